"""Per-deployment calibration on the user's own measured runs.

The serving model (``serving_model``) is fitted on thousands of rows pooled over models, GPUs and
engines; a team that has benched its own deployment knows better how far off the model is *there*.
This module groups the knowledge base's ``serving`` runs by deployment (engine x model x GPU x
configuration: TP, replicas, attention DP, EP, attention backend, MoE runner, KV dtype), compares each
run's measured mean TPOT and TTFT with the serving model's prediction for the run's own workload
(mean input / output length and concurrency), and keeps per deployment one factor per metric:

    factor = exp(median(log(measured / predicted)) * n / (n + SHRINK_RUNS))

i.e. the median log-ratio shrunk toward 1 as if ``SHRINK_RUNS`` runs had matched the model exactly:
one run moves a prediction a third of the way, nine runs 82 % of the way. ``recommend`` and
``predict`` multiply that deployment's mean TPOT and TTFT (the serving model's level; the batch and
backend shaping on top of it is unchanged) and say "calibrated on N runs"; every other deployment is
predicted exactly as without calibration.

Runs are left out, each with its reason, when they carry no model or GPU, are flagged partial by
``bench``, ran a mode the model does not describe (pipeline parallelism, speculative decoding), were
served by another engine than SGLang, do not state the attention backend, or cannot be predicted
(unknown profile, no fixed-length workload, no TTFT/TPOT).

``leave_one_out`` scores the correction on runs held out of it: each run of a deployment is predicted
with the factor fitted on the deployment's other runs. It scores whatever serving model the
observations were predicted with; ``validate`` predicts them with a fit that leaves all of the
deployment's runs out (``serving_model.load_or_fit(exclude_runs=...)``), so a scored run is held out of
both the base model and the factor.

The deployment's attention backend is the decode backend when the launch names one
(``--decode-attention-backend``, how ``launch`` starts ours), else ``--attention-backend``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hpc_advise.advisor.serving_data import RowError, point_from_run

SHRINK_RUNS = 2.0  # pseudo-runs at ratio 1 the median log-ratio is shrunk toward
METRICS = ("tpot", "ttft")


@dataclass(frozen=True)
class Deployment:
    """What a correction is keyed by: the configuration of one SGLang launch on one GPU type."""

    engine: str
    model: str  # model profile key
    gpu: str  # GPU profile key
    tp: int
    replicas: int
    attn_dp: int
    ep: int
    attention_backend: str
    moe_runner: str | None  # None for dense models
    kv_dtype: str

    def label(self) -> str:
        parts = [f"{self.replicas}x" if self.replicas > 1 else "", f"TP{self.tp}"]
        parts += [f"EP{self.ep}" if self.ep > 1 else "", f"attnDP{self.attn_dp}" if self.attn_dp > 1 else ""]
        parts += [f"attn={self.attention_backend}", f"moe={self.moe_runner}" if self.moe_runner else ""]
        parts.append(f"kv={self.kv_dtype}")
        return f"{self.model} on {self.gpu}: " + " ".join(p for p in parts if p)


@dataclass
class Correction:
    """One deployment's factors (measured / predicted, shrunk) and the runs they came from."""

    deployment: Deployment
    run_ids: list
    factor: dict  # {"tpot"|"ttft": float}
    median_ratio: dict  # the unshrunk median ratio per metric

    @property
    def n(self) -> int:
        return len(self.run_ids)

    def note(self) -> str:
        return (
            f"calibrated on {self.n} run{'s' if self.n != 1 else ''}: "
            f"TPOT x{self.factor['tpot']:.3f}, TTFT x{self.factor['ttft']:.3f}"
        )

    def to_dict(self) -> dict:
        return {"deployment": self.deployment.label(), "runs": self.run_ids, "factor": self.factor,
                "median_ratio": self.median_ratio}  # fmt: skip


@dataclass
class Observation:
    """A usable run: its deployment, measured and predicted mean TPOT / TTFT (ms)."""

    run_id: int
    deployment: Deployment
    measured: dict
    predicted: dict


