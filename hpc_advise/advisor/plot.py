"""Pareto chart of ranked candidates as an image: output tokens/s per GPU at their capacity
(``recommend``'s "max tok/s/GPU") against TPOT p99 at the trace's load. At the trace's load every
candidate that keeps up serves the same tokens/s, so that would plot a vertical line.

The x axis is TPOT p99 because the SLOs are checked at p99: the TPOT SLO is a vertical line on the
same axis, and candidates whose TTFT p99 misses the TTFT SLO are marked (TTFT has no axis here). A
candidate with no capacity at the trace's load (it cannot keep up at all) is drawn but never on the
front.

matplotlib is an optional extra (``pip install 'hpc-advise[plot]'``); it is imported only here, with the
non-interactive Agg backend, and its absence is a clear error.
"""

from __future__ import annotations

import math
from pathlib import Path


class PlotUnavailable(RuntimeError):
    pass


def pareto_front(ranked: list) -> list:
    """The candidates no other beats on both lower TPOT p99 and higher capacity tokens/s, lowest TPOT
    first; candidates with zero capacity or an unknown TPOT are left out."""
    pts = [r for r in ranked if math.isfinite(r.tpot_p99) and r.max_tok_s_per_gpu > 0]
    front, best = [], 0.0
    for r in sorted(pts, key=lambda r: (r.tpot_p99, -r.max_tok_s_per_gpu)):
        if r.max_tok_s_per_gpu > best:
            front.append(r)
            best = r.max_tok_s_per_gpu
    return front


def pareto_png(
    ranked: list,
    path: str | Path,
    slo_tpot_ms: float | None = None,
    slo_ttft_ms: float | None = None,
    title: str = "",
) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'hpc-advise[plot]'") from exc
    pts = [r for r in ranked if math.isfinite(r.tpot_p99)]
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter([r.tpot_p99 for r in pts], [r.max_tok_s_per_gpu for r in pts], s=12, color="0.6",
               label="candidates")  # fmt: skip
    front = pareto_front(ranked)
    ax.plot([r.tpot_p99 for r in front], [r.max_tok_s_per_gpu for r in front], "o-", color="C0",
            label="Pareto front")  # fmt: skip
    for r in front[:8]:
        ax.annotate(r.candidate.label(), (r.tpot_p99, r.max_tok_s_per_gpu), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")  # fmt: skip
    if ranked and math.isfinite(ranked[0].tpot_p99):
        top = ranked[0]
        ax.scatter([top.tpot_p99], [top.max_tok_s_per_gpu], s=80, marker="*", color="C3", label="top pick",
                   zorder=5)  # fmt: skip
    if slo_tpot_ms:
        ax.axvline(slo_tpot_ms, color="C3", linestyle="--", label=f"TPOT SLO {slo_tpot_ms:g} ms (p99)")
    if slo_ttft_ms:
        miss = [r for r in pts if not r.ttft_p99 <= slo_ttft_ms]
        ax.scatter([r.tpot_p99 for r in miss], [r.max_tok_s_per_gpu for r in miss], s=40, marker="x",
                   color="C1", label=f"misses TTFT SLO {slo_ttft_ms:g} ms (p99): {len(miss)}", zorder=4)  # fmt: skip
    ax.set_xlabel("TPOT p99 (ms) at the trace's load")
    ax.set_ylabel("max output tokens/s per GPU (at capacity)")
    ax.set_title(title or "hpc-advise recommend")
    ax.legend(fontsize=7)
    out = Path(path)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out
