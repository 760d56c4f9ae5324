"""Sweep launch configs of the FP8 fused MoE and write them as data (configs.json).

    python benchmarks/tune_fused_moe.py [--shapes hy3,hy3-tp8,...] [--ts 1,16,128,4096] [--out PATH]
    python benchmarks/tune_fused_moe.py --breakdown [--shapes ...] [--ts 1024,4096,16384]
    python benchmarks/tune_fused_moe.py --variants [--shapes ...] [--ts 1,16,64,128]
    python benchmarks/tune_fused_moe.py --route-reduce [--shapes ...] [--ts 16,64,128]
    python benchmarks/tune_fused_moe.py --persistent [--shapes ...] [--ts 1,4]
    python benchmarks/tune_fused_moe.py --prefill-variants [--shapes ...] [--ts 1024,4096,16384]
    python benchmarks/tune_fused_moe.py --decode-forms [--shapes ...] [--ts 16,64,128]
    python benchmarks/tune_fused_moe.py --launch-overhead [--shapes ...] [--ts 1]

Times every candidate of ``hpc_advise.runtime.benches.fused_moe.candidates`` per (shape, scale mode,
T) with CUDA-graph replay and keeps the fastest (a candidate whose output differs from the first
candidate's by more than ``TUNE_MAX_REL_DIFF`` is dropped). The output is merged into the file: other
entries are kept, same (E, H, I, top_k, mode, T) replaced. Default output: $OUT/fused_moe_configs.json
on the device machine, else hpc_advise/kernels/fused_moe/configs.json (the file ``op.get_config`` reads).

``--variants`` times, per point, the config ``op.get_config`` picks now against the same with
programmatic dependent launches and the new decode variants (``fb.variant_candidates``: split sums
in the small-T path, PDL), old and new in one process, and keeps the fastest if it beats the current pick by >= 2% (the noise).

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
process; a form replaces the current pick only if >= 2% faster (``fb.DECODE_FORM_MIN_GAIN``).

``--launch-overhead`` tunes nothing: per (shape, T) and path (the persistent, small-T and regular
configs) it measures one eager call's host time (perf_counter around 200 calls without a synchronize:
what the Python side and the launches cost the CPU), the eager wall time per call (the same 200 calls
and one synchronize), the GPU time of a CUDA-graph replay of one call (events), the host time of the
launcher objects alone, and the top host functions of the persistent call (cProfile).

``--persistent`` times, per point, the config ``op.get_config`` picks now against the one-launch
persistent decode path's candidates (``persistent_candidates``), in one process, through the
``--variants`` loop (the current pick re-timed last), and keeps the fastest if >= 2% faster than the current pick.

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


def _stage_times(launch, w13, w2, x) -> dict:
    """µs per launch (graph replay) of one prepared ``op._Launch``."""
    import torch

    from hpc_advise.runtime.benchmarking import time_cuda

    out = torch.empty_like(x)
    launch.prep(x)
    return {
        "gate_up_us": time_cuda(
            lambda: launch.gate_up(w13, launch.inter, launch.inter_s, 0, 1), inner=4, reps=10
        ).p50,
        "down_us": time_cuda(lambda: launch.down(w2, 1.0), inner=4, reps=10).p50,
        "reduce_us": time_cuda(lambda: launch.reduce(out), inner=4, reps=10).p50,
    }


def _variant_stage_times(op, args: tuple, cfg: dict, w2) -> dict:
    """µs of the prep launch with the ranked router (ROUTE = 1) and of the down launch with the top-k
    sum in its epilogue (DN_REDUCE = 1), on the same inputs as ``_stage_times``."""
    import torch

    from hpc_advise.runtime.benchmarking import time_cuda

    x = args[0]
    ranked = op._Launch(*args[:-1], dict(cfg, ROUTE=1))
    prep_us = time_cuda(lambda: ranked.prep(x), inner=4, reps=10).p50
    fused = op._Launch(*args[:-1], dict(cfg, DN_REDUCE=1))
    out = torch.empty_like(x)
    fused.prep(x, out)
    fused.gate_up(args[1], fused.inter, fused.inter_s, 0, 1)
    down_us = time_cuda(lambda: fused.down(w2, 1.0, out), inner=4, reps=10).p50
    return {"prep_ranked_us": prep_us, "down_reduce_us": down_us}


def _prep_time(op, args: tuple, threshold: int) -> float:
    """µs of the prep launch(es) with the multi-CTA router from ``threshold`` entries up."""
    from hpc_advise.runtime.benchmarking import time_cuda

    saved = op.ROUTE_MULTI_MIN_ENTRIES
    op.ROUTE_MULTI_MIN_ENTRIES = threshold
    try:
        launch = op._Launch(*args)
    finally:
        op.ROUTE_MULTI_MIN_ENTRIES = saved
    return time_cuda(lambda: launch.prep(args[0]), inner=4, reps=10).p50


def breakdown(shapes: list[str], ts: tuple[int, ...], log=print) -> list[dict]:
    """Per-launch times (µs, CUDA-graph replay) of ``fused_moe`` at each (shape, T)."""
    import torch

    from hpc_advise.kernels.fused_moe import op

    rows = []
    for shape in shapes:
        e, h, i, k, eg, off = fb.SHAPES[shape]
        mode = fb.MODES[shape][0]
        wts = fb.make_weights(e, h, i, mode)
        kw = fb._kwargs(wts, mode, off)
        for t in ts:
            s = fb.make_routings(t, k, eg, h, 1)[0]
            args = (s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], kw["w13_scale"], kw["w2_scale"])
            args += (kw.get("a13_scale"), kw.get("a2_scale"), kw.get("block_shape"), off, None)
            row = dict(shape=shape, mode=mode, T=t)
            row["prep_single_us"] = _prep_time(op, args, 1 << 62)
            row["prep_multi_us"] = _prep_time(op, args, 1)
            launch = op._Launch(*args)
            if launch.cfg["SPLIT_K"] != 1:
                log(f"  {shape} T={t}: split-K config, breakdown skipped")
                continue
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
                f"{row['down_reduce_us']:.1f} us"
            )
            rows.append(row)
        del wts, kw
        torch.cuda.empty_cache()
    return rows


def _host_us(fn, calls: int = 200) -> tuple[float, float]:
    """(host µs per call: perf_counter around ``calls`` eager calls without a synchronize, wall µs per
    call: the same calls and one synchronize). Equal when the host is the bottleneck (the GPU waits for
    launches); wall > host when the GPU's own time per call is the longer one."""
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


