"""The step-cost model: what one scheduler step of an SGLang replica costs, from the roofline's
physics with fitted coefficients, and the fit of those coefficients with the simulator in the loop.

``RooflineStepCost`` implements ``simulate.StepCost`` for one deployment (model, GPU, TP / EP /
attention-DP, weight and KV precisions). Each step's time is linear in a coefficient vector θ over
physical terms (µs; ``roofline.decode_step`` / ``roofline.prefill`` on one rank):

    decode  = θ · [1 ms, 10 µs per layer, KV read (+ bounded state), weight GEMMs, MoE + router,
                   collectives' bytes, 10 µs per collective, 10 µs per MoE layer, the routed
                   tokens' activation traffic]
    prefill = θ · [1 ms, 10 µs per layer, GEMMs + MoE + LM head at the new tokens, causal attention
                   FLOPs (query-key pairs) + KV write, collectives' bytes, 10 µs per collective]

times one factor for the decode terms and one for the prefill terms per engine and GPU family
(``level``). A decode batch's batch-dependent terms are tabulated per batch size, its KV term is
linear in the context tokens, so ``decode_s`` is a lookup and ``decode_run_s`` one numpy expression.

Fit (``fit``): every measured run (``ServingPoint``: isl, osl, concurrency, deployment) is replayed
as the closed loop it was (``concurrency`` clients sending requests of exactly isl / osl tokens, KV
pool from the GPU's memory after weights, SGLang's chunked-prefill default) through ``simulate``.
In a closed loop every event falls on a step's end, so which steps run, and in which order, does not
depend on how long they take: the simulated mean TTFT and TPOT are exactly linear in θ. One
simulation per run therefore gives its design rows: the per-request sums of each term over the steps
that made up its TTFT and its TPOT (averaged over the run's requests, the way ``bench_serving``
averages). θ is fitted non-negatively on the relative error of TTFT and TPOT together, iteratively
reweighted toward least absolute relative error (the score is a median percentage error); then the
level: log(measured / predicted) = engine + GPU family, by alternating means, separately for TPOT
(decode terms) and TTFT (prefill terms). An engine x family with no rows (SGLang on Hopper in the
shipped data) gets its engine's level plus the Hopper level that the other engines measured there:
anchored on Hopper measurements and on the Hopper rates of the GPU profile, not on Blackwell alone.

Numpy only (no scipy, no scikit-learn): nothing here slows ``recommend``'s start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hpc_advise import rules
from hpc_advise.advisor import roofline as F
from hpc_advise.advisor.simulate import PrefillShape, SchedulerConfig, Workload, simulate
from hpc_advise.advisor.simulate.config import default_chunked_prefill_size

DECODE_TERMS = (
    "d_const", "d_layers", "d_kv", "d_weights", "d_moe", "d_comm", "d_collectives", "d_moe_layers", "d_moe_routed",
)  # fmt: skip
PREFILL_TERMS = ("p_const", "p_layers", "p_gemm", "p_attention", "p_comm", "p_collectives")
TERMS = DECODE_TERMS + PREFILL_TERMS
N_D = len(DECODE_TERMS)


class StepTerms:
    """The physical terms (µs per rank) of one deployment's steps, cached per batch / token count."""

    def __init__(self, shapes: F.Shapes, rates: F.Rates, dep: F.Deployment):
        self.s, self.rates, self.dep = shapes, rates, dep
        s = shapes
        zero = F.decode_step(s, rates, dep, ctx_sum=0.0, batch=1.0)
        one = F.decode_step(s, rates, dep, ctx_sum=1.0, batch=1.0)
        self.kv_per_token = one["attn_kv"] - zero["attn_kv"]  # µs per context token read per step
        qk_dim = s.head_dim if not s.mla else s.head_dim + 64
        self.per_pair = 2.0 * s.layers * (s.heads / dep.attn_tp) * (qk_dim + s.head_dim) / rates.peak("bf16")
        self.kv_write = (
            s.layers * s.kv_bytes_per_token_layer_bf16 * dep.kv_bytes / 2.0 / min(dep.attn_tp, s.kv_heads)
        ) / rates.bw
        self._decode: dict[int, np.ndarray] = {}
        self._prefill: dict[int, np.ndarray] = {}

    def decode_base(self, batch: int) -> np.ndarray:
        """Decode terms at ``batch`` sequences and no context (the KV term adds ``kv_per_token``)."""
        v = self._decode.get(batch)
        if v is None:
            d = F.decode_step(self.s, self.rates, self.dep, ctx_sum=0.0, batch=float(batch))
            v = np.array(
                [
                    1000.0,
                    10.0 * self.s.layers,
                    d["attn_kv"],
                    d["attn_proj"] + d["dense_ffn"] + d["lm_head"],
                    d["moe"] + d["router"],
                    d["comm"],
                    10.0 * d["n_collectives"],
                    10.0 * self.s.moe_layers,
                    d["moe_routed"],
                ]
            )
            self._decode[batch] = v
        return v

    def decode(self, batch: int, context_tokens: float) -> np.ndarray:
        v = self.decode_base(batch).copy()
        v[2] += self.kv_per_token * context_tokens
        return v

    def prefill(self, shape: PrefillShape) -> np.ndarray:
        n = max(int(shape.new_tokens), 1)
        base = self._prefill.get(n)
        if base is None:
            p = F.prefill(self.s, self.rates, self.dep, tokens=float(n), ctx_before=0.0)
            base = np.array(
                [
                    1000.0,
                    10.0 * self.s.layers,
                    p["attn_proj"] + p["dense_ffn"] + p["moe"] + p["lm_head"],
                    0.0,
                    p["comm"],
                    10.0 * p["n_collectives"],
                ]
            )
            if len(self._prefill) < 65536:
                self._prefill[n] = base
        v = base.copy()
        v[3] = self.per_pair * shape.attention_pairs + self.kv_write * n
        return v


