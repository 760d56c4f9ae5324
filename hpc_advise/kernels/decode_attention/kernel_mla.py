"""Triton attention pass of the MLA form of paged decode attention (DeepSeek-V2/V3's absorbed latent attention).

Every query head of a request attends to one shared latent KV row per token, ``kv = [c (LORA), k_rope (ROPE)]``:
the logit is ``q_c . c + q_rope . k_rope`` and the value is ``c`` itself, so one load of a tile's latent rows feeds
both products (the GQA pass reads K and V apart). The planner, the descriptors, the partial workspace and the
merge are the GQA form's (kernel.py), with the query heads cut into blocks of GROUP rows as if each block had
its own KV head: a segment is (request, head block), and every head block reads the same pool rows (no head
offset in the pool).

Shapes: q [B, H, LORA + ROPE] (latent part first); kv [num_pages, PAGE, 1, LORA + ROPE] (any strides but the
last); out [B, H, LORA] of q's dtype; H = head blocks * GROUP. bf16/fp16 only. Address math is int64.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from .kernel import (
    _chunk_pages,
    _chunk_tile_page,
    _finish,
    _load_q,
    _next_segment,
    _range_desc,
    _tile_pages,
    _tile_rows,
)


@triton.jit
def _attend_mla(qc, qr, c, kr, valid, m_i, l_i, acc, qk_scale):
    """One online-softmax step over a tile: qc [R, LORA], qr [R, ROPE], c [TILE, LORA], kr [TILE, ROPE],
    valid [TILE]; m_i / l_i [R] (log2 domain), acc [R, LORA] fp32. The latent tile is both K's first part and V."""
    s = tl.dot(qc, tl.trans(c))
    s = tl.dot(qr, tl.trans(kr), s) * qk_scale  # [R, TILE], log2 units
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # empty request: keep exp2 finite
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
    return m_new, l_i, acc


@triton.jit
def _attend_rows(kv_ptr, tok, valid, offs_c, offs_r, qc, qr, m_i, l_i, acc, qk_scale):
    """A tile's latent rows (element offsets ``tok`` [TILE], ``valid`` [TILE]) loaded and attended."""
    c = tl.load(kv_ptr + tok[:, None] + offs_c[None, :], mask=valid[:, None], other=0.0)
    kr = tl.load(kv_ptr + tok[:, None] + offs_r[None, :], mask=valid[:, None], other=0.0)
    return _attend_mla(qc, qr, c, kr, valid, m_i, l_i, acc, qk_scale)


@triton.jit(do_not_specialize=["num_head_blocks"])
def decode_mla_kernel(
    q_ptr,  # [B, H, LORA + ROPE]
    kv_ptr,  # [P, PAGE, 1, LORA + ROPE]
    out_ptr,  # [B, H, LORA], dtype of q
    page_table_ptr,  # [B, >= max pages] int32
    seq_lens_ptr,  # [B] int32
    prog_desc_ptr,  # [G, 8] int32 (planner)
    ws_o_ptr,  # [2G, GROUP, LORA] fp32 partial outputs (normalised)
    ws_lse_ptr,  # [2G, GROUP] fp32 partial log2-sum-exp
    qk_scale,  # sm_scale * log2(e)
    stride_qb,
    stride_qh,
    stride_kp,
    stride_ks,
    stride_ob,
    stride_oh,
    stride_ptb,
    num_head_blocks,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,  # >= 16 and a power of two (tl.dot needs 16 rows)
    LORA: tl.constexpr,
    ROPE: tl.constexpr,
    PAGE: tl.constexpr,
    TILE: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PT_CHUNK: tl.constexpr,  # PAGE >= TILE or == TILE/2: page ids of PT_CHUNK tiles loaded ahead
    PDL: tl.constexpr = False,  # let the merge grid launch now (programmatic dependent launch, SM90)
):
    if PDL:
        gdc_launch_dependents()  # as in kernel.decode_kernel: the merge's programs wait before reading partials
    pid = tl.program_id(0)
    u_begin, u_end, b, h, t0, n_tiles, seq_len = _range_desc(prog_desc_ptr, pid)

    rows = tl.arange(0, GROUP_PAD)
    row_ok = rows < GROUP
    offs_c = tl.arange(0, LORA)
    offs_r = LORA + tl.arange(0, ROPE)
    offs_n = tl.arange(0, TILE)

    live = u_begin < u_end
    qc_next = _load_q(q_ptr, b, h, rows, row_ok, offs_c, stride_qb, stride_qh, live, GROUP)
    qr_next = _load_q(q_ptr, b, h, rows, row_ok, offs_r, stride_qb, stride_qh, live, GROUP)
    u = u_begin
    while u < u_end:
        seg_start = u - t0
        t1 = tl.minimum(n_tiles, u_end - seg_start)
        b64 = b.to(tl.int64)
        q_rows = h.to(tl.int64) * GROUP + rows
        qc = qc_next
        qr = qr_next
        b_n, h_n, more, seq_len_n = _next_segment(
            b, h, num_head_blocks, seg_start, t1, u_end, seq_lens_ptr, seq_len
        )
        qc_next = _load_q(q_ptr, b_n, h_n, rows, row_ok, offs_c, stride_qb, stride_qh, more, GROUP)
        qr_next = _load_q(q_ptr, b_n, h_n, rows, row_ok, offs_r, stride_qb, stride_qh, more, GROUP)
        m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, LORA], dtype=tl.float32)
        pt_row = page_table_ptr + b64 * stride_ptb

        if PAGE >= TILE or TILE == 2 * PAGE:
            for c0 in range(t0, t1, PT_CHUNK):
                pgs, c1 = _chunk_pages(pt_row, c0, t1, seq_len, TILE, PAGE, PT_CHUNK)
                for t in tl.range(c0, c1, num_stages=NUM_STAGES):
                    valid = (t * TILE + offs_n) < seq_len
                    pg = _chunk_tile_page(pgs, t, c0, TILE, PAGE, PT_CHUNK)
                    tok = _tile_rows(pg, t, stride_kp, stride_ks, TILE, PAGE)
                    m_i, l_i, acc = _attend_rows(
                        kv_ptr, tok, valid, offs_c, offs_r, qc, qr, m_i, l_i, acc, qk_scale
                    )
        else:
            for t in tl.range(t0, t1, num_stages=NUM_STAGES):
                valid = (t * TILE + offs_n) < seq_len
                pg = _tile_pages(pt_row, t, t1, seq_len, TILE, PAGE)
                tok = _tile_rows(pg, t, stride_kp, stride_ks, TILE, PAGE)
                m_i, l_i, acc = _attend_rows(
                    kv_ptr, tok, valid, offs_c, offs_r, qc, qr, m_i, l_i, acc, qk_scale
                )

        _finish(
            out_ptr,
            ws_o_ptr,
            ws_lse_ptr,
            b64,
            q_rows,
            rows,
            row_ok,
            offs_c,
            m_i,
            l_i,
            acc,
            1.0,
            (t0 == 0) & (t1 == n_tiles),
            2 * pid + (u != u_begin).to(tl.int32),
            stride_ob,
            stride_oh,
            GROUP,
            LORA,
        )
        u = seg_start + t1
        b = b_n
        h = h_n
        t0 = t0 * 0
        seq_len = seq_len_n
        n_tiles = tl.maximum((seq_len + TILE - 1) // TILE, 1)
