"""Stream floor of the decode-attention benchmark: the K/V bytes of a plan read with no attention math.

A diagnostic, not a product kernel (issue 5: what the remaining misses are limited by). ``stream_floor``
launches one Triton kernel over a decode-attention plan (``op.plan``) with the SAME persistent grid, the same
program ranges (the planner's ``prog_desc``: each program's units and first segment, the next segment
stepped to as ``(b, h + 1)`` or ``(b + 1, 0)``, as ``kernel.decode_kernel`` does), the plan's copy of the page
table and lengths, the caller's K/V pool, and the plan's tile, pipeline stages, warps, page ids loaded
``pt_chunk`` tiles at a time, and register cap (``op._register_cap``, so as many programs per SM are resident
as in the real pass). Every tile loads exactly the K and V rows the real pass loads (tokens past the length
masked, never read) and adds them, converted to fp32, into a ``[TILE, D]`` accumulator; the program writes
the accumulator's sum to ``sums[pid]``, so nothing is dead code. No q, no products, no softmax, no partials,
no merge launch. With ``tail`` a second, dependent launch follows in the merge launch's slot (under programmatic
dependent launch on the GPU as the merge is): ``'grid'`` (or True) on the merge launch's grid, all its programs
exiting at once but program (0, 0, 0), which waits for the floor pass and writes the total of ``sums[:G]`` to
``sums[G]``; ``'one'`` the same as one program; ``'duty'`` the merge grid whose merging programs (``kernel.merge_duty``)
wait and exit (what the grid and its parked duties cost, without the merge's work).

``bench_cells`` times both forms beside ours in ``decode_attention.bench_case`` (``--floor``): µs, TB/s of K/V
read, that against DESIGN.md §7's 4.12 TB/s device copy, and ours / floor; also ``empty_launch`` (the attention
grid launched with no K/V to read: the per-launch cost in the same graph replay) and ours timed again. With
``split`` (``--split``) also our call in its two launches: ``pass_only`` (``op.run`` with the merge launch held
back: the attention pass alone, which still writes its partials and the rows of unsplit segments) and
``merge_only`` (that held merge launch, same arguments, PDL flag included, on the partials the pass left).

Assumption when reading the numbers: the floor is what any kernel reading these bytes with this schedule (same
grid, ranges, tile, stages, warps and residency, Triton's pipeliner) pays at least; a different schedule or
load path (more bytes in flight, TMA, other tile sizes) could go under it.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from hpc_advise.kernels.decode_attention.kernel import _next_segment, _range_desc, merge_duty
from hpc_advise.runtime.measure.harness import DESIGN_COPY_TBPS

COPY_TBPS = DESIGN_COPY_TBPS  # the floor table's fixed reference (DESIGN.md §7)
TAIL_BLOCK = 1024  # sums the tail's waiting program adds per step


@triton.jit
def _tile_kv_sum(
    k_head, v_head, pg, tok, valid, offs_d, stride_kp, stride_ks, stride_vp, stride_vs, PAGE: tl.constexpr
):
    """K + V of one tile's tokens (page ids ``pg``, one per token or one for the tile), read as the real pass's
    gather reads them, in fp32; tokens outside ``valid`` read as 0."""
    slot = (tok % PAGE).to(tl.int64)
    rows_k = pg * stride_kp + slot * stride_ks
    rows_v = pg * stride_vp + slot * stride_vs
    k = tl.load(k_head + rows_k[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
    v = tl.load(v_head + rows_v[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
    return k.to(tl.float32) + v.to(tl.float32)


@triton.jit(do_not_specialize=["num_kv_heads"])
def stream_floor_kernel(
    k_ptr,  # [P, PAGE, Hkv, D] bf16/fp16/fp8e4m3
    v_ptr,  # [P, PAGE, Hkv, D]
    page_table_ptr,  # [B, >= max pages] int32 (the plan's copy)
    seq_lens_ptr,  # [B] int32 (the plan's copy)
    prog_desc_ptr,  # [G, 8] int32: u_begin, u_end, b, h, t0, n_tiles, seq_len of the first segment, -
    sums_ptr,  # [G + 1] fp32 out: sum of every K and V value program pid read
    stride_kp,
    stride_ks,
    stride_kh,
    stride_vp,
    stride_vs,
    stride_vh,
    stride_ptb,
    num_kv_heads,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    TILE: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PT_CHUNK: tl.constexpr,  # > 0 and PAGE >= TILE: page ids of PT_CHUNK tiles per load, as the real pass
    PDL: tl.constexpr,  # let a dependent launch start now (the real pass does, for its merge launch)
):
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    u, u_end, b, h, t0, n_tiles, seq_len = _range_desc(prog_desc_ptr, pid)  # as the real pass reads it
    offs_n = tl.arange(0, TILE)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([TILE, HEAD_DIM], dtype=tl.float32)
    while u < u_end:
        seg_start = u - t0
        t1 = tl.minimum(n_tiles, u_end - seg_start)
        pt_row = page_table_ptr + b.to(tl.int64) * stride_ptb
        k_head = k_ptr + h.to(tl.int64) * stride_kh
        v_head = v_ptr + h.to(tl.int64) * stride_vh
        if PT_CHUNK > 0 and PAGE >= TILE:
            offs_c = tl.arange(0, PT_CHUNK)
            for c0 in range(t0, t1, PT_CHUNK):
                c1 = tl.minimum(c0 + PT_CHUNK, t1)
                pgs = tl.load(pt_row + ((c0 + offs_c) * TILE) // PAGE, mask=(c0 + offs_c) < c1, other=0)
                for t in tl.range(c0, c1, num_stages=NUM_STAGES):
                    tok = t * TILE + offs_n
                    valid = tok < seq_len
                    pg = tl.sum(tl.where(offs_c == t - c0, pgs, 0), axis=0).to(tl.int64)
                    acc += _tile_kv_sum(
                        k_head,
                        v_head,
                        pg,
                        tok,
                        valid,
                        offs_d,
                        stride_kp,
                        stride_ks,
                        stride_vp,
                        stride_vs,
                        PAGE,
                    )
        else:
            # one page id per token (pages shorter than a tile): the same rows as the real pass's gather
            for t in tl.range(t0, t1, num_stages=NUM_STAGES):
                tok = t * TILE + offs_n
                valid = tok < seq_len
                pg = tl.load(pt_row + tok // PAGE, mask=valid, other=0).to(tl.int64)
                acc += _tile_kv_sum(
                    k_head, v_head, pg, tok, valid, offs_d, stride_kp, stride_ks, stride_vp, stride_vs, PAGE
                )
        # the next segment of the range, (b, h + 1) or (b + 1, 0), from its first tile (the real pass's step)
        b, h, _, seq_len = _next_segment(b, h, num_kv_heads, seg_start, t1, u_end, seq_lens_ptr, seq_len)
        u = seg_start + t1
        t0 = t0 * 0
        n_tiles = tl.maximum((seq_len + TILE - 1) // TILE, 1)
    tl.store(sums_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


@triton.jit
def _tail_total(sums_ptr, G, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """After griddepcontrol.wait (under PDL): sum(sums[:G]) into sums[G]."""
    if PDL:
        gdc_wait()
    offs = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for g0 in range(0, G, BLOCK):
        total += tl.load(sums_ptr + g0 + offs, mask=g0 + offs < G, other=0.0)
    tl.store(sums_ptr + G, tl.sum(total, axis=0))


@triton.jit
def floor_tail_kernel(sums_ptr, G, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """The merge launch's slot: every program exits at once but (0, 0, 0), which waits for the floor pass
    (griddepcontrol.wait under PDL) and writes sum(sums[:G]) to sums[G]."""
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
        _tail_total(sums_ptr, G, BLOCK, PDL)


@triton.jit
def duty_tail_kernel(
    sums_ptr,
    merge_first_ptr,
    wide_list_ptr,
    G,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
    S: tl.constexpr,
    NARROW: tl.constexpr,
):
    """The merge launch's grid and duties with none of its work: each program reads its duty as a merge program
    does (kernel.merge_duty, the same planner data); those with a segment to merge wait for the floor pass
    (griddepcontrol.wait under PDL) and exit, the others exit at once; program (0, 0, 0) waits and writes
    sum(sums[:G]) to sums[G]. Against the plain tail (one waiting program) it adds what parking the merging
    programs at their wait costs; against the merge launch it leaves out their loads, arithmetic and stores."""
    x = tl.program_id(0)
    c = tl.program_id(2)
    _, lo, _, _ = merge_duty(x, c, G, merge_first_ptr, wide_list_ptr, S, NARROW)
    if (x == 0) & (tl.program_id(1) == 0) & (c == 0):
        _tail_total(sums_ptr, G, BLOCK, PDL)
    elif lo >= 0:
        if PDL:
            gdc_wait()


def _check_plan(plan, k_cache, v_cache) -> None:
    import torch

    from hpc_advise.kernels.decode_attention import op

    if not isinstance(plan, op.DecodePlan) or plan.schedule != "dynamic":
        raise ValueError("stream_floor: needs a dynamic-schedule plan from op.plan()")
    want = (plan.page_size, plan.num_kv_heads, plan.head_dim)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or tuple(t.shape[1:]) != want:
            raise ValueError(f"stream_floor: {name} must be [num_pages, {', '.join(map(str, want))}]")
        if t.stride(-1) != 1 or t.device != plan.device:
            raise ValueError(f"stream_floor: {name} must be contiguous in D and on {plan.device}")


def tail_grid(plan) -> tuple[int, int, int]:
    """The merge launch's grid for this plan (op.merge_grid)."""
    from hpc_advise.kernels.decode_attention import op

    return op.merge_grid(plan)


