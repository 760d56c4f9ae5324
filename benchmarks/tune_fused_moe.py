"""Sweep launch configs of the FP8 fused MoE and write them as data (configs.json).

    python benchmarks/tune_fused_moe.py [--shapes hy3,hy3-tp8,...] [--ts 1,16,128,4096] [--out PATH]
    python benchmarks/tune_fused_moe.py --breakdown [--shapes ...] [--ts 1024,4096,16384]
    python benchmarks/tune_fused_moe.py --variants [--shapes ...] [--ts 1,16,64,128]
    python benchmarks/tune_fused_moe.py --route-reduce [--shapes ...] [--ts 16,64,128]
    python benchmarks/tune_fused_moe.py --persistent [--shapes ...] [--ts 1,4]
    python benchmarks/tune_fused_moe.py --prefill-variants [--shapes ...] [--ts 1024,4096,16384]
    python benchmarks/tune_fused_moe.py --decode-forms [--shapes ...] [--ts 16,64,128]
    python benchmarks/tune_fused_moe.py --swap-ab [--shapes ...] [--ts 16,64,128]
    python benchmarks/tune_fused_moe.py --multi-tile [--shapes ...] [--ts 16,64,128]
    python benchmarks/tune_fused_moe.py --prefill-tiles [--shapes ...] [--ts 4096,16384]
    python benchmarks/tune_fused_moe.py --pingpong [--shapes hy3] [--ts 4096,16384]
    python benchmarks/tune_fused_moe.py --prefill-retune [--shapes hy3] [--ts 16384,4096]
    python benchmarks/tune_fused_moe.py --half-tiles [--shapes ...] [--ts 16384,4096]
    python benchmarks/tune_fused_moe.py --decide ROWS.jsonl [--out configs.json]   (no GPU)
    python benchmarks/tune_fused_moe.py --launch-overhead [--shapes ...] [--ts 1]
    python benchmarks/tune_fused_moe.py --fuse-quant [--shapes ...] [--ts 1,4]
    python benchmarks/tune_fused_moe.py --scale-lag [--shapes ...] [--ts 1,16,64,128]
    python benchmarks/tune_fused_moe.py --occupancy [--shapes ...] [--ts 16,64,128]
    python benchmarks/tune_fused_moe.py --h-group [--shapes ...] [--ts 1,4]
    python benchmarks/tune_fused_moe.py --small-breakdown [--shapes ...] [--ts 1,4]

Times every candidate of ``hpc_advise.runtime.benches.fused_moe.candidates`` per (shape, scale mode,
T) with CUDA-graph replay and keeps the fastest (a candidate whose output differs from the first
candidate's by more than ``TUNE_MAX_REL_DIFF`` is dropped). The output is merged into the file: other
entries are kept, same (E, H, I, top_k, mode, T) replaced. Default output: $OUT/fused_moe_configs.json
on the device machine, else hpc_advise/kernels/fused_moe/configs.json (the file ``op.get_config`` reads).

``--variants`` times, per point, the config ``op.get_config`` picks now against the same with
programmatic dependent launches and the new decode variants (``fb.variant_candidates``: split sums
in the small-T path, PDL), old and new in one process, decided by ``fb._decide``'s decode rule (below).

``--route-reduce`` times, per point, the config ``op.get_config`` picks now against the regular decode
path with the ranked router (ROUTE), the top-k sum in the down kernel (DN_REDUCE) and both, plus
pipeline-depth and tile candidates with both (``fb.route_reduce_candidates``), in one process.

``--prefill-variants`` times, per point (T >= 1024), the config ``op.get_config`` picks now against the
TMA weight tiles (W_TMA), scalar block scales (W_SCALAR), BLOCK_M 128 with separate gate/up dots
(GU_TWO_DOTS) and, with per-tensor scales, fp32 promotion every 256 (GU_K / DN_K = 256), in one process
(``fb.prefill_variant_candidates``; forms more than 5e-3 from the current pick are dropped).

``--decode-forms`` times, per point (T <= 128), the config ``op.get_config`` picks now against the
regular decode path with the prefill forms (TMA weight tiles, scalar block scales, the down GEMM's
activation rows by TMA, and the tile choices their registers allow; ``fb.decode_form_candidates``), in one
process; a form replaces the current pick only if it wins every one of ``fb.DECODE_ROUNDS`` interleaved rounds
against it and is >= 1% faster in median (``fb.DECODE_ROUNDS_MIN_GAIN``; ``fb._decide``).
That is the decode rule of every old-vs-new loop below too ("same rule"): the current pick and the short
screen's ``fb.SUSTAINED_FINALISTS`` fastest candidates are timed again in ``fb.DECODE_ROUNDS`` interleaved rounds.
Before 2026-11-30 it was the pick timed first and again last against one timing per candidate, with a 2 % bar.

``--swap-ab`` times, per point (T <= 128), the config ``op.get_config`` picks now against the regular
pick with its GEMMs swapped (GU_SWAP_AB, DN_SWAP_AB: the weight tile as the MMA's M side, so 16 token
rows reach wgmma; ``swap_ab_candidates``), through the ``--decode-forms`` loop (one process, same rule).

``--multi-tile`` times, per point (T <= 128), the config ``op.get_config`` picks now against the regular
pick with multi-tile programs (GU_TILES, DN_TILES: a program computes that many adjacent N tiles of its
block in one flattened, software-pipelined loop) and, at T <= 16 with long K loops, split-K summed in the
gate/up kernel (GU_RED; ``multi_tile_candidates``), through the same loop (same rule). Its candidates are precompiled at an H and I their tile
counts divide (``multi_tile_compile_job``).

``--prefill-tiles`` times, per point (T >= 1024), the config ``op.get_config`` picks now against the same pick
with multi-tile (GU_TILES, DN_TILES) and persistent (GU_PERSIST, DN_PERSIST) GEMM programs, whose flattened
(tile, K step) loop overlaps one tile's epilogue with the next tile's loads (``prefill_tile_candidates``), through
the ``--decode-forms`` loop (whole call, one process; at a prefill T the decision is ``tune``'s sustained one:
finalists and the pick re-timed after ``fb.PREFILL_SETTLE_S``, merged only if >= ``fb.SUSTAINED_MIN_GAIN`` faster),
then each GEMM launch alone for the same candidates in interleaved rounds (``prefill_tile_launches``; rows in
$OUT/fused_moe_prefill_tiles_launches.jsonl).

``--pingpong`` is ``--prefill-tiles`` with ``pingpong_candidates`` (the pick against its down GEMM as the
persistent ping-pong Gluon kernel, DN_GLUON 3), the launch-alone rounds timing the whole call too (rows in
$OUT/fused_moe_prefill_pingpong_launches.jsonl).

``--prefill-retune`` times, per point (T >= 1024), the config ``op.get_config`` picks now against one-key moves
of its gate/up and down tiles (``prefill_retune_candidates``: stages, GROUP_M, the other BLOCK_M, W_TMA,
GU_TILES 2, the ping-pong down's stages / GROUP_M / consumer tile) with no single-timing pass: each output is
checked against the pick's, then each GEMM launch alone and the whole call are timed in RETUNE_ROUNDS interleaved
rounds with the pick first and again last in every round (rows in $OUT/fused_moe_prefill_retune_launches.jsonl),
and ``retune_decision`` ships a candidate only if its median whole call is >= ``fb.SUSTAINED_MIN_GAIN`` (1 %) below
the better of the pick's two medians and it beat the pick in most rounds (``prefill_retune``). Whole calls at a prefill T are timed after
``fb.PREFILL_SETTLE_S`` of their own load (the H200's sustained clocks under its power cap; short windows spread up
to 15 % in one process), and so are ``tune``'s prefill finalists (``fb.sustained_finalists``).

``--decide ROWS.jsonl`` re-applies that rule (``ship_point``) to the rows file a --prefill-retune / --half-tiles run
wrote (e.g. the committed benchmarks/results/fused_moe_prefill_sustained_*_launches.jsonl) and merges the picks into
--out (default: the shipped configs.json); no GPU.

``--half-tiles`` is ``--prefill-retune`` with ``half_tile_candidates``: the pick against the same pick with GU_HALF
(64-row gate/up tiles for the 128-row blocks whose rows 64.. are padding only) and GU_HALF + DN_HALF (the down tiles
too; where the pick is BLOCK_M 64, the T = 16384 pick without and with them); rows in
$OUT/fused_moe_prefill_half_launches.jsonl, same rule.

``--fuse-quant`` times, per point (T <= op_small.FUSE_T_MAX), the config ``op.get_config`` picks now
against the same small-T pick with its quantization launch folded into the gate/up prologue (FUSE_QUANT 1,
and 2: with the first K steps' weights prefetched to L2 before the prologue; with dynamic group scales also
with FUSE_L1; with PDL where the pick has none; ``fuse_quant_candidates``), through the ``--decode-forms`` loop (one process, same rule). Its candidates are precompiled at the shape's H (the prologue's tile
depends on the K span: ``fuse_quant_compile_job``).

``--scale-lag`` times, per point (decode or prefill T), the config ``op.get_config`` picks now against the same
pick with its gate/up up products scaled (per-tensor: promoted) one K step late (SCALE_LAG: the up wgmma stays in
flight across the step), on the regular path also the two-dot form alone (GU_TWO_DOTS, which the lag runs, so the
two effects separate) and the lag with one gate/up stage fewer from 4 (two-dot TMA tiles: 2 programs per SM at 3
stages); where the pick's tile spills with the lag (BLOCK_M 128 × GU_N 128) the nearest tile that does not, with
and without it; through the ``--decode-forms`` loop (one process, same rule; ``scale_lag_candidates``).

``--occupancy`` times, per point (T <= 128), the config ``op.get_config`` picks now against the same regular pick
with more resident programs or warps per SM (``occupancy_candidates``: fewer gate/up / down stages, a 128-register
cap on a 2-stage gate/up, 8 warps), through the ``--decode-forms`` loop (one process, same rule).

``--h-group`` times, per point (block-dynamic small-T picks, T <= H_GROUP_T_MAX), the config ``op.get_config``
picks now against the same pick with h quantized in 1×64 groups (H_GROUP 64: 64-wide gate/up tiles whose
epilogue quantizes their own columns, so twice the gate/up programs; the down kernel stepping K by 128 with
two group scales per step), and FUSE_QUANT / split variants of that form, through the ``--decode-forms`` loop (one process, same rule; ``h_group_candidates``). The 1×64 outputs differ from the 1×128 pick's by a few % (a finer, not a
wrong, quantization: the tests hold them to the 1×64 reference), so the loop's accuracy bar against the first
candidate is H_GROUP_MAX_REL_DIFF there.

``--small-breakdown`` tunes nothing: per point it times the small-T path's whole call and each of its launches
alone (quantization, gate/up, down; the others skipped, so the alone times sum the GPU work without the launch
boundaries) in CUDA-graph replay over 8 routings, for the current pick and its 1×64 form
(``small_breakdown``).

``--launch-overhead`` tunes nothing: per (shape, T) and path that serves T (persistent T <= 16, small-T
T <= 32, regular) it measures, with launch plans off (``launch_plan.ENABLED = False``: every call checks,
looks up its config and goes through Triton's dispatch) and on (the signature's recorded plan replays the
compiled launches), in one process: one eager call's host time (perf_counter around 100 calls without a
synchronize: what the Python side and the launches cost the CPU), the eager wall time per call (the same
calls and one synchronize), the GPU time of one call from a CUDA graph (events), whether the outputs are
bitwise equal, the host time of the plan key alone, and at the first T the planned call's top host
functions (cProfile). Last it prints the markdown table (``overhead_table``).

``--persistent`` times, per point, the config ``op.get_config`` picks now against the one-launch
persistent decode path's candidates (``persistent_candidates``), in one process, through the
``--variants`` loop (same rule),
in a table of its own (``--out``, default fused_moe_configs_persistent.json here or under $OUT), never in the
shipped configs.json: the persistent programs wait on each other's counters and assume the whole grid is
resident, which a kernel on another stream (an EP collective, the other micro-batch) can break, and a hang is
not worth the 1.7 µs it won on one point (kernel README, "Persistent decode path").

``--breakdown`` tunes nothing: it times each launch of the config ``op.get_config`` picks (the
single-CTA and the multi-CTA router + input quantization, gate/up, down, reduce) and prints one line
per (shape, T) with each GEMM's TFLOP/s, so the share of every stage is measured, not guessed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpc_advise.runtime.benches import fused_moe as fb  # noqa: E402


def _gate_up_call(launch, w13):
    """The config's gate/up step of one prepared ``op._Launch``: one launch, or with split-K the launch of
    fp32 partials + the SiLU / quantization launch, or (GU_RED) the launch that sums them itself."""
    import torch

    from hpc_advise.kernels.fused_moe.op_small import _counters

    split = launch.cfg["SPLIT_K"]
    if split == 1:
        return lambda: launch.gate_up(w13, launch.inter, launch.inter_s, 0, 1)
    part = torch.empty(split, launch.P, 2 * launch.I, dtype=torch.float32, device=w13.device)
    if launch.cfg.get("GU_RED", 0):
        cnt = _counters(w13.device, (launch.P // launch.cfg["BLOCK_M"]) * -(-launch.I // launch.cfg["GU_N"]))
        return lambda: launch.gate_up(w13, launch.inter, launch.inter_s, 2, split, part=part, counters=cnt)
    return lambda: (launch.gate_up(w13, part, part, 1, split), launch.act_quant(part, split))


def _stage_times(launch, w13, w2, x) -> dict:
    """µs per launch (graph replay) of one prepared ``op._Launch`` (gate/up: with split-K its launches)."""
    import torch

    from hpc_advise.runtime.measure.harness import time_cuda

    out = torch.empty_like(x)
    launch.prep(x)
    return {
        "gate_up_us": time_cuda(_gate_up_call(launch, w13), inner=4, reps=10).p50,
        "down_us": time_cuda(lambda: launch.down(w2, 1.0), inner=4, reps=10).p50,
        "reduce_us": time_cuda(lambda: launch.reduce(out), inner=4, reps=10).p50,
    }


def _variant_stage_times(op, args: tuple, cfg: dict, w2) -> dict:
    """µs of the prep launch with the ranked router (ROUTE = 1) and of the down launch with the top-k
    sum in its epilogue (DN_REDUCE = 1), on the same inputs as ``_stage_times``; the latter None where the down
    GEMM is the ping-pong Gluon kernel (DN_GLUON: no DN_REDUCE form)."""
    import torch

    from hpc_advise.runtime.measure.harness import time_cuda

    x = args[0]
    ranked = op._Launch(*args[:-1], dict(cfg, ROUTE=1))
    prep_us = time_cuda(lambda: ranked.prep(x), inner=4, reps=10).p50
    if cfg.get("DN_GLUON", 0):
        return {"prep_ranked_us": prep_us, "down_reduce_us": None}
    fused = op._Launch(*args[:-1], dict(cfg, DN_REDUCE=1))
    out = torch.empty_like(x)
    fused.prep(x, out)
    _gate_up_call(fused, args[1])()
    down_us = time_cuda(lambda: fused.down(w2, 1.0, out), inner=4, reps=10).p50
    return {"prep_ranked_us": prep_us, "down_reduce_us": down_us}


def _prep_time(op, args: tuple, threshold: int) -> float:
    """µs of the prep launch(es) with the multi-CTA router from ``threshold`` entries up."""
    from hpc_advise.runtime.measure.harness import time_cuda

    saved = op.ROUTE_MULTI_MIN_ENTRIES
    op.ROUTE_MULTI_MIN_ENTRIES = threshold
    try:
        launch = op._Launch(*args)
    finally:
        op.ROUTE_MULTI_MIN_ENTRIES = saved
    return time_cuda(lambda: launch.prep(args[0]), inner=4, reps=10).p50


def _shape_inputs(shape: str):
    """(E, H, I, top-k, global E, expert offset, scale mode, weights, fused_moe scale kwargs) of a bench shape,
    with its first scale mode and fresh random weights."""
    e, h, i, k, eg, off = fb.SHAPES[shape]
    mode = fb.MODES[shape][0]
    wts = fb.make_weights(e, h, i, mode)
    return e, h, i, k, eg, off, mode, wts, fb._kwargs(wts, mode, off)


def _launch_args(s: dict, wts: dict, kw: dict, off: int) -> tuple:
    """``op._Launch``'s arguments for routing set ``s`` of a bench shape, the config last (None: op's pick)."""
    args = (s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], kw["w13_scale"], kw["w2_scale"])
    return args + (kw.get("a13_scale"), kw.get("a2_scale"), kw.get("block_shape"), off, None)


def breakdown(shapes: list[str], ts: tuple[int, ...], log=print) -> list[dict]:
    """Per-launch times (µs, CUDA-graph replay) of ``fused_moe`` at each (shape, T)."""
    import torch

    from hpc_advise.kernels.fused_moe import op

    rows = []
    for shape in shapes:
        e, h, i, k, eg, off, mode, wts, kw = _shape_inputs(shape)
        for t in ts:
            s = fb.make_routings(t, k, eg, h, 1)[0]
            args = _launch_args(s, wts, kw, off)
            row = dict(shape=shape, mode=mode, T=t)
            row["prep_single_us"] = _prep_time(op, args, 1 << 62)
            row["prep_multi_us"] = _prep_time(op, args, 1)
            launch = op._Launch(*args)
            row.update(_stage_times(launch, wts["w13"], wts["w2"], s["x"]))
            row.update(_variant_stage_times(op, args, launch.cfg, wts["w2"]))
            flops, _ = op.flops_and_bytes(s["ids"], e, h, i, off, wts["block"])
            row["gate_up_tflops"] = flops * 2 / 3 / (row["gate_up_us"] * 1e-6) / 1e12
            row["down_tflops"] = flops / 3 / (row["down_us"] * 1e-6) / 1e12
            row["padded_rows"] = int(launch.num_padded.item())
            row["rows"] = round(flops / (6 * h * i))
            row["config"] = launch.cfg
            log(
                f"  breakdown {shape} {mode} T={t}: prep single {row['prep_single_us']:.1f} / multi "
                f"{row['prep_multi_us']:.1f} us, gate/up {row['gate_up_us']:.1f} us "
                f"({row['gate_up_tflops']:.0f} TF/s), down {row['down_us']:.1f} us ({row['down_tflops']:.0f} "
                f"TF/s), reduce {row['reduce_us']:.1f} us, rows {row['rows']} padded {row['padded_rows']}; "
                f"ROUTE=1 prep {row['prep_ranked_us']:.1f} us, DN_REDUCE=1 down incl. the top-k sum "
                + (
                    f"{row['down_reduce_us']:.1f} us"
                    if row["down_reduce_us"] is not None
                    else "n/a (DN_GLUON)"
                )
            )
            rows.append(row)
        del wts, kw
        torch.cuda.empty_cache()
    return rows


def _host_us(fn, calls: int = 100) -> tuple[float, float]:
    """(host µs per call: perf_counter around ``calls`` eager calls without a synchronize, wall µs per
    call: the same calls and one synchronize). Equal when the host is the bottleneck (the GPU waits for
    launches); wall > host when the GPU's own time per call is the longer one. 100 calls of <= 5 launches
    stay below the driver's queue of pending launches, so the host loop does not wait on the GPU."""
    import time

    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return 1e6 * (t1 - t0) / calls, 1e6 * (t2 - t0) / calls


