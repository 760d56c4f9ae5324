"""The transposed attention pass of paged decode attention: tokens on the MMA's M side.

Same plan, same workspace / partials contract and same merge as ``kernel.decode_kernel`` (descriptor
prologue, page ids of ``PT_CHUNK`` tiles per load, page >= tile or = tile / 2); only the tile loop's products differ.
``decode_kernel`` computes ``S[heads, tokens] = q[heads, D] @ K_tile^T`` with the GQA group (8 heads) padded
to the MMA's 16 rows and q as the operand re-read every tile. Here, per tile of T tokens of one KV head:

    S^T[T, G]  = K_tile[T, D] @ q^T[D, G]          (K converted fp8 -> fp16 in registers: the A operand;
                                                    q^T loop-invariant: the B operand, G = group padded to 16)
    m' = max(m, max_tokens S^T),  P^T = 2^(S^T - m'),  L' = L 2^(m - m') + P^T
    O^T[D, G] = O^T 2^(m - m') + V_tile^T[D, T] @ P^T[T, G]

i.e. the same online softmax in base 2 as ``kernel._attend`` (logits scaled by ``qk_scale`` in fp32 after
the product, P rounded to the product dtype, fp32 accumulators), with every tensor transposed: the
running max is per column (query head), its reduction runs over the token axis. The running sum is kept
per element, ``L [T, G]``, and summed over the tokens once at the segment's end (``l = sum_tokens L``, the
same value up to fp32 summation order): the max is the only cross-warp reduction per tile. The output
accumulator is ``O^T [D, G]``: ``D x 16`` fp32 spread over all the program's threads instead of one
``[16, D]`` block per warp. At the segment's end ``O^T`` is transposed back and written by
``kernel._finish`` (output rows or a partial).

fp8 K is read as int32 (4 e4m3 bytes) and its head_dim permuted (``_perm_d``, q the same way, so every
q.k is unchanged): the 4 bytes land in the columns one thread holds in the 16-bit MMA's A-operand layout,
so the loaded tile converts (two ``cvt.rn.f16x2.e4m3x2``) straight into the operand registers. V is read
as e4m3 pairs like ``kernel._load_v_f16``.

Layouts are Triton's (3.6): on sm_90a with 4 warps and a 64-token tile both products are warpgroup MMAs
(m64n16k16; M = 64 tokens, resp. 2 x 64 rows of D), the first with K from registers and q^T from shared
memory, the second with V^T from registers (converted V through shared memory, ``ldmatrix.trans``) and P^T
from shared memory; with fewer warps they are mma.sync. For 16-bit KV (bf16 / fp16 in q's dtype, no
conversion) both warpgroup MMAs read every operand from shared memory: K straight from its async-copy buffer,
Vᵀ as a transposed view of V's buffer, qᵀ and Pᵀ as above, so nothing is staged through registers; each of
``NUM_STAGES`` buffers holds a K and a V tile (32 KB at tile 64, D 128). README.md ("Decisions") points to the
offline sm_90a counts. Products: fp16 for fp8 e4m3 KV (``F16_DOT``: q scaled by a power of two, exact
e4m3 -> fp16), q's dtype for 16-bit KV.

Tiles of 128 tokens (a Config option no tuned row uses; measured slower than 64 for fp8): with PAGE = TILE / 2 each
tile's two pages come from two page-id vectors per chunk. 8 warps run the tile as one product (two warpgroups,
each an m64 half of S^T and then of O^T's D rows); ``HALVES`` 2 (op._halves: 4 warps) runs it as two products of
TILE / 2 tokens, one page base each, whose logits meet in one element-wise max before the one reduction over the
tokens (``_attend_t``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from .kernel import _arrive_and_merge, _finish, _load_q, _load_v_f16, _next_segment, _q_as_f16, _range_desc


@triton.jit
def _attend_t(qt, k, v, valid, k1, v1, valid1, m_i, l_i, acc_t, qk_scale, HALVES: tl.constexpr):
    """One online-softmax step, transposed: qt [D, G], k/v [T, D] (product dtype), valid [T]; m_i [G]
    running max (log2 domain) per query head, l_i [T, G] running sums per token row, acc_t [D, G] fp32.
    HALVES 2: k1 / v1 / valid1 are the tile's second T tokens (else unused): both halves' logits meet in one
    element-wise max before the one reduction over the tokens, so a tile of 2T tokens pays one cross-warp
    max; their P^T products accumulate into acc_t one after the other."""
    s = tl.dot(k, qt) * qk_scale  # [T, G], log2 units
    s = tl.where(valid[:, None], s, float("-inf"))
    if HALVES == 2:
        s1 = tl.dot(k1, qt) * qk_scale
        s1 = tl.where(valid1[:, None], s1, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(tl.maximum(s, s1), axis=0))
    else:
        s1 = s
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing valid yet: keep exp2 finite
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[None, :])
    acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(v), p.to(qt.dtype))
    if HALVES == 2:
        p1 = tl.exp2(s1 - m_use[None, :])
        acc_t = tl.dot(tl.trans(v1), p1.to(qt.dtype), acc_t)
        p = p + p1
    l_i = l_i * alpha[None, :] + p  # [T, G]: summed over the tokens once, at the segment's end
    return m_new, l_i, acc_t


@triton.jit
def _e4m3x2_to_f16(x, ASM: tl.constexpr):
    """Two fp16 (low byte's, high byte's) of int32 values holding an e4m3 pair in their low 16 bits."""
    if ASM:
        pair = tl.inline_asm_elementwise(
            asm="cvt.rn.f16x2.e4m3x2 $0, $1;",
            constraints="=r,h",
            args=[x.to(tl.int16)],
            dtype=tl.int32,
            is_pure=True,
            pack=1,
        )
        lo = (pair & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
        hi = ((pair >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    else:
        lo = (x & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        hi = ((x >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    return lo, hi


@triton.jit
def _perm_d(HEAD_DIM: tl.constexpr):
    """Source column d(k) of column k of the permuted K / q operands: in each block of 16 columns, the
    4 bytes at d = 4c..4c+3 go to k = 2c, 2c+1 (first pair) and 2c+8, 2c+9 (second pair), the columns one
    thread holds in the 16-bit MMA's A-operand layout; so a thread loads its K bytes as whole int32."""
    k = tl.arange(0, HEAD_DIM)
    r = k % 16
    return (k - r) + 4 * ((r % 8) // 2) + 2 * (r // 8) + r % 2


@triton.jit
def _load_k_perm(k_head, rows, offs_d4, valid, ASM: tl.constexpr):
    """fp8 e4m3 K rows of a tile as fp16 [T, D] (exact) with the columns permuted as ``_perm_d`` says,
    read as int32 (4 e4m3; K's strides and base are multiples of 4, checked by op.py)."""
    x = tl.load(
        k_head.to(tl.pointer_type(tl.int32), bitcast=True) + (rows // 4)[:, None] + offs_d4[None, :],
        mask=valid[:, None],
        other=0,
    )
    a0, a1 = _e4m3x2_to_f16(x & 0xFFFF, ASM)  # d = 4c, 4c + 1
    b0, b1 = _e4m3x2_to_f16((x >> 16) & 0xFFFF, ASM)  # d = 4c + 2, 4c + 3
    both = tl.join(tl.join(a0, b0), tl.join(a1, b1))  # [T, D / 4, 2 (half), 2 (pair)]
    t: tl.constexpr = x.shape[0]
    nb: tl.constexpr = x.shape[1] // 4
    both = tl.reshape(both, [t, nb, 4, 2, 2])  # [T, block, c, half, pair]
    return tl.reshape(
        tl.permute(both, (0, 1, 3, 2, 4)), [t, 4 * x.shape[1]]
    )  # k = 16 block + 8 half + 2 c + pair


@triton.jit
def _load_kv(
    k_head,
    v_head,
    rows_k,
    rows_v,
    valid,
    offs_d,
    offs_d2,
    offs_d4,
    dtype: tl.constexpr,
    F16_DOT: tl.constexpr,
    ASM: tl.constexpr,
):
    """K and V rows ``rows_k`` / ``rows_v`` (element offsets, rows past ``valid`` 0) as product operands:
    fp8 as fp16 (K permuted, ``_load_k_perm``; V by e4m3 pairs) with F16_DOT, else converted to ``dtype``."""
    if F16_DOT:
        k = _load_k_perm(k_head, rows_k, offs_d4, valid, ASM)
        v = _load_v_f16(v_head, rows_v, offs_d2, valid, ASM)
    else:
        k = tl.load(k_head + rows_k[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0).to(dtype)
        v = tl.load(v_head + rows_v[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0).to(dtype)
    return k, v


@triton.jit(do_not_specialize=["num_kv_heads"])  # one compile serves every head count
def decode_transposed_kernel(
    q_ptr,  # [B, Hq, D]
    k_ptr,  # [P, PAGE, Hkv, D] bf16/fp16/fp8e4m3
    v_ptr,  # [P, PAGE, Hkv, D]
    out_ptr,  # [B, Hq, D], dtype of q
    page_table_ptr,  # [B, >= max pages] int32
    seq_lens_ptr,  # [B] int32
    prog_desc_ptr,  # [G, 8] int32 (planner): range and first segment of each program
    ws_o_ptr,  # [2G, GROUP, D] fp32 partial outputs (normalised)
    ws_lse_ptr,  # [2G, GROUP] fp32 partial log2-sum-exp
    scale_ptr,  # [2] fp32 (k_scale, v_scale) when SCALES_FROM_PTR
    qk_scale,  # sm_scale * log2(e) (* k_scale unless SCALES_FROM_PTR)
    v_scale,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_oh,
    stride_ptb,
    num_kv_heads,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,  # >= 16 and a power of two (the products' N)
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,  # >= TILE (one page id per tile) or TILE / 2 (two)
    TILE: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    SCALES_FROM_PTR: tl.constexpr,
    PT_CHUNK: tl.constexpr,  # > 0: page ids of PT_CHUNK tiles per load
    F16_DOT: tl.constexpr = False,  # fp8 KV: K and V read as e4m3 pairs, converted to fp16 (q rescaled)
    ASM_CVT: tl.constexpr = False,  # F16_DOT: cvt.rn.f16x2.e4m3x2 by inline PTX (False under the interpreter)
    PDL: tl.constexpr = False,  # let the merge grid launch now (programmatic dependent launch, SM90)
    HALVES: tl.constexpr = 1,  # 2: each tile as two products of TILE / 2 tokens (see _attend_t)
    MERGE_IN_PASS: tl.constexpr = False,  # split segments the planner marked merge here (kernel._arrive_and_merge)
):
    if PDL:
        gdc_launch_dependents()  # every program is resident from the start (see kernel.decode_kernel)
    pid = tl.program_id(0)
    u_begin, u_end, b, h, t0, n_tiles, seq_len = _range_desc(prog_desc_ptr, pid)
    desc_first = pid
    if MERGE_IN_PASS:
        desc_first = tl.load(prog_desc_ptr + pid * 8 + 7)
    if SCALES_FROM_PTR:
        qk_scale = qk_scale * tl.load(scale_ptr)
        v_scale = tl.load(scale_ptr + 1)

    rows = tl.arange(0, GROUP_PAD)
    row_ok = rows < GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    offs_d2 = tl.arange(0, HEAD_DIM // 2)
    SUB: tl.constexpr = TILE // HALVES  # token rows of one product
    offs_n = tl.arange(0, SUB)
    offs_c = tl.arange(0, PT_CHUNK)
    offs_d4 = tl.arange(0, HEAD_DIM // 4)
    if F16_DOT:
        offs_dq = _perm_d(HEAD_DIM)  # q's columns in K's permuted order
    else:
        offs_dq = offs_d

    q_next = _load_q(q_ptr, b, h, rows, row_ok, offs_dq, stride_qb, stride_qh, u_begin < u_end, GROUP)
    u = u_begin
    while u < u_end:
        seg_start = u - t0
        t1 = tl.minimum(n_tiles, u_end - seg_start)
        b64 = b.to(tl.int64)
        h64 = h.to(tl.int64)
        q_rows = h64 * GROUP + rows
        q = q_next
        # the next segment of the range is (b, h + 1) or (b + 1, 0) from its first tile: its q rows and
        # length are loaded while this one runs
        b_n, h_n, more, seq_len_n = _next_segment(
            b, h, num_kv_heads, seg_start, t1, u_end, seq_lens_ptr, seq_len
        )
        q_next = _load_q(q_ptr, b_n, h_n, rows, row_ok, offs_dq, stride_qb, stride_qh, more, GROUP)
        seg_scale = qk_scale
        if F16_DOT:
            q, q_unscale = _q_as_f16(q)
            seg_scale = qk_scale * q_unscale
        qt = tl.trans(q)  # [D, G]
        m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([SUB, GROUP_PAD], dtype=tl.float32)
        acc_t = tl.zeros([HEAD_DIM, GROUP_PAD], dtype=tl.float32)
        offs_ks = offs_n * stride_ks  # token rows inside a page (int32: PAGE x stride fits)
        offs_vs = offs_n * stride_vs
        pt_row = page_table_ptr + b64 * stride_ptb
        k_head = k_ptr + h64 * stride_kh
        v_head = v_ptr + h64 * stride_vh
        for c0 in range(t0, t1, PT_CHUNK):
            c1 = tl.minimum(c0 + PT_CHUNK, t1)
            if PAGE >= TILE:
                pgs = tl.load(pt_row + ((c0 + offs_c) * TILE) // PAGE, mask=(c0 + offs_c) < c1, other=0)
                pgs1 = pgs
            else:  # TILE == 2 PAGE: the pages of each tile's first and second half, one vector each
                col = 2 * (c0 + offs_c)
                pgs = tl.load(pt_row + col, mask=(c0 + offs_c) < c1, other=0)
                pgs1 = tl.load(
                    pt_row + col + 1, mask=((c0 + offs_c) < c1) & ((col + 1) * PAGE < seq_len), other=0
                )
            for t in tl.range(c0, c1, num_stages=NUM_STAGES):
                # each product's SUB rows lie in one page: a scalar base + fixed in-page offsets
                pg = tl.sum(tl.where(offs_c == t - c0, pgs, 0), axis=0).to(tl.int64)
                if PAGE >= TILE:
                    pg1 = pg
                    s0 = (t * TILE) % PAGE  # s0 * stride < PAGE * stride: int32
                else:
                    pg1 = tl.sum(tl.where(offs_c == t - c0, pgs1, 0), axis=0).to(tl.int64)
                    s0 = t * 0
                if HALVES == 2:
                    valid = offs_n < seq_len - t * TILE
                    valid1 = offs_n < seq_len - t * TILE - SUB
                    s_hi = (s0 + SUB) % PAGE  # second half: the same page (PAGE >= TILE) or the next one
                    k, v = _load_kv(
                        k_head,
                        v_head,
                        pg * stride_kp + s0 * stride_ks + offs_ks,
                        pg * stride_vp + s0 * stride_vs + offs_vs,
                        valid,
                        offs_d,
                        offs_d2,
                        offs_d4,
                        q.dtype,
                        F16_DOT,
                        ASM_CVT,
                    )
                    k1, v1 = _load_kv(
                        k_head,
                        v_head,
                        pg1 * stride_kp + s_hi * stride_ks + offs_ks,
                        pg1 * stride_vp + s_hi * stride_vs + offs_vs,
                        valid1,
                        offs_d,
                        offs_d2,
                        offs_d4,
                        q.dtype,
                        F16_DOT,
                        ASM_CVT,
                    )
                else:
                    valid1 = offs_n < seq_len - t * TILE
                    valid = valid1
                    if PAGE >= TILE:
                        rows_k = (pg * stride_kp + s0 * stride_ks) + offs_ks
                        rows_v = (pg * stride_vp + s0 * stride_vs) + offs_vs
                    else:  # one product over both pages: each row's page base
                        lo = offs_n < PAGE
                        rows_k = tl.where(lo, pg * stride_kp, pg1 * stride_kp - PAGE * stride_ks) + offs_ks
                        rows_v = tl.where(lo, pg * stride_vp, pg1 * stride_vp - PAGE * stride_vs) + offs_vs
                    k, v = _load_kv(
                        k_head,
                        v_head,
                        rows_k,
                        rows_v,
                        valid,
                        offs_d,
                        offs_d2,
                        offs_d4,
                        q.dtype,
                        F16_DOT,
                        ASM_CVT,
                    )
                    k1 = k
                    v1 = v
                m_i, l_i, acc_t = _attend_t(
                    qt, k, v, valid, k1, v1, valid1, m_i, l_i, acc_t, seg_scale, HALVES
                )

        _finish(
            out_ptr,
            ws_o_ptr,
            ws_lse_ptr,
            b64,
            q_rows,
            rows,
            row_ok,
            offs_d,
            m_i,
            tl.sum(l_i, axis=0),
            tl.trans(acc_t),
            v_scale,
            (t0 == 0) & (t1 == n_tiles),
            2 * pid + (u != u_begin).to(tl.int32),
            stride_ob,
            stride_oh,
            GROUP,
            HEAD_DIM,
        )
        if MERGE_IN_PASS:
            _arrive_and_merge(
                prog_desc_ptr,
                ws_o_ptr,
                ws_lse_ptr,
                out_ptr,
                pid,
                (t0 == 0) & (t1 == n_tiles),
                u == u_begin,
                desc_first,
                seg_start,
                b64,
                q_rows,
                rows,
                row_ok,
                offs_d,
                stride_ob,
                stride_oh,
                GROUP,
                HEAD_DIM,
            )
        u = seg_start + t1
        # step to the range's next segment
        b = b_n
        h = h_n
        t0 = t0 * 0
        seq_len = seq_len_n
        n_tiles = tl.maximum((seq_len + TILE - 1) // TILE, 1)
