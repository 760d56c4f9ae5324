"""Tests of the decode-attention stream floor (hpc_advise/runtime/measure/cases/decode_attention_floor.py).

The floor must read exactly the K/V bytes the plan gives each program: its per-program fp32 sums are checked
against a float64 sum over the tokens of each program's units, computed here from the unit numbering alone
(units request-major, then KV head, then tile; program p owns units [u_begin, u_end) of the plan's
descriptors), not from the kernel's own walk. Values are N(1, 1/4), so a token read twice or skipped moves a
sum by about 256 (one token's K and V row at D = 128) against a tolerance of 1e-5 of the sum of |x|. Pool slots
no request uses (spare pages, slots past each length) hold NaN: a read there makes the sum NaN.
CPU: the Triton interpreter, small cases; GPU (``-m gpu``): benchmark-size cases, PDL tail, CUDA-graph replay.
Also the split of our call (``--split``): the attention pass with the merge launch held back, then that launch,
must give our call's output bitwise.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from hpc_advise.kernels.decode_attention import op
from hpc_advise.kernels.decode_attention.reference import decode_attention_reference
from hpc_advise.runtime.measure.cases import decode_attention_floor as fl
from hpc_advise.runtime.measure.harness import Timing
from tests.kernels.decode_attention.helpers import fix_grid, make_case
from tests.kernels.sm90_compile import compile_sm90

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL_ABS = 1e-5  # of the program's sum of |x|: fp32 accumulation over <= ~1000 adds per lane, then a tree


def shifted_case(lens, *, hkv, page, kv_dtype, hq=8, d=128):
    """make_case's NaN-poisoned pool with every value moved by +1 (NaN stays NaN)."""
    q, k, v, table, seq_lens = make_case(lens, hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv_dtype)
    k = (k.float() * 0.5 + 1).to(kv_dtype)
    v = (v.float() * 0.5 + 1).to(kv_dtype)
    return q, k, v, table, seq_lens


def program_sums(plan, k, v):
    """float64 (sums, sums of |x|) per program: every K and V value of every token of the program's units."""
    g, tile, page = plan.grid_size(), plan.tile, plan.page_size
    kd, vd = k.double(), v.double()  # fp8 -> float64 is exact; no fp8 indexing kernels needed
    units, units_abs = [], []
    for b, n in enumerate(plan.seq_lens[: plan.batch].tolist()):
        pages = plan.page_table[b, : math.ceil(n / page)].long()
        kk = kd[pages].reshape(-1, plan.num_kv_heads, plan.head_dim)[:n]
        vv = vd[pages].reshape(-1, plan.num_kv_heads, plan.head_dim)[:n]
        tiles = max(1, math.ceil(n / tile))
        for tok, out in (((kk + vv).sum(-1), units), ((kk.abs() + vv.abs()).sum(-1), units_abs)):
            padded = torch.zeros(tiles * tile, plan.num_kv_heads, dtype=torch.float64, device=k.device)
            padded[:n] = tok
            out.append(padded.view(tiles, tile, -1).sum(1).T.reshape(-1))  # units of b: head-major, then tile
    desc = plan.prog_desc[:g, :2].long()
    total = int(plan.req_start[plan.batch])
    assert desc[0, 0] == 0 and desc[-1, 1] == total and torch.equal(desc[1:, 0], desc[:-1, 1]), desc.tolist()
    res = []
    for u in (torch.cat(units), torch.cat(units_abs)):
        assert u.numel() == total
        cs = torch.cat([u.new_zeros(1), u.cumsum(0)])
        res.append(cs[desc[:, 1]] - cs[desc[:, 0]])
    return res


def check_sums(got, plan, k, v):
    ref, ref_abs = program_sums(plan, k, v)
    got = got[: plan.grid_size()].double()
    # a NaN: a poisoned slot (or a token past a length) was read
    assert torch.isfinite(got).all(), got.tolist()
    bad = (got - ref).abs() > RTOL_ABS * ref_abs + 1e-3
    assert not bad.any(), [(p, got[p].item(), ref[p].item()) for p in bad.nonzero().flatten().tolist()]


