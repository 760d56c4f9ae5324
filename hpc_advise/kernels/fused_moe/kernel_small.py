"""Triton kernels of the FP8 fused MoE's small-T (decode) path: two launches, no routing pass.

Launched by ``op_small.py``. Notation as in ``kernel.py``: T tokens (T <= BLOCK_M), k = top_k,
n = T·k (token, slot) entries, E local experts, H hidden, I intermediate (a TP shard), G = 128.

  1. ``_small_gate_up_kernel``  grid (n · cdiv(I, BLOCK_N), SPLIT_K). The program of entry s serves the
     local expert e = topk_ids[s] − offset for *every* token routed to e, but only if s is the first
     entry naming e (later entries of the same expert exit at once): each expert's weights are
     streamed once, without sorting the entries. Its A tile holds one row per token (rows of tokens not
     routed to e are zero) and is quantized on the fly from the bf16 hidden rows (static a13 scale, or
     dynamic per-1×G group: the K step is the group). Output, at every slot j where token t chose e:
     with SPLIT_K == 1, h = SiLU(gate)·up in fp32 at row t·k + j of ``h_ptr`` [n, I]; with SPLIT_K > 1,
     the fp32 gate and up partial sums of split s at [s, t·k + j, 0:2I] (summed by the down kernel, so
     no counters and no atomics).
  2. ``_small_down_kernel``  grid (T · cdiv(H, BLOCK_H),). One program owns an H tile of one token and
     walks its k slots in j order (one flattened loop of k · cdiv(I, BLOCK_K) steps, so loads are
     pipelined across slot boundaries). Each step sums the split-K partials (if any), applies
     SiLU·up, quantizes the [BLOCK_K] chunk of h like the reference (static a2 or dynamic group),
     multiplies by the expert's W2 tile and adds it, scaled by routing weight · routed scaling ·
     activation and weight scales, to an fp32 accumulator. Slots of other EP ranks (or −1) are masked
     off (no weight bytes are read). The bf16 output row is written once: no reduce launch, no atomics.

Each output element is produced by one program in a fixed order, so results are bitwise reproducible.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel import FP8_MAX, SCALE_EPS


@triton.jit
def _quant_tile(x, a_scale_ptr, GROUP_SCALE: tl.constexpr, dtype: tl.constexpr):
    """fp32 tile [R, C] → (fp8 tile, per-row fp32 scale [R]); with GROUP_SCALE the C columns are one
    group (amax / 448 per row), else the static per-tensor scale at ``a_scale_ptr`` (returned per row)."""
    if GROUP_SCALE:
        s = tl.maximum(tl.max(tl.abs(x), axis=1), SCALE_EPS) / FP8_MAX
    else:
        s = tl.zeros([x.shape[0]], dtype=tl.float32) + tl.load(a_scale_ptr)
    q = tl.math.div_rn(x, s[:, None])
    q = tl.minimum(tl.maximum(q, -FP8_MAX), FP8_MAX)
    return q.to(dtype), s


@triton.jit(
    do_not_specialize=["T", "top_k", "n_entries", "expert_offset", "num_experts", "stride_wse", "stride_wsn"]
)
def _small_gate_up_kernel(
    x_ptr,  # bf16 [T, H], row stride stride_x
    a13_scale_ptr,  # fp32 [1] (static)
    topk_ids_ptr,  # int32 [T, k]
    w_ptr,  # fp8 [E, 2I, H]
    ws_ptr,  # fp32 [E] or [E, cdiv(2I, G), cdiv(H, G)]
    h_ptr,  # SPLIT_K == 1: fp32 [n, I] (SiLU(gate)·up); else fp32 [SPLIT_K, n, 2I] (gate | up partials)
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
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # == G when A_GROUP (the K step is the quantization group)
    SPLIT_K: tl.constexpr,
    K_PAD: tl.constexpr,  # next power of two >= top_k
    N_PAD: tl.constexpr,  # next power of two >= n_entries
    A_GROUP: tl.constexpr,
    W_BLOCK: tl.constexpr,
    EVEN_K: tl.constexpr,  # H % BLOCK_K == 0
):
    num_n = tl.cdiv(I, BLOCK_N)
    pid = tl.program_id(0)
    s_entry = pid // num_n
    pid_n = pid % num_n
    pid_k = tl.program_id(1)
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
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_x + offs_k[None, :]
    wg_ptrs = w_ptr + e64 * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    wu_ptrs = wg_ptrs + I * stride_wn
    if W_BLOCK:
        sg_ptrs = ws_ptr + e64 * stride_wse + (offs_n // 128) * stride_wsn
        su_ptrs = ws_ptr + e64 * stride_wse + ((offs_n + I) // 128) * stride_wsn

    k_span = tl.cdiv(tl.cdiv(H, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = pid_k * k_span
    k_hi = tl.minimum(k_lo + k_span, H)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs + k0, mask=row_ok[:, None], other=0.0)
            bg = tl.load(wg_ptrs + k0, mask=n_ok[None, :], other=0.0)
            bu = tl.load(wu_ptrs + k0, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = (k0 + offs_k) < H
            x = tl.load(x_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            bg = tl.load(wg_ptrs + k0, mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            bu = tl.load(wu_ptrs + k0, mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        a, sa = _quant_tile(x.to(tl.float32), a13_scale_ptr, A_GROUP, w_ptr.dtype.element_ty)
        if A_GROUP or W_BLOCK:
            dg = tl.dot(a, bg)
            du = tl.dot(a, bu)
            if A_GROUP:
                dg = dg * sa[:, None]
                du = du * sa[:, None]
            if W_BLOCK:
                dg = dg * tl.load(sg_ptrs + k0 // 128, mask=n_ok, other=0.0)[None, :]
                du = du * tl.load(su_ptrs + k0 // 128, mask=n_ok, other=0.0)[None, :]
            acc_g += dg
            acc_u += du
        else:
            # promote the fp8 tensor-core partial sums to fp32 every BLOCK_K
            acc_g = tl.dot(a, bg, acc_g, max_num_imprecise_acc=BLOCK_K)
            acc_u = tl.dot(a, bu, acc_u, max_num_imprecise_acc=BLOCK_K)
    if not A_GROUP:
        acc_g = acc_g * tl.load(a13_scale_ptr)
        acc_u = acc_u * tl.load(a13_scale_ptr)
    if not W_BLOCK:
        acc_g = acc_g * tl.load(ws_ptr + e64)
        acc_u = acc_u * tl.load(ws_ptr + e64)
    if SPLIT_K == 1:
        h = acc_g * tl.sigmoid(acc_g) * acc_u
    for jj in tl.static_range(K_PAD):
        at_j = tl.sum(tl.where(offs_j[None, :] == jj, match.to(tl.int32), 0), axis=1) > 0
        m_out = at_j[:, None] & n_ok[None, :]
        entry = offs_m.to(tl.int64) * top_k + jj
        if SPLIT_K == 1:
            tl.store(h_ptr + entry[:, None] * I + offs_n[None, :], h, mask=m_out)
        else:
            base = h_ptr + (pid_k * n_entries + entry)[:, None] * (2 * I) + offs_n[None, :]
            tl.store(base, acc_g, mask=m_out)
            tl.store(base + I, acc_u, mask=m_out)


@triton.jit(
    do_not_specialize=["T", "top_k", "n_entries", "expert_offset", "num_experts", "stride_wse", "stride_wsn"]
)
def _small_down_kernel(
    h_ptr,  # as written by _small_gate_up_kernel
    a2_scale_ptr,  # fp32 [1] (static)
    topk_ids_ptr,  # int32 [T, k]
    topk_w_ptr,  # fp32 [T, k]
    w_ptr,  # fp8 [E, H, I]
    ws_ptr,  # fp32 [E] or [E, cdiv(H, G), cdiv(I, G)]
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
    BLOCK_K: tl.constexpr,  # == G when A2_GROUP
    SPLIT_K: tl.constexpr,  # of the gate/up launch (partials summed here, in split order)
    K_PAD: tl.constexpr,  # next power of two >= top_k
    A2_GROUP: tl.constexpr,
    W_BLOCK: tl.constexpr,
    EVEN_K: tl.constexpr,  # I % BLOCK_K == 0
):
    pid = tl.program_id(0)
    t = (pid % T).to(tl.int64)  # tokens of one H tile are neighbours: shared experts hit L2
    pid_h = pid // T
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < H
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, 16)  # the dot's A tile: row 0 holds the token, rows 1.. are zero
    # the token's experts and routing weights, loaded once: inside the loop the weight addresses then
    # depend on the induction variable only, so the software pipeliner keeps several tiles in flight
    offs_j = tl.arange(0, K_PAD)
    ids_t = tl.load(topk_ids_ptr + t * top_k + offs_j, mask=offs_j < top_k, other=-1) - expert_offset
    local_t = (ids_t >= 0) & (ids_t < num_experts)
    coef_t = tl.load(topk_w_ptr + t * top_k + offs_j, mask=local_t, other=0.0) * routed_scaling
    num_k = tl.cdiv(I, BLOCK_K)
    acc = tl.zeros([16, BLOCK_H], dtype=tl.float32)
    for it in range(0, top_k * num_k):
        j = it // num_k
        k0 = (it % num_k) * BLOCK_K
        entry = t * top_k + j
        e = tl.sum(tl.where(offs_j == j, ids_t, 0), axis=0)
        local = tl.sum(tl.where((offs_j == j) & local_t, 1, 0), axis=0) > 0
        e64 = tl.where(local, e, 0).to(tl.int64)
        cols = k0 + offs_k
        if EVEN_K:
            k_ok = local & (cols >= 0)
        else:
            k_ok = local & (cols < I)
        if SPLIT_K == 1:
            hv = tl.load(h_ptr + entry * I + cols, mask=k_ok, other=0.0)
        else:
            g = tl.zeros([BLOCK_K], dtype=tl.float32)
            u = tl.zeros([BLOCK_K], dtype=tl.float32)
            for sp in tl.static_range(SPLIT_K):
                base = h_ptr + (sp * n_entries + entry) * (2 * I) + cols
                g += tl.load(base, mask=k_ok, other=0.0)
                u += tl.load(base + I, mask=k_ok, other=0.0)
            hv = g * tl.sigmoid(g) * u
        hv2 = tl.where((rows == 0)[:, None], hv[None, :], 0.0)
        a, sa = _quant_tile(hv2, a2_scale_ptr, A2_GROUP, w_ptr.dtype.element_ty)
        b = tl.load(
            w_ptr + e64 * stride_we + offs_h[None, :].to(tl.int64) * stride_wn + cols[:, None],
            mask=h_ok[None, :] & k_ok[:, None],
            other=0.0,
        )
        d = tl.dot(a, b)
        coef = tl.sum(tl.where(offs_j == j, coef_t, 0.0), axis=0)
        if W_BLOCK:
            sw = tl.load(
                ws_ptr + e64 * stride_wse + (offs_h // 128) * stride_wsn + k0 // 128, mask=h_ok, other=0.0
            )
            d = d * sw[None, :]
        else:
            coef = coef * tl.load(ws_ptr + e64)
        acc += d * (sa[:, None] * coef)
    y = tl.sum(acc, axis=0)  # rows 1.. are zero
    tl.store(out_ptr + t * stride_out + offs_h, y.to(out_ptr.dtype.element_ty), mask=h_ok)


__all__ = ["_small_down_kernel", "_small_gate_up_kernel"]