class RooflineStepCost:
    """``simulate.StepCost`` from ``StepTerms`` and coefficients (decode θ, prefill θ; seconds out)."""

    def __init__(self, terms: StepTerms, theta_decode, theta_prefill):
        self.terms = terms
        self.td = np.asarray(theta_decode, dtype=np.float64) * 1e-6
        self.tp = np.asarray(theta_prefill, dtype=np.float64) * 1e-6
        self._base: dict[int, float] = {}
        self._kv = float(self.td[2] * terms.kv_per_token)
        self._passes: dict[PrefillShape, float] = {}  # ``prefill_s``: a replay repeats most passes

    def _decode_base(self, batch: int) -> float:
        v = self._base.get(batch)
        if v is None:
            v = float(self.terms.decode_base(batch) @ self.td)
            self._base[batch] = v
        return v

    def decode_s(self, batch_size: int, context_tokens: int) -> float:
        return self._decode_base(batch_size) + self._kv * context_tokens

    def decode_run_s(self, batch_size: int, context_tokens: int, k: int) -> np.ndarray:
        ctx = context_tokens + batch_size * np.arange(k, dtype=np.float64)
        return self._decode_base(batch_size) + self._kv * ctx

    def prefill_s(self, shape: PrefillShape) -> float:
        v = self._passes.get(shape)
        if v is None:
            v = float(self.terms.prefill(shape) @ self.tp)
            if len(self._passes) < 65536:
                self._passes[shape] = v
        return v


class _Recorder:
    """A step cost that keeps each step's terms (in call order) and returns a nominal time: in a
    closed loop the schedule does not depend on the times (module docstring)."""

    def __init__(self, terms: StepTerms):
        self.terms = terms
        self.nominal = RooflineStepCost(terms, np.ones(N_D), np.ones(len(PREFILL_TERMS)))
        self.parts: list[tuple] = []  # ("p", terms, dt) or ("d", batch, ctx0, k)

    def prefill_s(self, shape: PrefillShape) -> float:
        v = self.terms.prefill(shape)
        dt = float(v @ self.nominal.tp)
        self.parts.append(("p", v, dt))
        return dt

    def decode_s(self, batch_size: int, context_tokens: int) -> float:
        return float(self.decode_run_s(batch_size, context_tokens, 1)[0])

    def decode_run_s(self, batch_size: int, context_tokens: int, k: int) -> np.ndarray:
        self.parts.append(("d", batch_size, context_tokens, k))
        return self.nominal.decode_run_s(batch_size, context_tokens, k)

    def steps(self) -> tuple[np.ndarray, np.ndarray]:
        """(end time of every step [n], cumulative terms [n + 1, len(TERMS)])."""
        durs, rows = [], []
        kvc = self.terms.kv_per_token
        for part in self.parts:
            if part[0] == "p":
                row = np.zeros((1, len(TERMS)))
                row[0, N_D:] = part[1]
                rows.append(row)
                durs.append(np.array([part[2]]))
            else:
                _, b, c0, k = part
                ctx = c0 + b * np.arange(k, dtype=np.float64)
                row = np.zeros((k, len(TERMS)))
                row[:, :N_D] = self.terms.decode_base(b)
                row[:, 2] += kvc * ctx
                rows.append(row)
                durs.append(self.nominal.decode_run_s(b, c0, k))
        if not rows:
            return np.zeros(0), np.zeros((1, len(TERMS)))
        ends = np.cumsum(np.concatenate(durs))
        cum = np.zeros((ends.size + 1, len(TERMS)))
        np.cumsum(np.concatenate(rows), axis=0, out=cum[1:])
        return ends, cum