def make_plan(seq_lens, table, *, hkv, page, kv_dtype, hq=8, monkeypatch=None, programs=None, **kw):
    """The tuned plan of the case; with ``programs`` its grid is that many programs (helpers.fix_grid)."""
    if programs is not None:
        fix_grid(monkeypatch, programs)
        kw["config"] = replace(op.tuned_config(kv_dtype, hkv, 128, page), ctas_per_sm=1)
    return op.plan(
        seq_lens,
        table,
        page_size=page,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=128,
        kv_dtype=kv_dtype,
        **kw,
    )


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("hkv,num_programs", [(1, None), (2, None), (2, 2)])
def test_floor_reads_exactly_the_plans_tokens(monkeypatch, kv_dtype, page, hkv, num_programs):
    # lengths 1 / 65 / 97: a one-token request, tiles ending mid-page; the default grid (4 x programs per SM on CPU)
    # splits segments over programs and leaves some empty; 2 programs walk several segments each
    _, k, v, table, seq_lens = shifted_case([1, 65, 97], hkv=hkv, page=page, kv_dtype=kv_dtype)
    p = make_plan(
        seq_lens, table, hkv=hkv, page=page, kv_dtype=kv_dtype, monkeypatch=monkeypatch, programs=num_programs
    )
    sums = torch.full((p.grid_size() + 1,), float("nan"), device=k.device)
    fl.stream_floor(p, k, v, sums=sums, tail=True)
    check_sums(sums, p, k, v)
    g = p.grid_size()
    assert math.isclose(sums[g].item(), sums[:g].double().sum().item(), rel_tol=1e-6, abs_tol=1e-3)


