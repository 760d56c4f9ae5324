"""Where a bench run goes: one SGLang ``bench_serving`` JSONL record per server, and the same record as
a knowledge-base ``runs`` row.

The record uses ``bench_serving``'s field names (``duration``, ``completed``, ``*_throughput``,
``mean|median|std|p90|p99_{ttft,tpot,e2e_latency}_ms``, ``mean|median|std|p95|p99|max_itl_ms``,
``concurrency``, ``request_goodput``, ``server_info``, ``input_lens``/``output_lens``/``ttfts`` and, with
details, ``itls``/``errors``), plus one ``hpc_advise`` object bench_serving does not write (intervals,
failures by cause, the partial flag, the trace, the recommendation id); ``runs import`` ignores it.

The row is made by the importer itself (``knowledge_base.importers.to_row``) from that record, so a
run stored by ``bench`` and the same line read back by ``runs import`` are one row (same fingerprint).
``bench`` then adds to the row's JSON columns only, never new columns: ``config`` gets the bench
settings (``trace``, ``rate_scale``, ``recommendation_id``, ``url``, ``prompt_lengths``, ``partial`` and
``partial_reasons``, ``failures``), ``metrics`` the interval bounds (``median_ttft_ms_ci_low`` ...),
``failed_<cause>`` counts and the GPU samples.
"""

from __future__ import annotations

import math
from pathlib import Path

import orjson

from hpc_advise import __version__

FAMILIES = (("ttft_ms", "ttft", ("mean", "median", "std", "p90", "p99")),
            ("tpot_ms", "tpot", ("mean", "median", "std", "p90", "p99")),
            ("e2e_ms", "e2e_latency", ("mean", "median", "std", "p90", "p99")),
            ("itl_ms", "itl", ("mean", "median", "std", "p95", "p99", "max")))  # fmt: skip


def _finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def backend_name(engine: str) -> str:
    """bench_serving's ``--backend`` for an OpenAI completions client of that engine."""
    return {"sglang": "sglang-oai", "vllm": "vllm"}.get(engine, "openai")


def bench_record(summary: dict, outcome, *, label: str | None, plan, concurrency: int | None,
                 rate_scale: float, extras: dict, details: bool = False) -> dict:  # fmt: skip
    """The bench_serving-format record of one server's results."""
    facts = outcome.facts
    info = dict(facts.server_info)
    info["served_model_name"] = facts.model  # /v1/models id, or --model
    rec: dict = {
        "tag": label,
        "backend": backend_name(facts.engine),
        "dataset_name": "mooncake" if plan.fmt == "mooncake" else f"trace-{plan.fmt}",
        "request_rate": "inf" if concurrency is not None else "trace",
        "max_concurrency": concurrency,
        "server_info": info,
        "duration": summary["duration_s"],
        "completed": summary["completed"],
        "total_input_tokens": summary["total_input_tokens"],
        "total_output_tokens": summary["total_output_tokens"],
        "request_throughput": summary["request_throughput"],
        "input_throughput": summary["input_throughput"],
        "output_throughput": summary["output_throughput"],
        "total_throughput": summary["total_throughput"],
        "concurrency": summary["concurrency"],
    }
    for key, name, stats in FAMILIES:
        fam = summary.get(key) or {}
        for st in stats:
            rec[f"{st}_{name}_ms"] = _finite(fam.get(st))
    if "request_goodput" in summary:
        rec["request_goodput"] = summary["request_goodput"]
    ok = [r for r in outcome.results if r.ok]
    rec["input_lens"] = [r.n_in for r in ok]
    rec["output_lens"] = [r.n_out for r in ok]
    rec["ttfts"] = [r.ttft for r in ok]
    if details:
        rec["itls"] = [list(r.itl) for r in ok]
        rec["errors"] = [r.error or "" for r in outcome.results]
    rec["hpc_advise"] = dict(
        extras,
        version=__version__,
        rate_scale=rate_scale,
        failures=summary["failures"],
        skipped_too_long=summary["skipped_too_long"],
        intervals={
            f"{st}_{name}_ms": (summary.get(key) or {}).get(f"{st}_ci")
            for key, name, _ in FAMILIES
            for st in ("median", "p90", "p99")
            if (summary.get(key) or {}).get(f"{st}_ci")
        },  # fmt: skip
    )
    return rec


def append_jsonl(path: Path, record: dict) -> int:
    """Append one record; returns its line number."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = 0
    if path.exists():
        with open(path, "rb") as fh:
            lines = sum(1 for _ in fh)
    with open(path, "ab") as fh:
        fh.write(orjson.dumps(record) + b"\n")
    return lines + 1


def kb_row(record: dict, summary: dict, *, path: Path, lineno: int, gpu: str | None, command: str | None,
           config: dict, gpu_samples: dict | None) -> dict:  # fmt: skip
    """The ``runs`` row of a record, with bench's settings in ``config`` and its extra figures in ``metrics``."""
    from hpc_advise.knowledge_base.importers import to_row
    from hpc_advise.knowledge_base.store import now_iso

    # to_row fingerprints the record as JSON; orjson round trip makes its floats JSON-exact
    record = orjson.loads(orjson.dumps(record))
    row = to_row(record, path=path, lineno=lineno, mtime=now_iso(), gpu=gpu)
    row["config"].update({k: v for k, v in config.items() if v is not None})
    row["config"]["failures"] = summary["failures"]
    metrics = row["metrics"]
    for key, name, _ in FAMILIES:
        fam = summary.get(key) or {}
        for st in ("median", "p90", "p99"):
            ci = fam.get(f"{st}_ci")
            if ci and all(_finite(x) is not None for x in ci):
                metrics[f"{st}_{name}_ms_ci_low"], metrics[f"{st}_{name}_ms_ci_high"] = ci
    if summary.get("output_throughput_ci"):
        metrics["output_throughput_ci_low"], metrics["output_throughput_ci_high"] = summary[
            "output_throughput_ci"
        ]
    metrics["requests"] = summary["requests"]
    metrics["skipped_too_long"] = summary["skipped_too_long"]
    for cause, n in summary["failures"].items():
        metrics[f"failed_{cause}"] = n
    for key in ("good_requests", "goodput_fraction"):
        if key in summary:
            metrics[key] = summary[key]
    for key, value in (gpu_samples or {}).items():
        if isinstance(value, (int, float)) and key != "gpus":
            metrics[key] = value
    if command and not row.get("command"):
        row["command"] = command
    versions = dict(row.get("versions") or {})
    versions["hpc_advise"] = __version__
    row["versions"] = versions
    if row["p50"] is None or not math.isfinite(row["p50"]):
        row["p20"] = row["p50"] = row["p80"] = 0.0
    return row
