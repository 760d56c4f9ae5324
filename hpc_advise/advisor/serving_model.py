"""The serving-level performance model: roofline terms calibrated on measured end-to-end runs.

Two stages, both fitted on ``ServingPoint``s (the shipped CSV plus the knowledge base's serving runs):

1. A non-negative linear model over the roofline's terms (``roofline``), pooled over engines, times
   one factor per engine: TPOT = θ · [1 ms, per-layer overhead, collectives, KV read (+ bounded
   state), weight read, MoE, communication, prefill interference mixed in / run alone, per-MoE-layer
   overhead, the routed tokens' activation traffic]; TTFT = θ · [1 ms, per-layer overhead, prefill,
   queueing wait, decode step, collectives].
   Fitted on relative error (each row divided by its measurement) by NNLS; for TPOT then reweighted
   toward least absolute relative error (``_nnls_rel``): the score is a median percentage error, and
   a few rows the roofline misdescribes no longer pull the shape. Each engine with at least
   ``min_engine_rows`` rows gets its median ratio as a factor (per-engine NNLS fitted narrow data into
   unphysical shapes); other engines use the pooled fit.
2. A small gradient-boosted correction (scikit-learn HistGradientBoosting, absolute loss) of the log
   ratio measured / stage 1, on dimensionless features (``roofline.FEATURE_NAMES``), no GPU or model
   identity. For TPOT its target is taken within each training model (``gbm_target =
   "within_model"``: each model's median log ratio removed), so it learns how the error moves with
   batch, lengths, parallelism and GPU, not the level of the models it saw, which does not transfer
   to a new one. TTFT uses the same fit since version 3 (held-out model TTFT median / p90 38.6 / 121.9 %
   -> 33.2 / 95.6 %; see ``SETTINGS``).

Since version 4 a prediction scales TPOT's two prefill-interference terms by the fraction of its life
a request spends decoding (``decode_fraction``, from the predicted TTFT and TPOT): requests waiting
for or running their prefill are not in the decode batch. The fit keeps them unscaled: its runs
decoded 97.6 % of the time (median; 5 % of them under 89 %), and fitting with each run's measured
fraction, or with the predicted one, scored worse in ``evaluate`` (held-out model TPOT median / p90
16.2 / 40.6 % and 15.7 / 40.2 % against 15.8 / 39.6 % for this and 15.9 / 39.9 % for version 3).

Since version 5 TPOT has two MoE terms the weight-bytes roofline lacks: 10 µs per MoE layer (the
router, top-k, sort, combine and shared-expert kernels a dense layer does not launch) and the routed
tokens' activations at bandwidth (``roofline.decode_step``'s ``moe_routed``: gathered into expert
order and scattered back, once per (token, expert) pair on a rank). Fitted they come out at about
32 µs per MoE layer and 18x the activations' roofline; adding the same routed-token term to TTFT
fits 19x there (an independent fit agreeing), but scored no better, so TTFT keeps its terms. Held out
by model TPOT median / p90 15.9 / 39.9 -> 12.9 / 36.1 %, by GPU 13.5 / 36.4 -> 12.7 / 35.6, by engine x
GPU family 13.2 / 37.6 -> 12.6 / 36.7 (``evaluate``; docs/advisor.md, "Honest error").

A closed loop over the KV pool waits for admission: where SGLang's pool holds fewer requests than
the loop sends (``admission``, at the point's own weight precision, ``kv_limit``), the point is
predicted at the requests held and its TTFT adds their steady-state wait (``admission_wait_ms``).
Since version 6 TensorRT-LLM's closed loops wait too, each admitted request holding its whole
isl + osl (its default scheduler, GUARANTEED_NO_EVICT, admits a request only when the KV of its
maximum length is free): held out by model TTFT median 33.0 -> 32.6 %, by GPU 34.5 / 81.7 ->
34.3 / 81.4 %; vLLM's (admitted at the mean context as SGLang's) measured worse (docs/advisor.md,
"Honest error"). The fit keeps such rows as they are (fitting them at the requests held measured
no better in ``evaluate``; docs/advisor.md, "Limits: KV-admission queueing").

TTFT is a latency: its calibration absorbs everything between a request's arrival and its first
token in the measured runs (scheduling, waiting behind other prefills of the closed-loop benchmark,
tokenization), so SGLang's TTFT prefill coefficient is ~10x the prefill roofline. It is not the GPU
time a prefill occupies. That time, which ``recommend`` needs for prefill capacity and queueing, is
``ServingModel.prefill_occupancy``: the TPOT fit's prefill-interference coefficients, i.e. how much
decode time the measured runs lost per unit of roofline prefill work run beside them (see there).

``evaluate`` runs grouped cross-validation (hold out every model, every GPU, every engine x GPU family
such as all vLLM rows on Hopper) and reports the median and p90 absolute percentage error per held-out
group; nothing fitted (θ, engine factors, the correction) sees a held-out row. Predictions carry
``out_of_range`` notes when an input lies outside what the model was trained on.

``load_or_fit``: the fit of the shipped data alone (no serving runs in the knowledge base, default
settings) ships as package data, ``data/serving_model.npz``: plain arrays (``TreeEnsemble`` holds the
correction's trees) that load and predict with numpy, so ``recommend`` neither fits nor imports
scikit-learn or scipy. ``tests/advisor/test_shipped_data.py`` fails when a fresh fit differs from it;
``HPC_ADVISE_WRITE_GOLDENS=1`` rewrites it there (and before the advisor goldens are recorded). A
knowledge base with serving runs changes the fit: that one is fitted on first use and cached, in the
same format, under ``hpc_advise.paths.cache_dir()`` keyed by a hash of its training rows, settings
and code. A model's ``key`` is a hash of its fitted numbers (``content_key``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from hpc_advise.advisor import roofline as F
from hpc_advise.advisor.serving_data import RowError, ServingPoint

MODEL_VERSION = 6  # 3: TTFT on the TPOT fit's settings; recommend's prefill occupancy from the TPOT fit;
# 4: TPOT's prefill terms at the predicted decoding fraction; 5: TPOT's MoE-layer and routed-token terms;
# 6: TensorRT-LLM's closed loops wait for admission at their whole isl + osl per request
SETTINGS: dict = {
    "version": MODEL_VERSION,
    "min_engine_rows": 150,
    "gbm": {
        "max_iter": 100,
        "learning_rate": 0.05,
        "max_leaf_nodes": 15,
        "min_samples_leaf": 60,
        "l2_regularization": 1.0,
        # the score is a median percentage error: absolute loss here as in stage 1
        "loss": "absolute_error",
        "random_state": 0,
    },
    "stage1": "pooled",  # or "per_engine" (its own NNLS per engine: fits better, transfers worse)
    "stage1_loss": "l1",  # or "l2" (plain NNLS on relative error, the version-1 fit)
    "use_gbm": True,
    "gbm_target": "within_model",  # or "pooled" (the raw log ratio, offsets of each model included)
    "residual_clip": 1.5,  # |log ratio| the correction may apply
    # TPOT and TTFT share these settings since version 3: the version-1 TTFT fit (least squares, raw
    # log ratio, squared loss) held out by model
    # scored 38.6 / 121.9 % (median / p90), this one 33.2 / 95.6 %; by GPU 29.8 / 85.8 -> 34.0 / 81.8;
    # by engine x GPU family 37.2 / 90.2 -> 35.5 / 85.9 (`hpc-advise model eval`, 2,876 rows)
}

TPOT_TERMS = (
    "const_ms",
    "layers",
    "collectives",
    "attn_kv",
    "weights",
    "moe",
    "comm",
    "interference",
    "interference_alone",
    "moe_layers",
    "moe_routed",
)
# the prefill-interference terms of TPOT_TERMS (scaled by ``decode_fraction``)
INTERFERENCE = [TPOT_TERMS.index("interference"), TPOT_TERMS.index("interference_alone")]
TTFT_TERMS = ("const_ms", "layers", "prefill", "wait", "step", "collectives")


# Checkpoints whose architecture equals a shipped profile's (same config.json shapes).
def resolve_model(name: str):
    """``profiles.resolve_model`` with the advisor's error type (``RowError``)."""
    from hpc_advise.profiles import ProfileNotFound
    from hpc_advise.profiles.resolve import resolve_model as resolve

    try:
        return resolve(name)
    except ProfileNotFound as exc:
        raise RowError(str(exc)) from None


