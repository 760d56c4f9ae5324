"""Tests of the in-pass merge of paged decode attention (``op.plan(merge_in_pass=N)``).

A split segment with at most N participating programs is merged inside the attention pass by the participant
that arrives last at its counter (``kernel._arrive_and_merge``); wider ones keep the merge launches, which skip
the in-pass ones. Checked here: the planner's bookkeeping against the launch-merge plan of the same lengths (no
segment merged twice or never), outputs against the float64 reference (tolerances of test_decode_attention.py:
bf16 5e-3, fp8 2e-2) and against ``merge_in_pass=0``, a second call on the same plan (counters back at 0), and
on the GPU real sizes, many calls of one plan (true races: every result bitwise the same) and CUDA-graph replay
with new lengths.

Equality with ``merge_in_pass=0`` under the interpreter (which rounds every operation as written): rows of
segments that are not split, or are merged by the launches, run the same code and are bitwise equal. Rows merged in
the pass (``kernel._merge_partials``: chunks of 3 participants, a running maximum) compute the same weighted average
sum_k w_k o_k / sum_k w_k as merge_kernel (blocks of 16) with the weights rounded differently (one rescale per chunk
whose maximum grows, one per block there: about 2 2^-24 relative each) and the sums in another order: with two
participants the same numbers (the sum of two products plus exact zeros, asserted bitwise); with n, the fp32 results
differ by at most about (2n + 4 chunks + 4 blocks) 2^-24 max_k |o_k| <= (n + 2) 2^-22 max_k |o_k| (|o_k| <= v_scale
max |V|: a partial is a convex combination of V rows), so the outputs differ by at most one bf16 unit in the last
place (2^-7 of the larger) plus that: asserted as 2^-7 max(|a|, |b|) + (n + 2) 2^-22 v_scale max |V| (the absolute
term matters where partials cancel: a bound relative to the output alone is wrong there). The plans' workspaces are
filled with NaN before the first call: a merge that read the slot of a range that wrote nothing (an empty range: its
slot holds an older partial, or anything) would show. On the GPU the two plans run two different
builds of the attention kernel (MERGE_IN_PASS is a constexpr): Triton emits plain ``mul.f32`` / ``add.f32``, which
ptxas may contract into FMAs differently per build (register pressure differs: the fp8 transposed build at its
168-register cap spills 72 vs 144 bytes), so not even the untouched rows are promised bitwise; there the outputs
are compared as a whole (relative Frobenius difference <= 1e-3, 5x under the bf16 tolerance), while one build's
outputs must be bitwise equal from call to call (20 calls racing to the counters) and between graph replay and
eager.

Under the Triton interpreter the programs of a grid run one after another, so the last-arriver logic is still
exercised (the program last in order arrives last and merges), but no two pieces race; the GPU tests cover that.
"""

from __future__ import annotations

import pytest
import torch

from hpc_advise.kernels.decode_attention import op
from hpc_advise.kernels.decode_attention.reference import decode_attention_reference
from tests.kernels.test_decode_attention import (
    _STRIDES,
    BF16,
    EDGE,
    FP8,
    TOL,
    _decode_job,
    check_graph_replay,
    make_case,
    rel_err,
)

ULP_BF16 = 2.0**-7  # bf16 spacing relative to the value, at most


def mip_rows(p) -> list[list[int]]:
    """The 4 rows after the plan's G descriptors: counters, participant counts, last participants, scratch."""
    g = p.grid_size()
    return p.prog_desc.as_strided((4, g), (g, 1), 8 * g).tolist()


def launch_merges(p0) -> dict[int, tuple[int, int]]:
    """{first participant: (last participant, b * Hkv + h)} of every split segment of a merge_in_pass=0 plan."""
    firsts, bh = p0.merge_first.tolist(), p0.merge_bh.tolist()
    return {f: (q, bh[q]) for q, f in enumerate(firsts) if f >= 0}


def in_pass_widths(p) -> list[tuple[int, int]]:
    """(programs first .. last, non-empty ranges among them) of every segment the plan merges in the pass."""
    _, need, last, _ = mip_rows(p)
    return sorted((last[f] - f + 1, n) for f, n in enumerate(need) if n)


