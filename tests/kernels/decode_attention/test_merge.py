"""The log-sum-exp merge of split segments: the merge launch (narrow programs for segments split over at most
op.MERGE_BLOCK programs, wide ones for the others) and the in-pass merge (``merge_in_pass`` N: a segment split over
at most N programs is merged inside the attention pass by the participant that arrives last at its counter,
``kernel._arrive_and_merge``; the launch skips it).

Checked: the planner's bookkeeping against the launch-merge plan of the same lengths (no segment merged twice or
never), outputs against the float64 reference (helpers.TOL) and against ``merge_in_pass=0``, a second call of
one plan (counters back at 0), and on the GPU many calls of one plan (true races: every result bitwise the same).

Equality with ``merge_in_pass=0`` under the interpreter (which rounds every operation as written): rows of
segments that are not split, or are merged by the launch, run the same code and are bitwise equal. Rows merged in
the pass (``kernel._merge_partials``: chunks of 3 participants, a running maximum) compute the same weighted
average sum_k w_k o_k / sum_k w_k as the launch (blocks of 16) with the weights rounded differently (one rescale
per chunk whose maximum grows: about 2 2^-24 relative each) and the sums in another order: with two participants
the same numbers (asserted bitwise); with n, the fp32 results differ by at most (n + 2) 2^-22 max_k |o_k| (|o_k| <=
v_scale max |V|: a partial is a convex combination of V rows), so the outputs differ by at most one bf16 unit in
the last place (2^-7 of the larger) plus that. The workspaces are filled with NaN before the first call: a merge
that read the slot of a range that wrote nothing would show. On the GPU the two plans run two builds of the
attention kernel (MERGE_IN_PASS is a constexpr) that ptxas may contract into FMAs differently, so there the outputs
are compared as a whole (relative difference <= 1e-3, 5x under the bf16 tolerance).

Under the interpreter the programs of a grid run one after another, so the last-arriver logic runs (the program
last in order arrives last) but no two pieces race; the GPU tests cover that.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.decode_attention import op  # noqa: E402
from hpc_advise.kernels.decode_attention.config import Config  # noqa: E402
from hpc_advise.kernels.decode_attention.reference import decode_attention_reference  # noqa: E402
from tests.kernels.decode_attention.helpers import (  # noqa: E402
    BF16,
    FP8,
    FP8_SCALES,
    TOL,
    check,
    check_graph_replay,
    check_ranges,
    fix_grid,
    make_case,
    merged_rows,
    plan_of,
    rel_err,
)

ULP_BF16 = 2.0**-7  # bf16 spacing relative to the value, at most
SMALL = dict(hq=4, hkv=2, d=64, page=16)  # page 16 = tile 16: page ids loaded a chunk at a time


def small_config(kv_dtype=BF16, **keys) -> Config:
    return Config(tile=16, ctas_per_sm=1, f16_dot=kv_dtype == FP8, **keys)


@pytest.mark.parametrize("kv_dtype", [BF16, FP8])
def test_merge_launch_takes_narrow_and_wide_segments(monkeypatch, kv_dtype):
    # 700 tokens = 44 tiles over ~27 of 40 programs (> 16 participants: the wide programs), 300 tokens over ~12
    # (a narrow program), 5 tokens in one program (no merge)
    lens = [700, 300, 5]
    fix_grid(monkeypatch, 40)
    p, _ = check(lens, hq=4, hkv=1, d=64, page=16, kv_dtype=kv_dtype, config=small_config(kv_dtype))
    check_ranges(p, lens, 1)
    assert merged_rows(p, wide=True) == [(0, 0)] and merged_rows(p, wide=False) == [(1, 0)]
    listed = p.wide_list.tolist()
    assert len(listed) == 40 // op.MERGE_BLOCK + 1 and listed[1:] == [-1] * (len(listed) - 1)


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
    """Plan p (merge_in_pass n) against p0 (same lengths, 0): the same ranges and descriptors; segments of <= n
    programs counted for the pass, the others left to the launch, none in both. Returns the (b * Hkv + h) of
    the in-pass and of the launch segments."""
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
    return in_pass, launched


def compare_to_launch_merge(out, out0, p0, group, hkv, n, vmax) -> None:
    """out (merge_in_pass n) against out0 (0), module docstring."""
    if torch.cuda.is_available():  # two GPU builds
        diff = ((out.double() - out0.double()).norm() / out0.double().norm()).item()
        assert diff <= 1e-3, diff
        return
    in_pass = {bh: q - f + 1 for f, (q, bh) in launch_merges(p0).items() if q - f + 1 <= n}
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


def run_pair(lens, *, hq, hkv, d, page, n, cfg, kv_dtype=BF16, schedule="dynamic", calls=2):
    """One random case planned with ``cfg`` at merge_in_pass 0 and n and run: both against the reference, n
    against 0, the bookkeeping, and ``calls`` calls of the n plan (bitwise the same each time, counters back at
    0); outputs and workspaces start as NaN. Returns (plan n, in-pass segments, launch segments)."""
    scales = FP8_SCALES if kv_dtype == FP8 else (1.0, 1.0)
    q, k, v, table, seq_lens = make_case(lens, hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv_dtype)
    ref = decode_attention_reference(
        q, k, v, table, seq_lens, page_size=page, k_scale=scales[0], v_scale=scales[1]
    )
    outs, plans = [], []
    for mip in (0, n):
        p = plan_of(
            seq_lens,
            table,
            hq=hq,
            hkv=hkv,
            d=d,
            page=page,
            config=replace(cfg, merge_in_pass=mip),
            schedule=schedule,
        )
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
    vmax = scales[1] * v.float().nan_to_num(0.0).abs().max().item()  # unused pool slots hold NaN
    compare_to_launch_merge(outs[1], outs[0], plans[0], hq // hkv, hkv, n, vmax)
    return plans[1], in_pass, launched


@pytest.mark.parametrize("kv_dtype,transposed", [(BF16, False), (FP8, False), (FP8, True)])
def test_in_pass_and_launch_merges_in_one_call(monkeypatch, kv_dtype, transposed):
    # edge lengths and longer ones over 13 programs: splits over 2, 3 and 4 programs; N = 3 merges those of 2
    # and 3 in the pass and leaves those of 4 to the launch (the transposed kernel calls the same helper)
    fix_grid(monkeypatch, 13)
    cfg = small_config(kv_dtype, transposed=transposed)
    _, in_pass, launched = run_pair([1, 63, 64, 65, 97, 300, 700], n=3, cfg=cfg, kv_dtype=kv_dtype, **SMALL)
    assert in_pass and launched, (in_pass, launched)


def test_static_schedule_in_pass_and_launch_merges(monkeypatch):
    # 3 programs per segment: short segments stay whole (empty pieces), 2-tile ones split over 2, longer over 3
    fix_grid(monkeypatch, 36)
    lens = [1, 17, 33, 64, 65, 97]
    _, in_pass, launched = run_pair(lens, n=2, cfg=small_config(), schedule="static", **SMALL)
    assert in_pass and launched, (in_pass, launched)


def test_batch_one_split_with_empty_ranges_all_in_pass(monkeypatch):
    # 7 tiles over 12 programs: some ranges inside the split segment are empty (they wrote nothing, do not
    # arrive); N = 16 takes it in the pass, so the merge launch finds nothing
    fix_grid(monkeypatch, 12)
    p, in_pass, launched = run_pair([97], n=16, cfg=small_config(), **SMALL | dict(hkv=1, hq=8))
    assert in_pass == {0} and not launched
    assert set(p.merge_first.tolist()) == {-1} and set(p.wide_list.tolist()) == {-1}
    counters, need, _, _ = mip_rows(p)
    assert need[0] == 7 and counters == [0] * 12


@pytest.mark.parametrize(
    "lens,programs,hkv,n,widths,launch",
    [
        # segments over 2, 3, 6, 6 programs in the pass (two chunks of 3 and one), 13 left to the narrow launch
        ([1, 40, 200, 700, 1500], 40, 2, 8, [(2, 2), (3, 3), (6, 6), (6, 6)], 2),
        # 32 programs, 13 of them empty (wrote nothing: their NaN slots must not be read into the result)
        ([300], 33, 1, 32, [(32, 19)], 0),
    ],
)
def test_wide_segments_merge_in_pass(monkeypatch, lens, programs, hkv, n, widths, launch):
    fix_grid(monkeypatch, programs)
    p, _, launched = run_pair(lens, n=n, cfg=small_config(), **SMALL | dict(hkv=hkv, hq=4 * hkv))
    assert in_pass_widths(p) == widths
    assert len(launched) == launch


def test_update_replans_counts_in_place(monkeypatch):
    fix_grid(monkeypatch, 11)
    q, k, v, table, _ = make_case([700, 700, 700], **SMALL)
    p = plan_of(
        torch.tensor([300, 40, 97], dtype=torch.int32, device=q.device),
        table,
        **SMALL,
        config=small_config(merge_in_pass=8),
    )
    for ls in ([300, 40, 97], [65, 300, 2]):
        sl = torch.tensor(ls, dtype=torch.int32, device=q.device)
        p.update(sl, table)
        assert any(mip_rows(p)[1])
        out = torch.full_like(q, float("nan"))
        op.run(p, q, k, v, out=out)
        assert rel_err(out, decode_attention_reference(q, k, v, table, sl, page_size=16)) <= TOL[BF16]
        assert mip_rows(p)[0] == [0] * 11


# ---------------------------------------------------------------- GPU, real sizes

EDGE = [1, 63, 64, 65, 97] + [4096] * 11


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens,hq,hkv,kv_dtype,n",
    [
        (EDGE + [70000], 8, 1, BF16, 4),
        ([128] * 8 + [3000] * 8 + [70000], 64, 8, BF16, 4),
        (EDGE + [70000], 8, 1, FP8, 4),
        ([128] * 8 + [3000] * 8 + [70000], 64, 8, FP8, 4),
        ([65536] + [4096] * 15, 64, 8, BF16, 32),  # the tuned bf16 64/8 form: ~17 programs per segment
        ([131072], 64, 8, BF16, 64),  # ~33 each
    ],
)
def test_gpu_in_pass_merge_races(lens, hq, hkv, kv_dtype, n):
    # the tuned form of each KV dtype and head count with merge_in_pass n; 20 calls of one plan with pieces
    # racing to their counters: every result bitwise the first
    cfg = op.tuned_config(kv_dtype, hkv, 128, 64)
    p, in_pass, _ = run_pair(lens, hq=hq, hkv=hkv, d=128, page=64, n=n, cfg=cfg, kv_dtype=kv_dtype, calls=20)
    assert in_pass
    if n > 16:
        assert max(w for w, _ in in_pass_widths(p)) > 16, in_pass_widths(p)


@pytest.mark.gpu
@pytest.mark.parametrize("lens,kv_dtype", [([131072], BF16), ([131072], FP8), (EDGE + [70000], BF16)])
def test_gpu_merge_launch_real_sizes(lens, kv_dtype):
    # one segment over all programs (wide programs), through the bf16 and the transposed fp8 8/1 default, and
    # narrow and wide segments in one call; 3 calls of one plan bitwise the first
    q, k, v, table, seq_lens = make_case(lens, hq=8, hkv=1, d=128, page=64, kv_dtype=kv_dtype)
    p = plan_of(seq_lens, table, hq=8, hkv=1, d=128, page=64, kv_dtype=kv_dtype)
    scales = FP8_SCALES if kv_dtype == FP8 else (1.0, 1.0)
    outs = [
        op.run(p, q, k, v, k_scale=scales[0], v_scale=scales[1], out=torch.full_like(q, float("nan")))
        for _ in range(3)
    ]
    ref = decode_attention_reference(
        q, k, v, table, seq_lens, page_size=64, k_scale=scales[0], v_scale=scales[1]
    )
    assert rel_err(outs[0], ref) <= TOL[kv_dtype]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    assert merged_rows(p, wide=True)
    if len(lens) > 16:
        assert merged_rows(p, wide=False), p.merge_first.tolist()


@pytest.mark.gpu
def test_gpu_in_pass_merge_cuda_graph_replay():
    # the tuned bf16 64/8 form (merge_in_pass 32) captured once, replayed with lengths whose segments span
    # 1 .. ~33 programs (the widest go to the wide merge programs); counters back at 0 after every replay
    page = 64
    q, k, v, table, _ = make_case([131072, 4096, 12800, 4096], hq=64, hkv=8, d=128, page=page)
    lens_buf = torch.tensor([65536, 100, 12800, 4096], dtype=torch.int32, device="cuda")
    p = plan_of(lens_buf, table, hq=64, hkv=8, d=128, page=page, kv_dtype=BF16)
    assert p.config.merge_in_pass == 32

    def each(_):
        assert mip_rows(p)[0] == [0] * p.grid_size()

    steps = ([131072, 1, 4096, 4096], [4096] * 4, [65536, 100, 300, 4096], [131072, 100, 12800, 4096])
    check_graph_replay(p, q, k, v, table, lens_buf, steps, page=page, each=each)
