"""Tests of hpc_advise.kernels.decode_attention against the float64 reference.

CPU: the Triton interpreter (tests/conftest.py), small shapes, a small persistent grid so segments are
split and merged. GPU (``-m gpu``, H200): real sizes, fp8, long contexts, CUDA-graph replay.
Inputs are fresh random draws; pool slots no request uses and outputs are poisoned with NaN.

Tolerances (relative Frobenius error against float64 on the same, dequantised inputs), declared once:
- bf16 / fp16 KV: 5e-3. q, K and V are exact inputs; the kernel adds two roundings to 8 mantissa bits
  (the probabilities P before the P.V product, and the output), each about 2^-9/sqrt(3) ~ 1.1e-3 relative
  RMS, plus fp32 accumulation (~1e-6): about 2e-3 expected, 5e-3 leaves margin for few-token rows where
  one rounding dominates.
- fp8 e4m3 KV: 2e-2. The KV values are exact (e4m3 embeds in bf16), so the expected error is the bf16 one;
  the looser bound covers logit scales folded into fp32 and outliers of e4m3's coarse grid that make
  single probabilities dominate a row (fewer terms to average the P rounding).
"""

from __future__ import annotations

import math

import pytest
import torch

from hpc_advise.kernels.decode_attention import op
from hpc_advise.kernels.decode_attention.reference import decode_attention_reference
from hpc_advise.runtime.benches import decode_attention as da

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
TOL = {BF16: 5e-3, torch.float16: 5e-3, FP8: 2e-2}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(
    lens,
    *,
    hq,
    hkv,
    d,
    page,
    kv_dtype=torch.bfloat16,
    q_dtype=torch.bfloat16,
    extra_pages=3,
    extra_cols=1,
    device=DEVICE,
    gen=None,
):
    """Random q, a NaN-poisoned KV pool with each request's pages scattered at random, the page table
    (unused columns hold -1) and int32 lengths."""
    gen = gen or torch.Generator(device="cpu").manual_seed(torch.seed() % (2**31))
    b = len(lens)
    need = [math.ceil(n / page) for n in lens]
    num_pages = sum(need) + extra_pages
    max_pages = max(need) + extra_cols
    k = torch.full((num_pages, page, hkv, d), float("nan"), dtype=torch.float32)
    v = torch.full_like(k, float("nan"))
    perm = torch.randperm(num_pages, generator=gen)
    table = torch.full((b, max_pages), -1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(lens):
        pages = perm[used : used + need[i]]
        used += need[i]
        table[i, : need[i]] = pages.int()
        for j, pg in enumerate(pages.tolist()):
            fill = min(page, n - j * page)  # slots past the length stay NaN
            k[pg, :fill] = torch.randn(fill, hkv, d, generator=gen)
            v[pg, :fill] = torch.randn(fill, hkv, d, generator=gen)
    q = torch.randn(b, hq, d, generator=gen).to(q_dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    # table entries past the sequence are never read: -1 there would fault if they were
    return (
        q.to(device),
        k.to(kv_dtype).to(device),
        v.to(kv_dtype).to(device),
        table.to(device),
        seq_lens.to(device),
    )


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(out).any(), "NaN in output (unwritten rows or poisoned slots read)"
    return ((out.double() - ref).norm() / ref.norm()).item()


def check(
    lens,
    *,
    hq,
    hkv,
    d,
    page,
    kv_dtype=torch.bfloat16,
    schedule="dynamic",
    scales=(1.0, 1.0),
    tuned=False,
    q_dtype=torch.bfloat16,
    **plan_kw,
):
    """One random case through plan + run against the reference; ``tuned``: the launch variant
    op.TUNED_BY_KV_DTYPE gives this KV dtype (what decode_attention() and the SGLang backend run) for the
    knobs ``plan_kw`` leaves unset, else op.py's module defaults. fp16 KV needs ``q_dtype=torch.float16``."""
    if tuned:
        plan_kw["kv_dtype"] = kv_dtype
    q, k, v, table, seq_lens = make_case(
        lens, hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv_dtype, q_dtype=q_dtype
    )
    p = op.plan(
        seq_lens,
        table,
        page_size=page,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        schedule=schedule,
        **plan_kw,
    )
    out = torch.full_like(q, float("nan"))
    op.run(p, q, k, v, k_scale=scales[0], v_scale=scales[1], out=out)
    ref = decode_attention_reference(
        q, k, v, table, seq_lens, page_size=page, k_scale=scales[0], v_scale=scales[1]
    )
    err = rel_err(out, ref)
    assert err <= TOL[kv_dtype], f"relative error {err:.2e} > {TOL[kv_dtype]:.0e}"
    return p, out


def check_graph_replay(p, q, k, v, table, lens_buf, steps, *, page, eager=None, each=None):
    """GPU: ``plan.update`` + ``run`` of plan ``p`` (lengths read from ``lens_buf``) warmed up on a side stream,
    captured in a CUDA graph, then replayed once per lengths list in ``steps`` (written into ``lens_buf``, the
    output poisoned first): bitwise the eager call (``eager(table)``, default ``run`` on the re-updated plan)
    and within the bf16 tolerance of the reference. ``each(lengths)`` adds checks right after each replay."""
    table_buf, out = table.clone(), torch.empty_like(q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        p.update(lens_buf, table_buf)
        op.run(p, q, k, v, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        p.update(lens_buf, table_buf)
        op.run(p, q, k, v, out=out)
    held = (table >= 0).sum(dim=1).tolist()  # pages each request's row holds
    for new in steps:
        # a length past the request's pages is not a valid input (its table entries are -1): a test bug
        assert all(n <= page * h for n, h in zip(new, held, strict=True)), (new, [page * h for h in held])
        lens_buf.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        if each is not None:
            each(new)
        want = eager(table_buf) if eager is not None else op.run(p.update(lens_buf, table_buf), q, k, v)
        assert torch.equal(out, want), new
        ref = decode_attention_reference(q, k, v, table_buf, lens_buf, page_size=page)
        assert rel_err(out, ref) <= TOL[torch.bfloat16], new


# ---------------------------------------------------------------- CPU (interpreter) and GPU alike


@pytest.mark.parametrize("schedule", ["dynamic", "static"])
@pytest.mark.parametrize(
    "lens,hq,hkv,page",
    [
        ([1, 63, 64, 65, 97], 8, 1, 16),  # edge lengths around a tile, group 8
        ([97, 5], 5, 1, 1),  # odd group, page 1 (per-token page table)
        ([40, 130, 2], 4, 2, 64),  # two KV heads, page larger than the tile
        ([200], 16, 1, 16),  # group 16, one request split over every program
    ],
)
def test_matches_reference(lens, hq, hkv, page, schedule):
    check(lens, hq=hq, hkv=hkv, d=64, page=page, schedule=schedule, tile=16, num_programs=5)


@pytest.mark.parametrize("loop,prefetch", [("flat", None), ("nested", False), ("nested", True)])
def test_loop_variants_and_tiles_spanning_pages(loop, prefetch):
    # tile 32 over pages of 16 (page ids per token) and over pages of 64 (one page id per tile)
    kw = dict(loop=loop, prefetch=prefetch)
    check([45, 100, 3], hq=4, hkv=1, d=64, page=16, tile=32, num_programs=3, **kw)
    check([130, 64], hq=3, hkv=1, d=64, page=64, tile=32, num_programs=4, schedule="static", **kw)


@pytest.mark.parametrize(
    "lens,hq,hkv,page,tile,kv_dtype,extra",
    [
        ([1, 63, 64, 65, 97], 8, 1, 16, 16, BF16, {}),  # edge lengths; ranges cross requests
        ([97, 1, 65], 4, 2, 1, 16, FP8, {}),  # page 1, two KV heads: (b, h + 1) and (b + 1, 0) steps
        ([130, 64, 63], 3, 1, 64, 128, FP8, {}),  # 2 pages of 64 per 128-token step (fp8's tile)
        ([65, 200], 2, 2, 16, 32, BF16, {"schedule": "static"}),
        ([97, 40, 1], 4, 1, 16, 16, BF16, {"prefetch": True}),
        # page ids of 16 tiles per load (pt_chunk): one id per tile, two per tile, page 1 (ignored)
        ([1, 63, 64, 65, 97, 700], 8, 1, 64, 16, BF16, {"pt_chunk": 16}),
        ([130, 64, 63, 1, 97], 6, 2, 16, 32, FP8, {"pt_chunk": 16}),
        ([130, 64, 63, 1], 3, 1, 16, 32, BF16, {"pt_chunk": 16, "schedule": "static"}),
        ([97, 5, 65], 5, 1, 1, 16, BF16, {"pt_chunk": 16}),
        # 128-token tiles over pages of 64 (sweep run 10's candidate): two page ids per tile, 32 tiles per load
        ([1, 63, 64, 65, 97, 300], 8, 1, 64, 128, BF16, {"pt_chunk": 32, "num_stages": 2}),
    ],
)
def test_desc_variant(lens, hq, hkv, page, tile, kv_dtype, extra):
    # desc=True: each program's first segment comes from the planner's descriptor and later segments
    # are stepped to without request-start lookups; 5 programs split and merge segments
    scales = (0.37, 1.9) if kv_dtype == FP8 else (1.0, 1.0)
    p, _ = check(
        lens,
        hq=hq,
        hkv=hkv,
        d=64,
        page=page,
        kv_dtype=kv_dtype,
        tile=tile,
        num_programs=5,
        desc=True,
        scales=scales,
        **extra,
    )
    starts, desc = p.prog_start.tolist(), p.prog_desc.tolist()
    tiles = [max(1, math.ceil(n / tile)) for n in lens]
    for g in range(p.grid_size()):
        u_b, u_e, b, h, t0, n_tiles, seq_len, _ = desc[g]
        assert (u_b, u_e) == (starts[g], starts[g + 1])
        if u_b < u_e:  # the descriptor names the unit u_b: request b, KV head h, tile t0
            assert (n_tiles, seq_len) == (tiles[b], lens[b])
            assert sum(tiles[:b]) * hkv + h * n_tiles + t0 == u_b


@pytest.mark.parametrize("merge_block", [16, 128])
def test_merge_block_long_segment_over_many_programs(merge_block):
    # a 700-token request over 40 programs: one segment with ~40 partials, 3 merge steps at 16, 1 at 128
    p, _ = check(
        [700, 3], hq=4, hkv=1, d=64, page=16, tile=16, num_programs=40, merge_block=merge_block, desc=True
    )
    assert max(p.merge_first.tolist()) >= 0


def _cost_of(lens, tile, hkv, seg_cost):
    """Per unit (request-major, then KV head, then tile): its cost in the planner's model."""
    costs = []
    for n in lens:
        tiles = max(1, math.ceil(n / tile))
        costs += ([1 + seg_cost] + [1] * (tiles - 1)) * hkv
    return costs


@pytest.mark.parametrize("seg_cost", [0, 3])
def test_plan_balances_tiles_and_segment_starts(seg_cost):
    # short requests next to long ones: with seg_cost > 0 a program that starts many segments gets fewer
    # tiles; every program's cost stays within one share + one segment start of the even split
    lens = [20] * 12 + [700, 333, 1, 90]
    hkv, tile, g = 2, 16, 11
    _, _, _, table, seq_lens = make_case(lens, hq=4, hkv=hkv, d=64, page=16)
    p = op.plan(
        seq_lens,
        table,
        page_size=16,
        num_q_heads=4,
        num_kv_heads=hkv,
        head_dim=64,
        tile=tile,
        num_programs=g,
        seg_cost=seg_cost,
    )
    costs = _cost_of(lens, tile, hkv, seg_cost)
    starts = p.prog_start.tolist()
    assert starts[0] == 0 and starts[-1] == len(costs) and starts == sorted(starts)
    share = math.ceil(sum(costs) / g)
    per_prog = [sum(costs[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert max(per_prog) <= share + seg_cost, (per_prog, share)
    if seg_cost:  # the programs over the 12 short requests hold fewer tiles than the others
        tiles = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
        assert tiles[0] < max(tiles), tiles
    # merge duty: the first participant (merge_first) holds the split segment's first unit
    firsts, segs = p.merge_first.tolist(), p.merge_seg.tolist()
    for q, first in enumerate(firsts):
        if first >= 0:
            assert starts[first] <= segs[q] < starts[first + 1] and segs[q] < starts[q]
    check(lens, hq=4, hkv=hkv, d=64, page=16, tile=tile, num_programs=g, seg_cost=seg_cost, desc=True)


@pytest.mark.parametrize("kv_dtype", [BF16, FP8])
def test_wide_merge_takes_segments_over_many_programs(kv_dtype):
    # 700 tokens = 44 tiles over ~27 of 40 programs (> 16 participants: the wide programs), 300 tokens over
    # ~12 (a narrow program), 5 tokens in one program (no merge)
    lens = [700, 300, 5]
    scales = (0.37, 1.9) if kv_dtype == FP8 else (1.0, 1.0)
    p, _ = check(
        lens,
        hq=4,
        hkv=1,
        d=64,
        page=16,
        tile=16,
        num_programs=40,
        merge_block=16,
        wide_merge=True,
        desc=True,
        kv_dtype=kv_dtype,
        scales=scales,
    )
    firsts = p.merge_first.tolist()
    wide = [q for q, f in enumerate(firsts) if f >= 0 and q - f + 1 > 16]
    narrow = [q for q, f in enumerate(firsts) if f >= 0 and q - f + 1 <= 16]
    assert len(wide) == 1 and len(narrow) == 1, firsts
    listed = p.wide_list.tolist()
    assert len(listed) == 40 // 16 + 1 and listed == wide + [-1] * (len(listed) - 1)


def merged_rows(p, wide: bool) -> list[tuple[int, int]]:
    """(request, KV head) of the split segments the merge launch combines: those over more than merge_block
    programs (its wide programs, ``wide``) or the others (its narrow ones)."""
    firsts, bh = p.merge_first.tolist(), p.merge_bh.tolist()
    return [
        divmod(bh[q], p.num_kv_heads)
        for q, f in enumerate(firsts)
        if f >= 0 and (q - f + 1 > p.merge_block) == wide
    ]


def segment_rows(out: torch.Tensor, segs: list[tuple[int, int]], group: int) -> torch.Tensor:
    return torch.stack([out[b, h * group : (h + 1) * group] for b, h in segs])


@pytest.mark.parametrize("kv_dtype", [BF16, FP8])
def test_merge_launches_narrow_and_wide_segments_bitwise(kv_dtype):
    # the adaptive merge, one launch: a segment over <= merge_block (16) programs is combined by a narrow program
    # (16 partials per step, 64 columns), a wider one by wide programs (128 per step on WIDE_MERGE_COLS-column
    # slices); here both kinds in one call (700 tokens = 44 tiles over ~27 of 40 programs, 300 over ~12),
    # against float64, NaN-poisoned output, twice on one plan. Bitwise, under the interpreter (which rounds
    # every operation as written; on the GPU a build's reduction order depends on its warps and tile): the merge
    # re-run into an fp32 output (the bf16 output hides the difference) gives the narrow rows of a merge of every
    # segment at 16 per step and the wide rows of one at 128 per step on 64-column tiles (wide_merge off, the
    # same schedule and partials), and those two differ on the wide rows, so a row merged by the wrong path,
    # block or columns fails. (It held for the two launches, 98a076b's one launch and this one.)
    lens, hq, hkv, d, page = [700, 300, 5, 64], 4, 1, 64, 16
    scales = (0.37, 1.9) if kv_dtype == FP8 else (1.0, 1.0)
    q, k, v, table, seq_lens = make_case(lens, hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv_dtype)
    ref = decode_attention_reference(
        q, k, v, table, seq_lens, page_size=page, k_scale=scales[0], v_scale=scales[1]
    )
    knobs = dict(
        page_size=page, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, tile=16, num_programs=40, desc=True
    )
    merged = {}
    for form, kw in (("adaptive", dict(merge_block=16, wide_merge=True)), ("16", dict(merge_block=16)),
                     ("128", dict(merge_block=128))):  # fmt: skip
        p = op.plan(seq_lens, table, kv_dtype=kv_dtype, pdl=True, **knobs | dict(wide_merge=False) | kw)
        calls = []
        for _ in range(2):
            out = torch.full_like(q, float("nan"))
            calls.append(op.run(p, q, k, v, k_scale=scales[0], v_scale=scales[1], out=out))
        assert torch.equal(calls[0], calls[1]), form
        err = rel_err(calls[0], ref)
        assert err <= TOL[kv_dtype], (form, err)
        merged[form] = torch.full(q.shape, float("nan"), dtype=torch.float32, device=q.device)
        op._merge(p, merged[form], pdl=False)  # the partials of the last call, merged again into fp32
        if form == "adaptive":
            narrow, wide = merged_rows(p, wide=False), merged_rows(p, wide=True)
            assert len(wide) == 1 and len(narrow) >= 1, p.merge_first.tolist()
            assert [w for w in p.wide_list.tolist() if w >= 0] == [
                g for g, f in enumerate(p.merge_first.tolist()) if f >= 0 and g - f + 1 > 16
            ]
            # exactly the split segments' rows are merged: every other row of the fp32 output stays NaN
            rows = segment_rows(merged[form], narrow + wide, hq // hkv)
            assert not rows.isnan().any() and merged[form].isnan().sum() == q.numel() - rows.numel()
    group = hq // hkv
    got = {kind: segment_rows(merged["adaptive"], segs, group) for kind, segs in (("n", narrow), ("w", wide))}
    if not q.is_cuda:  # the interpreter: bitwise, and the two step widths tell the paths apart
        assert torch.equal(got["n"], segment_rows(merged["16"], narrow, group))
        assert torch.equal(got["w"], segment_rows(merged["128"], wide, group))
        assert not torch.equal(segment_rows(merged["16"], wide, group), got["w"]), (
            "16 and 128 per step must differ"
        )
    else:  # GPU builds order their reductions by tile shape (8- vs 64-column slices): fp32 rounding apart
        # (seen on the H200, 2026-11-30: ~2e-5 relative on a few elements; a wrong row or segment is O(1) off)
        torch.testing.assert_close(got["n"], segment_rows(merged["16"], narrow, group), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got["w"], segment_rows(merged["128"], wide, group), rtol=1e-4, atol=1e-6)


# the merge forms of test_merge_hoist_is_bitwise_the_pre_mprol_form: (name, op.plan keywords, op.py constants);
# WIDE_MERGE_BLOCK 32 (sweep flag '-wp32') puts the wide segment (~34 participants) in two wide steps
_HOIST_FORMS = [
    ("narrow steps", dict(merge_block=16, wide_merge=False), {}),
    ("wide steps", dict(merge_block=16, wide_merge=True), {"wide_merge_block": 32}),
    ("shipped", dict(merge_block=16, wide_merge=True), {}),
]


@pytest.mark.parametrize("name, kw, consts", _HOIST_FORMS, ids=[f[0] for f in _HOIST_FORMS])
def test_merge_hoist_is_bitwise_the_pre_mprol_form(name, kw, consts):
    # op.MERGE_HOIST 1 (kernel._combine_segment's HOIST, shipped since sweep mprol's second timing; 0 the form before) loads the segment, its
    # output row and the first step's workspace slots before griddepcontrol.wait and each later step's slots during
    # the step before (narrow programs without wide_merge after its math, wide ones before it; narrow programs with
    # wide_merge take one step, no next-step code). Same partials, merged again into fp32 outputs (the bf16 output
    # hides last bits) by the hoisted form and by the shipped one: bitwise under the interpreter, on narrow programs
    # over 3 steps of 16, wide ones over 2 steps of 32 and the shipped adaptive launch (one step each), and the two
    # calls' bf16 outputs too. 2000 tokens = 125 tiles over ~34 of 40 programs, 300 over ~6 (a narrow segment beside
    # the wide one), 5 and 64 tokens. The interpreter runs no griddepcontrol (op.run launches without PDL there). On
    # the GPU both forms are PDL launches, two builds whose reductions may be ordered differently: within fp32
    # rounding there (a wrong slot or step is off by far more).
    lens, hq, hkv, d, page = [2000, 300, 5, 64], 4, 1, 64, 16
    q, k, v, table, seq_lens = make_case(lens, hq=hq, hkv=hkv, d=d, page=page)
    knobs = dict(page_size=page, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, tile=16, num_programs=40)
    pdl = q.is_cuda and not op._interpreting()
    with da.op_constants(consts):
        p = op.plan(seq_lens, table, desc=True, pdl=True, **knobs, **kw)
        block = op.WIDE_MERGE_BLOCK if p.wide_merge else p.merge_block
        firsts = p.merge_first.tolist()
        longest = max(g - f + 1 for g, f in enumerate(firsts) if f >= 0)
        steps = {"narrow steps": 3, "wide steps": 2, "shipped": 1}[name]
        assert (steps - 1) * block < longest <= steps * block and longest > 16, (name, longest, block)
        outs, merged = {}, {}
        for hoist in (1, 0):
            with da.op_constants({"merge_hoist": hoist}):
                outs[hoist] = op.run(p, q, k, v, out=torch.full_like(q, float("nan")))
                merged[hoist] = torch.full(q.shape, float("nan"), dtype=torch.float32, device=q.device)
                op._merge(p, merged[hoist], pdl=pdl)
    assert op.MERGE_HOIST == 1  # restored
    rows = segment_rows(merged[1], merged_rows(p, wide=False) + merged_rows(p, wide=True), hq // hkv)
    assert not rows.isnan().any()
    assert torch.equal(merged[1].isnan(), merged[0].isnan()), name  # the same rows merged
    if op._interpreting():
        assert torch.equal(merged[1].nan_to_num(7.0), merged[0].nan_to_num(7.0)), name
        assert torch.equal(outs[1], outs[0]), name
    else:
        torch.testing.assert_close(merged[1].nan_to_num(7.0), merged[0].nan_to_num(7.0), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(outs[1].float(), outs[0].float(), rtol=2**-7, atol=1e-5)
    ref = decode_attention_reference(q, k, v, table, seq_lens, page_size=page)
    assert rel_err(outs[1], ref) <= TOL[BF16], name


@pytest.mark.parametrize("q_mag", [3e5, 1.0, 1e-6])
def test_fp8_products_in_fp16_any_q_magnitude(q_mag):
    # f16_dot: e4m3 K/V convert to fp16 exactly; q is brought into fp16's range by a power of two per
    # segment, so q values past fp16's 65504 or under its normal range stay exact (bf16 holds them)
    lens = [97, 1, 65, 300]
    q, k, v, table, seq_lens = make_case(lens, hq=4, hkv=2, d=64, page=16, kv_dtype=FP8)
    q = (q.float() * q_mag).to(q.dtype)
    # one logit scale for every magnitude: softmax neither flat nor one-hot
    sm = 0.3 / (q.float().abs().amax().item() * math.sqrt(64))
    p = op.plan(
        seq_lens,
        table,
        page_size=16,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=64,
        tile=16,
        num_programs=5,
        desc=True,
        f16_dot=True,
        kv_dtype=FP8,
    )
    out = torch.full_like(q, float("nan"))
    op.run(p, q, k, v, k_scale=0.37, v_scale=1.9, sm_scale=sm, out=out)
    ref = decode_attention_reference(
        q, k, v, table, seq_lens, page_size=16, k_scale=0.37, v_scale=1.9, sm_scale=sm
    )
    assert rel_err(out, ref) <= TOL[FP8]


@pytest.mark.parametrize("kv_dtype", [BF16, FP8])
def test_tuned_variant_matches_reference(kv_dtype):
    # the measured defaults per KV dtype (desc + next segment ahead, page-id chunks, adaptive merge,
    # segment-start cost; fp8: fp16 products) on edge lengths, a long request and two KV heads
    scales = (0.37, 1.9) if kv_dtype == FP8 else (1.0, 1.0)
    p, _ = check(
        [1, 63, 64, 65, 97, 700],
        hq=6,
        hkv=2,
        d=64,
        page=16,
        tile=16,
        num_programs=64,
        kv_dtype=kv_dtype,
        scales=scales,
        tuned=True,
    )
    firsts = p.merge_first.tolist()
    assert max(p.wide_list.tolist()) >= 0, "the 700-token segments should be split over > 16 programs"
    assert any(f >= 0 and q - f + 1 <= p.merge_block for q, f in enumerate(firsts)), "and some narrowly"


@pytest.mark.parametrize("schedule", ["dynamic", "static"])
def test_tuned_many_kv_heads_fp8_matches_reference(schedule):
    # fp8 with 8 KV heads: the tuned variant (TUNED_MANY_KV_HEADS, sweep fp8t) runs the transposed kernel, 4
    # warps over 64-token tiles; group 2, page 64, edge lengths of 32- and 64-token tiles and a request split
    # over several programs
    p, _ = check(
        [1, 31, 32, 33, 63, 64, 65, 97, 450],
        hq=16,
        hkv=8,
        d=64,
        page=64,
        num_programs=24,
        kv_dtype=FP8,
        scales=(0.37, 1.9),
        schedule=schedule,
        tuned=True,
    )
    assert p.transposed and (p.num_warps, p.tile) == (4, 64)  # kernel_transposed.py since sweep fp8t
    if schedule == "dynamic":
        assert max(p.merge_first.tolist()) >= 0


def test_fp8_f16_dot_falls_back_on_odd_v_layout():
    # f16_dot reads V as int16 pairs; a V view with an odd base address and odd strides (a slice of a wider
    # buffer) must take the plain conversion instead of reading shifted pairs
    lens = [70, 5, 33]
    q, k, v, table, seq_lens = make_case(lens, hq=4, hkv=1, d=64, page=16, kv_dtype=FP8)
    wide = torch.zeros(*v.shape[:3], 65, dtype=torch.uint8, device=DEVICE)
    wide[..., 1:] = v.view(torch.uint8)
    v_odd = wide[..., 1:].view(FP8)
    assert v_odd.data_ptr() % 2 == 1 and v_odd.stride(2) % 2 == 1
    kw = dict(page_size=16, num_q_heads=4, num_kv_heads=1, head_dim=64, tile=16, num_programs=4, kv_dtype=FP8)
    p = op.plan(seq_lens, table, **kw)
    assert p.f16_dot
    out = op.run(p, q, k, v_odd, k_scale=0.5, v_scale=2.0)
    ref = decode_attention_reference(q, k, v, table, seq_lens, page_size=16, k_scale=0.5, v_scale=2.0)
    assert rel_err(out, ref) <= TOL[FP8]
    # the warp-split loop (tile 16 = page 16, 16 tokens per warp) falls back the same way
    p = op.plan(seq_lens, table, **kw, warp_split=True, num_warps=1)
    assert op._warp_split(p) == 1
    out = op.run(p, q, k, v_odd, k_scale=0.5, v_scale=2.0)
    assert rel_err(out, ref) <= TOL[FP8]


@pytest.mark.parametrize("kv_dtype", [BF16, FP8])
def test_pdl_merge_matches_reference(kv_dtype):
    # pdl: the merge launch as a programmatic dependent of the attention pass (on the GPU; the CPU
    # interpreter runs the launches in order), narrow and wide merges both present
    scales = (0.37, 1.9) if kv_dtype == FP8 else (1.0, 1.0)
    p, _ = check(
        [700, 300, 5, 64],
        hq=4,
        hkv=1,
        d=64,
        page=16,
        tile=16,
        num_programs=40,
        kv_dtype=kv_dtype,
        scales=scales,
        tuned=True,
        pdl=True,
    )
    assert p.pdl and max(p.wide_list.tolist()) >= 0 and max(p.merge_first.tolist()) >= 0


@pytest.mark.parametrize(
    "lens,hq,hkv,d,warps,kv_dtype",
    [
        ([1, 63, 64, 65, 97, 300], 8, 1, 64, 4, BF16),  # edge lengths; 4 warps x 16 tokens per tile
        ([1, 63, 64, 65, 97, 300], 8, 1, 64, 4, FP8),  # fp16 products, V as e4m3 pairs per warp
        ([130, 17, 64, 200], 6, 2, 128, 4, BF16),  # two KV heads, odd group, D 128
        ([97, 260, 3], 16, 1, 64, 2, FP8),  # group 16, 2 warps x 32 tokens
    ],
)
def test_warp_split_matches_reference(lens, hq, hkv, d, warps, kv_dtype):
    # warp_split: each warp takes 64 / warps tokens of every tile with its own softmax state, merged at the
    # segment's end (tokens past the length leave a warp empty: lengths 1 and 17); 5 programs split segments
    scales = (0.37, 1.9) if kv_dtype == FP8 else (1.0, 1.0)
    p, _ = check(
        lens,
        hq=hq,
        hkv=hkv,
        d=d,
        page=64,
        kv_dtype=kv_dtype,
        tile=64,
        num_warps=warps,
        num_programs=5,
        desc=True,
        pt_chunk=16,
        warp_split=True,
        tuned=True,
        scales=scales,
    )
    assert op._warp_split(p) == warps and max(p.merge_first.tolist()) >= 0


def test_warp_split_falls_back_where_it_does_not_apply():
    # page smaller than the tile, per-tile page ids (pt_chunk 0) or fewer than 16 tokens per warp: the
    # plain tile loop runs (same results)
    for kw in (
        dict(page=16, tile=64, pt_chunk=16),
        dict(page=64, tile=64, pt_chunk=0),
        dict(page=16, tile=16),
    ):
        page = kw.pop("page")
        p, _ = check(
            [1, 65, 150], hq=4, hkv=1, d=64, page=page, num_programs=3, warp_split=True, desc=True, **kw
        )
        assert p.warp_split and op._warp_split(p) == 0


def test_head_dim_128_and_256():
    check([33, 70], hq=2, hkv=1, d=128, page=16, tile=16, num_programs=3)
    check([20], hq=2, hkv=2, d=256, page=16, tile=16, num_programs=3)


@pytest.mark.parametrize("tensor_scales", [False, True])
def test_fp8_kv_with_scales(tensor_scales):
    scales = (0.37, 1.9)
    if tensor_scales:
        scales = tuple(torch.tensor([s], dtype=torch.float32, device=DEVICE) for s in scales)
    check(
        [50, 17, 90],
        hq=4,
        hkv=2,
        d=64,
        page=16,
        kv_dtype=torch.float8_e4m3fn,
        scales=scales,
        tile=16,
        num_programs=4,
    )


def test_more_programs_than_work_and_fp16():
    # 2 units over 9 programs: most programs get empty ranges and must neither write nor merge
    q, k, v, table, seq_lens = make_case(
        [20], hq=2, hkv=1, d=64, page=16, kv_dtype=torch.float16, q_dtype=torch.float16
    )
    p = op.plan(
        seq_lens, table, page_size=16, num_q_heads=2, num_kv_heads=1, head_dim=64, tile=16, num_programs=9
    )
    out = op.run(p, q, k, v)
    assert out.dtype == torch.float16
    assert (
        rel_err(out, decode_attention_reference(q, k, v, table, seq_lens, page_size=16)) <= TOL[torch.float16]
    )


def test_plan_covers_every_unit_evenly():
    lens = [1, 300, 17, 64, 65]
    _, _, _, table, seq_lens = make_case(lens, hq=2, hkv=2, d=64, page=16)
    p = op.plan(
        seq_lens, table, page_size=16, num_q_heads=2, num_kv_heads=2, head_dim=64, tile=32, num_programs=7
    )
    units = [2 * max(1, math.ceil(n / 32)) for n in lens]
    starts = p.prog_start.tolist()
    assert starts[0] == 0 and starts[-1] == sum(units)
    shares = [b - a for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert max(shares) - min(shares) <= 1, shares
    req_start = [0]
    for u in units:
        req_start.append(req_start[-1] + u)
    assert p.req_start[: len(lens) + 1].tolist() == req_start
    firsts = p.merge_first.tolist()
    for g, u in enumerate(starts[:-1]):  # prog_b = request holding the program's first unit
        if u < starts[-1]:
            b = p.prog_b[g].item()
            assert req_start[b] <= u < req_start[b + 1]
        # merge duty: the first participant's range holds the split segment's first unit
        if firsts[g] >= 0:
            seg = p.merge_seg[g].item()
            assert firsts[g] < g and starts[firsts[g]] <= seg < starts[firsts[g] + 1] and seg < u
    assert any(f >= 0 for f in firsts), "this case splits segments, so some program must merge"


def test_update_replans_in_place():
    q, k, v, table, seq_lens = make_case([70, 9, 33], hq=4, hkv=1, d=64, page=16)
    p = op.plan(
        seq_lens,
        table,
        page_size=16,
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=64,
        tile=16,
        num_programs=4,
        max_batch=4,
    )
    buffers = [p.prog_start.data_ptr(), p.seq_lens.data_ptr(), p.page_table.data_ptr()]
    new_lens = torch.tensor([12, 40], dtype=torch.int32, device=DEVICE)
    new_table = table[[2, 0], :3].contiguous()
    p.update(new_lens, new_table)
    assert [p.prog_start.data_ptr(), p.seq_lens.data_ptr(), p.page_table.data_ptr()] == buffers
    q2 = q[:2].clone()
    out = op.run(p, q2, k, v)
    ref = decode_attention_reference(q2, k, v, new_table, new_lens, page_size=16)
    assert rel_err(out, ref) <= TOL[torch.bfloat16]


def test_token_pool_viewed_as_pages():
    # SGLang's pool is [num_tokens, Hkv, D]; with page size 1 it is used as [num_tokens, 1, Hkv, D] (a view)
    gen = torch.Generator().manual_seed(1)
    pool_k = torch.randn(300, 2, 64, generator=gen).bfloat16().to(DEVICE)
    pool_v = torch.randn(300, 2, 64, generator=gen).bfloat16().to(DEVICE)
    lens = [37, 5]
    table = torch.stack([torch.randperm(300, generator=gen)[:40] for _ in lens]).int().to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, 4, 64, generator=gen).bfloat16().to(DEVICE)
    k, v = pool_k.unsqueeze(1), pool_v.unsqueeze(1)
    out = op.decode_attention(q, k, v, table, seq_lens, page_size=1)
    ref = decode_attention_reference(q, k, v, table, seq_lens, page_size=1)
    assert rel_err(out, ref) <= TOL[torch.bfloat16]


def _valid_args():
    q, k, v, table, seq_lens = make_case([20, 3], hq=4, hkv=2, d=64, page=16)
    return dict(q=q, k=k, v=v, table=table, seq_lens=seq_lens)


@pytest.mark.parametrize(
    "mutate,exc,msg",
    [
        (lambda a: a.update(q=a["q"].float()), TypeError, "q dtype"),
        (lambda a: a.update(k=a["k"].float()), TypeError, "k_cache dtype"),
        (lambda a: a.update(seq_lens=a["seq_lens"].long()), TypeError, "seq_lens dtype"),
        (lambda a: a.update(q=a["q"].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "contiguous"),
        (lambda a: a.update(q=a["q"][:, :3]), ValueError, "GQA|multiple|shape"),
        (lambda a: a.update(seq_lens=a["seq_lens"] * 0), ValueError, "lengths must lie"),
        (lambda a: a.update(seq_lens=a["seq_lens"] + 100), ValueError, "pages"),
        (lambda a: a.update(table=a["table"] * 0 + 999), ValueError, "page ids"),
        (lambda a: a.update(q=a["q"][:1]), ValueError, "batch"),
    ],
)
def test_bad_inputs_raise_clear_errors(mutate, exc, msg):
    a = _valid_args()
    mutate(a)
    with pytest.raises(exc, match=msg):
        op.decode_attention(a["q"], a["k"], a["v"], a["table"], a["seq_lens"], page_size=16)


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(head_dim=96), "head_dim 96"),
        (dict(page_size=32), "page_size 32"),
        (dict(num_q_heads=34, num_kv_heads=2), "group 17"),
        (dict(num_q_heads=5, num_kv_heads=2), "multiple"),
        (dict(schedule="greedy"), "schedule"),
        (dict(max_batch=2000), "max_batch"),
        (dict(merge_block=24), "merge_block"),
        (dict(pt_chunk=8), "pt_chunk"),
        (dict(seg_cost=-1), "seg_cost"),
        (dict(seg_cost=2.5), "seg_cost"),
    ],
)
def test_plan_rejects_unsupported_shapes(kw, msg):
    _, _, _, table, seq_lens = make_case([5], hq=2, hkv=1, d=64, page=16)
    args = dict(page_size=16, num_q_heads=2, num_kv_heads=1, head_dim=64) | kw
    with pytest.raises(ValueError, match=msg):
        op.plan(seq_lens, table, **args)


def test_run_rejects_mismatched_cache():
    a = _valid_args()
    p = op.plan(a["seq_lens"], a["table"], page_size=16, num_q_heads=4, num_kv_heads=2, head_dim=64)
    with pytest.raises(ValueError, match="k_cache has shape"):
        op.run(p, a["q"], a["k"][:, :, :1].contiguous(), a["v"][:, :, :1].contiguous())
    with pytest.raises(TypeError, match="v_cache is"):
        op.run(p, a["q"], a["k"], a["v"].to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match="k_scale"):
        op.run(p, a["q"], a["k"], a["v"], k_scale=-1.0)


# ---------------------------------------------------------------- GPU, real sizes


EDGE = [1, 63, 64, 65, 97] + [4096] * 11  # lengths around a tile/page, next to full ones


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens,hq,hkv,d,page,kv_dtype,schedule",
    [
        (EDGE, 8, 1, 128, 64, BF16, "dynamic"),
        (EDGE, 8, 1, 128, 64, FP8, "dynamic"),
        (EDGE, 8, 1, 128, 64, BF16, "static"),
        ([128] * 8 + [3000] * 8 + [70000], 64, 8, 128, 64, BF16, "dynamic"),
        ([128] * 8 + [3000] * 8 + [70000], 64, 8, 128, 64, FP8, "static"),
        ([5, 1000, 20000], 16, 1, 256, 16, BF16, "dynamic"),
        ([777, 33, 2500], 12, 12, 64, 1, FP8, "dynamic"),
    ],
)
def test_gpu_real_sizes(lens, hq, hkv, d, page, kv_dtype, schedule):
    scales = (0.8, 1.3) if kv_dtype == torch.float8_e4m3fn else (1.0, 1.0)
    for tuned in (False, True):
        check(
            lens,
            hq=hq,
            hkv=hkv,
            d=d,
            page=page,
            kv_dtype=kv_dtype,
            schedule=schedule,
            scales=scales,
            tuned=tuned,
        )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "entry,kv_dtype",
    [(e, BF16) for e in da.SWEEP_CONFIGS] + [(e, FP8) for e in da.SWEEP_CONFIGS_FP8],
)
def test_gpu_sweep_candidates(entry, kv_dtype):
    # every launch configuration the benchmark's sweep may choose, at the benchmark's shape
    scales = (0.8, 1.3) if kv_dtype == FP8 else (1.0, 1.0)
    lens = EDGE + [70000]
    check(lens, hq=8, hkv=1, d=128, page=64, kv_dtype=kv_dtype, scales=scales, **da.variant_config(*entry))


@pytest.mark.gpu
def test_gpu_longest_context_and_largest_batch():
    check([256 * 1024], hq=8, hkv=1, d=128, page=64)
    gen = torch.Generator().manual_seed(3)
    lens = torch.randint(1, 600, (1024,), generator=gen).tolist()
    check(lens, hq=4, hkv=1, d=128, page=16)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "pdl,warp_split,num_stages",
    [(False, None, None), (True, None, None), (False, True, None), (True, None, 4)],
)
def test_gpu_cuda_graph_replay_matches_eager(pdl, warp_split, num_stages):
    hq, hkv, d, page = 8, 1, 128, 64
    # pages for the longest lengths of any replay; the captured step starts shorter
    q, k, v, table, _ = make_case([12800, 100, 12800, 5000], hq=hq, hkv=hkv, d=d, page=page)
    lens_buf = torch.tensor([4000, 100, 9000, 64], dtype=torch.int32, device="cuda")
    # the configuration decode_attention() picks (op.TUNED_BY_KV_DTYPE), so replay and eager match bitwise
    # (pdl: the merge launch as a programmatic dependent, captured as such; same arithmetic, so the same bits)
    p = op.plan(
        lens_buf,
        table,
        page_size=page,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        kv_dtype=k.dtype,
        pdl=pdl,
        warp_split=warp_split,
        num_stages=num_stages,
    )
    # decode_attention()'s own call where the plan is its variant, else eager with the same plan
    tuned = (
        None
        if warp_split or num_stages
        else lambda tb: op.decode_attention(q, k, v, tb, lens_buf, page_size=page)
    )
    steps = ([4001, 1, 12000, 65], [64, 64, 64, 64], [12800, 100, 300, 5000])
    check_graph_replay(p, q, k, v, table, lens_buf, steps, page=page, eager=tuned)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens,hq,hkv,kv_dtype,mip",
    [
        ([131072], 8, 1, BF16, None),  # one segment over all programs: wide programs merge it
        ([131072], 8, 1, FP8, None),  # the same through the transposed fp8 8/1 default
        (
            [65536] + [4096] * 15,
            64,
            8,
            BF16,
            0,
        ),  # the 64K request's segments (~17 programs each): wide programs
        (
            [65536] + [4096] * 15,
            64,
            8,
            BF16,
            None,
        ),  # tuned (merge_in_pass 32): they merge in the pass instead
        (EDGE + [70000], 8, 1, BF16, None),  # narrow and wide segments in one call
    ],
)
def test_gpu_merge_launches_real_sizes(lens, hq, hkv, kv_dtype, mip):
    # the tuned form's merge launch at real sizes: against float64, and 3 calls of one plan (output NaN-poisoned
    # before each) bitwise the first. (All passed against 98a076b's one launch in the merge1 call; in the merge1b
    # call, against af7be35, the 8/1 1 x 128K ones passed and the rest were cut by the stage's time limit:
    # benchmarks/results/decode_attention_sweep_merge1b_gpu_tests.log.)
    q, k, v, table, seq_lens = make_case(lens, hq=hq, hkv=hkv, d=128, page=64, kv_dtype=kv_dtype)
    kw = {} if mip is None else dict(merge_in_pass=mip)
    p = op.plan(
        seq_lens, table, page_size=64, num_q_heads=hq, num_kv_heads=hkv, head_dim=128, kv_dtype=kv_dtype, **kw
    )
    scales = (0.8, 1.3) if kv_dtype == FP8 else (1.0, 1.0)
    outs = []
    for _ in range(3):
        out = torch.full_like(q, float("nan"))
        outs.append(op.run(p, q, k, v, k_scale=scales[0], v_scale=scales[1], out=out))
    ref = decode_attention_reference(
        q, k, v, table, seq_lens, page_size=64, k_scale=scales[0], v_scale=scales[1]
    )
    assert rel_err(outs[0], ref) <= TOL[kv_dtype]
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    wide = merged_rows(p, wide=True)
    assert bool(wide) == (p.merge_in_pass == 0), (p.merge_in_pass, wide)
    if len(lens) > 16:
        assert merged_rows(p, wide=False), p.merge_first.tolist()


@pytest.mark.gpu
def test_gpu_merge_launches_cuda_graph_replay():
    # bf16 8/1 tuned, captured once and replayed with lengths whose split segments go to the wide programs alone
    # or to narrow and wide ones; each request's pages built for its longest step
    hq, hkv, page = 8, 1, 64
    q, k, v, table, _ = make_case([131072, 4096, 12800, 4096], hq=hq, hkv=hkv, d=128, page=page)
    lens_buf = torch.tensor([65536, 100, 12800, 4096], dtype=torch.int32, device="cuda")
    p = op.plan(
        lens_buf, table, page_size=page, num_q_heads=hq, num_kv_heads=hkv, head_dim=128, kv_dtype=BF16
    )
    kinds = []

    def each(_):
        kinds.append((bool(merged_rows(p, wide=False)), bool(merged_rows(p, wide=True))))

    steps = ([131072, 1, 4096, 4096], [4096] * 4, [65536, 100, 300, 4096], [131072, 100, 12800, 4096])
    eager = lambda tb: op.decode_attention(q, k, v, tb, lens_buf, page_size=page)  # noqa: E731
    check_graph_replay(p, q, k, v, table, lens_buf, steps, page=page, eager=eager, each=each)
    assert any(n for n, _ in kinds) and any(w for _, w in kinds), kinds


# ---------------------------------------------------------------- CPU only: what Triton builds for sm_90a

_STRIDES = ["stride_qb", "stride_qh", "stride_kp", "stride_ks", "stride_kh", "stride_vp", "stride_vs"]
_STRIDES += ["stride_vh", "stride_ob", "stride_oh"]  # multiples of 16 at the benchmark's shapes
_KERNEL = "hpc_advise.kernels.decode_attention.kernel"


def _decode_job(
    kv: str,
    tile: int,
    stages: int,
    pt_chunk: int,
    f16_dot: bool = False,
    ws: int = 0,
    warps: int = 4,
    d: int = 128,
) -> list:
    types = f"*bf16 *{kv} *{kv} *bf16 " + "*i32 " * 6 + "*fp32 *fp32 *fp32 fp32 fp32 " + "i32 " * 12
    consts = dict(
        GROUP=8,
        GROUP_PAD=16,
        HEAD_DIM=d,
        PAGE=64,
        TILE=tile,
        NUM_STAGES=stages,
        SCALES_FROM_PTR=False,
        PREFETCH=False,
        DESC=True,
        PT_CHUNK=pt_chunk,
        F16_DOT=f16_dot,
        ASM_CVT=f16_dot,
        PDL=False,
        WARP_SPLIT=ws,
    )
    return [
        "hpc_advise.kernels.decode_attention.kernel",
        "decode_kernel",
        types,
        consts,
        warps,
        stages,
        _STRIDES,
    ]


@pytest.mark.slow
def test_candidates_compile_for_sm90():
    # the sweep's new candidates (hpc_advise/runtime/benches/decode_attention.py) build for the H200 with
    # the K/V copies pipelined, and fit the programs per SM the sweep gives them (registers, shared memory)
    from tests.kernels.sm90_compile import compile_sm90

    jobs = [
        _decode_job("bf16", 64, 3, 0),
        _decode_job("bf16", 64, 3, 64),
        _decode_job("fp8e4nv", 128, 3, 32),
        _decode_job("fp8e4nv", 64, 3, 64, f16_dot=True),
        _decode_job("bf16", 64, 3, 32, ws=4),
        _decode_job("fp8e4nv", 64, 3, 32, f16_dot=True, ws=2, warps=2),
        _decode_job("fp8e4nv", 32, 3, 32, f16_dot=True, ws=1, warps=1),  # fp8 default at >= 8 KV heads
    ]
    res = compile_sm90(jobs)
    assert all(r["async_copies"] > 0 for r in res), res
    # tile 64, stages 3: ONE 32 KB K/V buffer when the page id is loaded in the tile loop (pt_chunk 0)...
    assert res[0]["shared"] < 48 * 1024, res[0]
    # ...two when the page ids come from the chunk load, and 3 programs still fit an SM
    assert res[1]["shared"] >= 64 * 1024 and res[1]["ctas_per_sm"] >= 3, res[1]
    # fp8, 128 tokens (2 pages) per step: two 32 KB buffers, 2 programs per SM
    assert res[2]["shared"] >= 64 * 1024 and res[2]["ctas_per_sm"] >= 2, res[2]
    # fp8 with fp16 products: V converted on its row-major tile, two buffers and 3 programs per SM (the
    # bytewise gather of the e4m3 operand took 224 registers, 2 programs)
    assert res[3]["async_copies"] > 0 and res[3]["ctas_per_sm"] >= 3 and res[3]["stack"] == 0, res[3]
    # tokens split over the warps: pipelined K/V; each warp's [16, D] fp32 accumulator makes it 255
    # registers (ptxas spills 16-56 bytes, read off this compile): 2 programs per SM at 4 warps, 4 at 2
    # warps, 7 at 1 warp (shared memory; the fp8 default at >= 8 KV heads since sweep run 10)
    assert all(r["async_copies"] > 0 and r["stack"] <= 64 for r in res[4:]), res[4:]
    assert [r["ctas_per_sm"] for r in res[4:]] == [2, 4, 7], res[4:]


@pytest.mark.slow
def test_deeper_pipelines_compile_for_sm90():
    # sweep run 10's candidates: with page ids 32 tiles per load, num_stages - 1 K/V buffers; what fits an SM
    from tests.kernels.sm90_compile import compile_sm90

    jobs = {  # job -> (shared memory in KB: lowest, below; programs per SM the sweep gives it)
        "bf16 tile 64, 3 stages": (_decode_job("bf16", 64, 3, 32), (64, 96), 2),  # two 32 KB buffers
        "bf16 tile 64, 4 stages": (_decode_job("bf16", 64, 4, 32), (96, 128), 2),  # three
        "bf16 tile 64, 4 stages, 64 ids": (_decode_job("bf16", 64, 4, 64), (96, 128), 2),
        "bf16 tile 64, 7 stages, id per tile": (_decode_job("bf16", 64, 7, 0), (96, 128), 2),
        "bf16 tile 128, 2 stages": (_decode_job("bf16", 128, 2, 32), (64, 96), 2),  # one 64 KB buffer
        "bf16 tile 128, 3 stages, 8 warps": (_decode_job("bf16", 128, 3, 32, warps=8), (128, 192), 1),
        "fp8 warp split, 4 stages": (
            _decode_job("fp8e4nv", 64, 4, 32, f16_dot=True, ws=2, warps=2),
            (64, 96),
            3,
        ),
        "fp8 plain, 4 stages": (_decode_job("fp8e4nv", 64, 4, 32, f16_dot=True), (64, 96), 3),
        # the fp8 default at >= 8 KV heads (1 warp x 32 tokens, 7 programs/SM)
        "fp8 warp split, 1 warp": (
            _decode_job("fp8e4nv", 32, 3, 32, f16_dot=True, ws=1, warps=1),
            (16, 32),
            7,
        ),
    }
    # head_dim 256 (op.TUNED_MANY_KV_HEADS_WIDE): one warp's [16, 256] accumulator spills far more than two
    # warps' and fits fewer than the 7 programs/SM of the head_dim-128 default, so the 2-warp form stays there
    wide = [_decode_job("fp8e4nv", 32, 3, 32, f16_dot=True, ws=w, warps=w, d=256) for w in (1, 2)]
    *out, one, two = compile_sm90([j for j, _, _ in jobs.values()] + wide)
    for (name, (_, (lo, hi), ctas)), r in zip(jobs.items(), out, strict=True):
        assert r["async_copies"] > 0 and lo <= r["shared"] // 1024 < hi, (name, r)
        assert r["ctas_per_sm"] >= ctas, (name, r)
        # no spills but the warp split's (its per-warp accumulators: 255 registers)
        assert r["stack"] < (128 if "warp split" in name else 1), (name, r)
    assert one["stack"] > 2 * two["stack"] and one["ctas_per_sm"] < 7, (one, two)


@pytest.mark.slow
def test_merge_launch_compiles_for_sm90_at_the_narrow_registers():
    # the one merge launch (narrow and wide programs) as a programmatic dependent (griddepcontrol, SM90 only: the
    # interpreter skips it) builds for the H200 in the shipped form (op's constants, merge_block 16: 2 warps, the
    # cap op passes) at the two-launch form's narrow registers, 64, without spills: 16 programs per SM, so the
    # wide programs ([128, WIDE_MERGE_COLS] tiles) cost the mostly idle narrow ones no residency (98a076b's
    # [128, 64] wide tiles took 128-176). Uncapped, ptxas takes 96: the cap is what makes it so, and where it
    # spills (16-column slices: 24 bytes) this fails.
    from tests.kernels.sm90_compile import compile_sm90

    types = "*bf16 " + "*i32 " * 4 + "*fp32 *fp32 *i32 i32 i32 i32 i32"
    consts = dict(
        NUM_KV_HEADS=8,
        GROUP=8,
        HEAD_DIM=128,
        D_CHUNK=64,
        PDL=True,
        BLOCK_P=16,
        NARROW=16,
        WIDE_COLS=op.WIDE_MERGE_COLS,
        WIDE_BLOCK_P=op.WIDE_MERGE_BLOCK,
    )
    cap = [op.MERGE_MAXNREG] if op.MERGE_MAXNREG else []
    jobs = [
        [_KERNEL, "merge_kernel", types, consts | {"HOIST": h}, 2, 1, ["stride_ob"], *cap] for h in (0, 1)
    ]
    # both forms of op.MERGE_HOIST: planner loads after griddepcontrol.wait and before it (shipped; sweep mprol)
    for r in compile_sm90(jobs):
        assert r["stack"] == 0 and (not cap or (r["registers"] <= 64 and r["ctas_per_sm"] == 16)), r


def test_sweep_variants_and_best_config_skip_failures():
    assert da.variant_config(64, 3, 5, 4, "nested-desc-m128") == dict(
        tile=64,
        ctas_per_sm=3,
        num_stages=5,
        num_warps=4,
        loop="nested",
        prefetch=False,
        desc=True,
        merge_block=128,
        pt_chunk=0,
        wide_merge=False,
        seg_cost=0,
        f16_dot=False,
        pdl=False,
        warp_split=False,
        snap=0,
        whole_below=0,
        transposed=False,
        merge_in_pass=0,
    )
    assert da.variant_config(128, 2, 3, 4, "nested-desc-m128-pc32")["pt_chunk"] == 32
    assert da.variant_config(64, 2, 3, 4, "nested-desc-w-pc32-s2-pdl-mip4")["merge_in_pass"] == 4
    assert da.variant_config(64, 2, 3, 4, "nested-desc-pc32-ws")["warp_split"] is True
    cfg = da.variant_config(64, 2, 3, 4, "nested-desc-w-pc64-s4-f16-pdl")
    assert (cfg["wide_merge"], cfg["seg_cost"], cfg["f16_dot"], cfg["pdl"]) == (True, 4, True, True)
    assert da.variant_config(64, 2, 1, 4, "nested-prefetch")["prefetch"] is True
    with pytest.raises(ValueError, match="unknown variant"):
        da.variant_config(64, 2, 3, 4, "nested-turbo")
    with pytest.raises(ValueError, match="unknown variant"):
        da.variant_config(64, 2, 3, 4, "nested-m16-m32")
    with pytest.raises(ValueError, match="unknown variant"):
        da.variant_config(64, 2, 3, 4, "nested-s2-s4")
    for entry in da.SWEEP_CONFIGS + da.SWEEP_CONFIGS_FP8:  # every candidate is a valid plan
        _, _, _, table, seq_lens = make_case([70], hq=8, hkv=1, d=128, page=64)
        cfg = da.variant_config(*entry)
        cfg.pop("ctas_per_sm")
        op.plan(
            seq_lens, table, page_size=64, num_q_heads=8, num_kv_heads=1, head_dim=128, num_programs=3, **cfg
        )

    def row(case, p50, ok=True, **cfg):
        base = da.variant_config(64, 2, 3, 4, "nested") | cfg
        return {"p50": p50, "config": base | {"case": case, "kv_dtype": "bf16", "ok": ok}}

    rows = [
        row("a", 10.0),
        row("b", 10.0),
        row("a", 5.0, ok=False, desc=True),
        row("b", 5.0, desc=True),  # fastest, but wrong once
        row("a", 9.0, ctas_per_sm=3),
        row("b", 10.5, ctas_per_sm=3),
        row("a", 1.0, num_stages=5),  # timed on one case only
    ]
    assert da.best_config(rows)["ctas_per_sm"] == 3 and da.best_config(rows)["desc"] is False
    # per head count: only that head count's cases vote
    heads = [r | {"config": r["config"] | {"num_q_heads": 64, "num_kv_heads": 8}} for r in rows[:4]]
    heads += [
        row("c", 1.0, num_warps=8)
        | {"config": row("c", 1.0, num_warps=8)["config"] | {"num_q_heads": 8, "num_kv_heads": 1}}
    ]
    assert da.best_config(heads, "bf16", "64/8")["num_warps"] == 4
    assert da.best_config(heads, "bf16", "8/1")["num_warps"] == 8
    assert da.best_config(heads)["num_warps"] == 4  # all: the 8-warp row misses the other cases
    # a repeated timing (the sweep times its first configuration twice per case) never votes
    timed = [row("a", 10.0), row("b", 10.0), row("a", 9.0, ctas_per_sm=3), row("b", 9.0, ctas_per_sm=3)]
    again = [row("a", 10.1, repeat=True), row("b", 9.9, repeat=True)]  # the default once more
    assert da.best_config(timed + again)["ctas_per_sm"] == 3
    with pytest.raises(RuntimeError, match="no bf16 case with heads 16/2"):
        da.best_config(heads, "bf16", "16/2")
    with pytest.raises(RuntimeError, match="no configuration"):
        da.best_config([row("a", 1.0, ok=False)])


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_plan_takes_the_measured_variant_of_its_kv_dtype(kv_dtype):
    seq_lens = torch.tensor([100, 7], dtype=torch.int32, device=DEVICE)
    table = torch.zeros(2, 4, dtype=torch.int32, device=DEVICE)
    kw = dict(page_size=64, num_q_heads=8, num_kv_heads=1, head_dim=128)
    for hkv in (1, 8):  # 8: TUNED_MANY_KV_HEADS on top (fp8: transposed, 4 warps x 64 tokens, 3/SM); 1: FEW
        tuned = op.TUNED_BY_KV_DTYPE[kv_dtype] | (
            op.TUNED_MANY_KV_HEADS.get(kv_dtype, {}) if hkv == 8 else op.TUNED_FEW_KV_HEADS.get(kv_dtype, {})
        )
        assert op.tuned_config(kv_dtype, hkv) == tuned
        p = op.plan(seq_lens, table, kv_dtype=kv_dtype, **(kw | dict(num_q_heads=8 * hkv, num_kv_heads=hkv)))
        for key, value in tuned.items():
            if key == "ctas_per_sm":  # the grid: SMs (CPU_NUM_SMS without a GPU) x programs per SM
                assert p.num_programs == op._num_sms(p.device) * value
            else:
                assert getattr(p, key) == value, key
    assert op.tuned_config(FP8, 8)["transposed"] and op.tuned_config(FP8, 1)["transposed"]  # sweeps fp8t, t2
    assert op.tuned_config(FP8, 1, page_size=16) == op.TUNED_BY_KV_DTYPE[FP8]  # page < tile: the plain loop's
    # head_dim 256: the 2-warp form (one warp's [16, 256] accumulator would spill 656 bytes)
    wide = op.plan(seq_lens, table, kv_dtype=FP8, **(kw | dict(num_q_heads=64, num_kv_heads=8, head_dim=256)))
    assert (wide.warp_split, wide.num_warps, wide.tile) == (True, 2, 32)
    assert wide.num_programs == op._num_sms(wide.device) * 4
    # an explicit knob wins over the tuned one
    p = op.plan(seq_lens, table, kv_dtype=kv_dtype, merge_block=32, **kw)
    assert p.merge_block == 32
    # no dtype given: the module defaults
    p = op.plan(seq_lens, table, **kw)
    assert (p.desc, p.merge_block, p.pt_chunk) == (
        op.DEFAULT_DESC,
        op.DEFAULT_MERGE_BLOCK,
        op.DEFAULT_PT_CHUNK,
    )


def test_plan_takes_tuned_stages_and_tile(monkeypatch):
    # the tuned tables may set num_stages and tile (sweep run 10 measured them); tile only at head_dim <= 128
    monkeypatch.setitem(op.TUNED_MANY_KV_HEADS, torch.bfloat16, {"num_stages": 4, "tile": 128})
    monkeypatch.setitem(op.TUNED_MANY_KV_HEADS_WIDE, torch.bfloat16, {"num_stages": 4, "tile": 128})
    seq_lens = torch.tensor([100, 7], dtype=torch.int32, device=DEVICE)
    table = torch.zeros(2, 4, dtype=torch.int32, device=DEVICE)
    kw = dict(page_size=64, num_q_heads=64, num_kv_heads=8, kv_dtype=torch.bfloat16)
    p = op.plan(seq_lens, table, head_dim=128, **kw)
    assert (p.num_stages, p.tile) == (4, 128)
    p = op.plan(seq_lens, table, head_dim=256, **kw)
    assert (p.num_stages, p.tile) == (4, op.DEFAULT_TILE // 2)
    p = op.plan(seq_lens, table, head_dim=128, num_stages=2, tile=64, **kw)  # explicit knobs win
    assert (p.num_stages, p.tile) == (2, 64)
    p = op.plan(seq_lens, table, head_dim=128, **(kw | dict(num_q_heads=8, num_kv_heads=1)))
    assert (p.num_stages, p.tile) == (op.DEFAULT_NUM_STAGES, op.DEFAULT_TILE)


def test_bench_rejects_unknown_grid_filters():
    # checked before anything touches a GPU
    with pytest.raises(ValueError, match="heads must be"):
        da.bench(heads="3/1")
    for kv in ("int4", "fp8,fp8", "fp8,"):
        with pytest.raises(ValueError, match="kv must be"):
            da.bench(kv=kv)
