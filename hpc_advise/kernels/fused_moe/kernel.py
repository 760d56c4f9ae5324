"""Triton kernels of the FP8 fused MoE (jit functions only; launched by ``op.py``).

Notation: T tokens, k = top_k, n = T·k (token, slot) entries, E local experts, H hidden size,
I intermediate size (a TP shard), P padded row count (a multiple of BLOCK_M), G = 128 quantization
group. All address math is done in int64 where a product can pass 2^31.

Launches, in order:
  1. ``_prep_kernel``     program 0 routes (per-expert counts, padded offsets, sorted entry ids,
                          expert of each BLOCK_M block), or with RANKED (config ROUTE) cdiv(n, 64)
                          programs of ``_route_ranked`` do, without atomics; the other programs quantize
                          [QROWS, G] tiles of the hidden rows to fp8 (per 1×G group, dynamic, or per
                          tensor, static scale).
  2. ``_gate_up_kernel``  gate and up tiles of one expert in one program, A rows read through the
                          sorted entry ids (no gathered copy); epilogue SiLU(gate)·up + fp8 quant of
                          the intermediate (OUT_MODE 0), or fp32 partial sums for split-K (OUT_MODE 1).
  3. ``_act_quant_kernel`` only for split-K: sums the partials, SiLU·up, fp8 quant.
  4. ``_down_kernel``     down GEMM over the padded intermediate; epilogue multiplies by the routing
                          weight (and routed scaling factor) and writes one bf16 row per (token, slot).
  5. ``_reduce_kernel``   sums the k rows of each token (skipping slots of other EP ranks) → bf16.
TILES (config DN_TILES): a down program computes that many adjacent H tiles of its block (``_down_tile``
each) in one flattened, software-pipelined loop over (tile, K step).
USE_PDL (config PDL = 1, SM90+): each launch is a programmatic dependent launch whose programs wait
(griddepcontrol.wait) for the prior grid before reading or writing anything, so only the launch
latency and the prior grid's tail overlap.
"""

from __future__ import annotations

import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)  # largest finite float8_e4m3fn
SCALE_EPS = tl.constexpr(1e-10)  # group scale floor, so an all-zero group quantizes to zeros, not NaN