def check_bookkeeping(p, p0, n: int) -> tuple[set, set]:
    """The plan with merge_in_pass=n against p0 (same lengths, merge_in_pass=0): the same ranges and
    descriptors; segments of <= n programs counted for the pass (their non-empty participants), the others
    left to the launches, none in both. Returns the (b * Hkv + h) of the in-pass and the launch segments."""
    g = p.grid_size()
    assert torch.equal(p.prog_start, p0.prog_start)
    assert torch.equal(p.prog_desc[:, :7], p0.prog_desc[:, :7])
    starts = p.prog_start.tolist()
    counters, need, last, _ = mip_rows(p)
    assert counters == [0] * g  # zeroed by the planner, back at 0 after every call
    firsts = p.merge_first.tolist()
    in_pass, launched = set(), set()
    want_need, want_last = [0] * g, [0] * g
    for f, (q, bh) in launch_merges(p0).items():
        if q - f + 1 <= n:
            want_need[f] = sum(starts[k + 1] > starts[k] for k in range(f, q + 1))
            want_last[f] = q
            assert firsts[q] == -1  # the launch skips it
            in_pass.add(bh)
        else:
            assert firsts[q] == f
            launched.add(bh)
    assert need == want_need
    assert all(last[f] == want_last[f] for f in range(g) if want_need[f])
    if p.wide_merge:
        wide = [q for q, f in enumerate(firsts) if f >= 0 and q - f + 1 > p.merge_block]
        listed = p.wide_list.tolist()
        assert listed == wide + [-1] * (len(listed) - len(wide))
    return in_pass, launched


def compare_to_launch_merge(out, out0, p0, group: int, hkv: int, n: int, exact: bool, vmax: float) -> None:
    """out (merge_in_pass=n) against out0 (merge_in_pass=0, same inputs), module docstring: with ``exact`` (the
    interpreter) bitwise outside the in-pass segments and for in-pass segments of two participants, the others
    within one bf16 ulp plus the reordered fp32 sum's error (``vmax`` = v_scale max |V|); else (two GPU builds)
    a relative Frobenius difference of at most 1e-3."""
    if not exact:
        diff = ((out.double() - out0.double()).norm() / out0.double().norm()).item()
        assert diff <= 1e-3, diff
        return
    merged = launch_merges(p0)
    in_pass = {bh: q - f + 1 for f, (q, bh) in merged.items() if q - f + 1 <= n}
    for b in range(out.shape[0]):
        for h in range(hkv):
            rows = slice(h * group, (h + 1) * group)
            a, c = out[b, rows].float(), out0[b, rows].float()
            parts = in_pass.get(b * hkv + h)
            if parts is None or parts == 2:
                assert torch.equal(a, c), (b, h, parts)
            else:
                bound = ULP_BF16 * torch.maximum(a.abs(), c.abs()) + (parts + 2) * 2.0**-22 * vmax
                assert ((a - c).abs() <= bound).all(), (b, h, parts, (a - c).abs().max().item())


