"""Sweep launch configs of the FP8 fused MoE and write them as data (configs.json).

    python benchmarks/tune_fused_moe.py [--shapes hy3,hy3-tp8,...] [--ts 1,16,128,4096] [--out PATH]
    python benchmarks/tune_fused_moe.py --breakdown [--shapes ...] [--ts 1024,4096,16384]
    python benchmarks/tune_fused_moe.py --variants [--shapes ...] [--ts 1,16,64,128]
    python benchmarks/tune_fused_moe.py --route-reduce [--shapes ...] [--ts 16,64,128]
    python benchmarks/tune_fused_moe.py --persistent [--shapes ...] [--ts 1,4]
    python benchmarks/tune_fused_moe.py --prefill-variants [--shapes ...] [--ts 1024,4096,16384]

Times every candidate of ``hpc_advise.runtime.benches.fused_moe.candidates`` per (shape, scale mode,
T) with CUDA-graph replay and keeps the fastest (a candidate whose output differs from the first
candidate's by more than ``TUNE_MAX_REL_DIFF`` is dropped). The output is merged into the file: other
entries are kept, same (E, H, I, top_k, mode, T) replaced. Default output: $OUT/fused_moe_configs.json
on the device machine, else hpc_advise/kernels/fused_moe/configs.json (the file ``op.get_config`` reads).

``--variants`` times, per point, the config ``op.get_config`` picks now against the same with
programmatic dependent launches and the new decode variants (``fb.variant_candidates``: split sums
in the small-T path, PDL), old and new in one process, and keeps the fastest.

``--route-reduce`` times, per point, the config ``op.get_config`` picks now against the regular decode
path with the ranked router (ROUTE), the top-k sum in the down kernel (DN_REDUCE) and both, plus
pipeline-depth and tile candidates with both (``fb.route_reduce_candidates``), in one process.

``--prefill-variants`` times, per point (T >= 1024), the config ``op.get_config`` picks now against the
TMA weight tiles (W_TMA), scalar block scales (W_SCALAR), BLOCK_M 128 with separate gate/up dots
(GU_TWO_DOTS) and, with per-tensor scales, fp32 promotion every 256 (GU_K / DN_K = 256), in one process
(``fb.prefill_variant_candidates``; forms more than 5e-3 from the current pick are dropped).

``--persistent`` times, per point, the config ``op.get_config`` picks now against the one-launch
persistent decode path's candidates (``persistent_candidates``), in one process, through the
``--variants`` loop (the current pick re-timed last), and keeps the fastest.

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


def persistent_candidates(op, t: int, k: int, e: int, h: int, i: int, mode: str) -> list[dict]:
    """--persistent: the config ``op.get_config`` picks now (first: the accuracy reference, re-timed
    last), then the one-launch persistent path (op_persistent.py) around its default with PDL: the
    phase-A / phase-B L2 prefetches, gate/up pipeline depth, segment / split bound S_MAX, 64- and
    256-row down tiles, programs per SM (capped at what fits), and with static a2 128-row gate/up tiles and 64-wide
    down K steps."""
    from hpc_advise.kernels.fused_moe import op_persistent

    a2_group = mode.endswith("dynamic")
    base = dict(op_persistent.default_persistent_config(a2_group), PDL=1)
    out = [
        op.get_config(t, k, e, h, i, mode, a2_group),
        base,
        dict(base, PREFETCH_A=1),
        dict(base, PREFETCH=1),
        dict(base, PREFETCH=2, PREFETCH_A=1),
    ]
    out += [dict(base, S_MAX=s) for s in (4, 16)] + [dict(base, DN_N=n) for n in (64, 256)]
    if a2_group:
        out += [dict(base, GU_STAGES=s) for s in (4, 5)] + [dict(base, WARPS=4, PROGS_PER_SM=2)]
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
    if args.breakdown:
        import json

        rows = breakdown(shapes, ts)
        if os.environ.get("OUT"):
            with open(Path(os.environ["OUT"]) / "fused_moe_breakdown.jsonl", "a") as f:
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
        on_entry=lambda done: fb.write_configs(done[-1:], out, gpu),
    )
    fb.write_configs(entries, out, gpu)
    print(f"wrote {len(entries)} entries to {out}")


if __name__ == "__main__":
    main()
