"""Capacity: the largest load factor at which a simulated deployment still meets its SLOs.

``capacity_search(evaluate)`` knows nothing of candidates or ranking: ``evaluate(load) -> bool``
says whether the deployment passes at ``load`` times the trace's rate (or concurrency). It assumes
passing is monotone in the load (latency grows with it), brackets the transition by doubling from
``start`` when it passes there, or by ``lo`` when it fails there (a deployment failing at ``lo`` too
costs two evaluations, not a halving down to it), then bisects on log(load) until the last pass and
the first fail are within a ratio of ``1 + rel_tol``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CapacityResult:
    load: float  # largest passing load found (0.0: fails even at lo)
    fail_at: float | None  # smallest failing load found (None: passes at hi)
    evaluations: tuple[tuple[float, bool], ...]


def capacity_search(
    evaluate: Callable[[float], bool],
    lo: float = 1.0 / 64,
    hi: float = 64.0,
    rel_tol: float = 0.02,
    start: float = 1.0,
) -> CapacityResult:
    if not 0 < lo <= hi or rel_tol <= 0:
        raise ValueError(f"capacity search needs 0 < lo <= hi and rel_tol > 0 (got {lo}, {hi}, {rel_tol})")
    seen: list[tuple[float, bool]] = []

    def ev(x: float) -> bool:
        ok = bool(evaluate(x))
        seen.append((x, ok))
        return ok

    x = min(max(start, lo), hi)
    if ev(x):
        good, bad = x, None
        while bad is None and good < hi:
            y = min(good * 2, hi)
            if ev(y):
                good = y
            else:
                bad = y
        if bad is None:
            return CapacityResult(good, None, tuple(seen))
    else:
        if x > lo and not ev(lo):  # failing at the lowest load ends the search at once
            return CapacityResult(0.0, lo, tuple(seen))
        good, bad = None, x
        if x > lo:
            good = lo
        while good is None and bad > lo:
            y = max(bad / 2, lo)
            if ev(y):
                good = y
            else:
                bad = y
        if good is None:
            return CapacityResult(0.0, bad, tuple(seen))
    while bad / good > 1 + rel_tol:
        mid = math.sqrt(good * bad)
        if ev(mid):
            good = mid
        else:
            bad = mid
    return CapacityResult(good, bad, tuple(seen))
