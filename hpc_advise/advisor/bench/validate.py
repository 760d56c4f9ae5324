"""``validate``: a recommendation's predictions beside what ``bench`` measured for it.

The prediction is the recommendation's top-ranked configuration as ``recommend`` stored it
(``outputs.top``: TTFT and TPOT p50/p99, output tokens/s per GPU, mean request latency); the
measurement is a bench run stored with that recommendation id (the newest, or the one named). Per
metric: predicted, measured, the relative error (predicted - measured) / measured, and, when the error
is past the threshold, the modelled term the miss points at:

- TTFT p50: the prefill step cost (prefill FLOPs/bytes in the roofline, the prefill attention model);
- TTFT p99 (p50 within the threshold): queueing: the arrival burstiness and the prefill capacity the
  simulator assumed (chunked-prefill budget, admission);
- TPOT p50: the decode step cost (weight + KV bytes per step, the decode attention and MoE kernel models,
  communication per layer);
- TPOT p99 (p50 within): the batch composition: context-length spread and prefill chunks mixed into
  decode steps;
- output throughput per GPU: the concurrency the replica reached (KV-pool capacity, admission), given the
  step costs above;
- request latency: TTFT + output length x TPOT; see those rows.

Calibration (``calibration_check``): the run's deployment (model x GPU x configuration) is looked up
among the knowledge base's runs, and each of that deployment's usable runs is predicted before and
after the per-deployment correction (``advisor.calibration``), per metric (mean TPOT, mean TTFT). Both
fits hold the scored run out: the serving model underneath is refitted without any of the
deployment's runs (the cached fit has every knowledge-base run among its rows), and the correction is
fitted on the deployment's *other* runs (leave-one-out). So "before" is what a user with none of these
runs would have been told, and "after" what the correction learnt from the rest adds.
"""

from __future__ import annotations

import math

THRESHOLD = 0.15

TERMS = {
    "ttft_p50": "prefill step cost (roofline prefill FLOPs/bytes, prefill attention model)",
    "ttft_p99": "queueing (arrival burstiness, prefill capacity: chunked-prefill budget, admission)",
    "tpot_p50": "decode step cost (weight + KV bytes per step, decode attention / MoE kernel models, comm)",
    "tpot_p99": "batch composition (context spread, prefill chunks mixed into decode steps)",
    "output_tok_s_per_gpu": "concurrency reached (KV-pool capacity, admission) given the step costs",
    "request_latency_ms": "TTFT + osl x TPOT: see those rows",
}


class ValidateError(ValueError):
    """Nothing to validate (no such recommendation or run, or no prediction stored): one line."""


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def find_run(kb, recommendation_id: int | None = None, run_id: int | None = None) -> dict:
    """The bench run to validate: ``run_id``, else the newest run stored for ``recommendation_id``."""
    if run_id is not None:
        try:
            return kb.run(run_id)
        except KeyError:
            raise ValidateError(f"no run with id {run_id}") from None
    runs = [
        r
        for r in kb.runs(kind="serving")
        if (r.get("config") or {}).get("recommendation_id") == recommendation_id
    ]
    if not runs:
        raise ValidateError(
            f"no bench run for recommendation {recommendation_id}: run "
            f"`hpc-advise bench --url URL --trace FILE --recommendation {recommendation_id}` first"
        )
    return runs[-1]


def compare(recommendation: dict, run: dict, threshold: float = THRESHOLD) -> dict:
    """Predicted vs measured rows for one recommendation and one bench run."""
    top = (recommendation.get("outputs") or {}).get("top")
    if not top:
        raise ValidateError(f"recommendation {recommendation.get('id')} stored no ranked configuration")
    inputs = recommendation.get("inputs") or {}
    m = run.get("metrics") or {}
    n_gpus = (top.get("candidate") or {}).get("tp", 1) * (top.get("candidate") or {}).get("replicas", 1)
    n_gpus = n_gpus or inputs.get("gpus") or 1
    pairs = [
        ("ttft_p50", "TTFT p50 [ms]", (top.get("ttft_ms") or {}).get("p50"), m.get("median_ttft_ms")),
        ("ttft_p99", "TTFT p99 [ms]", (top.get("ttft_ms") or {}).get("p99"), m.get("p99_ttft_ms")),
        ("tpot_p50", "TPOT p50 [ms]", (top.get("tpot_ms") or {}).get("p50"), m.get("median_tpot_ms")),
        ("tpot_p99", "TPOT p99 [ms]", (top.get("tpot_ms") or {}).get("p99"), m.get("p99_tpot_ms")),
        ("output_tok_s_per_gpu", "output tok/s per GPU", top.get("output_tok_s_per_gpu"),
         None if m.get("output_throughput") is None else m["output_throughput"] / n_gpus),
        ("request_latency_ms", "request latency mean [ms]", top.get("request_latency_ms"), m.get("mean_e2e_latency_ms")),
    ]  # fmt: skip
    rows = []
    errors = {}
    for key, label, pred, meas in pairs:
        pred, meas = _num(pred), _num(meas)
        err = (pred - meas) / meas if pred is not None and meas else None
        errors[key] = err
        rows.append({"metric": key, "label": label, "predicted": pred, "measured": meas, "error": err,
                     "ci": _ci(m, key), "points_at": None})  # fmt: skip
    for row in rows:
        err = row["error"]
        if err is None or abs(err) <= threshold:
            continue
        key = row["metric"]
        base = key.replace("p99", "p50")
        if key.endswith("p99") and errors.get(base) is not None and abs(errors[base]) > threshold:
            row["points_at"] = f"the p50 miss ({TERMS[base]})"
        else:
            row["points_at"] = TERMS[key]
    cfg = run.get("config") or {}
    return {
        "recommendation_id": recommendation.get("id"),
        "run_id": run.get("id"),
        "configuration": top.get("config"),
        "threshold": threshold,
        "partial": bool(cfg.get("partial")),
        "rows": rows,
        "notes": _notes(recommendation, run, cfg),
    }


