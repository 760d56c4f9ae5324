"""Triton kernels of paged decode attention: the planner, the persistent attention pass, the merge.

Terms (README.md has the full picture):
- a *tile* is TILE consecutive tokens of one request's KV for one KV head; a *unit* is one tile of one
  (request b, KV head h) pair. Units are numbered request-major, then KV head, then tile, so the units
  of one (b, h) pair, its *segment*, are consecutive: req_start[b] + h * n_tiles(b) + t.
- every program p of the persistent grid owns the contiguous unit range [prog_start[p], prog_start[p+1]).
  Inside its range it walks segment by segment; a segment it covers whole is written to the output
  directly, a segment it covers only partly (at most the first and the last of its range) becomes a
  partial result (o normalised, lse in base 2) in workspace slot 2 * p + j, j = 0 for the first segment of
  its range and j = 1 for the last.
- the merge pass: for every split segment, the program that holds its last unit combines the partials of
  all programs that touched it by log-sum-exp.

Shapes: q [B, Hq, D]; k/v cache [num_pages, PAGE, Hkv, D] (any strides but the last, which is 1);
page_table [B, max_pages] int32; seq_lens [B] int32; Hq = Hkv * GROUP. All address math is int64.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


# B and G vary per step: specialising on them (== 1, multiple of 16) would compile the planner again
# for batches of a new kind while a server runs
@triton.jit(do_not_specialize=["B", "G"])
def plan_kernel(
    seq_lens_in_ptr,  # [B] int32, caller's tensor
    seq_lens_ptr,  # [max_batch] int32, plan's copy (what the attention pass reads)
    req_start_ptr,  # [max_batch + 1] int32: first unit of each request; req_start[B] = total units
    prog_start_ptr,  # [G + 1] int32: first unit of each program; prog_start[G] = total units
    prog_b_ptr,  # [G] int32: request of each program's first unit
    merge_first_ptr,  # [G] int32: first participant of the split segment p merges, -1 if none
    merge_bh_ptr,  # [G] int32: b * Hkv + h of that segment
    merge_seg_ptr,  # [G] int32: its first unit
    prog_desc_ptr,  # [G, 8] int32: u_begin, u_end, b, h, t0, n_tiles, seq_len of the first segment, 0
    req_cost_ptr,  # [max_batch + 1] int32: cost position where each request starts (dynamic schedule)
    wide_list_ptr,  # [W] int32: programs whose merge has more than BLOCK_P participants, then -1s
    bounds_ptr,  # [4, G + 1] int32: the candidate plan's boundaries (cost position, unit, request); [3, 0] kept
    region_ptr,  # [max_batch, 2] int32 (whole_below > 0): cost span [start, end) of each request's region
    B,
    G,
    splits,  # static schedule: programs per (request, KV head)
    seg_cost,  # dynamic schedule: cost of starting a segment, in tiles (0: balance tiles alone)
    whole_below,  # dynamic schedule: segments costing <= whole_below % of the share are never split (0: off)
    gate,  # whole_below: the whole-segment plan is kept only if no range exceeds (100 + gate) % of T / G
    W,  # slots of wide_list
    NUM_KV_HEADS: tl.constexpr,
    TILE: tl.constexpr,
    STATIC: tl.constexpr,  # False: dynamic (even share of all units); True: `splits` programs per (b, h)
    BLOCK_B: tl.constexpr,  # power of two >= B
    BLOCK_G: tl.constexpr,  # programs handled per step of the loops below (op.py: >= G + 1 up to 1024)
    G_STEPS: tl.constexpr,  # cdiv(G + 1, BLOCK_G)
    SEARCH_STEPS: tl.constexpr,  # ceil(log2(BLOCK_B)) + 1
    BLOCK_P: tl.constexpr,  # merges with more participants than this go to wide_list
    MERGE_IN_PASS: tl.constexpr = 0,  # > 0: split segments of at most this many programs merge in the pass
):
    # One program. Step 1: per-request unit counts and their prefix sum.
    offs_b = tl.arange(0, BLOCK_B)
    in_batch = offs_b < B
    lens = tl.load(seq_lens_in_ptr + offs_b, mask=in_batch, other=0)
    tl.store(seq_lens_ptr + offs_b, lens, mask=in_batch)
    n_tiles = tl.maximum((lens + TILE - 1) // TILE, 1)
    units = tl.where(in_batch, n_tiles * NUM_KV_HEADS, 0)
    ends = tl.cumsum(units, axis=0)
    total = tl.sum(units, axis=0)
    tl.store(req_start_ptr + offs_b + 1, ends, mask=in_batch)
    tl.store(req_start_ptr + offs_b * 0, ends * 0, mask=offs_b == 0)
    # cost positions (dynamic): a segment costs seg_cost + n_tiles; its first tile spans
    # [start, start + seg_cost + 1), tile t > 0 spans [start + seg_cost + t, ... + 1)
    costs = tl.where(in_batch, (n_tiles + seg_cost) * NUM_KV_HEADS, 0)
    cost_ends = tl.cumsum(costs, axis=0)
    total_cost = tl.sum(costs, axis=0)
    tl.store(req_cost_ptr + offs_b + 1, cost_ends, mask=in_batch)
    tl.store(req_cost_ptr + offs_b * 0, cost_ends * 0, mask=offs_b == 0)
    if not STATIC:
        if whole_below > 0:
            # regions: maximal runs of consecutive requests of one class (short: a segment costs at most
            # whole_below % of the share T / G; all KV heads of a request have the same length)
            short = _is_short(n_tiles + seg_cost, total_cost, G, whole_below)
            lens_prev = tl.load(seq_lens_in_ptr + offs_b - 1, mask=in_batch & (offs_b > 0), other=0)
            lens_next = tl.load(seq_lens_in_ptr + offs_b + 1, mask=offs_b + 1 < B, other=0)
            short_prev = _is_short(
                tl.maximum((lens_prev + TILE - 1) // TILE, 1) + seg_cost, total_cost, G, whole_below
            )
            short_next = _is_short(
                tl.maximum((lens_next + TILE - 1) // TILE, 1) + seg_cost, total_cost, G, whole_below
            )
            opens = in_batch & ((offs_b == 0) | (short != short_prev))
            closes = in_batch & ((offs_b == B - 1) | (short != short_next))
            r_start = tl.associative_scan(tl.where(opens, cost_ends - costs, 0), 0, _max_combine)
            r_end = tl.associative_scan(
                tl.where(closes, cost_ends, 2147483647), 0, _min_combine, reverse=True
            )
            tl.store(region_ptr + 2 * offs_b, r_start, mask=in_batch)
            tl.store(region_ptr + 2 * offs_b + 1, r_end, mask=in_batch)
    tl.debug_barrier()  # req_start / req_cost / region are read back below (global memory, same CTA)

    # Step 2: every program boundary, once: without whole_below the even split's (program p starts at the
    # first unit whose span starts at or after x = ceil(p T / G)) into prog_start / prog_b; with it the
    # whole-segment plan's (cost position, unit, request) into bounds, and the even split is searched only
    # where the gate (step 2b) refuses that plan: its search shares nothing with the other's.
    for step in range(G_STEPS):
        p = step * BLOCK_G + tl.arange(0, BLOCK_G)
        live = p <= G
        if not STATIC:
            if whole_below > 0:
                # region proportional: the region holding p gets programs P_r .. P_r+1 - 1, P_r =
                # round(region start * G / T), and its cost is split evenly over them; a boundary that
                # falls inside a short segment then moves to that segment's nearer end (start on a tie)
                y = _region_position(p, live, B, G, total_cost, req_cost_ptr, region_ptr, SEARCH_STEPS)
                b, h, off, tiles_b = _locate(
                    y, live, B, seg_cost, req_cost_ptr, seq_lens_ptr, TILE, SEARCH_STEPS
                )
                near = _is_short(tiles_b + seg_cost, total_cost, G, whole_below) & (y < total_cost)
                moved = tl.where(near, _nearer_end(off, tiles_b + seg_cost), off)
                _store_bounds(
                    bounds_ptr,
                    p,
                    live,
                    G,
                    y,
                    b,
                    h,
                    off,
                    moved,
                    tiles_b,
                    B,
                    total,
                    total_cost,
                    seg_cost,
                    req_start_ptr,
                )
            else:
                _even_boundaries(
                    p,
                    live,
                    G,
                    B,
                    total,
                    total_cost,
                    seg_cost,
                    req_cost_ptr,
                    seq_lens_ptr,
                    req_start_ptr,
                    prog_start_ptr,
                    prog_b_ptr,
                    TILE,
                    SEARCH_STEPS,
                )
        else:
            # static split-k: program p = (b, h, s); s-th of `splits` equal chunks of the segment
            per_req = NUM_KV_HEADS * splits
            b_u = tl.minimum(p // per_req, B - 1)
            rem = p - b_u * per_req
            h = rem // splits
            s = rem - h * splits
            lens_b = tl.load(seq_lens_in_ptr + b_u, mask=live, other=1)
            tiles_b = tl.maximum((lens_b + TILE - 1) // TILE, 1)
            chunk = (tiles_b + splits - 1) // splits
            seg_start = tl.load(req_start_ptr + b_u, mask=live, other=0) + h * tiles_b
            u = seg_start + tl.minimum(s * chunk, tiles_b)
            u = tl.where(p >= G, total, u)
            tl.store(prog_start_ptr + p, u, mask=live)
            tl.store(prog_b_ptr + p, b_u, mask=p < G)
        if MERGE_IN_PASS > 0:
            # arrival counters and participant counts start at 0 every plan (step 3 fills the counts)
            tl.store(prog_desc_ptr + 8 * G + p, p * 0, mask=p < G)
            tl.store(prog_desc_ptr + 9 * G + p, p * 0, mask=p < G)
    tl.debug_barrier()  # bounds is read back below

    # Step 2b (whole_below): the whole-segment plan is kept only if no program's cost-axis range exceeds
    # (100 + gate) % of the even share T / G; else the even split runs.
    if not STATIC:
        if whole_below > 0:
            heaviest = total * 0
            for step in range(G_STEPS):
                p = step * BLOCK_G + tl.arange(0, BLOCK_G)
                live = p < G
                y0 = tl.load(bounds_ptr + p, mask=live, other=0)
                y1 = tl.load(bounds_ptr + p + 1, mask=live, other=0)
                heaviest = tl.maximum(heaviest, tl.max(tl.where(live, y1 - y0, 0), axis=0))
            keep = heaviest.to(tl.int64) * G * 100 <= (100 + gate) * total_cost.to(tl.int64)
            tl.store(bounds_ptr + 3 * (G + 1), keep.to(tl.int32))
            if keep:
                for step in range(G_STEPS):
                    p = step * BLOCK_G + tl.arange(0, BLOCK_G)
                    live = p <= G
                    u_c = tl.load(bounds_ptr + (G + 1) + p, mask=live, other=0)
                    b_c = tl.load(bounds_ptr + 2 * (G + 1) + p, mask=live, other=0)
                    tl.store(prog_start_ptr + p, u_c, mask=live)
                    tl.store(prog_b_ptr + p, b_c, mask=p < G)
            else:  # refused: the even split, which step 2 left out
                for step in range(G_STEPS):
                    p = step * BLOCK_G + tl.arange(0, BLOCK_G)
                    _even_boundaries(
                        p,
                        p <= G,
                        G,
                        B,
                        total,
                        total_cost,
                        seg_cost,
                        req_cost_ptr,
                        seq_lens_ptr,
                        req_start_ptr,
                        prog_start_ptr,
                        prog_b_ptr,
                        TILE,
                        SEARCH_STEPS,
                    )
            tl.debug_barrier()  # prog_start / prog_b are read back below

    # Step 3: merge duty. Program p merges the segment its range starts in when that segment began in
    # an earlier program (split) and ends inside p's range (p is its last participant).
    n_wide = total * 0
    run_carry = total * 0 - 1
    busy_carry = total * 0  # non-empty ranges before this step (MERGE_IN_PASS)
    for step in range(G_STEPS):
        p = step * BLOCK_G + tl.arange(0, BLOCK_G)
        live = p < G
        u_b = tl.load(prog_start_ptr + p, mask=live, other=0)
        u_e = tl.load(prog_start_ptr + p + 1, mask=live, other=0)
        b = tl.load(prog_b_ptr + p, mask=live, other=0)
        h, t0, tiles_b, lens_b = _range_head(u_b, b, live, req_start_ptr, seq_lens_ptr, TILE)
        seg_start = u_b - t0
        duty = live & (u_b < u_e) & (t0 > 0) & (seg_start + tiles_b <= u_e)
        if STATIC:
            first = (b * NUM_KV_HEADS + h) * splits
        else:
            # the first participant of the segment p's range starts in is the last program whose range
            # starts at or before the segment's first unit. The programs starting inside the segment (t0 > 0)
            # are consecutive, p among them: the first participant is the one before the first of them.
            # Found by a running max over the programs (units and segments are ordered), for any plan.
            prev = tl.maximum(p - 1, 0)
            has_prev = live & (p > 0)
            u_p = tl.load(prog_start_ptr + prev, mask=has_prev, other=0)
            b_p = tl.load(prog_b_ptr + prev, mask=has_prev, other=0)
            h_p, t0_p, _, _ = _range_head(u_p, b_p, has_prev, req_start_ptr, seq_lens_ptr, TILE)
            inside_prev = has_prev & (b_p == b) & (h_p == h) & (t0_p > 0)
            opens_run = live & (t0 > 0) & (inside_prev == 0)
            run = tl.associative_scan(tl.where(opens_run, p, -1), 0, _max_combine)
            run = tl.maximum(run, run_carry)
            run_carry = tl.max(run, axis=0)
            first = run - 1
        if MERGE_IN_PASS > 0:
            # split segments of at most MERGE_IN_PASS programs are merged inside the attention pass by the
            # participant that arrives last (kernel._arrive_and_merge), the merge launches skip them
            in_pass = duty & (p - first + 1 <= MERGE_IN_PASS)
            busy_carry = _plan_merge_in_pass(
                prog_desc_ptr, p, live, G, u_b, u_e, t0, first, in_pass, busy_carry
            )
            duty = duty & (in_pass == 0)
        tl.store(merge_first_ptr + p, tl.where(duty, first, -1), mask=live)
        # compact list of the programs whose merge has more than BLOCK_P participants (at most one such
        # segment per BLOCK_P programs, so W = G // BLOCK_P + 1 slots hold them all)
        wide = duty & (p - first + 1 > BLOCK_P)
        slot = n_wide + tl.cumsum(wide.to(tl.int32), axis=0) - 1
        tl.store(wide_list_ptr + slot, p, mask=wide)
        n_wide += tl.sum(wide.to(tl.int32), axis=0)
        tl.store(merge_bh_ptr + p, b * NUM_KV_HEADS + h, mask=live)
        tl.store(merge_seg_ptr + p, seg_start, mask=live)
        # descriptor of the program's first segment: one 32-byte load in the attention pass instead of the
        # chain range -> request -> request start / length
        desc = prog_desc_ptr + p * 8
        tl.store(desc, u_b, mask=live)
        tl.store(desc + 1, u_e, mask=live)
        tl.store(desc + 2, b, mask=live)
        tl.store(desc + 3, h, mask=live)
        tl.store(desc + 4, t0, mask=live)
        tl.store(desc + 5, tiles_b, mask=live)
        tl.store(desc + 6, lens_b, mask=live)
        if MERGE_IN_PASS == 0:
            tl.store(desc + 7, u_b * 0, mask=live)
    for w0 in range(0, W, BLOCK_G):
        k = w0 + tl.arange(0, BLOCK_G)
        tl.store(wide_list_ptr + k, k * 0 - 1, mask=(k >= n_wide) & (k < W))


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b)


@triton.jit
def _even_boundaries(
    p,
    live,
    G,
    B,
    total,
    total_cost,
    seg_cost,
    req_cost_ptr,
    seq_lens_ptr,
    req_start_ptr,
    prog_start_ptr,
    prog_b_ptr,
    TILE: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
):
    """The even split's boundaries p (program p starts at the first unit whose span starts at or after
    x = ceil(p T / G)) into prog_start / prog_b; returns x and the segment holding it (_locate)."""
    x = ((p.to(tl.int64) * total_cost + G - 1) // G).to(tl.int32)
    b, h, off, tiles_b = _locate(x, live, B, seg_cost, req_cost_ptr, seq_lens_ptr, TILE, SEARCH_STEPS)
    u, b_u = _unit_at(x, b, h, off, tiles_b, live, B, total, total_cost, seg_cost, req_start_ptr)
    tl.store(prog_start_ptr + p, u, mask=live)
    tl.store(prog_b_ptr + p, b_u, mask=p < G)
    return x, b, h, off, tiles_b


@triton.jit
def _store_bounds(
    bounds_ptr, p, live, G, y, b, h, off, moved, tiles_b, B, total, total_cost, seg_cost, req_start_ptr
):
    """The candidate plan's boundary p: cost position y moved from offset off to ``moved`` inside its segment
    (b, h), as (cost position, unit, request) into bounds[0..2, p]."""
    u_c, b_c = _unit_at(y, b, h, moved, tiles_b, live, B, total, total_cost, seg_cost, req_start_ptr)
    tl.store(bounds_ptr + p, y - off + moved, mask=live)
    tl.store(bounds_ptr + (G + 1) + p, u_c, mask=live)
    tl.store(bounds_ptr + 2 * (G + 1) + p, b_c, mask=live)


@triton.jit
def _plan_merge_in_pass(prog_desc_ptr, p, live, G, u_b, u_e, t0, first, in_pass, busy_carry):
    """Planner bookkeeping of the in-pass merge for programs p (one step of step 3's loop); returns the
    running count of non-empty ranges. The rows after prog_desc's G descriptors (int32, G each):
    8G + i: arrival counter of the split segment whose first participant is program i (0 between calls);
    9G + i: its participant count (non-empty ranges among programs first .. last) if it is merged in the
    pass, else 0; 10G + i: its last participant; 11G + i: non-empty ranges among programs 0 .. i (scratch).
    Descriptor word 7 of program p: the counter a piece of p's *first* segment arrives at (the segment's first
    participant where p starts inside it, else p); a piece of any later segment of p's range is p's own."""
    busy = live & (u_b < u_e)
    upto = busy_carry + tl.cumsum(busy.to(tl.int32), axis=0)
    tl.store(prog_desc_ptr + 11 * G + p, upto, mask=live)
    tl.store(prog_desc_ptr + p * 8 + 7, tl.where(t0 > 0, first, p), mask=live)
    tl.debug_barrier()  # upto of the first participants (this step or an earlier one) is read back
    upto_first = tl.load(prog_desc_ptr + 11 * G + first, mask=in_pass, other=0)
    # first participant: busy (it holds the segment's first unit), counted in upto_first
    tl.store(prog_desc_ptr + 9 * G + first, upto - upto_first + 1, mask=in_pass)
    tl.store(prog_desc_ptr + 10 * G + first, p, mask=in_pass)
    return busy_carry + tl.sum(busy.to(tl.int32), axis=0)


@triton.jit
def _is_short(seg_len, total_cost, G, whole_below):
    """A segment of cost seg_len is short (never split with whole_below) if it costs at most whole_below %
    of the even share T / G (integer test: 100 G seg_len <= whole_below T)."""
    return seg_len.to(tl.int64) * G * 100 <= whole_below * total_cost.to(tl.int64)


@triton.jit
def _locate(x, live, B, seg_cost, req_cost_ptr, seq_lens_ptr, TILE: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    """The segment holding cost position x: (request b, KV head h, offset of x from the segment's start,
    tiles of b). x >= T lands past the last segment (offset = the segment's cost or more)."""
    # largest b < B with req_cost[b] <= x (binary search, vectorised over programs)
    lo = tl.zeros_like(x)
    hi = tl.zeros_like(x) + B
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        start = tl.load(req_cost_ptr + mid, mask=live & (hi - lo > 1), other=0)
        go_up = (hi - lo > 1) & (start <= x)
        go_down = (hi - lo > 1) & (start > x)
        lo = tl.where(go_up, mid, lo)
        hi = tl.where(go_down, mid, hi)
    b = lo
    lens_b = tl.load(seq_lens_ptr + b, mask=live, other=1)
    tiles_b = tl.maximum((lens_b + TILE - 1) // TILE, 1)
    local = x - tl.load(req_cost_ptr + b, mask=live, other=0)
    h = local // (tiles_b + seg_cost)
    return b, h, local - h * (tiles_b + seg_cost), tiles_b


@triton.jit
def _unit_at(x, b, h, off, tiles_b, live, B, total, total_cost, seg_cost, req_start_ptr):
    """The first unit whose span starts at or after cost offset off of segment (b, h), and its request
    (a boundary at a segment's end is the next segment's first unit); x >= T: past the last unit."""
    t = tl.where(off == 0, 0, tl.minimum(tl.maximum(off - seg_cost, 1), tiles_b))
    u = tl.load(req_start_ptr + b, mask=live, other=0) + h * tiles_b + t
    u = tl.where(x >= total_cost, total, u)
    # t == tiles_b of the last KV head is the next request's first unit
    nxt = tl.load(req_start_ptr + b + 1, mask=live, other=0)
    return u, tl.where((u >= nxt) & (b + 1 < B), b + 1, b)


@triton.jit
def _region_position(p, live, B, G, total_cost, req_cost_ptr, region_ptr, SEARCH_STEPS: tl.constexpr):
    """Cost position of boundary p with whole_below: region r (cost span [a, e)) owns the programs
    P_r = round(a G / T) .. round(e G / T) - 1 and boundary p of them sits at a + ceil((p - P_r)(e - a) / k),
    k = its program count. p belongs to the region of the last request b with 2 G req_cost[b] < (2p + 1) T
    (i.e. round(req_cost[b] G / T) <= p); boundary 0 is 0, boundary G is T. A region with no program
    (round(a G / T) = round(e G / T)) is held by the program before it."""
    T64 = total_cost.to(tl.int64)
    lim = (2 * p.to(tl.int64) + 1) * T64
    lo = tl.zeros_like(p)
    hi = tl.zeros_like(p) + B
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        start = tl.load(req_cost_ptr + mid, mask=live & (hi - lo > 1), other=0)
        go_up = (hi - lo > 1) & (2 * start.to(tl.int64) * G < lim)
        go_down = (hi - lo > 1) & (2 * start.to(tl.int64) * G >= lim)
        lo = tl.where(go_up, mid, lo)
        hi = tl.where(go_down, mid, hi)
    a = tl.load(region_ptr + 2 * lo, mask=live, other=0).to(tl.int64)
    e = tl.load(region_ptr + 2 * lo + 1, mask=live, other=0).to(tl.int64)
    p_a = (2 * a * G + T64) // (2 * T64)
    p_e = (2 * e * G + T64) // (2 * T64)
    k = tl.maximum(p_e - p_a, 1)
    y = a + ((p - p_a) * (e - a) + k - 1) // k
    # boundary 0 is 0 even where the first regions get no program of their own (program 0 then holds them)
    return tl.where(p >= G, T64, tl.where(p == 0, 0, y)).to(tl.int32)


@triton.jit
def _range_head(u, b, live, req_start_ptr, seq_lens_ptr, TILE: tl.constexpr):
    """(KV head, tile in segment, tiles per segment, length) of unit u of request b."""
    lens_b = tl.load(seq_lens_ptr + b, mask=live, other=1)
    tiles_b = tl.maximum((lens_b + TILE - 1) // TILE, 1)
    local = u - tl.load(req_start_ptr + b, mask=live, other=0)
    h = local // tiles_b
    return h, local - h * tiles_b, tiles_b, lens_b


@triton.jit
def _nearer_end(off, seg_len):
    """The nearer end of a segment of cost seg_len from offset off: its start (0; also on a tie) or end."""
    return tl.where((off > 0) & (seg_len - off < off), seg_len, tl.where(off > 0, 0, off))


@triton.jit
def _tile_pages(pt_row, t, t_end, seq_len, TILE: tl.constexpr, PAGE: tl.constexpr):
    """Page ids of tile t (0 for tiles >= t_end and tokens >= seq_len): a scalar when a tile lies inside
    one page (PAGE a multiple of TILE), else one per token [TILE]."""
    if PAGE >= TILE:
        return tl.load(pt_row + (t * TILE) // PAGE, mask=t < t_end, other=0)
    else:
        tok = t * TILE + tl.arange(0, TILE)
        return tl.load(pt_row + tok // PAGE, mask=(t < t_end) & (tok < seq_len), other=0)


@triton.jit
def _chunk_pages(pt_row, c0, t1, seq_len, TILE: tl.constexpr, PAGE: tl.constexpr, PT_CHUNK: tl.constexpr):
    """The page ids of tiles c0 .. c1 - 1, c1 = min(c0 + PT_CHUNK, t1), in one vector load before the tile loop
    (so no load feeds the K/V addresses inside it): one per tile (PAGE >= TILE) or two (TILE == 2 * PAGE:
    tokens [0, PAGE) and [PAGE, TILE)). Returns (page ids, c1)."""
    c1 = tl.minimum(c0 + PT_CHUNK, t1)
    if PAGE >= TILE:
        offs = tl.arange(0, PT_CHUNK)
        pgs = tl.load(pt_row + ((c0 + offs) * TILE) // PAGE, mask=(c0 + offs) < c1, other=0)
    else:
        col = 2 * c0 + tl.arange(0, 2 * PT_CHUNK)  # page column of each half tile
        pgs = tl.load(pt_row + col, mask=(col < 2 * c1) & (col * PAGE < seq_len), other=0)
    return pgs, c1


@triton.jit
def _chunk_tile_page(pgs, t, c0, TILE: tl.constexpr, PAGE: tl.constexpr, PT_CHUNK: tl.constexpr):
    """Tile t's page id out of its chunk's ``_chunk_pages``: a scalar (PAGE >= TILE) or, for two half-tile
    pages, one per token row [TILE]."""
    if PAGE >= TILE:
        pg = tl.sum(tl.where(tl.arange(0, PT_CHUNK) == t - c0, pgs, 0), axis=0)
    else:
        offs = tl.arange(0, 2 * PT_CHUNK)
        pg_lo = tl.sum(tl.where(offs == 2 * (t - c0), pgs, 0), axis=0)
        pg_hi = tl.sum(tl.where(offs == 2 * (t - c0) + 1, pgs, 0), axis=0)
        pg = tl.where(tl.arange(0, TILE) < PAGE, pg_lo, pg_hi)
    return pg


@triton.jit
def _tile_rows(pages, t, stride_p, stride_s, TILE: tl.constexpr, PAGE: tl.constexpr):
    """int64 element offsets [TILE] of the tile's token rows (head offset excluded)."""
    tok = t * TILE + tl.arange(0, TILE)
    slot = (tok % PAGE).to(tl.int64)
    return pages.to(tl.int64) * stride_p + slot * stride_s


@triton.jit
def _load_q(q_ptr, b, h, rows, row_ok, offs_d, stride_qb, stride_qh, live, GROUP: tl.constexpr):
    """q rows of KV head h of request b: [GROUP_PAD, D], rows past the group (or all, if not live) 0."""
    q_rows = h.to(tl.int64) * GROUP + rows
    return tl.load(
        q_ptr + b.to(tl.int64) * stride_qb + q_rows[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & live,
        other=0.0,
    )


@triton.jit
def _q_as_f16(q):
    """q [R, D] (bf16) as fp16 scaled by a power of two so that max |q| lands in [2^13, 2^15): fp16's
    11-bit significand holds every bf16 value of that range exactly (fp8 K/V convert to fp16 exactly and
    more cheaply than to bf16 on SM90). Returns (q16, 1 / scale) for the logit scale."""
    amax = tl.max(tl.max(tl.abs(q.to(tl.float32)), axis=1), axis=0)
    shift = tl.floor(13.0 - tl.log2(tl.maximum(amax, 1e-30)))
    scale = tl.exp2(shift)
    return (q.to(tl.float32) * scale).to(tl.float16), tl.exp2(-shift)


@triton.jit
def _attend(q, k, v, valid, m_i, l_i, acc, qk_scale):
    """One online-softmax step over a tile: q [R, D], k/v [TILE, D] (any dtype, cast to q's), valid
    [TILE]; m_i/l_i [R] running max / sum (log2 domain), acc [R, D] fp32."""
    s = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale  # [R, TILE], log2 units
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # empty request: keep exp2 finite
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
    return m_new, l_i, acc


@triton.jit
def _load_v_f16(v_head, rows, offs_d2, valid, ASM: tl.constexpr, RANK3: tl.constexpr = False):
    """fp8 e4m3 V rows of a tile as fp16 [TILE, D] (exact), read as int16 pairs (2 e4m3 each, the lower
    address in the low byte; V's strides and base are even, checked by op.py). Converting here, on the
    row-major tile, with a join/reshape between the conversion and the P.V product keeps Triton from
    moving the conversion behind the operand load: the product then reads fp16 through ldmatrix.trans
    instead of gathering single e4m3 bytes from shared memory into the transposed operand layout
    (64 one-byte shared loads per thread per 64-token tile, 224 registers; 160 this way, offline sm_90a).
    ASM: one cvt.rn.f16x2.e4m3x2 per pair (GPU); else the same conversion in Triton ops (interpreter).
    RANK3: rows / valid are [W, TILE / W] (the warp-split loop) and the result is [W, TILE / W, D]."""
    base = v_head.to(tl.pointer_type(tl.int16), bitcast=True)
    if RANK3:
        x = tl.load(base + (rows // 2)[:, :, None] + offs_d2[None, None, :], mask=valid[:, :, None], other=0)
    else:
        x = tl.load(base + (rows // 2)[:, None] + offs_d2[None, :], mask=valid[:, None], other=0)
    if ASM:
        pair = tl.inline_asm_elementwise(
            asm="cvt.rn.f16x2.e4m3x2 $0, $1;",
            constraints="=r,h",
            args=[x],
            dtype=tl.int32,
            is_pure=True,
            pack=1,
        )
        lo = (pair & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
        hi = ((pair >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    else:
        lo = (x & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        hi = ((x >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    if RANK3:
        v = tl.reshape(tl.join(lo, hi), [x.shape[0], x.shape[1], 2 * x.shape[2]])
    else:
        v = tl.reshape(tl.join(lo, hi), [x.shape[0], 2 * x.shape[1]])
    return v


@triton.jit
def _attend_split(q3, k, v, valid, m3, l3, acc3, qk_scale):
    """_attend with the tile's tokens split over W warps: q3 [W, R, D] (q broadcast), k/v [W, TILE / W, D],
    valid [W, TILE / W]; every warp keeps its own running max / sum / accumulator ([W, R], [W, R, D]), so
    the row max and sum are reductions inside a warp (no shared memory, no barrier) and P stays in
    registers between the two products. _combine_split merges the W states once per segment."""
    s = tl.dot(q3, tl.trans(k.to(q3.dtype), (0, 2, 1))) * qk_scale  # [W, R, TILE / W]
    s = tl.where(valid[:, None, :], s, float("-inf"))
    m_new = tl.maximum(m3, tl.max(s, axis=2))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m3 - m_use)
    p = tl.exp2(s - m_use[:, :, None])
    l3 = l3 * alpha + tl.sum(p, axis=2)
    acc3 = acc3 * alpha[:, :, None] + tl.dot(p.to(q3.dtype), v.to(q3.dtype))
    return m_new, l3, acc3


@triton.jit
def _combine_split(m3, l3, acc3):
    """(m, l, acc) of a segment from the per-warp states of _attend_split: [R], [R], [R, D]."""
    m_i = tl.max(m3, axis=0)
    m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
    w = tl.exp2(m3 - m_use[None, :])  # [W, R]; 0 for a warp that saw no token
    return m_i, tl.sum(l3 * w, axis=0), tl.sum(acc3 * w[:, :, None], axis=0)


@triton.jit
def _finish(
    out_ptr,
    ws_o_ptr,
    ws_lse_ptr,
    b64,
    q_rows,
    rows,
    row_ok,
    offs_d,
    m_i,
    l_i,
    acc,
    v_scale,
    complete,
    slot,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Write a finished segment: the output rows if the program covered it whole, else a partial
    (o normalised, lse in base 2) into workspace slot ``slot``."""
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc * (v_scale / l_safe)[:, None]
    if complete:
        tl.store(
            out_ptr + b64 * stride_ob + q_rows[:, None] * stride_oh + offs_d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )
    else:
        slot_id = slot.to(tl.int64)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(
            ws_o_ptr + (slot_id * GROUP + rows)[:, None] * HEAD_DIM + offs_d[None, :],
            o,
            mask=row_ok[:, None],
        )
        tl.store(ws_lse_ptr + slot_id * GROUP + rows, lse, mask=row_ok)


@triton.jit
def _arrive_and_merge(
    prog_desc_ptr,
    ws_o_ptr,
    ws_lse_ptr,
    out_ptr,
    pid,
    complete,
    first_seg,
    desc_first,
    seg_start,
    b64,
    q_rows,
    rows,
    row_ok,
    offs_d,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """After ``_finish`` wrote a segment not ``complete`` (a partial of a split segment): if the planner marked it
    for the in-pass merge, count this piece in (``atom.acq_rel.gpu``: the release publishes the partial, the
    acquire makes the others' visible) and, if it is the last to arrive, merge all participants' partials into
    ``out`` now and reset the counter for the next call. ``first_seg``: the piece is the range's first segment
    (its counter is then descriptor word 7, ``desc_first``, else the program's own); ``seg_start``: the
    segment's first unit. Rows after the descriptors: ``plan_kernel``'s ``_plan_merge_in_pass``. What the merge
    needs of the planner (participant count, last participant, the first participant's range start) is loaded
    at once, before the atomic."""
    G = tl.num_programs(0)
    cidx = tl.where(first_seg, desc_first, pid)
    mip = prog_desc_ptr + 8 * G
    marked = complete == 0
    need = tl.load(mip + G + cidx, mask=marked, other=0)
    last = tl.load(mip + 2 * G + cidx, mask=marked, other=0)
    lo_start = tl.load(prog_desc_ptr + cidx * 8, mask=marked, other=0)
    if need > 0:
        tl.debug_barrier()  # every thread's partial stores happen before the release below
        old = tl.atomic_add(mip + cidx, 1, sem="acq_rel", scope="gpu")
        if old == need - 1:
            _merge_partials(
                prog_desc_ptr,
                ws_o_ptr,
                ws_lse_ptr,
                out_ptr,
                cidx,
                last,
                # the first participant's piece is its range's last segment (slot 2 lo + 1) when its range
                # starts before the segment, else its first (2 lo); every later participant's is its first
                2 * cidx + (lo_start < seg_start).to(tl.int32),
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
            tl.store(mip + cidx, 0)  # the segment is merged: every piece has arrived, the count starts over


@triton.jit
def _merge_partials(
    prog_desc_ptr,
    ws_o_ptr,
    ws_lse_ptr,
    out_ptr,
    lo,
    hi,
    lo_slot,
    b64,
    q_rows,
    rows,
    row_ok,
    offs_d,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CHUNK: tl.constexpr = 3,
):
    """The log-sum-exp merge of one segment, all query rows and columns at once, over the partials of programs
    ``lo`` .. ``hi`` in program order (slot ``lo_slot`` for ``lo``, 2k for every later k), in one pass with a
    running maximum: a participant's weight is 2^(lse - running max), and when the maximum grows, the sums so
    far are rescaled by 2^(old - new). Unrolled CHUNK participants per step with no load depending on another:
    their descriptors (an empty range wrote no partial: its stale slot is read, then replaced by lse -inf and
    o 0), lse and partials are all in flight together, about one L2 round trip per chunk (a loop of dependent
    descriptor -> slot -> partial loads, twice over, paid two per participant).

    Arithmetic against merge_kernel (one step over up to BLOCK_P = 16 participants: maximum lse, weights
    2^(lse - max), weighted sum / sum of weights): with two participants the same numbers (the first's weight
    enters as the rescale 2^(lse_0 - max) of its weight-1 term: 1 * s = s and o * s exactly as there), so
    bitwise equal; with n more, each growth of the running maximum rounds the sums' rescale once (one exp2
    and one product, the same factor on both sums: the weights of the weighted average move by about 2^-23
    each time) and the sums run in another order, so the result moves by at most about 3 n 2^-24 max_k |o_k|
    (|o_k| <= v_scale max |V|, a partial is a convex combination of V rows);
    tests/kernels/decode_attention/test_merge.py asserts (n + 2) 2^-22 v_scale max |V| plus one bf16 unit.
    Partials are read through L2 (``.cg``): other programs wrote them during this pass."""
    m_run = tl.full(rows.shape, float("-inf"), dtype=tl.float32)
    w_sum = tl.zeros(rows.shape, dtype=tl.float32)
    acc = tl.zeros([rows.shape[0], HEAD_DIM], dtype=tl.float32)
    rows_in = tl.minimum(rows, GROUP - 1)  # rows past the group read the last row again (never stored)
    lses, os_ = _load_chunk(
        prog_desc_ptr, ws_o_ptr, ws_lse_ptr, lo, lo, hi, lo_slot, rows_in, offs_d, GROUP, HEAD_DIM, CHUNK
    )
    for c0 in range(lo, hi + 1, CHUNK):
        # the next chunk's loads go out before this chunk's arithmetic (past hi: masked, no traffic)
        lses_n, os_n = _load_chunk(
            prog_desc_ptr,
            ws_o_ptr,
            ws_lse_ptr,
            c0 + CHUNK,
            lo,
            hi,
            lo_slot,
            rows_in,
            offs_d,
            GROUP,
            HEAD_DIM,
            CHUNK,
        )
        m_new = m_run
        for i in tl.static_range(CHUNK):
            m_new = tl.maximum(m_new, lses[i])
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        scale_old = tl.exp2(m_run - m_use)
        acc = acc * scale_old[:, None]
        w_sum = w_sum * scale_old
        for i in tl.static_range(CHUNK):
            w = tl.exp2(lses[i] - m_use)  # 0 where nothing was written
            acc += tl.where(w[:, None] > 0.0, w[:, None] * os_[i], 0.0)  # an old slot may hold NaN
            w_sum += w
        m_run = m_new
        lses = lses_n
        os_ = os_n
    res = acc / tl.where(w_sum > 0.0, w_sum, 1.0)[:, None]
    tl.store(
        out_ptr + b64 * stride_ob + q_rows[:, None] * stride_oh + offs_d[None, :],
        res.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


@triton.jit
def _load_chunk(
    prog_desc_ptr,
    ws_o_ptr,
    ws_lse_ptr,
    c0,
    lo,
    hi,
    lo_slot,
    rows_in,
    offs_d,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """The partials of participants c0 .. c0 + CHUNK - 1 of ``_merge_partials`` as two tuples: lse ([rows], -inf
    where the participant is past ``hi`` or its range is empty: it wrote nothing) and o ([rows, D], as read: an
    old slot's values, weight 0). No load depends on another's value."""
    lses = ()
    os_ = ()
    for i in tl.static_range(CHUNK):
        k = c0 + i
        live = k <= hi
        k_start = tl.load(prog_desc_ptr + k * 8, mask=live, other=0)
        k_end = tl.load(prog_desc_ptr + k * 8 + 1, mask=live, other=0)
        idx = tl.where(k == lo, lo_slot, 2 * k).to(tl.int64) * GROUP + rows_in
        lse = tl.load(ws_lse_ptr + idx, mask=live, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(
            ws_o_ptr + idx[:, None] * HEAD_DIM + offs_d[None, :], mask=live, other=0.0, cache_modifier=".cg"
        )
        lses = lses + (tl.where(k_end > k_start, lse, float("-inf")),)
        os_ = os_ + (o,)
    return lses, os_


@triton.jit
def _range_desc(prog_desc_ptr, pid):
    """Program ``pid``'s range and first segment from the planner's descriptor in one 32-byte load:
    (u_begin, u_end, b, h, t0, n_tiles, seq_len)."""
    j = tl.arange(0, 8)
    d = tl.load(prog_desc_ptr + pid * 8 + j)
    u_begin = tl.sum(tl.where(j == 0, d, 0), axis=0)
    u_end = tl.sum(tl.where(j == 1, d, 0), axis=0)
    b = tl.sum(tl.where(j == 2, d, 0), axis=0)
    h = tl.sum(tl.where(j == 3, d, 0), axis=0)
    t0 = tl.sum(tl.where(j == 4, d, 0), axis=0)
    n_tiles = tl.sum(tl.where(j == 5, d, 0), axis=0)
    seq_len = tl.sum(tl.where(j == 6, d, 0), axis=0)
    return u_begin, u_end, b, h, t0, n_tiles, seq_len


@triton.jit
def _next_segment(b, h, num_kv_heads, seg_start, t1, u_end, seq_lens_ptr, seq_len):
    """The segment after (b, h) in a range that goes on to unit ``u_end`` — (b, h + 1) or (b + 1, 0), from its
    first tile —, whether there is one (``more``: this segment, units from ``seg_start`` to tile ``t1``, ends
    before ``u_end``), and its length (loaded only when it starts a new request): (b_n, h_n, more, seq_len_n)."""
    new_req = h + 1 >= num_kv_heads
    b_n = tl.where(new_req, b + 1, b)
    h_n = tl.where(new_req, 0, h + 1)
    more = seg_start + t1 < u_end
    seq_len_n = tl.load(seq_lens_ptr + b_n, mask=more & new_req, other=seq_len)
    return b_n, h_n, more, seq_len_n


@triton.jit(do_not_specialize=["num_kv_heads"])  # one compile serves every head count
def decode_kernel(
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
    GROUP_PAD: tl.constexpr,  # >= 16 and a power of two (tl.dot needs 16 rows)
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    TILE: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    SCALES_FROM_PTR: tl.constexpr,
    PT_CHUNK: tl.constexpr,  # PAGE >= TILE or == TILE/2: page ids of PT_CHUNK tiles loaded ahead
    F16_DOT: tl.constexpr = False,  # fp8 KV: products in fp16 (q rescaled by a power of two)
    ASM_CVT: tl.constexpr = False,  # F16_DOT: V's e4m3 -> fp16 by inline PTX (False under the interpreter)
    PDL: tl.constexpr = False,  # let the merge grid launch now (programmatic dependent launch, SM90)
    WARP_SPLIT: tl.constexpr = 0,  # > 0 (PT_CHUNK, PAGE >= TILE): the tile's tokens split over this many warps
    MERGE_IN_PASS: tl.constexpr = False,  # split segments the planner marked are merged here (_arrive_and_merge)
):
    if PDL:
        # every program of the persistent grid is resident from the start: the merge launch may begin
        # as soon as all of them got here; its programs wait (griddepcontrol.wait) before reading partials
        gdc_launch_dependents()
    pid = tl.program_id(0)
    # the next segment of a range is always (b, h + 1) or (b + 1, 0) from its first tile, so no
    # request-start lookups are needed at all
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
    offs_n = tl.arange(0, TILE)

    # the q rows of the range's first segment; later segments' rows (and lengths) are loaded one
    # segment ahead, so a program walking many short segments does not wait for them each time
    q_next = _load_q(q_ptr, b, h, rows, row_ok, offs_d, stride_qb, stride_qh, u_begin < u_end, GROUP)
    u = u_begin
    while u < u_end:
        seg_start = u - t0
        t1 = tl.minimum(n_tiles, u_end - seg_start)

        b64 = b.to(tl.int64)
        h64 = h.to(tl.int64)
        q_rows = h64 * GROUP + rows
        q = q_next
        b_n, h_n, more, seq_len_n = _next_segment(
            b, h, num_kv_heads, seg_start, t1, u_end, seq_lens_ptr, seq_len
        )
        q_next = _load_q(q_ptr, b_n, h_n, rows, row_ok, offs_d, stride_qb, stride_qh, more, GROUP)
        seg_scale = qk_scale
        if F16_DOT:
            q, q_unscale = _q_as_f16(q)
            seg_scale = qk_scale * q_unscale
        m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
        pt_row = page_table_ptr + b64 * stride_ptb
        k_head = k_ptr + h64 * stride_kh
        v_head = v_ptr + h64 * stride_vh

        if WARP_SPLIT > 0:
            # (op.py: PAGE >= TILE, TILE / WARP_SPLIT >= 16) the page ids of PT_CHUNK tiles per
            # load as below; warp w takes tokens [w * TW, (w + 1) * TW) of every tile with its own online
            # softmax state, merged once at the segment's end
            TW: tl.constexpr = TILE // WARP_SPLIT
            offs_w = tl.arange(0, WARP_SPLIT)[:, None] * TW + tl.arange(0, TW)[None, :]  # [W, TW]
            q3 = tl.broadcast_to(q[None, :, :], [WARP_SPLIT, GROUP_PAD, HEAD_DIM])
            m3 = tl.full([WARP_SPLIT, GROUP_PAD], float("-inf"), dtype=tl.float32)
            l3 = tl.zeros([WARP_SPLIT, GROUP_PAD], dtype=tl.float32)
            acc3 = tl.zeros([WARP_SPLIT, GROUP_PAD, HEAD_DIM], dtype=tl.float32)
            for c0 in range(t0, t1, PT_CHUNK):
                pgs, c1 = _chunk_pages(pt_row, c0, t1, seq_len, TILE, PAGE, PT_CHUNK)
                for t in tl.range(c0, c1, num_stages=NUM_STAGES):
                    tok = t * TILE + offs_w
                    valid = tok < seq_len
                    pg = _chunk_tile_page(pgs, t, c0, TILE, PAGE, PT_CHUNK).to(tl.int64)
                    slot = (tok % PAGE).to(tl.int64)
                    rows_k = pg * stride_kp + slot * stride_ks
                    rows_v = pg * stride_vp + slot * stride_vs
                    k = tl.load(
                        k_head + rows_k[:, :, None] + offs_d[None, None, :], mask=valid[:, :, None], other=0.0
                    )
                    if F16_DOT:
                        v = _load_v_f16(v_head, rows_v, offs_d2, valid, ASM_CVT, True)
                    else:
                        v = tl.load(
                            v_head + rows_v[:, :, None] + offs_d[None, None, :],
                            mask=valid[:, :, None],
                            other=0.0,
                        )
                    m3, l3, acc3 = _attend_split(q3, k, v, valid, m3, l3, acc3, seg_scale)
            m_i, l_i, acc = _combine_split(m3, l3, acc3)
        elif PAGE >= TILE or TILE == 2 * PAGE:
            # no load feeds the K/V addresses inside the tile loop (the page ids of a chunk of tiles come
            # from one vector load before it), so the pipeliner gives K/V their full distance: two
            # buffers at 3 stages instead of one (the page-id load in the loop costs a stage).
            # PAGE >= TILE: one page id per tile; TILE == 2 * PAGE: two (tokens [0, PAGE) and [PAGE, TILE)).
            for c0 in range(t0, t1, PT_CHUNK):
                pgs, c1 = _chunk_pages(pt_row, c0, t1, seq_len, TILE, PAGE, PT_CHUNK)
                for t in tl.range(c0, c1, num_stages=NUM_STAGES):
                    valid = (t * TILE + offs_n) < seq_len
                    pg = _chunk_tile_page(pgs, t, c0, TILE, PAGE, PT_CHUNK)
                    rows_k = _tile_rows(pg, t, stride_kp, stride_ks, TILE, PAGE)
                    rows_v = _tile_rows(pg, t, stride_vp, stride_vs, TILE, PAGE)
                    k = tl.load(k_head + rows_k[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
                    if F16_DOT:
                        v = _load_v_f16(v_head, rows_v, offs_d2, valid, ASM_CVT)
                    else:
                        v = tl.load(
                            v_head + rows_v[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0
                        )
                    m_i, l_i, acc = _attend(q, k, v, valid, m_i, l_i, acc, seg_scale)
        else:
            for t in tl.range(t0, t1, num_stages=NUM_STAGES):
                valid = (t * TILE + offs_n) < seq_len
                pg = _tile_pages(pt_row, t, t1, seq_len, TILE, PAGE)
                rows_k = _tile_rows(pg, t, stride_kp, stride_ks, TILE, PAGE)
                rows_v = _tile_rows(pg, t, stride_vp, stride_vs, TILE, PAGE)
                k = tl.load(k_head + rows_k[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
                if F16_DOT:
                    v = _load_v_f16(v_head, rows_v, offs_d2, valid, ASM_CVT)
                else:
                    v = tl.load(v_head + rows_v[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
                m_i, l_i, acc = _attend(q, k, v, valid, m_i, l_i, acc, seg_scale)

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
            l_i,
            acc,
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
        # the segment ended inside the range (or the range ends here): step to the next one
        b = b_n
        h = h_n
        t0 = t0 * 0
        seq_len = seq_len_n
        n_tiles = tl.maximum((seq_len + TILE - 1) // TILE, 1)


@triton.jit
def _step_slots(prog_start_ptr, q0, p, seg_start, BLOCK_P: tl.constexpr):
    """Partials ``q0 .. q0 + BLOCK_P - 1`` (those up to ``p``) of the split segment that starts at unit
    ``seg_start``: their workspace slots (int64) and which of them hold a partial. Planner data only (no
    partial is read), so a merge program may load them before griddepcontrol.wait."""
    qs = q0 + tl.arange(0, BLOCK_P)
    in_range = qs <= p
    q_start = tl.load(prog_start_ptr + qs, mask=in_range, other=0)
    q_next = tl.load(prog_start_ptr + qs + 1, mask=in_range, other=0)
    ok = in_range & (q_next > q_start)  # empty ranges wrote nothing
    # a participant's slot: 2q for its range's first segment, 2q + 1 for its last
    slot_id = (2 * qs + (q_start < seg_start).to(tl.int32)).to(tl.int64)
    return slot_id, ok


@triton.jit
def _combine_segment(
    out_ptr,
    prog_start_ptr,
    merge_bh_ptr,
    merge_seg_ptr,
    ws_o_ptr,
    ws_lse_ptr,
    p,
    lo,
    r,
    c,
    stride_ob,
    stride_oh,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    COLS: tl.constexpr,  # columns of D combined here: c * COLS ..
    BLOCK_P: tl.constexpr,  # partials combined per step
    PDL: tl.constexpr,  # griddepcontrol.wait before the first partial is read
    ONE_STEP: tl.constexpr,  # the caller guarantees p - lo < BLOCK_P: one step, no next-step slot loads
):
    """Query row ``r``, columns ``c * COLS ..`` of the split segment whose partials programs ``lo`` .. ``p`` of
    the attention pass wrote: their log-sum-exp combination, BLOCK_P partials per step, into ``out``. Every
    column's arithmetic is its own (the weights are per partial, the sums per column), so a column's result
    does not depend on COLS.

    Only ``ws_lse`` / ``ws_o`` come from the attention pass: everything else (the segment, its output row, the
    first step's slots) is loaded before the wait, so after it the first dependent load is the partials', and
    each later step's slots are loaded right after that step's partials are issued (their latency hidden by
    its math)."""
    bh = tl.load(merge_bh_ptr + p)
    seg_start = tl.load(merge_seg_ptr + p)
    slot_id, ok = _step_slots(prog_start_ptr, lo, p, seg_start, BLOCK_P)
    if PDL:
        gdc_wait()
    offs_d = c * COLS + tl.arange(0, COLS)
    m_run = tl.full([COLS], float("-inf"), dtype=tl.float32)  # kept as a vector
    w_sum = tl.zeros([COLS], dtype=tl.float32)
    acc = tl.zeros([COLS], dtype=tl.float32)
    last = p + 1
    if ONE_STEP:
        last = lo + 1
    for q0 in range(lo, last, BLOCK_P):
        lse = tl.load(ws_lse_ptr + slot_id * GROUP + r, mask=ok, other=float("-inf"))
        o = tl.load(
            ws_o_ptr + (slot_id * GROUP + r)[:, None] * HEAD_DIM + offs_d[None, :],
            mask=ok[:, None],
            other=0.0,
        )  # [BLOCK_P, COLS]
        if not ONE_STEP:  # (all masked off after the last step)
            slot_id, ok = _step_slots(prog_start_ptr, q0 + BLOCK_P, p, seg_start, BLOCK_P)
        m_new = tl.maximum(m_run, tl.max(lse, axis=0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        w = tl.exp2(lse[:, None] - m_use[None, :])  # [BLOCK_P, COLS] (same per column)
        scale_old = tl.exp2(m_run - m_use)
        acc = acc * scale_old + tl.sum(w * o, axis=0)
        w_sum = w_sum * scale_old + tl.sum(w, axis=0)
        m_run = m_new
    res = acc / tl.where(w_sum > 0.0, w_sum, 1.0)
    b = bh // NUM_KV_HEADS
    row = (bh - b * NUM_KV_HEADS).to(tl.int64) * GROUP + r
    tl.store(
        out_ptr + b.to(tl.int64) * stride_ob + row * stride_oh + offs_d, res.to(out_ptr.dtype.element_ty)
    )


@triton.jit
def merge_duty(x, c, G, merge_first_ptr, wide_list_ptr, S: tl.constexpr, NARROW: tl.constexpr):
    """What program ``(x, r, c)`` of merge_kernel's grid merges, from planner data alone: ``(p, lo, cw, is_wide)``
    — the segment program ``p`` of the attention pass merges, its first participant ``lo`` (``lo < 0``: nothing
    to merge) and the program's column chunk ``cw`` (of D_CHUNK columns when narrow, of D_CHUNK // S when wide).
    Also the stream floor's duty tail (the same grid, its programs waiting where these merge)."""
    is_wide = x >= G
    p = x
    if is_wide:
        j = (x - G) // S
        cw = c * S + (x - G - j * S)  # column chunk of WIDE_COLS
        p = tl.load(wide_list_ptr + j)
        lo = tl.load(merge_first_ptr + p, mask=p >= 0, other=-1)
    else:
        cw = c
        lo = tl.load(merge_first_ptr + p)
        lo = tl.where(p - lo + 1 > NARROW, -1, lo)
    return p, lo, cw, is_wide


@triton.jit
def merge_kernel(
    out_ptr,  # [B, Hq, D]
    prog_start_ptr,  # [G + 1]
    merge_first_ptr,  # [G]: first participant, -1 when program p merges nothing
    merge_bh_ptr,  # [G]
    merge_seg_ptr,  # [G]
    ws_o_ptr,  # [2G, GROUP, D] fp32
    ws_lse_ptr,  # [2G, GROUP] fp32
    wide_list_ptr,  # [W] int32 (plan): programs whose merge has > BLOCK_P participants, then -1s
    G,  # programs of the attention pass
    W,  # wide_list entries the launch covers (0: no wide programs)
    stride_ob,
    stride_oh,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_CHUNK: tl.constexpr,  # columns of D per narrow program
    BLOCK_P: tl.constexpr,  # a narrow program merges a segment of at most BLOCK_P participants, in one step
    WIDE_COLS: tl.constexpr,  # columns of D per wide program
    WIDE_BLOCK_P: tl.constexpr,  # partials combined per step by a wide program
    PDL: tl.constexpr = False,  # launched as a programmatic dependent of the attention pass
):
    # grid (G + W * S, GROUP, HEAD_DIM // D_CHUNK), S = D_CHUNK // WIDE_COLS. Along axis 0, for query row r and
    # columns c * D_CHUNK .. of the group: G narrow programs, program p combining the segment that program p of
    # the attention pass merges (its last participant) if it has at most NARROW participants, BLOCK_P partials
    # per step; and W * S wide ones, program (j, s) combining columns c * D_CHUNK + s * WIDE_COLS .. of the
    # segment of p = wide_list[j] (-1: none), WIDE_BLOCK_P per step. So every split segment is combined by
    # exactly one set of programs. Programs with nothing to merge exit after their planner loads.
    x = tl.program_id(0)
    r = tl.program_id(1)
    c = tl.program_id(2)
    p, lo, cw, is_wide = merge_duty(x, c, G, merge_first_ptr, wide_list_ptr, D_CHUNK // WIDE_COLS, BLOCK_P)
    if PDL:
        # launched before the attention pass finished: everything read above, and in _combine_segment before its
        # wait, comes from the planner (done before that pass started); partials may be read only after
        # griddepcontrol.wait, which a merging program reaches inside _combine_segment. Program (0, 0, 0) always
        # waits, so the launch never completes before the attention pass: pass and merge complete in that order,
        # and whatever is launched after them (without PDL) finds every output row written, even when no segment
        # needed merging and every other program exited at once.
        if (lo < 0) & (x == 0) & (r == 0) & (c == 0):
            gdc_wait()
    if lo >= 0:
        # two code paths, one per tile shape, chosen by a value uniform over the program
        if is_wide:
            _combine_segment(
                out_ptr, prog_start_ptr, merge_bh_ptr, merge_seg_ptr, ws_o_ptr, ws_lse_ptr, p, lo, r, cw,
                stride_ob, stride_oh, NUM_KV_HEADS, GROUP, HEAD_DIM, WIDE_COLS, WIDE_BLOCK_P, PDL, False,
            )  # fmt: skip
        else:
            _combine_segment(
                out_ptr, prog_start_ptr, merge_bh_ptr, merge_seg_ptr, ws_o_ptr, ws_lse_ptr, p, lo, r, c,
                stride_ob, stride_oh, NUM_KV_HEADS, GROUP, HEAD_DIM, D_CHUNK, BLOCK_P, PDL, True,
            )  # fmt: skip