def resolve_gpu(name: str):
    """``profiles.resolve_gpu`` with the advisor's error type (``RowError``)."""
    from hpc_advise.profiles import ProfileNotFound
    from hpc_advise.profiles.resolve import resolve_gpu as resolve

    try:
        return resolve(name)
    except ProfileNotFound as exc:
        raise RowError(str(exc)) from None


FOUR_BIT = ("nvfp4", "mxfp4", "int4_wo")


def model_quants(model) -> tuple[str, str]:
    """(dense GEMM quant, MoE quant) of the checkpoint a model profile plans
    (``candidates.planned_quants``, what the memory check sizes a user's deployment at)."""
    from hpc_advise.advisor.candidates import planned_quants

    return planned_quants(model)


@dataclass
class Prepared:
    """A ServingPoint with its profiles resolved and its roofline computed."""

    point: ServingPoint
    model_key: str
    gpu_key: str
    shapes: F.Shapes
    rates: F.Rates
    dep: F.Deployment
    workload: F.ClosedLoopLoad
    rf: dict
    feats: np.ndarray
    x_tpot: np.ndarray
    x_ttft: np.ndarray
    # requests per replica whose KV fits at the point's own weight precision (``kv_limit``); 0 = not
    # even one request's
    kv_limit: float = math.inf
    # the same point at the requests the server admits, when fewer than it is sent (``admission``):
    # the others wait for KV (``ServingModel.predict``); None when all are admitted
    admitted: Prepared | None = None


def kv_limit(model, gpu, p: ServingPoint, reserved: bool = False) -> float:
    """Most requests per replica of point ``p`` whose KV fits: ``candidates.kv_limit``, the memory
    check of a user's deployment, with the weights at the point's own precisions (a measured FP8 or
    NVFP4 row of a bf16 profile is sized as what it ran) and its fixed lengths (mean context
    isl + osl / 2, the longest isl + osl). ``reserved``: every request holds its whole isl + osl
    (an engine that reserves a request's maximum length when it admits it)."""
    from hpc_advise.advisor.candidates import Candidate
    from hpc_advise.advisor.candidates import kv_limit as limit

    c = Candidate(
        tp=p.n_gpus,
        ep=p.moe_ep if model.is_moe else 1,
        attn_dp=p.attn_dp,
        moe_runner="auto" if model.is_moe else None,
        kv_dtype="fp8_e4m3" if p.kv_bytes < 2 else "auto",
    )
    ctx = p.isl + p.osl if reserved else p.isl + p.osl / 2.0
    return limit(c, model, gpu, ctx, p.isl + p.osl, (p.dense_quant, p.moe_quant))


def prepare(p: ServingPoint, prefix_reuse: float = 0.0, gpu=None) -> Prepared:
    """Resolve profiles and compute the roofline of one point. Raises RowError when it cannot.
    ``gpu``: the GPU profile to use instead of ``p.gpu``'s (one with the user's ``--nic-gbps``)."""
    model = resolve_model(p.model)
    gpu = gpu if gpu is not None else resolve_gpu(p.gpu)
    if not p.dense_quant or not p.moe_quant:  # not stated: the model's shipped checkpoint
        dq, mq = model_quants(model)
        p = replace(p, dense_quant=p.dense_quant or dq, moe_quant=p.moe_quant or mq)
    ck_dense, ck_moe = model_quants(model)
    if ck_dense == "bf16" and ck_moe in FOUR_BIT and p.dense_quant in FOUR_BIT:
        # a 4-bit label on a checkpoint that quantizes only its experts (gpt-oss's MXFP4 and Kimi's
        # INT4 keep attention, shared experts and dense MLPs in bf16: modules_to_not_convert / ignore
        # of their config.json): the dense GEMMs that ran read bf16 weights
        p = replace(p, dense_quant="bf16")
    s = F.shapes_of(model)
    rates = F.Rates.of(gpu)
    ep = p.moe_ep if s.is_moe else 1
    if s.is_moe and s.experts % ep:
        raise RowError(f"moe_ep {ep} does not divide {s.experts} experts")
    try:
        dep = F.Deployment(p.n_gpus, p.attn_dp, ep, p.dense_quant, p.moe_quant, p.kv_bytes)
    except ValueError as exc:
        raise RowError(str(exc)) from exc
    if p.dense_quant not in F.WEIGHT_BYTES or p.moe_quant not in F.WEIGHT_BYTES:
        raise RowError(f"unknown quantization {p.dense_quant}/{p.moe_quant}")
    w = F.ClosedLoopLoad(p.isl, p.osl, p.concurrency, prefix_reuse)
    rf = F.roofline_serving(s, rates, dep, w)
    feats = F.feature_vector(s, rates, dep, w, rf, p.engine)
    x_tpot = np.array(
        [
            1000.0,
            s.layers * 10.0,
            rf["d_n_collectives"] * 10.0,
            rf["d_attn_kv"],
            rf["d_attn_proj"] + rf["d_dense_ffn"] + rf["d_lm_head"],
            rf["d_moe"] + rf["d_router"],
            rf["d_comm"],
            rf["interference_us"],
            rf["interference_alone_us"],
            s.moe_layers * 10.0,
            rf["d_moe_routed"],
        ]
    )
    x_ttft = np.array(
        [
            1000.0,
            s.layers * 10.0,
            rf["prefill_us"],
            rf["wait_us"],
            rf["step_us"],
            rf["p_n_collectives"] * 10.0,
        ]
    )
    limit = kv_limit(model, gpu, p)
    slots = admission(model, gpu, p, limit)
    admitted = prepare(replace(p, concurrency=slots), prefix_reuse, gpu) if slots < p.concurrency else None
    return Prepared(p, model.key, gpu.key, s, rates, dep, w, rf, feats, x_tpot, x_ttft, limit, admitted)