# ----- deployments and their scheduler ---------------------------------------------------------


def kv_pool_tokens(
    model, gpu, dep: F.Deployment, mem_fraction: float | None = None, page_size: int = 1
) -> int:
    """KV pool of one attention group in tokens, as SGLang sizes it (``rules.kv_pool_tokens``): its
    default ``mem_fraction_static`` for this deployment (``rules.static_memory_fraction``) less this
    rank's weights, over SGLang's per-token cell (MLA's latent once per attention group, GQA heads
    split over attention-TP, full-attention layers only)."""
    from hpc_advise.advisor.candidates import rank_weight_bytes

    if mem_fraction is None:
        setup = rules.Setup(tp=dep.n_gpus, ep=dep.moe_ep, attn_dp=dep.attn_dp)
        mem_fraction = rules.static_memory_fraction(
            setup, gpu.memory_gib, mla=model.attention == "mla", vision=rules.vision_tower(model)
        )
    return rules.kv_pool_tokens(
        model,
        dep.attn_tp,
        dep.kv_bytes,
        memory_gib=gpu.memory_gib,
        fraction=mem_fraction,
        weight_bytes=rank_weight_bytes(model, dep),
        page_size=page_size,
        sm_major=int(gpu.compute_capability[0]),
    )


@dataclass
class Deployed:
    """What the simulator needs for one deployment: its terms and its scheduler."""

    terms: StepTerms
    config: SchedulerConfig
    engine: str
    family: str


def deployed(model, gpu, dep: F.Deployment, engine: str = "sglang", page_size: int = 1, **cfg) -> Deployed:
    pool = kv_pool_tokens(model, gpu, dep, page_size=page_size)
    if pool < 2:
        raise ValueError(f"no KV pool left: weights fill the GPU at {dep.n_gpus} GPUs")
    config = SchedulerConfig(
        max_total_tokens=pool,
        chunked_prefill_size=cfg.pop("chunked_prefill_size", default_chunked_prefill_size(gpu.memory_gib)),
        page_size=page_size,
        context_len=int(getattr(model, "max_position_embeddings", 0) or 131072),
        **cfg,
    )
    return Deployed(StepTerms(F.shapes_of(model), F.Rates.of(gpu), dep), config, engine, gpu_family(gpu))


def gpu_family(gpu) -> str:
    major = int(gpu.compute_capability[0])
    return {8: "ampere", 9: "hopper", 10: "blackwell", 12: "blackwell"}.get(major, f"sm{major}")


# ----- closed-loop replay: design rows ---------------------------------------------------------


def closed_loop_requests(concurrency: int) -> int:
    """Requests one replayed benchmark sends: two rounds of the clients, at most 256 beyond one."""
    return int(concurrency + min(concurrency, 256))


