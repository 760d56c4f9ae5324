"""Statistics of a bench run: percentiles with bootstrap confidence intervals, throughput, goodput,
failures by cause, and the A/B difference of two runs over the same requests.

Percentiles are numpy's linear interpolation (as SGLang's ``bench_serving``). A confidence interval
is the 2.5th-97.5th percentile of the statistic over bootstrap resamples of the requests (seeded, so
a run's report is reproducible); a run's ITL interval resamples gaps, the A/B ITL interval
resamples requests with all their gaps. The number of resamples is ``BOOTSTRAP`` and
shrinks for very large samples so one interval costs at most ``BOOT_BUDGET`` values, processed in
chunks to bound memory.

A/B (``compare``): the requests are paired by index; each resample draws the same request indices
for both sides, so request-length differences do not widen the interval. A difference is called
real when its interval excludes zero *and* it is at least ``min_effect`` of the baseline: timer
jitter of a few tenths of a percent between two identical servers is not a difference anyone acts on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from hpc_advise.advisor.bench.client import Result

BOOTSTRAP = 1000
BOOT_BUDGET = 20_000_000
CHUNK_VALUES = 2_000_000
PERCENTILES = (50, 90, 99)
MIN_EFFECT = 0.02


def _resamples(n: int, boot: int) -> int:
    return max(50, min(boot, BOOT_BUDGET // max(n, 1)))


def bootstrap(values: np.ndarray, stat: Callable[[np.ndarray], np.ndarray], boot: int = BOOTSTRAP,
              seed: int = 0) -> tuple[float, float]:  # fmt: skip
    """95% interval of ``stat`` (applied along axis 1 of a [k, n] resample matrix)."""
    n = len(values)
    if n < 2:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    b = _resamples(n, boot)
    per = max(1, CHUNK_VALUES // n)
    out = []
    for start in range(0, b, per):
        k = min(per, b - start)
        out.append(stat(values[rng.integers(0, n, (k, n))]))
    lo, hi = np.percentile(np.concatenate(out), [2.5, 97.5])
    return float(lo), float(hi)


def pct_stat(q: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda m: np.percentile(m, q, axis=1)


def describe(values: Sequence[float] | np.ndarray, scale: float = 1000.0, seed: int = 0) -> dict:
    """mean/median/std/p90/p99/max and the intervals of median/p90/p99, in ms (``scale``)."""
    v = np.asarray(values, dtype=np.float64) * scale
    if len(v) == 0:
        return {}
    out = {"n": int(len(v)), "mean": float(v.mean()), "median": float(np.median(v)), "std": float(v.std()),
           "max": float(v.max())}  # fmt: skip
    for q in PERCENTILES:
        key = "median" if q == 50 else f"p{q}"
        out[key] = float(np.percentile(v, q))
        out[f"{key}_ci"] = bootstrap(v, pct_stat(q), seed=seed + q)
    out["p95"] = float(np.percentile(v, 95))
    return out


def columns(results: Sequence[Result]) -> dict[str, np.ndarray]:
    """Per-request arrays of the successful requests: ttft, e2e, tpot (NaN when < 2 tokens), n_in, n_out."""
    ok = [r for r in results if r.ok]
    return {
        "index": np.array([r.index for r in ok], dtype=np.int64),
        "ttft": np.array([r.ttft for r in ok], dtype=np.float64),
        "e2e": np.array([r.e2e for r in ok], dtype=np.float64),
        "tpot": np.array([np.nan if r.tpot is None else r.tpot for r in ok], dtype=np.float64),
        "n_in": np.array([r.n_in for r in ok], dtype=np.int64),
        "n_out": np.array([r.n_out for r in ok], dtype=np.int64),
    }


def all_itl(results: Sequence[Result]) -> np.ndarray:
    parts = [np.frombuffer(r.itl, dtype=np.float64) for r in results if r.ok and len(r.itl)]
    return np.concatenate(parts) if parts else np.zeros(0)


def summarize(results: Sequence[Result], duration_s: float, slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None, seed: int = 0) -> dict:  # fmt: skip
    """Everything a report, a KB row and a bench_serving record need from one target's results."""
    cols = columns(results)
    causes = Counter(r.error for r in results if not r.ok)
    n_ok = len(cols["e2e"])
    dur = max(duration_s, 1e-9)
    out_tok, in_tok = int(cols["n_out"].sum()), int(cols["n_in"].sum())
    s: dict = {
        "requests": len(results),
        "completed": n_ok,
        "failed": int(sum(v for k, v in causes.items() if k != "too_long")),
        "skipped_too_long": int(causes.get("too_long", 0)),
        "failures": dict(sorted(causes.items())),
        "duration_s": duration_s,
        "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
        "request_throughput": n_ok / dur,
        "input_throughput": in_tok / dur,
        "output_throughput": out_tok / dur,
        "total_throughput": (in_tok + out_tok) / dur,
        # mean requests in flight (Little's law), bench_serving's ``concurrency``
        "concurrency": float(cols["e2e"].sum() / dur) if n_ok else 0.0,
        "ttft_ms": describe(cols["ttft"], seed=seed),
        "e2e_ms": describe(cols["e2e"], seed=seed + 1),
        "tpot_ms": describe(cols["tpot"][~np.isnan(cols["tpot"])], seed=seed + 2),
        "itl_ms": describe(all_itl(results), seed=seed + 3),
    }
    lag = [r.start - r.scheduled for r in results if r.start]
    if lag:  # how late the client sent, against the plan (open loop): its own overhead
        s["dispatch_lag_ms"] = {
            "median": float(np.median(lag)) * 1000,
            "p99": float(np.percentile(lag, 99)) * 1000,
        }
    if n_ok:
        s["output_throughput_ci"] = tuple(
            x / dur
            for x in bootstrap(cols["n_out"].astype(np.float64), lambda m: m.sum(axis=1), seed=seed + 4)
        )
    if slo_ttft_ms is not None or slo_tpot_ms is not None:
        good = np.ones(n_ok, dtype=bool)
        if slo_ttft_ms is not None:
            good &= cols["ttft"] * 1000 <= slo_ttft_ms
        if slo_tpot_ms is not None:
            tpot = np.nan_to_num(cols["tpot"], nan=0.0)
            good &= tpot * 1000 <= slo_tpot_ms
        s["good_requests"] = int(good.sum())
        s["request_goodput"] = float(good.sum() / dur)
        s["goodput_fraction"] = float(good.sum() / len(results)) if results else 0.0
    return s


