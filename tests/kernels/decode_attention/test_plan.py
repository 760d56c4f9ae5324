"""The planner of paged decode attention (kernel.plan_kernel through op.plan / DecodePlan.update).

Dynamic schedule: the even split of the cost axis (tiles + seg_cost per segment start) over the persistent grid,
or with ``whole_below`` the whole-segment plan (a segment costing at most that % of the even share T / G is never
split; requests of one class form regions, each gets its proportional number of programs; kept only if no
program's range exceeds (100 + op.WHOLE_GATE) % of the share, else the even split). Checked against a pure-Python
model of the planner (helpers.model_plan) and against properties read off the ranges alone: every unit exactly
once in contiguous ordered ranges; merge duty, first participant, merged segment, wide list and descriptors equal
to what the ranges imply; each program's cost within its bound. Outputs against the float64 reference, in-place
re-planning and (``-m gpu``) real sizes and CUDA-graph replay of the whole-segment plan.

The grid is fixed per test through helpers.fix_grid (ctas_per_sm 1 x the given "SMs").
"""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.decode_attention import op  # noqa: E402
from hpc_advise.kernels.decode_attention.config import Config  # noqa: E402
from hpc_advise.kernels.decode_attention.reference import decode_attention_reference  # noqa: E402
from tests.kernels.decode_attention.helpers import (  # noqa: E402
    BF16,
    DEVICE,
    FP8,
    TOL,
    check,
    check_graph_replay,
    check_plan,
    check_ranges,
    fix_grid,
    layout,
    make_case,
    model_plan,
    plan_of,
    rel_err,
)

PAGE = TILE = 16


def plan_case(monkeypatch, lens, hkv, g, **keys):
    """A plan of ``lens`` (random page tables) on a grid of ``g`` programs, tile 16, head_dim 64."""
    fix_grid(monkeypatch, g)
    _, _, _, table, seq_lens = make_case(lens, hq=hkv, hkv=hkv, d=64, page=PAGE)
    cfg = Config(tile=TILE, ctas_per_sm=1, **keys)
    return plan_of(seq_lens, table, hq=hkv, hkv=hkv, d=64, page=PAGE, config=cfg)


ADVERSARIAL = [
    # (lens, hkv, programs, seg_cost): tiles of 16 tokens
    ([256] * 16, 2, 17, 2),  # uniform: 1.94 segments a share, two whole ones kept
    ([4096] + [256] * 31, 1, 32, 2),  # one long request before short ones
    ([2000] + [64] * 20, 2, 11, 2),  # long next to many short: a region boundary inside a program's share
    ([32] * 32 + [256] * 32, 1, 30, 2),  # tiny segments, then ones of ~one share: whole ones overflow: even
    ([64, 1500, 64, 1500, 64], 1, 13, 4),  # alternating classes: regions of one request
    ([3000] + [64] * 30, 1, 40, 2),  # a long request over > 16 programs: the wide merge list
    ([1] * 40, 2, 7, 3),  # only one-tile segments
    ([97], 1, 30, 2),  # more programs than tiles: empty ranges
    ([1, 63, 64, 65, 97], 4, 5, 2),  # edge lengths
    ([400] * 3 + [16] * 9 + [400] * 2, 1, 9, 0),  # long, short, long; seg_cost 0
]