def test_floor_tail_forms_write_the_total(monkeypatch):
    # the tails in the merge launch's slot: its grid, one program, and its grid with
    # the merging programs waiting (kernel.merge_duty: a wide segment over > 16 of 24 programs and a narrow one
    # here, so both kinds of duty exist); each writes the pass's total to sums[G] and leaves sums[:G] as the floor
    _, k, v, table, seq_lens = shifted_case([1, 65, 1100], hkv=1, page=64, kv_dtype=BF16)
    p = make_plan(seq_lens, table, hkv=1, page=64, kv_dtype=BF16, monkeypatch=monkeypatch, programs=24)
    assert int((p.wide_list >= 0).sum()) == 1 and int((p.merge_first >= 0).sum()) == 2, p.merge_first.tolist()
    g = p.grid_size()
    assert fl.tail_grid(p) == (24 + len(p.wide_list) * 64 // op.WIDE_MERGE_COLS, 8, 2)
    for tail in fl.TAILS[1:]:
        sums = torch.full((g + 1,), float("nan"), device=k.device)
        fl.stream_floor(p, k, v, sums=sums, tail=tail)
        check_sums(sums, p, k, v)
        total = sums[:g].double().sum().item()
        assert math.isclose(sums[g].item(), total, rel_tol=1e-6, abs_tol=1e-3), tail


def test_floor_page_id_chunks_and_long_segments(monkeypatch):
    # page = tile = 64 with 32 page ids per load: a 2100-token segment crosses a chunk (33 tiles) inside one
    # program and the next request's segments follow in the same range
    _, k, v, table, seq_lens = shifted_case([2100, 70, 5], hkv=1, page=64, kv_dtype=BF16)
    p = make_plan(seq_lens, table, hkv=1, page=64, kv_dtype=BF16, monkeypatch=monkeypatch, programs=2)
    assert op.PT_CHUNK == 32 and p.tile == 64
    check_sums(fl.stream_floor(p, k, v), p, k, v)


def test_a_poisoned_used_token_reaches_exactly_the_programs_holding_it():
    # the NaN check can fail: a NaN in one token of unit (b=2, h=1, tile 1) shows in the sum of each program
    # whose range holds that unit, and in no other
    _, k, v, table, seq_lens = shifted_case([1, 65, 97], hkv=2, page=64, kv_dtype=BF16)
    p = make_plan(seq_lens, table, hkv=2, page=64, kv_dtype=BF16)
    v[table[2, 1].long(), 70 - 64, 1, 5] = float("nan")
    sums = fl.stream_floor(p, k, v)
    unit = int(p.req_start[2]) + 1 * 2 + 1  # request 2 has 2 tiles per KV head
    g = p.grid_size()
    desc = p.prog_desc[:g, :2]
    holds = (desc[:, 0] <= unit) & (unit < desc[:, 1])
    assert holds.sum() == 1
    assert torch.equal(torch.isnan(sums[:g]).cpu(), holds.cpu()), (sums.tolist(), desc.tolist())


def test_floor_rejects_static_plans_and_mismatched_pools():
    _, k, v, table, seq_lens = shifted_case([5, 9], hkv=1, page=16, kv_dtype=BF16)
    static = make_plan(seq_lens, table, hkv=1, page=16, kv_dtype=BF16, schedule="static")
    with pytest.raises(ValueError, match="dynamic-schedule plan"):
        fl.stream_floor(static, k, v)
    p = make_plan(seq_lens, table, hkv=1, page=16, kv_dtype=BF16)
    with pytest.raises(ValueError, match=r"v_cache must be \[num_pages, 16, 1, 128\]"):
        fl.stream_floor(p, k, v[..., :64])
    assert fl.tail_grid(p) == op.merge_grid(p) and op.merge_grid(p)[1:] == (8, 2)
    with pytest.raises(ValueError, match="tail must be one of"):
        fl.stream_floor(p, k, v, tail="all")


def fake_cells(split: bool):
    """bench_cells over two rotated plans of a small case with a fake timer in place of CUDA events (no GPU
    here): each timed call list runs once; returns (rows, cells, call-list lengths, the workload, the plans)."""
    q, k, v, table, seq_lens = shifted_case([1, 65, 97], hkv=1, page=64, kv_dtype=BF16)
    plans = [make_plan(seq_lens, t, hkv=1, page=64, kv_dtype=BF16) for t in (table, table.clone())]
    ran, fake = [], iter([20.0, 25.0, 21.0, 23.5, 4.0] + ([26.5, 3.5] if split else []) + [30.0])

    def timer(calls):
        for c in calls:
            c()
        ran.append(len(calls))
        us = next(fake)
        return Timing(us, us, us, 1), "fake"

    w = SimpleNamespace(q=q, k=k, v=v, kv_bytes=2 * 163 * 128 * 2)
    ours = [lambda: None] * 2
    rows, cells = fl.bench_cells(
        w, plans, ours, Timing(40.0, 40.0, 40.0, 1), timer, {"case": "x"}, {"gpu": "none"}, split=split
    )
    return rows, cells, ran, w, plans


def test_bench_cells_rows_and_table_cells_fake_timer():
    # the benchmark's --floor columns: every rotation's sums written; ours is timed again last
    rows, cells, ran, w, plans = fake_cells(split=False)
    assert ran == [2] * 6
    assert [r["provider"] for r in rows] == [*fl.FORMS, "hpc_advise_dynamic_again"]
    assert rows[0]["config"]["finite"] and rows[1]["config"]["tail_grid"] == list(fl.tail_grid(plans[0]))
    assert rows[2]["config"]["tail_grid"] == [1, 1, 1] and rows[3]["config"]["tail_grid"] == list(
        fl.tail_grid(plans[0])
    )
    tbps = w.kv_bytes / 20.0 / 1e6
    want = [
        20.0,
        round(tbps, 2),
        f"{100 * tbps / fl.COPY_TBPS:.0f}%",
        "2.00x",
        25.0,
        "1.60x",
        21.0,
        23.5,
        4.0,
        30.0,
    ]
    assert cells == want and len(cells) == len(fl.HEADERS)


def test_bench_cells_split_columns_fake_timer():
    # --split: the floor's forms, then the pass alone and the merge launch alone (each rotation's own held merge),
    # then ours again; cells: pass 26.5, merge alone 3.5, ours (40) - pass, pass - floor (20)
    rows, cells, ran, _, plans = fake_cells(split=True)
    assert ran == [2] * 8
    assert [r["provider"] for r in rows] == [*fl.FORMS, *fl.SPLIT_FORMS, "hpc_advise_dynamic_again"]
    assert [r["subject"] for r in rows[5:7]] == ["decode_attention.split"] * 2
    assert rows[5]["config"]["merge_grid"] == list(fl.tail_grid(plans[0]))
    assert cells[: len(fl.HEADERS)][-1] == 30.0  # ours again stays the floor's last column
    assert cells[len(fl.HEADERS) :] == [26.5, 3.5, 13.5, 6.5]
    assert len(cells) == len(fl.HEADERS) + len(fl.SPLIT_HEADERS)


def test_pass_then_merge_launch_is_our_call_bitwise(monkeypatch):
    # lengths 1 / 65 / 1100 over 24 programs (tuned bf16 form: wide merge, 16 partials per narrow step): the 1100-token
    # segment splits over > 16 programs (a wide merge), 65 over 2 (narrow). The pass alone leaves every row of a
    # split segment unwritten (NaN-filled out) and the merge launch alone completes them to our call's output, bitwise
    q, k, v, table, seq_lens = make_case([1, 65, 1100], hq=8, hkv=1, d=128, page=64, kv_dtype=BF16)
    p = make_plan(seq_lens, table, hkv=1, page=64, kv_dtype=BF16, monkeypatch=monkeypatch, programs=24)
    wide = int((p.wide_list >= 0).sum())
    assert wide == 1, p.wide_list.tolist()
    whole = op.run(p, q, k, v)
    w = SimpleNamespace(q=q, k=k, v=v)
    out = torch.full_like(q, float("nan"))
    held = fl.pass_only(p, w, out)
    assert held[0] is p and held[1] is out
    split_rows = torch.isnan(out).all(-1).all(-1)
    assert split_rows.tolist() == [False, True, True]  # 65 and 1100 split, the one-token request whole
    assert torch.equal(out[0], whole[0])
    fl.merge_only(held)
    assert torch.equal(out, whole)
    ref = decode_attention_reference(q, k, v, table, seq_lens, page_size=64)
    assert ((whole.double() - ref).norm() / ref.norm()).item() < 5e-3


def test_floor_builds_for_sm90_as_resident_as_the_real_pass():
    # offline sm_90a (no GPU): the floor's K/V loads are async copies (pipelined), nothing spills, and the SM holds
    # as many floor programs as the shipped grids put there: bf16 2 per SM (4 warps, no cap), fp8 64/8 3 per SM
    # (4 warps, op._register_cap's 168 registers, as the transposed pass)
    types = "*{kv} *{kv} *i32 *i32 *i32 *fp32" + " i32" * 8
    strides = ["stride_kp", "stride_ks", "stride_kh", "stride_vp", "stride_vs", "stride_vh"]
    consts = dict(HEAD_DIM=128, PAGE=64, TILE=64, NUM_STAGES=3, PT_CHUNK=32, PDL=True)
    mod, name = fl.__name__, "stream_floor_kernel"
    bf16, fp8 = compile_sm90(
        [
            (mod, name, types.format(kv="bf16"), consts, 4, 3, strides),
            (mod, name, types.format(kv="fp8e4nv"), consts, 4, 3, strides, 168),
        ]
    )
    for build, ctas in ((bf16, 2), (fp8, 3)):
        assert build["async_copies"] > 0 and build["stack"] == 0, build
        assert build["ctas_per_sm"] >= ctas, build


# ---------------------------------------------------------------- GPU, benchmark sizes


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens,hq,hkv,kv_dtype",
    [
        ([65536] + [4096] * 15, 8, 1, BF16),  # bf16 8/1: plain loop, 2 programs/SM
        ([128] * 32 + [4096] * 32, 64, 8, FP8),  # fp8 64/8: transposed default's grid, 3/SM (register cap)
    ],
    ids=["bf16-8-1", "fp8-64-8"],
)
def test_gpu_floor_sums_tail_and_graph_replay(lens, hq, hkv, kv_dtype):
    _, k, v, table, seq_lens = shifted_case(lens, hq=hq, hkv=hkv, page=64, kv_dtype=kv_dtype)
    p = make_plan(seq_lens, table, hq=hq, hkv=hkv, page=64, kv_dtype=kv_dtype)
    g = p.grid_size()
    sums = torch.full((g + 1,), float("nan"), device="cuda")
    fl.stream_floor(p, k, v, sums=sums, tail=True)  # tail under PDL: sums[G] read after the pass completes
    torch.cuda.synchronize()
    check_sums(sums, p, k, v)
    assert math.isclose(sums[g].item(), sums[:g].double().sum().item(), rel_tol=1e-6)
    eager = sums.clone()
    # the 1-program tail and the merge grid's waiting duties: the same sums, under PDL
    for tail in ("one", "duty"):
        sums.fill_(float("nan"))
        fl.stream_floor(p, k, v, sums=sums, tail=tail)
        torch.cuda.synchronize()
        assert torch.equal(sums[:g], eager[:g]), tail
        assert math.isclose(sums[g].item(), eager[g].item(), rel_tol=1e-6), tail
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fl.stream_floor(p, k, v, sums=sums, tail=True)
    for _ in range(3):
        sums.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(sums, eager)
