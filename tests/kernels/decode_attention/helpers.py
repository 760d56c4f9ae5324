"""Shared pieces of the decode-attention tests: random cases, the reference check, the grid override, the
planner's model in Python and CUDA-graph replay.

Tolerances (relative Frobenius error against the float64 reference on the same, dequantised inputs), declared
once here:
- bf16 / fp16 KV: 5e-3. q, K and V are exact inputs; the kernel adds two roundings to 8 mantissa bits (the
  probabilities P before the P.V product, and the output), each about 2^-9/sqrt(3) ~ 1.1e-3 relative RMS, plus
  fp32 accumulation (~1e-6): about 2e-3 expected, 5e-3 leaves margin for few-token rows where one rounding
  dominates.
- fp8 e4m3 KV: 2e-2. The KV values are exact (e4m3 embeds in bf16 and fp16), so the expected error is the bf16
  one; the looser bound covers logit scales folded into fp32 and outliers of e4m3's coarse grid that make single
  probabilities dominate a row (fewer terms to average the P rounding).

Inputs are fresh random draws (the seed is printed on failure through the assertion message); pool slots no
request uses hold NaN, and outputs are filled with NaN before every call, so an unwritten row or a read past a
length shows.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from hpc_advise.kernels.decode_attention import op
from hpc_advise.kernels.decode_attention.config import Config
from hpc_advise.kernels.decode_attention.reference import decode_attention_reference

BF16, FP16, FP8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
TOL = {BF16: 5e-3, FP16: 5e-3, FP8: 2e-2}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8_SCALES = (0.37, 1.9)


def make_case(
    lens, *, hq, hkv, d, page, kv_dtype=BF16, extra_pages=3, extra_cols=1, device=DEVICE, seed=None
):
    """Random q (fp16 for fp16 KV, else bf16), a NaN-poisoned KV pool with each request's pages scattered at
    random, the page table (unused columns hold -1: a read there would fault) and int32 lengths."""
    gen = generator(seed)
    num_pages, table, filled = scatter_pages(lens, page, gen, extra_pages=extra_pages, extra_cols=extra_cols)
    k = torch.full((num_pages, page, hkv, d), float("nan"))
    v = torch.full_like(k, float("nan"))
    for pg, fill in filled:  # slots past the length stay NaN
        k[pg, :fill] = torch.randn(fill, hkv, d, generator=gen)
        v[pg, :fill] = torch.randn(fill, hkv, d, generator=gen)
    q = torch.randn(len(lens), hq, d, generator=gen).to(FP16 if kv_dtype == FP16 else BF16)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return tuple(t.to(device) for t in (q, k.to(kv_dtype), v.to(kv_dtype), table, seq_lens))


# DeepSeek-V3's softmax scale (qk_nope 128 + rope 64, before YaRN's factor): the MLA form's tests use it
MLA_SM_SCALE = 1.0 / math.sqrt(192)


def make_mla_case(lens, *, heads, page, dtype=BF16, extra_pages=2, device=DEVICE, seed=None):
    """Random q and a NaN-poisoned latent pool [pages, page, 1, 576] with each request's pages scattered,
    the page table (unused columns -1) and int32 lengths."""
    gen = generator(seed)
    num_pages, table, filled = scatter_pages(lens, page, gen, extra_pages=extra_pages, extra_cols=1)
    kv = torch.full((num_pages, page, 1, op.MLA_LORA + op.MLA_ROPE), float("nan"))
    for pg, fill in filled:
        kv[pg, :fill] = torch.randn(fill, 1, op.MLA_LORA + op.MLA_ROPE, generator=gen)
    q = torch.randn(len(lens), heads, op.MLA_LORA + op.MLA_ROPE, generator=gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return tuple(t.to(device) for t in (q.to(dtype), kv.to(dtype), table, seq_lens))


def generator(seed=None) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (None: a fresh random seed)."""
    return torch.Generator(device="cpu").manual_seed(torch.seed() % (2**31) if seed is None else seed)


def scatter_pages(lens, page, gen, *, extra_pages, extra_cols):
    """Each request's pages at random places of a pool with ``extra_pages`` unused ones: (pool pages, page table
    [B, max pages + extra_cols] int32 with -1 in unused columns, [(page, slots filled)] in request order)."""
    need = [math.ceil(n / page) for n in lens]
    num_pages = sum(need) + extra_pages
    perm = torch.randperm(num_pages, generator=gen)
    table = torch.full((len(lens), max(need) + extra_cols), -1, dtype=torch.int32)
    filled, used = [], 0
    for i, n in enumerate(lens):
        pages = perm[used : used + need[i]]
        used += need[i]
        table[i, : need[i]] = pages.int()
        filled += [(pg, min(page, n - j * page)) for j, pg in enumerate(pages.tolist())]
    return num_pages, table, filled


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(out).any(), "NaN in output (an unwritten row or a poisoned slot read)"
    return ((out.double() - ref).norm() / ref.norm()).item()


