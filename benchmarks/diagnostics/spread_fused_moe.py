"""Run-to-run spread of one fused-MoE call under sustained load, with the GPU's clocks and power beside it.

    python benchmarks/diagnostics/spread_fused_moe.py [--shape hy3] [--t 16384] [--seconds 40] [--rest 10] [--tag a]

Why: the same Hy3 T = 16384 prefill config read ~6380 µs in the bench's process and ~6950 µs in the tuner's
(TUNING_LOG "Hy3 prefill retune"), which decides whether 55 % of 1410 TFLOP/s is met. This script replays one
CUDA graph of the call (the bench's inputs: ``benches.fused_moe.make_weights`` / ``make_routings``, the shipped
pick) back to back for ``--seconds``, times every replay with CUDA events, rests ``--rest`` seconds and times a
few replays again, while ``nvidia-smi`` samples SM clock, power, temperature and the clock-event reasons every
100 ms. The fp8 GEMM ceiling (``microbench.run_case``: torch._scaled_mm 8192³) is timed at the start and at the
end, in the same state. Writes spread_fused_moe_<tag>.jsonl (every replay and every nvidia-smi sample) and .md
(windows: median µs, TFLOP/s, mean SM clock and power) under benchmarks/results/ or $OUT.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpc_advise.runtime.measure.cases import fused_moe as fb  # noqa: E402
from hpc_advise.runtime.measure.harness import capture_graph, environment, results_dir  # noqa: E402

SMI_FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"


def start_smi(path: Path) -> subprocess.Popen | None:
    """nvidia-smi sampling every 100 ms into ``path`` (None where nvidia-smi is missing)."""
    try:
        return subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=path.open("w"),
            stderr=subprocess.STDOUT,
        )
    except FileNotFoundError:
        return None


def read_smi(path: Path) -> list[dict]:
    """The samples as dicts with a unix time ``t`` (nvidia-smi prints local wall-clock timestamps)."""
    rows = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6:
            continue
        try:
            t = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            t += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            rows.append(
                {"t": t, "sm_mhz": float(parts[1]), "mem_mhz": float(parts[2]), "power_w": float(parts[3]),
                 "temp_c": float(parts[4]), "reasons": parts[5]}
            )  # fmt: skip
        except ValueError:
            continue
    return rows


def fp8_gemm_tflops() -> float:
    """The profile's fp8 GEMM ceiling now (``microbench``: torch._scaled_mm 8192³, fast accumulation, 0.1 s spin)."""
    from hpc_advise.runtime.measure.microbench import Case, run_case

    return run_case(Case("gemm", "fp8", 8192, fast_accum=True))["p50"]


def add_problem_args(ap: argparse.ArgumentParser, t: int) -> None:
    """--shape / --t: one bench shape at one token count."""
    ap.add_argument("--shape", default="hy3", choices=sorted(fb.SHAPES))
    ap.add_argument("--t", type=int, default=t)


def bench_problem(shape: str, t: int) -> dict:
    """The fused-MoE bench's inputs for ``shape`` at ``t`` tokens (its weights, first routing and call keywords):
    dims (E, H, I, top_k, E global, offset), mode, wts, s, kw."""
    dims = fb.SHAPES[shape]
    e, h, i, k, eg, off = dims
    mode = fb.MODES[shape][0]
    wts = fb.make_weights(e, h, i, mode)
    return {"dims": dims, "mode": mode, "wts": wts, "s": fb.make_routings(t, k, eg, h, 1)[0],
            "kw": fb._kwargs(wts, mode, off)}  # fmt: skip


def replay_loop(graph, inner: int, seconds: float, phase: str, flops: float) -> list[dict]:
    """Replay ``graph`` (``inner`` calls) until ``seconds`` passed; one row per replay."""
    import torch

    rows, t_end = [], time.time() + seconds
    while time.time() < t_end:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        us = s.elapsed_time(e) * 1000.0 / inner
        rows.append({"phase": phase, "t": time.time(), "us": us, "tflops": flops / us * 1e-6})
    return rows


