"""Triton kernel of the FP32-accurate router GEMM (jit code only; launched by ``op.py``).

logits[M, N] (fp32) = x[M, K] · hiᵀ + (x · loᵀ) / 256 (+ bias), where hi = bf16(W) and
lo = bf16((W − hi) · 256) were split once from the fp32 weight W[N, K] (``op.prepare``). Each K step
loads one x tile and the matching hi and lo tiles and issues two bf16 tensor-core products into two
fp32 accumulators (three when fp32 x is split as well), so the small lo part is never swamped by the
large hi part before the final scaled sum.

Grid: axis 0 = output tiles (M tile major, N tile minor, so CTAs that share an x tile run together),
axis 1 = SPLIT_K slices of the K range. With SPLIT_K > 1 every CTA writes its fp32 partial tile to a
workspace [SPLIT_K, M, N] (L2-resident at the small M where split-K is used), bumps the tile's arrival
counter, and the CTA that arrives last sums the SPLIT_K partials in slice order 0..SPLIT_K-1, adds the
bias, writes the output and resets the counter to 0. The sum order never depends on arrival order, so
the result is bitwise deterministic, and the whole op is one launch with no zero-fill and no second
pass over the output.

``router_gemv_kernel`` is the small-M path (a few decode tokens): one program per few experts over the
whole K on the CUDA cores, same hi/lo split, no split-K and no arrival counters (see its docstring).
"""

from __future__ import annotations

import triton
import triton.language as tl

# x modes (constexpr X_MODE)
X_BF16 = 0  # x is bf16: 2 products
X_FP32_SPLIT = 1  # x is fp32, split in registers into x_hi + x_lo/256: 3 products
X_FP32_ROUND = 2  # x is fp32, rounded to bf16 in registers: 2 products (x precision lost)


