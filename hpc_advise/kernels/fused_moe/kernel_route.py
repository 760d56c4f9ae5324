"""Multi-CTA routing of the FP8 fused MoE for prefill (jit functions only; launched by ``op.py``).

The single-program router of ``kernel._prep_kernel`` walks all n = T·k (token, slot) entries twice on
one CTA; at T = 16384, k = 8 that is 131072 entries of serial histogram and atomic passes in front of
every GEMM. Here the same outputs (padded per-expert runs of entry ids, the expert of each BLOCK_M
block, the used row count) come from two launches over C = cdiv(n, CHUNK) chunks:

  1. ``_prep_chunks_kernel``  programs [0, C): histogram of one chunk → ``hist[c, :]`` (plain stores,
                              no atomics, nothing to zero first) and a share of the padding fill of
                              ``sorted_ids``; programs C..: quantize [QROWS, G] tiles of the hidden
                              rows (``kernel._quant_rows``), as the single-CTA prep does.
  2. ``_route_scatter_kernel`` program c: per-expert totals and the counts of chunks before c from the
                              [C, E_PAD] table, padded prefix sum → the start of every expert's run;
                              chunk c's entries go to start + (entries of the expert in earlier chunks)
                              + an atomic cursor private to (c, expert); a share of ``block_expert``.

Every buffer has a size fixed by (T, k, E, BLOCK_M), so the two launches are graph-capturable. Inside a
chunk the order of one expert's entries follows the atomics' arrival, as in the single-CTA router;
every GEMM output row depends only on its own A row, so the layer's output stays bitwise reproducible.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel import _quant_rows


@triton.jit(do_not_specialize=["n_entries", "expert_offset", "num_experts", "max_padded", "num_chunks", "T"])
def _prep_chunks_kernel(
    topk_ids_ptr,  # int32 [n]
    n_entries,
    expert_offset,
    num_experts,
    hist_ptr,  # int32 [C, E_PAD]
    sorted_ids_ptr,  # int32 [P]
    max_padded,
    num_chunks,
    x_ptr,
    xq_ptr,
    xs_ptr,
    a_scale_ptr,
    T,
    H,
    stride_x,
    CHUNK: tl.constexpr,
    E_PAD: tl.constexpr,
    ROUTE_BLK: tl.constexpr,
    QROWS: tl.constexpr,
    GROUP: tl.constexpr,
    A_GROUP: tl.constexpr,
):
    """Grid (C + cdiv(T, QROWS) · cdiv(H, GROUP),)."""
    pid = tl.program_id(0)
    if pid < num_chunks:
        offs0 = tl.arange(0, ROUTE_BLK)
        counts = tl.zeros([E_PAD], dtype=tl.int32)
        end = tl.minimum(pid * CHUNK + CHUNK, n_entries)
        for start in range(pid * CHUNK, end, ROUTE_BLK):
            offs = start + offs0
            inb = offs < end
            e = tl.load(topk_ids_ptr + offs, mask=inb, other=-1) - expert_offset
            valid = inb & (e >= 0) & (e < num_experts)
            counts += tl.histogram(tl.where(valid, e, 0), E_PAD, mask=valid)
        tl.store(hist_ptr + pid.to(tl.int64) * E_PAD + tl.arange(0, E_PAD), counts)
        # padding rows read entry id n_entries (masked everywhere downstream)
        share = tl.cdiv(tl.cdiv(max_padded, num_chunks), ROUTE_BLK) * ROUTE_BLK
        fill = tl.zeros([ROUTE_BLK], dtype=tl.int32) + n_entries
        for p0 in range(pid * share, tl.minimum(pid * share + share, max_padded), ROUTE_BLK):
            p = p0 + offs0
            tl.store(sorted_ids_ptr + p, fill, mask=p < max_padded)
    else:
        _quant_rows(
            x_ptr, xq_ptr, xs_ptr, a_scale_ptr, pid - num_chunks, T, H, stride_x, QROWS, GROUP, A_GROUP
        )


@triton.jit(do_not_specialize=["n_entries", "expert_offset", "num_experts", "max_padded", "num_chunks"])
def _route_scatter_kernel(
    topk_ids_ptr,  # int32 [n]
    n_entries,
    expert_offset,
    num_experts,
    hist_ptr,  # int32 [C, E_PAD] from _prep_chunks_kernel
    cursor_ptr,  # int32 [C, E_PAD] scratch
    sorted_ids_ptr,  # int32 [P]
    block_expert_ptr,  # int32 [P / BLOCK_M]
    num_padded_ptr,  # int32 [1]
    max_padded,
    num_chunks,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
    E_PAD: tl.constexpr,
    ROUTE_BLK: tl.constexpr,
    HIST_ROWS: tl.constexpr,
):
    """Grid (C,)."""
    c = tl.program_id(0)
    bins = tl.arange(0, E_PAD)
    total = tl.zeros([E_PAD], dtype=tl.int32)
    before = tl.zeros([E_PAD], dtype=tl.int32)
    rows0 = tl.arange(0, HIST_ROWS)
    for r0 in range(0, num_chunks, HIST_ROWS):
        r = r0 + rows0
        h = tl.load(
            hist_ptr + r.to(tl.int64)[:, None] * E_PAD + bins[None, :],
            mask=(r < num_chunks)[:, None],
            other=0,
        )
        total += tl.sum(h, axis=0)
        before += tl.sum(tl.where((r < c)[:, None], h, 0), axis=0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    used = tl.sum(padded, 0)
    if c == 0:
        tl.store(num_padded_ptr, used)
    # this program's share of block_expert: number of runs ending at or before the block start
    max_blocks = max_padded // BLOCK_M
    share = tl.cdiv(tl.cdiv(max_blocks, num_chunks), 32) * 32
    offs_b0 = tl.arange(0, 32)
    for b0 in range(c * share, tl.minimum(c * share + share, max_blocks), 32):
        b = b0 + offs_b0
        bstart = b * BLOCK_M
        eb = tl.sum((ends[None, :] <= bstart[:, None]).to(tl.int32), axis=1)
        eb = tl.where(bstart < used, eb, -1)
        tl.store(block_expert_ptr + b, eb, mask=b < max_blocks)
    # cursors private to this chunk, set through L2 (atomic exchange) before the atomics below
    cursors = cursor_ptr + c.to(tl.int64) * E_PAD
    tl.atomic_xchg(cursors + bins, starts + before)
    tl.debug_barrier()
    offs0 = tl.arange(0, ROUTE_BLK)
    end = tl.minimum(c * CHUNK + CHUNK, n_entries)
    for start in range(c * CHUNK, end, ROUTE_BLK):
        offs = start + offs0
        inb = offs < end
        e = tl.load(topk_ids_ptr + offs, mask=inb, other=-1) - expert_offset
        valid = inb & (e >= 0) & (e < num_experts)
        pos = tl.atomic_add(cursors + tl.where(valid, e, 0), 1, mask=valid)
        tl.store(sorted_ids_ptr + pos, offs, mask=valid)


__all__ = ["_prep_chunks_kernel", "_route_scatter_kernel"]
