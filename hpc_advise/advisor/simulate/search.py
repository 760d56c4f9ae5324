"""Capacity: the largest load factor at which a simulated deployment still meets its SLOs.

``capacity_search(evaluate)`` knows nothing of candidates or ranking: ``evaluate(load) -> bool``
says whether the deployment passes at ``load`` times the trace's rate (or concurrency). It assumes
passing is monotone in the load (latency grows with it), brackets the transition by multiplying
``start`` by ``step`` while it passes (dividing while it fails), then bisects on log(load) until the
last pass and the first fail are within a ratio of ``1 + rel_tol``. A cold start (``step`` >= 2) that
fails at ``start`` tries ``lo`` next (a deployment failing there too costs two evaluations, not a
halving down to it); a warm one (a guess, ``step`` < 2) steps down from it. ``known`` are loads
already evaluated (free to the caller, e.g. the trace's own load): a step that would pass beyond a
known fail, or below a known pass, goes to that load instead, and it is not evaluated again.
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
    step: float = 2.0,
    known: tuple[tuple[float, bool], ...] = (),
) -> CapacityResult:
    if not 0 < lo <= hi or rel_tol <= 0 or step <= 1:
        raise ValueError(
            f"capacity search needs 0 < lo <= hi, rel_tol > 0 and step > 1 (got {lo}, {hi}, {rel_tol}, {step})"
        )
    seen: list[tuple[float, bool]] = []

    cached = dict(known)

    def ev(x: float) -> bool:
        ok = bool(cached[x]) if x in cached else bool(evaluate(x))
        seen.append((x, ok))
        return ok

    def up(good: float) -> float:  # the next load above a pass: a known fail before good * step
        fails = [k for k, ok in cached.items() if not ok and good < k < good * step]
        return min(fails) if fails else min(good * step, hi)

    def down(bad: float) -> float:  # the next load below a fail: a known pass after bad / step
        passes = [k for k, ok in cached.items() if ok and bad / step < k < bad]
        return max(passes) if passes else max(bad / step, lo)

    x = min(max(start, lo), hi)
    if ev(x):
        good, bad = x, None
        while bad is None and good < hi:
            y = up(good)
            if ev(y):
                good = y
            else:
                bad = y
        if bad is None:
            return CapacityResult(good, None, tuple(seen))
    else:
        good, bad = None, x
        if step >= 2.0 and x > lo:  # a cold start: failing at the lowest load ends the search at once
            if not ev(lo):
                return CapacityResult(0.0, lo, tuple(seen))
            good = lo
        while good is None and bad > lo:
            y = down(bad)
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
