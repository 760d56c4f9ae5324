"""Benchmark the FP32-accurate router GEMM against cuBLAS FP32 / TF32 / BF16 and write the results table.

    python benchmarks/bench_router_gemm.py [--grid full|small] [--no-peers] [--configs PATH] [--no-accuracy]
        [--ship]

Writes router_gemm.md/.jsonl under benchmarks/results/ (or $OUT on the device machine). --configs times the
kernel with the launch configs of that configs.json instead of the package's (the table
benchmarks/tune_router_gemm.py writes; copy it to hpc_advise/kernels/router_gemm/configs.json to keep it).
With --ship router_gemm.jsonl is also copied into the package (hpc_advise/advisor/data/kernel_results/,
benchmarks/ship.py); without it the advisor's data is not touched.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ship import ship  # noqa: E402  (benchmarks/ship.py, beside this script)
from tune_router_gemm import use_table  # noqa: E402

from hpc_advise.runtime.measure.cases import router_gemm as rb  # noqa: E402
from hpc_advise.runtime.measure.harness import write_results  # noqa: E402

NOTES = """\
Timing: CUDA-graph replay (hpc_advise.runtime.measure.harness.time_cuda), p50 of 20 replays. Every call
reads its own x and its own weight copy; one replay walks through enough copies to touch more than
2x the L2 size, so x and W come from HBM (as in serving, where the rest of the forward pass evicts a
layer's router weight between uses). cuBLAS FP32/TF32 include the x bf16->fp32 cast. floor = max(bytes
/ copy bandwidth, 2 products x 2MNK / bf16 rate), bytes = hi+lo (4NK) + x (2MK) + logits (4MN), with the
GPU profile's measured ceilings. ours fp32-x = fp32 x split in registers, 3 products. x FP32 / x TF32 =
their time / ours. hot-W (M <= 64 only): the same calls with one shared weight (L2-resident after the
first call, x still rotating), the optimistic case in which nothing evicts the router weight.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", choices=("full", "small"), default="full")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument(
        "--configs", type=Path, default=None, help="a configs.json to time instead of the package's"
    )
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--ship", action="store_true", help="copy the jsonl into the package's kernel tables")
    args = ap.parse_args()
    if args.configs is not None:
        use_table(args.configs)
    rows, table, headers = rb.bench(grid=args.grid, peers=not args.no_peers)
    notes = NOTES
    if not args.no_accuracy and args.grid == "full":
        acc_rows, lines = rb.accuracy()
        rows += acc_rows
        notes += "\nAccuracy (fresh N(0, 0.02) weights, N(0, 1) x, vs float64; top-8 vs cuBLAS FP32):\n"
        notes += "\n".join(lines) + "\n"
    md, jl = write_results(
        rows,
        table,
        headers,
        stem="router_gemm",
        title="Router GEMM (x bf16 · fp32 W → fp32 logits), H200",
        notes=notes,
    )
    print(md.read_text())
    if args.ship:
        print(f"shipped {ship(jl)}")


if __name__ == "__main__":
    main()