@triton.jit(do_not_specialize=["M"])
def router_gemm_kernel(
    x_ptr,  # [M, K] bf16 or fp32; row stride stride_xm, unit column stride
    hi_ptr,  # [N, K] bf16, contiguous
    lo_ptr,  # [N, K] bf16, contiguous
    bias_ptr,  # [N] fp32 (read only when HAS_BIAS)
    out_ptr,  # [M, N] fp32; row stride stride_om, unit column stride
    ws_ptr,  # [SPLIT_K, M, N] fp32 partial tiles (used only when SPLIT_K > 1)
    count_ptr,  # [num output tiles] int32 arrival counters; 0 before and after every launch
    M,
    N,
    K,
    stride_xm,
    stride_om,
    X_MODE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MASK_K: tl.constexpr,  # K % BLOCK_K != 0 or the slices cover more K steps than exist
    K_STEPS: tl.constexpr,  # BLOCK_K steps per K slice = cdiv(cdiv(K, BLOCK_K), SPLIT_K)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid_mn = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid_mn // num_pid_n
    pid_n = pid_mn % num_pid_n

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_k = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    mask_m = offs_m < M
    mask_n = offs_n < N

    # This CTA's slice of K: K_STEPS whole BLOCK_K steps (a constexpr trip count: the compiler can
    # pipeline it fully, and the slice's end needs no runtime min()).
    k0 = pid_k * (K_STEPS * BLOCK_K)

    # int64 address math: x rows can be far apart (M up to 16384, strided views).
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + (k0 + offs_k)[None, :]  # [BM, BK]
    w_off = offs_n.to(tl.int64)[None, :] * K + (k0 + offs_k)[:, None]  # [BK, BN]
    hi_ptrs = hi_ptr + w_off
    lo_ptrs = lo_ptr + w_off

    acc_hi = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # x·hiᵀ
    acc_lo = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # 256 × the small terms
    for step in range(K_STEPS):
        if MASK_K:
            # K tail, and steps past K in the last slice (their loads are fully masked)
            mask_k = (k0 + step * BLOCK_K + offs_k) < K
            x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            hi = tl.load(hi_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            lo = tl.load(lo_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        else:
            x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
            hi = tl.load(hi_ptrs, mask=mask_n[None, :], other=0.0)
            lo = tl.load(lo_ptrs, mask=mask_n[None, :], other=0.0)
        if X_MODE == 0:
            acc_hi = tl.dot(x, hi, acc_hi)
            acc_lo = tl.dot(x, lo, acc_lo)
        elif X_MODE == 1:
            x_hi = x.to(tl.bfloat16)
            x_lo = ((x - x_hi.to(tl.float32)) * 256.0).to(tl.bfloat16)
            acc_hi = tl.dot(x_hi, hi, acc_hi)
            acc_lo = tl.dot(x_hi, lo, acc_lo)
            acc_lo = tl.dot(x_lo, hi, acc_lo)
        else:
            x_b = x.to(tl.bfloat16)
            acc_hi = tl.dot(x_b, hi, acc_hi)
            acc_lo = tl.dot(x_b, lo, acc_lo)
        x_ptrs += BLOCK_K
        hi_ptrs += BLOCK_K
        lo_ptrs += BLOCK_K
    acc = acc_hi + acc_lo * (1.0 / 256.0)

    mask_mn = mask_m[:, None] & mask_n[None, :]
    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += bias[None, :]
        tl.store(out_ptrs, acc, mask=mask_mn)
    else:
        slice_elems = M.to(tl.int64) * N
        ws_tile = ws_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]  # [BM, BN], slice 0
        tl.store(ws_tile + pid_k * slice_elems, acc, mask=mask_mn)
        # All threads' partial stores happen before the (gpu-scope, acq_rel) arrival atomic.
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + pid_mn, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                # .cg: read through L2, never a stale L1 line of another CTA's partial.
                total += tl.load(ws_tile + s * slice_elems, mask=mask_mn, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += bias[None, :]
            tl.store(out_ptrs, total, mask=mask_mn)
            tl.atomic_xchg(count_ptr + pid_mn, 0, sem="relaxed", scope="gpu")


@triton.jit(do_not_specialize=["M"])
def router_gemv_kernel(
    x_ptr,  # [M, K] bf16 or fp32; row stride stride_xm, unit column stride
    hi_ptr,  # [N, K] bf16, contiguous
    lo_ptr,  # [N, K] bf16, contiguous
    bias_ptr,  # [N] fp32 (read only when HAS_BIAS)
    out_ptr,  # [M, N] fp32; row stride stride_om, unit column stride
    M,
    N,
    K,
    stride_xm,
    stride_om,
    X_MODE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    M_PAD: tl.constexpr,  # power of two >= M
    ROWS: tl.constexpr,  # weight rows (experts) per program
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Small-M path (decode: a handful of tokens): one program owns ROWS experts and the whole K, so
    no split-K partials and no reduction pass exist. At M <= 8 a tensor-core tile would be >= 50%
    padding and the op is a pure weight stream, so the products run on the CUDA cores instead, over the
    same hi/lo split: a bf16·bf16 product is exact in fp32 and the fp32 sums of x·hi and x·lo are kept
    apart until the final hi + lo/256, exactly as in the tensor-core path. fp32 x (X_FP32_SPLIT) is used
    as is: one fp32 FMA per product is at least as accurate as the 3-product split. Lanes are
    (token, expert) pairs, r = m·ROWS + j, each with a [BLOCK_K] strip of K per step; the weight strip
    of expert j is loaded once per token, the repeats hitting L1."""
    pid = tl.program_id(0)
    R: tl.constexpr = M_PAD * ROWS
    offs_r = tl.arange(0, R)
    offs_m = offs_r // ROWS
    offs_n = pid * ROWS + offs_r % ROWS
    offs_k = tl.arange(0, BLOCK_K)
    mask_r = (offs_m < M) & (offs_n < N)

    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    w_rows = offs_n.to(tl.int64)[:, None] * K
    acc_hi = tl.zeros((R,), dtype=tl.float32)
    acc_lo = tl.zeros((R,), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        kk = k0 + offs_k
        mask = mask_r[:, None] & (kk < K)[None, :]
        x = tl.load(x_rows + kk[None, :], mask=mask, other=0.0)
        hi = tl.load(hi_ptr + w_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)
        lo = tl.load(lo_ptr + w_rows + kk[None, :], mask=mask, other=0.0).to(tl.float32)
        if X_MODE == 2:
            x = x.to(tl.bfloat16)
        x = x.to(tl.float32)
        acc_hi += tl.sum(x * hi, axis=1)
        acc_lo += tl.sum(x * lo, axis=1)
    acc = acc_hi + acc_lo * (1.0 / 256.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)
    tl.store(out_ptr + offs_m.to(tl.int64) * stride_om + offs_n, acc, mask=mask_r)
