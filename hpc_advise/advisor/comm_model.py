"""Communication-time predictor fitted on measured collectives (``kind = 'comm'`` runs rows).

Per collective and world size the time of one call is piecewise alpha-beta in the message size:
``t(b) = alpha_i + b / beta_i`` on segment i (sizes up to ``upto_i`` bytes), µs. Small messages are
latency-bound (alpha dominates, NCCL's low-latency protocols), large ones bandwidth-bound; NCCL switches
protocol and algorithm in between, which one straight line misses by 2x or more at the middle sizes.
``bytes`` is the size nccl-tests (and ``runtime.comm_bench``) report: the per-rank buffer of all-reduce
and all-to-all, the gathered output of all-gather, the reduced input of reduce-scatter; the advisor's
``roofline._collective`` passes the same.

Fit (``fit_points``): each segment by least squares on the *relative* error (sizes span 4 KB to 1 GB,
so an absolute fit would only see the largest), with alpha >= 0 and 1/beta >= 0; the breakpoints by
exhaustive search over 1 to 3 segments of at least 3 sizes each, the number of segments chosen by BIC
on the relative residuals. A prediction uses the segment whose range holds the size; a segment hands
over to the next where their lines cross, clipped to the gap between the two segments' measured sizes.

Held-out error (``holdout``): fit on every other measured size, predict the others, report the median
and maximum relative error; beside it the same error of the flat model the advisor used before
(bus-bandwidth factor x bytes / peak bus bandwidth, no latency).

Figures (``to_figures`` / ``fits_from_figures``): a fit travels in a GPU profile's measured figures as
flat floats, ``{op}_ws{n}_s{i}_alpha_us``, ``{op}_ws{n}_s{i}_gbps`` (10**9 bytes/s; 0 = no bandwidth term)
and ``{op}_ws{n}_s{i}_upto_bytes`` (absent on the last segment), op in allreduce, allgather,
reducescatter, alltoall. No torch here: the advisor runs on a CPU-only laptop.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# comm_bench's op names -> the advisor's (roofline._collective, GPU profile figure names)
OP_NAMES = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "all_to_all": "alltoall",
}
BUSBW_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}
MAX_SEGMENTS = 3
MIN_POINTS = 3  # sizes per segment
_KEY = re.compile(r"^(allreduce|allgather|reducescatter|alltoall)_ws(\d+)_s(\d+)_(alpha_us|gbps|upto_bytes)$")


@dataclass(frozen=True)
class Segment:
    upto_bytes: float  # sizes up to this many bytes (math.inf on the last segment)
    alpha_us: float
    us_per_byte: float  # 1 / beta

    @property
    def gbps(self) -> float:
        return 0.0 if self.us_per_byte == 0 else 1e-3 / self.us_per_byte


@dataclass(frozen=True)
class CommFit:
    """Piecewise alpha-beta time of one collective at one world size."""

    segments: tuple[Segment, ...]

    def time_us(self, nbytes: float) -> float:
        # the last segment reaches to infinity (fit_points and fits_from_figures build it so)
        seg = next(s for s in self.segments if nbytes <= s.upto_bytes)
        return seg.alpha_us + nbytes * seg.us_per_byte


def _fit_segment(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(alpha, c) >= 0 minimizing sum(((alpha + c x - y) / y)^2)."""
    # normal equations of the weighted problem with weights 1/y^2
    w = [1.0 / (y * y) for y in ys]
    s_w = sum(w)
    s_x = sum(wi * x for wi, x in zip(w, xs, strict=True))
    s_xx = sum(wi * x * x for wi, x in zip(w, xs, strict=True))
    s_y = sum(wi * y for wi, y in zip(w, ys, strict=True))
    s_xy = sum(wi * x * y for wi, x, y in zip(w, xs, ys, strict=True))
    det = s_w * s_xx - s_x * s_x
    if det > 1e-12 * s_w * s_xx:
        alpha = (s_xx * s_y - s_x * s_xy) / det
        c = (s_w * s_xy - s_x * s_y) / det
        if alpha >= 0 and c >= 0:
            return alpha, c
    # a constraint is active: the better of the two one-parameter fits
    c_only = s_xy / s_xx if s_xx > 0 else 0.0
    a_only = s_y / s_w
    return min(((0.0, max(c_only, 0.0)), (max(a_only, 0.0), 0.0)), key=lambda p: _sse(p, xs, ys))


