"""Gluon (Triton's explicit-layout dialect) down GEMM of the fused MoE's regular prefill path, SM90 only.

Config DN_GLUON = 1 (op.check_forms: per-tensor w2 scales, static intermediate scale, BLOCK_M >= 64, DN_K = 128,
H % DN_N == 0; none of PDL / PREFETCH / DN_REDUCE / DN_TILES / DN_SWAP_AB / FAST_ACC) replaces
``kernel._down_kernel`` for the same grid, tile order and epilogue: y[entry] = w_entry · scaling · a2 · ws[e] ·
(h_entry · W2[e]ᵀ), one bf16 row per (token, slot), stored through the sorted entry ids.

What it changes is the K loop. ``_down_kernel`` promotes each 128-wide K step's fp8 tensor-core partial to
fp32 (``max_num_imprecise_acc``) right behind its MMA, so every step ends in ``wgmma.wait_group 0``. Here each
step's partial goes into one of two register tiles, alternating, and the loop waits with one group still
outstanding (``warpgroup_mma_wait(num_outstanding=1)``): step k+1's wgmma runs while step k's partial is added
to the fp32 accumulator. A (the quantized intermediate [P, I], contiguous rows in the padded sorted order) and
B (w2 viewed as [E·H, I]) arrive by TMA into a STAGES-deep shared-memory ring, one mbarrier per slot; a slot is
refilled once both warpgroups have waited for the wgmma that read it (the compiler's shared-memory barrier
before the copy). Same products, same order of fp32 additions (0 + p0 + p1 + ...), same epilogue: the result
is meant to be bitwise ``_down_kernel``'s.

``num_warps`` 4 or 8 (one or two warpgroups: [8, 1] warps over 128 rows, [4, 2] over 64 rows and the N halves).
PRODUCER (config DN_GLUON = 2): the ring is fed by one extra producer warp (``gl.warp_specialize``; 40 registers,
the consumers get the rest): it waits on each slot's ``empty`` mbarrier and issues the TMA; the consumer warps
only wait on ``ready``, issue wgmma, promote, and free the slot (one barrier of the consumer warps, then one
arrival). Without it the consumer warps issue the copies themselves and the compiler's shared-memory barriers
(``bar.sync`` of the whole CTA around the mbarrier and copy ops: 4 per K step at 8 warps, sm_90a SASS) sit in
the loop; with it, 2 per K step, of the consumer warps only.
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

PRODUCER_REGS = gl.constexpr(40)  # registers per thread of the producer warp (PRODUCER): TMA issue only


@gluon.constexpr_function
def _warps_per_cta(block_m, num_warps):
    """Warps over [rows, columns]: along the rows while each warp still has 16 of them, then columns."""
    rows = min(num_warps, max(4, block_m // 16))
    return [rows, num_warps // rows]


@gluon.constexpr_function
def _instr_n(block_n, num_warps, block_m):
    """The wgmma instruction's N: the columns of one warp group's share of the tile."""
    return block_n // (num_warps // min(num_warps, max(4, block_m // 16)))


@gluon.jit
def _issue_loads(a_desc, w_desc, a_s, b_s, ready, step, m0, w_row, STAGES: gl.constexpr, pred):
    """TMA of K step ``step`` (A rows m0.., weight rows w_row..) into ring slot step % STAGES."""
    s = step % STAGES
    bar = ready.index(s)
    k0 = step * a_desc.block_type.shape[1]
    mbarrier.expect(bar, a_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [m0, k0], bar, a_s.index(s), pred=pred)
    tma.async_copy_global_to_shared(w_desc, [w_row, k0], bar, b_s.index(s), pred=pred)


@gluon.jit
def _mma_step(a_s, b_s, ready, step, part, STAGES: gl.constexpr):
    """Issue K step ``step``'s wgmma once its tiles landed: a fresh partial (use_acc False) in ``part``'s registers."""
    s = step % STAGES
    mbarrier.wait(ready.index(s), (step // STAGES) & 1)
    return warpgroup_mma(a_s.index(s), b_s.index(s).permute((1, 0)), part, use_acc=False, is_async=True)


@gluon.jit
def _retire(acc, part, a_desc, w_desc, a_s, b_s, ready, empty, step, n_k, m0, w_row, STAGES: gl.constexpr,
            PRODUCER: gl.constexpr):  # fmt: skip
    """Wait until only the newest wgmma is in flight (step ``step`` done), promote its partial (fp32 add) and
    free its slot: PRODUCER, every consumer warp past its wait (a barrier of the consumer warps), then one
    arrival on the slot's ``empty`` barrier for the producer warp; else refill it here with step + STAGES."""
    part = warpgroup_mma_wait(num_outstanding=1, deps=(part,))
    acc = acc + part
    if PRODUCER:
        gl.thread_barrier()
        mbarrier.arrive(empty.index(step % STAGES))
    else:
        nxt = step + STAGES
        _issue_loads(a_desc, w_desc, a_s, b_s, ready, nxt, m0, w_row, STAGES, nxt < n_k)
    return acc, part