@pytest.mark.parametrize("whole_below", [0, 50, 100, 150])
@pytest.mark.parametrize("case", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_plan_of_adversarial_mixes_is_the_model(monkeypatch, case, whole_below):
    lens, hkv, g, seg_cost = case
    p = plan_case(monkeypatch, lens, hkv, g, seg_cost=seg_cost, whole_below=whole_below)
    check_plan(p, lens, hkv)


def test_plan_of_random_mixes_is_the_model(monkeypatch):
    # fresh draws each run (the seed is in the failure message); the kept and the refused whole-segment plans
    # are also pinned by the adversarial table and the two tests below
    seed = torch.seed() % (2**31)
    rng = random.Random(seed)
    for _ in range(12):
        b = rng.randint(1, 40)
        if rng.random() < 0.5:  # log-uniform lengths
            lens = [int(math.exp(rng.uniform(0, math.log(3000)))) for _ in range(b)]
        else:  # a few long requests among uniform short ones, at random places
            lens = [rng.choice((256, 256, 256, 2000, 4000)) for _ in range(b)]
        hkv, g = rng.choice((1, 2, 4)), rng.randint(2, 60)
        seg_cost, whole_below = rng.choice((0, 2, 4, 6)), rng.choice((0, 25, 60, 100, 140, 200))
        p = plan_case(monkeypatch, lens, hkv, g, seg_cost=seg_cost, whole_below=whole_below)
        try:
            check_plan(p, lens, hkv)
        except AssertionError as exc:
            raise AssertionError(
                f"seed {seed}, lens {lens}, hkv {hkv}, G {g}, keys {p.config}: {exc}"
            ) from exc


def test_whole_plan_keeps_short_segments_whole_and_splits_long_ones_evenly(monkeypatch):
    # 1 x 128K + 31 x 4K at 64/8, scaled down: a long request before uniform short ones, two KV heads,
    # 20 programs; three whole short segments hold 1.02 shares
    lens, hkv, g, seg_cost = [4096] + [256] * 15, 2, 20, 2
    p = plan_case(monkeypatch, lens, hkv, g, seg_cost=seg_cost, whole_below=100)
    kept, n_split = check_plan(p, lens, hkv)
    assert kept
    segs, _, total, _ = layout(lens, hkv, TILE, seg_cost)
    starts = p.prog_start.tolist()
    long_units, long_cost = 2 * 256, 2 * (256 + seg_cost)  # the long request's 2 segments of 256 tiles
    # the long request ends exactly at a program boundary: no program holds long and short work
    k_long = starts.index(long_units)
    assert k_long == round(long_cost * g / total)  # its proportional number of programs
    inside = [b - a for a, b in zip(starts[:k_long], starts[1 : k_long + 1], strict=False)]
    assert max(inside) - min(inside) <= seg_cost + 1, inside  # an even split, up to one segment start
    assert n_split == 2  # only the long segments are split
    assert all(s in {u0 for u0, *_ in segs} | {starts[-1]} for s in starts[k_long:])


def test_whole_plan_gate_falls_back_to_the_even_split_bitwise(monkeypatch):
    # short segments of about one share each: whole ones would give some program two shares, so the plan is
    # the even split, every buffer equal to the whole_below 0 plan's
    lens, hkv, g, seg_cost = [32] * 32 + [256] * 32, 1, 30, 2
    assert not model_plan(lens, hkv, TILE, g, seg_cost, 100)[1]
    even = plan_case(monkeypatch, lens, hkv, g, seg_cost=seg_cost)
    p = plan_case(monkeypatch, lens, hkv, g, seg_cost=seg_cost, whole_below=100)
    assert p.bounds[3, 0].item() == 0
    for name in ("prog_start", "prog_b", "merge_first", "merge_bh", "merge_seg", "prog_desc", "wide_list"):
        assert torch.equal(getattr(p, name), getattr(even, name)), name


@pytest.mark.parametrize("seg_cost", [0, 3])
def test_even_split_balances_tiles_and_segment_starts(monkeypatch, seg_cost):
    # short requests next to long ones: with seg_cost > 0 a program that starts many segments gets fewer tiles
    lens, hkv, g = [20] * 12 + [700, 333, 1, 90], 2, 11
    p = plan_case(monkeypatch, lens, hkv, g, seg_cost=seg_cost)
    check_plan(p, lens, hkv)
    starts = p.prog_start.tolist()
    tiles = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
    if seg_cost:  # the programs over the 12 short requests hold fewer tiles than the others
        assert tiles[0] < max(tiles), tiles
    else:
        assert max(tiles) - min(tiles) <= 1, tiles


def test_static_plan_splits_every_segment_into_equal_chunks(monkeypatch):
    # schedule='static': G = max_batch x Hkv x splits programs, program (b, h, s) the s-th of `splits` chunks
    lens, hkv = [1, 17, 33, 64, 65, 97], 2
    fix_grid(monkeypatch, 36)
    _, _, _, table, seq_lens = make_case(lens, hq=4, hkv=hkv, d=64, page=PAGE)
    cfg = Config(tile=TILE, ctas_per_sm=1)
    p = plan_of(seq_lens, table, hq=4, hkv=hkv, d=64, page=PAGE, config=cfg, schedule="static")
    assert p.static_splits == 3 and p.grid_size() == len(lens) * hkv * 3
    segs, _, _, units = layout(lens, hkv, TILE, 0)
    want = []
    for u0, _, tiles, _, _ in segs:
        chunk = -(-tiles // 3)
        want += [u0 + min(s * chunk, tiles) for s in range(3)]
    assert p.prog_start.tolist() == want + [units]
    check_ranges(p, lens, hkv)


def test_plan_update_replans_in_place(monkeypatch):
    # new lengths and a permuted page table into the same buffers; the whole-segment plan follows the model
    lens, new = (
        [700, 9, 33, 160, 160, 160],
        [9, 160, 160, 20, 700],
    )  # new request i reuses old [1, 3, 4, 2, 0]
    fix_grid(monkeypatch, 7)
    q, k, v, table, seq_lens = make_case(lens, hq=4, hkv=1, d=64, page=PAGE)
    cfg = Config(tile=TILE, ctas_per_sm=1, seg_cost=2, whole_below=100)
    p = plan_of(seq_lens, table, hq=4, hkv=1, d=64, page=PAGE, config=cfg, max_batch=6)
    names = (
        "prog_start",
        "merge_first",
        "prog_desc",
        "req_cost",
        "bounds",
        "region",
        "seq_lens",
        "page_table",
    )
    buffers = [getattr(p, n).data_ptr() for n in names]
    new_lens = torch.tensor(new, dtype=torch.int32, device=DEVICE)
    new_table = table[[1, 3, 4, 2, 0], :].contiguous()
    p.update(new_lens, new_table)
    assert [getattr(p, n).data_ptr() for n in names] == buffers
    check_plan(p, new, 1)
    q2 = q[:5].clone()
    out = op.run(p, q2, k, v, out=torch.full_like(q2, float("nan")))
    ref = decode_attention_reference(q2, k, v, new_table, new_lens, page_size=PAGE)
    assert rel_err(out, ref) <= TOL[BF16]


@pytest.mark.parametrize("kv_dtype", [BF16, FP8])
def test_whole_plan_outputs_match_reference(monkeypatch, kv_dtype):
    # kept and fallback plans, one and two KV heads; the merge runs too
    cases = [
        ([1000] + [80] * 7 + [97, 64, 63, 1, 65], 1, 7),  # kept: the long request split, short ones whole
        ([1, 63, 64, 65, 97] + [80] * 6, 2, 15),  # the gate falls back to the even split
    ]
    kept = []
    for lens, hkv, g in cases:
        fix_grid(monkeypatch, g)
        cfg = Config(tile=TILE, ctas_per_sm=1, seg_cost=2, whole_below=100, f16_dot=kv_dtype == FP8)
        p, _ = check(lens, hq=4, hkv=hkv, d=64, page=PAGE, kv_dtype=kv_dtype, config=cfg)
        k, n_split = check_plan(p, lens, hkv)
        assert n_split > 0
        kept.append(k)
    assert kept == [True, False]


# ---------------------------------------------------------------- GPU, real sizes


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [BF16, FP8])
def test_gpu_whole_plan_real_sizes(monkeypatch, kv_dtype):
    # 64/8, the tuned config with whole_below 100 on 33 programs: one long request before 31 short ones (1 x 128K
    # + 31 x 4K over 264, scaled): kept, the short segments whole, only the long request's 8 split
    from dataclasses import replace

    lens = [16384] + [1024] * 31
    fix_grid(monkeypatch, 33)
    cfg = replace(op.tuned_config(kv_dtype, 8, 128, 64), ctas_per_sm=1, whole_below=100)
    p, _ = check(lens, hq=64, hkv=8, d=128, page=64, kv_dtype=kv_dtype, config=cfg)
    kept, n_split = check_plan(p, lens, 8)
    assert kept and n_split == 8


@pytest.mark.gpu
def test_gpu_whole_plan_cuda_graph_replay_matches_eager(monkeypatch):
    # 33 programs: steps that keep the whole-segment plan and steps that fall back, replayed from one graph
    from dataclasses import replace

    hq, hkv, d, page = 64, 8, 128, 64
    fix_grid(monkeypatch, 33)
    q, k, v, table, _ = make_case([16384] + [2048] * 15, hq=hq, hkv=hkv, d=d, page=page)
    lens_buf = torch.tensor([2048] * 16, dtype=torch.int32, device="cuda")
    cfg = replace(op.tuned_config(BF16, hkv, d, page), ctas_per_sm=1)
    p = plan_of(lens_buf, table, hq=hq, hkv=hkv, d=d, page=page, config=cfg)
    steps = ([2048] * 16, [100, 2048, 1, 65] + [2048] * 12, [15000, 1] + [333] * 14, [16384] + [2048] * 15)
    kept = []
    check_graph_replay(
        p,
        q,
        k,
        v,
        table,
        lens_buf,
        steps,
        page=page,
        each=lambda lens: kept.append(check_plan(p, lens, hkv)[0]),
    )
    assert kept == [True, False, True, False]
