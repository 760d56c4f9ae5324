"""Triton kernels of the FP8 fused MoE's small-T (decode) path: two launches, no routing pass.

Launched by ``op_small.py``. Notation as in ``kernel.py``: T tokens (T <= BLOCK_M), k = top_k,
n = T·k (token, slot) entries, E local experts, H hidden, I intermediate (a TP shard), G = 128.

  0. ``_small_quant_kernel``  (PRE_Q configs only) the inputs quantized once, as the regular path's
     prep launch does, minus its router; then the gate/up loop only streams fp8 tiles.
  1. ``_small_gate_up_kernel``  grid (n · cdiv(I, BLOCK_N), SPLIT_K). The program of entry s serves the
     local expert e = topk_ids[s] − offset for *every* token routed to e, but only if s is the first
     entry naming e (later entries of the same expert exit at once): each expert's weights are
     streamed once, without sorting the entries. Its A tile holds one row per token (rows of tokens not
     routed to e are zero) and is quantized on the fly from the bf16 hidden rows (static a13 scale, or
     dynamic per-1×G group: the K step is the group), or read from launch 0's output (PRE_Q). Output, at every slot j where token t chose e
     (row t·k + j), by H_MODE: 1 — h = SiLU(gate)·up quantized to fp8 (static a2, or dynamic: the tile's
     BLOCK_N columns are one 1×H_GROUP group of h, H_GROUP = 128 or 64 (op_small's config key), scale to
     ``hs_ptr`` [n, cdiv(I, BLOCK_N)]); 0 — h in fp32; 2 (SPLIT_K > 1) — the fp32 gate and up
     partial sums of split p at [p, t·k + j, 0:2I] (summed by the down kernel: no atomics). GU_RED
     (SPLIT_K > 1): the splits of a tile store fp32 partials and bump the tile's arrival counter; the
     last to arrive sums them in split order and runs the mode 1/0 epilogue (more programs than
     experts × N tiles at T = 1, without mode 2's per-H-tile SiLU/quantization in the down kernel).
  2. ``_small_down_kernel``  grid (n · cdiv(H, BLOCK_H),): one program per (entry, H tile), the regular
     path's parallelism without its sorted order. H_MODE 1 reads the fp8 h row (with dynamic a2 one group
     scale per group); modes 0/2 sum the partials, apply SiLU·up and quantize each 1×H_GROUP group like the
     reference. A K step holds H_GROUPS groups (BLOCK_K = H_GROUPS · H_GROUP, inside one 128×128 weight
     block): row r of the dot's 16-row activation side holds group r of the step (zeros elsewhere), so one
     BLOCK_K-wide dot leaves group r's partial sum in column r, scaled there by its own group scale; the
     columns are summed after the loop (H_GROUP 64 at the 1×128 form's 128-wide loads and wgmma count). The row
     w_tj · s · W2_e · q(h) of the tile is stored in fp32 to ``y_ptr`` [n, H]; the program then bumps
     the (token, H tile) arrival counter, and the last of the token's k programs sums the k rows in
     slot order j = 0..k−1 (slots of other EP ranks, or −1, skipped: they compute nothing), writes the
     bf16 output and resets the counter to 0. No reduce launch, no atomics on the output. DN_SPLIT
     programs per (entry, H tile) split the K = I steps; their rows are summed in split order too.
  FUSE_QUANT (with PRE_Q): no launch 0. Each gate/up program that owns an expert quantizes the T rows of
     its K range itself (``_quant_span``, the same arithmetic as launch 0: bitwise its values) into a
     private scratch slice, then runs the PRE_Q loop on that slice: one launch boundary fewer per call.
  USE_PDL: each kernel is a programmatic dependent launch that waits (griddepcontrol.wait) for the
     prior grid before touching anything it wrote, and lets the next grid launch at once.

Every output element is a fixed-order sum, so results are bitwise reproducible.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel import FP8_MAX, SCALE_EPS, _prefetch_l2
from .kernel import _quant_rows as _quant_hidden_tile


@triton.jit
def _quant_rows(x, static_scale, GROUP_SCALE: tl.constexpr, dtype: tl.constexpr):
    """fp32 tile [R, C] → (fp8 tile, per-row scale [R]). GROUP_SCALE: the C columns are one group,
    scale = amax / 448 per row; else the per-tensor ``static_scale`` (the returned scale is then 1).
    IEEE division as torch does: bf16 inputs land exactly on fp8 rounding midpoints often enough that a
    reciprocal multiply (which breaks such ties either way) moved 14 of 768 elements in a CPU test."""
    if GROUP_SCALE:
        s = tl.maximum(tl.max(tl.abs(x), axis=1), SCALE_EPS) / FP8_MAX
        q = tl.math.div_rn(x, s[:, None])
    else:
        s = tl.full([x.shape[0]], 1.0, tl.float32)
        q = tl.math.div_rn(x, static_scale)
    q = tl.minimum(tl.maximum(q, -FP8_MAX), FP8_MAX)
    return q.to(dtype), s


@triton.jit
def _gate_up_step(bg, bu, at, sa, sg_ptrs, su_ptrs, k0, n_ok, acc_g, acc_u, A_GROUP: tl.constexpr,
                  W_BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """One K step of the small-T path's swapped gate/up product: weight tiles bg, bu
    [BLOCK_N, BLOCK_K] times the activations' transpose at [BLOCK_K, tokens]. With group/block scales
    each step's fresh fp32 product is scaled per token (sa, the 1x128 group scale) and per weight row
    (the 128x128 block scale at sg_ptrs / su_ptrs for this K step) and added; without, the fp8
    tensor-core partial sums are promoted to fp32 every BLOCK_K."""
    if A_GROUP or W_BLOCK:
        dg = tl.dot(bg, at)
        du = tl.dot(bu, at)
        acc_g += _scaled(dg, sa, sg_ptrs, k0, n_ok, A_GROUP, W_BLOCK)
        acc_u += _scaled(du, sa, su_ptrs, k0, n_ok, A_GROUP, W_BLOCK)
    else:
        acc_g = tl.dot(bg, at, acc_g, max_num_imprecise_acc=BLOCK_K)
        acc_u = tl.dot(bu, at, acc_u, max_num_imprecise_acc=BLOCK_K)
    return acc_g, acc_u


@triton.jit
def _scaled(d, sa, sw_ptrs, k0, n_ok, A_GROUP: tl.constexpr, W_BLOCK: tl.constexpr):
    """A swapped product d [weight rows, tokens] of the K step at k0 times its tokens' group scales sa
    (A_GROUP), then its rows' 128x128 block scales read at ``sw_ptrs`` (W_BLOCK)."""
    if A_GROUP:
        d = d * sa[None, :]
    if W_BLOCK:
        d = d * tl.load(sw_ptrs + k0 // 128, mask=n_ok, other=0.0)[:, None]
    return d


@triton.jit
def _quant_span(x_ptr, stride_x, q_ptr, qs_ptr, a_scale, T, H, k_lo, k_hi,
                Q_GROUPS: tl.constexpr, Q_CHUNKS: tl.constexpr, A_GROUP: tl.constexpr):  # fmt: skip
    """FUSE_QUANT prologue: columns [k_lo, k_hi) of the T bf16 rows at ``x_ptr`` quantized to fp8 at
    ``q_ptr`` [T, H] (and with A_GROUP the 1×128 group scales at ``qs_ptr`` [T, cdiv(H, 128)]): the
    arithmetic of ``kernel._quant_rows`` (amax per group, IEEE division, clamp), so bitwise launch 0's
    values. One [Q_GROUPS, 128] tile per row and chunk: one memory round trip each, no walk over groups
    (with A_GROUP, k_lo is a multiple of 128 and k_hi one or H, so every tile row is one whole group)."""
    num_groups = tl.cdiv(H, 128)
    offs_g = tl.arange(0, Q_GROUPS)
    offs_c = tl.arange(0, 128)
    for r in range(0, T):  # r < T <= FUSE_T_MAX: int32 row offsets
        for c in tl.static_range(Q_CHUNKS):
            starts = k_lo + (c * Q_GROUPS + offs_g) * 128
            cols = starts[:, None] + offs_c[None, :]
            m = cols < k_hi
            x = tl.load(x_ptr + r * stride_x + cols, mask=m, other=0.0).to(tl.float32)
            if A_GROUP:
                s = tl.maximum(tl.max(tl.abs(x), axis=1), SCALE_EPS) / FP8_MAX
                q = tl.math.div_rn(x, s[:, None])
                tl.store(qs_ptr + r * num_groups + starts // 128, s, mask=starts < k_hi)
            else:
                q = tl.math.div_rn(x, a_scale)
            q = tl.minimum(tl.maximum(q, -FP8_MAX), FP8_MAX)
            tl.store(q_ptr + r * H + cols, q.to(q_ptr.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["T"])
def _small_quant_kernel(
    x_ptr,  # bf16 [T, H], row stride stride_x
    xq_ptr,  # fp8 [T, H]
    xs_ptr,  # fp32 [T, cdiv(H, G)] (A_GROUP)
    a_scale_ptr,  # fp32 [1] (static)
    T,
    H,
    stride_x,
    QROWS: tl.constexpr,
    GROUP: tl.constexpr,
    A_GROUP: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """PRE_Q launch 0, grid (cdiv(T, QROWS) · cdiv(H, G),): the regular path's input quantization of one
    [QROWS, G] tile (kernel._quant_rows) without its router."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    _quant_hidden_tile(
        x_ptr, xq_ptr, xs_ptr, a_scale_ptr, tl.program_id(0), T, H, stride_x, QROWS, GROUP, A_GROUP
    )


@triton.jit(
    do_not_specialize=["T", "top_k", "n_entries", "expert_offset", "num_experts", "stride_wse", "stride_wsn"]
)
def _small_gate_up_kernel(
    x_ptr,  # bf16 [T, H], row stride stride_x
    xq_ptr,  # PRE_Q: fp8 [T, H] from _small_quant_kernel; FUSE_QUANT: fp8 [programs, T, H] scratch
    xs_ptr,  # PRE_Q with A_GROUP: fp32 [T, cdiv(H, G)]; FUSE_QUANT: fp32 [programs, T, cdiv(H, G)]
    a13_scale_ptr,  # fp32 [1] (static)
    a2_scale_ptr,  # fp32 [1] (static a2, H_MODE 1)
    topk_ids_ptr,  # int32 [T, k]
    w_ptr,  # fp8 [E, 2I, H]
    ws_ptr,  # fp32 [E] or [E, cdiv(2I, G), cdiv(H, G)]
    h_ptr,  # H_MODE 1: fp8 [n, I]; 0: fp32 [n, I]; 2: fp32 [SPLIT_K, n, 2I]
    hs_ptr,  # H_MODE 1 with A2_GROUP: fp32 [n, cdiv(I, BLOCK_N)] (BLOCK_N = H_GROUP: one group per tile)
    part_ptr,  # GU_RED: fp32 [SPLIT_K, n, 2I] split partials (row t·k + first slot of e)
    count_ptr,  # GU_RED: int32 [>= n · cdiv(I, BLOCK_N)] arrival counters, 0 before and after
    T,
    H,
    I,
    top_k,
    n_entries,
    expert_offset,
    num_experts,
    stride_x,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    BLOCK_M: tl.constexpr,  # >= T (one row per token)
    BLOCK_N: tl.constexpr,  # == H_GROUP (128 or 64) with H_MODE 1 and A2_GROUP
    BLOCK_K: tl.constexpr,  # == G when A_GROUP (the K step is the quantization group)
    SPLIT_K: tl.constexpr,
    K_PAD: tl.constexpr,  # next power of two >= top_k
    N_PAD: tl.constexpr,  # power of two >= n_entries
    H_MODE: tl.constexpr,
    PRE_Q: tl.constexpr,  # read the inputs quantized by _small_quant_kernel (else quantize per K step)
    A_GROUP: tl.constexpr,
    A2_GROUP: tl.constexpr,
    W_BLOCK: tl.constexpr,
    EVEN_K: tl.constexpr,  # H % BLOCK_K == 0
    GU_RED: tl.constexpr,  # SPLIT_K > 1 summed here: the last-arriving split runs the H_MODE 1 epilogue
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent launch (wait for the prior grid here)
    PREFETCH: tl.constexpr,  # (USE_PDL and PRE_Q) prefetch this tile's weights to L2 before the wait
    FUSE_QUANT: tl.constexpr = False,  # (PRE_Q) quantize the rows here (_quant_span), not in launch 0
    Q_GROUPS: tl.constexpr = 1,  # FUSE_QUANT: 128-column groups per prologue tile (power of two)
    Q_CHUNKS: tl.constexpr = 1,  # FUSE_QUANT: prologue tiles per row (Q_GROUPS · Q_CHUNKS >= the K span)
    PF_STEPS: tl.constexpr = 0,  # FUSE_QUANT on SM90: K steps of weights prefetched to L2 before the prologue
):
    num_n = tl.cdiv(I, BLOCK_N)
    pid = tl.program_id(0)
    s_entry = pid // num_n
    pid_n = pid % num_n
    pid_k = tl.program_id(1)
    k_span = tl.cdiv(tl.cdiv(H, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = pid_k * k_span
    k_hi = tl.minimum(k_lo + k_span, H)
    if PREFETCH:
        # topk_ids come from before the quantization launch, which let this grid start only after all its
        # programs had passed their wait: complete. The weights are constant.
        tl.static_assert(USE_PDL)
        tl.static_assert(PRE_Q != 0)
        e_pf = tl.load(topk_ids_ptr + s_entry, cache_modifier=".cg") - expert_offset
        if (e_pf >= 0) & (e_pf < num_experts):
            rows_pf = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            row_ptrs = w_ptr + e_pf.to(tl.int64) * stride_we + rows_pf.to(tl.int64) * stride_wn
            for k0 in range(k_lo, k_hi, 128):
                _prefetch_l2(row_ptrs + k0, rows_pf < I)
                _prefetch_l2(row_ptrs + I * stride_wn + k0, rows_pf < I)
    if USE_PDL:  # everything below reads what earlier launches wrote (ids, quantized inputs)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    e = tl.load(topk_ids_ptr + s_entry) - expert_offset
    if (e < 0) | (e >= num_experts):
        return
    # the first entry naming e owns it; later ones exit (each expert's weights are read once)
    offs_s = tl.arange(0, N_PAD)
    before = tl.load(topk_ids_ptr + offs_s, mask=offs_s < s_entry, other=-1) - expert_offset
    if tl.sum(((offs_s < s_entry) & (before == e)).to(tl.int32), axis=0) > 0:
        return

    # one A row per token routed to e; its result goes to every slot j at which the token chose e
    offs_m = tl.arange(0, BLOCK_M)
    offs_j = tl.arange(0, K_PAD)
    tok_ok = offs_m < T
    ids_m = tl.load(
        topk_ids_ptr + offs_m[:, None] * top_k + offs_j[None, :],
        mask=tok_ok[:, None] & (offs_j < top_k)[None, :],
        other=-1,
    )
    match = (ids_m - expert_offset == e) & tok_ok[:, None] & (offs_j < top_k)[None, :]
    row_ok = tl.sum(match.to(tl.int32), axis=1) > 0

    e64 = e.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < I
    offs_k = tl.arange(0, BLOCK_K)
    if FUSE_QUANT:
        tl.static_assert(PRE_Q != 0)
        if PF_STEPS > 0:  # the first K steps' weights are in flight while the rows are quantized
            rows_pf = w_ptr + e64 * stride_we + offs_n.to(tl.int64) * stride_wn
            for k0 in tl.static_range(0, PF_STEPS * BLOCK_K, 128):
                _prefetch_l2(rows_pf + k_lo + k0, n_ok & (k_lo + k0 < k_hi))
                _prefetch_l2(rows_pf + I * stride_wn + k_lo + k0, n_ok & (k_lo + k0 < k_hi))
        # this program's private slice of the scratch (no other program writes it: no cross-CTA order)
        prog = (pid_k * tl.num_programs(0) + pid).to(tl.int64) * T
        xq_ptr += prog * H
        xs_ptr += prog * tl.cdiv(H, 128)
        _quant_span(x_ptr, stride_x, xq_ptr, xs_ptr, tl.load(a13_scale_ptr), T, H, k_lo, k_hi, Q_GROUPS,
                    Q_CHUNKS, A_GROUP)  # fmt: skip
        tl.debug_barrier()  # bar.sync: every thread's scratch stores are visible to the CTA's loads below
    XQ_CACHE: tl.constexpr = ".cg" if FUSE_QUANT else ""
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_x + offs_k[None, :]
    xq_ptrs = xq_ptr + offs_m.to(tl.int64)[None, :] * H + offs_k[:, None]  # transposed: [BLOCK_K, BLOCK_M]
    # swap A and B: weight rows are the dot's M side (BLOCK_N >= 64: a Hopper wgmma reads the fp8 tile
    # straight from shared memory, no fp8 -> f16 conversion as mma.sync needs), the tokens its N side
    wg_ptrs = w_ptr + e64 * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    wu_ptrs = wg_ptrs + I * stride_wn
    if W_BLOCK:
        sg_ptrs = ws_ptr + e64 * stride_wse + (offs_n // 128) * stride_wsn
        su_ptrs = ws_ptr + e64 * stride_wse + ((offs_n + I) // 128) * stride_wsn
    else:  # per-tensor weight scales: unused by _gate_up_step
        sg_ptrs = ws_ptr
        su_ptrs = ws_ptr
    a13 = tl.load(a13_scale_ptr)

    acc_g = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # transposed: [columns of I, tokens]
    acc_u = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    xs_row = xs_ptr + offs_m.to(tl.int64) * tl.cdiv(H, 128)  # PRE_Q with A_GROUP: this row's group scales
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            k_ok = offs_k >= 0
        else:
            k_ok = (k0 + offs_k) < H
        bg = tl.load(wg_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        bu = tl.load(wu_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if PRE_Q:
            # FUSE_QUANT: .cg (L2 only; a caution, not needed: the stores were this CTA's, so
            # this SM's L1, ordered by the bar.sync). It takes the group-scale loads off L1: one L2 round trip
            # per K step (sm_90a PTX: ld.global.cg.b32 in the loop). The tile's copy stays cp.async.ca (8 B)
            at = tl.load(
                xq_ptrs + k0, mask=k_ok[:, None] & row_ok[None, :], other=0.0, cache_modifier=XQ_CACHE
            )
            if A_GROUP:
                sa = tl.load(xs_row + k0 // 128, mask=row_ok, other=0.0, cache_modifier=XQ_CACHE)
            else:  # static activation scale: applied after the loop, unused by _gate_up_step
                sa = 1.0
        else:
            x = tl.load(x_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            a, sa = _quant_rows(x.to(tl.float32), a13, A_GROUP, w_ptr.dtype.element_ty)
            at = tl.trans(a)  # [BLOCK_K, BLOCK_M]
        acc_g, acc_u = _gate_up_step(
            bg, bu, at, sa, sg_ptrs, su_ptrs, k0, n_ok, acc_g, acc_u, A_GROUP, W_BLOCK, BLOCK_K
        )
    if GU_RED:
        # this split's partial sums go to row (p, t·k + j) for the first slot j where token t chose e;
        # the split that arrives last sums all SPLIT_K partials in split order (deterministic) and
        # runs the epilogue, the others exit (router_gemm's arrival counter)
        j_first = tl.min(tl.where(match, offs_j[None, :], K_PAD), axis=1)
        row_first = offs_m.to(tl.int64) * top_k + j_first
        p_ofs = row_first[None, :] * (2 * I) + offs_n[:, None]  # [BLOCK_N, BLOCK_M]
        p_ok = n_ok[:, None] & row_ok[None, :]
        mine = part_ptr + pid_k * n_entries * (2 * I) + p_ofs
        tl.store(mine, acc_g, mask=p_ok)
        tl.store(mine + I, acc_u, mask=p_ok)
        tl.debug_barrier()  # every thread's partial store before the (gpu-scope, acq_rel) arrival
        cnt = count_ptr + s_entry * num_n + pid_n
        arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if arrived != SPLIT_K - 1:
            return
        acc_g = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for p in tl.static_range(SPLIT_K):
            part = part_ptr + p * n_entries * (2 * I) + p_ofs
            # .cg: through L2, never a stale L1 line of another CTA's partial
            acc_g += tl.load(part, mask=p_ok, other=0.0, cache_modifier=".cg")
            acc_u += tl.load(part + I, mask=p_ok, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
    acc_g = tl.trans(acc_g)  # [BLOCK_M, BLOCK_N] again: one row per token
    acc_u = tl.trans(acc_u)
    if not A_GROUP:
        acc_g = acc_g * tl.load(a13_scale_ptr)
        acc_u = acc_u * tl.load(a13_scale_ptr)
    if not W_BLOCK:
        acc_g = acc_g * tl.load(ws_ptr + e64)
        acc_u = acc_u * tl.load(ws_ptr + e64)
    if H_MODE != 2:
        h = acc_g * tl.sigmoid(acc_g) * acc_u
        h = tl.where(n_ok[None, :], h, 0.0)
    if H_MODE == 1:
        hq, hs = _quant_rows(h, tl.load(a2_scale_ptr), A2_GROUP, h_ptr.dtype.element_ty)
    for jj in tl.static_range(K_PAD):
        at_j = tl.sum(tl.where(offs_j[None, :] == jj, match.to(tl.int32), 0), axis=1) > 0
        m_out = at_j[:, None] & n_ok[None, :]
        entry = offs_m.to(tl.int64) * top_k + jj
        if H_MODE == 1:
            tl.store(h_ptr + entry[:, None] * I + offs_n[None, :], hq, mask=m_out)
            if A2_GROUP:
                tl.store(hs_ptr + entry * tl.cdiv(I, BLOCK_N) + pid_n, hs, mask=at_j)
        elif H_MODE == 0:
            tl.store(h_ptr + entry[:, None] * I + offs_n[None, :], h, mask=m_out)
        else:
            base = h_ptr + (pid_k * n_entries + entry)[:, None] * (2 * I) + offs_n[None, :]
            tl.store(base, acc_g, mask=m_out)
            tl.store(base + I, acc_u, mask=m_out)


@triton.jit(
    do_not_specialize=["T", "top_k", "n_entries", "expert_offset", "num_experts", "stride_wse", "stride_wsn"]
)
def _small_down_kernel(
    h_ptr,  # as written by _small_gate_up_kernel (H_MODE)
    hs_ptr,  # fp32 [n, cdiv(I, H_GROUP)] (H_MODE 1 with A2_GROUP: one scale per 1×H_GROUP group)
    a2_scale_ptr,  # fp32 [1] (static)
    topk_ids_ptr,  # int32 [T, k]
    topk_w_ptr,  # fp32 [T, k]
    w_ptr,  # fp8 [E, H, I]
    ws_ptr,  # fp32 [E] or [E, cdiv(H, G), cdiv(I, G)]
    y_ptr,  # fp32 [DN_SPLIT, n, H] scratch: one weighted row per (K split, token, slot)
    count_ptr,  # int32 [>= T · cdiv(H, BLOCK_H)] arrival counters, 0 before and after the launch
    out_ptr,  # bf16 [T, H], row stride stride_out
    T,
    H,
    I,
    top_k,
    n_entries,
    expert_offset,
    num_experts,
    routed_scaling,
    stride_out,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,  # == H_GROUPS · H_GROUP when A2_GROUP (H_GROUP 128 or 64: h's quantization group)
    SPLIT_K: tl.constexpr,  # of the gate/up launch (H_MODE 2: partials summed here, in split order)
    K_PAD: tl.constexpr,  # next power of two >= top_k
    H_MODE: tl.constexpr,
    A2_GROUP: tl.constexpr,
    W_BLOCK: tl.constexpr,
    EVEN_K: tl.constexpr,  # I % BLOCK_K == 0
    DN_SPLIT: tl.constexpr,  # programs per (entry, H tile), each over a 1/DN_SPLIT share of the K = I steps
    USE_PDL: tl.constexpr,
    PREFETCH: tl.constexpr,  # (USE_PDL) prefetch this tile's weights to L2 before the wait
    H_GROUPS: tl.constexpr = 1,  # (A2_GROUP) h's quantization groups per K step (BLOCK_K / H_GROUP, <= 16)
):
    pid = tl.program_id(0)
    s = (pid % n_entries).to(tl.int64)  # the entries of one H tile are neighbours: shared experts hit L2
    num_h = tl.cdiv(H, BLOCK_H)
    pid_h = (pid // n_entries) % num_h
    pid_p = pid // (n_entries * num_h)
    t = s // top_k
    k_span = tl.cdiv(tl.cdiv(I, BLOCK_K), DN_SPLIT) * BLOCK_K
    k_lo = pid_p * k_span
    k_hi = tl.minimum(k_lo + k_span, I)
    if PREFETCH:
        # this grid starts only once every gate/up program has passed its wait, so the launches before
        # gate/up (topk_ids) are complete; the weights are constant
        tl.static_assert(USE_PDL)
        e_pf = tl.load(topk_ids_ptr + s, cache_modifier=".cg") - expert_offset
        if (e_pf >= 0) & (e_pf < num_experts):
            rows_pf = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
            row_ptrs = w_ptr + e_pf.to(tl.int64) * stride_we + rows_pf.to(tl.int64) * stride_wn
            for k0 in range(k_lo, k_hi, 128):
                _prefetch_l2(row_ptrs + k0, rows_pf < H)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < H
    e = tl.load(topk_ids_ptr + s) - expert_offset
    if (e >= 0) & (e < num_experts):
        e64 = e.to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        rows = tl.arange(0, 16)  # the dot's N side: column r holds the entry's K-step group r, others zero
        HG: tl.constexpr = BLOCK_K // H_GROUPS
        if H_GROUPS == 1:
            mine = (rows == 0)[:, None]
        else:  # [16, BLOCK_K]: row r keeps the columns of group r
            tl.static_assert(A2_GROUP)
            tl.static_assert(H_GROUPS <= 16)
            mine = rows[:, None] == (offs_k // HG)[None, :]
        # weight rows are the dot's M side (see the gate/up kernel)
        w_ptrs = w_ptr + e64 * stride_we + offs_h[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
        if W_BLOCK:
            sw_ptrs = ws_ptr + e64 * stride_wse + (offs_h // 128) * stride_wsn
        a2 = tl.load(a2_scale_ptr)
        acc = tl.zeros([BLOCK_H, 16], dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            cols = k0 + offs_k
            if EVEN_K:
                k_ok = cols >= 0
            else:
                k_ok = cols < I
            if H_MODE == 1:
                a = tl.load(
                    h_ptr + s * I + cols[None, :] + rows[:, None] * 0, mask=mine & k_ok[None, :], other=0.0
                )
                if H_GROUPS > 1:  # one scale per row: its group's
                    g_ok = (rows < H_GROUPS) & (k0 + rows * HG < I)
                    sa = tl.load(hs_ptr + s * tl.cdiv(I, HG) + k0 // HG + rows, mask=g_ok, other=0.0)
                elif A2_GROUP:
                    sa = tl.load(hs_ptr + s * tl.cdiv(I, BLOCK_K) + k0 // BLOCK_K)
                else:
                    sa = 1.0
            else:
                if H_MODE == 0:
                    hv = tl.load(h_ptr + s * I + cols, mask=k_ok, other=0.0)
                else:
                    g = tl.zeros([BLOCK_K], dtype=tl.float32)
                    u = tl.zeros([BLOCK_K], dtype=tl.float32)
                    for p in tl.static_range(SPLIT_K):
                        base = h_ptr + (p * n_entries + s) * (2 * I) + cols
                        g += tl.load(base, mask=k_ok, other=0.0)
                        u += tl.load(base + I, mask=k_ok, other=0.0)
                    hv = g * tl.sigmoid(g) * u
                a, sa_rows = _quant_rows(
                    tl.where(mine, hv[None, :], 0.0), a2, A2_GROUP, w_ptr.dtype.element_ty
                )
                if H_GROUPS > 1:  # row r's scale is group r's (rows >= H_GROUPS: zero products)
                    sa = sa_rows
                else:
                    sa = tl.sum(tl.where(rows == 0, sa_rows, 0.0), axis=0)
            b = tl.load(w_ptrs + k0, mask=h_ok[:, None] & k_ok[None, :], other=0.0)
            at = tl.trans(a)  # [BLOCK_K, 16]
            if A2_GROUP or W_BLOCK:
                d = tl.dot(b, at)
                if W_BLOCK:
                    d = d * tl.load(sw_ptrs + k0 // 128, mask=h_ok, other=0.0)[:, None]
                if H_GROUPS > 1:
                    acc += d * sa[None, :]  # column r: group r's products times its scale
                else:
                    acc += d * sa
            else:
                acc = tl.dot(b, at, acc, max_num_imprecise_acc=BLOCK_K)
        coef = tl.load(topk_w_ptr + s) * routed_scaling
        if not A2_GROUP:
            coef = coef * tl.load(a2_scale_ptr)
        if not W_BLOCK:
            coef = coef * tl.load(ws_ptr + e64)
        y = tl.sum(acc, axis=1) * coef  # the groups' columns summed (columns >= H_GROUPS are zero)
        tl.store(y_ptr + (pid_p * n_entries + s) * H + offs_h, y, mask=h_ok)
    # every thread's row store happens before the (gpu-scope, acq_rel) arrival atomic
    tl.debug_barrier()
    cnt = count_ptr + t * num_h + pid_h
    arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if arrived == top_k * DN_SPLIT - 1:
        offs_j = tl.arange(0, K_PAD)
        ids_t = tl.load(topk_ids_ptr + t * top_k + offs_j, mask=offs_j < top_k, other=-1) - expert_offset
        local_t = (ids_t >= 0) & (ids_t < num_experts)
        total = tl.zeros([BLOCK_H], dtype=tl.float32)
        for j in range(0, top_k):  # slot order, then split order: never the arrival order
            local_j = tl.sum(tl.where((offs_j == j) & local_t, 1, 0), axis=0) > 0
            for p in tl.static_range(DN_SPLIT):
                # .cg: read through L2, never a stale L1 line of another CTA's row
                total += tl.load(
                    y_ptr + ((p * n_entries + t * top_k + j) * H + offs_h),
                    mask=h_ok & local_j,
                    other=0.0,
                    cache_modifier=".cg",
                )
        tl.store(out_ptr + t * stride_out + offs_h, total.to(out_ptr.dtype.element_ty), mask=h_ok)
        tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


__all__ = ["_small_down_kernel", "_small_gate_up_kernel", "_small_quant_kernel"]