def run_pair(
    lens, *, hq, hkv, d, page, n, kv_dtype=BF16, schedule="dynamic", calls=2, tuned=False, **plan_kw
):
    """One random case planned with merge_in_pass=0 and =n (otherwise the same plan; ``tuned``: op.py's tuned
    form for the KV dtype) and run: both against the reference, n against 0, the bookkeeping, and ``calls``
    calls of the n plan (bitwise the same each time, counters back at 0); outputs and workspaces start as NaN.
    Returns (plan n, in-pass segments, launch segments)."""
    scales = (0.37, 1.9) if kv_dtype == FP8 else (1.0, 1.0)
    q, k, v, table, seq_lens = make_case(lens, hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv_dtype)
    ref = decode_attention_reference(
        q, k, v, table, seq_lens, page_size=page, k_scale=scales[0], v_scale=scales[1]
    )
    common = dict(page_size=page, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, schedule=schedule, **plan_kw)
    if tuned:
        common["kv_dtype"] = kv_dtype
    outs, plans = [], []
    for mip in (0, n):
        p = op.plan(seq_lens, table, merge_in_pass=mip, **common)
        p.ws_o.fill_(float("nan"))
        p.ws_lse.fill_(float("nan"))
        first = None
        for _ in range(calls if mip else 1):
            out = torch.full_like(q, float("nan"))
            op.run(p, q, k, v, k_scale=scales[0], v_scale=scales[1], out=out)
            assert rel_err(out, ref) <= TOL[kv_dtype]
            if first is None:
                first = out
            else:
                assert torch.equal(out, first)  # a second call of the plan: the same bits
        outs.append(first)
        plans.append(p)
    in_pass, launched = check_bookkeeping(plans[1], plans[0], n)
    exact = not torch.cuda.is_available()  # the interpreter: every operation rounded as written
    vmax = scales[1] * v.float().nan_to_num(0.0).abs().max().item()  # unused pool slots hold NaN
    compare_to_launch_merge(outs[1], outs[0], plans[0], hq // hkv, hkv, n, exact, vmax)
    return plans[1], in_pass, launched


# ---------------------------------------------------------------- CPU (interpreter) and GPU alike

KNOBS = dict(tile=16, desc=True, pt_chunk=16, wide_merge=True, merge_block=16)  # page 16 = tile: chunked ids
SMALL = dict(hq=4, hkv=2, d=64, page=16, **KNOBS)


@pytest.mark.parametrize("kv_dtype", [BF16, FP8])
def test_dynamic_in_pass_and_launch_merges_match_reference(kv_dtype):
    # edge lengths and longer ones over 13 programs: splits over 2, 3 and 4 programs; N = 3 merges those of 2 and
    # 3 in the pass and leaves those of 4 to the launch
    lens = [1, 63, 64, 65, 97, 300, 700]
    _, in_pass, launched = run_pair(
        lens, n=3, num_programs=13, kv_dtype=kv_dtype, f16_dot=kv_dtype == FP8, **SMALL
    )
    assert in_pass and launched, (in_pass, launched)


def test_transposed_kernel_in_pass_and_launch_merges():
    # kernel_transposed.py (the fp8 default) calls the same helper after its _finish
    lens = [1, 63, 64, 65, 97, 300, 700]
    _, in_pass, launched = run_pair(
        lens, n=3, num_programs=13, kv_dtype=FP8, f16_dot=True, transposed=True, **SMALL
    )
    assert in_pass and launched, (in_pass, launched)


def test_static_schedule_in_pass_and_launch_merges():
    # 3 programs per segment: short segments stay whole (empty pieces), 2-tile ones split over 2, longer over 3
    lens = [1, 17, 33, 64, 65, 97]
    _, in_pass, launched = run_pair(lens, n=2, schedule="static", static_splits=3, **SMALL)
    assert in_pass and launched, (in_pass, launched)


def test_batch_one_split_with_empty_ranges_all_in_pass():
    # 7 tiles over 12 programs: some ranges are empty inside the split segment (they wrote nothing, do not
    # arrive); N = 16 takes it in the pass, so the merge launches find nothing
    p, in_pass, launched = run_pair([97], n=16, num_programs=12, **SMALL | dict(hkv=1, hq=8))
    assert in_pass == {0} and not launched
    assert set(p.merge_first.tolist()) == {-1} and set(p.wide_list.tolist()) == {-1}
    counters, need, _, _ = mip_rows(p)
    assert need[0] == 7 and counters == [0] * 12


@pytest.mark.parametrize(
    "lens,programs,hkv,n,widths,launch",
    [
        # segments over 2, 3, 6, 6 programs in the pass (two chunks of 3 and one), 13 left to the narrow launch
        ([1, 40, 200, 700, 1500], 40, 2, 8, [(2, 2), (3, 3), (6, 6), (6, 6)], 2),
        # 5 and 32 programs in the pass (eleven chunks, the last with two), 33 left to the wide launch
        ([1, 65, 500, 520], 72, 1, 32, [(5, 5), (32, 32)], 1),
        # 32 programs, 13 of them empty (wrote nothing: their NaN slots must not be read into the result)
        ([300], 33, 1, 32, [(32, 19)], 0),
    ],
)
def test_wide_segments_merge_in_pass(lens, programs, hkv, n, widths, launch):
    # split segments over 2 .. N + 1 programs: the chunked merge against the reference and the launches
    p, in_pass, launched = run_pair(lens, n=n, num_programs=programs, **SMALL | dict(hkv=hkv, hq=4 * hkv))
    assert in_pass_widths(p) == widths
    assert len(launched) == launch


def test_update_replans_counts_in_place():
    # a plan updated to new lengths: the counts follow, counters stay 0, outputs match the reference
    lens, new = [300, 40, 97], [65, 300, 2]
    q, k, v, table, _ = make_case([700, 700, 700], hq=4, hkv=2, d=64, page=16)
    p = op.plan(
        torch.tensor(lens, dtype=torch.int32, device=q.device),
        table,
        page_size=16,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=64,
        num_programs=11,
        merge_in_pass=8,
        **KNOBS,
    )
    for ls in (lens, new):
        sl = torch.tensor(ls, dtype=torch.int32, device=q.device)
        p.update(sl, table)
        assert any(mip_rows(p)[1])
        out = torch.full_like(q, float("nan"))
        op.run(p, q, k, v, out=out)
        assert rel_err(out, decode_attention_reference(q, k, v, table, sl, page_size=16)) <= TOL[BF16]
        assert mip_rows(p)[0] == [0] * 11


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(merge_in_pass=4, loop="flat"), "needs loop='nested'"),
        (dict(merge_in_pass=-1), "merge_in_pass must be an int in 0..64"),
        (dict(merge_in_pass=65), "merge_in_pass must be an int in 0..64"),
        (dict(merge_in_pass=True), "merge_in_pass must be an int in 0..64"),
    ],
)
def test_plan_rejects_bad_merge_in_pass(kw, msg):
    lens = torch.tensor([100], dtype=torch.int32, device="cuda" if torch.cuda.is_available() else "cpu")
    table = torch.zeros(1, 2, dtype=torch.int32, device=lens.device)
    with pytest.raises(ValueError, match=msg):
        op.plan(lens, table, page_size=64, num_q_heads=8, num_kv_heads=1, head_dim=128, **kw)


