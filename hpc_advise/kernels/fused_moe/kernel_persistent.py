"""Triton kernel of the FP8 fused MoE's persistent decode path: the whole layer in ONE launch.

Launched by ``op_persistent.py``. Notation as in ``kernel.py``: T tokens (T <= 16: one dot column per
token), k = top_k, n = T·k (token, slot) entries, E local experts, H hidden, I intermediate, G = 128.

``_persistent_moe_kernel``, grid (P,) with P <= the programs that fit on the GPU at once (the launcher
checks occupancy): every program is resident, so a program may wait for another's result. Each program
first does its phase-A work, then its phase-B items (dealt round-robin in reverse program order, so
programs without phase-A work take B items first), so no program waits before its own A work is done:

  Phase A (gate/up → fp8 h), stream-K: owners are the local entries that name their expert first
     (entry order), so each expert's weights stream once for every token routed to it. The K steps of
     all (owner, I group of BLOCK_N rows) pairs are laid end to end and worker v takes steps
     [v·U/W, (v+1)·U/W) (W workers = programs, at most pairs·(S_MAX − 1) and at most U steps), so
     every program streams an equal share whatever the number of pairs (an EP rank with one local
     expert spreads it over all SMs). Each step is one swap-AB dot pair (gate, up): weight rows are the
     wgmma M side, the tokens its N side (16 wide). The activations come from the program's own fp8
     copy of the hidden rows, quantized once in its prologue (static a13, or per 1×G group;
     PREFETCH_A: the program's weight tiles are first sent towards L2, so their HBM latency overlaps
     the prologue). A pair split over several workers: each stores its fp32 partial sums and bumps the
     pair's arrival counter (acq_rel, gpu scope, after a CTA barrier); the last to arrive sums the
     segments in K order. Epilogue: SiLU(gate)·up, quantized to fp8 (the 1×G group of a BLOCK_N = G
     tile, or the static a2 scale), stored at every slot where a token chose the expert; then the
     owner's ready counter is bumped (release).
  Phase B (down → out), item (unit u, H tile, K split): units are the local entries (entry order),
     then the tokens without a local slot; the K = I steps are split sb ways (sb <= S_MAX) when the
     (entry, H tile) items alone would leave programs idle. W2 tiles do not depend on h, so they may go
     towards L2 early: PREFETCH = 1 each item's before its wait, 2 all of the program's at its start
     (with PREFETCH_A the whole share of the weights is requested at once). An entry's program spins on its owner's ready counter (acquire)
     until every I group is in, and computes w_tj · s · W2_e[tile] · q(h) over its K share: a token
     with one local slot and no split writes its bf16 output tile directly; otherwise each item stores
     an fp32 row and the last to arrive at the (token, H tile) counter sums them in slot order, then
     split order. A token without a local slot gets a zero tile.
  The program that finishes last (a done counter) resets the ready counters, so every counter is 0
  again for the next call or CUDA-graph replay (no memset in the graph).

Every output element is a fixed-order sum, so the result is bitwise reproducible. USE_PDL: a
programmatic dependent launch that waits (griddepcontrol.wait) before touching anything but weights.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel import _prefetch_l2
from .kernel_small import _gate_up_step, _quant_rows


@triton.jit
def _pick(values, mask):
    """The element of ``values`` where ``mask`` holds (exactly one lane, or 0 if none)."""
    return tl.sum(tl.where(mask, values, 0), axis=0)


@triton.jit
def _prefetch_rows(row_ptrs, rows_ok, c_lo, c_hi):
    """prefetch.global.L2 of columns [c_lo, c_hi) of the weight rows at ``row_ptrs`` (128-byte lines)."""
    for c0 in range(c_lo, c_hi, 128):
        _prefetch_l2(row_ptrs + c0, rows_ok)


@triton.jit
def _routing_tables(ids_ptr, n_entries, top_k, expert_offset, num_experts, T, N_PAD: tl.constexpr):
    """Per-entry tables in registers: local expert, local?, owner?, owner rank, local rank, and per
    token (16 lanes) the number of local slots."""
    offs = tl.arange(0, N_PAD)
    inb = offs < n_entries
    e = tl.load(ids_ptr + offs, mask=inb, other=-1) - expert_offset
    local = inb & (e >= 0) & (e < num_experts)
    # an earlier local entry with the same expert makes this one a non-owner
    earlier = (e[:, None] == e[None, :]) & (offs[None, :] < offs[:, None]) & local[None, :]
    owner = local & (tl.sum(earlier.to(tl.int32), axis=1) == 0)
    owner_rank = tl.cumsum(owner.to(tl.int32), 0) - 1
    local_rank = tl.cumsum(local.to(tl.int32), 0) - 1
    toks = tl.arange(0, 16)
    per_tok = ((offs[None, :] // top_k) == toks[:, None]) & local[None, :]
    n_local_tok = tl.sum(per_tok.to(tl.int32), axis=1)  # [16]
    zero_tok = (toks < T) & (n_local_tok == 0)
    zero_rank = tl.cumsum(zero_tok.to(tl.int32), 0) - 1
    return offs, e, local, owner, owner_rank, local_rank, toks, n_local_tok, zero_tok, zero_rank


@triton.jit(
    do_not_specialize=[
        "T",
        "top_k",
        "n_entries",
        "expert_offset",
        "num_experts",
        "work_programs",
        "stride_wse",
        "stride_wsn",
        "stride_w2se",
        "stride_w2sn",
    ]
)
def _persistent_moe_kernel(
    x_ptr,  # bf16 [T, H], row stride stride_x
    ids_ptr,  # int32 [T, k]
    topk_w_ptr,  # fp32 [T, k]
    a13_ptr,  # fp32 [1] (static a13)
    a2_ptr,  # fp32 [1] (static a2)
    w13_ptr,  # fp8 [E, 2I, H]
    ws13_ptr,  # fp32 [E] or [E, cdiv(2I, G), cdiv(H, G)]
    w2_ptr,  # fp8 [E, H, I]
    ws2_ptr,  # fp32 [E] or [E, cdiv(H, G), cdiv(I, G)]
    xq_ptr,  # fp8 [P, T, H] scratch: each program's own copy of the quantized hidden rows
    xs_ptr,  # fp32 [P, T, cdiv(H, G)] scratch: their group scales (A_GROUP)
    h_ptr,  # fp8 [n, I]: h of each local (token, slot)
    hs_ptr,  # fp32 [n, cdiv(I, G)] (A2_GROUP)
    part_ptr,  # fp32 [S_MAX, n, 2I]: split partials at row t·k + first slot of the expert
    y_ptr,  # fp32 [n, H]: weighted rows of tokens with several local slots
    out_ptr,  # bf16 [T, H], row stride stride_out
    cnt_out_ptr,  # int32 [T · cdiv(H, BLOCK_H)]  (token, H tile) arrivals, 0 before and after
    cnt_grp_ptr,  # int32 [n · cdiv(I, BLOCK_N)]  (owner entry, I group) split arrivals
    ready_ptr,  # int32 [n]: I groups done per owner entry
    done_ptr,  # int32 [1]: programs finished
    T,
    H,
    I,
    top_k,
    n_entries,
    expert_offset,
    num_experts,
    routed_scaling,
    work_programs,  # W: programs the work is dealt to: the grid on the GPU (tests: more, on CPU)
    stride_x,
    stride_out,
    stride_w13e,
    stride_w13n,
    stride_w2e,
    stride_w2n,
    stride_wse,
    stride_wsn,
    stride_w2se,
    stride_w2sn,
    BLOCK_N: tl.constexpr,  # I rows per phase-A item (== G with A2_GROUP)
    BLOCK_K: tl.constexpr,  # K step of phase A (== G with A_GROUP)
    BLOCK_H: tl.constexpr,  # H rows per phase-B item
    BLOCK_KB: tl.constexpr,  # K step of phase B (== G with A2_GROUP)
    S_MAX: tl.constexpr,
    K_PAD: tl.constexpr,  # next power of two >= top_k
    N_PAD: tl.constexpr,  # next power of two >= n_entries
    A_GROUP: tl.constexpr,
    A2_GROUP: tl.constexpr,
    W_BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
    G_PAD: tl.constexpr,  # next power of two >= cdiv(H, G): the prologue's [G_PAD, G] tile of one row
    PREFETCH: tl.constexpr,  # (GPU only) W2 tiles to L2: 1 each B item's before its wait, 2 all at the start
    PREFETCH_A: tl.constexpr,  # (GPU only) the program's phase-A tiles to L2 before its prologue
    STAGES_A: tl.constexpr,
    STAGES_B: tl.constexpr,
):
    pid = tl.program_id(0)
    num_progs = tl.num_programs(0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    offs, ent_e, local, owner, owner_rank, local_rank, toks, n_local_tok, zero_tok, zero_rank = (
        _routing_tables(ids_ptr, n_entries, top_k, expert_offset, num_experts, T, N_PAD)
    )
    n_owners = tl.sum(owner.to(tl.int32), axis=0)
    n_local = tl.sum(local.to(tl.int32), axis=0)
    n_zero = tl.sum(zero_tok.to(tl.int32), axis=0)
    num_g = tl.cdiv(I, BLOCK_N)
    num_h = tl.cdiv(H, BLOCK_H)
    n_steps = tl.cdiv(H, BLOCK_K)
    # phase A, stream-K: the K steps of all (owner, I group) pairs laid end to end, worker v taking
    # steps [v·U/W, (v+1)·U/W): equal shares whatever the pair count. W <= pairs·(S_MAX − 1) bounds a
    # pair's segments by S_MAX, W <= U gives every worker a step (so every segment arrives)
    pairs = n_owners * num_g
    units = pairs * n_steps
    work_a = tl.minimum(tl.minimum(work_programs, pairs * tl.maximum(S_MAX - 1, 1)), units)
    # phase B: K = I split over sb programs per (entry, H tile) when the tiles alone leave programs idle
    n_kb = tl.cdiv(I, BLOCK_KB)
    sb = tl.minimum(tl.minimum(tl.maximum(work_programs // tl.maximum(n_local * num_h, 1), 1), S_MAX), n_kb)
    kb_span = tl.cdiv(n_kb, sb) * BLOCK_KB
    num_b = (n_local + n_zero) * num_h * sb

    offs_m = tl.arange(0, 16)  # one dot column per token
    offs_j = tl.arange(0, K_PAD)
    tok_ok = offs_m < T
    ids_m = (
        tl.load(
            ids_ptr + offs_m[:, None] * top_k + offs_j[None, :],
            mask=tok_ok[:, None] & (offs_j < top_k)[None, :],
            other=-1,
        )
        - expert_offset
    )  # [16, K_PAD]

    # ------------------------------------------------------------------ phase A: gate/up → fp8 h
    offs_k = tl.arange(0, BLOCK_K)
    if PREFETCH_A:  # this program's weight tiles start towards L2 while it quantizes the inputs
        for v in range(pid, work_a, num_progs):
            lo = v * units // work_a
            hi = (v + 1) * units // work_a
            for q in range(lo // n_steps, (hi - 1) // n_steps + 1):
                e_pf = _pick(ent_e, owner & (owner_rank == q // num_g)).to(tl.int64)
                rows_pf = (q % num_g) * BLOCK_N + tl.arange(0, BLOCK_N)
                row_ptrs = w13_ptr + e_pf * stride_w13e + rows_pf.to(tl.int64) * stride_w13n
                c_lo = (tl.maximum(lo, q * n_steps) - q * n_steps) * BLOCK_K
                c_hi = tl.minimum((tl.minimum(hi, (q + 1) * n_steps) - q * n_steps) * BLOCK_K, H)
                _prefetch_rows(row_ptrs, rows_pf < I, c_lo, c_hi)  # gate rows
                _prefetch_rows(row_ptrs + I * stride_w13n, rows_pf < I, c_lo, c_hi)  # up rows
    if PREFETCH == 2:  # and every W2 tile of its phase-B items (no dependence on h)
        for b in range(num_progs - 1 - pid, num_b, num_progs):
            if b // (num_h * sb) < n_local:
                e_pf = _pick(ent_e, local & (local_rank == b // (num_h * sb))).to(tl.int64)
                rows_pf = ((b // sb) % num_h) * BLOCK_H + tl.arange(0, BLOCK_H)
                c_lo = (b % sb) * kb_span
                row_ptrs = w2_ptr + e_pf * stride_w2e + rows_pf.to(tl.int64) * stride_w2n
                _prefetch_rows(row_ptrs, rows_pf < H, c_lo, tl.minimum(c_lo + kb_span, I))
    # prologue: the program's own fp8 copy of the hidden rows (one [G_PAD, G] tile per token: a row of
    # the tile is a 1×G group), so the K loop below only streams fp8 tiles into the dot
    num_xg = tl.cdiv(H, 128)
    my_xq = xq_ptr + pid.to(tl.int64) * T * H
    my_xs = xs_ptr + pid.to(tl.int64) * T * num_xg
    if pid < work_a:
        offs_gr = tl.arange(0, G_PAD)
        cols = offs_gr[:, None] * 128 + tl.arange(0, 128)[None, :]
        a13 = tl.load(a13_ptr)
        for tq in range(0, T):
            xr = tl.load(x_ptr + tq * stride_x + cols, mask=cols < H, other=0.0).to(tl.float32)
            xrq, xrs = _quant_rows(xr, a13, A_GROUP, xq_ptr.dtype.element_ty)
            tl.store(my_xq + tq * H + cols, xrq, mask=cols < H)
            if A_GROUP:
                tl.store(my_xs + tq * num_xg + offs_gr, xrs, mask=offs_gr < num_xg)
        tl.debug_barrier()  # the copy is complete before any thread's K loop reads it
    for v in range(pid, work_a, num_progs):
        lo = v * units // work_a
        hi = (v + 1) * units // work_a
        for q in range(lo // n_steps, (hi - 1) // n_steps + 1):  # the pairs this worker's steps touch
            r = q // num_g
            g = q % num_g
            # workers holding the pair's first and last step: its segments, summed in K (= worker) order
            first_w = ((q * n_steps + 1) * work_a + units - 1) // units - 1
            last_w = ((q + 1) * n_steps * work_a + units - 1) // units - 1
            segs = last_w - first_w + 1
            s0 = _pick(offs, owner & (owner_rank == r))
            e = _pick(ent_e, offs == s0)
            e64 = e.to(tl.int64)
            match = (ids_m == e) & tok_ok[:, None] & (offs_j < top_k)[None, :]
            row_ok = tl.sum(match.to(tl.int32), axis=1) > 0
            offs_n = g * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = offs_n < I
            k_lo = (tl.maximum(lo, q * n_steps) - q * n_steps) * BLOCK_K
            k_hi = tl.minimum((tl.minimum(hi, (q + 1) * n_steps) - q * n_steps) * BLOCK_K, H)
            wg_ptrs = (
                w13_ptr + e64 * stride_w13e + offs_n[:, None].to(tl.int64) * stride_w13n + offs_k[None, :]
            )
            wu_ptrs = wg_ptrs + I * stride_w13n
            xq_ptrs = my_xq + offs_m[None, :] * H + offs_k[:, None]  # transposed: [BLOCK_K, 16]
            if W_BLOCK:
                sg_ptrs = ws13_ptr + e64 * stride_wse + (offs_n // 128) * stride_wsn
                su_ptrs = ws13_ptr + e64 * stride_wse + ((offs_n + I) // 128) * stride_wsn
            else:  # per-tensor weight scales: unused by _gate_up_step
                sg_ptrs = ws13_ptr
                su_ptrs = ws13_ptr
            acc_g = tl.zeros([BLOCK_N, 16], dtype=tl.float32)  # [I rows, tokens]
            acc_u = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
            for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES_A):
                k_ok = (k0 + offs_k) < H
                bg = tl.load(wg_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
                bu = tl.load(wu_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
                at = tl.load(xq_ptrs + k0, mask=k_ok[:, None] & row_ok[None, :], other=0.0)
                if A_GROUP:
                    sa = tl.load(my_xs + offs_m * num_xg + k0 // 128, mask=row_ok, other=0.0)
                else:  # static activation scale: applied after the loop, unused by _gate_up_step
                    sa = 1.0
                acc_g, acc_u = _gate_up_step(
                    bg, bu, at, sa, sg_ptrs, su_ptrs, k0, n_ok, acc_g, acc_u, A_GROUP, W_BLOCK, BLOCK_K
                )
            # partial rows: token t's at t·k + its first slot naming e
            j_first = tl.min(tl.where(match, offs_j[None, :], K_PAD), axis=1)
            row_first = offs_m.to(tl.int64) * top_k + j_first
            p_ofs = row_first[None, :] * (2 * I) + offs_n[:, None]  # [BLOCK_N, 16]
            p_ok = n_ok[:, None] & row_ok[None, :]
            last = segs == 1
            cnt = cnt_grp_ptr + s0 * num_g + g
            if segs > 1:
                mine = part_ptr + (v - first_w) * n_entries * (2 * I) + p_ofs
                tl.store(mine, acc_g, mask=p_ok)
                tl.store(mine + I, acc_u, mask=p_ok)
                tl.debug_barrier()  # every thread's partial store before the arrival
                arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
                last = arrived == segs - 1
            if last:
                if segs > 1:
                    acc_g = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
                    acc_u = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
                    for sg in range(0, segs):  # K order, never arrival order
                        part = part_ptr + sg * n_entries * (2 * I) + p_ofs
                        acc_g += tl.load(part, mask=p_ok, other=0.0, cache_modifier=".cg")
                        acc_u += tl.load(part + I, mask=p_ok, other=0.0, cache_modifier=".cg")
                    tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
                gate = tl.trans(acc_g)  # [16, BLOCK_N]: one row per token
                up = tl.trans(acc_u)
                if not A_GROUP:
                    gate = gate * tl.load(a13_ptr)
                    up = up * tl.load(a13_ptr)
                if not W_BLOCK:
                    gate = gate * tl.load(ws13_ptr + e64)
                    up = up * tl.load(ws13_ptr + e64)
                hv = gate * tl.sigmoid(gate) * up
                hv = tl.where(n_ok[None, :], hv, 0.0)
                hq, hsc = _quant_rows(hv, tl.load(a2_ptr), A2_GROUP, h_ptr.dtype.element_ty)
                for jj in tl.static_range(K_PAD):
                    at_j = tl.sum(tl.where(offs_j[None, :] == jj, match.to(tl.int32), 0), axis=1) > 0
                    entry = offs_m.to(tl.int64) * top_k + jj
                    tl.store(
                        h_ptr + entry[:, None] * I + offs_n[None, :], hq, mask=at_j[:, None] & n_ok[None, :]
                    )
                    if A2_GROUP:
                        tl.store(hs_ptr + entry * tl.cdiv(I, 128) + g, hsc, mask=at_j)
                tl.debug_barrier()  # every thread's h store before the release
                tl.atomic_add(ready_ptr + s0, 1, sem="release", scope="gpu")

    # ------------------------------------------------------------------ phase B: down → out
    offs_kb = tl.arange(0, BLOCK_KB)
    first_col = (offs_m == 0)[:, None]
    for b in range(num_progs - 1 - pid, num_b, num_progs):
        u = b // (num_h * sb)
        hb = (b // sb) % num_h
        pb = b % sb
        kb_lo = pb * kb_span
        kb_hi = tl.minimum(kb_lo + kb_span, I)
        offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        h_ok = offs_h < H
        if u < n_local:
            s = _pick(offs, local & (local_rank == u))
            e = _pick(ent_e, offs == s)
            e64 = e.to(tl.int64)
            t = s // top_k
            s0 = tl.min(tl.where(local & (ent_e == e), offs, N_PAD), axis=0)  # the expert's owner
            w_ptrs = w2_ptr + e64 * stride_w2e + offs_h[:, None].to(tl.int64) * stride_w2n + offs_kb[None, :]
            if PREFETCH == 1:  # the weights do not depend on h: into L2 while this program waits
                row_ptrs = w2_ptr + e64 * stride_w2e + offs_h.to(tl.int64) * stride_w2n
                _prefetch_rows(row_ptrs, h_ok, kb_lo, kb_hi)
            ready = tl.atomic_add(ready_ptr + s0, 0, sem="acquire", scope="gpu")
            while ready < num_g:
                ready = tl.atomic_add(ready_ptr + s0, 0, sem="acquire", scope="gpu")
            if W_BLOCK:
                sw_ptrs = ws2_ptr + e64 * stride_w2se + (offs_h // 128) * stride_w2sn
            acc = tl.zeros([BLOCK_H, 16], dtype=tl.float32)
            for k0 in tl.range(kb_lo, kb_hi, BLOCK_KB, num_stages=STAGES_B):
                cols = k0 + offs_kb
                k_ok = cols < I
                hrow = tl.load(
                    h_ptr + s * I + cols[None, :] + offs_m[:, None] * 0,
                    mask=first_col & k_ok[None, :],
                    other=0.0,
                    cache_modifier=".cg",
                )  # [16, BLOCK_KB]: row 0 holds h, the others are zero
                wt = tl.load(w_ptrs + k0, mask=h_ok[:, None] & k_ok[None, :], other=0.0)
                if A2_GROUP or W_BLOCK:
                    d = tl.dot(wt, tl.trans(hrow))
                    if W_BLOCK:
                        d = d * tl.load(sw_ptrs + k0 // 128, mask=h_ok, other=0.0)[:, None]
                    if A2_GROUP:
                        d = d * tl.load(hs_ptr + s * tl.cdiv(I, 128) + k0 // 128, cache_modifier=".cg")
                    acc += d
                else:
                    acc = tl.dot(wt, tl.trans(hrow), acc, max_num_imprecise_acc=BLOCK_KB)
            coef = tl.load(topk_w_ptr + s) * routed_scaling
            if not A2_GROUP:
                coef = coef * tl.load(a2_ptr)
            if not W_BLOCK:
                coef = coef * tl.load(ws2_ptr + e64)
            yv = tl.sum(acc, axis=1) * coef  # columns 1.. are zero
            n_tok = _pick(n_local_tok, toks == t) * sb  # arrivals at the (token, H tile)
            if n_tok == 1:  # the token's only local slot, unsplit: its output tile, no partial rows
                tl.store(out_ptr + t * stride_out + offs_h, yv.to(out_ptr.dtype.element_ty), mask=h_ok)
            else:
                tl.store(y_ptr + (pb * n_entries + s) * H + offs_h, yv, mask=h_ok)
                tl.debug_barrier()  # every thread's row store before the arrival
                cnt = cnt_out_ptr + t * num_h + hb
                arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
                if arrived == n_tok - 1:
                    total = tl.zeros([BLOCK_H], dtype=tl.float32)
                    for j in range(0, top_k):  # slot order, then K split order: never arrival order
                        loc_j = _pick(local.to(tl.int32), offs == t * top_k + j) > 0
                        for pp in range(0, sb):
                            total += tl.load(
                                y_ptr + ((pp * n_entries + t * top_k + j) * H + offs_h),
                                mask=h_ok & loc_j,
                                other=0.0,
                                cache_modifier=".cg",
                            )
                    tl.store(out_ptr + t * stride_out + offs_h, total.to(out_ptr.dtype.element_ty), mask=h_ok)
                    tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
        elif pb == 0:  # a token without a local slot: zeros
            t = _pick(toks, zero_tok & (zero_rank == u - n_local))
            tl.store(
                out_ptr + t * stride_out + offs_h,
                tl.zeros([BLOCK_H], dtype=out_ptr.dtype.element_ty),
                mask=h_ok,
            )

    # ------------------------------------------------------------------ the last program resets
    tl.debug_barrier()
    finished = tl.atomic_add(done_ptr, 1, sem="acq_rel", scope="gpu")
    if finished == num_progs - 1:
        tl.store(ready_ptr + offs, tl.zeros([N_PAD], dtype=tl.int32), mask=offs < n_entries)
        tl.atomic_xchg(done_ptr, 0, sem="relaxed", scope="gpu")


__all__ = ["_persistent_moe_kernel"]