def calibration_check(runs: list[dict], run: dict, load_serving) -> dict:
    """Leave-one-out errors before / after calibration over ``run``'s deployment among ``runs``.

    ``load_serving(exclude)`` returns the serving model fitted without the knowledge-base runs whose
    ids are in ``exclude`` (every run of the deployment); it is called only when the run's deployment
    can be calibrated at all. Returns {"deployment": label or None, "reason": why not (or None),
    "n_runs", "held_out_of_base": sorted run ids, "metrics": [{"metric", "label", "median_abs_before",
    "median_abs_after", "run_before", "run_after"}], "runs": per-run rows, "dropped": [(where, reason)]
    of that deployment's runs}."""
    from hpc_advise.advisor import calibration as cal
    from hpc_advise.advisor.serving_data import RowError

    try:
        dep = cal.deployment_of_run(run)
    except (RowError, ValueError, TypeError) as exc:
        return {"deployment": None, "reason": str(exc), "n_runs": 0, "held_out_of_base": [], "metrics": [],
                "runs": [], "dropped": []}  # fmt: skip
    same = []
    for r in runs:
        try:
            if cal.deployment_of_run(r) == dep:
                same.append(r)
        except (RowError, ValueError, TypeError):
            continue
    held_out = sorted(int(r["id"]) for r in same if r.get("id") is not None)
    obs, dropped = cal.observe(same, load_serving(frozenset(held_out)))
    out = {"deployment": dep.label(), "reason": None, "n_runs": len(obs), "held_out_of_base": held_out,
           "metrics": [], "runs": [], "dropped": dropped}  # fmt: skip
    if not obs:
        out["reason"] = "; ".join(f"{w}: {why}" for w, why in dropped) or "no usable run"
        return out
    loo = cal.leave_one_out(obs)
    mine = next((r for r in loo["runs"] if r["run_id"] == run.get("id")), None)
    for m, label in (("tpot", "TPOT mean [ms]"), ("ttft", "TTFT mean [ms]")):
        out["metrics"].append({
            "metric": m, "label": label,
            "median_abs_before": loo[m]["median_abs_before"], "median_abs_after": loo[m]["median_abs_after"],
            "run_before": mine[m]["before"] if mine else None, "run_after": mine[m]["after"] if mine else None,
        })  # fmt: skip
    out["runs"] = loo["runs"]
    return out


def _ci(m: dict, key: str):
    name = {"ttft_p50": "median_ttft_ms", "ttft_p99": "p99_ttft_ms", "tpot_p50": "median_tpot_ms",
            "tpot_p99": "p99_tpot_ms"}.get(key)  # fmt: skip
    if name and f"{name}_ci_low" in m:
        return (m[f"{name}_ci_low"], m[f"{name}_ci_high"])
    return None


def _notes(rec: dict, run: dict, cfg: dict) -> list[str]:
    notes = []
    if cfg.get("partial"):
        notes.append(f"the run is partial: {'; '.join(cfg.get('partial_reasons') or [])}")
    want = (rec.get("inputs") or {}).get("trace")
    if want and cfg.get("trace") and str(want) != str(cfg.get("trace")):
        notes.append(f"predicted for trace {want}, measured on {cfg['trace']}")
    if cfg.get("rate_scale") not in (None, 1, 1.0):
        notes.append(
            f"measured at rate scale {cfg['rate_scale']}; the prediction is for the trace's own rate"
        )
    if cfg.get("max_concurrency") is not None and (rec.get("inputs") or {}).get("concurrency") is None:
        notes.append("measured in a closed loop; the prediction is for the trace's arrivals")
    if cfg.get("prompt_lengths") == "approximate":
        notes.append("prompt lengths were approximate (no tokenizer); measured lengths come from the server")
    return notes
