"""Capacity of ranked candidates: how much more load than the trace's a deployment takes.

With arrival times, capacity is the largest multiple x of the trace's arrival rate (same length mix,
same burstiness: the workload's sample with its rate scaled by x) at which the candidate

(a) is not prefill-saturated: rho < 1, with rho as ``recommend`` computes it (linear in the rate:
    the prefill's GPU time does not depend on it);
(b) fits its KV cache for the concurrency Little's law gives at x times the rate (``Ranker.concurrency``'s
    fixed point; with ``--concurrency`` fixed, that concurrency times x), by ``candidates.memory_check``;
(c) meets the SLOs given (TPOT p99, TTFT p99, as ``Ranker.rank_one`` predicts them at that rate and
    concurrency: the queue's wait grows with rho). Without SLOs only (a) and (b).

Its output tokens/s per GPU is then ``x * rate * osl / GPUs``: in steady state a deployment that keeps
up serves what arrives. Without arrival times (a closed loop at a concurrency C) capacity is over the
concurrency instead: the largest multiple x of C meeting (b) and (c), and its tokens/s per GPU is
Little's law at x * C (``rank_one``'s ``tok_s_per_gpu``).

Search: bisection on log x, between 1/BOUND and BOUND (64), until the last passing multiple (reported)
and the first failing one (``fail_at``, with the condition that failed: ``limit``) are within a ratio
of 1 + RESOLUTION (2 %). A candidate that passes at BOUND reports BOUND (``limit`` "bound"); one that
fails at 1/BOUND reports 0. All candidates are searched together: each step makes one batched set of
serving-model calls (the model is called per (tp, ep, attn_dp, kv_dtype, concurrency)), and candidates
that differ only by MoE runner share one search (the runner enters no prediction, only a flag). The
conditions rise with the load (concurrency, rho, queueing), so the transition bisection finds is the
largest passing multiple; where a fitted prediction is not monotone it is still a point that passes
next to one that fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hpc_advise.advisor.candidates import Candidate, Checked, memory_check

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
    if slo_tpot is not None and not r.tpot_p99 <= slo_tpot:
        return TPOT_SLO
    if slo_ttft is not None and not r.ttft_p99 <= slo_ttft:
        return TTFT_SLO
    return None


def evaluate(ranker, base: dict, load: dict, slo_tpot, slo_ttft, fixed, need_ranked: bool = False) -> dict:
    """{candidate: (failed condition or None, Ranked at that load or None)} for each candidate of
    ``load`` at its multiple; ``base[c]`` is its prediction at the trace's load (for rho)."""
    w = ranker.w
    cands = list(load)
    conc = ranker.concurrency(cands, fixed, load)
    out, fits = {}, []
    for c in cands:
        rho = base[c].rho
        if rho is not None and load[c] * rho >= 1.0:  # rho is linear in the rate
            out[c] = (SATURATED, None)
            continue
        ok, _, mem = memory_check(c, ranker.model, ranker.gpu, conc[c], w.ctx_mean, w.ctx_p99)
        if not ok:
            out[c] = (MEMORY, None)
            continue
        fits.append((c, mem))
    if not fits or (not need_ranked and slo_tpot is None and slo_ttft is None):
        out.update({c: (None, None) for c, _ in fits})
        return out
    preds = ranker.serving_predictions([c for c, _ in fits], conc)
    for c, mem in fits:
        pred = preds[ranker.pred_key(c, conc[c])]
        r = ranker.rank_one(Checked(c, True, "", mem), conc[c], pred, slo_tpot, slo_ttft, load=load[c])
        out[c] = (failed_condition(r, slo_tpot, slo_ttft), r)
    return out


def search(ranker, base: dict, slo_tpot, slo_ttft, fixed) -> dict:
    """{candidate: Capacity} for the candidates of ``base`` (their predictions at the trace's load,
    all of which fit in memory there)."""
    over = "arrival rate" if ranker.w.rate_rps else "concurrency"
    lo: dict[Candidate, float] = {}
    hi: dict[Candidate, float] = {}
    limit: dict[Candidate, str] = {}
    done: dict[Candidate, tuple[float, str, float | None]] = {}
    probe = {c: (BOUND if r.meets_slo else 1.0 / BOUND) for c, r in base.items()}
    for c, (why, _) in evaluate(ranker, base, probe, slo_tpot, slo_ttft, fixed).items():
        if base[c].meets_slo:  # passes at 1
            if why is None:
                done[c] = (BOUND, "bound", None)
            else:
                lo[c], hi[c], limit[c] = 1.0, BOUND, why
        else:
            if why is not None:
                done[c] = (0.0, why, 1.0 / BOUND)
            else:
                lo[c], hi[c] = 1.0 / BOUND, 1.0
                limit[c] = failed_condition(base[c], slo_tpot, slo_ttft) or MEMORY
    while True:
        active = {c: math.sqrt(lo[c] * hi[c]) for c in lo if hi[c] / lo[c] > 1.0 + RESOLUTION}
        if not active:
            break
        for c, (why, _) in evaluate(ranker, base, active, slo_tpot, slo_ttft, fixed).items():
            if why is None:
                lo[c] = active[c]
            else:
                hi[c], limit[c] = active[c], why
    done.update({c: (lo[c], limit[c], hi[c]) for c in lo})
    # tokens/s per GPU at the capacity
    w = ranker.w
    tok = {}
    if w.rate_rps:
        tok = {c: x * w.rate_rps * w.osl_mean / c.n_gpus for c, (x, _, _) in done.items()}
    else:
        at = {c: x for c, (x, _, _) in done.items() if x > 0}
        for c, (_, r) in evaluate(ranker, base, at, slo_tpot, slo_ttft, fixed, need_ranked=True).items():
            tok[c] = r.tok_s_per_gpu if r is not None else 0.0
    return {c: Capacity(x, over, tok.get(c, 0.0), why, fail_at) for c, (x, why, fail_at) in done.items()}


def assign_capacities(ranker, ranked: list, slo_tpot, slo_ttft, fixed) -> None:
    """Set ``r.capacity`` on every ranked candidate; one search per candidate less its MoE runner."""
    reps: dict[Candidate, object] = {}
    for r in ranked:
        reps.setdefault(replace(r.candidate, moe_runner=None), r)
    base = {r.candidate: r for r in reps.values()}
    found = search(ranker, base, slo_tpot, slo_ttft, fixed)
    for r in ranked:
        r.capacity = found[reps[replace(r.candidate, moe_runner=None)].candidate]