@gluon.jit
def _consume(a_desc, w_desc, a_s, b_s, ready, empty, m0, w_row, n_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, PRODUCER: gl.constexpr, layout: gl.constexpr):  # fmt: skip
    """fp32 [BLOCK_M, BLOCK_N] = Σ over the K steps of each step's fp8 partial, two partials alternating: step k's
    partial is added while step k + 1's wgmma runs."""
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout)
    pb = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout)
    pa = _mma_step(a_s, b_s, ready, 0, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout), STAGES)
    # pairs of steps (k into pb, k + 1 into pa); step k - 1's partial is added while step k runs
    for k in range(1, n_k - 1, 2):
        pb = _mma_step(a_s, b_s, ready, k, pb, STAGES)
        acc, pa = _retire(
            acc, pa, a_desc, w_desc, a_s, b_s, ready, empty, k - 1, n_k, m0, w_row, STAGES, PRODUCER
        )
        pa = _mma_step(a_s, b_s, ready, k + 1, pa, STAGES)
        acc, pb = _retire(
            acc, pb, a_desc, w_desc, a_s, b_s, ready, empty, k, n_k, m0, w_row, STAGES, PRODUCER
        )
    if n_k % 2 == 0:  # one step left (n_k - 1, into pb); pa holds step n_k - 2
        pc = _mma_step(a_s, b_s, ready, n_k - 1, pb, STAGES)
        acc = acc + warpgroup_mma_wait(num_outstanding=1, deps=(pa,))
        acc = acc + warpgroup_mma_wait(num_outstanding=0, deps=(pc,))
    else:  # pa holds the last step, n_k - 1
        acc = acc + warpgroup_mma_wait(num_outstanding=0, deps=(pa,))
    return acc


@gluon.jit
def _consume_ws(a_desc, w_desc, a_s, b_s, ready, empty, m0, w_row, n_k, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, layout: gl.constexpr):  # fmt: skip
    """``_consume`` as the default partition of ``gl.warp_specialize`` (its results: a tuple)."""
    return (
        _consume(
            a_desc, w_desc, a_s, b_s, ready, empty, m0, w_row, n_k, BLOCK_M, BLOCK_N, STAGES, True, layout
        ),
    )


@gluon.jit
def _produce(a_desc, w_desc, a_s, b_s, ready, empty, m0, w_row, n_k, STAGES: gl.constexpr):
    """The producer warp (PRODUCER): every K step's TMA once the consumers freed its slot (a fresh barrier
    passes the wait for parity 1, so the first STAGES steps go at once)."""
    for step in range(n_k):
        mbarrier.wait(empty.index(step % STAGES), ((step // STAGES) & 1) ^ 1)
        _issue_loads(a_desc, w_desc, a_s, b_s, ready, step, m0, w_row, STAGES, True)


@gluon.jit
def _k_loop(a_desc, w_desc, m0, w_row, I, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            PRODUCER: gl.constexpr, layout: gl.constexpr):  # fmt: skip
    """The tile's fp32 sum over K (``_consume``), its TMA ring fed by the consumer warps themselves or (PRODUCER)
    by one producer warp (``gl.warp_specialize``)."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    a_s = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_s = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    n_k = gl.cdiv(I, BLOCK_K)
    if PRODUCER:
        (acc,) = gl.warp_specialize(
            [
                (_consume_ws, (a_desc, w_desc, a_s, b_s, ready, empty, m0, w_row, n_k, BLOCK_M, BLOCK_N, STAGES,
                               layout)),
                (_produce, (a_desc, w_desc, a_s, b_s, ready, empty, m0, w_row, n_k, STAGES)),
            ],
            [1],
            [PRODUCER_REGS],
        )  # fmt: skip
    else:
        for s in gl.static_range(STAGES):  # every slot's first load; each retired step refills its slot
            _issue_loads(a_desc, w_desc, a_s, b_s, ready, s, m0, w_row, STAGES, s < n_k)
        acc = _consume(a_desc, w_desc, a_s, b_s, ready, empty, m0, w_row, n_k, BLOCK_M, BLOCK_N, STAGES, PRODUCER,
                       layout)  # fmt: skip
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))
    return acc


@gluon.jit
def _tile_ids(pid, num_m_blocks, num_n_blocks, GROUP_M: gl.constexpr):
    """``kernel._tile_ids``' grouped order: GROUP_M row blocks share each column sweep (L2 reuse of w2)."""
    width = GROUP_M * num_n_blocks
    first_m = (pid // width) * GROUP_M
    size_m = gl.minimum(num_m_blocks - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@gluon.jit(do_not_specialize=["n_entries", "max_padded"])
def _down_gluon_kernel(
    a_desc,  # fp8 intermediate [P, I], block [BLOCK_M, 128]
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
    max_padded,
    routed_scaling,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
    PRODUCER: gl.constexpr = False,
):
    """Grid (P/BLOCK_M · H/BLOCK_N,): ``_down_kernel``'s per-tensor form (module docstring)."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0],
        warps_per_cta=_warps_per_cta(BLOCK_M, num_warps),
        instr_shape=[16, _instr_n(BLOCK_N, num_warps, BLOCK_M), 32],
    )
    pid_m, pid_n = _tile_ids(gl.program_id(0), max_padded // BLOCK_M, H // BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M < gl.load(num_padded_ptr):
        e = gl.load(block_expert_ptr + pid_m)
        if e >= 0:
            acc = _k_loop(a_desc, w_desc, pid_m * BLOCK_M, e * H + pid_n * BLOCK_N, I, BLOCK_M, BLOCK_N, STAGES,
                          PRODUCER, layout)  # fmt: skip
            offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
            offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
            entry = gl.load(sorted_ids_ptr + offs_m)
            row_ok = entry < n_entries
            # the epilogue of _down_tile, in its order: ((w · scaling) · a2) · ws[e]
            scale = gl.load(topk_w_ptr + entry, mask=row_ok, other=0.0) * routed_scaling
            scale = scale * gl.load(a2_scale_ptr)
            scale = scale * gl.load(ws_ptr + e)
            acc = acc * gl.expand_dims(scale, 1)
            rows = gl.expand_dims(entry.to(gl.int64) * H, 1)
            ok = gl.expand_dims(row_ok, 1) & gl.expand_dims(offs_n < H, 0)
            gl.store(y_ptr + rows + gl.expand_dims(offs_n, 0), acc.to(gl.bfloat16), mask=ok)


__all__ = ["_down_gluon_kernel"]
