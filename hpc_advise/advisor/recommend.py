"""Rank candidate configurations for a trace: predicted TPOT/TTFT percentiles, throughput per GPU,
memory headroom, confidence flags and plain-language reasons.

Two stages: every candidate is screened analytically (below), then the screen's first rows are
simulated (``simulated``: the trace's busiest window and a sample replayed through SGLang's scheduler
with a step cost levelled on the serving model) and their printed figures, SLO verdict and capacity
come out of the simulation (``Ranked.simulated``); they are ranked again by the same key, ahead of the
rows the screen alone predicts. What follows is the screen.

Per candidate (``candidates``), at the trace's mean lengths:

1. the serving model (``serving_model``, engine sglang) predicts TPOT and TTFT at the candidate's
   concurrency. With arrival times in the trace, concurrency per replica is the fixed point of
   Little's law ``C = rate / replicas * (TTFT + osl * TPOT)`` (TTFT without queueing: waiting
   requests hold no KV), damped and held at the KV limit (``Ranker.concurrency``); where it has no
   fixed point below that limit the candidate is KV-saturated: ranked after those that keep up, TTFT
   unbounded, with the rate it completes and the GPU count of its layout that would keep up. Without
   arrival times C is ``--concurrency`` (default: the trace summary's context-spread concurrency);
2. TPOT p50/p99: 48 decode batches are drawn from the trace's (isl, osl) sample at that concurrency
   (requests weighted by their output length, each at a uniform point of its decode, as
   ``traces.summary.context_spread`` does). Each batch's step time is the calibrated TPOT scaled by its
   roofline step time over the mean batch's, plus, per layer with KV cache, the attention backend's
   fitted kernel time (``kernel_models``) minus the reference backend's (FlashInfer's decode kernel,
   the one the calibration data's engines mostly ran). Backends with no kernel measurement keep the
   reference time and are flagged;
3. TTFT p50/p99: each sampled request's prefill is the calibrated prefill scaled by its roofline
   prefill; with arrival times, an M/G/1 queue per attention group adds waiting (mean by
   Pollaczek-Khinchine, zero with probability 1 - rho, exponential otherwise); rho >= 1 marks the
   candidate as saturated. The queue's service time is the GPU time a prefill occupies, not its
   calibrated TTFT: the sampled prompt's roofline prefill times ``ServingModel.prefill_occupancy``
   (the TPOT fit's prefill-interference coefficients, ~1.7 for SGLang: fitted on how much decode
   slowed for the prefills beside it). The calibrated TTFT (~10x the roofline for SGLang) is a
   latency: it holds the scheduling and the queueing of the runs it was measured on, so as a
   service time it would count that queueing twice and call an idle GPU saturated. ``rho`` is
   reported per candidate (``prefill_utilisation``).

Prefix reuse (``Ranker.reuse``, JSON ``prefix_reuse``): the share of prompt tokens the prefix cache
serves, which the prefill terms of 1. and 3. leave out. With ``hash_ids`` in the trace it is per
candidate: ``prefix_cache`` replays the summary's window (the first requests, up to 65,536 blocks)
through radix caches of the candidate's KV pool per attention group (``kv_pool_tokens``), split over
replicas as sgl-router's cache-aware policy does, and scales the trace's unlimited-cache reuse by the
share the pools keep; the reasons say it where it differs. Without hashes, an OpenAI log's
``cached_tokens`` fraction (what the serving system achieved) is every candidate's reuse.

Output tokens/s per GPU (``tok_s_per_gpu``, JSON ``output_tok_s_per_gpu``): with arrival times, what
the trace offers (rate * osl / GPUs), or what the prefill capacity admits when saturated (rate / rho);
in steady state a candidate that keeps up serves what arrives, so this is the same for all of them.
Without arrival times (a closed loop at the given concurrency), Little's law: a replica's
``concurrency`` requests complete at ``concurrency / (TTFT + osl * TPOT)`` per second (calibrated
mean TTFT, sampled mean TPOT) with ``osl`` tokens each.

Capacity (``capacity`` module; table "load x" and "max tok/s/GPU", JSON ``capacity_x``,
``max_output_tok_s_per_gpu`` and ``capacity``): the largest multiple x of the trace's arrival rate
(same length mix and burstiness) at which the candidate is not prefill-saturated, fits its KV cache
for the concurrency Little's law gives and meets the SLOs given; max tok/s/GPU = x * the offered
tokens/s per GPU. Without arrival times it is over the concurrency instead (the largest multiple of it
that fits and meets the SLOs; tokens/s by Little's law there). Found by bisection on log x to 2 %,
up to 64x.

Ranking: candidates meeting the SLOs first; among them, with SLOs given, the highest max output
tokens/s per GPU (goodput per GPU at capacity: what an operator buys GPUs for; those within 5 % of
the best, below the model's error, by the lowest mean request latency), otherwise the lowest mean
request latency, with capacity shown; measured backends win ties. Candidates missing an SLO follow,
closest to meeting it first; then each top row says what breaks (``what_breaks``: the condition, its
figure, and the highest rate at which it would hold) and ``more_gpus`` ranks again on 1, 2, 4 nodes
for the smallest GPU count that meets the SLOs. Mean request latency = mean TTFT + mean osl * mean TPOT (the sampled
ones, queueing and attention backend included): per-token time for decode-heavy traces, and TTFT
where prompts dominate. Ranking by TPOT p50 alone let 0.4 % of TPOT decide between TP8 and 2 x TP4 on
the agentic example while TP8's TTFT p99 was 37 % lower. The top picks' reasons name a capacity
difference of more than 10 % against the best-ranked other deployment (and, without SLOs, against
the highest-capacity candidate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from hpc_advise.advisor import calibration
from hpc_advise.advisor import capacity as cap
from hpc_advise.advisor import roofline as F
from hpc_advise.advisor.candidates import Candidate, Checked, check_all, kv_limit, memory_check
from hpc_advise.advisor.capacity import Capacity, failed_condition
from hpc_advise.advisor.kernel_models import AttentionModel, batch_attention_terms
from hpc_advise.advisor.prefix_cache import PrefixReuse
from hpc_advise.advisor.serving_data import RowError, ServingPoint
from hpc_advise.advisor.serving_model import ServingModel, model_quants, prepare

REFERENCE_ATTENTION = "flashinfer"
# how the flags of a backend / runner nobody measured begin (ranked after a measured tie, folded into it)
UNMEASURED_ATTENTION = "no kernel measurement for attention backend"
UNMEASURED_MOE = "no kernel comparison for MoE runner"
# MLA decode attention: our backend and SGLang's triton were measured against each other in layer steps, neither
# against the reference; the note goes into the attention reason, a candidate folded into another's row hands it
# on to that row (_drop_twins)
MLA_PAIR = ("hpc_advise", "triton")
MLA_PAIR_NOTE = "MLA decode attention measured in layer steps"
N_BATCHES = 48
N_TTFT = 2000
N_PROMPTS = 128  # sampled prompts whose prefill times the TTFT percentiles draw from
FIXED_POINT_ITERATIONS = 12  # Little's law's damped fixed point (``Ranker.concurrency``)
FIXED_POINT_TOLERANCE = 0.02


@dataclass
class TraceLoad:
    """The load a trace offers, as the ranking reads it: mean lengths, an (isl, osl) sample, arrival
    rate (None: no timestamps), prefix reuse, context mean / p99, and the concurrency assumed
    without arrival times."""

    isl_mean: float
    osl_mean: float
    pairs: np.ndarray  # [n, 2] (isl, osl)
    rate_rps: float | None
    prefix_reuse: float
    ctx_mean: float
    ctx_p99: float
    default_concurrency: int
    prefix_window: object = None  # ``traces.stats.PrefixWindow`` replayed per pool (``prefix_cache``)
    requests: object = None  # ``simulated.TraceRequests``: what the simulated stage replays (None: not kept)
    prefix_block_size: int | None = None
    reuse_note: str | None = None  # where the reuse comes from, when it is not the hash blocks

    @classmethod
    def from_summary(cls, s) -> TraceLoad:
        pairs = np.asarray(s.sample or [], dtype=float).reshape(-1, 2)
        if pairs.shape[0] == 0:
            pairs = np.array([[s.isl["mean"], s.osl["mean"]]], dtype=float)
        isl_mean, osl_mean = float(s.isl["mean"]), float(s.osl["mean"])
        ctx = pairs[:, 0] + pairs[:, 1] / 2.0
        reuse, note = s.prefix_reuse, None
        if reuse is None and s.cached_fraction is not None:
            # no hash blocks to replay: what the serving system that wrote the log achieved
            reuse = s.cached_fraction
            note = f"prefix reuse {100 * reuse:.1f} % of prompt tokens: the trace's cached_tokens, as served"
        return cls(
            isl_mean=isl_mean,
            osl_mean=max(osl_mean, 1.0),
            pairs=pairs,
            rate_rps=s.rate_rps,
            prefix_reuse=float(reuse or 0.0),
            ctx_mean=float(np.average(ctx, weights=np.maximum(pairs[:, 1], 1))),
            ctx_p99=float(np.percentile(pairs[:, 0] + pairs[:, 1], 99)),
            default_concurrency=int(getattr(s, "ctx_concurrency", 64) or 64),
            prefix_window=getattr(s, "prefix_window", None) if s.prefix_reuse else None,
            prefix_block_size=s.prefix_block_size,
            reuse_note=note,
            requests=getattr(s, "requests", None),
        )


@dataclass
class Ranked:
    candidate: Candidate
    tpot_p50: float
    tpot_p99: float
    ttft_p50: float
    ttft_p99: float
    tok_s_per_gpu: float
    concurrency: float
    headroom_gib: float
    meets_slo: bool
    flags: list = field(default_factory=list)
    reasons: list = field(default_factory=list)
    ctx_cv: float = 0.0
    attn_delta_ms: float = 0.0  # per decode step vs the reference attention backend (p50 batch)
    mla_pair: str | None = None  # MLA: what layer steps measured between MLA_PAIR (``_mla_pair_note``)
    rho: float | None = None  # prefill utilisation per attention group (None: no arrival times)
    latency_ms: float = 0.0  # mean request latency: mean TTFT + osl * mean TPOT
    capacity: Capacity | None = None  # how much more load it takes (``capacity`` module)
    kv_saturated_rps: float | None = None  # KV-saturated: requests/s it completes (all replicas)
    calibration: str | None = None  # "calibrated on N runs: ..." when its deployment was measured
    breaks: str | None = None  # what fails, when no candidate meets the SLOs (``what_breaks``)
    prefix_reuse: float = 0.0  # share of prompt tokens its prefix caches serve (``Ranker.reuse``)
    simulated: dict | None = None  # the replay's figures (``simulated``); None: analytic screen only
    sim_failure: str | None = None  # the condition its simulated busiest window fails at load 1
    sim_state: object = field(default=None, repr=False, compare=False)  # ``simulated.CandidateSim``

    @property
    def max_tok_s_per_gpu(self) -> float:
        """Output tokens/s per GPU at the capacity (the current throughput until it is known)."""
        return self.capacity.max_tok_s_per_gpu if self.capacity else self.tok_s_per_gpu

    def to_dict(self) -> dict:
        """JSON-ready; an unbounded TTFT (saturated prefill) is null."""

        def num(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        out = {
            "config": self.candidate.label(),
            "candidate": self.candidate.to_dict(),
            "tpot_ms": {"p50": num(self.tpot_p50), "p99": num(self.tpot_p99)},
            "ttft_ms": {"p50": num(self.ttft_p50), "p99": num(self.ttft_p99)},
            "output_tok_s_per_gpu": self.tok_s_per_gpu,
            "max_output_tok_s_per_gpu": self.max_tok_s_per_gpu,
            "capacity_x": self.capacity.x if self.capacity else None,
            "capacity": self.capacity.to_dict() if self.capacity else None,
            "concurrency_per_replica": self.concurrency,
            "memory_headroom_gib": num(self.headroom_gib),
            "prefill_utilisation": self.rho,
            "kv_saturated_rps": self.kv_saturated_rps,
            "request_latency_ms": num(self.latency_ms),
            "prefix_reuse": self.prefix_reuse,
            "meets_slo": self.meets_slo,
            "confidence": "ok" if not self.flags else "low",
            "flags": self.flags,
            "reasons": self.reasons,
        }
        if self.calibration:  # only then: uncalibrated output stays as it was
            out["calibration"] = self.calibration
        if self.breaks:  # only when nothing meets the SLOs
            out["breaks"] = self.breaks
        out["source"] = "simulation" if self.simulated else "analytic screen"
        if self.simulated:
            out["simulated"] = self.simulated
        return out


BATCH_BLOCK = 64  # requests per block of the batch sample (``_batches``)


def _batches(w: TraceLoad, batch: int, seed: int = 0) -> np.ndarray:
    """[N_BATCHES, batch] context lengths drawn as traces.summary.context_spread does. Batches of b
    requests are the first b of the batches of b + 1 (columns come in blocks of BATCH_BLOCK, each
    from its own seeded stream): common random numbers, so predictions move smoothly with the batch
    size instead of redrawing it, which the capacity search's bisection relies on."""
    weights = np.maximum(w.pairs[:, 1], 1.0)
    p = weights / weights.sum()
    blocks = []
    for k in range(-(-batch // BATCH_BLOCK)):
        rng = np.random.default_rng((seed, k))
        idx = rng.choice(w.pairs.shape[0], size=(N_BATCHES, BATCH_BLOCK), p=p)
        blocks.append(w.pairs[idx, 0] + np.floor(rng.random((N_BATCHES, BATCH_BLOCK)) * w.pairs[idx, 1]))
    return np.concatenate(blocks, axis=1)[:, :batch]


class Ranker:
    """Predicts every feasible candidate for one (model, GPU, workload)."""

    def __init__(
        self,
        model_name: str,
        model,
        gpu,
        w: TraceLoad,
        serving: ServingModel,
        attn: AttentionModel,
        calibration=None,
    ):
        self.model_name, self.model, self.gpu, self.w = model_name, model, gpu, w
        self.serving, self.attn = serving, attn
        self.calibration = calibration  # ``calibration.Calibration`` of the user's runs, or None
        self.shapes = F.shapes_of(model)
        self.rates = F.Rates.of(gpu)
        self.dense_q, self.moe_q = model_quants(model)
        self._batch_cache: dict[int, np.ndarray] = {}
        self._physics_cache: dict = {}
        self._prefill_cache: dict = {}
        self._attn_cache: dict = {}
        self._moe_cache: dict = {}
        self._kv_limit: dict = {}
        self._reuse: dict = {}
        self.prefix = PrefixReuse(w.prefix_window, w.prefix_block_size, w.prefix_reuse)
        self.saturated: dict = {}  # KV-saturated candidates of the last ``concurrency`` call
        self._plans: dict = {}
        self._draws: dict = {}  # ``_ttft_draws``
        self._prefill_mean: dict = {}  # ``_prefill_ms(...).mean()`` per key of ``_prefill_cache``
        pick = np.random.default_rng(2).choice(w.pairs.shape[0], size=N_PROMPTS)
        self._prompts = w.pairs[pick, 0]

    def _point(self, c: Candidate, conc: float) -> ServingPoint:
        return ServingPoint(
            where="recommend",
            row_id=c.label(),
            engine="sglang",
            model=self.model_name,
            gpu=self.gpu.key,
            dense_quant=self.dense_q,
            moe_quant=self.moe_q,
            kv_bytes=1.0 if c.kv_dtype.startswith("fp8") else 2.0,
            isl=self.w.isl_mean,
            osl=self.w.osl_mean,
            concurrency=max(conc, 1.0),
            n_gpus=c.tp,
            attn_dp=c.attn_dp,
            moe_ep=c.ep,
        )

    def sim_plan(self, fixed: float | None):
        """What the simulated stage replays (``simulated.plan``), or None when the trace's requests
        were not kept; built once per kind (open loop over windows, or a closed loop)."""
        if self.w.requests is None:
            return None
        from hpc_advise.advisor import simulated

        closed = fixed is not None or not self.w.rate_rps
        key = (closed, fixed)
        if key not in self._plans:
            total = fixed if fixed is not None else float(self.w.default_concurrency)
            self._plans[key] = simulated.plan(self.w.requests, closed, total)
        return self._plans[key]

    def correction(self, c: Candidate):
        """The measured-runs correction of ``c``'s deployment (``calibration``), or None."""
        if not self.calibration:
            return None
        return self.calibration.lookup(self.model.key, self.gpu.key, c)

    def pred_key(self, c: Candidate, conc: float) -> tuple:
        """What the serving model's prediction for ``c`` depends on (``serving_predictions``' keys)."""
        return (c.tp, c.ep, c.attn_dp, c.kv_dtype, round(conc, 3), self.reuse(c))

    def kv_pool_tokens(self, c: Candidate) -> float:
        """KV tokens one attention group of ``c`` holds (``candidates.memory_check``: what the weights
        and SGLang's reserve leave, over the KV bytes per token); 0 when the weights do not fit."""
        w, one = self.w, float(c.attn_dp)
        _, _, m1 = memory_check(c, self.model, self.gpu, one, w.ctx_mean, w.ctx_p99)
        free = m1["usable_gib"] - m1["weights_gib"] - m1["reserve_gib"]
        if "headroom_gib" not in m1 or free <= 0:
            return 0.0
        _, _, m2 = memory_check(c, self.model, self.gpu, 2.0 * one, w.ctx_mean, w.ctx_p99)
        per_tok = (m2["kv_gib"] - m1["kv_gib"]) / max(w.ctx_mean, 1.0)
        return free / per_tok if per_tok > 0 else math.inf

    def reuse(self, c: Candidate) -> float:
        """Prefix reuse ``c``'s pools keep (``prefix_cache``); the trace's own figure when there are
        no hash blocks to replay. Cached per candidate (the replay per distinct pool and split)."""
        got = self._reuse.get(c)
        if got is None:
            if self.prefix.replayed:
                got = self.prefix.reuse(self.kv_pool_tokens(c), c.replicas, c.attn_dp)
            else:
                got = self.w.prefix_reuse
            self._reuse[c] = got
        return got

    def serving_predictions(self, cands: list[Candidate], conc: dict) -> dict:
        """Calibrated mean TPOT/TTFT per distinct (tp, ep, attn_dp, kv) at concurrency ``conc[c]``."""
        keys = {}
        for c in cands:
            keys.setdefault(self.pred_key(c, conc[c]), c)
        preps = [prepare(self._point(c, conc[c]), self.reuse(c), self.gpu) for c in keys.values()]
        pred = self.serving.predict(preps)
        split = self.serving.ttft_split(preps, pred)
        occupancy = self.serving.prefill_occupancy("sglang")
        out = {}
        for i, k in enumerate(keys):
            parts = tuple(float(split[n][i]) for n in ("overhead_ms", "prefill_coef", "correction"))
            parts += (occupancy,)
            out[k] = (float(pred["tpot_ms"][i]), float(pred["ttft_ms"][i]), preps[i], parts)
        return out

    def predict_checked(
        self, checked: list[Checked], conc: dict, slo_tpot, slo_ttft, load: dict | None = None
    ) -> list[tuple[Checked, Ranked | RowError]]:
        """``(checked, its Ranked prediction)`` for candidates that fit in memory, at ``conc[c]``
        requests per replica and ``load[c]`` times the trace's load (default 1); one batched set of
        serving-model calls; a candidate the model cannot predict gets the ``RowError`` instead."""
        preds = self.serving_predictions([chk.candidate for chk in checked], conc)
        out: list[tuple[Checked, Ranked | RowError]] = []
        for chk in checked:
            c = chk.candidate
            try:
                pred = preds[self.pred_key(c, conc[c])]
                x = (load or {}).get(c, 1.0)
                out.append((chk, self.rank_one(chk, conc[c], pred, slo_tpot, slo_ttft, load=x)))
            except RowError as exc:
                out.append((chk, exc))
        return out

    def kv_limit(self, c: Candidate) -> float:
        """Most requests per replica whose KV fits (``candidates.memory_check``, linear in the
        concurrency); 0 when the weights alone do not fit. Cached per candidate."""
        got = self._kv_limit.get(c)
        if got is None:
            got = self._kv_limit[c] = kv_limit(c, self.model, self.gpu, self.w.ctx_mean, self.w.ctx_p99)
        return got

    def concurrency(self, cands: list[Candidate], fixed: float | None, load: dict | None = None) -> dict:
        """Requests in flight per replica. ``load[c]`` (default 1) multiplies the offered load: the
        arrival rate in Little's law's fixed point, or the fixed / default concurrency itself.

        With arrival times the fixed point ``C = rate / replicas * latency(C)`` is iterated with
        damping (geometric mean of the old and new C) and C is held at the KV limit
        (``kv_limit``). Where latency grows faster than C there is no fixed point: C climbs to the
        limit, and Little's law at the limit still asks for more requests than the KV holds. Such a
        candidate is KV-saturated (``self.saturated[c]``: the requests/s per replica it completes
        there); its queue, and its TTFT, grow without bound at this rate."""
        x = {c: (load or {}).get(c, 1.0) for c in cands}
        self.saturated = {}
        if fixed is not None or not self.w.rate_rps:
            total = fixed if fixed is not None else float(self.w.default_concurrency)
            return {c: max(total * x[c] / c.replicas, 1.0) for c in cands}
        rate = {c: self.w.rate_rps * x[c] / c.replicas for c in cands}
        limit = {c: self.kv_limit(c) for c in cands}
        cap_c = {c: max(limit[c], 1.0) for c in cands}
        conc = {c: min(max(rate[c] * (self.w.osl_mean * 0.02), 1.0), cap_c[c]) for c in cands}
        asked = dict(conc)
        open_ = list(cands)
        for _ in range(FIXED_POINT_ITERATIONS):
            if not open_:
                break
            preds = self.serving_predictions(open_, conc)
            still = []
            for c in open_:
                pred = calibration.apply(self.correction(c), preds[self.pred_key(c, conc[c])])
                tpot, _, prep, (over, coef, corr, _) = pred
                # the TTFT without queueing: the calibrated TTFT holds the closed-loop queueing of
                # its training runs, which fed back here grows C without bound; requests waiting
                # for their prefill hold no KV and are not in the decode batch
                ttft = (over + coef * self._mean_prefill_ms(prep.dep, self.reuse(c))) * corr
                latency_s = (ttft + self.w.osl_mean * tpot) / 1e3
                asked[c] = max(rate[c] * latency_s, 1.0)
                new = min(math.sqrt(conc[c] * asked[c]), cap_c[c])
                if abs(new / conc[c] - 1.0) > FIXED_POINT_TOLERANCE:
                    still.append(c)
                conc[c] = new
            open_ = still
        for c in cands:
            if conc[c] >= cap_c[c] * (1 - 1e-9) and asked[c] > cap_c[c] * (1 + FIXED_POINT_TOLERANCE):
                self.saturated[c] = rate[c] * cap_c[c] / asked[c]  # what the full KV completes
        return conc

    def _attn_times(self, c: Candidate, batch: int) -> tuple[np.ndarray, list[str]]:
        """Per-step µs difference of c's attention backend vs the reference, for each sampled batch
        of ``batch`` requests; cached per (backend, attention-TP, KV dtype, batch): capacity
        searches repeat them."""
        key = (c.attention_backend, c.tp // c.attn_dp, c.kv_dtype, batch)
        ctx = self._batch_cache[batch]
        if key not in self._attn_cache:
            self._attn_cache[key] = self._attn_times_uncached(c, ctx)
        delta, flags = self._attn_cache[key]
        return delta, list(flags)

    def _attn_times_uncached(self, c: Candidate, ctx: np.ndarray) -> tuple[np.ndarray, list[str]]:
        s = self.shapes
        n_layers = int(getattr(self.model, "num_full_attention_layers", s.layers))
        if s.mla:  # the attention-kernel models were fitted on GQA paged decode only
            if c.attention_backend == REFERENCE_ATTENTION:
                return np.zeros(len(ctx)), []
            flags = [f"{UNMEASURED_ATTENTION} {c.attention_backend} on MLA: assumed equal to {REFERENCE_ATTENTION}"]
            return np.zeros(len(ctx)), flags + self._mla_pair_note(c, ctx, n_layers)
        attn_tp = c.tp // c.attn_dp
        kv_heads = F.kv_heads_per_rank(s, attn_tp)
        elem = 1.0 if c.kv_dtype.startswith("fp8") else 2.0
        # the attention-kernel model was fitted on bytes over the measured copy bandwidth
        # (kernel_models), so its inputs use the same basis, not the serving model's datasheet rate
        bw = float(self.gpu.rate("copy_bw_tbps")) * 1e6
        floors, tails = batch_attention_terms(ctx, kv_heads, s.head_dim, elem, bw)
        layered = self._layer_attn(c, ctx, kv_heads, elem, bw, n_layers, floors, tails)
        if layered is not None:
            return layered
        delta = self._kernel_delta(c.attention_backend, floors, tails, n_layers)
        if delta is None:
            flag = (
                []
                if c.attention_backend == REFERENCE_ATTENTION
                else [
                    f"{UNMEASURED_ATTENTION} {c.attention_backend}: assumed equal to {REFERENCE_ATTENTION}"
                ]
            )
            return np.zeros(len(ctx)), flag
        return delta, []

    def _mla_pair_note(self, c: Candidate, ctx: np.ndarray, n_layers: int) -> list[str]:
        """What the layer steps measured between our MLA decode attention and SGLang's triton at this batch (a
        note only: neither was measured against the reference, so the prediction stays the reference's)."""
        layer = self.attn.layer
        if c.attention_backend not in MLA_PAIR or layer is None or not set(MLA_PAIR) <= layer.backends():
            return []
        if c.kv_dtype.startswith("fp8"):
            return []  # our MLA form reads bf16 latent rows only
        s = self.shapes
        attn_tp = c.tp // c.attn_dp
        # the layer-step cells carry the model's heads per rank (``rules.conditions``), whatever MLA stores
        got = layer.delta_us(*MLA_PAIR, q_heads=max(1, s.heads // attn_tp), kv_heads=max(1, s.kv_heads // attn_tp),
                             head_dim=s.head_dim, kv_dtype="bf16", mla=True, batch=ctx.shape[1],
                             context=ctx.mean(axis=1), kv_bytes_per_token=s.kv_bytes_per_token_layer_bf16)  # fmt: skip
        if got is None:
            return []
        per_layer, notes = got
        ms = float(np.median(n_layers * per_layer)) / 1e3
        if abs(ms) < 0.01:
            return []
        faster, slower = MLA_PAIR if ms < 0 else MLA_PAIR[::-1]
        text = (
            f"{MLA_PAIR_NOTE}: attn={faster} {abs(ms):.1f} ms per decode step faster than attn={slower} at these "
            "contexts"
        )
        return [text + (" (" + "; ".join(notes) + ")" if notes else "")]

    def _kernel_delta(self, backend: str, floors, tails, n_layers: int) -> np.ndarray | None:
        """Per-step µs of ``backend`` minus the reference from the fitted kernel timings (None: unfitted)."""
        ref = self.attn.predict_us(REFERENCE_ATTENTION, np.array(floors), np.array(tails))
        mine = self.attn.predict_us(backend, np.array(floors), np.array(tails))
        if ref is None or mine is None:
            return None
        return n_layers * (mine - ref) + self.attn.plan_for(backend) - self.attn.plan_for(REFERENCE_ATTENTION)

    def _layer_attn(self, c: Candidate, ctx, kv_heads, elem, bw, n_layers, floors, tails):
        """(per-step µs vs the reference, flags) from layer-step rows, or None where they do not apply:
        measured against the reference itself, or against an anchor backend whose kernel timings are
        fitted against the reference (anchor's kernel difference + the layer-step difference). A
        backend the kernel fit covers directly keeps the kernel path unless the layer rows measured it
        against the reference."""
        layer = self.attn.layer
        backend = c.attention_backend
        if layer is None or backend == REFERENCE_ATTENTION or backend not in layer.backends():
            return None
        s = self.shapes
        q_heads = max(1, s.heads // (c.tp // c.attn_dp))
        per_token = 2.0 * s.head_dim * elem * kv_heads  # bytes of one layer's KV per token on one rank
        anchors = [REFERENCE_ATTENTION] if REFERENCE_ATTENTION in layer.backends() else []
        if not anchors and self.attn.provider_for(backend) is not None:
            return None  # the kernel fit measured it against the reference: keep that
        anchors += sorted(b for b in layer.backends() - {backend} if self.attn.provider_for(b) is not None)
        for anchor in anchors:
            got = layer.delta_us(backend, anchor, q_heads=q_heads, kv_heads=kv_heads, head_dim=s.head_dim,
                                 kv_dtype="fp8_e4m3" if elem == 1.0 else "bf16", mla=s.mla, batch=ctx.shape[1],
                                 context=ctx.mean(axis=1), kv_bytes_per_token=per_token)  # fmt: skip
            if got is None:
                continue
            per_layer, notes = got
            base = np.zeros(len(ctx)) if anchor == REFERENCE_ATTENTION else self._kernel_delta(anchor, floors, tails, n_layers)
            if base is None:
                continue
            flags = [f"decode attention {backend} vs {anchor} from layer-step rows, extrapolated: " + "; ".join(notes)] if notes else []
            return n_layers * per_layer + base, flags
        return None

    def _moe_times(self, c: Candidate, batch: int) -> tuple[float, list[str]]:
        """Per-step µs of c's MoE runner minus SGLang's default (measured layer-step / kernel pairs,
        ``kernel_models.LayerMoe``), and flags; a runner nobody compared keeps the default's time."""
        if c.moe_runner in (None, "auto"):
            return 0.0, []
        unmeasured = [
            f"{UNMEASURED_MOE} {c.moe_runner} in the knowledge base: predicted as SGLang's default"
        ]
        if self.attn.moe is None:
            return 0.0, unmeasured
        from hpc_advise import rules
        from hpc_advise.measured import moe_shape_of

        cond = rules.conditions(self.model, self.gpu, tp=c.tp, ep=c.ep, attn_dp=c.attn_dp,
                                kv_dtype="bf16", page_size=c.page_size)  # fmt: skip
        key = (c.moe_runner, moe_shape_of(cond, c.ep), batch * c.attn_dp)
        if key not in self._moe_cache:
            self._moe_cache[key] = self.attn.moe.delta_us(c.moe_runner, key[1], key[2])
        got = self._moe_cache[key]
        if got is None:
            return 0.0, unmeasured
        per_layer, notes = got
        flags = [f"MoE runner {c.moe_runner} vs SGLang's triton extrapolated: " + "; ".join(notes)] if notes else []
        return self.shapes.moe_layers * per_layer, flags

    def _physics(
        self, dep: F.Deployment, batch: int, ctx: np.ndarray, reuse: float
    ) -> tuple[np.ndarray, float, np.ndarray]:
        """Roofline decode steps of the sampled batches and of the mean batch (µs), and roofline
        prefill (ms) of the sampled prompts; cached per deployment (backends share them)."""
        key = (dep, batch)
        s, w, r = self.shapes, self.w, self.rates
        if key not in self._physics_cache:
            mean_ctx = batch * (w.isl_mean + w.osl_mean / 2)
            mean_step = F.total_us(F.decode_step(s, r, dep, ctx_sum=mean_ctx, batch=batch))
            steps = [F.total_us(F.decode_step(s, r, dep, ctx_sum=float(x.sum()), batch=batch)) for x in ctx]
            self._physics_cache[key] = (np.array(steps), mean_step)
        return (*self._physics_cache[key], self._prefill_ms(dep, reuse))

    def _mean_prefill_ms(self, dep: F.Deployment, reuse: float) -> float:
        """Mean of ``_prefill_ms``, kept with it (the fixed point asks every iteration)."""
        key = (dep, reuse)
        if key not in self._prefill_mean:
            self._prefill_mean[key] = float(self._prefill_ms(dep, reuse).mean())
        return self._prefill_mean[key]

    def _prefill_ms(self, dep: F.Deployment, reuse: float) -> np.ndarray:
        """Roofline prefill (ms) of the sampled prompts at prefix ``reuse``, cached per deployment
        and reuse."""
        key = (dep, reuse)
        if key not in self._prefill_cache:  # the prompts' prefill does not depend on the batch
            s, r = self.shapes, self.rates
            pf = [
                F.total_us(F.prefill(s, r, dep, max(x * (1 - reuse), 1.0), x * reuse)) for x in self._prompts
            ]
            self._prefill_cache[key] = np.array(pf) / 1e3
        return self._prefill_cache[key]

    def _ttft_draws(self, n_prompts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``rank_one``'s TTFT sample draws, the same stream (seed 1) for every candidate, drawn once:
        uniforms (queued or not), standard exponentials (the wait, times its mean) and prompt indices
        (what ``Generator.exponential`` and ``Generator.choice`` would draw, in that order)."""
        got = self._draws.get(n_prompts)
        if got is None:
            rng = np.random.default_rng(1)
            got = (rng.random(N_TTFT), rng.standard_exponential(N_TTFT), rng.integers(0, n_prompts, N_TTFT))
            self._draws[n_prompts] = got
        return got

    def rank_one(
        self,
        chk: Checked,
        conc: float,
        pred: tuple,
        slo_tpot: float | None,
        slo_ttft: float | None,
        load: float = 1.0,
    ) -> Ranked:
        """Predictions for one candidate at ``conc`` requests per replica; ``load`` multiplies the
        trace's arrival rate (the capacity search's probes)."""
        c = chk.candidate
        fix = self.correction(c)
        tpot_mean, ttft_mean, prep, (over, coef, corr, occupancy) = calibration.apply(fix, pred)
        w = self.w
        rate = w.rate_rps * load if w.rate_rps else None
        batch = max(int(round(conc / c.attn_dp)), 1)
        if batch not in self._batch_cache:
            self._batch_cache[batch] = _batches(w, batch)
        ctx = self._batch_cache[batch]
        dep = prep.dep
        steps, mean_step, pf_ms = self._physics(dep, batch, ctx, self.reuse(c))
        delta_us, flags = self._attn_times(c, batch)
        if c.tp > self.gpu.node_gpus and not self.gpu.nic_gbps:
            flags.append(
                f"no inter-node link in the {self.gpu.key} profile: {F.NIC_FALLBACK_GBPS:g} GB/s per GPU assumed (--nic-gbps)"
            )
        moe_us, moe_flags = self._moe_times(c, batch)
        flags += moe_flags
        tpot = tpot_mean * steps / mean_step + (delta_us + moe_us) / 1e3
        tpot = np.maximum(tpot, 0.05 * tpot_mean)
        # TTFT: overhead + calibrated prefill of each sampled prompt, plus queueing
        service_ms = occupancy * pf_ms  # GPU time the prefill occupies (module docstring, 3.)
        base_ms = (over + coef * pf_ms) * corr  # its latency without this trace's queue
        saturated = False
        rho = None
        if rate:
            lam = rate / (c.replicas * c.attn_dp) / 1e3  # arrivals per ms per attention group
            es, es2 = float(service_ms.mean()), float((service_ms**2).mean())
            rho = lam * es
            if rho >= 1.0:
                saturated = True
                ttft = base_ms
            else:
                wait_mean = lam * es2 / (2 * (1 - rho))
                draws, expo, pick = self._ttft_draws(len(base_ms))
                waits = np.where(draws < rho, (wait_mean / max(rho, 1e-9)) * expo, 0.0)
                ttft = base_ms[pick] + waits
        else:
            # closed loop: the calibrated TTFT already holds its queueing; spread it by prefill size
            ttft = base_ms * ttft_mean / max(float(base_ms.mean()), 1e-9)
        if rate:  # every arriving request is served, or as many as the prefill capacity admits
            tok_s_per_gpu = rate / max(rho, 1.0) * w.osl_mean / c.n_gpus
        else:  # closed loop: Little's law, calibrated mean TTFT and sampled TPOT (backend included)
            latency_s = (ttft_mean + w.osl_mean * float(tpot.mean())) / 1e3
            tok_s_per_gpu = conc * w.osl_mean / latency_s / c.tp
        tpot_p50, tpot_p99 = np.percentile(tpot, (50, 99)).tolist()
        ttft_p50, ttft_p99 = (math.inf, math.inf) if saturated else np.percentile(ttft, (50, 99)).tolist()
        r = Ranked(
            candidate=c,
            tpot_p50=tpot_p50,
            tpot_p99=tpot_p99,
            ttft_p50=ttft_p50,
            ttft_p99=ttft_p99,
            tok_s_per_gpu=float(tok_s_per_gpu),
            latency_ms=float(np.mean(ttft)) + w.osl_mean * float(tpot.mean()),
            concurrency=float(conc),
            headroom_gib=float(chk.memory.get("headroom_gib", float("nan"))),
            meets_slo=True,
            flags=list(flags),
            rho=rho,
            calibration=fix.note() if fix else None,
            prefix_reuse=self.reuse(c),
        )
        ctx_cv = float(np.median(ctx.std(axis=1) / np.maximum(ctx.mean(axis=1), 1)))
        r.ctx_cv = ctx_cv
        r.attn_delta_ms = float(np.median(delta_us)) / 1e3
        pair = [f for f in r.flags if f.startswith(MLA_PAIR_NOTE)]
        r.flags = [f for f in r.flags if not f.startswith(MLA_PAIR_NOTE)]
        r.mla_pair = pair[0] if pair else None
        if saturated:
            r.flags.append("prefill saturated: arrivals exceed prefill capacity (rho >= 1)")
        served = self.saturated.get(c)
        if rate and served is not None:
            r.kv_saturated_rps = served * c.replicas
            r.ttft_p50 = r.ttft_p99 = math.inf
            r.latency_ms = math.inf
            r.tok_s_per_gpu = r.kv_saturated_rps * w.osl_mean / c.n_gpus
            r.flags.insert(0, kv_saturation_note(c, rate, conc, r.kv_saturated_rps, rho))
        r.flags += self.serving.out_of_range(prep)
        r.meets_slo = failed_condition(r, slo_tpot, slo_ttft) is None
        return r


def reuse_note(w: TraceLoad) -> str | None:
    """Where the candidates' prefix reuse comes from, for the output's notes (None: no reuse)."""
    if w.reuse_note:
        return w.reuse_note
    if w.prefix_window is not None and w.prefix_reuse > 0:
        t = w.prefix_window.arrays()[0]
        return (
            f"prefix reuse per candidate: its KV pools' radix caches replayed over the first {t.size:,} "
            f"requests ({w.prefix_window.n_blocks:,} blocks) of the trace, scaled to the trace's "
            f"unlimited-cache {100 * w.prefix_reuse:.1f} %"
        )
    return None


def _ms(x: float) -> str:
    return f"{x:.0f} ms" if math.isfinite(x) else "unbounded (saturated)"


def kv_saturation_note(c: Candidate, rate: float, conc: float, served_rps: float, rho: float | None) -> str:
    """What breaks for a KV-saturated candidate, and the GPU count (2, 4, 8 times this one, same
    layout, more replicas) whose KV and prefill would keep up at the predicted per-replica rates."""
    need = next((k for k in (2, 4, 8) if served_rps * k >= rate and (rho or 0.0) < k), None)
    more = (
        f"the same layout on {c.n_gpus * need} GPUs ({need}x the replicas) would keep up"
        if need
        else f"more than {8 * c.n_gpus} GPUs of this layout would be needed"
    )
    return (
        f"saturated: TTFT grows without bound at {rate:.2f} req/s: the KV cache holds {conc:.0f} "
        f"requests per replica, which complete {served_rps:.2f} req/s in all; {more}"
    )


def what_breaks(r: Ranked, w: TraceLoad, slo_tpot: float | None, slo_ttft: float | None) -> str:
    """What keeps ``r`` from meeting the SLOs at the trace's load, and where it would meet them (its
    capacity: the largest multiple of the load that passes)."""
    why = r.sim_failure if r.simulated else failed_condition(r, slo_tpot, slo_ttft)
    c = r.candidate
    sim = r.simulated
    if sim and why == "queue growth":
        b = sim["busiest"]
        what = (
            f"queue grows: {b['backlog_at_end']} of {b['requests']} requests of the busiest window still "
            f"wait for their prefill at its end (simulated)"
        )
    elif sim and why == cap.MEMORY:
        what = f"{sim['busiest']['rejected']} requests do not fit the KV pool ({sim['pool_tokens']:,} tokens)"
    elif sim and why == cap.TTFT_SLO:
        b = sim["busiest"]
        what = (
            f"TTFT p99 {_ms(r.ttft_p99)} > {slo_ttft:g} ms (simulated busiest window: queue p99 "
            f"{_ms(b['queue_ms']['p99'] if b['queue_ms']['p99'] is not None else math.inf)}, KV use "
            f"{100 * b['kv_used_mean']:.0f} % mean)"
        )
    elif why == cap.MEMORY and r.kv_saturated_rps is not None:
        what = (
            f"KV cache full: {r.concurrency:.0f} requests per replica complete {r.kv_saturated_rps:.2f} req/s"
        )
    elif why == cap.SATURATED:
        what = f"prefill saturated: utilisation {r.rho:.2f} at {w.rate_rps:.2f} req/s"
    elif why == cap.TPOT_SLO:
        what = f"TPOT p99 {r.tpot_p99:.1f} ms > {slo_tpot:g} ms at {r.concurrency:.0f} requests per replica"
    elif why == cap.TTFT_SLO:
        what = f"TTFT p99 {_ms(r.ttft_p99)} > {slo_ttft:g} ms"
        if r.rho is not None:
            what += f" (prefill utilisation {r.rho:.2f} at {w.rate_rps:.2f} req/s)"
    else:
        what = why or "KV memory"
    k = r.capacity
    if k is None:
        return what
    if k.x > 0:
        if k.over == "arrival rate":
            return what + f"; meets them up to {k.x * w.rate_rps:.2f} req/s ({k.x:.2f}x the trace's)"
        return what + f"; meets them up to {k.x * r.concurrency * c.replicas:.0f} requests in flight"
    return what + f"; misses them even at 1/{cap.BOUND:g} of the trace's {k.over}"


NODE_MULTIPLES = (1, 2, 4)  # GPU counts ``more_gpus`` tries, in nodes of the GPU profile


@dataclass
class MoreGpus:
    """The smallest GPU count (whole nodes) on which a candidate meets the SLOs (``more_gpus``)."""

    tried: list[int]  # GPU counts ranked, smallest first
    gpus: int | None = None  # the first that meets them (None: none of ``tried``)
    best: Ranked | None = None  # its top pick

    def to_dict(self, node: int) -> dict:
        out: dict = {"tried_gpus": self.tried, "gpus": self.gpus, "nodes": None, "config": None}
        if self.gpus is not None and self.best is not None:
            out.update(
                nodes=self.gpus / node,
                config=self.best.candidate.label(),
                tpot_ms_p99=self.best.tpot_p99,
                ttft_ms_p99=self.best.ttft_p99,
            )
        return out

    def line(self, node: int, gpu_key: str) -> str:
        if self.gpus is None:
            if not self.tried:
                return "no larger GPU count tried"
            return f"no configuration meets them on up to {max(self.tried)} x {gpu_key} ({max(self.tried) // node} nodes)"
        b = self.best
        nodes = self.gpus / node
        where = f"{nodes:g} node{'s' if nodes != 1 else ''}" if self.gpus >= node else f"{self.gpus} GPUs"
        return (
            f"on {self.gpus} x {gpu_key} ({where}) {b.candidate.label()} meets them: "
            f"TPOT p99 {b.tpot_p99:.1f} ms, TTFT p99 {_ms(b.ttft_p99)}"
        )


def more_gpus(ranker: Ranker, n_gpus: int, slo_tpot, slo_ttft, concurrency) -> MoreGpus:
    """Rank again on 1, 2 and 4 nodes of the GPU profile (``node_gpus``), those above ``n_gpus``,
    and stop at the first count whose top pick meets the SLOs (the trace's load split over more
    replicas, or larger tensor-parallel groups)."""
    node = ranker.gpu.node_gpus
    out = MoreGpus(tried=[])
    for k in NODE_MULTIPLES:
        g = k * node
        if g <= n_gpus:
            continue
        out.tried.append(g)
        ranked, _ = rank_candidates(ranker, g, slo_tpot, slo_ttft, concurrency, n_simulated=1, sim_capacity=False)
        if ranked and ranked[0].meets_slo:
            out.gpus, out.best = g, ranked[0]
            break
    return out


def reasons_for(r: Ranked, ranker: Ranker, ranked: list[Ranked]) -> list[str]:
    """A few plain-language reasons for a top pick; comparisons are with rows predicted the same way
    (simulated ones with simulated ones: the screen's figures are another model's)."""
    c = r.candidate
    out = []
    ranked = [x for x in ranked if bool(x.simulated) == bool(r.simulated)]
    unlimited = ranker.w.prefix_reuse
    if ranker.prefix.replayed and round(100 * r.prefix_reuse) != round(100 * unlimited):
        pools = f"{c.replicas}x TP{c.tp}" if c.replicas > 1 else f"TP{c.tp}"
        if c.attn_dp > 1:
            pools += f" attnDP{c.attn_dp}"
        out.append(
            f"prefix cache holds {100 * r.prefix_reuse:.0f} % of prompt tokens at {pools}'s pools "
            f"(unlimited: {100 * unlimited:.0f} %)"
        )
    batch = r.concurrency / c.attn_dp
    measured = not any(f.startswith(UNMEASURED_ATTENTION) for f in r.flags)
    spread = (
        f"context-length CV {r.ctx_cv:.2f} at {batch:.0f} concurrent requests"
        if batch >= 2
        else "about one request at a time per attention group"
    )
    if measured and c.attention_backend != REFERENCE_ATTENTION and abs(r.attn_delta_ms) >= 0.01:
        verb = "saves" if r.attn_delta_ms < 0 else "costs"
        kind = (
            "dynamic (work-balanced) attention"
            if c.attention_backend in ("hpc_advise", "hpc_ops")
            else c.attention_backend
        )
        out.append(
            f"{spread}: {kind} {verb} {abs(r.attn_delta_ms) * 1e3:.0f} us per decode step vs {REFERENCE_ATTENTION} (fitted kernel timings)"
        )
    elif c.attention_backend == REFERENCE_ATTENTION:
        basis = (
            "the serving data's baseline (no MLA kernel measured against it)"
            if ranker.shapes.mla
            else "the measured baseline"
        )
        out.append(f"{spread}: attention on {REFERENCE_ATTENTION}, {basis}" + (f"; {r.mla_pair}" if r.mla_pair else ""))
    elif r.mla_pair:
        out.append(f"{spread}: {r.mla_pair} (neither measured against {REFERENCE_ATTENTION}: predicted as it)")
    if c.kv_dtype.startswith("fp8"):
        out.append(
            "FP8 KV cache halves KV bytes (decode attention reads and memory); check accuracy on your evals"
        )
    if c.replicas > 1:
        out.append(
            f"{c.replicas} replicas of TP{c.tp}: the model fits in {c.tp} GPUs with {r.headroom_gib:.0f} GiB headroom; each replica serves 1/{c.replicas} of the requests ({r.concurrency:.0f} in flight)"
        )
    elif c.tp > 1 and c.attn_dp == 1:
        out.append(f"TP{c.tp}: one replica, weights and KV split over {c.tp} GPUs")
    if c.attn_dp > 1:
        sh = ranker.shapes
        avoid = ""
        if sh.mla or sh.kv_heads < c.tp:  # under attention TP{c.tp} these would be stored on several GPUs
            avoid = f", avoiding replicated {'MLA latent' if sh.mla else 'KV heads'}"
        out.append(
            f"TP{c.tp} with attention data-parallel {c.attn_dp}: weights split over {c.tp} GPUs, each attention group keeps its own requests' KV{avoid}"
        )
    if c.ep > 1:
        out.append(f"EP{c.ep}: each GPU holds {ranker.model.num_experts // c.ep} whole experts")
    shape = (c.tp, c.replicas, c.ep, c.attn_dp)
    other = [
        x
        for x in ranked
        if (x.candidate.tp, x.candidate.replicas, x.candidate.ep, x.candidate.attn_dp) != shape
    ]
    if other:  # the best-ranked other deployment, and what separates them
        alt = other[0]
        out.append(
            f"vs {alt.candidate.label()}: TTFT p50 {_ms(r.ttft_p50)} vs {_ms(alt.ttft_p50)}, TPOT p50 {r.tpot_p50:.1f} vs {alt.tpot_p50:.1f} ms"
        )
        capacity = _capacity_contrast(r, alt)
        if capacity:  # ahead of the backend and KV lines, which the cut below may drop
            out.insert(0, capacity)
    most = max((x for x in ranked if x.meets_slo), key=lambda x: x.max_tok_s_per_gpu, default=None)
    if most is not None and (not other or most is not other[0]):
        capacity = _capacity_contrast(r, most)
        if capacity and most.max_tok_s_per_gpu > r.max_tok_s_per_gpu:  # only without SLOs
            out.insert(0, capacity.replace(" for ", " for the highest-capacity ", 1))
    same = [x for x in ranked if x.candidate.tp == c.tp and x.candidate.kv_dtype == c.kv_dtype and x is not r]
    if same:
        alt = min(same, key=lambda x: x.tpot_p50)
        if alt.tpot_p50 > r.tpot_p50 and not (other and alt is other[0]):  # not said above already
            out.append(f"vs {alt.candidate.label()}: TPOT p50 {r.tpot_p50:.1f} vs {alt.tpot_p50:.1f} ms")
    return out[:5]


def _capacity_contrast(r: Ranked, alt: Ranked) -> str | None:
    """A reason when the capacities of ``r`` and ``alt`` differ by more than 10 %."""
    a, b = r.capacity, alt.capacity
    if a is None or b is None or not b.max_tok_s_per_gpu:
        return None
    ratio = a.max_tok_s_per_gpu / b.max_tok_s_per_gpu
    if 1 / 1.1 <= ratio <= 1.1:
        return None
    what = "the trace's load" if a.over == "arrival rate" else "the concurrency"
    text = (
        f"capacity {a.x:.2f}x {what} ({a.max_tok_s_per_gpu:.0f} out tok/s/GPU, limited by {a.limit}) vs "
        f"{b.x:.2f}x ({b.max_tok_s_per_gpu:.0f}) for {alt.candidate.label()}: "
    )
    if ratio > 1:
        return text + f"{(ratio - 1) * 100:.0f} % more load per GPU"
    return text + f"{(1 - ratio) * 100:.0f} % less, ranked ahead on mean request latency"


def _drop_twins(ranked: list[Ranked]) -> list[Ranked]:
    """Drop a candidate that differs from a better-ranked one only by an unmeasured MoE runner or
    attention backend (same prediction, nothing measured to choose it by); the survivor's flags
    name what was folded into it."""
    kept: dict[tuple, Ranked] = {}
    out = []
    for r in ranked:
        c = r.candidate
        unmeasured_moe = c.moe_runner not in (None, "auto") and any(f.startswith(UNMEASURED_MOE) for f in r.flags)
        unmeasured_attn = any(f.startswith(UNMEASURED_ATTENTION) for f in r.flags)
        key_moe = (c.tp, c.replicas, c.ep, c.attn_dp, c.attention_backend, c.kv_dtype, round(r.tpot_p50, 6))
        key_attn = (c.tp, c.replicas, c.ep, c.attn_dp, c.moe_runner, c.kv_dtype, round(r.tpot_p50, 6))
        twin = (kept.get(("moe",) + key_moe) if unmeasured_moe else None) or (
            kept.get(("attn",) + key_attn) if unmeasured_attn else None
        )
        if twin is not None:
            what = f"moe={c.moe_runner}" if unmeasured_moe else f"attn={c.attention_backend}"
            twin.mla_pair = twin.mla_pair or r.mla_pair
            note = "unmeasured alternatives predicted the same: "
            have = [f for f in twin.flags if f.startswith(note)]
            if not have:
                twin.flags.append(note + what)
            elif what not in have[0][len(note) :].split(", "):
                twin.flags[twin.flags.index(have[0])] = have[0] + f", {what}"
            kept.setdefault(("moe",) + key_moe, twin)
            kept.setdefault(("attn",) + key_attn, twin)
            continue
        kept.setdefault(("moe",) + key_moe, r)
        kept.setdefault(("attn",) + key_attn, r)
        out.append(r)
    return out


def at_load(ranker: Ranker, base: dict, load: dict, slo_tpot, slo_ttft, fixed, need_ranked=False) -> dict:
    """{candidate: (failed condition or None, Ranked at that load or None)} for each candidate of
    ``load`` at its multiple of the trace's load; ``base[c]`` is its prediction at the trace's load
    (for rho, which is linear in the rate)."""
    w = ranker.w
    cands = list(load)
    conc = ranker.concurrency(cands, fixed, load)
    out, fits = {}, []
    for c in cands:
        rho = base[c].rho
        if rho is not None and load[c] * rho >= 1.0:
            out[c] = (cap.SATURATED, None)
            continue
        if c in ranker.saturated:  # Little's law asks for more requests than the KV holds
            out[c] = (cap.MEMORY, None)
            continue
        ok, _, mem = memory_check(c, ranker.model, ranker.gpu, conc[c], w.ctx_mean, w.ctx_p99)
        if not ok:
            out[c] = (cap.MEMORY, None)
            continue
        fits.append(Checked(c, True, "", mem))
    if not fits or (not need_ranked and slo_tpot is None and slo_ttft is None):
        out.update({chk.candidate: (None, None) for chk in fits})
        return out
    for chk, r in ranker.predict_checked(fits, conc, slo_tpot, slo_ttft, load):
        if isinstance(r, RowError):
            raise r
        out[chk.candidate] = (failed_condition(r, slo_tpot, slo_ttft), r)
    return out


def assign_capacities(ranker: Ranker, ranked: list, slo_tpot, slo_ttft, fixed) -> None:
    """Set ``r.capacity`` on every ranked candidate; one search per candidate less its MoE runner."""
    reps: dict[Candidate, Ranked] = {}
    for r in ranked:
        reps.setdefault(replace(r.candidate, moe_runner=None), r)
    base = {r.candidate: r for r in reps.values()}
    at_one = {
        c: None if r.meets_slo else (failed_condition(r, slo_tpot, slo_ttft) or cap.MEMORY)
        for c, r in base.items()
    }

    def evaluate(load: dict) -> dict:
        return {c: why for c, (why, _) in at_load(ranker, base, load, slo_tpot, slo_ttft, fixed).items()}

    done = cap.search(evaluate, at_one)
    w = ranker.w
    over = "arrival rate" if w.rate_rps else "concurrency"
    tok = {}
    if w.rate_rps:  # in steady state a deployment that keeps up serves what arrives
        tok = {c: x * w.rate_rps * w.osl_mean / c.n_gpus for c, (x, _, _) in done.items()}
    else:  # Little's law at the capacity's concurrency
        at = {c: x for c, (x, _, _) in done.items() if x > 0}
        for c, (_, r) in at_load(ranker, base, at, slo_tpot, slo_ttft, fixed, need_ranked=True).items():
            tok[c] = r.tok_s_per_gpu if r is not None else 0.0
    found = {c: Capacity(x, over, tok.get(c, 0.0), why, fail_at) for c, (x, why, fail_at) in done.items()}
    for r in ranked:
        r.capacity = found[reps[replace(r.candidate, moe_runner=None)].candidate]


def rank_candidates(
    ranker: Ranker,
    n_gpus: int,
    slo_tpot: float | None = None,
    slo_ttft: float | None = None,
    concurrency: float | None = None,
    n_simulated: int | None = None,
    sim_capacity: bool = True,
) -> tuple[list[Ranked], list[Checked]]:
    """All feasible candidates ranked, and the excluded ones with their reasons: screened
    analytically, then the first ``n_simulated`` (default ``simulated.N_SIMULATED``) simulated
    (``simulated``) when the trace's requests were kept, and ranked again by the same key, ahead of
    the rows the screen alone predicts; without ``sim_capacity`` they keep the screen's capacity."""
    from hpc_advise.advisor.candidates import enumerate_candidates

    w = ranker.w
    all_c = enumerate_candidates(ranker.model, n_gpus)
    conc = ranker.concurrency(all_c, concurrency)
    checked = check_all(ranker.model, ranker.gpu, n_gpus, lambda c: conc[c], w.ctx_mean, w.ctx_p99)
    ok = [chk for chk in checked if chk.ok]
    excluded = [chk for chk in checked if not chk.ok]
    if not ok:
        return [], excluded
    ranked = []
    for chk, r in ranker.predict_checked(ok, conc, slo_tpot, slo_ttft):
        if isinstance(r, RowError):
            excluded.append(Checked(chk.candidate, False, f"cannot predict: {r}"))
        else:
            ranked.append(r)
    slo_given = slo_tpot is not None or slo_ttft is not None
    assign_capacities(ranker, ranked, slo_tpot, slo_ttft, concurrency)

    def overshoot(r: Ranked) -> float:
        """How far the worse of the two SLOs is missed (1.0 = exactly met)."""
        ratios = [1.0]
        if slo_tpot is not None:
            ratios.append(r.tpot_p99 / slo_tpot)
        if slo_ttft is not None:
            ratios.append(r.ttft_p99 / slo_ttft)
        return max(ratios)

    def key(r: Ranked):
        unmeasured = sum(f.startswith((UNMEASURED_ATTENTION, UNMEASURED_MOE)) for f in r.flags)
        if not r.meets_slo:  # none of these meets the SLOs: the closest first
            if r.simulated and r.sim_failure in ("queue growth", cap.MEMORY):  # simulated: it does not keep up
                x = r.capacity.x if r.capacity else 0.0
                return (True, math.inf, -x, unmeasured, r.tpot_p50)
            if r.kv_saturated_rps is not None:  # after those that keep up: the most served per GPU
                return (True, math.inf, -r.kv_saturated_rps / r.candidate.n_gpus, unmeasured, r.tpot_p50)
            return (True, round(overshoot(r), 6), 0.0, unmeasured, r.tpot_p50, r.ttft_p99)
        latency = (round(r.latency_ms, 6), r.tpot_p50)
        if slo_given:  # within 5 % of the best goodput per GPU (below the model's error): by latency
            if r.max_tok_s_per_gpu >= 0.95 * best_tok:
                return (False, 0, 0.0, unmeasured, *latency)
            return (False, 1, round(-r.max_tok_s_per_gpu, 6), unmeasured, *latency)
        return (False, 0, 0.0, unmeasured, *latency)

    best_tok = max((r.max_tok_s_per_gpu for r in ranked if r.meets_slo), default=0.0)

    ranked.sort(key=key)
    ranked = _drop_twins(ranked)
    the_plan = ranker.sim_plan(concurrency)
    if the_plan is not None:
        from hpc_advise.advisor import simulated

        n_sim = simulated.N_SIMULATED if n_simulated is None else n_simulated
        chosen = simulated.survivors(ranked, n_sim, simulated.N_SHAPES if n_simulated is None else 1)
        simulated.simulate_ranked(ranker, chosen, the_plan, slo_tpot, slo_ttft, concurrency, sim_capacity)
        best_tok = max((r.max_tok_s_per_gpu for r in chosen if r.meets_slo), default=0.0)
        ranked = sorted(chosen, key=key) + [r for r in ranked if all(r is not x for x in chosen)]
        if sim_capacity:
            simulated.add_samples(ranked[:3])
    for r in ranked[:5]:
        r.reasons = reasons_for(r, ranker, ranked)
    if slo_given and not ranked[0].meets_slo:
        for r in ranked[:5]:
            r.breaks = what_breaks(r, w, slo_tpot, slo_ttft)
    return ranked, excluded