def closed_loop_workload(isl: int, osl: int, concurrency: int, cached: int = -1, stagger: bool = False) -> Workload:
    """The requests of a replayed closed-loop benchmark (``closed_loop_requests``), all of ``isl`` /
    ``osl`` tokens, ``cached`` prompt tokens each served by the prefix cache (-1: none). With
    ``stagger`` the first round's outputs are spread over 1/N ... N/N of ``osl``, so the clients do
    not run in lock-step (a benchmark's clients drift apart; uniform requests started together stay
    together and queue every round's N prefills at once)."""
    n = closed_loop_requests(concurrency)
    out = np.full(n, int(osl), dtype=np.int64)
    if stagger:
        k = min(int(concurrency), n)
        out[:k] = np.maximum(1, np.round(osl * np.arange(1, k + 1) / k)).astype(np.int64)
    return Workload(
        np.zeros(n),
        np.full(n, int(isl), dtype=np.int64),
        out,
        np.full(n, int(cached), dtype=np.int64),
        np.zeros(n + 1, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
    )


def design_rows(
    d: Deployed,
    isl: int,
    osl: int,
    concurrency: int,
    *,
    cached: int = -1,
    stagger: bool = False,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(TTFT row, TPOT row, notes) of a closed loop of ``concurrency`` clients (per attention group)
    sending requests of ``isl`` / ``osl`` tokens (``closed_loop_workload``): mean per-request sums
    of each term (µs) over the steps between sending and the first token, and between the first and
    the last token divided by osl - 1. ``predicted = row @ θ``. With ``stagger`` only the requests
    after the first round are averaged (the first round's are shortened)."""
    w = closed_loop_workload(isl, osl, concurrency, cached, stagger)
    rec = _Recorder(d.terms)
    res = simulate(w, rec, d.config, concurrency=int(concurrency))
    ends, cum = rec.steps()
    ok = res.finished & ~res.rejected
    if stagger and len(w) > concurrency:
        ok[: int(concurrency)] = False
    if not ok.any():
        raise ValueError("no request of the replay could be served (prompt larger than the KV pool)")
    tol = 1e-9 * (float(ends[-1]) if ends.size else 1.0)

    def at(times):
        return cum[np.searchsorted(ends, times + tol, side="right")]

    send = res.send_s[ok]
    first = send + res.ttft_s[ok]
    fin = send + res.e2e_s[ok]
    ttft = (at(first) - at(send)).mean(axis=0)
    tpot = ((at(fin) - at(first)) / max(osl - 1, 1)).mean(axis=0)
    notes = {
        "retractions": res.retractions,
        "queue_s": float(np.mean(res.queue_s[ok])),
        "pool_tokens": d.config.max_total_tokens,
    }
    return ttft, tpot, notes


# ----- a candidate's step cost, levelled on the two-stage serving model ---------------------------

# The physical terms only (no per-step constants): decode = KV read + weight GEMMs + MoE + collectives,
# prefill = GEMMs + MoE + causal attention + KV write + collectives, each at θ = 1 (roofline µs); the
# routed activations are outside the decode roofline's total (``roofline.decode_step``), so 0 here.
PHYSICS_DECODE = np.array([0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
PHYSICS_PREFILL = np.array([0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
MIN_DECODE_FACTOR = 0.05  # a decode step cannot be much faster than its roofline


def decode_shape_of(serving_theta_tpot) -> np.ndarray:
    """The two-stage serving model's stage-1 decode coefficients (``serving_model.TPOT_TERMS``: const,
    layers, collectives, KV, weights, MoE, comm, then after the two prefill terms MoE layers and
    routed activations) in ``DECODE_TERMS`` order: the same physical terms in the same units (1 ms,
    10 µs per layer, 10 µs per collective, 10 µs per MoE layer, roofline µs)."""
    t = np.asarray(serving_theta_tpot, dtype=float)
    return np.array([t[0], t[1], t[3], t[4], t[5], t[6], t[2], t[9], t[10]])


class LevelledStepCost(RooflineStepCost):
    """``RooflineStepCost`` with decode = ``decode_factor`` x ``decode_shape`` · terms +
    ``extra_decode_s`` (the attention backend's and MoE runner's difference to the reference, per
    step) and prefill = ``prefill_factor`` x its roofline (the GPU time a prefill occupies).
    ``decode_shape`` defaults to the bare roofline (``PHYSICS_DECODE``)."""

    def __init__(
        self,
        terms: StepTerms,
        decode_factor: float,
        prefill_factor: float,
        extra_decode_s: float = 0.0,
        decode_shape: np.ndarray | None = None,
    ):
        shape = PHYSICS_DECODE if decode_shape is None else np.asarray(decode_shape, dtype=float)
        super().__init__(terms, shape * decode_factor, PHYSICS_PREFILL * prefill_factor)
        self.decode_shape = shape
        self.decode_factor, self.prefill_factor = float(decode_factor), float(prefill_factor)
        self.extra_decode_s = float(extra_decode_s)
        self._alone: dict[tuple, float] = {}  # ``roofline_prefill_ms`` per (new, cached) tokens

    def _decode_base(self, batch: int) -> float:
        v = self._base.get(batch)
        if v is None:
            v = float(self.terms.decode_base(batch) @ self.td) + self.extra_decode_s
            self._base[batch] = v
        return v

    def decode_s(self, batch_size: int, context_tokens: int) -> float:
        v = self._base.get(batch_size)  # the simulator's hottest call: one lookup
        if v is None:
            v = self._decode_base(batch_size)
        return v + self._kv * context_tokens

    def roofline_prefill_ms(self, new_tokens: np.ndarray, cached_tokens: np.ndarray) -> np.ndarray:
        """Roofline ms of each request's prefill alone: ``new_tokens`` computed over ``cached_tokens``
        (kept per pair: the replays of one candidate at other loads ask for mostly the same ones)."""
        memo = self._alone
        out = np.empty(len(new_tokens))
        for i, key in enumerate(zip(np.asarray(new_tokens).tolist(), np.asarray(cached_tokens).tolist(), strict=True)):
            v = memo.get(key)
            if v is None:
                n, c = max(int(key[0]), 1), key[1]
                pairs = n * (c + (n + 1) / 2.0)
                v = float(self.terms.prefill(PrefillShape(n, int(c), 1, pairs)) @ PHYSICS_PREFILL) / 1e3
                if len(memo) < 65536:
                    memo[key] = v
            out[i] = v
        return out


@dataclass(frozen=True)
class Levels:
    """What ``solve_levels`` found for one candidate: the decode factor on the decode roofline, the
    prefill occupancy (fixed, the serving model's), and the TTFT latency that occupies no GPU:
    per request ``latency_scale x max(0, (overhead + coef x pf) x corr - occupancy x pf)`` ms, pf its
    roofline prefill (the two-stage model's unqueued TTFT less the GPU time the simulator already
    spends on the prefill). ``target_*`` and ``closed_loop_*`` are the two-stage figures and what the
    simulated closed loop gives with these levels (ms)."""

    decode_factor: float
    prefill_factor: float
    latency_scale: float
    overhead_ms: float
    prefill_coef: float
    correction: float
    target_tpot_ms: float
    target_ttft_ms: float
    closed_loop_tpot_ms: float
    closed_loop_ttft_ms: float
    concurrency: int

    def latency_ms(self, pf_ms: np.ndarray) -> np.ndarray:
        pf = np.asarray(pf_ms, dtype=float)
        off_gpu = (self.overhead_ms + self.prefill_coef * pf) * self.correction - self.prefill_factor * pf
        return self.latency_scale * np.maximum(off_gpu, 0.0)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def solve_levels(
    d: Deployed,
    isl: float,
    osl: float,
    concurrency: float,
    target_tpot_ms: float,
    target_ttft_ms: float,
    split: tuple[float, float, float],
    occupancy: float,
    reuse: float = 0.0,
    decode_shape: np.ndarray | None = None,
    idle_ttft_ms: float | None = None,
) -> tuple[LevelledStepCost, Levels]:
    """Level ``d``'s physics on the two-stage serving model's point prediction.

    The operating point: a closed loop of ``concurrency`` clients per attention group (the candidate's
    requests in flight) sending the trace's mean lengths, ``reuse`` of each prompt served by the
    prefix cache, clients staggered (``closed_loop_workload``). The prefill occupies ``occupancy`` x
    its roofline of GPU (``ServingModel.prefill_occupancy``: fitted on how decode slowed beside
    prefills). Two unknowns: the decode factor and the scale of the TTFT latency that occupies no
    GPU (``Levels``). In a closed loop the schedule does not depend on step times, so the simulated
    mean TPOT and TTFT are linear in them: one recorded simulation gives both rows and the solve is
    exact (TPOT first: it holds no latency term; then TTFT). A TPOT below what the prefills beside
    the decode already cost clamps the factor at ``MIN_DECODE_FACTOR``; a TTFT below the simulated
    queueing plus prefill clamps the latency at 0. ``split``: the two-stage TTFT as
    (overhead ms, prefill coefficient, correction), ``ServingModel.ttft_split``; ``decode_shape``:
    the decode terms' relative weights (``decode_shape_of`` the serving model's; default the bare
    roofline), so the factor is the level and the shape says how the step grows with the batch.
    ``idle_ttft_ms``: the two-stage TTFT of one request per attention group; the latency that occupies
    no GPU is held at what that leaves over the simulated idle TTFT (latency the server has unloaded),
    so the two-stage model's closed-loop queueing, where it exceeds the simulated one, is not turned
    into a latency every request pays at any load: ``closed_loop_ttft_ms`` is then below the target."""
    shape = PHYSICS_DECODE if decode_shape is None else np.asarray(decode_shape, dtype=float)
    g = max(int(round(concurrency)), 1)
    isl_i, osl_i = max(int(round(isl)), 1), max(int(round(osl)), 1)
    cached = int(round(isl_i * reuse)) if reuse > 0 else -1
    ttft_row, tpot_row, _ = design_rows(d, isl_i, osl_i, g, cached=cached, stagger=True)
    # ms per unit of each unknown (rows are µs)
    td, tp_ = ttft_row[:N_D] @ shape / 1e3, ttft_row[N_D:] @ PHYSICS_PREFILL / 1e3
    pd, pp = tpot_row[:N_D] @ shape / 1e3, tpot_row[N_D:] @ PHYSICS_PREFILL / 1e3
    a_d = float(max((target_tpot_ms - occupancy * pp) / max(pd, 1e-12), MIN_DECODE_FACTOR))
    over, coef, corr = split
    probe = Levels(a_d, occupancy, 1.0, over, coef, corr, 0, 0, 0, 0, g)
    new = max(isl_i - max(cached, 0), 1)
    cost = LevelledStepCost(d.terms, a_d, occupancy, decode_shape=shape)
    lat1 = float(probe.latency_ms(cost.roofline_prefill_ms(np.array([new]), np.array([max(cached, 0)])))[0])
    sim_ttft = a_d * td + occupancy * tp_
    scale = float(max((target_ttft_ms - sim_ttft) / lat1, 0.0)) if lat1 > 0 else 0.0
    if idle_ttft_ms is not None and lat1 > 0:
        idle_row, _, _ = design_rows(d, isl_i, osl_i, 1, cached=cached, stagger=True)
        idle_sim = a_d * (idle_row[:N_D] @ shape) / 1e3 + occupancy * (idle_row[N_D:] @ PHYSICS_PREFILL) / 1e3
        scale = float(min(scale, max((idle_ttft_ms - idle_sim) / lat1, 0.0)))
    levels = Levels(
        a_d,
        occupancy,
        scale,
        over,
        coef,
        corr,
        float(target_tpot_ms),
        float(target_ttft_ms),
        float(a_d * pd + occupancy * pp),
        float(sim_ttft + scale * lat1),
        g,
    )
    return cost, levels


# ----- fitting ---------------------------------------------------------------------------------


def nnls(A: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Non-negative least squares, Lawson and Hanson's active-set method (small problems)."""
    m, n = A.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = A.T @ (b - A @ x)
    it = 0
    max_iter = max_iter or 3 * n
    while (~passive).any() and w[~passive].max() > 1e-12 * max(1.0, np.abs(w).max()) and it < max_iter:
        it += 1
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / np.maximum(x[neg] - z[neg], 1e-300))
            x = x + alpha * (z - x)
            passive &= x > 1e-12
            x[~passive] = 0.0
        w = A.T @ (b - A @ x)
    return x


def fit_relative(
    X: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None, rounds: int = 30
) -> np.ndarray:
    """Non-negative θ minimising the relative error of ``X @ θ`` against ``y``: least squares, then
    reweighted toward least absolute relative error (weights 1/sqrt|r|, floored at 1 %)."""
    A = X / y[:, None]
    base = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=float)
    scale = np.maximum(np.abs(A).max(axis=0), 1e-30)  # columns of very different magnitudes
    A = A / scale
    sq = np.sqrt(base)
    theta = nnls(A * sq[:, None], sq)
    for _ in range(rounds):
        r = np.sqrt(base / np.maximum(np.abs(A @ theta - 1.0), 0.01))
        new = nnls(A * r[:, None], r)
        moved = np.abs(new - theta).sum() / max(np.abs(theta).sum(), 1e-12)
        theta = new
        if moved < 1e-5:
            break
    return theta / scale


def additive_levels(logr: np.ndarray, engines: np.ndarray, families: np.ndarray, rounds: int = 30) -> dict:
    """log ratio ~ engine + family, least squares by alternating means (medians do not converge to
    the decomposition when cells are unbalanced); returns {"engine": {e: a}, "family": {f: b}}."""
    a = {e: 0.0 for e in set(engines)}
    b = {f: 0.0 for f in set(families)}
    for _ in range(rounds):
        fb = np.array([b[f] for f in families])
        a = {e: float(np.mean((logr - fb)[engines == e])) for e in a}
        ea = np.array([a[e] for e in engines])
        b = {f: float(np.mean((logr - ea)[families == f])) for f in b}
    # families relative to the most common one, so an engine's level is its level there
    ref = max(b, key=lambda f: int((families == f).sum()))
    shift = b[ref]
    return {"engine": {e: v + shift for e, v in a.items()}, "family": {f: v - shift for f, v in b.items()}}


@dataclass
class StepModel:
    """Fitted coefficients and levels."""

    theta: np.ndarray  # [len(TERMS)]
    levels: dict  # {"tpot"|"ttft": additive_levels(...)}
    cells: dict = field(default_factory=dict)  # {"tpot"|"ttft": {(engine, family): log level}}

    def level(self, which: str, engine: str, family: str) -> float:
        """Factor on the decode (``tpot``) or prefill (``ttft``) terms for an engine on a family."""
        cell = self.cells.get(which, {}).get(f"{engine}@{family}")
        if cell is not None:
            return math.exp(cell)
        lv = self.levels[which]
        return math.exp(lv["engine"].get(engine, 0.0) + lv["family"].get(family, 0.0))

    def thetas(self, engine: str, family: str) -> tuple[np.ndarray, np.ndarray]:
        return (
            self.theta[:N_D] * self.level("tpot", engine, family),
            self.theta[N_D:] * self.level("ttft", engine, family),
        )

    def cost(self, d: Deployed) -> RooflineStepCost:
        td, tp = self.thetas(d.engine, d.family)
        return RooflineStepCost(d.terms, td, tp)

    def predict_rows(self, ttft_rows: np.ndarray, tpot_rows: np.ndarray, engines, families) -> tuple:
        """(TTFT ms, TPOT ms) of design rows, each with its engine's and family's level."""
        tt, tp = [], []
        for r_ttft, r_tpot, e, f in zip(ttft_rows, tpot_rows, engines, families, strict=True):
            td, tpp = self.thetas(e, f)
            th = np.concatenate([td, tpp])
            tt.append(float(r_ttft @ th) / 1e3)
            tp.append(float(r_tpot @ th) / 1e3)
        return np.array(tt), np.array(tp)


MIN_CELL_ROWS = 150  # an engine x family with this many rows gets its own level


def fit(
    ttft_rows: np.ndarray,
    tpot_rows: np.ndarray,
    ttft_ms: np.ndarray,
    tpot_ms: np.ndarray,
    engines: np.ndarray,
    families: np.ndarray,
    ttft_weight: float = 0.5,
) -> StepModel:
    """θ on TTFT and TPOT together (relative error), then the levels (module docstring)."""
    engines, families = np.asarray(engines), np.asarray(families)
    X = np.vstack([tpot_rows, ttft_rows])
    y = np.concatenate([tpot_ms, ttft_ms]) * 1e3
    wts = np.concatenate([np.ones(len(tpot_ms)), np.full(len(ttft_ms), ttft_weight)])
    theta = fit_relative(X, y, wts)
    levels, cells = {}, {}
    for which, rows, meas in (("tpot", tpot_rows, tpot_ms), ("ttft", ttft_rows, ttft_ms)):
        pred = np.maximum(rows @ theta, 1e-3)
        logr = np.log(meas * 1e3 / pred)
        levels[which] = additive_levels(logr, engines, families)
        cells[which] = {}
        for key in {f"{e}@{f}" for e, f in zip(engines, families, strict=True)}:
            e, f = key.split("@")
            idx = (engines == e) & (families == f)
            if idx.sum() >= MIN_CELL_ROWS:
                cells[which][key] = float(np.median(logr[idx]))
    return StepModel(theta, levels, cells)


# ----- training rows and grouped cross-validation ------------------------------------------------


@dataclass
class Rows:
    """Design rows of measured runs (one per run) with what grouping and levels need."""

    ttft: np.ndarray  # [n, len(TERMS)]
    tpot: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    engines: np.ndarray
    families: np.ndarray
    models: np.ndarray
    gpus: np.ndarray
    left_out: list = field(default_factory=list)  # (where, reason)

    def take(self, idx) -> Rows:
        return Rows(
            *(
                getattr(self, k)[idx]
                for k in ("ttft", "tpot", "ttft_ms", "tpot_ms", "engines", "families", "models", "gpus")
            )
        )

    def fit(self) -> StepModel:
        return fit(self.ttft, self.tpot, self.ttft_ms, self.tpot_ms, self.engines, self.families)


def training_rows(preps) -> Rows:
    """Replay every prepared point (``serving_model.prepare``) as its closed loop."""
    from hpc_advise.profiles.resolve import resolve_gpu, resolve_model

    keep, a, b, bad = [], [], [], []
    fams = []
    for pr in preps:
        p = pr.point
        try:
            d = deployed(resolve_model(p.model), resolve_gpu(p.gpu), pr.dep, p.engine)
            conc = max(int(round(p.concurrency / pr.dep.attn_dp)), 1)
            r_ttft, r_tpot, _ = design_rows(d, int(round(p.isl)), int(round(p.osl)), conc)
        except ValueError as exc:
            bad.append((p.where, str(exc)))
            continue
        keep.append(pr)
        a.append(r_ttft)
        b.append(r_tpot)
        fams.append(d.family)
    return Rows(
        np.array(a).reshape(-1, len(TERMS)),
        np.array(b).reshape(-1, len(TERMS)),
        np.array([pr.point.ttft_ms for pr in keep], dtype=float),
        np.array([pr.point.tpot_ms for pr in keep], dtype=float),
        np.array([pr.point.engine for pr in keep]),
        np.array(fams),
        np.array([pr.model_key for pr in keep]),
        np.array([pr.gpu_key for pr in keep]),
        bad,
    )


GROUPINGS = ("model", "gpu", "engine_family")


def evaluate(rows: Rows, by: tuple[str, ...] = GROUPINGS) -> list[dict]:
    """Grouped cross-validation on design rows: each held-out group predicted by a fit on the others;
    median / p90 absolute percentage error of TPOT and TTFT per group and pooled ('all')."""
    out = []
    for kind in by:
        if kind == "model":
            g = rows.models
        elif kind == "gpu":
            g = rows.gpus
        elif kind == "engine_family":
            g = np.array([f"{e}@{f}" for e, f in zip(rows.engines, rows.families, strict=True)])
        else:
            raise ValueError(f"unknown grouping {kind!r}; known: {GROUPINGS}")
        p_ttft = np.full(len(g), np.nan)
        p_tpot = np.full(len(g), np.nan)
        for k in sorted(set(g)):
            test = g == k
            if (~test).sum() < 20:
                continue
            m = rows.take(~test).fit()
            p_ttft[test], p_tpot[test] = m.predict_rows(
                rows.ttft[test], rows.tpot[test], rows.engines[test], rows.families[test]
            )
        groups = sorted(set(g)) + ["all"]
        for k in groups:
            idx = np.isfinite(p_tpot) & ((g == k) if k != "all" else True)
            if not idx.any():
                continue
            e_tpot = np.abs(p_tpot[idx] / rows.tpot_ms[idx] - 1.0) * 100
            e_ttft = np.abs(p_ttft[idx] / rows.ttft_ms[idx] - 1.0) * 100
            out.append(
                {
                    "held_out": kind,
                    "group": str(k),
                    "n": int(idx.sum()),
                    "tpot_median_ape": float(np.median(e_tpot)),
                    "tpot_p90_ape": float(np.percentile(e_tpot, 90)),
                    "ttft_median_ape": float(np.median(e_ttft)),
                    "ttft_p90_ape": float(np.percentile(e_ttft, 90)),
                }
            )
    return out