@dataclass
class Calibration:
    """Corrections per deployment, the runs they use and the runs left out with their reasons."""

    corrections: dict = field(default_factory=dict)  # Deployment -> Correction
    observations: list = field(default_factory=list)
    dropped: list = field(default_factory=list)  # (where, reason)

    def __bool__(self) -> bool:
        return bool(self.corrections)

    def lookup(self, model_key: str, gpu_key: str, cand, engine: str = "sglang") -> Correction | None:
        """The correction of a ``candidates.Candidate`` of that model on that GPU, if its deployment
        was measured."""
        if not self.corrections:
            return None
        return self.corrections.get(deployment_of_candidate(model_key, gpu_key, cand, engine))


def deployment_of_candidate(model_key: str, gpu_key: str, c, engine: str = "sglang") -> Deployment:
    return Deployment(engine, model_key, gpu_key, c.tp, c.replicas, c.attn_dp, c.ep, c.attention_backend,
                      c.moe_runner, _kv(c.kv_dtype))  # fmt: skip


def _kv(value) -> str:
    v = str(value or "auto").lower()
    return "auto" if v in ("auto", "bf16", "bfloat16", "float16", "fp16") else v


def _int(cfg: dict, *names, default: int = 1) -> int:
    for n in names:
        if cfg.get(n) not in (None, ""):
            return int(cfg[n])
    return default


def deployment_of_run(run: dict) -> Deployment:
    """The deployment a ``serving`` run measured; RowError with the reason a run cannot be used."""
    from hpc_advise.advisor.serving_model import resolve_gpu, resolve_model

    cfg = run.get("config") or {}
    where = f"kb:runs:{run.get('id')}"
    model_name = cfg.get("model") or cfg.get("model_path") or cfg.get("served_model_name")
    if not model_name:
        raise RowError(f"{where}: no model (import with `runs import --model NAME`)")
    gpu_name = run.get("gpu") or cfg.get("gpu")
    if not gpu_name:
        raise RowError(f"{where}: no GPU (import with `runs import --gpu NAME`)")
    if cfg.get("partial"):
        why = "; ".join(cfg.get("partial_reasons") or []) or "flagged partial"
        raise RowError(f"{where}: partial run ({why})")
    engine = str(run.get("subject") or cfg.get("engine") or "sglang").lower()
    if engine != "sglang":
        raise RowError(f"{where}: engine {engine}: recommend and predict model SGLang deployments")
    if _int(cfg, "pp_size") != 1:
        raise RowError(f"{where}: unsupported mode: pipeline parallelism (pp_size {cfg['pp_size']})")
    if cfg.get("speculative_algorithm"):
        raise RowError(f"{where}: unsupported mode: speculative decoding ({cfg['speculative_algorithm']})")
    backend = cfg.get("decode_attention_backend") or cfg.get("attention_backend")
    if not backend:
        raise RowError(f"{where}: the launch arguments do not state the attention backend")
    model = resolve_model(str(model_name))
    gpu = resolve_gpu(str(gpu_name))
    tp = _int(cfg, "tp_size", "tp")
    dp = _int(cfg, "dp_size")
    dp_attn = bool(cfg.get("enable_dp_attention"))
    attn_dp = _int(cfg, "attn_dp_size", default=dp if dp_attn else 1)
    replicas = 1 if dp_attn else dp
    ep = _int(cfg, "ep_size", "ep") if model.is_moe else 1
    moe = str(cfg.get("moe_runner_backend") or "auto") if model.is_moe else None
    return Deployment(engine, model.key, gpu.key, tp, replicas, attn_dp, ep, str(backend), moe,
                      _kv(cfg.get("kv_cache_dtype")))  # fmt: skip