# ----- A/B ----------------------------------------------------------------------------------------

AB_METRICS = (("ttft", 50), ("ttft", 90), ("ttft", 99), ("tpot", 50), ("tpot", 90), ("tpot", 99),
              ("e2e", 50), ("e2e", 99), ("itl", 50), ("itl", 99))  # fmt: skip


def _gaps_by_index(results: Sequence[Result]) -> dict[int, np.ndarray]:
    return {r.index: np.frombuffer(r.itl, dtype=np.float64) for r in results if r.ok and len(r.itl)}


def compare(a: Sequence[Result], b: Sequence[Result], duration_a: float, duration_b: float,
            min_effect: float = MIN_EFFECT, seed: int = 0) -> list[dict]:  # fmt: skip
    """Per metric: baseline (b) and candidate (a) values, difference a - b with its 95% interval,
    relative difference, and ``verdict`` (``same`` / ``a_higher`` / ``a_lower``)."""
    ca, cb = columns(a), columns(b)
    common = np.intersect1d(ca["index"], cb["index"])
    ia = np.searchsorted(ca["index"], common)
    ib = np.searchsorted(cb["index"], common)
    rows = []
    rng_seed = seed
    for name, q in AB_METRICS:
        if name == "itl":
            # cluster bootstrap: resample the paired requests, take all their gaps (gaps of one
            # request, and of requests in flight together, are not independent draws)
            ga, gb = _gaps_by_index(a), _gaps_by_index(b)
            pairs = [(ga[i], gb[i]) for i in common if len(ga.get(i, ())) and len(gb.get(i, ()))]
            if len(pairs) < 2:
                continue
            va = np.concatenate([p[0] for p in pairs]) * 1000
            vb = np.concatenate([p[1] for p in pairs]) * 1000
            base, cand = float(np.percentile(vb, q)), float(np.percentile(va, q))
            est = cand - base
            rng = np.random.default_rng(rng_seed)
            diffs = []
            for _ in range(_resamples(len(va) + len(vb), 200)):
                pick = rng.integers(0, len(pairs), len(pairs))
                diffs.append(np.percentile(np.concatenate([pairs[j][0] for j in pick]), q) * 1000
                             - np.percentile(np.concatenate([pairs[j][1] for j in pick]), q) * 1000)  # fmt: skip
            lo, hi = np.percentile(diffs, [2.5, 97.5])
        else:
            va, vb = ca[name][ia] * 1000, cb[name][ib] * 1000
            keep = ~(np.isnan(va) | np.isnan(vb))
            va, vb = va[keep], vb[keep]
            if len(va) < 2:
                continue
            pair = np.stack([va, vb])
            n = len(va)
            rng = np.random.default_rng(rng_seed)
            diffs = []
            per = max(1, CHUNK_VALUES // n)
            b_total = _resamples(n, BOOTSTRAP)
            for start in range(0, b_total, per):
                idx = rng.integers(0, n, (min(per, b_total - start), n))
                diffs.append(np.percentile(pair[0][idx], q, axis=1) - np.percentile(pair[1][idx], q, axis=1))
            lo, hi = np.percentile(np.concatenate(diffs), [2.5, 97.5])
            base, cand = float(np.percentile(vb, q)), float(np.percentile(va, q))
            est = cand - base
        rng_seed += 1
        rel = est / base if base else float("nan")
        real = (lo > 0 or hi < 0) and abs(rel) >= min_effect
        rows.append({
            "metric": f"{'median' if q == 50 else f'p{q}'}_{name}_ms", "candidate": cand, "baseline": base,
            "diff": est, "ci": (float(lo), float(hi)), "relative": rel,
            "verdict": "same" if not real else ("a_higher" if est > 0 else "a_lower"),
        })  # fmt: skip
    ta = columns(a)["n_out"].sum() / max(duration_a, 1e-9)
    tb = columns(b)["n_out"].sum() / max(duration_b, 1e-9)
    rows.append({"metric": "output_throughput", "candidate": float(ta), "baseline": float(tb),
                 "diff": float(ta - tb), "ci": None, "relative": float((ta - tb) / tb) if tb else float("nan"),
                 "verdict": "info"})  # fmt: skip
    return rows