TAILS = (False, "grid", "one", "duty")  # stream_floor's tail forms


def stream_floor(plan, k_cache, v_cache, *, sums=None, tail=False):
    """Read every K/V byte the plan's attention pass reads, in its schedule, with no math (module docstring).
    Returns ``sums`` [G + 1] fp32: ``sums[p]`` the sum of the values program p read; ``sums[G]`` their total
    when ``tail`` (the dependent second launch), else left as it was. ``tail``: True or 'grid' the do-nothing
    launch on the merge launch's grid (``floor_tail_kernel``), 'one' the same as one program, 'duty' the merge
    grid whose merging programs wait (``duty_tail_kernel``)."""
    if tail not in TAILS and tail is not True:
        raise ValueError(f"stream_floor: tail must be one of {TAILS} or True, got {tail!r}")
    import torch

    from hpc_advise.kernels.decode_attention import op

    _check_plan(plan, k_cache, v_cache)
    g = plan.grid_size()
    if sums is None:
        sums = torch.zeros(g + 1, dtype=torch.float32, device=plan.device)
    gpu = plan.device.type == "cuda" and not op._interpreting()
    pdl = bool(tail) and gpu
    compiled = stream_floor_kernel[(g,)](
        k_cache,
        v_cache,
        plan.page_table,
        plan.seq_lens,
        plan.prog_desc,
        sums,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        plan.page_table.stride(0),
        plan.num_kv_heads,
        HEAD_DIM=plan.head_dim,
        PAGE=plan.page_size,
        TILE=plan.tile,
        NUM_STAGES=op.NUM_STAGES,
        PT_CHUNK=op.PT_CHUNK,
        PDL=pdl,
        num_warps=plan.num_warps,
        **op._register_cap(plan),
    )
    # the build's resources (GPU only): registers, spills, shared memory, so residency can be compared
    stream_floor.last_build = {
        key: getattr(compiled, attr, None) for key, attr in (("regs", "n_regs"), ("spills", "n_spills"))
    } | {"shared": getattr(getattr(compiled, "metadata", None), "shared", None)}
    launch = {"launch_pdl": True} if pdl else {}  # the interpreter knows no such option
    if tail == "duty":
        duty_tail_kernel[tail_grid(plan)](
            sums,
            plan.merge_first,
            plan.wide_list,
            g,
            BLOCK=TAIL_BLOCK,
            PDL=pdl,
            S=min(64, plan.head_dim) // op.WIDE_MERGE_COLS,
            NARROW=op.MERGE_BLOCK,
            num_warps=2,
            **launch,
        )
    elif tail:
        grid = (1, 1, 1) if tail == "one" else tail_grid(plan)
        floor_tail_kernel[grid](sums, g, BLOCK=TAIL_BLOCK, PDL=pdl, num_warps=2, **launch)
    return sums