# ---------------------------------------------------------------- CPU only: what Triton builds for sm_90a


@pytest.mark.slow
def test_in_pass_merge_compiles_for_sm90():
    # the plain loop for bf16 and for fp8 with f16 products, without and with the in-pass merge (pipelined
    # K/V, no spills), and the planner with its bookkeeping
    from tests.kernels.sm90_compile import compile_sm90

    jobs = []
    for mip in (False, True):
        for kv, f16 in (("bf16", False), ("fp8e4nv", True)):
            job = _decode_job(kv, 64, 3, 32, f16_dot=f16)
            job[3] |= {"PDL": True, "MERGE_IN_PASS": mip}
            jobs.append(job)
    types = "*i32 " * 13 + "i32 " * 8
    base = dict(NUM_KV_HEADS=8, TILE=64, BLOCK_B=256, BLOCK_G=512, G_STEPS=1, SEARCH_STEPS=9, BLOCK_P=16)
    jobs += [
        [_KERNEL, "plan_kernel", types, base | {"STATIC": s, "MERGE_IN_PASS": 4}, 4, 1, []]
        for s in (False, True)
    ]
    # the transposed kernel (fp8 default) at 3 programs per SM, registers capped at 168 as op._register_cap does
    types = "*bf16 *fp8e4nv *fp8e4nv *bf16 *i32 *i32 *i32 *fp32 *fp32 *fp32 fp32 fp32 " + "i32 " * 12
    consts = dict(GROUP=8, GROUP_PAD=16, HEAD_DIM=128, PAGE=64, TILE=64, NUM_STAGES=3, SCALES_FROM_PTR=False)
    consts |= dict(PT_CHUNK=32, F16_DOT=True, ASM_CVT=True, PDL=True)
    job = [_KERNEL + "_transposed", "decode_transposed_kernel", types]
    jobs += [job + [consts | {"MERGE_IN_PASS": mip}, 4, 3, _STRIDES, 168] for mip in (False, True)]
    res = compile_sm90(jobs)
    assert all(r["stack"] == 0 and r["async_copies"] > 0 for r in res[:4]), res
    # transposed: spills outside the tile loop only (72 -> 160 bytes of stack at this tree), the same barriers
    # in the loop and 3 programs per SM
    plain, merged = res[6:]
    assert merged["loop"]["local"] == 0 and merged["ctas_per_sm"] == 3, merged
    assert merged["loop"]["barriers"] == plain["loop"]["barriers"], (plain, merged)
    res = res[:6]
    # bf16 (the default's loop): 161 -> 155 registers at this tree (the chunked merge: 3 participants' partials
    # and the next 3's in flight, about 20 registers each), 3 programs per SM either way (2 shipped); fp8 with f16
    # products in the plain loop (not the fp8 default: that is the transposed kernel) 153 -> 191, 3 -> 2 per SM
    assert res[2]["ctas_per_sm"] == res[0]["ctas_per_sm"] and res[3]["ctas_per_sm"] >= 2, res
    # the planner: 8 bytes of stack with the bookkeeping in the dynamic schedule (one program per decode step)
    assert all(r["stack"] <= 8 for r in res[4:]), res[4:]


