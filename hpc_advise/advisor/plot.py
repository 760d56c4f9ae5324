"""Pareto chart of ranked candidates (output tokens/s per GPU at their capacity, ``recommend``'s
"max tok/s/GPU", vs TPOT p50 at the trace's load; SLO line marked) as a PNG. At the trace's load
every candidate that keeps up serves the same tokens/s, so that would plot a vertical line.

matplotlib is an optional extra (``pip install 'hpc-advise[plot]'``); it is imported only here, with the
non-interactive Agg backend, and its absence is a clear error.
"""

from __future__ import annotations

from pathlib import Path


class PlotUnavailable(RuntimeError):
    pass


def pareto_png(ranked: list, path: str | Path, slo_tpot_ms: float | None = None, title: str = "") -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'hpc-advise[plot]'") from exc
    pts = [(r.tpot_p50, r.max_tok_s_per_gpu, r) for r in ranked if r.tpot_p50 == r.tpot_p50]
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12, color="0.6", label="candidates")
    front, best = [], -1.0
    for x, y, r in sorted(pts, key=lambda p: (p[0], -p[1])):
        if y > best:
            front.append((x, y, r))
            best = y
    ax.plot([p[0] for p in front], [p[1] for p in front], "o-", color="C0", label="Pareto front")
    for x, y, r in front[:8]:
        ax.annotate(r.candidate.label(), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    if ranked:
        top = ranked[0]
        ax.scatter(
            [top.tpot_p50], [top.max_tok_s_per_gpu], s=80, marker="*", color="C3", label="top pick", zorder=5
        )
    if slo_tpot_ms:
        ax.axvline(slo_tpot_ms, color="C3", linestyle="--", label=f"TPOT SLO {slo_tpot_ms:g} ms")
    ax.set_xlabel("TPOT p50 (ms)")
    ax.set_ylabel("max output tokens/s per GPU (at capacity)")
    ax.set_title(title or "hpc-advise recommend")
    ax.legend(fontsize=7)
    out = Path(path)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out