def launch_overhead(shapes: list[str], ts: tuple[int, ...], log=print) -> list[dict]:
    """Host time vs GPU time of one call per path (persistent, small-T, regular) at each (shape, T): host
    and wall µs per eager call (``_host_us``), the GPU µs of a CUDA-graph replay of one call (events), the
    host µs of building the launcher's validated ``op._Launch`` alone, and for the persistent path the
    same eager call with PDL off and its top host functions (cProfile)."""
    import functools

    import torch

    from hpc_advise.kernels.fused_moe import op, op_persistent, op_small
    from hpc_advise.runtime.benchmarking import time_cuda

    rows = []
    for shape in shapes:
        e, h, i, k, eg, off = fb.SHAPES[shape]
        mode = fb.MODES[shape][0]
        a2_group = mode.endswith("dynamic")
        wts = fb.make_weights(e, h, i, mode)
        kw = fb._kwargs(wts, mode, off)
        for t in ts:
            s = fb.make_routings(t, k, eg, h, 1)[0]
            cur = op.get_config(t, k, e, h, i, mode, a2_group)
            small = cur if op_small.is_small(cur) else op_small.default_small_config(t, k, e, h, i, a2_group)
            pers = cur if op_persistent.is_persistent(cur) else None
            pers = pers or dict(op_persistent.default_persistent_config(a2_group), PDL=1)
            paths = {
                "persistent": pers,
                "persistent PDL off": dict(pers, PDL=0),
                "small": small,
                "regular": op.get_config(t, k, e, h, i, mode, a2_group, allow_small=False),
            }
            fb.precompile([fb.compile_job(shape, mode, c) for c in paths.values()])  # builds in parallel
            for path, cfg in paths.items():
                xs = (s["x"], wts["w13"], wts["w2"], s["w"], s["ids"])
                call = functools.partial(op.fused_moe, *xs, config=cfg, **kw)
                args = (*xs, kw["w13_scale"], kw["w2_scale"], kw.get("a13_scale"), kw.get("a2_scale"))
                make_launch = functools.partial(
                    op._Launch, *args, kw.get("block_shape"), off, cfg, allow_small=True
                )
                try:
                    call()
                    host, wall = _host_us(call)
                    gpu = time_cuda(call, inner=1, reps=50, warmup=3).p50
                    launcher, _ = _host_us(make_launch, calls=200)
                except Exception as exc:
                    log(f"  overhead {shape} T={t} {path}: {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                row = dict(shape=shape, mode=mode, T=t, path=path, config=cfg, host_us=host, wall_us=wall)
                row.update(graph_gpu_us=gpu, launch_object_host_us=launcher)
                if path == "persistent":
                    row["top_host_functions"] = _top_host_functions(call)
                log(
                    f"  overhead {shape} T={t} {path}: eager host {host:.1f} us/call, eager wall {wall:.1f} "
                    f"us/call, graph replay (GPU) {gpu:.1f} us, op._Launch alone {launcher:.1f} us"
                )
                for line in row.get("top_host_functions", []):
                    log(f"    {line}")
                rows.append(row)
        del wts, kw
        torch.cuda.empty_cache()
    return rows


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
        "--launch-overhead",
        action="store_true",
        help="host vs GPU time of one eager call on the persistent, small-T and regular paths",
    )
    ap.add_argument(
        "--persistent",
        action="store_true",
        help="time the current pick against the one-launch persistent decode path (T <= 16)",
    )
    args = ap.parse_args()
    import torch

    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in fb.SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {', '.join(fb.SHAPES)}")
    ts = tuple(int(t) for t in args.ts.split(","))
    for wanted, measure, name in (
        (args.launch_overhead, launch_overhead, "fused_moe_launch_overhead.jsonl"),
        (args.breakdown, breakdown, "fused_moe_breakdown.jsonl"),
    ):
        if wanted:  # rows appended under $OUT on the device machine
            rows = measure(shapes, ts)
            if os.environ.get("OUT"):
                with open(Path(os.environ["OUT"]) / name, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
            return
    if args.out:
        out = Path(args.out)
    elif os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "fused_moe_configs.json"
    else:
        out = Path(__file__).resolve().parents[1] / "hpc_advise/kernels/fused_moe/configs.json"
    gpu = torch.cuda.get_device_name()
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
        decode_forms=args.decode_forms,
        on_entry=lambda done: fb.write_configs(done[-1:], out, gpu),
    )
    fb.write_configs(entries, out, gpu)
    print(f"wrote {len(entries)} entries to {out}")


if __name__ == "__main__":
    main()