def observe(runs: list[dict], serving) -> tuple[list[Observation], list[tuple[str, str]]]:
    """Usable runs with the serving model's prediction for each, and (where, reason) for the rest."""
    from hpc_advise.advisor.serving_model import prepare

    obs, dropped, preps = [], [], []
    for run in runs:
        where = f"kb:runs:{run.get('id')}"
        try:
            dep = deployment_of_run(run)
            point = point_from_run(run)
            prep = prepare(point)
        except (RowError, ValueError, TypeError) as exc:
            msg = str(exc)
            dropped.append((where, msg[len(where) + 2 :] if msg.startswith(where + ": ") else msg))
            continue
        meas = {"tpot": point.tpot_ms, "ttft": point.ttft_ms}
        if not all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in meas.values()):
            dropped.append((where, "measured TTFT/TPOT not positive"))
            continue
        obs.append(Observation(int(run["id"]), dep, meas, {}))
        preps.append(prep)
    if preps:
        pred = serving.predict(preps)
        for i, o in enumerate(obs):
            o.predicted = {m: float(pred[f"{m}_ms"][i]) for m in METRICS}
    return obs, dropped


def correction(dep: Deployment, obs: list[Observation]) -> Correction:
    """The shrunk median-log-ratio factors of one deployment's observations."""
    n = len(obs)
    factor, ratio = {}, {}
    for m in METRICS:
        logs = np.log([o.measured[m] / o.predicted[m] for o in obs])
        med = float(np.median(logs))
        ratio[m] = math.exp(med)
        factor[m] = math.exp(med * n / (n + SHRINK_RUNS))
    return Correction(dep, [o.run_id for o in obs], factor, ratio)


def by_deployment(obs: list[Observation]) -> dict:
    groups: dict = {}
    for o in obs:
        groups.setdefault(o.deployment, []).append(o)
    return groups


def calibrate(runs: list[dict], serving) -> Calibration:
    """Corrections of every measured deployment among ``runs`` (the KB's ``serving`` runs)."""
    obs, dropped = observe(runs, serving)
    groups = by_deployment(obs)
    return Calibration({d: correction(d, g) for d, g in groups.items()}, obs, dropped)


def from_kb(db, serving) -> Calibration:
    """``calibrate`` over the knowledge base's serving runs (an empty Calibration without a KB file)."""
    from pathlib import Path

    from hpc_advise.paths import kb_path

    path = Path(db) if db else kb_path()
    if not path.exists():
        return Calibration()
    from hpc_advise.knowledge_base.store import KnowledgeBase

    with KnowledgeBase(path) as kb:
        runs = kb.runs(kind="serving")
    return calibrate(runs, serving)


def leave_one_out(obs: list[Observation]) -> dict:
    """Relative errors (predicted - measured) / measured per metric of each observation, before
    calibration and after it with the factor fitted on the same deployment's other runs only.
    Returns {"runs": [{"run_id", "n_fit", "tpot": {"before", "after"}, "ttft": {...}}],
    "tpot"|"ttft": {"median_abs_before", "median_abs_after"}}."""
    rows = []
    for i, o in enumerate(obs):
        others = [x for j, x in enumerate(obs) if j != i]
        f = correction(o.deployment, others).factor if others else dict.fromkeys(METRICS, 1.0)
        row = {"run_id": o.run_id, "n_fit": len(others)}
        for m in METRICS:
            before = o.predicted[m] / o.measured[m] - 1.0
            after = o.predicted[m] * f[m] / o.measured[m] - 1.0
            row[m] = {"predicted": o.predicted[m], "calibrated": o.predicted[m] * f[m],
                      "measured": o.measured[m], "before": before, "after": after}  # fmt: skip
        rows.append(row)
    out: dict = {"runs": rows}
    for m in METRICS:
        out[m] = {
            "median_abs_before": float(np.median([abs(r[m]["before"]) for r in rows])) if rows else None,
            "median_abs_after": float(np.median([abs(r[m]["after"]) for r in rows])) if rows else None,
        }
    return out


def apply(corr: Correction | None, pred: tuple) -> tuple:
    """A ``Ranker.serving_predictions`` value with the deployment's factors applied: mean TPOT and
    TTFT, and the TTFT split's correction (so the per-prompt TTFTs scale with the mean)."""
    if corr is None:
        return pred
    tpot, ttft, prep, (over, coef, c, occ) = pred
    ft, fT = corr.factor["tpot"], corr.factor["ttft"]
    return tpot * ft, ttft * fT, prep, (over, coef, c * fT, occ)