def _sse(p: tuple[float, float], xs: list[float], ys: list[float]) -> float:
    return sum(((p[0] + p[1] * x - y) / y) ** 2 for x, y in zip(xs, ys, strict=True))


def fit_points(points: Iterable[tuple[float, float]], max_segments: int = MAX_SEGMENTS) -> CommFit:
    """Fit (bytes, µs) measurements of one collective at one world size (module docstring)."""
    pts = sorted((float(b), float(t)) for b, t in points)
    if len(pts) < 2 or any(b <= 0 or t <= 0 for b, t in pts):
        raise ValueError(f"need at least 2 positive (bytes, µs) points, got {pts}")
    if len({b for b, _ in pts}) != len(pts):
        raise ValueError("duplicate message sizes")
    xs, ys = [b for b, _ in pts], [t for _, t in pts]
    n = len(pts)
    best = None
    for k in range(1, max_segments + 1):
        if k * MIN_POINTS > n and k > 1:
            break
        for cuts in itertools.combinations(range(MIN_POINTS, n - MIN_POINTS + 1), k - 1):
            if any(b - a < MIN_POINTS for a, b in zip(cuts, cuts[1:], strict=False)):
                continue
            bounds = [0, *cuts, n]
            params = [_fit_segment(xs[a:b], ys[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
            sse = sum(_sse(p, xs[a:b], ys[a:b]) for p, a, b in zip(params, bounds, bounds[1:], strict=False))
            bic = n * math.log(max(sse, 1e-12) / n) + (3 * k - 1) * math.log(n)
            if best is None or bic < best[0]:
                best = (bic, bounds, params)
    _, bounds, params = best
    segs = []
    for i, (a, c) in enumerate(params):
        end = bounds[i + 1]
        upto = math.inf if end == n else _switch_point(params[i], params[i + 1], xs[end - 1], xs[end])
        segs.append(Segment(upto, a, c))
    return CommFit(tuple(segs))


def _switch_point(p: tuple[float, float], q: tuple[float, float], lo: float, hi: float) -> float:
    """Where segment ``p`` hands over to ``q`` between the measured sizes ``lo`` and ``hi``: where
    their lines cross, clipped to [lo, hi]. A latency floor meeting the bandwidth line (slope grows:
    the time is the larger line) and NCCL switching to a faster protocol (slope shrinks: the smaller
    line) both change over at the crossing. Parallel lines: halfway on a log scale."""
    if p[1] == q[1]:
        return math.sqrt(lo * hi)
    return min(max((q[0] - p[0]) / (p[1] - q[1]), lo), hi)


def comm_points(rows: Iterable[Mapping]) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """(op, world size) -> [(bytes, p50 µs)] of ``comm`` runs rows (op in the advisor's names)."""
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("kind") != "comm":
            continue
        c = r["config"]
        op = OP_NAMES.get(c["op"], c["op"])
        out.setdefault((op, int(c["world_size"])), []).append((float(c["bytes"]), float(r["p50"])))
    return {key: sorted(v) for key, v in out.items()}


def fit_rows(rows: Iterable[Mapping], min_world_size: int = 2) -> dict[tuple[str, int], CommFit]:
    """A fit per (op, world size >= min_world_size) of ``comm`` rows."""
    return {
        key: fit_points(pts)
        for key, pts in comm_points(rows).items()
        if key[1] >= min_world_size and len(pts) >= 2
    }


def to_figures(fits: Mapping[tuple[str, int], CommFit]) -> dict[str, float]:
    """The fits as flat GPU-profile figures (module docstring)."""
    out: dict[str, float] = {}
    for (op, ws), fit in sorted(fits.items()):
        for i, seg in enumerate(fit.segments):
            pre = f"{op}_ws{ws}_s{i}"
            out[f"{pre}_alpha_us"] = seg.alpha_us
            out[f"{pre}_gbps"] = seg.gbps
            if math.isfinite(seg.upto_bytes):
                out[f"{pre}_upto_bytes"] = seg.upto_bytes
    return out


def fits_from_figures(measured: Mapping[str, float]) -> dict[tuple[str, int], CommFit]:
    """The fits stored in a GPU profile's measured figures (other figures are ignored)."""
    parts: dict[tuple[str, int], dict[int, dict[str, float]]] = {}
    for key, value in measured.items():
        m = _KEY.match(key)
        if m:
            op, ws, seg, field = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
            parts.setdefault((op, ws), {}).setdefault(seg, {})[field] = float(value)
    fits = {}
    for key, segs in parts.items():
        if sorted(segs) != list(range(len(segs))):
            raise ValueError(f"comm fit {key}: segments {sorted(segs)} are not 0..{len(segs) - 1}")
        out = []
        for i in range(len(segs)):
            s = segs[i]
            if "alpha_us" not in s or "gbps" not in s:
                raise ValueError(f"comm fit {key} segment {i} lacks alpha_us or gbps")
            last = i == len(segs) - 1
            if not last and "upto_bytes" not in s:
                raise ValueError(f"comm fit {key} segment {i} lacks upto_bytes")
            c = 0.0 if s["gbps"] == 0 else 1e-3 / s["gbps"]
            out.append(Segment(math.inf if last else s["upto_bytes"], s["alpha_us"], c))
        fits[key] = CommFit(tuple(out))
    return fits


@dataclass(frozen=True)
class Holdout:
    op: str
    world_size: int
    n_fit: int
    n_test: int
    segments: int
    median_rel_err: float
    max_rel_err: float
    flat_median_rel_err: float  # factor x bytes / peak busbw of the fitted sizes, no latency
    flat_max_rel_err: float


def holdout(rows: Iterable[Mapping], min_world_size: int = 2) -> list[Holdout]:
    """Fit on every other size (the 1st, 3rd, …), predict the rest; one line per (op, world size)."""
    out = []
    for (op, ws), pts in sorted(comm_points(rows).items()):
        if ws < min_world_size or len(pts) < 4:
            continue
        train, test = pts[0::2], pts[1::2]
        fit = fit_points(train)
        errs = [abs(fit.time_us(b) - t) / t for b, t in test]
        factor = BUSBW_FACTOR[op](ws)
        peak = max(factor * b / t for b, t in train)  # bytes/µs of bus traffic at the best fitted size
        # one rank moves nothing over links: the flat model says 0 µs, 100 % off
        flat = [abs(factor * b / peak - t) / t if peak > 0 else 1.0 for b, t in test]
        out.append(Holdout(op, ws, len(train), len(test), len(fit.segments), statistics.median(errs),
                           max(errs), statistics.median(flat), max(flat)))  # fmt: skip
    return out


def holdout_markdown(lines: list[Holdout]) -> str:
    """A Markdown table of ``holdout`` results."""
    head = ("| collective | GPUs | sizes fitted / predicted | segments | median rel. err | max rel. err | "
            "flat model median | flat model max |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    body = [
        f"| {h.op} | {h.world_size} | {h.n_fit} / {h.n_test} | {h.segments} | {h.median_rel_err:.1%} | "
        f"{h.max_rel_err:.1%} | {h.flat_median_rel_err:.1%} | {h.flat_max_rel_err:.1%} |"
        for h in lines
    ]
    return "\n".join([head, *body])