def window(replays: list[dict], smi: list[dict], t0: float, t1: float) -> dict | None:
    """Median of the replays that ended in [t0, t1), with the mean clocks / power sampled then."""
    rs = [r for r in replays if t0 <= r["t"] < t1]
    ss = [s for s in smi if t0 <= s["t"] < t1]
    if not rs:
        return None
    us = statistics.median(r["us"] for r in rs)
    out = {"replays": len(rs), "us": us, "tflops": statistics.median(r["tflops"] for r in rs)}
    if ss:
        out.update(
            sm_mhz=statistics.mean(s["sm_mhz"] for s in ss),
            power_w=statistics.mean(s["power_w"] for s in ss),
            temp_c=max(s["temp_c"] for s in ss),
            reasons=sorted({s["reasons"] for s in ss}),
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_problem_args(ap, 16384)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--rest", type=float, default=10.0)
    ap.add_argument("--tag", default="a")
    args = ap.parse_args()

    from hpc_advise.kernels.fused_moe import op

    out_dir = results_dir()
    smi_path = out_dir / f"spread_fused_moe_{args.tag}_smi.csv"
    smi_proc = start_smi(smi_path)
    pb = bench_problem(args.shape, args.t)
    e, h, i, k, eg, off = pb["dims"]
    mode, wts, s, kw = pb["mode"], pb["wts"], pb["s"], pb["kw"]
    flops, _ = op.flops_and_bytes(s["ids"], e, h, i, off, wts["block"])

    def call():
        return op.fused_moe(s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], **kw)

    inner = 2
    t_start = time.time()
    gemm_start = fp8_gemm_tflops()
    for _ in range(2):
        call()
    graph = capture_graph(call, inner)
    t_load = time.time()
    replays = replay_loop(graph, inner, args.seconds, "load", flops)
    gemm_end = fp8_gemm_tflops()
    time.sleep(args.rest)
    t_rest = time.time()
    replays += replay_loop(graph, inner, 1.0, "after rest", flops)
    time.sleep(0.5)
    if smi_proc is not None:
        smi_proc.terminate()
        smi_proc.wait()
    smi = read_smi(smi_path) if smi_proc is not None else []

    edges = [0.0] + [x for x in (2.0, 10.0, 25.0) if x < args.seconds] + [args.seconds]
    spans = [(f"{a:g}-{b:g} s", t_load + a, t_load + b) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    spans.append(("after rest (1 s)", t_rest, t_rest + 1.0))
    table = [(name, window(replays, smi, a, b)) for name, a, b in spans]
    env = environment()
    with (out_dir / f"spread_fused_moe_{args.tag}.jsonl").open("w") as f:
        meta = {"kind": "meta", "shape": args.shape, "T": args.t, "mode": mode, "flops": flops, "t_start": t_start,
                "gemm_tflops_start": gemm_start, "gemm_tflops_end": gemm_end, "env": env}  # fmt: skip
        f.write(json.dumps(meta) + "\n")
        for r in replays:
            f.write(json.dumps({"kind": "replay", **r}) + "\n")
        for r in smi:
            f.write(json.dumps({"kind": "smi", **r}) + "\n")
    lines = [
        f"# fused_moe spread: {args.shape} T = {args.t} ({mode}), shipped pick, {args.seconds:.0f} s of back-to-back "
        f"graph replays ({inner} calls each)",
        "",
        f"- GPU: {env.get('gpu', '?')}; versions: torch {env.get('torch', '?')}, triton {env.get('triton', '?')}",
        f"- command: `python3 benchmarks/diagnostics/spread_fused_moe.py --shape {args.shape} --t {args.t} "
        f"--seconds {args.seconds:g} --rest {args.rest:g} --tag {args.tag}`",
        f"- fp8 GEMM ceiling (microbench: torch._scaled_mm 8192³, fast acc.): {gemm_start:.0f} TFLOP/s before the load, "
        f"{gemm_end:.0f} right after it",
        "",
        "| window | replays | µs / call (p50) | TFLOP/s | % of 1410 | SM MHz | power W | max °C | clock-event reasons |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, w in table:
        if w is None:
            continue
        lines.append(
            f"| {name} | {w['replays']} | {w['us']:.0f} | {w['tflops']:.0f} | {100 * w['tflops'] / 1410:.1f} | "
            f"{w.get('sm_mhz', float('nan')):.0f} | {w.get('power_w', float('nan')):.0f} | "
            f"{w.get('temp_c', float('nan')):.0f} | {' '.join(w.get('reasons', []))} |"
        )
    (out_dir / f"spread_fused_moe_{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
