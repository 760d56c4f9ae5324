"""Fit the communication-time predictor on measured ``comm`` rows and report its held-out error.

    python benchmarks/diagnostics/fit_comm.py ROWS.jsonl [ROWS2.jsonl ...] [--min-world-size 2]

ROWS.jsonl: ``runs`` rows as ``hpc-advise profile --bench comm --write-results`` or
``comm_bench.measure`` write them. Prints Markdown, per timing mode (eager / graph): the held-out
error (fit on every other size, predict the rest; ``hpc_advise.advisor.comm_model.holdout``) beside
the flat bytes / peak-bus-bandwidth model, and the fitted segments of each collective fitted on all
sizes (what ``comm_bench.measured_figures`` hands to the GPU profile).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpc_advise.advisor import comm_model as cm  # noqa: E402


def load(paths: list[Path]) -> list[dict]:
    rows = []
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{n}: not JSON: {exc.msg}") from None
    return rows


def report(rows: list[dict], min_ws: int) -> str:
    out = []
    by_timing: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("kind") == "comm":
            by_timing.setdefault(r["config"].get("timing", "eager").split(" ")[0], []).append(r)
    for timing, group in sorted(by_timing.items()):
        out += [f"### {timing} timing: held-out error (fit on every other size, predict the rest)", ""]
        out += [cm.holdout_markdown(cm.holdout(group, min_world_size=min_ws)), ""]
        out += [f"### {timing} timing: fitted on every size", "",
                "| collective | GPUs | segment | sizes up to | alpha µs | GB/s |", "|---|---|---|---|---|---|"]  # fmt: skip
        for (op, ws), fit in sorted(cm.fit_rows(group, min_world_size=min_ws).items()):
            for i, s in enumerate(fit.segments):
                upto = "∞" if s.upto_bytes == float("inf") else f"{s.upto_bytes / 2**20:.3g} MiB"
                gbps = "-" if s.gbps == 0 else f"{s.gbps:.1f}"
                out.append(f"| {op} | {ws} | {i} | {upto} | {s.alpha_us:.1f} | {gbps} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+", type=Path)
    ap.add_argument("--min-world-size", type=int, default=2)
    args = ap.parse_args()
    print(report(load(args.rows), args.min_world_size))


if __name__ == "__main__":
    main()