def config(kv_dtype, hkv: int, d: int, page: int, **keys) -> Config:
    """The tuned config of this form with ``keys`` replaced."""
    return replace(op.tuned_config(kv_dtype, hkv, d, page), **keys)


def plan_of(seq_lens, table, *, hq, hkv, d, page, kv_dtype=BF16, **kw):
    return op.plan(
        seq_lens, table, page_size=page, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, kv_dtype=kv_dtype, **kw
    )


def check(lens, *, hq, hkv, d, page, kv_dtype=BF16, scales=None, case=None, **plan_kw):
    """One random case through plan + run (NaN-poisoned output) against the reference; ``plan_kw`` go to
    op.plan (``config``, ``schedule``, ...). Returns (plan, out)."""
    if scales is None:
        scales = FP8_SCALES if kv_dtype == FP8 else (1.0, 1.0)
    q, k, v, table, seq_lens = case or make_case(lens, hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv_dtype)
    p = plan_of(seq_lens, table, hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv_dtype, **plan_kw)
    out = torch.full_like(q, float("nan"))
    op.run(p, q, k, v, k_scale=scales[0], v_scale=scales[1], out=out)
    ks, vs = (float(s) for s in scales)
    ref = decode_attention_reference(q, k, v, table, seq_lens, page_size=page, k_scale=ks, v_scale=vs)
    err = rel_err(out, ref)
    assert err <= TOL[kv_dtype], f"relative error {err:.2e} > {TOL[kv_dtype]:.0e} (lens {lens})"
    return p, out


def fix_grid(monkeypatch, programs: int) -> None:
    """Make the persistent grid ``programs`` x ctas_per_sm programs (op._num_sms), on the interpreter and the
    GPU alike: the plan's grid is the only thing that changes."""
    monkeypatch.setattr(op, "_num_sms", lambda device: programs)


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


def is_short(seg_len, total, g, whole_below):
    return 100 * g * seg_len <= whole_below * total


def _unit(segs, units, total, y, seg_cost, move):
    """(first unit, cost position) of a boundary at cost position y; ``move(off, seg_len)`` says where inside
    its segment the boundary goes."""
    if y >= total:
        return units, y
    u0, c0, tiles, _, _ = max((s for s in segs if s[1] <= y), key=lambda s: s[1])
    off = move(y - c0, tiles + seg_cost)
    return (u0 if off == 0 else u0 + min(max(off - seg_cost, 1), tiles)), c0 + off


