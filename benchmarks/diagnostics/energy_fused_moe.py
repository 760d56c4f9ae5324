"""Energy per call of fused-MoE config variants under sustained load: the whole call and its down GEMM alone.

    python benchmarks/diagnostics/energy_fused_moe.py [--shape hy3] [--t 4096] [--variant '{"DN_GLUON": 3, ...}'] [--seconds 8]
        [--rounds 2] [--tag a]

The question (TUNING_LOG "Prefill under the power cap"): at the H200's 700 W cap a call's time is its energy over
~693 W, so does a launch that is faster alone (the ping-pong down GEMM at Hy3 T = 4096: -26 %) also spend less energy,
and does the whole call then get faster? Each variant (the shipped pick, then the pick with each ``--variant``'s keys
over it) is captured twice in a CUDA graph: the whole call, and the down launch alone on a prepared
``op._Launch`` (routing, quantization and gate/up run once before). The graphs replay back to back in rounds
(every variant's call, then every variant's down launch, per round), ``--seconds`` each; per window, after its first
second: median µs per call, joules per call from NVML's total-energy counter (nvidia-ml-py; without it, from the
nvidia-smi power samples), mean power and SM clock. Writes energy_fused_moe_<tag>.md / .jsonl (window summaries and
the nvidia-smi samples) under benchmarks/results/ or $OUT.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spread_fused_moe import add_problem_args, bench_problem, read_smi, replay_loop, start_smi  # noqa: E402

from hpc_advise.runtime.measure.harness import capture_graph, environment, results_dir  # noqa: E402

SKIP_S = 1.0  # each window's first second is not counted (the previous graph's load hands over)


def energy_reader():
    """A function returning the GPU's total energy in joules (NVML), or None without nvidia-ml-py."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0
    except Exception:  # no bindings or no NVML: fall back to the power samples
        return None


def graphs(op, s: dict, wts: dict, kw: dict, cfg: dict, inner: int) -> dict:
    """{'call': graph of ``inner`` whole calls, 'down': graph of ``inner`` down launches} for config ``cfg``."""
    import torch

    def call():
        return op.fused_moe(s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], config=cfg, **kw)

    call()
    launch = op._Launch(s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], kw["w13_scale"], kw["w2_scale"],
                        kw.get("a13_scale"), kw.get("a2_scale"), kw.get("block_shape"), kw["expert_offset"], cfg)  # fmt: skip
    launch.prep(s["x"])
    launch.gate_up(wts["w13"], launch.inter, launch.inter_s, 0, 1)
    torch.cuda.synchronize()
    return {
        "call": capture_graph(call, inner),
        "down": capture_graph(lambda: launch.down(wts["w2"], 1.0), inner),
    }


def measure(graph, inner: int, seconds: float, energy) -> dict:
    """One window of back-to-back replays: µs per call (median after SKIP_S), J per call, W, replay rows."""
    rows = replay_loop(graph, inner, SKIP_S, "skip", 0.0)
    t0, e0 = time.time(), energy() if energy else None
    counted = replay_loop(graph, inner, seconds - SKIP_S, "count", 0.0)
    t1, e1 = time.time(), energy() if energy else None
    out = {
        "us": statistics.median(r["us"] for r in counted),
        "calls": inner * len(counted),
        "t0": t0,
        "t1": t1,
    }
    if energy:
        out["joules"] = e1 - e0
    return out | {"rows": rows + counted}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_problem_args(ap, 4096)
    ap.add_argument(
        "--variant", action="append", default=[], help="JSON config keys over the pick (repeatable)"
    )
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tag", default="a")
    args = ap.parse_args()

    from hpc_advise.kernels.fused_moe import op

    out_dir = results_dir()
    smi_path = out_dir / f"energy_fused_moe_{args.tag}_smi.csv"
    smi_proc = start_smi(smi_path)
    energy = energy_reader()
    pb = bench_problem(args.shape, args.t)
    e, h, i, k, _, _ = pb["dims"]
    mode, wts, s, kw = pb["mode"], pb["wts"], pb["s"], pb["kw"]
    pick = op.get_config(args.t, k, e, h, i, mode, wts["block"], allow_small=False)
    variants = [("pick", pick)] + [(v, dict(pick, **json.loads(v))) for v in args.variant]
    built = {name: graphs(op, s, wts, kw, cfg, 2) for name, cfg in variants}
    windows = []
    for rnd in range(args.rounds):
        for what in ("call", "down"):
            for name, _ in variants:
                w = measure(built[name][what], 2, args.seconds, energy)
                windows.append({"round": rnd, "what": what, "variant": name, **w})
    if smi_proc is not None:
        smi_proc.terminate()
        smi_proc.wait()
    smi = read_smi(smi_path) if smi_proc is not None else []
    for w in windows:
        ss = [x for x in smi if w["t0"] <= x["t"] < w["t1"]]
        if ss:
            w["sm_mhz"] = statistics.mean(x["sm_mhz"] for x in ss)
            w["power_w_smi"] = statistics.mean(x["power_w"] for x in ss)
        if "joules" not in w and ss:  # no NVML energy counter: power samples x time
            w["joules"] = w["power_w_smi"] * (w["t1"] - w["t0"])
    env = environment()
    with (out_dir / f"energy_fused_moe_{args.tag}.jsonl").open("w") as f:
        meta = {"kind": "meta", "shape": args.shape, "T": args.t, "mode": mode, "pick": pick,
                "variants": [v for v, _ in variants], "energy": "nvml" if energy else "nvidia-smi power", "env": env}  # fmt: skip
        f.write(json.dumps(meta) + "\n")
        for w in windows:  # the windows' summaries (not every replay: thousands per window)
            w.pop("rows")
            f.write(json.dumps({"kind": "window", **w}) + "\n")
        f.writelines(json.dumps({"kind": "smi", **r}) + "\n" for r in smi)
    lines = [
        f"# fused_moe energy per call: {args.shape} T = {args.t} ({mode}), {args.rounds} rounds of {args.seconds:g} s "
        f"windows (first {SKIP_S:g} s of each not counted); energy from "
        f"{'NVML total-energy counter' if energy else 'nvidia-smi power samples'}",
        "",
        f"- GPU: {env.get('gpu', '?')}; versions: torch {env.get('torch', '?')}, triton {env.get('triton', '?')}",
        "- command: `python3 benchmarks/diagnostics/energy_fused_moe.py " + shlex.join(sys.argv[1:]) + "`",
        f"- pick: `{json.dumps(pick)}`",
        "",
        "| round | graph | variant | µs / call (p50) | J / call | W (energy / time) | SM MHz |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in windows:
        j = w.get("joules")
        per = f"{j / w['calls']:.3f}" if j is not None else "n/a"
        watts = f"{j / (w['t1'] - w['t0']):.0f}" if j is not None else "n/a"
        lines.append(
            f"| {w['round']} | {w['what']} | {w['variant']} | {w['us']:.1f} | {per} | {watts} | "
            f"{w.get('sm_mhz', float('nan')):.0f} |"
        )
    (out_dir / f"energy_fused_moe_{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