@triton.jit
def _prefetch_l2(ptrs, mask):
    """prefetch.global.L2 of the line holding each address where ``mask`` (a hint: no data, no fault on
    masked lanes). Only under USE_PDL guards: the interpreter runs no inline PTX."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r",
        [ptrs, mask.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _local_experts(topk_ids_ptr, offs, n_entries, expert_offset, num_experts):
    """(e, local) of the entry ids ``offs``: e = the chosen expert minus ``expert_offset``; local = the
    entry exists (< n_entries) and its expert is on this rank (0 <= e < num_experts)."""
    inb = offs < n_entries
    e = tl.load(topk_ids_ptr + offs, mask=inb, other=-1) - expert_offset
    return e, inb & (e >= 0) & (e < num_experts)


@triton.jit
def _store_block_experts(block_expert_ptr, b, ends, total, max_blocks, BLOCK_M: tl.constexpr):
    """The local expert of each block b < max_blocks: the number of experts whose padded run ends
    (``ends``: one past each run's last row) at or before the block's first row; -1 past the used rows
    (``total``)."""
    bstart = b * BLOCK_M
    eb = tl.sum((ends[None, :] <= bstart[:, None]).to(tl.int32), axis=1)
    eb = tl.where(bstart < total, eb, -1)
    tl.store(block_expert_ptr + b, eb, mask=b < max_blocks)


@triton.jit
def _route(
    topk_ids_ptr,  # int32 [n]
    n_entries,
    expert_offset,
    num_experts,
    sorted_ids_ptr,  # int32 [P]: entry id t*k+j, or n_entries for padding
    block_expert_ptr,  # int32 [P / BLOCK_M]: local expert of the block, -1 past the end
    num_padded_ptr,  # int32 [1]: used rows (sum of per-expert counts rounded up to BLOCK_M)
    cursor_ptr,  # int32 [E_PAD] scratch
    max_padded,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,
    ROUTE_BLK: tl.constexpr,
):
    offs0 = tl.arange(0, ROUTE_BLK)
    bins = tl.arange(0, E_PAD)
    counts = tl.zeros([E_PAD], dtype=tl.int32)
    for start in range(0, n_entries, ROUTE_BLK):
        offs = start + offs0
        e, valid = _local_experts(topk_ids_ptr, offs, n_entries, expert_offset, num_experts)
        counts += tl.histogram(tl.where(valid, e, 0), E_PAD, mask=valid)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    total = tl.sum(padded, 0)
    tl.store(num_padded_ptr, total)
    # cursors live in L2 (atomic exchange), so the atomics below see them without relying on L1
    tl.atomic_xchg(cursor_ptr + bins, starts)
    # expert of each block = number of experts whose padded range ends at or before the block start
    max_blocks = max_padded // BLOCK_M
    offs_b0 = tl.arange(0, 32)
    for b0 in range(0, max_blocks, 32):
        _store_block_experts(block_expert_ptr, b0 + offs_b0, ends, total, max_blocks, BLOCK_M)
    for p0 in range(0, max_padded, ROUTE_BLK):
        p = p0 + offs0
        tl.store(sorted_ids_ptr + p, tl.zeros([ROUTE_BLK], dtype=tl.int32) + n_entries, mask=p < max_padded)
    tl.debug_barrier()
    for start in range(0, n_entries, ROUTE_BLK):
        offs = start + offs0
        e, valid = _local_experts(topk_ids_ptr, offs, n_entries, expert_offset, num_experts)
        pos = tl.atomic_add(cursor_ptr + tl.where(valid, e, 0), 1, mask=valid)
        tl.store(sorted_ids_ptr + pos, offs, mask=valid)


@triton.jit
def _route_ranked(
    topk_ids_ptr,  # int32 [n]
    n_entries,
    expert_offset,
    num_experts,
    sorted_ids_ptr,  # int32 [P]
    block_expert_ptr,  # int32 [P / BLOCK_M]
    num_padded_ptr,  # int32 [1]
    max_padded,
    r,  # this router program, of num_route
    num_route,
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,
    ROUTE_BLK: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Router program r of num_route (config ROUTE = 1, decode): no atomics, no cursor, no barrier.
    Every program counts all n entries (and those before its chunk), so each knows every expert's padded
    run; it then writes (1) the rows of the entries of its chunk [r·CHUNK, (r+1)·CHUNK): start of the
    expert's run + entries of that expert before the chunk + those before the entry inside the chunk (a
    [CHUNK, CHUNK] comparison), i.e. a stable order by entry id, the order of moe_align_reference;
    (2) the padding rows (sentinel n) of the experts e ≡ r mod num_route; (3) the expert of the blocks
    b ≡ r (32-block groups); program 0 stores the used row count. Each output element has exactly one
    writer, so nothing orders the programs."""
    c0 = r * CHUNK
    offs0 = tl.arange(0, ROUTE_BLK)
    bins = tl.arange(0, E_PAD)
    counts = tl.zeros([E_PAD], dtype=tl.int32)
    before = tl.zeros([E_PAD], dtype=tl.int32)
    for start in range(0, n_entries, ROUTE_BLK):
        offs = start + offs0
        e, valid = _local_experts(topk_ids_ptr, offs, n_entries, expert_offset, num_experts)
        e = tl.where(valid, e, 0)
        counts += tl.histogram(e, E_PAD, mask=valid)
        before += tl.histogram(e, E_PAD, mask=valid & (offs < c0))
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    total = tl.sum(padded, 0)
    if r == 0:
        tl.store(num_padded_ptr, total)
    # (1) this chunk's entries
    offs_c = c0 + tl.arange(0, CHUNK)
    e_c, ok_c = _local_experts(topk_ids_ptr, offs_c, n_entries, expert_offset, num_experts)
    base = tl.sum(tl.where(bins[None, :] == e_c[:, None], (starts + before)[None, :], 0), axis=1)
    j_c = tl.arange(0, CHUNK)
    same = (e_c[:, None] == e_c[None, :]) & (j_c[None, :] < j_c[:, None]) & ok_c[None, :]
    pos = base + tl.sum(same.to(tl.int32), axis=1)
    tl.store(sorted_ids_ptr + pos, offs_c, mask=ok_c)
    # (2) padding rows of this program's experts
    pad_j = tl.arange(0, BLOCK_M)
    pad_row = (starts + counts)[:, None] + pad_j[None, :]
    mine = (bins % num_route) == r
    pad_ok = mine[:, None] & (pad_row < ends[:, None])
    tl.store(sorted_ids_ptr + pad_row, tl.zeros([E_PAD, BLOCK_M], dtype=tl.int32) + n_entries, mask=pad_ok)
    # (3) expert of each block (the count of experts whose run ends at or before the block start)
    max_blocks = max_padded // BLOCK_M
    offs_b0 = tl.arange(0, 32)
    for b0 in range(r * 32, max_blocks, num_route * 32):
        _store_block_experts(block_expert_ptr, b0 + offs_b0, ends, total, max_blocks, BLOCK_M)


@triton.jit
def _quant_rows(
    x_ptr,  # bf16 [T, H], row stride stride_x
    xq_ptr,  # fp8 [T, H]
    xs_ptr,  # fp32 [T, cdiv(H, G)] (group mode)
    a_scale_ptr,  # fp32 [1] (static mode)
    q,
    T,
    H,
    stride_x,
    QROWS: tl.constexpr,
    GROUP: tl.constexpr,
    A_GROUP: tl.constexpr,
):
    # one [QROWS, GROUP] tile per program: no serial walk over H (each step of such a walk is a full
    # memory round trip, ~2 µs, which at decode cost more than streaming the experts' weights)
    num_groups = tl.cdiv(H, GROUP)
    g = q % num_groups
    rows = (q // num_groups) * QROWS + tl.arange(0, QROWS)
    row_ok = rows < T
    rows64 = rows.to(tl.int64)
    cols = g * GROUP + tl.arange(0, GROUP)
    m = row_ok[:, None] & (cols < H)[None, :]
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=m, other=0.0).to(tl.float32)
    if A_GROUP:
        amax = tl.max(tl.abs(x), axis=1)
        s = tl.maximum(amax, SCALE_EPS) / FP8_MAX
        xq = tl.math.div_rn(x, s[:, None])
        tl.store(xs_ptr + rows64 * num_groups + g, s, mask=row_ok)
    else:
        xq = tl.math.div_rn(x, tl.load(a_scale_ptr))
    xq = tl.minimum(tl.maximum(xq, -FP8_MAX), FP8_MAX)
    tl.store(xq_ptr + rows64[:, None] * H + cols[None, :], xq.to(xq_ptr.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n_entries", "expert_offset", "num_experts", "max_padded", "T", "num_route"])
def _prep_kernel(
    topk_ids_ptr,
    n_entries,
    expert_offset,
    num_experts,
    sorted_ids_ptr,
    block_expert_ptr,
    num_padded_ptr,
    cursor_ptr,
    max_padded,
    x_ptr,
    xq_ptr,
    xs_ptr,
    a_scale_ptr,
    T,
    H,
    stride_x,
    num_route,  # router programs: 1, or cdiv(n, CHUNK) with RANKED
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,
    ROUTE_BLK: tl.constexpr,
    QROWS: tl.constexpr,
    GROUP: tl.constexpr,
    A_GROUP: tl.constexpr,
    USE_PDL: tl.constexpr = False,
    RANKED: tl.constexpr = False,
    CHUNK: tl.constexpr = 64,
):
    """Grid (num_route + cdiv(T, QROWS) · cdiv(H, GROUP),): programs [0, num_route) route (one program
    with atomic cursors, ``_route``, or with RANKED (config ROUTE = 1) cdiv(n, CHUNK) programs of
    ``_route_ranked``); each other program quantizes one [QROWS, GROUP] tile of the hidden rows."""
    if USE_PDL:  # programmatic dependent launch: wait for the prior grid before touching its outputs
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    if pid < num_route:
        if RANKED:
            _route_ranked(
                topk_ids_ptr,
                n_entries,
                expert_offset,
                num_experts,
                sorted_ids_ptr,
                block_expert_ptr,
                num_padded_ptr,
                max_padded,
                pid,
                num_route,
                BLOCK_M,
                E_PAD,
                ROUTE_BLK,
                CHUNK,
            )
        else:
            _route(
                topk_ids_ptr,
                n_entries,
                expert_offset,
                num_experts,
                sorted_ids_ptr,
                block_expert_ptr,
                num_padded_ptr,
                cursor_ptr,
                max_padded,
                BLOCK_M,
                E_PAD,
                ROUTE_BLK,
            )
    else:
        q = pid - num_route
        _quant_rows(x_ptr, xq_ptr, xs_ptr, a_scale_ptr, q, T, H, stride_x, QROWS, GROUP, A_GROUP)


@triton.jit
def _tile_ids(num_m_blocks, num_n_blocks, GROUP_M: tl.constexpr):
    """Grouped ordering of a 1-D grid: GROUP_M row blocks share each column sweep (L2 reuse of B)."""
    return _tile_ids_of(tl.program_id(0), num_m_blocks, num_n_blocks, GROUP_M)


@triton.jit
def _tile_ids_of(pid, num_m_blocks, num_n_blocks, GROUP_M: tl.constexpr):
    """(row block, column tile) of linear tile ``pid`` in the grouped order of ``_tile_ids``."""
    width = GROUP_M * num_n_blocks
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    return pid_m, pid_n


@triton.jit
def _block_rows(block_expert_ptr, sorted_ids_ptr, num_padded_ptr, pid_m, offs_m, BLOCK_M, BLOCK_EXIT):
    """(local expert of block pid_m, or -1 past the used rows; its BLOCK_M sorted entry ids). Default:
    the used-row count first, the rest only inside the used rows (two dependent memory round trips
    before the first weight load). BLOCK_EXIT (config key): every router writes -1 as the expert of the
    blocks past the used rows, and ``sorted_ids`` is in bounds for every block, so both loads are issued
    at once and the program exits on e < 0 (one round trip). Entries of exited blocks are never used."""
    if BLOCK_EXIT:
        e = tl.load(block_expert_ptr + pid_m)
        entry = tl.load(sorted_ids_ptr + offs_m)
    else:
        e = tl.full([], -1, tl.int32)
        entry = tl.zeros([BLOCK_M], dtype=tl.int32)
        if pid_m * BLOCK_M < tl.load(num_padded_ptr):
            e = tl.load(block_expert_ptr + pid_m)
            entry = tl.load(sorted_ids_ptr + offs_m)
    return e, entry


@triton.jit
def _silu_mul_quant_store(
    g,  # fp32 [BLOCK_M, BLOCK_N] gate
    u,  # fp32 [BLOCK_M, BLOCK_N] up
    offs_m,  # [BLOCK_M] padded rows
    offs_n,  # [BLOCK_N] columns of I
    inter_ptr,  # fp8 [P, I]
    inter_s_ptr,  # fp32 [P, cdiv(I, G)]
    a2_scale_ptr,
    I,
    col_group,  # index of the G-column group this tile covers (A2_GROUP)
    BLOCK_N: tl.constexpr,
    A2_GROUP: tl.constexpr,
):
    h = g * tl.sigmoid(g) * u
    n_ok = offs_n < I
    h = tl.where(n_ok[None, :], h, 0.0)
    rows64 = offs_m.to(tl.int64)
    if A2_GROUP:
        # BLOCK_N == G and the tile starts on a group boundary: one group per row
        amax = tl.max(tl.abs(h), axis=1)
        s = tl.maximum(amax, SCALE_EPS) / FP8_MAX
        hq = tl.math.div_rn(h, s[:, None])
        num_groups = tl.cdiv(I, BLOCK_N)
        tl.store(inter_s_ptr + rows64 * num_groups + col_group, s)
    else:
        hq = tl.math.div_rn(h, tl.load(a2_scale_ptr))
    hq = tl.minimum(tl.maximum(hq, -FP8_MAX), FP8_MAX)
    tl.store(
        inter_ptr + rows64[:, None] * I + offs_n[None, :],
        hq.to(inter_ptr.dtype.element_ty),
        mask=n_ok[None, :],
    )


@triton.jit
def _w_tile(w_desc, e, half, n0, k0, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_K, ROWS·BLOCK_N] weight tile through TMA (config W_TMA): ``w_desc`` is a 4-D descriptor
    over the weights viewed as [E, halves, N, K] (w13: halves gate and up, N = I; w2: one half, N = H)
    with block [1, ROWS, BLOCK_N, BLOCK_K]; rows past N and columns past K are zero-filled by the copy
    engine (no masks, no address registers)."""
    b = w_desc.load([e, half, n0, k0])
    return tl.reshape(b, [ROWS * BLOCK_N, BLOCK_K]).T


@triton.jit
def _prod(a, b, SWAP_AB: tl.constexpr):
    """a [M, K] · b [K, N] → fp32 [M, N] (one K step's fresh product). SWAP_AB (config GU_SWAP_AB /
    DN_SWAP_AB): computed as (bᵀ · aᵀ)ᵀ, so the weight tile's N (≥ 64 rows) is the MMA's M side and the
    BLOCK_M token rows its N side: at 16 rows Triton 3.6 then issues Hopper fp8 wgmma (QGMMA) with both
    operands from shared memory, where a 16-row M side gets mma.sync: every step's fp8 tile goes shared
    memory → ldmatrix → registers, is converted to f16 there (F2FP) and fed to HMMA (sm_90a SASS; the kernel README's decisions table has the evidence). The transposes are layout changes; the products are the same."""
    if SWAP_AB:
        return tl.trans(tl.dot(tl.trans(b), tl.trans(a)))
    else:
        return tl.dot(a, b)


@triton.jit
def _prod_acc(a, b, acc, BLOCK_K: tl.constexpr, SWAP_AB: tl.constexpr):
    """acc + a · b, one K step of a per-tensor-scaled GEMM (scales applied after the K loop). Default:
    the fp8 tensor-core partial sums promoted to fp32 every BLOCK_K (sm_90 otherwise keeps the whole K
    in its reduced-precision fp8 accumulator); SWAP_AB: the step's fresh product of ``_prod`` added in
    fp32, which is what the promotion does (the accumulator handed to a swapped dot, transposed each
    step, broke Triton 3.6's sm_90 pipeliner: "operand does not dominate this use")."""
    if SWAP_AB:
        return acc + _prod(a, b, True)
    else:
        return tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)


@triton.jit
def _w_step_tile(w_ptrs, w_ok, k0, offs_k, K, w_desc, e32, half, n0, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, W_TMA: tl.constexpr, EVEN_K: tl.constexpr):  # fmt: skip
    """The fp8 weight tile [BLOCK_K, ROWS·BLOCK_N] of the K step at k0 (K: H for w13, I for w2): by TMA
    (W_TMA, ``_w_tile``: ``half`` of expert e32 from row n0, zero-filled past the edges), else through
    ``w_ptrs`` ([BLOCK_K, ROWS·BLOCK_N] at K offset 0), rows outside ``w_ok`` and (unless EVEN_K: BLOCK_K
    divides K) columns past K read as 0."""
    if W_TMA:
        b = _w_tile(w_desc, e32, half, n0, k0, ROWS, BLOCK_N, BLOCK_K)
    elif EVEN_K:
        b = tl.load(w_ptrs + k0, mask=w_ok[None, :], other=0.0)
    else:
        b = tl.load(w_ptrs + k0, mask=w_ok[None, :] & ((k0 + offs_k) < K)[:, None], other=0.0)
    return b


@triton.jit
def _scaled_step(a, b, k0, K, sa, sa_ptrs, sa_ok, sw, sw_ptrs, sw_ok, BLOCK_K: tl.constexpr,
                 A_GROUP: tl.constexpr, W_VEC: tl.constexpr, SWAP_AB: tl.constexpr):  # fmt: skip
    """One K step of a group/block-scaled GEMM (BLOCK_K <= 128, K the reduction length): the fresh fp32
    product d = a [BLOCK_M, BLOCK_K] · b [BLOCK_K, N] (``_prod``) times the rows' activation group
    scales sa [BLOCK_M] (A_GROUP) and the columns' weight block scales sw [N] (W_VEC: one per column),
    each scale loaded here for the next step (one step ahead, loop-carried: the latency hides behind a
    step) from ``sa_ptrs`` (rows outside ``sa_ok`` read as 0; None: all rows in bounds, unmasked) and
    ``sw_ptrs`` (masked by ``sw_ok``). Returns (d, kn, sa, sw): the caller applies scalar weight scales
    (W_SCALAR; kn = the next step's 128-group) and adds d to its fp32 accumulator (the promotion every
    BLOCK_K). Scales a form does not use pass through unchanged."""
    kn = tl.minimum(k0 + BLOCK_K, K - 1) // 128
    d = _prod(a, b, SWAP_AB)
    if A_GROUP:
        if sa_ok is None:
            sa_next = tl.load(sa_ptrs + kn)
        else:
            sa_next = tl.load(sa_ptrs + kn, mask=sa_ok, other=0.0)
        d = d * sa[:, None]
        sa = sa_next
    if W_VEC:
        sw_next = tl.load(sw_ptrs + kn, mask=sw_ok, other=0.0)
        d = d * sw[None, :]
        sw = sw_next
    return d, kn, sa, sw


@triton.jit
def _gate_up_two_dots(
    a_ptrs,
    w_ptrs,
    row_ok,
    n_ok,
    offs_k,
    k_lo,
    k_hi,
    H,
    up_offset,
    BLOCK_M,
    BLOCK_N,
    BLOCK_K,
    EVEN_K,
    w_desc,
    e32,
    n0,
    W_TMA: tl.constexpr,
    sa_ptrs,  # A_GROUP: [BLOCK_M] row pointers of the activation group scales
    swg_ptr,  # W_BLOCK: the block scales of the tile's gate rows (one 128-row group) ...
    swu_ptr,  # ... and of its up rows, one per K group
    A_GROUP: tl.constexpr,
    W_BLOCK: tl.constexpr,
    SWAP_AB: tl.constexpr,
):
    """Separate gate and up dots (config GU_TWO_DOTS; always for per-tensor weights with a static a13
    scale): the fp32 accumulators of a BLOCK_M = 128 tile fit beside one dot's fresh
    partial product, where the merged N = 2·BLOCK_N dot's partial does not.
    Per-tensor: the fp8 partial sums are promoted to fp32 once per dot, i.e. every BLOCK_K (128, or 256
    with GU_K = 256). Group/block scales (BLOCK_K <= 128): each step's product is scaled by the row's
    activation group scale and the gate / up rows' weight block scale (a scalar each: the tile's
    columns lie in one 128-row group), scales loaded one step ahead. W_TMA: weight tiles by TMA
    (``_w_tile``, halves 0 / 1 of expert e32). SWAP_AB: each dot with the weights as the MMA's M side
    (``_prod``)."""
    g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if A_GROUP:
        sa = tl.load(sa_ptrs + k_lo // 128, mask=row_ok, other=0.0)
    if W_BLOCK:
        swg = tl.load(swg_ptr + k_lo // 128)
        swu = tl.load(swu_ptr + k_lo // 128)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_ok = ((k0 + offs_k) < H) | EVEN_K  # all true when BLOCK_K divides H (folded away)
        a = tl.load(a_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        bg = _w_step_tile(w_ptrs, n_ok, k0, offs_k, H, w_desc, e32, 0, n0, 1, BLOCK_N, BLOCK_K, W_TMA, EVEN_K)
        bu = _w_step_tile(
            w_ptrs + up_offset, n_ok, k0, offs_k, H, w_desc, e32, 1, n0, 1, BLOCK_N, BLOCK_K, W_TMA, EVEN_K
        )
        if A_GROUP or W_BLOCK:
            kn = tl.minimum(k0 + BLOCK_K, H - 1) // 128
            dg = _prod(a, bg, SWAP_AB)
            if A_GROUP:
                sa_next = tl.load(sa_ptrs + kn, mask=row_ok, other=0.0)
                dg = dg * sa[:, None]
            if W_BLOCK:
                swg_next = tl.load(swg_ptr + kn)
                dg = dg * swg
                swg = swg_next
            g += dg
            du = _prod(a, bu, SWAP_AB)
            if A_GROUP:
                du = du * sa[:, None]
                sa = sa_next
            if W_BLOCK:
                swu_next = tl.load(swu_ptr + kn)
                du = du * swu
                swu = swu_next
            u += du
        else:
            g = _prod_acc(a, bg, g, BLOCK_K, SWAP_AB)
            u = _prod_acc(a, bu, u, BLOCK_K, SWAP_AB)
    return g, u


@triton.jit
def _gate_up_tile(
    pid_n, pid_k, offs_m, e, row_ok, tok, xq_ptr, xs_ptr, a_scale_ptr, w_ptr, ws_ptr,
    out_ptr, outs_ptr, a2_scale_ptr, H, I, max_padded, stride_wn, stride_we, stride_wse,
    stride_wsn, w_desc,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, A_GROUP: tl.constexpr,
    W_BLOCK: tl.constexpr, A2_GROUP: tl.constexpr, OUT_MODE: tl.constexpr, EVEN_K: tl.constexpr,
    TWO_DOTS: tl.constexpr, W_TMA: tl.constexpr, W_SCALAR: tl.constexpr,
    SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr,
):  # fmt: skip
    """N tile pid_n (of split pid_k) of the gate/up program's block: the K loop over [k_lo, k_hi) (merged
    gate|up dot, or ``_gate_up_two_dots``), the per-tensor scales, then the epilogue (OUT_MODE 0: SiLU·up and
    fp8 quantization of h; 1: fp32 split-K partials). The rest of ``_gate_up_kernel``'s docstring."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < I
    offs_k = tl.arange(0, BLOCK_K)
    num_kg = tl.cdiv(H, 128)
    a_ptrs = xq_ptr + tok[:, None] * H + offs_k[None, :]
    k_span = tl.cdiv(tl.cdiv(H, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = pid_k * k_span
    k_hi = tl.minimum(k_lo + k_span, H)

    if TWO_DOTS:
        wg_ptrs = w_ptr + e * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        sw_base = ws_ptr + e * stride_wse  # W_BLOCK: BLOCK_N = 128 and I % 128 == 0 (op checks)
        g, u = _gate_up_two_dots(
            a_ptrs,
            wg_ptrs,
            row_ok,
            n_ok,
            offs_k,
            k_lo,
            k_hi,
            H,
            I * stride_wn,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            EVEN_K,
            w_desc,
            e.to(tl.int32),
            pid_n * BLOCK_N,
            W_TMA,
            xs_ptr + tok * num_kg,
            sw_base + (pid_n * BLOCK_N // 128) * stride_wsn,
            sw_base + ((I + pid_n * BLOCK_N) // 128) * stride_wsn,
            A_GROUP,
            W_BLOCK,
            SWAP_AB,
        )
    else:
        offs_j = tl.arange(0, 2 * BLOCK_N)
        col = pid_n * BLOCK_N + offs_j % BLOCK_N  # column of I (gate half, then up half)
        j_ok = col < I
        w_row = col + (offs_j >= BLOCK_N).to(tl.int32) * I  # row of w13
        w_ptrs = w_ptr + e * stride_we + w_row[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        sa_ptrs = xs_ptr + tok * num_kg
        sw_ptrs = ws_ptr + e * stride_wse + (w_row // 128) * stride_wsn
        # W_SCALAR: the gate half and the up half each lie in one 128-row group (GU_N <= 128,
        # I % 128 == 0): two scalar scale loads per K step instead of a [2·BLOCK_N] vector
        swg_ptr = ws_ptr + e * stride_wse + (pid_n * BLOCK_N // 128) * stride_wsn
        swu_ptr = ws_ptr + e * stride_wse + ((I + pid_n * BLOCK_N) // 128) * stride_wsn
        acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
        # 128-group scales are loaded one K step ahead (loop-carried): their latency hides behind a step;
        # 1.0 stands for those this form does not use (``_scaled_step`` passes them through)
        sa = 1.0
        sw = 1.0
        if A_GROUP:
            sa = tl.load(sa_ptrs + k_lo // 128, mask=row_ok, other=0.0)
        if W_BLOCK:
            if W_SCALAR:
                swg = tl.load(swg_ptr + k_lo // 128)
                swu = tl.load(swu_ptr + k_lo // 128)
            else:
                sw = tl.load(sw_ptrs + k_lo // 128, mask=j_ok, other=0.0)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs + k0, mask=row_ok[:, None], other=0.0)
            else:
                a = tl.load(a_ptrs + k0, mask=row_ok[:, None] & ((k0 + offs_k) < H)[None, :], other=0.0)
            # W_TMA: gate and up rows of expert e in one [1, 2, BN, BK] block, the merged tile
            b = _w_step_tile(
                w_ptrs, j_ok, k0, offs_k, H, w_desc, e.to(tl.int32), 0, pid_n * BLOCK_N, 2, BLOCK_N, BLOCK_K,
                W_TMA, EVEN_K,
            )  # fmt: skip
            if A_GROUP or W_BLOCK:
                d, kn, sa, sw = _scaled_step(
                    a, b, k0, H, sa, sa_ptrs, row_ok, sw, sw_ptrs, j_ok, BLOCK_K, A_GROUP, W_BLOCK and not W_SCALAR,
                    SWAP_AB,
                )  # fmt: skip
                if W_BLOCK and W_SCALAR:  # the gate half's scale, then the up half's
                    swg_next = tl.load(swg_ptr + kn)
                    swu_next = tl.load(swu_ptr + kn)
                    d = d * tl.where(offs_j < BLOCK_N, swg, swu)[None, :]
                    swg = swg_next
                    swu = swu_next
                acc += d
            else:
                acc = _prod_acc(a, b, acc, BLOCK_K, SWAP_AB)
        g, u = tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, BLOCK_N]), [0, 2, 1]))
    if not A_GROUP:
        sa_t = tl.load(a_scale_ptr)
        g = g * sa_t
        u = u * sa_t
    if not W_BLOCK:
        sw_t = tl.load(ws_ptr + e)
        g = g * sw_t
        u = u * sw_t

    if OUT_MODE == 0:
        _silu_mul_quant_store(
            g, u, offs_m, offs_n, out_ptr, outs_ptr, a2_scale_ptr, I, pid_n, BLOCK_N, A2_GROUP
        )
    else:
        _store_split_partials(g, u, out_ptr, pid_k, max_padded, offs_m, offs_n, n_ok, I)


@triton.jit
def _half_rows(x, BLOCK_M: tl.constexpr):
    """(x[:BLOCK_M/2], x[BLOCK_M/2:]) of a [BLOCK_M] vector, in registers (a layout change, no memory access)."""
    return tl.split(tl.permute(tl.reshape(x, [2, BLOCK_M // 2]), [1, 0]))


@triton.jit
def _zero_rows_store(
    offs_m, pid_n, out_ptr, outs_ptr, a2_scale_ptr, I, BLOCK_N: tl.constexpr, A2_GROUP: tl.constexpr
):
    """h (and, A2_GROUP, its group scales) of padding rows offs_m, N tile pid_n, exactly as a full gate/up tile
    stores them: its gate and up sums of an all-zero A row are +0 (fp32 sums from +0), so this is the same epilogue
    (``_silu_mul_quant_store``) on zeros: h 0, group scale SCALE_EPS / FP8_MAX."""
    zero = tl.zeros([offs_m.shape[0], BLOCK_N], dtype=tl.float32)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _silu_mul_quant_store(
        zero, zero, offs_m, offs_n, out_ptr, outs_ptr, a2_scale_ptr, I, pid_n, BLOCK_N, A2_GROUP
    )


@triton.jit
def _store_split_partials(g, u, part_ptr, pid_k, max_padded, offs_m, offs_n, n_ok, I):
    """Split pid_k's fp32 gate and up sums of rows offs_m, columns offs_n into part [SPLIT_K, P, 2I]."""
    base = part_ptr + (pid_k * max_padded + offs_m.to(tl.int64))[:, None] * (2 * I) + offs_n[None, :]
    tl.store(base, g, mask=n_ok[None, :])
    tl.store(base + I, u, mask=n_ok[None, :])


@triton.jit
def _sum_split_partials(part_ptr, SPLIT_K: tl.constexpr, max_padded, offs_m, offs_n, n_ok, I):
    """(gate, up): the SPLIT_K fp32 partials of rows offs_m, columns offs_n summed in split order from 0."""
    g = tl.zeros([offs_m.shape[0], offs_n.shape[0]], dtype=tl.float32)
    u = tl.zeros([offs_m.shape[0], offs_n.shape[0]], dtype=tl.float32)
    for s in range(0, SPLIT_K):
        base = part_ptr + (s * max_padded + offs_m.to(tl.int64))[:, None] * (2 * I) + offs_n[None, :]
        g += tl.load(base, mask=n_ok[None, :], other=0.0)
        u += tl.load(base + I, mask=n_ok[None, :], other=0.0)
    return g, u


@triton.jit(do_not_specialize=["top_k", "n_entries", "max_padded", "stride_wse", "stride_wsn"])
def _gate_up_kernel(
    xq_ptr,  # fp8 [T, H]
    xs_ptr,  # fp32 [T, cdiv(H, G)] (A_GROUP)
    a_scale_ptr,  # fp32 [1] (static)
    w_ptr,  # fp8 [E, 2I, H]
    ws_ptr,  # fp32 [E] or [E, cdiv(2I, G), cdiv(H, G)]
    sorted_ids_ptr,
    block_expert_ptr,
    num_padded_ptr,
    out_ptr,  # OUT_MODE 0: fp8 [P, I]; 1: fp32 [SPLIT_K, P, 2I]
    outs_ptr,  # OUT_MODE 0: fp32 [P, cdiv(I, G)]
    a2_scale_ptr,
    H,
    I,
    top_k,
    n_entries,
    max_padded,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    A_GROUP: tl.constexpr,
    W_BLOCK: tl.constexpr,
    A2_GROUP: tl.constexpr,
    OUT_MODE: tl.constexpr,
    EVEN_K: tl.constexpr,
    TWO_DOTS: tl.constexpr,
    USE_PDL: tl.constexpr = False,
    BLOCK_EXIT: tl.constexpr = False,
    W_TMA: tl.constexpr = False,
    w_desc=None,  # W_TMA: w13 as [E, 2, I, H], block [1, 1 (TWO_DOTS) or 2, BN, BK]
    W_SCALAR: tl.constexpr = False,
    SWAP_AB: tl.constexpr = False,
    HALF: tl.constexpr = False,
):
    """Grid (P/BLOCK_M · cdiv(I, BLOCK_N), SPLIT_K). One program: BLOCK_M sorted rows × BLOCK_N columns
    of gate *and* up as ONE dot against a [BLOCK_K, 2·BLOCK_N] weight tile (w13 rows n.. then I + n..):
    the A tile is read from shared memory once per K step and the tensor cores get one N = 2·BLOCK_N
    instruction stream; the acc is split into gate and up for the epilogue. TWO_DOTS: see
    ``_gate_up_two_dots`` (per-tensor scales, fp32 promotion). W_TMA (config key): the
    weight tiles come by TMA from ``w_desc`` (the gathered A rows stay pointer loads). W_SCALAR (config
    key, block scales): the weight scale of each tile half is a scalar per K step (op checks that the
    halves lie in one 128-row group), not a per-column vector (fewer registers; same products).
    SWAP_AB (config GU_SWAP_AB, decode tiles): every K step's dot runs with the weight tile as the MMA's
    M side and the BLOCK_M token rows as its N side (``_prod``: wgmma at 16 rows instead of mma.sync);
    the accumulator is the transposed product, transposed back, so scales and epilogue are unchanged.
    HALF (config GU_HALF; BLOCK_M 128, one tile, SPLIT_K 1, OUT_MODE 0): a block whose rows BLOCK_M/2.. are all
    padding (the last block of an expert with <= BLOCK_M/2 rows in it; its sorted entries, already in registers, say
    so: no extra load) runs the same ``_gate_up_tile`` at BLOCK_M/2 rows (half the MMA work) and stores its padding
    rows BLOCK_M/2.. as the full tile computes them, zeros (``_zero_rows_store``): h of every real row and the
    scales bitwise the full tile's, every padding row's h zero, the output bitwise."""
    if USE_PDL:  # programmatic dependent launch: wait for the prior grid before touching its outputs
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    num_m_blocks = max_padded // BLOCK_M
    pid_m, pid_g = _tile_ids(num_m_blocks, tl.cdiv(I, BLOCK_N), GROUP_M)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    e, entry = _block_rows(
        block_expert_ptr, sorted_ids_ptr, num_padded_ptr, pid_m, offs_m, BLOCK_M, BLOCK_EXIT
    )
    if e < 0:
        return
    e = e.to(tl.int64)
    row_ok = entry < n_entries
    tok = (entry // top_k).to(tl.int64)
    if HALF:
        tl.static_assert(SPLIT_K == 1 and OUT_MODE == 0 and BLOCK_M % 2 == 0)
        entry_lo, entry_hi = _half_rows(entry, BLOCK_M)
        if tl.max((entry_hi < n_entries).to(tl.int32), axis=0) == 0:  # rows BLOCK_M/2.. all padding
            offs_lo = pid_m * BLOCK_M + tl.arange(0, BLOCK_M // 2)
            _gate_up_tile(
                pid_g, pid_k, offs_lo, e, entry_lo < n_entries, (entry_lo // top_k).to(tl.int64), xq_ptr, xs_ptr,
                a_scale_ptr, w_ptr, ws_ptr, out_ptr, outs_ptr, a2_scale_ptr, H, I, max_padded,
                stride_wn, stride_we, stride_wse, stride_wsn, w_desc, BLOCK_M // 2, BLOCK_N, BLOCK_K, A_GROUP,
                W_BLOCK, A2_GROUP, OUT_MODE, EVEN_K, TWO_DOTS, W_TMA, W_SCALAR, SPLIT_K, SWAP_AB,
            )  # fmt: skip
            _zero_rows_store(
                offs_lo + BLOCK_M // 2, pid_g, out_ptr, outs_ptr, a2_scale_ptr, I, BLOCK_N, A2_GROUP
            )
            return
    _gate_up_tile(
        pid_g, pid_k, offs_m, e, row_ok, tok, xq_ptr, xs_ptr, a_scale_ptr,
        w_ptr, ws_ptr, out_ptr, outs_ptr, a2_scale_ptr, H, I, max_padded, stride_wn, stride_we, stride_wse,
        stride_wsn, w_desc, BLOCK_M, BLOCK_N, BLOCK_K, A_GROUP, W_BLOCK, A2_GROUP, OUT_MODE, EVEN_K,
        TWO_DOTS, W_TMA, W_SCALAR, SPLIT_K, SWAP_AB,
    )  # fmt: skip


@triton.jit(do_not_specialize=["max_padded"])
def _act_quant_kernel(
    part_ptr,  # fp32 [SPLIT_K, P, 2I]
    block_expert_ptr,
    num_padded_ptr,
    inter_ptr,
    inter_s_ptr,
    a2_scale_ptr,
    I,
    max_padded,
    BLOCK_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    A2_GROUP: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """Grid (P/BLOCK_M, cdiv(I, 128)): sum split-K partials, SiLU(gate)·up, fp8 quantization."""
    if USE_PDL:  # programmatic dependent launch: wait for the prior grid before touching its outputs
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * 128 + tl.arange(0, 128)
    n_ok = offs_n < I
    g, u = _sum_split_partials(part_ptr, SPLIT_K, max_padded, offs_m, offs_n, n_ok, I)
    _silu_mul_quant_store(g, u, offs_m, offs_n, inter_ptr, inter_s_ptr, a2_scale_ptr, I, pid_n, 128, A2_GROUP)


@triton.jit
def _down_tile(
    pid_n, pid_m, offs_m, e, entry, inter_ptr, inter_s_ptr, a2_scale_ptr, w_ptr, ws_ptr, topk_w_ptr, y_ptr, H, I,
    n_entries, routed_scaling, stride_we, stride_wn, stride_wse, stride_wsn, w_desc, a_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, A_GROUP: tl.constexpr, W_BLOCK: tl.constexpr, EVEN_K: tl.constexpr,
    W_TMA: tl.constexpr,
    W_SCALAR: tl.constexpr, A_TMA: tl.constexpr, SWAP_AB: tl.constexpr,
):  # fmt: skip
    """H tile pid_n of the down program's block pid_m (expert e, sorted entries ``entry``): the K loop over I,
    the routing-weight epilogue and the bf16 row store. The rest of
    ``_down_kernel``'s docstring."""
    rows64 = offs_m.to(tl.int64)
    row_ok = entry < n_entries
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < H
    offs_k = tl.arange(0, BLOCK_K)
    num_kg = tl.cdiv(I, 128)

    a_ptrs = inter_ptr + rows64[:, None] * I + offs_k[None, :]
    w_ptrs = w_ptr + e * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    sa_ptrs = inter_s_ptr + rows64 * num_kg
    sw_ptrs = ws_ptr + e * stride_wse + (offs_n // 128) * stride_wsn
    if W_SCALAR:  # BLOCK_N <= 128: the tile's rows lie in one 128-row group, one scalar per K step
        tl.static_assert(BLOCK_N <= 128)
        sw_ptrs = ws_ptr + e * stride_wse + (pid_n * BLOCK_N // 128) * stride_wsn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    sa = 1.0  # scales one K step ahead, as in the gate/up kernel (1.0: not used by this form)
    sw = 1.0
    if A_GROUP:
        sa = tl.load(sa_ptrs)
    if W_BLOCK:
        sw = tl.load(sw_ptrs) if W_SCALAR else tl.load(sw_ptrs, mask=n_ok, other=0.0)
    for k0 in range(0, I, BLOCK_K):
        if A_TMA:  # columns past I come zero-filled
            a = a_desc.load([pid_m * BLOCK_M, k0])
        elif EVEN_K:
            a = tl.load(a_ptrs + k0)
        else:
            a = tl.load(a_ptrs + k0, mask=((k0 + offs_k) < I)[None, :], other=0.0)
        b = _w_step_tile(
            w_ptrs, n_ok, k0, offs_k, I, w_desc, e.to(tl.int32), 0, pid_n * BLOCK_N, 1, BLOCK_N, BLOCK_K,
            W_TMA, EVEN_K,
        )  # fmt: skip
        if A_GROUP or W_BLOCK:
            # sa_ok None: the padded intermediate's scale rows all exist (unmasked loads)
            d, kn, sa, sw = _scaled_step(
                a, b, k0, I, sa, sa_ptrs, None, sw, sw_ptrs, n_ok, BLOCK_K, A_GROUP, W_BLOCK and not W_SCALAR,
                SWAP_AB,
            )  # fmt: skip
            if W_BLOCK and W_SCALAR:  # one scalar for the tile's rows
                sw_next = tl.load(sw_ptrs + kn)
                d = d * sw
                sw = sw_next
            acc += d
        else:
            acc = _prod_acc(a, b, acc, BLOCK_K, SWAP_AB)
    scale = tl.load(topk_w_ptr + entry, mask=row_ok, other=0.0) * routed_scaling
    if not A_GROUP:
        scale = scale * tl.load(a2_scale_ptr)
    if not W_BLOCK:
        scale = scale * tl.load(ws_ptr + e)
    acc = acc * scale[:, None]
    y_ptrs = y_ptr + entry.to(tl.int64)[:, None] * H + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit(
    do_not_specialize=[
        "n_entries",
        "max_padded",
        "stride_wse",
        "stride_wsn",
    ]
)
def _down_kernel(
    inter_ptr,  # fp8 [P, I]
    inter_s_ptr,  # fp32 [P, cdiv(I, G)] (A_GROUP)
    a2_scale_ptr,  # fp32 [1] (static)
    w_ptr,  # fp8 [E, H, I]
    ws_ptr,  # fp32 [E] or [E, cdiv(H, G), cdiv(I, G)]
    sorted_ids_ptr,
    block_expert_ptr,
    num_padded_ptr,
    topk_w_ptr,  # fp32 [n]
    y_ptr,  # bf16 [n, H]
    H,
    I,
    n_entries,
    max_padded,
    routed_scaling,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_GROUP: tl.constexpr,
    W_BLOCK: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
    BLOCK_EXIT: tl.constexpr = False,
    W_TMA: tl.constexpr = False,
    w_desc=None,  # W_TMA: w2 as [E, 1, H, I], block [1, 1, BLOCK_N, BLOCK_K]
    W_SCALAR: tl.constexpr = False,
    A_TMA: tl.constexpr = False,
    a_desc=None,  # A_TMA: the intermediate [P, I], block [BLOCK_M, BLOCK_K]
    SWAP_AB: tl.constexpr = False,
    TILES: tl.constexpr = 1,
    HALF: tl.constexpr = False,
):
    """Grid (P/BLOCK_M · cdiv(H, BLOCK_N) / TILES,): y[entry] = w_entry · scaling · (h_entry · W2ᵀ).
    W_TMA (config key): weight tiles by TMA from ``w_desc`` (``_w_tile``). W_SCALAR (config key, block
    scales, BLOCK_N <= 128): the tile's weight scale is one scalar per K step (same products). A_TMA
    (config DN_A_TMA): the intermediate rows, contiguous in the padded order, come by TMA too.
    SWAP_AB (config DN_SWAP_AB): the weight tile (BLOCK_N rows of H) as the MMA's M side (``_prod``).
    TILES (config DN_TILES, decode): TILES adjacent H tiles of the block per program, one after the other
    (``_down_tile`` each) in a loop nest Triton flattens into one pipelined loop over (tile, K step), as
    (op: TILES divides the H tiles).
    HALF (config DN_HALF, not with A_TMA): a block whose rows BLOCK_M/2.. are all padding (its sorted
    entries, already in registers, say so) runs the same tiles at BLOCK_M/2 rows (``_down_tiles``); padding rows
    store nothing in either form, so y is bitwise the full tiles'."""
    num_m_blocks = max_padded // BLOCK_M
    pid_m, pid_n = _tile_ids(num_m_blocks, tl.cdiv(H, BLOCK_N) // TILES, GROUP_M)  # pid_n: tile group
    if USE_PDL:  # programmatic dependent launch: wait for the prior grid before touching its outputs
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    e, entry = _block_rows(
        block_expert_ptr, sorted_ids_ptr, num_padded_ptr, pid_m, offs_m, BLOCK_M, BLOCK_EXIT
    )
    if e < 0:
        return
    e = e.to(tl.int64)
    if HALF:  # config DN_HALF: a block whose rows BLOCK_M/2.. are padding only runs BLOCK_M/2-row tiles
        tl.static_assert(not A_TMA and BLOCK_M % 2 == 0)
        entry_lo, entry_hi = _half_rows(entry, BLOCK_M)
        if tl.max((entry_hi < n_entries).to(tl.int32), axis=0) == 0:
            _down_tiles(
                pid_n, pid_m, pid_m * BLOCK_M + tl.arange(0, BLOCK_M // 2), e, entry_lo, inter_ptr, inter_s_ptr,
                a2_scale_ptr, w_ptr, ws_ptr, topk_w_ptr, y_ptr, H, I, n_entries, routed_scaling, stride_we, stride_wn,
                stride_wse, stride_wsn, w_desc, a_desc, BLOCK_M // 2, BLOCK_N, BLOCK_K, A_GROUP, W_BLOCK, EVEN_K, W_TMA, W_SCALAR, A_TMA, SWAP_AB, TILES,
            )  # fmt: skip
            return
    _down_tiles(
        pid_n, pid_m, offs_m, e, entry, inter_ptr, inter_s_ptr, a2_scale_ptr, w_ptr, ws_ptr, topk_w_ptr, y_ptr, H, I,
        n_entries, routed_scaling, stride_we, stride_wn, stride_wse, stride_wsn, w_desc, a_desc, BLOCK_M, BLOCK_N, BLOCK_K, A_GROUP,
        W_BLOCK, EVEN_K, W_TMA, W_SCALAR, A_TMA, SWAP_AB, TILES,
    )  # fmt: skip


@triton.jit
def _down_tiles(
    pid_n, pid_m, offs_m, e, entry, inter_ptr, inter_s_ptr, a2_scale_ptr, w_ptr, ws_ptr, topk_w_ptr, y_ptr, H, I,
    n_entries, routed_scaling, stride_we, stride_wn, stride_wse, stride_wsn, w_desc, a_desc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, A_GROUP: tl.constexpr, W_BLOCK: tl.constexpr, EVEN_K: tl.constexpr,
    W_TMA: tl.constexpr,
    W_SCALAR: tl.constexpr, A_TMA: tl.constexpr, SWAP_AB: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    """The down program's tile group pid_n of block pid_m: one ``_down_tile``, or (TILES > 1) TILES adjacent H tiles
    in one loop that Triton flattens into a single pipelined loop over (tile, K step). ``offs_m`` / ``entry``: the
    block's BLOCK_M padded rows and their sorted entries (DN_HALF: its first BLOCK_M rows of a larger block)."""
    if TILES == 1:
        _down_tile(
            pid_n, pid_m, offs_m, e, entry, inter_ptr, inter_s_ptr, a2_scale_ptr, w_ptr, ws_ptr, topk_w_ptr, y_ptr, H, I,
            n_entries, routed_scaling, stride_we, stride_wn, stride_wse, stride_wsn, w_desc, a_desc, BLOCK_M, BLOCK_N, BLOCK_K, A_GROUP,
            W_BLOCK, EVEN_K, W_TMA, W_SCALAR, A_TMA, SWAP_AB,
        )  # fmt: skip
    else:
        for t in tl.range(0, TILES, flatten=True):
            _down_tile(
                pid_n * TILES + t, pid_m, offs_m, e, entry, inter_ptr, inter_s_ptr, a2_scale_ptr, w_ptr, ws_ptr, topk_w_ptr, y_ptr, H, I,
                n_entries, routed_scaling, stride_we, stride_wn, stride_wse, stride_wsn, w_desc, a_desc, BLOCK_M, BLOCK_N, BLOCK_K, A_GROUP,
                W_BLOCK, EVEN_K, W_TMA, W_SCALAR, A_TMA, SWAP_AB,
            )  # fmt: skip


@triton.jit(do_not_specialize=["top_k", "expert_offset", "num_experts"])
def _reduce_kernel(
    y_ptr,  # bf16 [n, H]
    topk_ids_ptr,  # int32 [T, k]
    out_ptr,  # bf16 [T, H], row stride stride_out
    H,
    top_k,
    expert_offset,
    num_experts,
    stride_out,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """Grid (T, cdiv(H, BLOCK_H)): out[t] = Σ_j y[t·k + j] over this rank's slots (0 if none)."""
    if USE_PDL:  # programmatic dependent launch: wait for the prior grid before touching its outputs
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in range(0, top_k):
        e = tl.load(topk_ids_ptr + t * top_k + j) - expert_offset
        valid = (e >= 0) & (e < num_experts)
        acc += tl.load(y_ptr + (t * top_k + j) * H + offs, mask=h_ok & valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_out + offs, acc.to(out_ptr.dtype.element_ty), mask=h_ok)


__all__ = [
    "FP8_MAX",
    "_prefetch_l2",
    "SCALE_EPS",
    "_act_quant_kernel",
    "_down_kernel",
    "_gate_up_kernel",
    "_prep_kernel",
    "_reduce_kernel",
    "_route_ranked",
]