# engines whose closed loops wait for KV admission (``admission``), and whether an admitted request
# reserves its whole isl + osl (True) or holds its mean context (False)
ADMITS = {"sglang": False, "trtllm": True}


def admission(model, gpu, p: ServingPoint, limit: float) -> float:
    """Requests of ``p``'s closed loop the server holds at once: SGLang admits a request only when its
    KV fits the pool, so at most ``limit`` (``kv_limit``) of the ``p.concurrency`` clients' requests;
    ``p.concurrency`` where all fit, or where the engine's admission is not modelled (vLLM admits on
    the prompt's blocks and preempts when decode runs out: a queue at SGLang's limit measured worse,
    docs/advisor.md) or the weights alone do not fit (``limit`` < 1).
    TensorRT-LLM's default scheduler (GUARANTEED_NO_EVICT) admits a request only when the KV of its
    whole isl + osl is free and never evicts, so its requests are counted at isl + osl
    (``kv_limit(reserved=True)``), in the pool the same memory check gives (its own split of the
    memory, ``free_gpu_memory_fraction`` of what the weights leave, is not modelled apart).
    A point whose KV dtype is a guess (``kv_stated`` False: the CSV rows) is given the largest pool
    it could have run with, FP8's: the queue is then a lower bound (at bf16 the DeepSeek-R1 TP8 B200
    rows of 8192 / 1024 tokens at 256 requests would hold 129 and measured an 8.7 s TTFT, not the
    ~64 s a queue for the other 127 means; at FP8 they hold 258)."""
    if p.engine not in ADMITS:
        return p.concurrency
    reserved = ADMITS[p.engine]
    if reserved or not p.kv_stated:
        limit = kv_limit(model, gpu, p if p.kv_stated else replace(p, kv_bytes=1.0), reserved)
    return limit if 1.0 <= limit < p.concurrency else p.concurrency


def admission_wait_ms(clients: float, slots: float, ttft_ms, tpot_ms, osl: float):
    """Mean wait for admission of a closed loop of ``clients`` over ``slots`` (< clients) KV slots in
    steady state: each admitted request holds its slot ``S = TTFT + osl * TPOT`` (at ``slots`` in
    flight), so requests complete at ``slots / S`` and, by Little's law over the whole loop
    (``clients = slots / S * (wait + S)``), each waits ``(clients / slots - 1) * S``."""
    return (clients / slots - 1.0) * (ttft_ms + osl * tpot_ms)


def prepare_all(points: list[ServingPoint]) -> tuple[list[Prepared], list[tuple[str, str]]]:
    good, bad = [], []
    for p in points:
        try:
            good.append(prepare(p))
        except RowError as exc:
            bad.append((p.where, str(exc)))
    return good, bad


def dedupe(points: list[ServingPoint]) -> list[ServingPoint]:
    """Drop exact repeats (same configuration and same measurements; the CSV lists some twice)."""
    seen, out = set(), []
    for p in points:
        d = p.to_dict()
        d.pop("where")
        d.pop("row_id")
        key = json.dumps(d, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


@functools.lru_cache(maxsize=1)
def _controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _one_thread():
    """OpenMP in HistGradientBoosting oversubscribes small, busy machines (18 s vs 0.7 s measured on
    a loaded 2-core box for one fit); the data are small, one thread is fastest. The controller scans
    the loaded libraries once."""
    return _controller().limit(limits=1)


class TreeEnsemble:
    """A fitted ``HistGradientBoostingRegressor`` (one tree per iteration, numeric features) as plain
    arrays, evaluated with numpy to the bit of scikit-learn's ``predict``.

    Stored per node, the trees concatenated in order (``tree_size`` nodes each, child indices local
    to their tree): ``feature``, ``threshold``, ``nan_left`` (where a NaN goes), ``left``, ``right``,
    ``is_leaf``, ``value``; plus the ``baseline``. scikit-learn's rule, kept exactly: a row goes left
    at a split when ``x <= threshold`` in float64 (this estimator does not cast to float32, unlike
    the ``tree`` module's), or when x is NaN and ``nan_left``; the prediction is the baseline plus the
    trees' leaf values added one tree after another in float64 (a pairwise sum would differ in the
    last bits).

    Evaluation without walking the trees node by node: every split of every tree is compared at
    once; a leaf is reached when all splits on its path went its way, which one batched matrix
    product per tree finds (``_path`` holds +1 / -1 for the left / right turns on each leaf's path,
    ``_need`` the count of left turns; the product of the 0/1 comparisons with it equals the count
    exactly when no turn is missed), whatever the depth."""

    ARRAYS = ("feature", "threshold", "nan_left", "left", "right", "is_leaf", "value", "tree_size")

    def __init__(self, baseline: float, **arrays: np.ndarray) -> None:
        self.baseline = float(baseline)
        self.feature = np.asarray(arrays["feature"], dtype=np.int64)
        self.threshold = np.asarray(arrays["threshold"], dtype=np.float64)
        self.nan_left = np.asarray(arrays["nan_left"], dtype=bool)
        self.left = np.asarray(arrays["left"], dtype=np.int64)
        self.right = np.asarray(arrays["right"], dtype=np.int64)
        self.is_leaf = np.asarray(arrays["is_leaf"], dtype=bool)
        self.value = np.asarray(arrays["value"], dtype=np.float64)
        self.tree_size = np.asarray(arrays["tree_size"], dtype=np.int64)
        self._compile()

    @classmethod
    def from_sklearn(cls, est) -> TreeEnsemble:
        """The arrays of a fitted ``HistGradientBoostingRegressor`` (numeric features only)."""
        if est.n_trees_per_iteration_ != 1 or getattr(est, "_preprocessor", None) is not None:
            raise ValueError("only single-output regressors on numeric features convert")
        nodes = [pred.nodes for (pred,) in est._predictors]
        if not nodes or any(n["is_categorical"].any() for n in nodes):
            raise ValueError("only fitted estimators without categorical splits convert")
        cat = np.concatenate(nodes)
        return cls(
            float(np.asarray(est._baseline_prediction).reshape(-1)[0]),
            feature=cat["feature_idx"],
            threshold=cat["num_threshold"],
            nan_left=cat["missing_go_to_left"],
            left=cat["left"],
            right=cat["right"],
            is_leaf=cat["is_leaf"],
            value=cat["value"],
            tree_size=np.array([len(n) for n in nodes]),
        )

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k) for k in self.ARRAYS}

    def _compile(self) -> None:
        is_leaf, left, right = self.is_leaf.tolist(), self.left.tolist(), self.right.tolist()
        splits: list[tuple[int, int, int]] = []  # (tree, position among its splits, node)
        leaves: list[tuple[int, int, int]] = []  # (tree, position among its leaves, node)
        turns: list[tuple[int, int, int, float]] = []  # (tree, split position, leaf position, +1 | -1)
        need: list[float] = []  # left turns on each leaf's path, in ``leaves`` order
        start = 0
        for t, size in enumerate(self.tree_size.tolist()):
            n_split = n_leaf = 0
            stack = [(0, ())] if size else []
            while stack:
                node, path = stack.pop()
                g = start + node
                if is_leaf[g]:
                    leaves.append((t, n_leaf, g))
                    turns += [(t, k, n_leaf, turn) for k, turn in path]
                    need.append(float(sum(turn > 0 for _, turn in path)))
                    n_leaf += 1
                    continue
                splits.append((t, n_split, g))
                stack.append((right[g], (*path, (n_split, -1.0))))
                stack.append((left[g], (*path, (n_split, 1.0))))
                n_split += 1
            start += size
        n_t = len(self.tree_size)
        n_k = max([k for _, k, _ in splits] + [0]) + 1
        n_l = max([j for _, j, _ in leaves] + [0]) + 1
        self._feat = np.zeros((n_t, n_k), dtype=np.int64)
        self._thr = np.zeros((n_t, n_k))
        self._nan = np.zeros((n_t, n_k), dtype=bool)
        self._path = np.zeros((n_t, n_k, n_l))
        self._need = np.full((n_t, n_l), -1.0)  # padding leaves: never reached
        self._leaf_value = np.zeros((n_t, n_l))
        if splits:
            t, k, g = np.array(splits).T
            self._feat[t, k], self._thr[t, k], self._nan[t, k] = (
                self.feature[g],
                self.threshold[g],
                self.nan_left[g],
            )
        if leaves:
            t, j, g = np.array(leaves).T
            self._need[t, j], self._leaf_value[t, j] = need, self.value[g]
        if turns:
            t, k, j, turn = (np.array(c) for c in zip(*turns, strict=True))
            self._path[t, k, j] = turn

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        n = X.shape[0]
        acc = np.zeros((self._feat.shape[0] + 1, n))
        acc[0] += self.baseline
        if self._feat.shape[0] and n:
            x = X[:, self._feat]  # [N, T, K]
            go_left = (x <= self._thr) | (np.isnan(x) & self._nan)
            score = np.matmul(go_left.transpose(1, 0, 2).astype(np.float64), self._path)  # [T, N, L]
            leaf = (score == self._need[:, None, :]).argmax(axis=2)  # [T, N]
            acc[1:] = np.take_along_axis(self._leaf_value, leaf, axis=1)
        return np.cumsum(acc, axis=0)[-1]  # sequential, in tree order