stream_floor.last_build = {}


def empty_launch(plan, sums):
    """One launch of the floor's grid that reads no K/V: every program exits but program 0, which adds
    ``sums[:G]`` into ``sums[G]`` (the tail kernel on the attention grid, no PDL): what a launch of G programs
    costs in the benchmark's graph replay, bytes aside."""
    g = plan.grid_size()
    floor_tail_kernel[(g, 1, 1)](sums, g, BLOCK=TAIL_BLOCK, PDL=False, num_warps=plan.num_warps)
    return sums


def pass_only(plan, w, out) -> tuple:
    """Our call (``op.run``) with its merge launch held back: only the attention pass runs. Returns the held
    ``op._merge`` arguments (plan, out, pdl), for ``merge_only``."""
    from hpc_advise.kernels.decode_attention import op

    held = []
    merge, op._merge = op._merge, lambda *args: held.append(args)
    try:
        op.run(plan, w.q, w.k, w.v, out=out)
    finally:
        op._merge = merge
    if len(held) != 1:
        raise RuntimeError(f"pass_only: op.run launched the merge {len(held)} times, expected once")
    return held[0]


def merge_only(held: tuple) -> None:
    """The merge launch ``pass_only`` held back, on the partials its pass wrote."""
    from hpc_advise.kernels.decode_attention import op

    op._merge(*held)


