"""Tests of the dynamic planner's whole-segment plan (op.plan(whole_below=...)) in hpc_advise.kernels.decode_attention.

With ``whole_below`` > 0 a segment costing at most that % of the even share T / G is never split; requests of
one class form regions, each region gets its proportional number of programs and its cost is split evenly over
them, boundaries inside short segments move to the nearer segment end; a gate in the same launch keeps that
plan only if no program's cost-axis range exceeds (100 + op.WHOLE_GATE) % of the share, else the even
split runs. Checked against a pure-Python model of the planner and against properties read off the ranges
alone: every unit exactly once in contiguous ordered ranges; no short segment split when the plan is kept;
each program's cost within the bound; merge duty, first participant, merged segment and wide list equal to
what the ranges imply (for the even, snapped and whole-segment plans alike: the planner finds the first
participant by a running max over the programs). Outputs against the float64 reference (tolerances of
test_decode_attention.py) with NaN-poisoned outputs, in-place re-planning, validation, and (``-m gpu``) real
sizes and CUDA-graph replay with new lengths, bit for bit equal to eager.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from hpc_advise.kernels.decode_attention import op
from hpc_advise.kernels.decode_attention.reference import decode_attention_reference
from hpc_advise.runtime.benches import decode_attention as da
from tests.kernels.test_decode_attention import (
    BF16,
    DEVICE,
    FP8,
    TOL,
    check,
    check_graph_replay,
    make_case,
    rel_err,
)

PAGE, TILE, MERGE_BLOCK = 16, 16, 16


# ---------------------------------------------------------------- the planner, modelled in Python


def layout(lens, hkv, tile, seg_cost):
    """Segments in unit order as (first unit, cost position, tiles, b * hkv + h, request); request cost
    starts; total cost; total units."""
    segs, starts, unit, cost = [], [], 0, 0
    for b, n in enumerate(lens):
        tiles = max(1, math.ceil(n / tile))
        starts.append(cost)
        for h in range(hkv):
            segs.append((unit, cost, tiles, b * hkv + h, b))
            unit += tiles
            cost += tiles + seg_cost
    return segs, starts, cost, unit


def _short(seg_len, total, g, whole_below):
    return 100 * g * seg_len <= whole_below * total


def _unit(segs, units, total, y, seg_cost, move):
    """(first unit, cost position) of a boundary at cost position y; ``move(off, seg_len, tiles)`` says
    where inside its segment the boundary goes."""
    if y >= total:
        return units, y
    u0, c0, tiles, _, _ = max((s for s in segs if s[1] <= y), key=lambda s: s[1])
    off = move(y - c0, tiles + seg_cost, tiles)
    return (u0 if off == 0 else u0 + min(max(off - seg_cost, 1), tiles)), c0 + off


def even_bounds(lens, hkv, tile, g, seg_cost):
    """(unit, cost position) of boundaries 0..G of the even split: x_p = ceil(p T / G)."""
    segs, _, total, units = layout(lens, hkv, tile, seg_cost)
    return [_unit(segs, units, total, -(-p * total // g), seg_cost, lambda o, n, t: o) for p in range(g + 1)]


def whole_bounds(lens, hkv, tile, g, seg_cost, whole_below):
    """The whole-segment candidate (kernel._region_position, then the move to the nearer end)."""
    segs, starts, total, units = layout(lens, hkv, tile, seg_cost)
    tiles = [max(1, math.ceil(n / tile)) for n in lens]
    cls = [_short(t + seg_cost, total, g, whole_below) for t in tiles]
    ends = starts[1:] + [total]
    out = []
    for p in range(g + 1):
        if p in (0, g):
            y = 0 if p == 0 else total
        else:
            b = max(i for i in range(len(lens)) if 2 * g * starts[i] < (2 * p + 1) * total)
            first = b
            while first > 0 and cls[first - 1] == cls[b]:
                first -= 1
            last = b
            while last + 1 < len(lens) and cls[last + 1] == cls[b]:
                last += 1
            a, e = starts[first], ends[last]
            pa, pe = (2 * a * g + total) // (2 * total), (2 * e * g + total) // (2 * total)
            k = max(pe - pa, 1)
            y = a + -(-(p - pa) * (e - a) // k)

        def move(off, seg_len, t):
            if not _short(seg_len, total, g, whole_below) or off == 0:
                return off
            return seg_len if seg_len - off < off else 0

        out.append(_unit(segs, units, total, y, seg_cost, move))
    return out


def model_plan(lens, hkv, tile, g, seg_cost, whole_below):
    """(prog_start, kept) as the planner should compute them (kernel.plan_kernel, steps 2 and 2b)."""
    _, _, total, _ = layout(lens, hkv, tile, seg_cost)
    cand = whole_bounds(lens, hkv, tile, g, seg_cost, whole_below)
    heaviest = max(b[1] - a[1] for a, b in zip(cand, cand[1:], strict=False))
    kept = 100 * g * heaviest <= (100 + op.WHOLE_GATE) * total
    chosen = cand if kept else even_bounds(lens, hkv, tile, g, seg_cost)
    return [u for u, _ in chosen], kept


# ---------------------------------------------------------------- checks read off the ranges


def merge_expected(starts, segs, g, merge_block, merge_in_pass=0):
    """(merge_first, {program: (segment's first unit, b * hkv + h)}, wide list) the ranges imply: a segment
    touched by several non-empty ranges is merged by the last of them, which names the first; one spanning
    at most ``merge_in_pass`` programs is merged inside the attention pass, so the merge launch gets no duty
    for it (merge_first -1, not listed wide; its merge_seg / merge_bh are written all the same)."""
    first, merged, wide = [-1] * g, {}, []
    for u0, _, tiles, bh, _ in segs:
        parts = [
            q for q in range(g) if starts[q] < starts[q + 1] and starts[q] < u0 + tiles and u0 < starts[q + 1]
        ]
        if len(parts) > 1:
            merged[parts[-1]] = (u0, bh)
            span = parts[-1] - parts[0] + 1  # the merge walks every program in between
            if span <= merge_in_pass:
                continue
            first[parts[-1]] = parts[0]
            if span > merge_block:
                wide.append(parts[-1])
    return first, merged, wide


def check_ranges(p, segs, units, g):
    """Every unit exactly once: contiguous, ordered ranges from 0 to the last unit; the merge bookkeeping
    equal to what the ranges imply. Returns (prog_start, number of split segments)."""
    starts = p.prog_start.tolist()
    assert starts[0] == 0 and starts[-1] == units, starts
    assert all(a <= b for a, b in zip(starts, starts[1:], strict=False)), starts
    first, merged, wide = merge_expected(starts, segs, g, p.merge_block, p.merge_in_pass)
    assert p.merge_first.tolist() == first
    merge_seg, merge_bh = p.merge_seg.tolist(), p.merge_bh.tolist()
    assert all((merge_seg[q], merge_bh[q]) == merged[q] for q in merged)
    if p.wide_merge:
        listed = p.wide_list.tolist()
        assert listed == wide + [-1] * (len(listed) - len(wide))
    desc = p.prog_desc.tolist()
    assert [d[0] for d in desc] == starts[:-1] and [d[1] for d in desc] == starts[1:]
    return starts, len(merged)


def program_costs(segs, starts, seg_cost):
    """Each program's cost on the planner's axis: its tiles, plus seg_cost for every segment start it holds."""
    unit_cost = []
    for _, _, tiles, _, _ in segs:
        unit_cost += [1 + seg_cost] + [1] * (tiles - 1)
    return [sum(unit_cost[a:b]) for a, b in zip(starts, starts[1:], strict=False)]


def check_whole_plan(p, lens, hkv, g, seg_cost, whole_below, tile=TILE):
    """Every property of a plan with whole_below; returns (kept, number of split segments)."""
    segs, _, total, units = layout(lens, hkv, tile, seg_cost)
    want, kept = model_plan(lens, hkv, tile, g, seg_cost, whole_below)
    assert bool(p.bounds[3, 0].item()) == kept
    starts, n_split = check_ranges(p, segs, units, g)
    assert starts == want
    costs = program_costs(segs, starts, seg_cost)
    if kept:
        # short segments whole; each program within (100 + gate) % of the share (the gate) + one segment
        # start (a boundary inside a long segment's first tile takes that tile, of cost 1 + seg_cost, whole)
        inner = {
            u
            for u0, _, tiles, _, _ in segs
            if _short(tiles + seg_cost, total, g, whole_below)
            for u in range(u0 + 1, u0 + tiles)
        }
        assert not inner & set(starts), (inner & set(starts), starts)
        bound = (100 + op.WHOLE_GATE) * total / (100 * g) + seg_cost
    else:
        assert starts == [u for u, _ in even_bounds(lens, hkv, tile, g, seg_cost)]
        bound = math.ceil(total / g) + seg_cost
    assert max(costs) <= bound, (max(costs), bound)
    return kept, n_split


def plan_case(lens, hkv, g, seg_cost, whole_below, tile=TILE, **kw):
    """A CPU plan of lens (random page tables) at page PAGE, head_dim 64, the wide merge and descriptors."""
    _, _, _, table, seq_lens = make_case(lens, hq=hkv, hkv=hkv, d=64, page=PAGE)
    kw = dict(merge_block=MERGE_BLOCK, wide_merge=True, desc=True) | kw
    return op.plan(
        seq_lens,
        table,
        page_size=PAGE,
        num_q_heads=hkv,
        num_kv_heads=hkv,
        head_dim=64,
        tile=tile,
        num_programs=g,
        seg_cost=seg_cost,
        whole_below=whole_below,
        **kw,
    )


# ---------------------------------------------------------------- CPU (interpreter) and GPU alike

ADVERSARIAL = [
    # (lens, hkv, programs, seg_cost): tiles of 16 tokens
    ([256] * 16, 2, 17, 2),  # uniform (64/8 64 x 4K scaled down): 1.94 segments a share, two whole ones kept
    ([4096] + [256] * 31, 1, 32, 2),  # one long request before short ones (1 x 128K + 31 x 4K scaled down)
    ([2000] + [64] * 20, 2, 11, 2),  # long next to many short: a region boundary inside a program's share
    ([32] * 32 + [256] * 32, 1, 30, 2),  # tiny segments, then ones of ~one share: whole ones overflow: even
    ([64, 1500, 64, 1500, 64], 1, 13, 4),  # alternating classes: regions of one request
    ([3000] + [64] * 30, 1, 40, 2),  # a long request over > 16 programs: the wide merge list
    ([1] * 40, 2, 7, 3),  # only one-tile segments
    ([97], 1, 30, 2),  # more programs than tiles: empty ranges
    ([1, 63, 64, 65, 97], 4, 5, 2),  # edge lengths
    ([16] * 9 + [400] * 3, 1, 7, 2),  # short then long
    ([400] * 3 + [16] * 9 + [400] * 2, 1, 9, 0),  # long, short, long; seg_cost 0
]


@pytest.mark.parametrize("whole_below", [50, 100, 150])
@pytest.mark.parametrize("case", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_whole_plan_adversarial_mixes(case, whole_below):
    lens, hkv, g, seg_cost = case
    check_whole_plan(plan_case(lens, hkv, g, seg_cost, whole_below), lens, hkv, g, seg_cost, whole_below)


def test_whole_plan_random_mixes():
    rng = random.Random(torch.seed() % (2**31))
    kept_any = False
    for _ in range(30):
        b = rng.randint(1, 40)
        if rng.random() < 0.5:  # log-uniform lengths
            lens = [int(math.exp(rng.uniform(0, math.log(3000)))) for _ in range(b)]
        else:  # a few long requests among uniform short ones, at random places
            lens = [rng.choice((256, 256, 256, 2000, 4000)) for _ in range(b)]
        hkv, g = rng.choice((1, 2, 4)), rng.randint(2, 60)
        seg_cost, whole_below = rng.choice((0, 2, 4, 6)), rng.choice((25, 60, 100, 140, 200))
        kept, _ = check_whole_plan(
            plan_case(lens, hkv, g, seg_cost, whole_below), lens, hkv, g, seg_cost, whole_below
        )
        kept_any |= kept
    assert kept_any  # the draws exercise the kept plan, not only the fallback


def test_whole_plan_keeps_short_segments_whole_and_splits_long_ones_evenly():
    # 1 x 128K + 31 x 4K at 64/8, scaled down: a long request before uniform short ones, two KV heads, 20
    # programs; three whole short segments hold 1.02 shares
    lens, hkv, g, seg_cost = [4096] + [256] * 15, 2, 20, 2
    p = plan_case(lens, hkv, g, seg_cost, 100)
    kept, n_split = check_whole_plan(p, lens, hkv, g, seg_cost, 100)
    assert kept
    segs, _, total, _ = layout(lens, hkv, TILE, seg_cost)
    starts = p.prog_start.tolist()
    long_units, long_cost = 2 * 256, 2 * (256 + seg_cost)  # the long request's 2 segments of 256 tiles
    # the long request ends exactly at a program boundary: no program holds long and short work
    assert long_units in starts
    k_long = starts.index(long_units)
    assert k_long == round(long_cost * g / total)  # its proportional number of programs
    inside = [b - a for a, b in zip(starts[:k_long], starts[1 : k_long + 1], strict=False)]
    assert max(inside) - min(inside) <= seg_cost + 1, inside  # an even split, up to one segment start
    # the short requests: every segment whole, none merged; only the long segments are
    assert n_split == 2
    assert all(s in {u0 for u0, *_ in segs} | {starts[-1]} for s in starts[k_long:])


def test_whole_plan_gate_falls_back_to_the_even_split():
    # short segments of about one share each: whole ones would give some program two shares, so the plan
    # is the even split, bit for bit (the snap-0 plan of the same lengths)
    lens, hkv, g, seg_cost = [32] * 32 + [256] * 32, 1, 30, 2
    _, kept = model_plan(lens, hkv, TILE, g, seg_cost, 100)
    assert not kept
    even = plan_case(lens, hkv, g, seg_cost, 0)
    p = plan_case(lens, hkv, g, seg_cost, 100)
    assert p.bounds[3, 0].item() == 0
    for name in ("prog_start", "prog_b", "merge_first", "merge_bh", "merge_seg", "prog_desc", "wide_list"):
        assert torch.equal(getattr(p, name), getattr(even, name)), name


def test_first_participant_for_every_plan_kind():
    # the running-max search of the first participant against the ranges for the even split, the snap
    # and the whole-segment plan, with empty ranges inside a split segment (more programs than tiles); with
    # the in-pass merge, the segments over <= merge_in_pass programs leave the merge launch (merge_first -1)
    for lens, hkv, g in (([97], 1, 30), ([480, 4640], 1, 10), ([1, 63, 64, 65, 97] * 3, 2, 23)):
        segs, _, _, units = layout(lens, hkv, TILE, 2)
        for kw in (
            dict(snap=0, whole_below=0),
            dict(snap=25, whole_below=0),
            dict(snap=0, whole_below=100),
            dict(snap=0, whole_below=100, merge_in_pass=4),
            dict(snap=0, whole_below=0, merge_in_pass=8),
        ):
            p = plan_case(lens, hkv, g, 2, kw.pop("whole_below"), **kw)
            check_ranges(p, segs, units, g)


@pytest.mark.parametrize("kv_dtype", [BF16, FP8])
def test_whole_plan_outputs_match_reference(kv_dtype):
    # outputs poisoned with NaN before the call; edge lengths among uniform ones and a long one, kept and
    # fallback plans, one and two KV heads
    scales = (0.37, 1.9) if kv_dtype == FP8 else (1.0, 1.0)
    cases = [
        ([1400] + [160] * 7 + [97, 64, 63, 1, 65], 1, 9),  # kept: the long request split, short ones whole
        ([1, 63, 64, 65, 97] + [160] * 6, 2, 9),
        ([1, 63, 64, 65, 97] + [160] * 6, 2, 23),
    ]
    kept = []
    for lens, hkv, g in cases:
        p, _ = check(
            lens,
            hq=4,
            hkv=hkv,
            d=64,
            page=PAGE,
            kv_dtype=kv_dtype,
            scales=scales,
            tile=TILE,
            num_programs=g,
            seg_cost=2,
            whole_below=100,
            desc=True,
            pt_chunk=16,
            merge_block=MERGE_BLOCK,
            wide_merge=True,
        )
        k, n_split = check_whole_plan(p, lens, hkv, g, 2, 100)
        assert n_split > 0  # the merge ran too
        kept.append(k)
    assert kept[0]


def test_whole_plan_update_replans_in_place():
    lens, new = (
        [700, 9, 33, 160, 160, 160],
        [9, 160, 160, 20, 700],
    )  # new request i reuses old [1, 3, 4, 2, 0]
    q, k, v, table, seq_lens = make_case(lens, hq=4, hkv=1, d=64, page=PAGE)
    p = op.plan(
        seq_lens,
        table,
        page_size=PAGE,
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=64,
        tile=TILE,
        num_programs=7,
        max_batch=6,
        seg_cost=2,
        whole_below=100,
        desc=True,
    )
    names = ("prog_start", "merge_first", "prog_desc", "req_cost", "bounds", "region")
    buffers = [getattr(p, n).data_ptr() for n in names]
    new_lens = torch.tensor(new, dtype=torch.int32, device=DEVICE)
    new_table = table[[1, 3, 4, 2, 0], :].contiguous()
    p.update(new_lens, new_table)
    assert [getattr(p, n).data_ptr() for n in names] == buffers
    check_whole_plan(p, new, 1, 7, 2, 100)
    q2 = q[:5].clone()
    out = op.run(p, q2, k, v, out=torch.full_like(q2, float("nan")))
    ref = decode_attention_reference(q2, k, v, new_table, new_lens, page_size=PAGE)
    assert rel_err(out, ref) <= TOL[BF16]


def test_whole_below_validation_and_knob_precedence(monkeypatch):
    _, _, _, table, seq_lens = make_case([70], hq=8, hkv=1, d=64, page=PAGE)
    kw = dict(page_size=PAGE, num_q_heads=8, num_kv_heads=1, head_dim=64)
    for bad in (-1, 201, 2.5, True):
        with pytest.raises(ValueError, match="whole_below must be an int in 0..200"):
            op.plan(seq_lens, table, whole_below=bad, **kw)
    with pytest.raises(ValueError, match="alternative plans"):
        op.plan(seq_lens, table, whole_below=100, snap=25, **kw)
    # a value given turns the other plan's tuned value off; an explicit 0 keeps the tuned other one
    monkeypatch.setitem(op.TUNED_MANY_KV_HEADS, BF16, {"whole_below": 100})
    kw8 = dict(page_size=PAGE, num_q_heads=8, num_kv_heads=8, head_dim=64, kv_dtype=BF16)
    assert (op.plan(seq_lens, table, **kw8).whole_below, op.plan(seq_lens, table, **kw8).snap) == (100, 0)
    p = op.plan(seq_lens, table, snap=25, **kw8)
    assert (p.whole_below, p.snap) == (0, 25)
    monkeypatch.setitem(op.TUNED_MANY_KV_HEADS, BF16, {"snap": 25})
    p = op.plan(seq_lens, table, whole_below=60, **kw8)
    assert (p.whole_below, p.snap) == (60, 0)
    assert op.plan(seq_lens, table, whole_below=0, **kw8).snap == 25
    # the sweep / bench flag
    assert da.variant_config(64, 2, 3, 4, "nested-desc-s4-wb100")["whole_below"] == 100
    assert da.variant_config(64, 2, 3, 4, "nested-desc-s4")["whole_below"] == 0
    with pytest.raises(ValueError, match="unknown variant"):
        da.variant_config(64, 2, 3, 4, "nested-wb10-wb20")


# ---------------------------------------------------------------- GPU, real sizes


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype,seg_cost", [(BF16, 2), (BF16, 6), (FP8, 4)])
def test_gpu_whole_plan_real_sizes(kv_dtype, seg_cost):
    # 64/8 at the benchmark's page and head_dim with the tuned launch variant of the KV dtype: one long
    # request before 31 short ones over 33 programs (1 x 128K + 31 x 4K over 264, scaled): kept, the short
    # segments whole, only the long request's 8 split; the plan against the model
    scales = (0.8, 1.3) if kv_dtype == FP8 else (1.0, 1.0)
    kw = dict(hq=64, hkv=8, d=128, page=64, kv_dtype=kv_dtype, scales=scales, tuned=True)
    lens = [16384] + [1024] * 31
    p, _ = check(lens, num_programs=33, whole_below=100, seg_cost=seg_cost, snap=0, **kw)
    kept, n_split = check_whole_plan(p, lens, 8, 33, seg_cost, 100, tile=p.tile)
    assert kept and n_split == 8


@pytest.mark.gpu
def test_gpu_whole_plan_cuda_graph_replay_matches_eager():
    # 33 programs: steps that keep the whole-segment plan and steps that fall back, replayed from one graph
    # with new lengths, bit for bit equal to eager, each replayed plan checked against the model. The pool
    # holds every length the steps take (page-table columns past it are -1 and would fault if read)
    hq, hkv, d, page, g = 64, 8, 128, 64, 33
    q, k, v, table, _ = make_case([16384] + [2048] * 15, hq=hq, hkv=hkv, d=d, page=page)
    lens_buf = torch.tensor([2048] * 16, dtype=torch.int32, device="cuda")
    p = op.plan(
        lens_buf,
        table,
        page_size=page,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        kv_dtype=k.dtype,
        whole_below=100,
        num_programs=g,
    )
    steps = ([2048] * 16, [100, 2048, 1, 65] + [2048] * 12, [15000, 1] + [333] * 14, [16384] + [2048] * 15)
    kept = []

    def planned_as_modelled(lens):
        kept.append(check_whole_plan(p, lens, hkv, g, p.seg_cost, 100, tile=p.tile)[0])

    check_graph_replay(p, q, k, v, table, lens_buf, steps, page=page, each=planned_as_modelled)
    assert kept == [True, False, True, False]