_KERNEL = "hpc_advise.kernels.decode_attention.kernel"


# ---------------------------------------------------------------- GPU, real sizes


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens,hq,hkv,kv_dtype",
    [
        (EDGE + [70000], 8, 1, BF16),
        ([128] * 8 + [3000] * 8 + [70000], 64, 8, BF16),
        (EDGE + [70000], 8, 1, FP8),
        ([128] * 8 + [3000] * 8 + [70000], 64, 8, FP8),
    ],
)
def test_gpu_real_sizes_tuned(lens, hq, hkv, kv_dtype):
    # the tuned launch form of each KV dtype and head count with merge_in_pass 4; 20 calls of one plan with
    # pieces racing to their counters: every result bitwise the first (the merge reads partials in program
    # order, whoever arrives last)
    _, in_pass, _ = run_pair(
        lens, hq=hq, hkv=hkv, d=128, page=64, n=4, kv_dtype=kv_dtype, calls=20, tuned=True
    )
    assert in_pass


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,kv_dtype", [(8, 1, BF16), (64, 8, BF16), (8, 1, FP8), (64, 8, FP8)])
def test_gpu_cuda_graph_replay_matches_eager(hq, hkv, kv_dtype):
    page = 64
    q, k, v, table, _ = make_case(
        [12800, 100, 12800, 5000], hq=hq, hkv=hkv, d=128, page=page, kv_dtype=kv_dtype
    )
    lens_buf = torch.tensor([4000, 100, 9000, 64], dtype=torch.int32, device="cuda")
    p = op.plan(
        lens_buf,
        table,
        page_size=page,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=128,
        kv_dtype=kv_dtype,
        merge_in_pass=4,
    )

    def counters_reset(_):
        assert mip_rows(p)[0] == [0] * p.grid_size()

    steps = ([4001, 1, 12000, 65], [64, 64, 64, 64], [12800, 100, 300, 5000])
    check_graph_replay(p, q, k, v, table, lens_buf, steps, page=page, each=counters_reset)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens,n",
    [
        ([65536] + [4096] * 15, 32),  # the 64K request's segments over ~17 programs each
        ([131072] + [4096] * 31, 32),  # ~17 each
        ([131072], 64),  # ~33 each
    ],
)
def test_gpu_wide_in_pass_real_sizes(lens, n):
    # 64/8 bf16, the tuned form with merge_in_pass n: the segments that went to the wide merge launch with n = 4
    # merge in the pass; 20 calls of one plan racing to the counters, every result bitwise the first
    p, in_pass, _ = run_pair(lens, hq=64, hkv=8, d=128, page=64, n=n, calls=20, tuned=True)
    assert max(w for w, _ in in_pass_widths(p)) > 16, in_pass_widths(p)


@pytest.mark.gpu
def test_gpu_wide_in_pass_cuda_graph_replay():
    # merge_in_pass 64 captured once, replayed with lengths whose segments span 1 .. ~33 programs
    page = 64
    # pages for every step's longest length of each request (a step past a request's pages would read -1 entries)
    q, k, v, table, _ = make_case([131072, 4096, 12800, 4096], hq=64, hkv=8, d=128, page=page)
    lens_buf = torch.tensor([65536, 100, 12800, 4096], dtype=torch.int32, device="cuda")
    p = op.plan(
        lens_buf,
        table,
        page_size=page,
        num_q_heads=64,
        num_kv_heads=8,
        head_dim=128,
        kv_dtype=BF16,
        merge_in_pass=64,
    )
    widest = []

    def each(_):
        assert mip_rows(p)[0] == [0] * p.grid_size()
        widest.append(max((w for w, _ in in_pass_widths(p)), default=0))

    steps = ([131072, 1, 4096, 4096], [4096] * 4, [65536, 100, 300, 4096], [131072, 100, 12800, 4096])
    check_graph_replay(p, q, k, v, table, lens_buf, steps, page=page, each=each)
    assert max(widest) > 16, widest