HEADERS = [
    "stream floor µs",
    "floor TB/s",
    "floor of 4.12",
    "ours / floor",
    "floor + tail µs",
    "ours / (f+t)",
    "floor + 1-program tail µs",
    "floor + duty tail µs",
    "empty launch µs",
    "ours again µs",
]
SPLIT_HEADERS = ["pass µs", "merge alone µs", "ours − pass µs", "pass − floor µs"]
# provider -> how one rotation's call runs, on that rotation's buffers: 'sums' (the floor's [G + 1] fp32), 'out'
# (the split's own output, NaN-filled) and 'held' (the merge arguments pass_only held back)
FORMS = {
    "stream_floor": lambda plan, w, buf: stream_floor(plan, w.k, w.v, sums=buf["sums"]),
    "stream_floor_tail": lambda plan, w, buf: stream_floor(plan, w.k, w.v, sums=buf["sums"], tail="grid"),
    "stream_floor_tail1": lambda plan, w, buf: stream_floor(plan, w.k, w.v, sums=buf["sums"], tail="one"),
    "stream_floor_duty": lambda plan, w, buf: stream_floor(plan, w.k, w.v, sums=buf["sums"], tail="duty"),
    "empty_launch": lambda plan, w, buf: empty_launch(plan, buf["sums"]),
}
SPLIT_FORMS = {  # after FORMS: pass_only first, so every rotation's partials and held merge exist for merge_only
    "pass_only": lambda plan, w, buf: buf.update(held=pass_only(plan, w, buf["out"])),
    "merge_only": lambda plan, w, buf: merge_only(buf["held"]),
}


