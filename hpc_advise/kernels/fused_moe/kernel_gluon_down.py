"""Gluon (Triton's explicit-layout dialect) ping-pong down GEMM of the fused MoE's prefill path, SM90 only.

Config DN_GLUON = 3 (shipped at Hy3 T = 16384; op.check_forms: per-tensor w2 scales, static intermediate scale,
DN_K 128, DN_WARPS 4, a tile of DN_GLUON_M x DN_N with at most 64 fp32 values per thread; none of PDL / PREFETCH /
DN_REDUCE / DN_TILES / DN_PERSIST / swap AB / FAST_ACC) replaces ``kernel._down_kernel``: same result, bitwise
(y[entry] = w_entry · scaling · a2 · ws[e] · (h_entry · W2[e]ᵀ), one bf16 row per (token, slot), stored
through the sorted entry ids).

The schedule is CUTLASS's "ping-pong" on one persistent CTA per SM (grid = SMs): the used tiles (the router's
padded row count in DN_GLUON_M-row tiles x H / DN_N column tiles, ``kernel._tile_ids``' grouped order) are
strided over the grid, program p taking tiles p, p + G, p + 2G, ... Three partitions (``gl.warp_specialize``):

- a producer warp (``_producer``, PRODUCER_REGS registers) walks the program's tiles and K steps in order and
  issues the TMA of each step (A: the quantized intermediate [P, I] rows; B: w2 viewed as [E·H, I]) into one
  STAGES-deep shared-memory ring (``ready`` / ``empty`` mbarrier per slot), running ahead across tile boundaries;
- two consumer warpgroups (``_consumer``: the default partition is consumer 0, a 4-warp worker consumer 1)
  take the program's tiles alternately (local tile v goes to consumer v % 2). A consumer waits for its turn on
  the ``order`` mbarrier pair, issues its tile's K loop of wgmmas, passes the turn to the other consumer right
  after issuing its last wgmma, then finishes its promotions and runs the tile's epilogue (the routing-weight
  scale and the DN_GLUON_M scattered bf16 row stores) while the other consumer's wgmmas run.

K loop numerics as ``_down_kernel``'s: each 128-wide K step is one fresh fp8 tensor-core partial (use_acc
False) added to the fp32 accumulator in step order (0 + p0 + p1 + ...). Two partial tiles alternate so step
k + 1's wgmma is in flight while step k's partial is added (``warpgroup_mma_wait(num_outstanding=1)``); a
slot is handed back to the producer once its step's wgmma retired (a barrier of the consumer's warps, then
one arrival on the slot's ``empty`` mbarrier). Epilogue in ``_down_tile``'s order: ((w · scaling) · a2) · ws[e].
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# registers per thread: the producer warp's warpgroup (TMA issue and tile indices only) and the worker consumer
# warpgroup; the default consumer gets the rest of the launch's 3 x MAXNREG (232)
PRODUCER_REGS = gl.constexpr(40)
CONSUMER_REGS = gl.constexpr(232)
MAXNREG = 168  # launch cap: 3 warpgroups (4 + 4 + 1 warps, rounded up to 12) x 128 threads x 168 <= 64 Ki
BLOCK_K = gl.constexpr(128)  # one K step = one promotion of the fp8 partial


@gluon.jit
def _tile_ids(t, num_m, num_n, GROUP_M: gl.constexpr):
    """``kernel._tile_ids_of``' grouped order: GROUP_M row tiles share each column sweep (L2 reuse of w2)."""
    width = GROUP_M * num_n
    first_m = (t // width) * GROUP_M
    size_m = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (t % width) % size_m, (t % width) // size_m


@gluon.jit
def _tiles(num_padded_ptr, H, TILE_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """(used row tiles, column tiles, used tiles) of the call: the router's padded rows in TILE_M-row tiles."""
    num_m = gl.load(num_padded_ptr) // TILE_M
    num_n = H // BLOCK_N
    return num_m, num_n, num_m * num_n


@gluon.jit
def _tile_origin(t, num_m, num_n, block_expert_ptr, H, BLOCK_M: gl.constexpr, TILE_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):  # fmt: skip
    """(first A row, first w2 row of the [E·H, I] view, expert, first column) of used tile ``t``."""
    pid_m, pid_n = _tile_ids(t, num_m, num_n, GROUP_M)
    m0 = pid_m * TILE_M
    e = gl.load(block_expert_ptr + m0 // BLOCK_M)  # a used row block always has a local expert
    n0 = pid_n * BLOCK_N
    return m0, e * H + n0, e, n0


@gluon.jit
def _producer(a_desc, w_desc, a_s, b_s, ready, empty, num_padded_ptr, block_expert_ptr, H, I,
              BLOCK_M: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """The producer warp: every K step of the program's tiles, in order, into ring slot g % STAGES (g: the
    program's running step count) once the consumers freed it (a fresh barrier passes the wait for parity 1,
    so the first STAGES steps go at once)."""
    TILE_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    num_m, num_n, n_tiles = _tiles(num_padded_ptr, H, TILE_M, BLOCK_N)
    n_k = gl.cdiv(I, BLOCK_K)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + w_desc.block_type.nbytes
    g = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        m0, w_row, e, n0 = _tile_origin(
            t, num_m, num_n, block_expert_ptr, H, BLOCK_M, TILE_M, BLOCK_N, GROUP_M
        )
        for k in range(n_k):
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, nbytes)
            tma.async_copy_global_to_shared(a_desc, [m0, k * BLOCK_K], bar, a_s.index(s))
            tma.async_copy_global_to_shared(w_desc, [w_row, k * BLOCK_K], bar, b_s.index(s))
            g += 1


@gluon.jit
def _mma_step(a_s, b_s, ready, g, part, STAGES: gl.constexpr):
    """Issue ring step ``g``'s wgmma once its tiles landed: a fresh partial (use_acc False) in ``part``."""
    s = g % STAGES
    mbarrier.wait(ready.index(s), (g // STAGES) & 1)
    return warpgroup_mma(a_s.index(s), b_s.index(s).permute((1, 0)), part, use_acc=False, is_async=True)


@gluon.jit
def _retire(acc, part, empty, g, outstanding: gl.constexpr, STAGES: gl.constexpr):
    """Wait until at most ``outstanding`` wgmma groups are in flight (step ``g``'s done), add its partial to
    the fp32 sum and hand its slot back: every warp of the consumer past its wait, then one arrival."""
    part = warpgroup_mma_wait(num_outstanding=outstanding, deps=(part,))
    acc = acc + part
    gl.thread_barrier()
    mbarrier.arrive(empty.index(g % STAGES))
    return acc, part


@gluon.jit
def _mainloop(a_s, b_s, ready, empty, order, turn, base, n_k, C: gl.constexpr, STAGES: gl.constexpr,
              layout: gl.constexpr):  # fmt: skip
    """fp32 sum over the tile's K steps (ring steps base .. base + n_k - 1), two partials alternating: step k's
    partial is added while step k + 1's wgmma runs. The consumer's ``turn``-th tile: it waits for its turn on
    order[C] and passes it on (order[1 - C]) right after issuing the last wgmma."""
    TILE_M: gl.constexpr = a_s.type.shape[1]
    BLOCK_N: gl.constexpr = b_s.type.shape[1]
    # consumer 0's first turn is free (a fresh barrier passes the wait for parity 1); consumer 1 waits for 0
    mbarrier.wait(order.index(C), (turn & 1) ^ (1 - C))
    acc = gl.zeros([TILE_M, BLOCK_N], gl.float32, layout)
    pb = gl.zeros([TILE_M, BLOCK_N], gl.float32, layout)
    pa = _mma_step(a_s, b_s, ready, base, gl.zeros([TILE_M, BLOCK_N], gl.float32, layout), STAGES)
    for k in range(1, n_k - 1, 2):  # pairs of steps (k into pb, k + 1 into pa)
        pb = _mma_step(a_s, b_s, ready, base + k, pb, STAGES)
        acc, pa = _retire(acc, pa, empty, base + k - 1, 1, STAGES)
        pa = _mma_step(a_s, b_s, ready, base + k + 1, pa, STAGES)
        acc, pb = _retire(acc, pb, empty, base + k, 1, STAGES)
    if n_k % 2 == 0:  # one step left (n_k - 1, into pb); pa holds step n_k - 2
        pc = _mma_step(a_s, b_s, ready, base + n_k - 1, pb, STAGES)
        mbarrier.arrive(order.index(1 - C))
        acc, _ = _retire(acc, pa, empty, base + n_k - 2, 1, STAGES)
        acc, _ = _retire(acc, pc, empty, base + n_k - 1, 0, STAGES)
    else:  # pa holds the last step, n_k - 1
        mbarrier.arrive(order.index(1 - C))
        acc, _ = _retire(acc, pa, empty, base + n_k - 1, 0, STAGES)
    return acc


@gluon.jit
def _consumer(a_s, b_s, ready, empty, order, a2_scale_ptr, ws_ptr, sorted_ids_ptr, block_expert_ptr,
              num_padded_ptr, topk_w_ptr, y_ptr, H, I, n_entries, routed_scaling, BLOCK_M: gl.constexpr,
              GROUP_M: gl.constexpr, STAGES: gl.constexpr, C: gl.constexpr, layout: gl.constexpr):  # fmt: skip
    """Consumer warpgroup C: the program's local tiles C, C + 2, ... (K loop, then the epilogue of
    ``kernel._down_tile`` in its order: ((w · scaling) · a2) · ws[e], bf16 rows through the sorted ids)."""
    TILE_M: gl.constexpr = a_s.type.shape[1]
    BLOCK_N: gl.constexpr = b_s.type.shape[1]
    num_m, num_n, n_tiles = _tiles(num_padded_ptr, H, TILE_M, BLOCK_N)
    n_k = gl.cdiv(I, BLOCK_K)
    grid = gl.num_programs(0)
    a2 = gl.load(a2_scale_ptr)
    turn = 0
    for t in range(gl.program_id(0) + C * grid, n_tiles, 2 * grid):
        m0, w_row, e, n0 = _tile_origin(
            t, num_m, num_n, block_expert_ptr, H, BLOCK_M, TILE_M, BLOCK_N, GROUP_M
        )
        acc = _mainloop(a_s, b_s, ready, empty, order, turn, (2 * turn + C) * n_k, n_k, C, STAGES, layout)
        offs_m = m0 + gl.arange(0, TILE_M, layout=gl.SliceLayout(1, layout))
        offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        entry = gl.load(sorted_ids_ptr + offs_m)
        row_ok = entry < n_entries
        scale = gl.load(topk_w_ptr + entry, mask=row_ok, other=0.0) * routed_scaling
        scale = scale * a2
        scale = scale * gl.load(ws_ptr + e)
        acc = acc * gl.expand_dims(scale, 1)
        rows = gl.expand_dims(entry.to(gl.int64) * H, 1)
        ok = gl.expand_dims(row_ok, 1) & gl.expand_dims(offs_n < H, 0)
        gl.store(y_ptr + rows + gl.expand_dims(offs_n, 0), acc.to(gl.bfloat16), mask=ok)
        turn += 1


@gluon.jit(do_not_specialize=["n_entries"])
def _down_pingpong_kernel(
    a_desc,  # fp8 intermediate [P, I], block [TILE_M, 128]
    w_desc,  # fp8 w2 as [E·H, I], block [BLOCK_N, 128]
    a2_scale_ptr,  # fp32 [1] static intermediate scale
    ws_ptr,  # fp32 [E] per-tensor w2 scales
    sorted_ids_ptr,  # int32 [P]
    block_expert_ptr,  # int32 [P / BLOCK_M]
    num_padded_ptr,  # int32 [1]
    topk_w_ptr,  # fp32 [n]
    y_ptr,  # bf16 [n, H]
    H,
    I,
    n_entries,
    routed_scaling,
    BLOCK_M: gl.constexpr,  # the router's row block (block_expert's unit)
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,  # 4: consumer 0 (the default partition)
):
    """Grid (SMs,): the persistent ping-pong down GEMM (module docstring)."""
    TILE_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    gl.static_assert(num_warps == 4, "one consumer warpgroup per partition")
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32]
    )
    a_s = gl.allocate_shared_memory(a_desc.dtype, [STAGES, TILE_M, BLOCK_K], a_desc.layout)
    b_s = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    order = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    for c in gl.static_range(2):
        mbarrier.init(order.index(c), count=1)
    fence_async_shared()
    gl.warp_specialize(
        [
            (_consumer, (a_s, b_s, ready, empty, order, a2_scale_ptr, ws_ptr, sorted_ids_ptr, block_expert_ptr,
                         num_padded_ptr, topk_w_ptr, y_ptr, H, I, n_entries, routed_scaling, BLOCK_M, GROUP_M,
                         STAGES, 0, layout)),
            (_consumer, (a_s, b_s, ready, empty, order, a2_scale_ptr, ws_ptr, sorted_ids_ptr, block_expert_ptr,
                         num_padded_ptr, topk_w_ptr, y_ptr, H, I, n_entries, routed_scaling, BLOCK_M, GROUP_M,
                         STAGES, 1, layout)),
            (_producer, (a_desc, w_desc, a_s, b_s, ready, empty, num_padded_ptr, block_expert_ptr, H, I, BLOCK_M,
                         GROUP_M, STAGES)),
        ],
        [4, 1],
        [CONSUMER_REGS, PRODUCER_REGS],
    )  # fmt: skip
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
    for c in gl.static_range(2):
        mbarrier.invalidate(order.index(c))


__all__ = ["MAXNREG", "_down_pingpong_kernel"]