def _nnls_rel(X: np.ndarray, y: np.ndarray, l1: bool = True) -> np.ndarray:
    """Non-negative θ minimising the relative error of ``X @ θ`` against ``y``: least squares, then
    (``l1``) iteratively reweighted toward least absolute relative error (weights 1/|r|, floored at
    1 % so exact fits do not dominate), which is what the median percentage error measures and which
    a few badly described rows cannot pull. Stops when θ moves less than 1e-4 relative, or after 30
    rounds."""
    from scipy.optimize import nnls

    A = X / y[:, None]
    theta, _ = nnls(A, np.ones(len(y)), maxiter=50 * X.shape[1])
    for _ in range(30 if l1 else 0):
        w = 1.0 / np.sqrt(np.maximum(np.abs(A @ theta - 1.0), 0.01))
        new, _ = nnls(A * w[:, None], w, maxiter=50 * X.shape[1])
        moved = np.abs(new - theta).sum() / max(np.abs(theta).sum(), 1e-12)
        theta = new
        if moved < 1e-4:
            break
    return theta


@dataclass
class ServingModel:
    """Fitted calibration; ``predict`` takes Prepared points."""

    theta: dict  # {"tpot"|"ttft": {engine|"*": list[float]}}
    gbm: dict  # {"tpot"|"ttft": TreeEnsemble|None}
    ranges: dict
    n_rows: int
    key: str
    settings: dict
    rows_by_engine: dict = field(default_factory=dict)
    left_out: list = field(default_factory=list)  # (where, reason) of training rows not used

    def _base(self, preps: list[Prepared], which: str) -> np.ndarray:
        X = np.array([pr.x_tpot if which == "tpot" else pr.x_ttft for pr in preps]).reshape(len(preps), -1)
        return _base_of(X, np.array([pr.point.engine for pr in preps]), self.theta[which])

    def predict(self, preps: list[Prepared]) -> dict[str, np.ndarray]:
        """{'tpot_ms', 'ttft_ms', 'tpot_base_ms', 'ttft_base_ms', 'admission_ms'} arrays for the
        points. A point whose server admits fewer requests than are sent (``Prepared.admitted``) is
        predicted at the admitted ones, its TTFT plus their wait for KV (``admission_wait_ms``,
        ``admission_ms``)."""
        res = self._predict_held(preps)
        res["admission_ms"] = np.zeros(len(preps))
        queued = [i for i, pr in enumerate(preps) if pr.admitted is not None]
        if not queued:
            return res
        held = self._predict_held([preps[i].admitted for i in queued])
        for j, i in enumerate(queued):
            p = preps[i].point
            wait = admission_wait_ms(
                p.concurrency,
                preps[i].admitted.point.concurrency,
                held["ttft_ms"][j],
                held["tpot_ms"][j],
                p.osl,
            )
            for k in ("tpot_ms", "tpot_base_ms", "ttft_ms", "ttft_base_ms"):
                res[k][i] = held[k][j] + (wait if k.startswith("ttft") else 0.0)
            res["admission_ms"][i] = wait
        return res

    def _predict_held(self, preps: list[Prepared]) -> dict[str, np.ndarray]:
        """``predict`` of the requests in flight, as if all were admitted. TTFT first: TPOT's prefill
        terms are scaled by the decoding fraction its TTFT implies (``decode_fraction``)."""
        res = {}
        for which in ("ttft", "tpot"):
            if which == "tpot":
                X = np.array([pr.x_tpot for pr in preps]).reshape(len(preps), -1)
                engines = np.array([pr.point.engine for pr in preps])
                osl = np.array([pr.point.osl for pr in preps], dtype=float)
                base = _tpot_base(X, engines, self.theta["tpot"], osl, res["ttft_ms"] * 1e3)
            else:
                base = self._base(preps, which)
            est = self.gbm.get(which)
            if est is not None and preps:
                Z = np.column_stack([np.array([p.feats for p in preps]), np.log(base)])
                clip = self.settings.get("residual_clip", 1.5)
                corr = np.clip(est.predict(Z), -clip, clip)
            else:
                corr = np.zeros(len(preps))
            res[f"{which}_base_ms"] = base / 1e3
            res[f"{which}_ms"] = base * np.exp(corr) / 1e3
        return res

    def ttft_split(self, preps: list[Prepared], pred: dict | None = None) -> dict[str, np.ndarray]:
        """TTFT as ``(overhead_ms + prefill_coef * roofline_prefill_ms) * correction`` plus queueing:
        the stage-1 terms other than prefill and queue wait form the overhead, ``prefill_coef`` is the
        prefill term's coefficient, ``correction`` the stage-2 factor. Lets a caller put its own
        queue (from a trace's arrivals) in place of the closed-loop one. All of it is latency: the
        GPU time a prefill occupies is ``prefill_occupancy``. ``pred``: ``predict(preps)`` when the
        caller has it already."""
        th = self.theta["ttft"]
        i_pf, i_wait = TTFT_TERMS.index("prefill"), TTFT_TERMS.index("wait")
        over, coef = np.empty(len(preps)), np.empty(len(preps))
        for i, pr in enumerate(preps):
            t = np.asarray(th.get(pr.point.engine, th["*"]), dtype=float)
            x = pr.x_ttft.copy()
            coef[i] = t[i_pf]
            x[i_pf] = x[i_wait] = 0.0
            over[i] = float(x @ t) / 1e3
        pred = self.predict(preps) if pred is None else pred
        corr = pred["ttft_ms"] / pred["ttft_base_ms"]
        return {"overhead_ms": over, "prefill_coef": coef, "correction": corr}

    def prefill_occupancy(self, engine: str) -> float:
        """GPU busy time of one prefill per unit of its roofline time (``roofline.prefill``), for
        ``engine``: what prefill capacity, utilisation and queueing need, as opposed to TTFT.

        Why not the TTFT fit: its prefill coefficient and correction are fitted to a latency. The
        measured TTFTs hold scheduling, tokenization and, above all, waiting behind the other prefills
        of the closed-loop benchmark (at concurrency C, up to C requests arrive together), which the
        fit can only attribute to the terms it has, mostly the prefill term: SGLang's is ~10x the
        roofline (its engine factor ~3.4x on the pooled ~2.8-3.5x). Read as GPU time, it made an 8 x H200
        replica of hy3 "prefill saturated" by three concurrent agentic requests (~1.3 s of GPU per
        3.7K-token prefill on a 27K-token prefix).

        What is used instead: the TPOT fit's two prefill-interference coefficients. TPOT there is
        the decode step plus ``interference`` (the roofline of the prefill work chunked into the steps)
        times θ_mixed plus ``interference_alone`` (the same prefills' own rooflines) times θ_alone;
        both are fitted on how much slower decode ran for the prefills that shared the GPU, which is
        GPU occupancy, not anyone's latency. Per prefill, occupancy = θ_mixed * marginal + θ_alone *
        roofline, and the marginal (mixed-in) roofline is at most the prefill's own (it shares the
        step's weight reads), so ``θ_alone + θ_mixed`` is used: an upper bound, conservative for a
        saturation check. The engine's θ includes its TPOT factor (a slower step occupies the GPU
        longer). Floored at 1: a prefill cannot take less than its roofline.

        Checked: stable across refits (θ_alone 1.28-1.65 pooled, 1.45-1.86 SGLang, θ_mixed
        0.05-0.15, over every held-out model and GPU fold of ``evaluate``); 1.71 for SGLang on the
        full data. Against kernels measured on one H200 (hy3 at TP8, prefill of 1,024 / 4,096 tokens:
        fused FP8 MoE 241 / 612 µs per layer from benchmarks/results/fused_moe_prefill.md, dense
        GEMMs at the measured cuBLAS fp8 1,410 of 1,979 TFLOP/s, attention FLOPs at the bf16 758 of
        989, collectives as the roofline) the same prefills take 1.87x / 2.23x their roofline: the
        calibrated figure is 9-23 % lower there (MoE-heavy prefills at TP8 run the experts' narrow
        192-column shards inefficiently), same order, where the TTFT coefficient is 5-6x higher."""
        th = self.theta["tpot"]
        t = th.get(engine, th["*"])
        occ = t[TPOT_TERMS.index("interference_alone")] + t[TPOT_TERMS.index("interference")]
        return max(float(occ), 1.0)

    def out_of_range(self, pr: Prepared) -> list[str]:
        """Human-readable notes for inputs outside the training data."""
        notes = []
        p = pr.point
        vals = {
            "isl": p.isl,
            "osl": p.osl,
            "concurrency": p.concurrency,
            "batch per attention group": pr.rf["batch"],
            "n_gpus": p.n_gpus,
            "memory bandwidth TB/s": pr.rates.bw / 1e6,
        }
        for name, v in vals.items():
            lo, hi = self.ranges.get(name, (None, None))
            if lo is not None and not (lo <= v <= hi):
                notes.append(f"{name} {v:g} outside training range [{lo:g}, {hi:g}]")
        if p.engine not in self.ranges.get("engines", []):
            notes.append(f"engine {p.engine!r} not in training data")
        if pr.model_key not in self.ranges.get("models", []):
            notes.append(f"model {pr.model_key} not in training data (architecture transfer)")
        if pr.gpu_key not in self.ranges.get("gpus", []):
            notes.append(f"GPU {pr.gpu_key} not in training data (roofline transfer)")
        return notes

    def summary(self) -> dict:
        return {
            "key": self.key,
            "n_rows": self.n_rows,
            "rows_by_engine": self.rows_by_engine,
            "theta": {
                which: {
                    eng: dict(zip(TPOT_TERMS if which == "tpot" else TTFT_TERMS, map(float, t), strict=True))
                    for eng, t in th.items()
                }
                for which, th in self.theta.items()
            },
            "ranges": self.ranges,
            "gbm": {k: (v is not None) for k, v in self.gbm.items()},
            "settings": self.settings,
        }

    # ----- stored form: plain arrays plus one JSON string, no pickle ------------------------------
    def _meta(self) -> dict:
        return {
            "format": STORED_FORMAT,
            "theta": self.theta,
            "gbm": {k: (None if v is None else v.baseline) for k, v in self.gbm.items()},
            "ranges": self.ranges,
            "n_rows": self.n_rows,
            "settings": self.settings,
            "rows_by_engine": self.rows_by_engine,
        }

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Everything the model is, as arrays (``from_arrays`` inverts it; ``content_key`` hashes all
        but the training rows left out, which are a note about the data, not part of the model, and
        the shipped file's ``training_hash``)."""
        out = {
            "meta": np.array(json.dumps(self._meta(), sort_keys=True)),
            "left_out": np.array(json.dumps([list(x) for x in self.left_out])),
        }
        for which, est in self.gbm.items():
            if est is not None:
                out.update({f"{which}.{k}": v for k, v in est.arrays().items()})
        return out

    @classmethod
    def from_arrays(cls, arrays) -> ServingModel:
        meta = json.loads(str(arrays["meta"][()]))
        if meta.get("format") != STORED_FORMAT:
            raise ValueError(f"stored serving model format {meta.get('format')!r}, expected {STORED_FORMAT}")
        gbm = {
            which: None
            if base is None
            else TreeEnsemble(base, **{k: arrays[f"{which}.{k}"] for k in TreeEnsemble.ARRAYS})
            for which, base in meta["gbm"].items()
        }
        ranges = {
            k: tuple(v) if k not in ("engines", "models", "gpus") else v for k, v in meta["ranges"].items()
        }
        model = cls(
            meta["theta"], gbm, ranges, meta["n_rows"], "", meta["settings"], meta["rows_by_engine"],
            [tuple(x) for x in json.loads(str(arrays["left_out"][()]))],
        )  # fmt: skip
        model.key = content_key(model.to_arrays())
        return model

    def save(self, path: Path, extra: dict[str, np.ndarray] | None = None) -> None:
        """Write ``to_arrays`` (and ``extra``) as a compressed .npz, atomically (a temp file renamed
        over ``path``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as fh:
            np.savez_compressed(fh, **self.to_arrays(), **(extra or {}))
        tmp.replace(path)


STORED_FORMAT = 1


def content_key(arrays: dict[str, np.ndarray]) -> str:
    """16 hex digits of a hash of a stored model's arrays: the same numbers give the same key, on any
    machine and whatever code computed them (the key a recommendation records)."""
    h = hashlib.sha256()
    for name in sorted(set(arrays) - {"left_out", "shipped"}):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}:".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def load(source) -> ServingModel:
    """A model written by ``ServingModel.save`` (a path or a binary file object). Raises ValueError
    (or OSError) when it cannot be read."""
    with np.load(source, allow_pickle=False) as z:
        return ServingModel.from_arrays({k: z[k] for k in z.files})


def _ranges(preps: list[Prepared]) -> dict:
    def rng(vals):
        return (float(min(vals)), float(max(vals)))

    return {
        "isl": rng([p.point.isl for p in preps]),
        "osl": rng([p.point.osl for p in preps]),
        "concurrency": rng([p.point.concurrency for p in preps]),
        "batch per attention group": rng([p.rf["batch"] for p in preps]),
        "n_gpus": rng([p.point.n_gpus for p in preps]),
        "memory bandwidth TB/s": rng([p.rates.bw / 1e6 for p in preps]),
        "engines": sorted({p.point.engine for p in preps}),
        "models": sorted({p.model_key for p in preps}),
        "gpus": sorted({p.gpu_key for p in preps}),
    }


def _stage1(X: np.ndarray, y: np.ndarray, engines: np.ndarray, settings: dict) -> dict:
    """θ per engine ('*' = pooled) fitted on the rows given (see the module docstring)."""
    l1 = settings.get("stage1_loss", "l1") == "l1"
    pooled = _nnls_rel(X, y, l1)
    th = {"*": pooled.tolist()}
    for eng in sorted(set(engines)):
        idx = engines == eng
        if idx.sum() < settings["min_engine_rows"]:
            continue
        if settings.get("stage1") == "per_engine":
            th[eng] = _nnls_rel(X[idx], y[idx], l1).tolist()
        else:  # pooled shape, one scale factor per engine
            factor = float(np.exp(np.median(np.log(y[idx] / np.maximum(X[idx] @ pooled, 1.0)))))
            th[eng] = (pooled * factor).tolist()
    return th


def _base_of(X: np.ndarray, engines: np.ndarray, th: dict) -> np.ndarray:
    """Stage-1 µs of rows ``X`` with each row's engine's θ ('*' for engines without their own)."""
    if not len(X):
        return np.empty(0)
    T = np.array([th.get(e, th["*"]) for e in engines], dtype=float)
    return np.maximum(np.einsum("ij,ij->i", X, T), 1.0)


def decode_fraction(osl: np.ndarray, tpot_us: np.ndarray, ttft_us: np.ndarray) -> np.ndarray:
    """Fraction of a closed-loop request's life spent decoding, ``osl * TPOT / (TTFT + osl * TPOT)``.

    The roofline's prefill interference charges every decode step with ``batch / osl`` prefills, as
    if all ``batch`` requests in flight were decoding. A request waiting for or running its prefill
    is not in the decode batch: the prefills that enter per decode step are the arrival rate
    ``batch / (TTFT + osl * TPOT)`` times the step, i.e. ``batch / osl`` times this fraction."""
    dec = np.maximum(osl, 1.0) * tpot_us
    return dec / np.maximum(dec + ttft_us, 1e-9)


# the decoding fraction's fixed point (``_tpot_base``): < 0.1 % after 4 rounds on the training rows
FRACTION_ITERATIONS = 8


def _tpot_base(
    X: np.ndarray, engines: np.ndarray, th: dict, osl: np.ndarray, ttft_us: np.ndarray
) -> np.ndarray:
    """Stage-1 TPOT µs with the prefill terms at the decoding fraction that this TPOT and the
    predicted TTFT give (``decode_fraction``): a fixed point, as TPOT enters the fraction. Stage 1 is
    linear, TPOT = A + f * B with B the prefill terms; f rises with T, so the iteration from
    f = 1 decreases monotonically to it."""
    if not len(X):
        return np.empty(0)
    T = np.array([th.get(e, th["*"]) for e in engines], dtype=float)
    part = X * T
    b = part[:, INTERFERENCE].sum(axis=1)
    a = part.sum(axis=1) - b
    f = np.ones(len(X))
    for _ in range(FRACTION_ITERATIONS):
        f = decode_fraction(osl, np.maximum(a + f * b, 1.0), ttft_us)
    return np.maximum(a + f * b, 1.0)


def _group_medians(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each row's group median of ``values``."""
    out = np.empty(len(values))
    for g in set(groups):
        idx = groups == g
        out[idx] = np.median(values[idx])
    return out


def fit(preps: list[Prepared], settings: dict | None = None) -> ServingModel:
    """Fit both stages on prepared points with measured TTFT and TPOT."""
    settings = dict(settings or SETTINGS)
    if len(preps) < 20:
        raise ValueError(f"need at least 20 measured rows to fit, got {len(preps)}")
    engines = np.array([p.point.engine for p in preps])
    models = np.array([p.model_key for p in preps])
    feats = np.array([p.feats for p in preps])
    theta: dict = {}
    gbm: dict = {}
    for which in ("tpot", "ttft"):
        X = np.array([p.x_tpot if which == "tpot" else p.x_ttft for p in preps])
        y = np.array([(p.point.tpot_ms if which == "tpot" else p.point.ttft_ms) * 1e3 for p in preps])
        theta[which] = _stage1(X, y, engines, settings)
        gbm[which] = None
        if not settings.get("use_gbm"):
            continue
        from sklearn.ensemble import HistGradientBoostingRegressor

        base = _base_of(X, engines, theta[which])
        Z = np.column_stack([feats, np.log(base)])
        target = np.log(y / base)
        if settings.get("gbm_target") == "within_model":
            # what is left of a model's offset cannot be learned for a model not seen: the correction
            # learns the shape within each model (batch, lengths, parallelism, GPU), not its level
            target = target - _group_medians(target, models)
        with _one_thread():
            est = HistGradientBoostingRegressor(**settings["gbm"]).fit(Z, target)
        gbm[which] = TreeEnsemble.from_sklearn(est)
    counts: dict = {}
    for e in sorted(engines):  # sorted: the order a stored model's JSON gives back
        counts[str(e)] = counts.get(str(e), 0) + 1
    model = ServingModel(theta, gbm, _ranges(preps), len(preps), "", settings, counts)
    model.key = content_key(model.to_arrays())
    return model


def _ape(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return np.abs(pred / meas - 1.0) * 100.0


GROUPINGS = ("model", "gpu", "engine_family")


def gpu_family(gpu_key: str) -> str:
    """Architecture family of a GPU profile from its compute capability (9.x hopper, 10.x blackwell)."""
    major = int(resolve_gpu(gpu_key).compute_capability[0])
    return {8: "ampere", 9: "hopper", 10: "blackwell", 12: "blackwell"}.get(major, f"sm{major}")


def group_key(pr: Prepared, kind: str) -> str:
    """The group a prepared point belongs to under a cross-validation grouping (``GROUPINGS``)."""
    if kind == "model":
        return pr.model_key
    if kind == "gpu":
        return pr.gpu_key
    if kind == "engine_family":
        return f"{pr.point.engine}@{gpu_family(pr.gpu_key)}"
    raise ValueError(f"unknown grouping {kind!r}; known: {GROUPINGS}")


def cv_predictions(preps: list[Prepared], kind: str, settings: dict | None = None) -> dict:
    """Held-out predictions for every point under one grouping: each group is predicted by a model
    fitted on the other groups only (nothing of the held-out group influences the fit).
    Returns {'groups': array of group keys, 'tpot_ms', 'ttft_ms', 'tpot_base_ms', 'ttft_base_ms':
    arrays aligned with ``preps`` (NaN where a group had too little training data left)}."""
    keys = np.array([group_key(p, kind) for p in preps])
    out = {"groups": keys}
    for k in ("tpot_ms", "ttft_ms", "tpot_base_ms", "ttft_base_ms"):
        out[k] = np.full(len(preps), np.nan)
    for g in sorted(set(keys)):
        idx = np.flatnonzero(keys == g)
        train = [p for p, k in zip(preps, keys, strict=True) if k != g]
        if len(train) < 20:
            continue
        pred = fit(train, settings).predict([preps[i] for i in idx])
        for k in ("tpot_ms", "ttft_ms", "tpot_base_ms", "ttft_base_ms"):
            out[k][idx] = pred[k]
    return out


def _score(row: dict, pred: dict, meas: dict, idx: np.ndarray) -> dict:
    for which in ("tpot", "ttft"):
        ape = _ape(pred[f"{which}_ms"][idx], meas[which][idx])
        ape0 = _ape(pred[f"{which}_base_ms"][idx], meas[which][idx])
        row[f"{which}_median_ape"] = float(np.median(ape))
        row[f"{which}_p90_ape"] = float(np.percentile(ape, 90))
        row[f"{which}_stage1_median_ape"] = float(np.median(ape0))
    return row


def evaluate(
    preps: list[Prepared], settings: dict | None = None, by: tuple[str, ...] = GROUPINGS
) -> list[dict]:
    """Grouped cross-validation: for each held-out model (each GPU, each engine x GPU family) fit on
    the rest and score the held-out rows. One dict per group plus an 'all' row per grouping (every
    held-out prediction pooled): median/p90 APE of TPOT and TTFT, and of stage 1 alone."""
    meas = {
        "tpot": np.array([p.point.tpot_ms for p in preps], dtype=float),
        "ttft": np.array([p.point.ttft_ms for p in preps], dtype=float),
    }
    out: list[dict] = []
    for kind in by:
        pred = cv_predictions(preps, kind, settings)
        done = np.isfinite(pred["tpot_ms"])
        for g in sorted(set(pred["groups"][done])):
            idx = np.flatnonzero(pred["groups"] == g)
            out.append(_score({"held_out": kind, "group": str(g), "n": len(idx)}, pred, meas, idx))
        if done.any():
            idx = np.flatnonzero(done)
            out.append(_score({"held_out": kind, "group": "all", "n": len(idx)}, pred, meas, idx))
    return out


# ----- training data and cache ---------------------------------------------------------------


def kb_points(
    kb_path: str | Path | None, exclude: frozenset = frozenset()
) -> tuple[list[ServingPoint], list[tuple[str, str]]]:
    """Measured serving runs imported into the knowledge base (none when the file does not exist),
    less the runs whose ids are in ``exclude``."""
    from hpc_advise.advisor.serving_data import point_from_run

    good, bad = [], []
    for run in _kb_serving_runs(kb_path, exclude):
        try:
            good.append(point_from_run(run))
        except (RowError, ValueError, TypeError) as exc:
            bad.append((f"kb:runs:{run.get('id')}", str(exc)))
    return good, bad


def training_points(
    kb_path: str | Path | None = None, csv_paths: tuple = (), exclude: frozenset = frozenset()
) -> tuple[list[ServingPoint], list[tuple[str, str]]]:
    """Seed CSV + extra CSVs + KB serving runs (less the ids in ``exclude``), deduplicated, with
    (where, reason) for rows left out."""
    from hpc_advise.advisor.serving_data import points_from_csv

    points, bad = points_from_csv(None, require_targets=True)
    for path in csv_paths:
        g, b = points_from_csv(path, require_targets=True)
        points += g
        bad += b
    g, b = kb_points(kb_path, exclude)
    return dedupe(points + g), bad + b


def _kb_serving_runs(kb_path: str | Path | None, exclude: frozenset = frozenset()) -> list[dict]:
    from hpc_advise.paths import kb_path as default_kb

    path = Path(kb_path) if kb_path else default_kb()
    if not path.exists():
        return []
    from hpc_advise.knowledge_base.store import KnowledgeBase

    return [r for r in KnowledgeBase(path).runs(kind="serving") if r.get("id") not in exclude]


def data_key(settings: dict, kb_runs: list[dict], csv_paths: tuple = ()) -> str:
    """Hash of everything a fit depends on, cheap to compute (no parsing): settings, library and
    code versions, the seed file's bytes, extra CSVs, the KB's serving runs, the shipped profiles."""
    from importlib.metadata import version

    h = hashlib.sha256()
    h.update(json.dumps(settings, sort_keys=True).encode())
    h.update(f"sklearn={version('scikit-learn')};v={MODEL_VERSION}".encode())
    here = Path(__file__).resolve().parent
    for name in ("roofline.py", "serving_model.py", "serving_data.py"):
        h.update((here / name).read_bytes())
    from importlib import resources

    from hpc_advise.advisor.serving_data import SEED_CSV

    h.update(resources.files("hpc_advise.advisor.data").joinpath(SEED_CSV).read_bytes())
    for path in csv_paths:
        h.update(Path(path).read_bytes())
    h.update(json.dumps(kb_runs, sort_keys=True, default=str).encode())
    prof = resources.files("hpc_advise.profiles")
    for sub in ("gpus", "models"):
        for entry in sorted(prof.joinpath(sub).iterdir(), key=lambda e: e.name):
            if entry.name.endswith((".toml", ".json")):
                h.update(entry.name.encode() + entry.read_bytes())
    return h.hexdigest()[:16]


def cache_path(key: str) -> Path:
    from hpc_advise.paths import cache_dir

    return cache_dir() / f"serving_model-{key}.npz"


SHIPPED_MODEL = "serving_model.npz"  # in hpc_advise.advisor.data: the fit of the shipped data alone


def training_hash(settings: dict) -> str:
    """What the shipped model was fitted from and how, as the shipped file records it: settings,
    model version, the seed file's bytes. A shipped model whose record differs is not used (a fit
    takes its place); the test that refits it also catches code that changes the fit."""
    from importlib import resources

    from hpc_advise.advisor.serving_data import SEED_CSV

    h = hashlib.sha256()
    h.update(json.dumps(settings, sort_keys=True).encode() + f";v={MODEL_VERSION};".encode())
    h.update(resources.files("hpc_advise.advisor.data").joinpath(SEED_CSV).read_bytes())
    return h.hexdigest()[:16]


def fit_shipped_data() -> ServingModel:
    """The fit of the shipped training data alone with ``SETTINGS`` (what ``SHIPPED_MODEL`` holds),
    its left-out rows noted."""
    from hpc_advise.advisor.serving_data import points_from_csv

    points, bad = points_from_csv(None, require_targets=True)
    preps, bad2 = prepare_all(dedupe(points))
    model = fit(preps, SETTINGS)
    model.left_out = bad + bad2
    return model


def write_shipped(model: ServingModel, path: Path) -> bool:
    """Write ``model`` as the shipped model at ``path`` unless the file holds it already (same
    content key); True when it wrote."""
    old = _read_shipped(Path(path).open("rb")) if Path(path).exists() else None
    if old is not None and old.key == model.key and old.left_out == model.left_out:
        return False
    model.save(path, {"shipped": np.array(json.dumps({"training": training_hash(model.settings)}))})
    return True


def _read_shipped(fh) -> ServingModel | None:
    """The shipped model from an open file, or None when it is unreadable or was fitted from other
    data or settings than today's (``training_hash``)."""
    try:
        with fh, np.load(fh, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        note = json.loads(str(arrays["shipped"][()]))
        if note.get("training") != training_hash(SETTINGS):
            return None
        return ServingModel.from_arrays(arrays)
    except (OSError, ValueError, KeyError):
        return None


def load_shipped() -> tuple[ServingModel | None, str]:
    """(the shipped model or None, where it lies)."""
    from importlib import resources

    entry = resources.files("hpc_advise.advisor.data").joinpath(SHIPPED_MODEL)
    try:
        fh = entry.open("rb")
    except OSError:
        return None, str(entry)
    return _read_shipped(fh), str(entry)


def load_or_fit(
    kb_path: str | Path | None = None,
    refit: bool = False,
    settings: dict | None = None,
    exclude_runs: frozenset = frozenset(),
) -> tuple[ServingModel, dict]:
    """The fitted model for the current training data: the shipped one when the knowledge base holds
    no serving runs (after ``exclude_runs``) and the settings are the defaults, else the per-home
    cache's when its data hash matches, else a fresh fit (cached). ``refit`` fits in any case.
    ``exclude_runs``: knowledge-base run ids kept out of the fit (``validate`` scores runs held out of
    it); the data key covers only the runs used, so excluding every KB run gives the KB-free fit.
    Returns (model, info) with info = {'cached': bool, 'shipped': bool, 'path', 'left_out': [(where, reason)]}."""
    settings = dict(settings or SETTINGS)
    exclude_runs = frozenset(exclude_runs)
    kb_runs = _kb_serving_runs(kb_path, exclude_runs)
    if not refit and not kb_runs and settings == SETTINGS:
        model, where = load_shipped()
        if model is not None:
            return model, {"cached": True, "shipped": True, "path": where, "left_out": model.left_out}
    key = data_key(settings, kb_runs)
    path = cache_path(key)
    if path.exists() and not refit:
        try:
            model = load(path)
            return model, {"cached": True, "shipped": False, "path": str(path), "left_out": model.left_out}
        except (OSError, ValueError, KeyError):  # unreadable cache: refit below
            pass
    points, bad = training_points(kb_path, exclude=exclude_runs)
    preps, bad2 = prepare_all(points)
    model = fit(preps, settings)
    model.left_out = bad + bad2
    try:
        model.save(path)
    except OSError:  # read-only data folder: the model serves uncached
        return model, {"cached": False, "shipped": False, "path": None, "left_out": model.left_out}
    return model, {"cached": False, "shipped": False, "path": str(path), "left_out": model.left_out}


def describe_row(row: dict) -> list:
    """A table row for ``evaluate`` output."""

    def f(x):
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, 1)

    return [
        row["held_out"],
        row["group"],
        row["n"],
        f(row["tpot_median_ape"]),
        f(row["tpot_p90_ape"]),
        f(row["ttft_median_ape"]),
        f(row["ttft_p90_ape"]),
        f(row["tpot_stage1_median_ape"]),
    ]


EVAL_HEADERS = [
    "held out",
    "group",
    "rows",
    "TPOT med %",
    "TPOT p90 %",
    "TTFT med %",
    "TTFT p90 %",
    "TPOT stage-1 med %",
]
