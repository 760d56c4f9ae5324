"""Sweep launch configs of the FP8 fused MoE and write them as data (configs.json).

    python benchmarks/tune_fused_moe.py [--shapes hy3,hy3-tp8,...] [--ts 1,16,128,4096] [--out PATH]

Times every candidate of ``hpc_advise.runtime.benches.fused_moe.candidates`` per (shape, scale mode,
T) with CUDA-graph replay and keeps the fastest. Default output: $OUT/fused_moe_configs.json on the
device machine, else hpc_advise/kernels/fused_moe/configs.json (the file ``op.get_config`` reads).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpc_advise.runtime.benches import fused_moe as fb  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(fb.SHAPES))
    ap.add_argument("--ts", default=",".join(str(t) for t in fb.TUNE_TS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget", type=float, default=None, help="seconds; later points are skipped")
    args = ap.parse_args()
    import torch

    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in fb.SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {', '.join(fb.SHAPES)}")
    ts = tuple(int(t) for t in args.ts.split(","))
    entries = fb.tune(shapes, ts, budget_s=args.budget)
    if args.out:
        out = Path(args.out)
    elif os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "fused_moe_configs.json"
    else:
        out = Path(__file__).resolve().parents[1] / "hpc_advise/kernels/fused_moe/configs.json"
    fb.write_configs(entries, out, torch.cuda.get_device_name())
    print(f"wrote {len(entries)} entries to {out}")


if __name__ == "__main__":
    main()
