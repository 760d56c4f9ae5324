"""Capacity of ranked candidates: how much more load than the trace's a deployment takes.

With arrival times, capacity is the largest multiple x of the trace's arrival rate (same length mix,
same burstiness: the workload's sample with its rate scaled by x) at which the candidate

(a) is not prefill-saturated: rho < 1, with rho as ``recommend`` computes it (linear in the rate:
    the prefill's GPU time does not depend on it);
(b) fits its KV cache for the concurrency Little's law gives at x times the rate (with ``--concurrency``
    fixed, that concurrency times x), by ``candidates.memory_check``;
(c) meets the SLOs given (TPOT p99, TTFT p99, as ``recommend`` predicts them at that rate and
    concurrency: the queue's wait grows with rho). Without SLOs only (a) and (b).

Its output tokens/s per GPU is then ``x * rate * osl / GPUs``: in steady state a deployment that keeps
up serves what arrives. Without arrival times (a closed loop at a concurrency C) capacity is over the
concurrency instead: the largest multiple x of C meeting (b) and (c), and its tokens/s per GPU is
Little's law at x * C (the prediction's ``tok_s_per_gpu``).

Search: bisection on log x, between 1/BOUND and BOUND (64), until the last passing multiple (reported)
and the first failing one (``fail_at``, with the condition that failed: ``limit``) are within a ratio
of 1 + RESOLUTION (2 %). A candidate that passes at BOUND reports BOUND (``limit`` "bound"); one that
fails at 1/BOUND reports 0. All candidates are searched together: ``search`` takes the evaluation as
a function of {candidate: multiple} and knows nothing of how it predicts; ``recommend`` supplies it
(one batched set of serving-model calls per step, one search per candidate less its MoE runner: the
runner enters no prediction, only a flag). The
conditions rise with the load (concurrency, rho, queueing), so the transition bisection finds is the
largest passing multiple; where a fitted prediction is not monotone it is still a point that passes
next to one that fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

BOUND = 64.0
RESOLUTION = 0.02
SATURATED, MEMORY, TPOT_SLO, TTFT_SLO = "prefill saturated", "KV memory", "TPOT SLO", "TTFT SLO"


@dataclass(frozen=True)
class Capacity:
    x: float  # largest passing multiple of the trace's load (arrival rate, or concurrency)
    over: str  # "arrival rate" or "concurrency"
    max_tok_s_per_gpu: float  # output tokens/s per GPU at x
    limit: str  # condition that fails at fail_at ("bound": none up to BOUND)
    fail_at: float | None  # the first failing multiple found (None: passes at BOUND)

    def to_dict(self) -> dict:
        return {
            "x": self.x,
            "over": self.over,
            "max_output_tok_s_per_gpu": self.max_tok_s_per_gpu,
            "limit": self.limit,
            "fail_at": self.fail_at,
            "resolution": RESOLUTION,
            "bound": BOUND,
        }


def failed_condition(r, slo_tpot: float | None, slo_ttft: float | None) -> str | None:
    """The first of (a) and (c) that a ranked prediction ``r`` fails, or None."""
    if r.rho is not None and r.rho >= 1.0:
        return SATURATED
    if getattr(r, "kv_saturated_rps", None) is not None:  # the queue for KV grows without bound
        return MEMORY
    if slo_tpot is not None and not r.tpot_p99 <= slo_tpot:
        return TPOT_SLO
    if slo_ttft is not None and not r.ttft_p99 <= slo_ttft:
        return TTFT_SLO
    return None


def search(evaluate: Callable[[dict], dict], at_one: dict) -> dict:
    """Bisection of every candidate's capacity, all candidates together.

    ``at_one[c]``: None when candidate ``c`` passes at the trace's load (x = 1), else the condition it
    fails there. ``evaluate({c: x})`` returns ``{c: failed condition or None}`` at each candidate's
    multiple ``x`` (one batched call per step). Returns ``{c: (x, limit, fail_at)}``: the largest
    passing multiple, the condition that fails above it ("bound": none up to BOUND) and the first
    failing multiple found (None: passes at BOUND)."""
    lo: dict = {}
    hi: dict = {}
    limit: dict = {}
    done: dict = {}
    probe = {c: (BOUND if why is None else 1.0 / BOUND) for c, why in at_one.items()}
    for c, why in evaluate(probe).items():
        if at_one[c] is None:  # passes at 1
            if why is None:
                done[c] = (BOUND, "bound", None)
            else:
                lo[c], hi[c], limit[c] = 1.0, BOUND, why
        else:
            if why is not None:
                done[c] = (0.0, why, 1.0 / BOUND)
            else:
                lo[c], hi[c] = 1.0 / BOUND, 1.0
                limit[c] = at_one[c]
    while True:
        active = {c: math.sqrt(lo[c] * hi[c]) for c in lo if hi[c] / lo[c] > 1.0 + RESOLUTION}
        if not active:
            break
        for c, why in evaluate(active).items():
            if why is None:
                lo[c] = active[c]
            else:
                hi[c], limit[c] = active[c], why
    done.update({c: (lo[c], limit[c], hi[c]) for c in lo})
    return done