def _top_host_functions(fn, calls: int = 100, top: int = 8) -> list[str]:
    """cProfile of ``calls`` eager calls: the functions with the most own time (µs per call)."""
    import cProfile
    import pstats

    import torch

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return [f"{1e6 * v[2] / calls:.1f} us {Path(f).name}:{line}({name})" for (f, line, name), v in rows]


def _graph_gpu_us(call) -> float:
    """GPU µs of one call from a CUDA graph: the call runs once eagerly on a side stream (with plans on,
    that records the side stream's plan), is captured on that stream (a cached plan is replayed inside
    the capture, with buffers of the graph's own) and the graph is replayed, timed with events."""
    from hpc_advise.runtime.measure.harness import capture_graph, time_cuda

    graph = capture_graph(call, same_stream=True)
    return time_cuda(graph.replay, graph=False, inner=1, reps=50, warmup=3).p50


def overhead_paths(op, op_small, op_persistent, t: int, k: int, e: int, h: int, i: int, mode: str) -> dict:
    """--launch-overhead: per path that serves T, its config: the tuned pick where it is that path, else
    the path's default (persistent with PDL: T <= 16; small: T <= 32); the regular path always."""
    a2_group = mode.endswith("dynamic")
    cur = op.get_config(t, k, e, h, i, mode, a2_group)
    paths = {}
    if t <= op_persistent.PERSISTENT_T_MAX:
        pers = cur if op_persistent.is_persistent(cur) else None
        paths["persistent"] = pers or dict(op_persistent.default_persistent_config(a2_group), PDL=1)
    if t <= op_small.SMALL_T_MAX:
        paths["small"] = (
            cur if op_small.is_small(cur) else op_small.default_small_config(t, k, e, h, i, a2_group)
        )
    paths["regular"] = op.get_config(t, k, e, h, i, mode, a2_group, allow_small=False)
    return paths