def _form_extra(provider: str, plan, buf, g: int) -> dict:
    """What a row of ``provider`` records beside its timing: the floor's schedule and build, the tail's grid,
    the split's merge grid and wide segments."""
    if provider.startswith("stream_floor"):
        extra = {
            "tile": plan.tile,
            "num_warps": plan.num_warps,
            "finite": bool(buf["sums"][:g].isfinite().all()),
            "build": stream_floor.last_build,
        }
        grid = {
            "stream_floor_tail": tail_grid(plan),
            "stream_floor_duty": tail_grid(plan),
            "stream_floor_tail1": (1, 1, 1),
        }
        return extra | ({"tail_grid": list(grid[provider])} if provider in grid else {})
    if provider in SPLIT_FORMS:
        return {"merge_grid": list(tail_grid(plan)), "wide_segments": int((plan.wide_list >= 0).sum())}
    return {}


def bench_cells(
    w, plans, ours_calls, t_ours, time_calls, base: dict, env, split: bool = False
) -> tuple[list[dict], list]:
    """Time the floor (one launch), the floor + tail (two, PDL) and the empty launch over the benchmark's
    rotated plans of workload ``w`` right after ours (``t_ours``), with ``split`` then our pass alone and our
    merge launch alone, then ours (``ours_calls``) again, all with the benchmark's timer ``time_calls``;
    returns (rows, the table cells of HEADERS, then of SPLIT_HEADERS with ``split``)."""
    import torch

    from hpc_advise.runtime.measure.harness import run_row

    g = plans[0].grid_size()
    dev = plans[0].device
    bufs = [
        {
            "sums": torch.zeros(g + 1, dtype=torch.float32, device=dev),
            "out": torch.full_like(w.q, float("nan")),
            "held": None,
        }
        for _ in plans
    ]
    rows, us = [], {}
    for provider, form in (FORMS | SPLIT_FORMS if split else FORMS).items():
        calls = [lambda p=p, b=b, form=form: form(p, w, b) for p, b in zip(plans, bufs, strict=True)]
        for c in calls:
            c()  # compiles outside the timed graph
        t, how = time_calls(calls)
        us[provider] = t.p50
        extra = {
            "timing": how,
            "tbps": w.kv_bytes / t.p50 / 1e6,
            "ours_over_this": t_ours.p50 / t.p50,
            "programs": g,
        } | _form_extra(provider, plans[0], bufs[0], g)
        rows.append(
            run_row(
                kind="kernel",
                subject=f"decode_attention.{'split' if provider in SPLIT_FORMS else 'stream_floor'}",
                provider=provider,
                config=base | extra,
                metric="latency",
                unit="us",
                timing=t,
                env=env,
            )
        )
    # ours once more after the floor: its spread within the case, against which ours / floor is read
    again, how = time_calls(ours_calls)
    rows.append(
        run_row(
            kind="kernel",
            subject="decode_attention.stream_floor",
            provider="hpc_advise_dynamic_again",
            config=base | {"timing": how, "tbps": w.kv_bytes / again.p50 / 1e6, "repeat": True},
            metric="latency",
            unit="us",
            timing=again,
            env=env,
        )
    )
    floor, tail = us["stream_floor"], us["stream_floor_tail"]
    tbps = w.kv_bytes / floor / 1e6
    cells = [round(floor, 1), round(tbps, 2), f"{100 * tbps / COPY_TBPS:.0f}%", f"{t_ours.p50 / floor:.2f}x"]
    cells += [round(tail, 1), f"{t_ours.p50 / tail:.2f}x", round(us["stream_floor_tail1"], 1)]
    cells += [round(us["stream_floor_duty"], 1), round(us["empty_launch"], 1), round(again.p50, 1)]
    if split:
        pas = us["pass_only"]
        cells += [
            round(pas, 1),
            round(us["merge_only"], 1),
            round(t_ours.p50 - pas, 1),
            round(pas - floor, 1),
        ]
    return rows, cells