def even_bounds(lens, hkv, tile, g, seg_cost):
    """(unit, cost position) of boundaries 0..G of the even split: x_p = ceil(p T / G)."""
    segs, _, total, units = layout(lens, hkv, tile, seg_cost)
    return [_unit(segs, units, total, -(-p * total // g), seg_cost, lambda o, n: o) for p in range(g + 1)]


def whole_bounds(lens, hkv, tile, g, seg_cost, whole_below):
    """The whole-segment plan (kernel._region_position, then the move to the nearer end)."""
    segs, starts, total, units = layout(lens, hkv, tile, seg_cost)
    tiles = [max(1, math.ceil(n / tile)) for n in lens]
    cls = [is_short(t + seg_cost, total, g, whole_below) for t in tiles]
    ends = starts[1:] + [total]

    def move(off, seg_len):
        if not is_short(seg_len, total, g, whole_below) or off == 0:
            return off
        return seg_len if seg_len - off < off else 0

    out = []
    for p in range(g + 1):
        if p in (0, g):
            y = 0 if p == 0 else total
        else:
            b = max(i for i in range(len(lens)) if 2 * g * starts[i] < (2 * p + 1) * total)
            first, last = b, b
            while first > 0 and cls[first - 1] == cls[b]:
                first -= 1
            while last + 1 < len(lens) and cls[last + 1] == cls[b]:
                last += 1
            a, e = starts[first], ends[last]
            pa, pe = (2 * a * g + total) // (2 * total), (2 * e * g + total) // (2 * total)
            k = max(pe - pa, 1)
            y = a + -(-(p - pa) * (e - a) // k)
        out.append(_unit(segs, units, total, y, seg_cost, move))
    return out


def model_plan(lens, hkv, tile, g, seg_cost, whole_below):
    """(prog_start, kept) as the planner should compute them (kernel.plan_kernel, steps 2 and 2b)."""
    _, _, total, _ = layout(lens, hkv, tile, seg_cost)
    if not whole_below:
        return [u for u, _ in even_bounds(lens, hkv, tile, g, seg_cost)], False
    cand = whole_bounds(lens, hkv, tile, g, seg_cost, whole_below)
    heaviest = max(b[1] - a[1] for a, b in zip(cand, cand[1:], strict=False))
    kept = 100 * g * heaviest <= (100 + op.WHOLE_GATE) * total
    chosen = cand if kept else even_bounds(lens, hkv, tile, g, seg_cost)
    return [u for u, _ in chosen], kept


def merge_expected(starts, segs, g, merge_in_pass=0):
    """(merge_first, {program: (segment's first unit, b * hkv + h)}, wide list) the ranges imply: a segment
    touched by several non-empty ranges is merged by the last of them, which names the first; one spanning at
    most ``merge_in_pass`` programs is merged inside the attention pass, so the merge launch gets no duty for it
    (merge_first -1, not listed wide; its merge_seg / merge_bh are written all the same)."""
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
            if span > op.MERGE_BLOCK:
                wide.append(parts[-1])
    return first, merged, wide


def check_ranges(p, lens, hkv):
    """Every unit exactly once in contiguous ordered ranges; the merge bookkeeping, wide list and descriptors
    equal to what the ranges imply. Returns (prog_start, number of split segments)."""
    g = p.grid_size()
    segs, _, _, units = layout(lens, hkv, p.tile, p.config.seg_cost)
    starts = p.prog_start.tolist()
    assert starts[0] == 0 and starts[-1] == units, starts
    assert all(a <= b for a, b in zip(starts, starts[1:], strict=False)), starts
    first, merged, wide = merge_expected(starts, segs, g, p.config.merge_in_pass)
    assert p.merge_first.tolist() == first
    merge_seg, merge_bh = p.merge_seg.tolist(), p.merge_bh.tolist()
    assert all((merge_seg[q], merge_bh[q]) == merged[q] for q in merged)
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


def check_plan(p, lens, hkv):
    """Every property of a dynamic plan (even split, or whole segments with whole_below): the ranges as the model
    computes them, each program's cost within its bound, short segments whole where the whole-segment plan was
    kept. Returns (kept, number of split segments)."""
    g, tile, seg_cost, whole_below = p.grid_size(), p.tile, p.config.seg_cost, p.config.whole_below
    segs, _, total, _ = layout(lens, hkv, tile, seg_cost)
    want, kept = model_plan(lens, hkv, tile, g, seg_cost, whole_below)
    if whole_below:
        assert bool(p.bounds[3, 0].item()) == kept
    starts, n_split = check_ranges(p, lens, hkv)
    assert starts == want
    costs = program_costs(segs, starts, seg_cost)
    if kept:
        # short segments whole; each program within (100 + gate) % of the share + one segment start (a boundary
        # inside a long segment's first tile takes that tile, of cost 1 + seg_cost, whole)
        inner = {
            u
            for u0, _, tiles, _, _ in segs
            if is_short(tiles + seg_cost, total, g, whole_below)
            for u in range(u0 + 1, u0 + tiles)
        }
        assert not inner & set(starts), (inner & set(starts), starts)
        bound = (100 + op.WHOLE_GATE) * total / (100 * g) + seg_cost
    else:
        bound = math.ceil(total / g) + seg_cost
    assert max(costs) <= bound, (max(costs), bound)
    return kept, n_split


def merged_rows(p, wide: bool) -> list[tuple[int, int]]:
    """(request, KV head) of the split segments the merge launch combines: those over more than MERGE_BLOCK
    programs (its wide programs, ``wide``) or the others (its narrow ones)."""
    firsts, bh = p.merge_first.tolist(), p.merge_bh.tolist()
    return [
        divmod(bh[q], p.num_kv_heads)
        for q, f in enumerate(firsts)
        if f >= 0 and (q - f + 1 > op.MERGE_BLOCK) == wide
    ]


def check_graph_replay(p, q, k, v, table, lens_buf, steps, *, page, scales=(1.0, 1.0), each=None):
    """GPU: ``plan.update`` + ``run`` of plan ``p`` (lengths read from ``lens_buf``) warmed up on a side stream,
    captured in a CUDA graph, then replayed once per lengths list in ``steps`` (written into ``lens_buf``, the
    output poisoned first): bitwise the eager call on the re-updated plan and within tolerance of the reference.
    ``each(lengths)`` adds checks right after each replay."""
    table_buf, out = table.clone(), torch.empty_like(q)
    kw = dict(k_scale=scales[0], v_scale=scales[1])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        p.update(lens_buf, table_buf)
        op.run(p, q, k, v, out=out, **kw)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        p.update(lens_buf, table_buf)
        op.run(p, q, k, v, out=out, **kw)
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
        want = op.run(p.update(lens_buf, table_buf), q, k, v, **kw)
        assert torch.equal(out, want), new
        ref = decode_attention_reference(q, k, v, table_buf, lens_buf, page_size=page, **kw)
        assert rel_err(out, ref) <= TOL[k.dtype], new
