"""What a simulated run reports, computed as SGLang's ``bench_serving`` computes it.

Per request: TTFT (first token - sent), TPOT ((e2e - ttft) / (output - 1), requests of one output
token have none), E2E, queue time (first scheduled into a prefill batch - sent). ITL samples are the
gaps between a request's consecutive tokens (weighted: a decode step gives every continuing request
the same gap). A request not finished when the simulation stopped has infinite latencies (so a
percentile that reaches it is infinite); a rejected one (it cannot fit the KV pool) is counted apart
and fails every SLO. Throughput is over the benchmark's duration (first send to last finish);
goodput counts the requests meeting every SLO given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

PERCENTILES = (50, 90, 99)


def percentile(x: np.ndarray, q: float, weights: np.ndarray | None = None) -> float:
    """Linear-interpolated percentile where +inf values sort last (a rank among them gives inf);
    NaN values are left out. With ``weights``, the inverted-CDF percentile of the weighted sample."""
    x = np.asarray(x, dtype=np.float64)
    keep = ~np.isnan(x)
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)[keep]
        x = x[keep]
        if x.size == 0 or w.sum() <= 0:
            return math.nan
        order = np.argsort(x, kind="stable")
        cw = np.cumsum(w[order])
        i = int(np.searchsorted(cw, q / 100.0 * cw[-1], side="left"))
        return float(x[order][min(i, x.size - 1)])
    x = np.sort(x[keep])
    if x.size == 0:
        return math.nan
    pos = q / 100.0 * (x.size - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, x.size - 1)
    frac = pos - lo
    if math.isinf(x[hi]) and frac > 0 or math.isinf(x[lo]):
        return math.inf
    return float(x[lo] + (x[hi] - x[lo]) * frac)


@dataclass
class SimResult:
    send_s: np.ndarray
    ttft_s: np.ndarray  # inf: no first token by the end
    tpot_s: np.ndarray  # NaN: one output token; inf: not finished
    e2e_s: np.ndarray
    queue_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    cached_tokens: np.ndarray
    rejected: np.ndarray
    finished: np.ndarray
    finish_s: np.ndarray
    itl_s: np.ndarray
    itl_weight: np.ndarray
    retractions: int
    prefill_steps: int
    decode_steps: int
    sim_end_s: float
    pool_tokens: int
    kv_used_mean: float
    kv_used_peak: int
    cache_tokens_mean: float
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_requests(
        cls,
        *,
        send_s,
        sched_s,
        first_s,
        finish_s,
        input_len,
        output_len,
        cached_tokens,
        rejected,
        itl_s,
        itl_weight,
        **totals,
    ) -> SimResult:
        finished = ~np.isnan(finish_s)
        ttft = np.where(np.isnan(first_s), np.inf, first_s - send_s)
        e2e = np.where(finished, finish_s - send_s, np.inf)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(output_len > 1, (e2e - ttft) / np.maximum(output_len - 1, 1), np.nan)
        tpot = np.where(finished | (output_len <= 1), tpot, np.inf)
        queue = np.where(np.isnan(sched_s), np.inf, sched_s - send_s)
        for a in (ttft, e2e, tpot, queue):
            a[rejected] = np.nan
        return cls(
            send_s=send_s,
            ttft_s=ttft,
            tpot_s=tpot,
            e2e_s=e2e,
            queue_s=queue,
            input_len=input_len,
            output_len=output_len,
            cached_tokens=cached_tokens,
            rejected=rejected,
            finished=finished,
            finish_s=finish_s,
            itl_s=itl_s,
            itl_weight=itl_weight,
            **totals,
        )

    @property
    def n_requests(self) -> int:
        return int(self.send_s.size)

    def duration_s(self) -> float:
        """First send to last finish of the measured requests (to the end when some never finish)."""
        if self.n_requests == 0:
            return 0.0
        served = ~self.rejected
        if not served.any():
            return 0.0
        end = float(np.nanmax(self.finish_s)) if self.finished.any() else self.sim_end_s
        if not self.finished[served].all():
            end = max(end, self.sim_end_s)
        return max(end - float(np.nanmin(self.send_s)), 1e-12)

    def good(self, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> np.ndarray:
        """Per request: finished and within every SLO given."""
        ok = self.finished & ~self.rejected
        if slo_ttft_s is not None:
            ok &= self.ttft_s <= slo_ttft_s
        if slo_tpot_s is not None:
            ok &= np.isnan(self.tpot_s) | (self.tpot_s <= slo_tpot_s)
        return ok

    def summary(self, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> dict:
        """Aggregates as a JSON-ready dict (seconds; percentiles p50/p90/p99 and mean)."""
        dur = self.duration_s()
        fin = self.finished & ~self.rejected
        out_tok = int(self.output_len[fin].sum())
        served_in = int(self.input_len[~self.rejected].sum())

        def dist(x, weights=None) -> dict:
            d = {f"p{q}": percentile(x, q, weights) for q in PERCENTILES}
            finite = x[np.isfinite(x)]
            if weights is None:
                d["mean"] = float(finite.mean()) if finite.size else math.nan
            else:
                wf = weights[np.isfinite(x)]
                d["mean"] = float((finite * wf).sum() / wf.sum()) if wf.sum() else math.nan
            return d

        good = self.good(slo_ttft_s, slo_tpot_s)
        n = max(self.n_requests, 1)
        return {
            "requests": self.n_requests,
            "finished": int(fin.sum()),
            "unfinished": int((~self.finished & ~self.rejected).sum()),
            "rejected": int(self.rejected.sum()),
            "duration_s": dur,
            "ttft_s": dist(self.ttft_s),
            "tpot_s": dist(self.tpot_s),
            "itl_s": dist(self.itl_s, self.itl_weight),
            "e2e_s": dist(self.e2e_s),
            "queue_s": dist(self.queue_s),
            "request_throughput": float(fin.sum()) / dur if dur else 0.0,
            "output_throughput": out_tok / dur if dur else 0.0,
            "goodput_req_s": float(good.sum()) / dur if dur else 0.0,
            "good_fraction": float(good.sum()) / n,
            "cache_hit_rate": float(self.cached_tokens[~self.rejected].sum()) / served_in
            if served_in
            else 0.0,
            "kv_used_mean": self.kv_used_mean / self.pool_tokens,
            "kv_used_peak": self.kv_used_peak / self.pool_tokens,
            "cache_tokens_mean": self.cache_tokens_mean / self.pool_tokens,
            "retractions": self.retractions,
            "prefill_steps": self.prefill_steps,
            "decode_steps": self.decode_steps,
        }

    def delayed(self, extra_s: np.ndarray) -> SimResult:
        """The same run with every token of request i reaching its client ``extra_s[i]`` later: a
        latency that occupies no GPU (tokenizing, scheduling, streaming). TTFT, E2E and the finish
        move by it; TPOT, ITL, queue time and the schedule do not."""
        extra = np.asarray(extra_s, dtype=np.float64)
        if extra.shape != self.send_s.shape:
            raise ValueError(f"delayed: {extra.size} latencies for {self.n_requests} requests")
        return replace(
            self,
            ttft_s=self.ttft_s + extra,
            e2e_s=self.e2e_s + extra,
            finish_s=self.finish_s + extra,
            notes=list(self.notes),
        )

    def meets(self, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None, q: float = 99) -> bool:
        """The q-th percentile of TTFT and of TPOT within the SLOs given, and nothing rejected."""
        if self.rejected.any():
            return False
        if slo_ttft_s is not None and not percentile(self.ttft_s, q) <= slo_ttft_s:
            return False
        if slo_tpot_s is not None:
            p = percentile(self.tpot_s, q)
            if not (math.isnan(p) or p <= slo_tpot_s):
                return False
        return True


def merge(results: list[SimResult]) -> SimResult:
    """Several replicas' results as one deployment's: requests and ITL samples pooled, counts summed,
    KV figures averaged over the replicas (per-replica pool)."""
    if not results:
        raise ValueError("no results to merge")
    cat = lambda name: np.concatenate([getattr(r, name) for r in results])  # noqa: E731
    k = len(results)
    return SimResult(
        send_s=cat("send_s"),
        ttft_s=cat("ttft_s"),
        tpot_s=cat("tpot_s"),
        e2e_s=cat("e2e_s"),
        queue_s=cat("queue_s"),
        input_len=cat("input_len"),
        output_len=cat("output_len"),
        cached_tokens=cat("cached_tokens"),
        rejected=cat("rejected"),
        finished=cat("finished"),
        finish_s=cat("finish_s"),
        itl_s=cat("itl_s"),
        itl_weight=cat("itl_weight"),
        retractions=sum(r.retractions for r in results),
        prefill_steps=sum(r.prefill_steps for r in results),
        decode_steps=sum(r.decode_steps for r in results),
        sim_end_s=max(r.sim_end_s for r in results),
        pool_tokens=results[0].pool_tokens,
        kv_used_mean=sum(r.kv_used_mean for r in results) / k,
        kv_used_peak=max(r.kv_used_peak for r in results),
        cache_tokens_mean=sum(r.cache_tokens_mean for r in results) / k,
    )