def launch_overhead(shapes: list[str], ts: tuple[int, ...], log=print) -> list[dict]:
    """Host time vs GPU time of one eager call per path (persistent, small-T, regular) at each (shape, T),
    launch plans off (every call checks, looks up its config and goes through Triton's launch dispatch)
    and on (the call signature's plan replays the compiled launches, launch_plan.py), in one process:
    host and wall µs per eager call (``_host_us``), GPU µs of one call from a CUDA graph
    (``_graph_gpu_us``), whether a replayed call's output is bitwise the unplanned one (until the
    2026-11-29 17:33 UTC run: the recording call's), the host µs of the plan key alone,
    and at the first T of each shape the top host functions of the planned call (cProfile)."""
    import functools

    import torch

    from hpc_advise.kernels.fused_moe import launch_plan, op, op_persistent, op_small

    plans = {}
    for shape in shapes:
        e, h, i, k, eg, off = fb.SHAPES[shape]
        mode = fb.MODES[shape][0]
        for t in ts:
            plans[shape, t] = overhead_paths(op, op_small, op_persistent, t, k, e, h, i, mode)
    jobs = [fb.compile_job(s, fb.MODES[s][0], c) for (s, _), p in plans.items() for c in p.values()]
    fb.precompile(jobs)  # builds in parallel
    rows = []
    for shape in shapes:
        e, h, i, k, eg, off, mode, wts, kw = _shape_inputs(shape)
        for t in ts:
            s = fb.make_routings(t, k, eg, h, 1)[0]
            for path, cfg in plans[shape, t].items():
                xs = (s["x"], wts["w13"], wts["w2"], s["w"], s["ids"])
                call = functools.partial(op.fused_moe, *xs, config=cfg, **kw)
                key_args = (*xs, kw["w13_scale"], kw["w2_scale"], kw.get("a13_scale"), kw.get("a2_scale"))
                key_args += (kw.get("block_shape"), off, 1.0, None, cfg)
                row = dict(shape=shape, mode=mode, T=t, path=path, config=cfg)
                try:
                    for label, enabled in (("old", False), ("new", True)):
                        launch_plan.ENABLED = enabled
                        op._PLANS.clear()
                        call()  # compiles (old) / records the plan (new)
                        host, wall = _host_us(call)
                        row.update({f"{label}_host_us": host, f"{label}_wall_us": wall})
                        row[f"{label}_graph_gpu_us"] = _graph_gpu_us(call)
                        row[f"{label}_out"] = call()  # new: a replay of the recorded plan
                    row["new_plans_recorded"] = op._PLANS.records
                    row["bitwise_equal"] = bool(torch.equal(row.pop("old_out"), row.pop("new_out")))
                    row["key_host_us"], _ = _host_us(lambda a=key_args: op._plan_key(*a), calls=1000)
                    if t == ts[0]:
                        row["new_top_host_functions"] = _top_host_functions(call)
                except Exception as exc:
                    log(f"  overhead {shape} T={t} {path}: {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                finally:
                    launch_plan.ENABLED = True
                log(
                    f"  overhead {shape} T={t} {path}: eager host {row['old_host_us']:.1f} -> "
                    f"{row['new_host_us']:.1f} us/call (key {row['key_host_us']:.1f}), eager wall "
                    f"{row['old_wall_us']:.1f} -> {row['new_wall_us']:.1f}, graph GPU {row['old_graph_gpu_us']:.1f}"
                    f" / {row['new_graph_gpu_us']:.1f} us, bitwise {row['bitwise_equal']}"
                )
                for line in row.get("new_top_host_functions", []):
                    log(f"    {line}")
                rows.append(row)
        del wts, kw
        torch.cuda.empty_cache()
    log(overhead_table(rows))
    return rows


def overhead_table(rows: list[dict]) -> str:
    """Markdown table of --launch-overhead rows (µs)."""
    lines = [
        "| shape | T | path | host old | host new | wall old | wall new | GPU (graph) old / new | key | bitwise |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['T']} | {r['path']} | {r['old_host_us']:.1f} | {r['new_host_us']:.1f} | "
            f"{r['old_wall_us']:.1f} | {r['new_wall_us']:.1f} | {r['old_graph_gpu_us']:.1f} / "
            f"{r['new_graph_gpu_us']:.1f} | {r['key_host_us']:.1f} | {'yes' if r['bitwise_equal'] else 'NO'} |"
        )
    return "\n".join(lines)


def persistent_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--persistent: the config ``op.get_config`` picks now (first: the accuracy reference, re-timed
    last), then the one-launch persistent path (op_persistent.py) around its default with PDL: the
    phase-B L2 prefetch, segment / split bound S_MAX 4, 64- and 256-row down tiles, programs per SM
    (capped at what fits), with dynamic a2 4 gate/up stages, with static a2 128-row gate/up tiles and
    64-wide down K steps. (Not timed again: the phase-A prefetch, PREFETCH 2, S_MAX 16 and 5 gate/up
    stages, which lost 3-35% on Qwen3-30B T = 1 at 16:00 UTC, results/fused_moe_decode_t1.md.)"""
    from hpc_advise.kernels.fused_moe import op_persistent

    a2_group = mode.endswith("dynamic")
    base = dict(op_persistent.default_persistent_config(a2_group), PDL=1)
    out = [op.get_config(t, k, e, h, i, mode, a2_group), base, dict(base, PREFETCH=1), dict(base, S_MAX=4)]
    out += [dict(base, DN_N=n) for n in (64, 256)]
    if a2_group:
        out += [dict(base, GU_STAGES=4), dict(base, WARPS=4, PROGS_PER_SM=2)]
    else:
        out += [dict(base, PROGS_PER_SM=p) for p in (1, 3)] + [dict(base, GU_STAGES=6)]
        out += [dict(base, GU_N=128, WARPS=8, PROGS_PER_SM=1), dict(base, GU_N=128), dict(base, DN_K=64)]
    return list({json.dumps(c, sort_keys=True): c for c in out}.values())


def swap_ab_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--swap-ab: the config ``op.get_config`` picks now (first: the accuracy reference and the baseline of the decision),
    then the regular pick (where the current one is a small-T / persistent config) with the gate/up swap,
    the down swap and both; with both, the tile choices the swap changes: one gate/up stage fewer from 4
    (the swapped block-scaled 128-wide tile takes 140 KB of shared memory at 4 stages, 1 program per SM;
    105 KB at 3, sm_90a offline), the other down tile width (64 / 128 rows: the wgmma M side), and the TMA
    weight tiles (+ scalar block scales where allowed) where the pick has pointer tiles. Per-tensor picks
    with gate/up tiles narrower than 64 (two dots of GU_N rows each) are swapped at GU_N 64; where the
    current pick uses PDL, the swapped candidates do too."""
    a2_group = mode.endswith("dynamic")
    cur = op.get_config(t, k, e, h, i, mode, a2_group)
    reg = op.get_config(t, k, e, h, i, mode, a2_group, allow_small=False)
    if mode.startswith("tensor") and reg["GU_N"] < 64:  # separate per-tensor dots: 64 rows for wgmma
        reg = dict(reg, GU_N=64)
    if cur.get("PDL"):  # a small-T / persistent pick with PDL: its regular stand-in launches with it too
        reg = dict(reg, PDL=1)
    both = dict(reg, GU_SWAP_AB=1, DN_SWAP_AB=1)
    out = [cur, dict(reg, GU_SWAP_AB=1), dict(reg, DN_SWAP_AB=1), both]
    if reg["GU_STAGES"] >= 4:
        out.append(dict(both, GU_STAGES=reg["GU_STAGES"] - 1))
    out.append(dict(both, DN_N=192 - reg["DN_N"]) if reg["DN_N"] in (64, 128) else both)
    if not reg.get("W_TMA"):
        tma = dict(both, W_TMA=1)
        if mode.startswith("block") and i % 128 == 0 and reg["GU_N"] <= 128 and reg["DN_N"] <= 128:
            tma["W_SCALAR"] = 1
        out.append(tma)

    def valid(c):  # a swap needs >= 64 weight rows per dot (Hy3's regular pick has 32-wide gate/up tiles)
        try:
            op.check_forms(c, a2_group, a2_group, mode.startswith("block"), h, i)
        except op.FusedMoEError:
            return False
        return True

    out = out[:1] + [c for c in out[1:] if valid(c)]
    return list({json.dumps(c, sort_keys=True): c for c in out}.values())


def _tile_counts(per_block: int, options: tuple[int, ...]) -> list[int]:
    return [n for n in options if n <= per_block and per_block % n == 0]


def _valid_form(op, cfg: dict, mode: str, h: int, i: int) -> bool:
    """Whether ``cfg`` passes the op's config and form checks at a shape (H, I) in scale ``mode``."""
    a2_group = mode.endswith("dynamic")
    try:
        op.check_forms(op.check_config(dict(cfg), a2_group, a2_group), a2_group, a2_group,
                       mode.startswith("block"), h, i)  # fmt: skip
    except op.FusedMoEError:
        return False
    return True


def multi_tile_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--multi-tile: the config ``op.get_config`` picks now (first: the accuracy reference and the baseline of the decision),
    then the regular pick (with PDL where the current pick has it; the one tuned at 4·T where the small-T
    path serves T) with 2 / 3 / 4 gate/up tiles per program,
    with 2 / 4 / 8 down tiles per program (each where it divides that GEMM's tiles per block), and both
    together: the gate/up's smallest count with the down's 2 and 4, and with one gate/up stage more (a
    multi-tile program streams longer, so a deeper pipeline may pay where fewer programs share an SM). At
    T <= 16 with H >= 4096 (few gate/up programs of >= 32 K steps: DeepSeek-V3 EP8 has ~13 active local
    experts x 16 tiles for 132 SMs) also split-K 2 with the SiLU / quantization launch, and split-K 2 / 4
    summed in the gate/up kernel (GU_RED)."""
    a2_group = mode.endswith("dynamic")
    cur = op.get_config(t, k, e, h, i, mode, a2_group)
    # where the small-T path serves T (Hy3 TP8 T = 16), the regular stand-in is the one tuned at 4·T: the
    # default regular config there has 32-wide gate/up tiles and none of the tuned forms
    reg_t = t if cur.get("PATH") is None else min(128, 4 * t)
    reg = op.get_config(reg_t, k, e, h, i, mode, a2_group, allow_small=False)
    if cur.get("PDL"):
        reg = dict(reg, PDL=1)
    reg = {key: v for key, v in reg.items() if key != "PREFETCH"}  # no multi-tile prefetch form
    gus = _tile_counts(-(-i // reg["GU_N"]), (2, 3, 4))
    dns = _tile_counts(-(-h // reg["DN_N"]), (2, 4, 8))
    out = [cur] + [dict(reg, GU_TILES=g) for g in gus] + [dict(reg, DN_TILES=d) for d in dns]
    if gus:
        out += [dict(reg, GU_TILES=gus[0], DN_TILES=d) for d in dns if d <= 4]
        out.append(dict(reg, GU_TILES=gus[0], DN_TILES=dns[0] if dns else 1, GU_STAGES=reg["GU_STAGES"] + 1))
    if t <= 16 and h >= 4096 and reg["SPLIT_K"] == 1:  # few programs of long K loops: split-K 2 / 4
        out += [dict(reg, SPLIT_K=2), dict(reg, SPLIT_K=2, GU_RED=1), dict(reg, SPLIT_K=4, GU_RED=1)]

    out = out[:1] + [c for c in out[1:] if _valid_form(op, c, mode, h, i)]
    return list({json.dumps(c, sort_keys=True): c for c in out}.values())


# ``fb.compile_job`` builds multi-tile programs at an I and H their tile counts divide (the name the tile loops and
# their tests use)
multi_tile_compile_job = fb.compile_job
_fb_compile_job = fb.compile_job


def _prefill_gate_up_spills(cfg: dict, mode: str) -> bool:
    """The prefill gate/up tile whose multi-tile and persistent builds spill in the flattened loop (sm_90a,
    offline, 2026-11-30): block scales, BLOCK_M 128, two dots (the T = 16384 picks) — 176 / 168-byte stack, 41 / 78
    local-memory accesses per trip of the loop with GU_TILES 2 / GU_PERSIST (the one-tile build: 8 bytes, none in
    the loop)."""
    block = mode.startswith("block")
    return block and cfg["BLOCK_M"] >= 128 and bool(cfg.get("GU_TWO_DOTS", 0) or cfg.get("SCALE_LAG", 0))


def prefill_tile_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--prefill-tiles: the config ``op.get_config`` picks now at a prefill T (first: the accuracy reference,
    re-timed last), then the same pick with programs that overlap one tile's ring fill and epilogue with the next
    tile's loads (one flattened, software-pipelined loop over (tile, K step)): DN_TILES 2 / 4 / 8 and GU_TILES
    2 / 3 / 4 adjacent N tiles of a block (each where it divides that GEMM's tiles per block; from the pick's one-tile
    form, itself a candidate where the pick ships tiles), persistent programs
    DN_PERSIST / GU_PERSIST (1 per SM; 2 at BLOCK_M 64, whose one-tile builds fit 2-3 per SM), both GEMMs
    persistent, and the smallest gate/up and down tile counts together. Gate/up forms of a tile whose flattened
    build spills (``_prefill_gate_up_spills``) are left out. Nothing else changes, and every form is bitwise the
    pick's output, so a gain is the overlap's."""
    a2_group = mode.endswith("dynamic")
    cur = op.get_config(t, k, e, h, i, mode, a2_group, allow_small=False)
    # the one-tile form of the pick (a candidate itself where the pick ships tiles), without PREFETCH (no multi-tile
    # or persistent prefetch form) and the half-height tiles (GU_HALF / DN_HALF: no persistent, no gate/up multi-tile
    # form)
    tile_keys = ("PREFETCH", "GU_TILES", "DN_TILES", "GU_PERSIST", "DN_PERSIST", "GU_HALF", "DN_HALF")
    base = {key: v for key, v in cur.items() if key not in tile_keys}
    gus = [] if _prefill_gate_up_spills(base, mode) else _tile_counts(-(-i // base["GU_N"]), (2, 3, 4))
    dns = _tile_counts(-(-h // base["DN_N"]), (2, 4, 8))
    per_sm = (1, 2) if base["BLOCK_M"] <= 64 else (1,)
    out = [cur, base] + [dict(base, DN_TILES=d) for d in dns] + [dict(base, DN_PERSIST=n) for n in per_sm]
    out += [dict(base, GU_TILES=g) for g in gus]
    if not _prefill_gate_up_spills(base, mode):
        out += [dict(base, GU_PERSIST=n) for n in per_sm] + [dict(base, GU_PERSIST=1, DN_PERSIST=1)]
    if gus and dns:
        out.append(dict(base, GU_TILES=gus[0], DN_TILES=dns[0]))

    out = out[:1] + [c for c in out[1:] if _valid_form(op, c, mode, h, i)]
    return list({json.dumps(c, sort_keys=True): c for c in out}.values())


def pingpong_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--pingpong: the config ``op.get_config`` picks now at a prefill T (first: the accuracy reference, re-timed
    last), then the same pick with its down GEMM as the persistent ping-pong Gluon kernel (DN_GLUON 3, DN_WARPS 4,
    kernel_gluon_down.py): 64 x 128 consumer tiles at 4 / 5 / 6 ring stages, at 4 stages also DN_GROUP_M 4 and 16,
    and at BLOCK_M 128 the 128 x 64 tile at 4 stages (call 1 on the H200, 2026-11-30 05:10 UTC: 8 stages and the
    6 / 8-stage 128 x 64 forms were slower at T = 16384). Keys the Gluon kernel has no form of are dropped from the
    pick (op.GLUON_DOWN_EXCLUDES, DN_TILES); per-tensor static scales only (else the pick alone). Every form is
    bitwise the pick's output."""
    cur = op.get_config(t, k, e, h, i, mode, mode.endswith("dynamic"), allow_small=False)
    if mode != "tensor-static":
        return [cur]
    base = {key: v for key, v in cur.items() if key not in (*op.GLUON_DOWN_EXCLUDES, "DN_TILES")}
    base.update(DN_GLUON=3, DN_WARPS=4, DN_K=128, DN_GLUON_M=64, DN_N=128)
    out = [dict(base, DN_STAGES=s) for s in (4, 5, 6)]
    out += [dict(base, DN_STAGES=4, DN_GROUP_M=g) for g in (4, 16)]
    if base["BLOCK_M"] >= 128:
        out.append(dict(base, DN_GLUON_M=128, DN_N=64, DN_STAGES=4))

    return [cur] + [c for c in out if _valid_form(op, c, mode, h, i)]


def prefill_retune_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--prefill-retune: the config ``op.get_config`` picks now at a prefill T (first: the accuracy reference and
    the rule's baseline), then the pick with one of its existing keys moved (every form passing the op's checks).
    Gate/up: GU_STAGES 2 / 3 / 4, GU_GROUP_M 4 / 8 / 16 / 32, the other BLOCK_M (64 <-> 128, 8 gate/up warps; at
    64 also 4 stages: 40 KB a stage), W_TMA flipped, GU_TILES 2 (where it divides the N tiles; no spilling form).
    Down: where the pick runs the ping-pong Gluon kernel (DN_GLUON 3), DN_STAGES 4 / 5 / 6, DN_GROUP_M 4 / 8 / 16
    and the other consumer tile (DN_GLUON_M x DN_N 64 x 128 <-> 128 x 64); else ``pingpong_candidates``' forms.
    Values equal to the pick's are left out; every form computes the same products in the same order."""
    cur = op.get_config(t, k, e, h, i, mode, mode.endswith("dynamic"), allow_small=False)
    out = [dict(cur, GU_STAGES=s) for s in (2, 3, 4)] + [dict(cur, GU_GROUP_M=g) for g in (4, 8, 16, 32)]
    other_m = 192 - cur["BLOCK_M"] if cur["BLOCK_M"] in (64, 128) else None
    full = {
        key: v for key, v in cur.items() if key not in ("GU_HALF", "DN_HALF")
    }  # (no half tiles at 64 / 2 tiles)
    if other_m:
        out.append(dict(full, BLOCK_M=other_m, GU_WARPS=8))
        if other_m == 64:
            out.append(dict(full, BLOCK_M=64, GU_WARPS=8, GU_STAGES=4))
    out.append(dict(cur, W_TMA=1 - cur.get("W_TMA", 0)))
    if (
        not _prefill_gate_up_spills(cur, mode)
        and cur.get("GU_TILES", 1) == 1
        and not cur.get("GU_PERSIST", 0)
    ):
        out.append(dict(full, GU_TILES=2))
    if cur.get("DN_GLUON", 0):
        out += [dict(cur, DN_STAGES=s) for s in (4, 5, 6)] + [dict(cur, DN_GROUP_M=g) for g in (4, 8, 16)]
        tm, bn = cur.get("DN_GLUON_M", 0) or cur["BLOCK_M"], cur["DN_N"]
        if (tm, bn) in ((64, 128), (128, 64)):
            out.append(dict(cur, DN_GLUON_M=bn, DN_N=tm))
    else:
        out += pingpong_candidates(op, t, k, e, h, i, mode)[1:]
    out = [cur] + [c for c in out if c != cur and _valid_form(op, c, mode, h, i)]
    return list({json.dumps(c, sort_keys=True): c for c in out}.values())


def half_tile_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--half-tiles: the config ``op.get_config`` picks now at a prefill T (first: the accuracy reference and the
    rule's baseline), then where the pick is BLOCK_M 128 the same pick with GU_HALF (a 128-row block whose rows 64..
    are padding only runs a 64-row gate/up tile; the pick's output bitwise) and, where its down GEMM is the Triton one,
    with GU_HALF + DN_HALF (the same for the down tiles); where the pick is BLOCK_M 64 (T = 4096), the T = 16384 pick
    of the shape without and with them (BLOCK_M 128 pads each expert further, which is why 64 won there: the half
    tiles take back part of that). Forms equal to the pick are left out; every form passes the op's checks."""
    a2_group = mode.endswith("dynamic")
    cur = op.get_config(t, k, e, h, i, mode, a2_group, allow_small=False)
    base = (
        cur if cur["BLOCK_M"] == 128 else op.get_config(16384, k, e, h, i, mode, a2_group, allow_small=False)
    )
    out = [base, dict(base, GU_HALF=1)] if base["BLOCK_M"] == 128 else []  # (Hy3 TP8: BLOCK_M 64 at every T)
    if out and not base.get("DN_GLUON", 0):
        out.append(dict(base, GU_HALF=1, DN_HALF=1))
    out = [cur] + [c for c in out if c != cur and _valid_form(op, c, mode, h, i)]
    return list({json.dumps(c, sort_keys=True): c for c in out}.values())


SHORT_WINDOW_MIN_GAIN = 0.02  # retune_decision's default bar: the noise of short-window timings (~2 %)


def retune_decision(rows: list[dict], min_gain: float = SHORT_WINDOW_MIN_GAIN) -> tuple[dict, str]:
    """--prefill-retune's rule over one point's interleaved rounds (``prefill_tile_launches`` with ``whole`` and
    ``pick_last``: rows[0] the pick timed first in every round, rows[-1] the pick again last, the candidates
    between, each with ``call_us`` = the median whole call and ``rounds``). The baseline is the better of the pick's
    two medians; the fastest candidate ships only if its median is ``min_gain`` below that AND it beat the round's
    better pick timing in more than half of the rounds (a drift of the GPU's state between rounds hits all alike).
    Returns (the row to ship, why)."""
    pick, again, cands = rows[0], rows[-1], rows[1:-1]
    base = min(pick["call_us"], again["call_us"])
    if not cands:
        return pick, "no candidate"
    best = min(cands, key=lambda r: r["call_us"])
    per_round = [
        min(a["call_us"], b["call_us"]) for a, b in zip(pick["rounds"], again["rounds"], strict=True)
    ]
    wins = sum(r["call_us"] < p for r, p in zip(best["rounds"], per_round, strict=True))
    gain = 1 - best["call_us"] / base
    why = (
        f"best candidate {best['call_us']:.1f} us vs the pick's better median {base:.1f} us ({-100 * gain:+.1f}%), "
        f"faster in {wins} of {len(per_round)} rounds"
    )
    if gain >= min_gain and 2 * wins > len(per_round):
        return best, "ships: " + why
    return pick, "pick kept: " + why


# interleaved rounds of the launch-alone timings (one config drifted up to 14% in one process on the H200)
PREFILL_TILE_ROUNDS = 3
# --pingpong and --prefill-retune / --half-tiles (whose rule reads them: pick first and last in each round,
# retune_decision): the whole call is timed sustained (fb.PREFILL_SETTLE_S first), where two processes agreed
# within 0.2 % (spread_fused_moe.md; the 5 short-window rounds these modes took before spread up to 15 %)
PINGPONG_ROUNDS = fb.SUSTAINED_ROUNDS
RETUNE_ROUNDS = fb.SUSTAINED_ROUNDS


def ship_point(rows: list[dict], out: Path, gpu: str, name: str = "retune", log=print) -> dict:
    """``retune_decision`` (at fb.SUSTAINED_MIN_GAIN) over one point's rows, its pick merged into ``out`` as a
    configs.json entry (p50_us = that config's median whole call); returns the entry."""
    row, why = retune_decision(rows, fb.SUSTAINED_MIN_GAIN)
    r0 = rows[0]
    e, h, i, k = fb.SHAPES[r0["shape"]][:4]
    log(f"  {name} {r0['shape']} {r0['mode']} T={r0['T']}: {why}; {row['config']}")
    entry = dict(E=e, H=h, I=i, top_k=k, mode=r0["mode"], T=r0["T"], config=row["config"],
                 p50_us=round(row["call_us"], 2))  # fmt: skip
    fb.write_configs([entry], out, gpu)
    return entry


def decide_from(jsonl: Path, out: Path, gpu: str) -> list[dict]:
    """--decide: ``ship_point`` again over every point of a --prefill-retune / --half-tiles rows file (the rule
    re-applied to committed measurements, no GPU); returns the entries written."""
    points: dict[tuple, list[dict]] = {}
    for line in jsonl.read_text().splitlines():
        r = json.loads(line)
        points.setdefault((r["shape"], r["mode"], r["T"]), []).append(r)
    return [ship_point(rows, out, gpu, jsonl.stem) for rows in points.values()]


def prefill_retune(shapes: list[str], ts: tuple[int, ...], out: Path, gpu: str, budget_s: float | None = None,
                   log=print, cands_fn=None, name: str = "retune") -> list[dict]:  # fmt: skip
    """--prefill-retune (--half-tiles: ``cands_fn`` = ``half_tile_candidates``, ``name`` "half"): precompile
    ``cands_fn``'s candidates (default ``prefill_retune_candidates``; ``multi_tile_compile_job``), then per point the
    launches alone and the whole call in RETUNE_ROUNDS interleaved rounds, the pick first and again last in each
    (``prefill_tile_launches``; rows appended to $OUT/fused_moe_prefill_<name>_launches.jsonl as each point
    finishes), and ``retune_decision``'s pick merged into ``out`` per point (configs.json as the tuner writes it;
    p50_us = that config's median whole call). Returns the entries written."""
    from hpc_advise.kernels.fused_moe import op

    cands_fn = cands_fn or prefill_retune_candidates
    jobs = []
    for shape in shapes:
        e, h, i, k = fb.SHAPES[shape][:4]
        mode = fb.MODES[shape][0]
        jobs += [multi_tile_compile_job(shape, mode, c) for t in ts
                 for c in cands_fn(op, t, k, e, h, i, mode)]  # fmt: skip
    log(f"{name}: precompiled {fb.precompile(jobs)} of {len(jobs)} jobs")
    jsonl = Path(os.environ.get("OUT", ".")) / f"fused_moe_prefill_{name}_launches.jsonl"
    entries = []

    def decide(rows):
        with open(jsonl, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        entries.append(ship_point(rows, out, gpu, name, log))

    prefill_tile_launches(shapes, ts, log=log, budget_s=budget_s, on_point=decide,
                          cands_fn=cands_fn, whole=True, rounds=RETUNE_ROUNDS, pick_last=True)  # fmt: skip
    return entries


def _accurate(
    op, wts: dict, kw: dict, s: dict, cands: list[dict], where: str, log=print
) -> list[dict | None]:
    """One whole call of each config on routing set ``s``, its output against the first config's: per config
    ``{"rel_diff": ..., "bitwise": ...}``, or None (logged) where it differs by more than fb.TUNE_MAX_REL_DIFF or
    fails (a form that does not build or launch); the first config's own failure is raised."""
    ref, out = None, []
    for n, c in enumerate(cands):
        try:
            got = fb._ours_body(op, wts, kw, c)(s).clone()
        except Exception as exc:
            if n == 0:
                raise
            log(f"  {where} {json.dumps(c, sort_keys=True)}: dropped, {type(exc).__name__}: {str(exc)[:200]}")
            out.append(None)
            continue
        ref = got if ref is None else ref
        diff = float((got.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-30))
        if diff > fb.TUNE_MAX_REL_DIFF:
            log(f"  {where} {json.dumps(c, sort_keys=True)}: dropped, rel diff {diff:.2e} vs the first")
            out.append(None)
            continue
        out.append({"rel_diff": diff, "bitwise": bool((got == ref).all())})
    return out


def _round_times(op, wts: dict, kw: dict, s: dict, cfg: dict, launch, whole: bool, settle: float) -> dict:
    """One round of ``prefill_tile_launches`` for one config: with ``whole`` the whole call first (graph replay after
    ``settle`` seconds of its own load), then each GEMM launch alone (``_stage_times``) in the clock state it left."""
    from hpc_advise.runtime.measure.harness import time_cuda

    call_us = None
    if whole:
        call = fb._ours_body(op, wts, kw, cfg)
        call_us = time_cuda(lambda: call(s), inner=2, reps=5, settle_s=settle).p50
    got = _stage_times(launch, wts["w13"], wts["w2"], s["x"])
    return dict(got, call_us=call_us) if whole else got


def prefill_tile_launches(
    shapes: list[str], ts: tuple[int, ...], log=print, budget_s: float | None = None, on_point=None,
    cands_fn=None, whole: bool = False, rounds: int = PREFILL_TILE_ROUNDS, pick_last: bool = False,
) -> list[dict]:  # fmt: skip
    """--prefill-tiles, after the whole-call tune: µs of each GEMM launch alone (``_stage_times``: graph replay of
    one prepared call's gate/up and down launches) for every ``prefill_tile_candidates`` config (or ``cands_fn``'s)
    of a point, in ``rounds`` interleaved rounds (candidate order repeated, so a drift hits all alike),
    median per launch; with ``whole`` also the whole call (``call_us``, graph replay after fb.PREFILL_SETTLE_S of its
    own load at a prefill T, timed before the launches alone so that they run in the same sustained clock state)
    in the same rounds, after
    each candidate's output is checked against the first's (``_accurate``: dropped beyond fb.TUNE_MAX_REL_DIFF or
    where it fails); with ``pick_last`` the first config (the pick) timed again at the end of every round (its row
    last, ``again`` true); rows with each round's times. With ``budget_s``, later points are skipped once that many seconds have passed;
    ``on_point(rows)`` gets each point's rows as it finishes (a run cut short keeps them)."""
    import statistics
    import time

    import torch

    from hpc_advise.kernels.fused_moe import op

    rows, t0 = [], time.monotonic()
    for shape in shapes:
        e, h, i, k, eg, off, mode, wts, kw = _shape_inputs(shape)
        for t in ts:
            if budget_s is not None and time.monotonic() - t0 > budget_s:
                log(f"  tiles: budget of {budget_s:.0f} s spent, skipping {shape} T={t}")
                continue
            s = fb.make_routings(t, k, eg, h, 1)[0]
            args = _launch_args(s, wts, kw, off)
            settle = fb.PREFILL_SETTLE_S if t >= fb.PREFILL_T_MIN else 0.0
            cands = (cands_fn or prefill_tile_candidates)(op, t, k, e, h, i, mode)
            checks = _accurate(op, wts, kw, s, cands, f"{shape} T={t}", log) if whole else [{} for _ in cands]
            cands, checks = (
                [c for c, d in zip(cands, checks, strict=True) if d is not None],
                [d for d in checks if d is not None],
            )
            launches = [op._Launch(*args[:-1], c) for c in cands]
            if pick_last:  # the pick again at the end of every round (same launch, timed last)
                cands, launches, checks = cands + cands[:1], launches + launches[:1], checks + checks[:1]
            times = [[] for _ in cands]
            for _ in range(rounds):
                for c, launch, got in zip(cands, launches, times, strict=True):
                    got.append(_round_times(op, wts, kw, s, c, launch, whole, settle))
            flops, _ = op.flops_and_bytes(s["ids"], e, h, i, off, wts["block"])
            point = []
            for n, (c, got, check) in enumerate(zip(cands, times, checks, strict=True)):
                row = dict(shape=shape, mode=mode, T=t, config=c, rounds=got, **check)
                if pick_last and n == len(cands) - 1:
                    row["again"] = True
                for key in ("gate_up_us", "down_us") + (("call_us",) if whole else ()):
                    row[key] = statistics.median(r[key] for r in got)
                row["gate_up_tflops"] = flops * 2 / 3 / (row["gate_up_us"] * 1e-6) / 1e12
                row["down_tflops"] = flops / 3 / (row["down_us"] * 1e-6) / 1e12
                diff = {key: v for key, v in c.items() if cands[0].get(key) != v}
                log(
                    f"  tiles {shape} T={t} {'pick again' if row.get('again') else json.dumps(diff, sort_keys=True)}: gate/up {row['gate_up_us']:.1f} us "
                    f"({row['gate_up_tflops']:.0f} TF/s), down {row['down_us']:.1f} us ({row['down_tflops']:.0f} "
                    f"TF/s); rounds gate/up {[round(r['gate_up_us'], 1) for r in got]} down "
                    f"{[round(r['down_us'], 1) for r in got]}"
                    + (
                        f"; call {row['call_us']:.1f} us, rounds {[round(r['call_us'], 1) for r in got]}"
                        if whole
                        else ""
                    )
                )
                point.append(row)
            rows += point
            if on_point:
                on_point(point)
            del launches
            torch.cuda.empty_cache()
        del wts, kw
        torch.cuda.empty_cache()
    return rows


def fuse_quant_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--fuse-quant: the config ``op.get_config`` picks now (first: the accuracy reference and the baseline of the decision),
    then, where that is a small-T PRE_Q pick and T <= FUSE_T_MAX, the same with FUSE_QUANT 1 and 2 (and with
    PDL on both launches where the pick has none: the down grid then launches while gate/up runs), and with
    dynamic group scales both also with FUSE_L1 (the loop's group-scale loads through L1: its sm_90a PTX is
    the PRE_Q loop's); nothing else (the other keys keep the pick's values, so a gain is the fold's)."""
    from hpc_advise.kernels.fused_moe import op_small

    cur = op.get_config(t, k, e, h, i, mode, mode.endswith("dynamic"))
    if not (op_small.is_small(cur) and cur.get("PRE_Q", 0) and t <= op_small.FUSE_T_MAX):
        return [cur]
    out = [cur] + [dict(cur, FUSE_QUANT=f) for f in (1, 2)]
    if mode.endswith("dynamic"):
        out += [dict(cur, FUSE_QUANT=f, FUSE_L1=1) for f in (1, 2)]
    if not cur.get("PDL", 0):
        out += [dict(cur, FUSE_QUANT=f, PDL=1) for f in (1, 2)]
    return list({json.dumps(c, sort_keys=True): c for c in out}.values())


def fuse_quant_compile_job(shape: str, mode: str, cfg: dict, unfused: bool = False) -> tuple:
    """``fb.compile_job``, at the shape's own H for FUSE_QUANT configs: the gate/up prologue's tile
    (Q_GROUPS, Q_CHUNKS) follows the K span H / SPLIT_K, so a build at H = 256 would not serve the shape."""
    job = _fb_compile_job(shape, mode, cfg, unfused)
    return job[:4] + (fb.SHAPES[shape][1],) if cfg.get("FUSE_QUANT", 0) else job


def _lag_spills(cfg: dict) -> bool:
    """The gate/up tile whose lagged form spills in its K loop (sm_90a, offline, 2026-11-30): BLOCK_M 128 × GU_N
    128 at 8 warps holds g, u, the in-flight up product and the gate's fresh product, 4 × 64 registers per
    thread (per-tensor 184-byte stack, 56 LDL/STL per K step; block-scaled 304 bytes, 111)."""
    return cfg["BLOCK_M"] * cfg["GU_N"] >= 128 * 128 and cfg["GU_WARPS"] <= 8


def scale_lag_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--scale-lag: the config ``op.get_config`` picks now (first: the accuracy reference and the baseline of the decision), then
    the same with SCALE_LAG where the path has the form (the regular path, any scales but FAST_ACC; the small-T
    path's PRE_Q loop with group or block scales); on the regular path also GU_TWO_DOTS alone (where the pick is
    the merged dot) and, from 4 gate/up stages, the lag at one stage fewer. Nothing else changes, so a gain is the
    lag's (or the two dots'). Where the pick's tile spills with the lag (``_lag_spills``: the BLOCK_M 128 prefill
    picks) the nearest tile that does not, with and without the lag (so the tile and the lag separate): per-tensor
    GU_N 64 at 3 and 4 stages, block-scaled BLOCK_M 64 with TMA weight tiles at 4 stages (the block-scaled
    two-dot form needs GU_N 128)."""
    from hpc_advise.kernels.fused_moe import op_small

    a2_group = mode.endswith("dynamic")
    block = mode.startswith("block")
    cur = op.get_config(t, k, e, h, i, mode, a2_group)
    if cur.get("PATH") not in (None, "small") or cur.get("FAST_ACC", 0):
        return [cur]
    if op_small.is_small(cur):
        return [cur, dict(cur, SCALE_LAG=1)] if cur.get("PRE_Q", 0) and (a2_group or block) else [cur]
    two_dots = not (a2_group or block) or cur.get("GU_TWO_DOTS", 0)
    out = [cur] if two_dots else [cur, dict(cur, GU_TWO_DOTS=1)]
    if _lag_spills(cur):
        bases = [dict(cur, GU_N=64, GU_STAGES=s) for s in (3, 4)] if not block else []
        bases += [dict(cur, BLOCK_M=64, W_TMA=1, GU_STAGES=4)] if block else []
        out += [c for b in bases for c in (b, dict(b, SCALE_LAG=1))]
    else:
        out.append(dict(cur, SCALE_LAG=1))
        if cur["GU_STAGES"] >= 4:
            out.append(dict(cur, SCALE_LAG=1, GU_STAGES=cur["GU_STAGES"] - 1))

    def valid(c):
        try:
            op.check_forms(op.check_config(dict(c), a2_group, a2_group), a2_group, a2_group, block, h, i)
        except op.FusedMoEError:
            return False
        return True

    out = out[:1] + [c for c in out[1:] if valid(c)]
    return list({json.dumps(c, sort_keys=True): c for c in out}.values())


def occupancy_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--occupancy: the config ``op.get_config`` picks now (first: the accuracy reference and the baseline of the decision), then,
    where that is a regular decode pick (BLOCK_M <= 32), the same with more programs or warps resident per SM.
    sm_90a (offline, triton 3.6, BLOCK_M 16, 128-wide block-scaled TMA tiles, scalar scales, 4 warps): the gate/up
    tile keeps 162-168 registers (swapped at 3-4 stages: 192), so at most 3 programs per SM by registers; shared
    memory is 34-37 KB per stage after the first (4 stages 104 KB: 2 per SM; 3 stages 70 KB: 3, timed in earlier
    rounds; 2 stages 35 KB). Candidates: GU_STAGES 2 (3 per SM, one weight tile in flight per program), the
    unswapped 2-stage tile capped at 128 registers (GU_MAXNREG: 4 per SM; its spill is one 4-byte value stored
    before the K loop and reloaded in the epilogue; the swapped tile spills 184 bytes at 128, so not that one),
    8 gate/up warps (126 registers, 2 per SM with twice the warps); the down tile (4 warps: 72-96 registers)
    at DN_STAGES 3 / 2 (128-wide: 5 per SM by registers instead of 4 by shared memory; swapped 64-wide: 7 / 10
    instead of 5) and 8 down warps; and the 8-warp gate/up with 3 down stages. The values are the pick's
    otherwise (a stage count, a cap or a warp count changes no product; 8 warps may change the MMA order)."""
    cur = op.get_config(t, k, e, h, i, mode, mode.endswith("dynamic"))
    if cur.get("PATH") is not None or cur["BLOCK_M"] > 32:
        return [cur]
    capped = dict(cur, GU_SWAP_AB=0, GU_STAGES=2, GU_MAXNREG=128)
    out = [cur, dict(cur, GU_STAGES=2), capped, dict(cur, GU_WARPS=8)]
    out += [dict(cur, DN_STAGES=s) for s in (3, 2) if s < cur["DN_STAGES"]]
    out += [dict(cur, DN_WARPS=8), dict(cur, GU_WARPS=8, DN_STAGES=3)]
    return list({json.dumps(c, sort_keys=True): c for c in out}.values())


H_GROUP_T_MAX = 4  # the 1x64 forms are tried up to this T (more tokens fill the SMs with 128-wide tiles)
# the 1x64 and 1x128 quantizations of h differ by up to one e4m3 step on about half the elements: 1.9-2.2% of the
# output at Qwen3-235B's H and I (the references alone), 1.9e-2 for the kernel at CPU sizes; a bug gives O(1)
H_GROUP_MAX_REL_DIFF = 6e-2


def h_group_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--h-group: the config ``op.get_config`` picks now (first: the accuracy reference and the baseline of the decision), then,
    where that is a small-T pick with dynamic intermediate scales at T <= H_GROUP_T_MAX, the pick with h in 1×64
    groups (H_GROUP 64, GU_N 64 with 4 warps and 4 stages as Hy3's 64-wide tiles) and the pick's down kernel
    with two groups per 128-wide K step (DN_K 128: its loads, stages and wgmma count), then that form with
    FUSE_QUANT toggled and, where the pick splits K, with one split (SPLIT_K 1: the 64-wide tiles double the
    programs a split was for). PREFETCH is dropped from all of them (it lost at 19 of 20 points, TUNING_LOG.md "Split
    sums"). Measured and not timed again (TUNING_LOG.md "h in 1×64 groups"): the 64-step down kernel (DN_K 64, 4 or 8
    stages) lost to the 128-step one at all six points of the 00:08 UTC run; 6 gate/up stages, 128-row down
    tiles and the 128-wide pick with split 2 summed in gate/up lost at all four points of the 23:47 one.
    ``small_breakdown`` splits the first BREAKDOWN_FORMS of this list."""
    from hpc_advise.kernels.fused_moe import op_small

    cur = op.get_config(t, k, e, h, i, mode, mode.endswith("dynamic"))
    if not (mode.endswith("dynamic") and op_small.is_small(cur) and t <= H_GROUP_T_MAX):
        return [cur]
    base = {key: v for key, v in cur.items() if key != "PREFETCH"}
    g = dict(base, H_GROUP=64, GU_N=64, DN_K=128, GU_WARPS=4, GU_STAGES=4)
    out = [cur, g]
    if t <= op_small.FUSE_T_MAX:
        out.append(dict(g, FUSE_QUANT=0) if g.get("FUSE_QUANT", 0) else dict(g, FUSE_QUANT=1))
    if g["SPLIT_K"] > 1:
        out.append(dict(g, SPLIT_K=1, GU_RED=0, DN_SPLIT=1))
    return list({json.dumps(c, sort_keys=True): c for c in out}.values())


# --small-breakdown: the current pick and the next candidate, its 1x64 form (where the pick is that form already:
# its FUSE_QUANT toggle)
BREAKDOWN_FORMS = 2


SMALL_LAUNCHES = ("_small_quant_kernel", "_small_gate_up_kernel", "_small_down_kernel")


def _launch_only(real, name: str | None, seen: set):
    """``launch_plan.launch`` that launches only the kernel called ``name`` (None: every kernel) and notes
    the names of the kernels the call asked for."""

    def launch(kernel, grid):
        seen.add(kernel.fn.__name__)
        if name is None or kernel.fn.__name__ == name:
            return real(kernel, grid)
        return lambda *args, **kwargs: None

    return launch


def small_breakdown(shapes: list[str], ts: tuple[int, ...], log=print) -> list[dict]:
    """µs (CUDA-graph replay over 8 routings, p50) of the small-T path's whole call and of each of its launches
    alone, for the current pick and its 1×64 form (the first BREAKDOWN_FORMS of ``h_group_candidates``), at each
    (shape, T).
    Launch plans are off (a replayed plan would bypass the filter on ``launch_plan.launch``)."""
    import torch

    from hpc_advise.kernels.fused_moe import launch_plan as LP
    from hpc_advise.kernels.fused_moe import op, op_small
    from hpc_advise.runtime.measure.harness import rotating

    real, enabled = LP.launch, LP.ENABLED
    rows = []
    LP.ENABLED = False
    try:
        for shape in shapes:
            e, h, i, k, eg, off, mode, wts, kw = _shape_inputs(shape)
            for t in ts:
                sets = fb.make_routings(t, k, eg, h, 8)
                for cfg in [
                    c
                    for c in h_group_candidates(op, t, k, e, h, i, mode)[:BREAKDOWN_FORMS]
                    if op_small.is_small(c)
                ]:
                    body = fb._ours_body(op, wts, kw, cfg)
                    row = dict(shape=shape, mode=mode, T=t, config=cfg)
                    seen: set = set()
                    for name in (None, *SMALL_LAUNCHES):
                        if name is not None and name not in seen:
                            continue  # the config makes no such launch (FUSE_QUANT: no quantization launch)
                        LP.launch = _launch_only(real, name, seen)
                        timing, why = fb._time(rotating(sets, body), t)
                        row[f"{name or 'call'}_us"] = round(timing.p50, 2)
                        if why:
                            row[f"{name or 'call'}_eager"] = why
                    alone = sum(
                        v for key, v in row.items() if key.startswith("_small") and key.endswith("_us")
                    )
                    log(
                        f"  small breakdown {shape} T={t} H_GROUP {cfg.get('H_GROUP', 128)} GU_N {cfg['GU_N']}: "
                        + ", ".join(
                            f"{key[:-3].strip('_')} {v:.2f}" for key, v in row.items() if key.endswith("_us")
                        )
                        + f" us; launches alone sum {alone:.2f} us; {json.dumps(cfg, sort_keys=True)}"
                    )
                    rows.append(row)
            del wts, kw
            torch.cuda.empty_cache()
    finally:
        LP.launch, LP.ENABLED = real, enabled
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(fb.SHAPES))
    ap.add_argument("--ts", default=",".join(str(t) for t in fb.TUNE_TS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget", type=float, default=None, help="seconds; later points are skipped")
    ap.add_argument("--breakdown", action="store_true", help="time each launch instead of tuning")
    ap.add_argument(
        "--small-vs-tuned",
        action="store_true",
        help="time only the small-T path's candidates against the config op.get_config picks now",
    )
    ap.add_argument(
        "--variants",
        action="store_true",
        help="time the current pick against its PDL form and the new decode variants",
    )
    ap.add_argument(
        "--prefill-variants",
        action="store_true",
        help="time the current prefill pick against its TMA / scalar-scale / wide-K forms",
    )
    ap.add_argument(
        "--route-reduce",
        action="store_true",
        help="time the current pick against the ranked router / in-kernel top-k sum forms",
    )
    ap.add_argument(
        "--decode-forms",
        action="store_true",
        help="time the current decode pick against the regular path with TMA / scalar-scale forms",
    )
    ap.add_argument(
        "--swap-ab",
        action="store_true",
        help="time the current decode pick against the regular path with its GEMMs swapped (wgmma at 16 rows)",
    )
    ap.add_argument(
        "--multi-tile",
        action="store_true",
        help="time the current decode pick against the regular path with multi-tile GEMM programs",
    )
    ap.add_argument(
        "--prefill-tiles",
        action="store_true",
        help="time the current prefill pick against multi-tile / persistent GEMM programs (call and launches)",
    )
    ap.add_argument(
        "--pingpong",
        action="store_true",
        help="time the current prefill pick against its down GEMM as the ping-pong Gluon kernel (DN_GLUON 3)",
    )
    ap.add_argument(
        "--prefill-retune",
        action="store_true",
        help="time the current prefill pick against one-key moves of its gate/up and down tiles in interleaved "
        "rounds (launches alone and the whole call; the pick first and last) and ship by retune_decision",
    )
    ap.add_argument(
        "--half-tiles",
        action="store_true",
        help="time the current prefill pick against its GEMMs with 64-row tiles for the 128-row blocks whose rows "
        "64.. are padding (GU_HALF, DN_HALF) as --prefill-retune does (interleaved rounds, retune_decision)",
    )
    ap.add_argument(
        "--launch-overhead",
        action="store_true",
        help="host vs GPU time of one eager call on the persistent, small-T and regular paths",
    )
    ap.add_argument(
        "--fuse-quant",
        action="store_true",
        help="time the current small-T pick against its quantization launch folded into gate/up (T <= 4)",
    )
    ap.add_argument(
        "--scale-lag",
        action="store_true",
        help="time the current pick against its up products scaled / promoted one K step late (SCALE_LAG)",
    )
    ap.add_argument(
        "--occupancy",
        action="store_true",
        help="time the current decode pick against more resident gate/up / down programs or warps per SM",
    )
    ap.add_argument(
        "--h-group",
        action="store_true",
        help="time the current small-T pick against its forms with h quantized in 1x64 groups (T <= 4)",
    )
    ap.add_argument(
        "--small-breakdown",
        action="store_true",
        help="time the small-T path's call and each of its launches alone (current pick and its 1x64 form)",
    )
    ap.add_argument(
        "--persistent",
        action="store_true",
        help="time the current pick against the one-launch persistent decode path (T <= 16)",
    )
    ap.add_argument(
        "--decide",
        default=None,
        metavar="JSONL",
        help="re-apply the --prefill-retune rule to the rows file of such a run and merge its picks into --out "
        "(default: the shipped configs.json; no GPU)",
    )
    args = ap.parse_args()
    if args.decide:
        path, out = Path(args.decide), _output_path(args)
        gpu = (
            json.loads(out.read_text()).get("gpu", "unknown") if out.exists() else "unknown"
        )  # the table's GPU
        entries = decide_from(path, out, gpu)
        print(f"wrote {len(entries)} entries from {path}")
        return
    import torch

    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in fb.SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {', '.join(fb.SHAPES)}")
    ts = tuple(int(t) for t in args.ts.split(","))
    for wanted, measure, name in (
        (args.launch_overhead, launch_overhead, "fused_moe_launch_overhead.jsonl"),
        (args.breakdown, breakdown, "fused_moe_breakdown.jsonl"),
        (args.small_breakdown, small_breakdown, "fused_moe_small_breakdown.jsonl"),
    ):
        if wanted:  # rows appended under $OUT on the device machine
            rows = measure(shapes, ts)
            if os.environ.get("OUT"):
                with open(Path(os.environ["OUT"]) / name, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
            return
    out = _output_path(args)
    gpu = torch.cuda.get_device_name()
    if args.prefill_retune or args.half_tiles:  # own loop: interleaved rounds decide, not one timing each
        half = {"cands_fn": half_tile_candidates, "name": "half"} if args.half_tiles else {}
        entries = prefill_retune(shapes, ts, out, gpu, budget_s=args.budget, **half)
        print(f"wrote {len(entries)} entries to {out}")
        return
    if args.persistent:  # the --variants loop over the persistent candidates
        fb.variant_candidates = persistent_candidates
    # merged after every point, so a run cut short by its time limit keeps the points it finished
    entries = fb.tune(
        shapes,
        ts,
        budget_s=args.budget,
        small_vs_tuned=args.small_vs_tuned,
        variants=args.variants or args.persistent,
        route_reduce=args.route_reduce,
        prefill_variants=args.prefill_variants,
        decode_forms=_use_form_loop(args),
        on_entry=lambda done: fb.write_configs(done[-1:], out, gpu),
    )
    fb.write_configs(entries, out, gpu)
    print(f"wrote {len(entries)} entries to {out}")
    if args.prefill_tiles or args.pingpong:  # then each GEMM launch alone, interleaved rounds
        _time_prefill_launches(shapes, ts, args)


def _output_path(args) -> Path:
    """Where the tuned table goes: --out, else under $OUT on the device machine, else the shipped configs.json
    (the persistent candidates never go there: opt-in only, module docstring)."""
    name = "fused_moe_configs_persistent.json" if args.persistent else "fused_moe_configs.json"
    if args.out:
        return Path(args.out)
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / name
    if args.persistent:
        return Path(name)
    return Path(__file__).resolve().parents[1] / "hpc_advise/kernels/fused_moe/configs.json"


# flags whose candidates run through the --decode-forms loop: flag -> (candidate list, compile job or None for
# the default one); the FUSE_QUANT-type forms are built at the shape's H, the tile forms at sizes they divide
_FORM_LOOPS = {
    "swap_ab": (swap_ab_candidates, None),
    "multi_tile": (multi_tile_candidates, multi_tile_compile_job),
    "prefill_tiles": (prefill_tile_candidates, multi_tile_compile_job),
    "pingpong": (pingpong_candidates, multi_tile_compile_job),
    "fuse_quant": (fuse_quant_candidates, fuse_quant_compile_job),
    "scale_lag": (scale_lag_candidates, None),
    "occupancy": (occupancy_candidates, None),
    "h_group": (h_group_candidates, fuse_quant_compile_job),
}


def _use_form_loop(args) -> bool:
    """Point the --decode-forms loop at the candidates of the flag given (_FORM_LOOPS); whether it runs."""
    for flag, (candidates, job) in _FORM_LOOPS.items():
        if getattr(args, flag):
            fb.decode_form_candidates = candidates
            if job is not None:
                fb.compile_job = job
    if args.h_group:  # the 1x64 forms' own accuracy guard
        fb.TUNE_MAX_REL_DIFF = H_GROUP_MAX_REL_DIFF
    return args.decode_forms or any(getattr(args, flag) for flag in _FORM_LOOPS)


def _time_prefill_launches(shapes, ts, args) -> None:
    """After --prefill-tiles / --pingpong: each GEMM launch alone in interleaved rounds, rows appended under $OUT
    per point."""
    name = "pingpong" if args.pingpong else "tiles"
    jsonl = Path(os.environ.get("OUT", ".")) / f"fused_moe_prefill_{name}_launches.jsonl"

    def keep(rows):
        with open(jsonl, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)

    prefill_tile_launches(
        shapes, ts, budget_s=args.budget, on_point=keep,
        cands_fn=pingpong_candidates if args.pingpong else None, whole=args.pingpong,
        rounds=PINGPONG_ROUNDS if args.pingpong else PREFILL_TILE_ROUNDS,
    )  # fmt: skip


if __name__ == "__main__":
    main()
