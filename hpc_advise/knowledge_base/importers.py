"""Read serving-benchmark results into ``runs`` rows: SGLang ``bench_serving`` and vLLM ``bench serve``.

Formats (field names checked against the tools' sources, SGLang ``python/sglang/bench_serving.py``
and vLLM ``vllm/benchmarks/serve.py``):

- SGLang ``python -m sglang.bench_serving --output-file F.jsonl`` appends one JSON object per run:
  backend, dataset_name, request_rate, max_concurrency, random_input_len/random_output_len, tag,
  server_info (the server's ``/get_server_info``: its launch arguments and version), duration,
  completed, token totals, request/input/output/total throughput, mean/median/std/p99 TTFT and
  TPOT, mean/median/std/p95/p99 ITL, mean/median/std/p90/p99 E2E latency, concurrency,
  accept_length, and with ``--output-details`` the per-request input_lens/output_lens/ttfts/itls.
- vLLM ``vllm bench serve --save-result`` writes one JSON object (``--append-result``: one per
  line): date, backend, label, model_id, tokenizer_id, num_prompts, request_rate ("inf" or a
  number), burstiness, max_concurrency, duration, completed, failed, token totals,
  request/output/total-token throughput, and mean/median/std/pNN for ttft/tpot/itl/e2el in ms.

Each record becomes one ``kind='serving'`` row: subject = engine, provider = the run's tag/label
(else the client backend), metric = output throughput (tok/s) in p20/p50/p80, every other figure in
``metrics`` under SGLang's names for both tools (``median_ttft_ms``, ``p99_tpot_ms``,
``p90_e2e_latency_ms``, ``total_throughput``, …; vLLM's ``*_e2el_ms`` and ``total_token_throughput``
are renamed), the workload and the server settings (``tp_size``, ``attention_backend``, …) flat in
``config``, and for SGLang the launch command rebuilt from server_info. Files are parsed completely before anything is written; every bad record is reported
as ``FILE:LINE: reason`` (``ImportFailed``) and the caller writes nothing.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

SGLANG = "sglang.bench_serving"
VLLM = "vllm bench serve"

# metrics keep SGLang bench_serving's names; vLLM's differing names are renamed on import
_THROUGHPUTS = ("output_throughput", "request_throughput", "input_throughput", "total_throughput",
                "request_goodput", "max_output_tokens_per_s")  # fmt: skip
_COUNTS = ("concurrency", "max_concurrent_requests", "accept_length", "completed", "failed", "duration",
           "total_input_tokens", "total_output_tokens")  # fmt: skip
_VLLM_NAMES = {"total_token_throughput": "total_throughput"}
# latency families (SGLang name, vLLM name); keys look like median_<name>_ms, p99_<name>_ms
_LATENCIES = (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e_latency", "e2el"))
_STAT_ORDER = {"mean": 0, "median": 1, "std": 2, "max": 1e9}

_REQUIRED = {
    SGLANG: ["duration", "completed", "request_throughput", "output_throughput",
             "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2e_latency_ms"],
    VLLM: ["duration", "completed", "request_throughput", "output_throughput"],
}  # fmt: skip

# server_info fields that shape performance, kept in config and in the rebuilt launch command
_SERVER_ARGS = (
    "model_path", "served_model_name", "tp_size", "dp_size", "ep_size", "pp_size",
    "enable_dp_attention", "attention_backend", "prefill_attention_backend",
    "decode_attention_backend", "moe_runner_backend", "moe_a2a_backend", "page_size",
    "kv_cache_dtype", "quantization", "dtype", "mem_fraction_static", "chunked_prefill_size",
    "max_running_requests", "max_total_tokens", "cuda_graph_max_bs", "disable_cuda_graph",
    "disable_radix_cache", "schedule_policy", "speculative_algorithm", "enable_mixed_chunk",
)  # fmt: skip
_WORKLOAD = ("dataset_name", "num_prompts", "request_rate", "burstiness", "max_concurrency",
             "random_input_len", "random_output_len", "random_range_ratio", "sharegpt_output_len")  # fmt: skip


class ImportFailed(ValueError):
    """One or more records are malformed; ``errors`` holds ``FILE:LINE: reason`` strings."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


class _Bad(ValueError):
    pass


def read_records(path: str | Path) -> Iterator[tuple[int, object]]:
    """(line number, decoded JSON or ``_Bad``) for every record of a JSON or JSONL file.

    A file holding one JSON document (possibly pretty-printed) is one record at line 1; otherwise
    each non-blank line is a record, and an undecodable line yields a ``_Bad`` in its place.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        yield 1, json.loads(text)
        return
    except json.JSONDecodeError as whole:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        if first in ("{", "["):  # a pretty-printed document: report where it broke
            yield whole.lineno, _Bad(f"invalid JSON: {whole.msg} (column {whole.colno})")
            return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            yield lineno, _Bad(f"invalid JSON: {exc.msg} (column {exc.colno})")


def detect(record: dict) -> str:
    """Which tool wrote this record (``SGLANG`` or ``VLLM``); raises ``_Bad`` if neither."""
    if (
        "model_id" in record
        or "endpoint_type" in record
        or "burstiness" in record
        or any(k.endswith("_e2el_ms") for k in record)
    ):
        return VLLM
    if (
        "median_e2e_latency_ms" in record
        or "server_info" in record
        or "total_output_tokens_retokenized" in record
    ):
        return SGLANG
    raise _Bad(
        "not an SGLang bench_serving or vLLM bench serve result "
        f"(keys: {', '.join(sorted(record)[:8]) or 'none'})"
    )


def _num(record: dict, key: str) -> float | int | None:
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise _Bad(f"{key!r} must be a non-negative number, got {value!r}")
    if math.isinf(value):
        raise _Bad(f"{key!r} is infinite")
    return value


def _rate(value: object) -> object:
    """request_rate: a number, 'inf' (vLLM writes the string, SGLang json.dumps Infinity) or 'trace'."""
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value in ("inf", "trace"):
        return value
    raise _Bad(f"'request_rate' must be a number, 'inf' or 'trace', got {value!r}")


def _latencies(record: dict, name: str, source: str) -> dict[str, float]:
    """mean/median/std/pNN/max of one latency family, statistics in that order."""
    found = []
    for key in record:
        m = re.fullmatch(rf"(mean|median|std|max|p\d+(?:\.\d+)?)_{source}_ms", key)
        if m and record[key] is not None:
            stat = m.group(1)
            order = _STAT_ORDER.get(stat) if stat in _STAT_ORDER else 3 + float(stat[1:])
            found.append((order, f"{stat}_{name}_ms", _num(record, key)))
    return {key: value for _, key, value in sorted(found)}


def _metrics(record: dict, tool: str) -> dict[str, float]:
    names = {v: k for k, v in _VLLM_NAMES.items()} if tool == VLLM else {}
    out: dict[str, float] = {}
    for name in _THROUGHPUTS:
        value = _num(record, names.get(name, name))
        if value is not None:
            out[name] = value
    duration = _num(record, "duration")
    if "input_throughput" not in out and duration and record.get("total_input_tokens") is not None:
        out["input_throughput"] = _num(record, "total_input_tokens") / duration  # vLLM omits it
    for name, vllm_name in _LATENCIES:
        out.update(_latencies(record, name, vllm_name if tool == VLLM else name))
    for name in _COUNTS:
        value = _num(record, name)
        if value is not None:
            out[name] = value
    return out


def _lengths(record: dict) -> dict:
    """Measured request lengths from per-request details, when the record carries them: ``isl`` /
    ``osl`` are the means (``random_input_len`` is only the upper bound when the range ratio < 1)."""
    out = {}
    for key, name in (("input_lens", "isl"), ("output_lens", "osl")):
        lens = record.get(key)
        if (
            isinstance(lens, list)
            and lens
            and all(isinstance(x, int) and not isinstance(x, bool) for x in lens)
        ):
            out[name] = round(sum(lens) / len(lens), 1)
            out[f"{name}_max"] = max(lens)
    return out


def _server(record: dict) -> dict:
    info = record.get("server_info")
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise _Bad(f"'server_info' must be an object, got {type(info).__name__}")
    if "decode" in info and isinstance(info["decode"], list) and info["decode"]:  # PD disaggregation
        info = info["decode"][0]
    return {k: info[k] for k in _SERVER_ARGS if info.get(k) is not None and info[k] is not False} | (
        {"version": info["version"]} if info.get("version") else {}
    )


def launch_command(server: dict) -> str | None:
    """``python -m sglang.launch_server …`` rebuilt from the server_info fields we keep."""
    if "model_path" not in server:
        return None
    parts = ["python", "-m", "sglang.launch_server"]
    for key in _SERVER_ARGS:
        if key not in server:
            continue
        flag = "--" + key.replace("_", "-")
        value = server[key]
        if value is True:
            parts.append(flag)
        else:
            parts += [flag, str(value)]
    return " ".join(parts)


def to_row(record: object, *, path: Path, lineno: int, mtime: str, gpu: str | None = None,
           subject: str | None = None, provider: str | None = None) -> dict:  # fmt: skip
    """One benchmark record -> one ``runs`` row (raises ``_Bad`` with the reason)."""
    if not isinstance(record, dict):
        raise _Bad(f"expected a JSON object, got {type(record).__name__}")
    tool = detect(record)
    missing = [k for k in _REQUIRED[tool] if k not in record]
    if missing:
        raise _Bad(f"{tool} result without {', '.join(repr(k) for k in missing)}")
    metrics = _metrics(record, tool)
    server = _server(record) if tool == SGLANG else {}
    backend = str(record.get("backend") or record.get("endpoint_type") or "unknown")
    label = record.get("tag") if tool == SGLANG else record.get("label")
    config: dict = {"tool": tool, "backend": backend}
    model = record.get("model_id") or server.get("served_model_name") or server.get("model_path")
    if model:
        config["model"] = model
    for key in _WORKLOAD:
        if record.get(key) is not None:
            config[key] = _rate(record[key]) if key == "request_rate" else record[key]
    if label:
        config["label"] = label
    config.update(_lengths(record))
    for key, value in server.items():  # flat, so the advisor reads tp_size etc. like any config key
        if key not in ("version", "served_model_name") and not (key == "model_path" and value == model):
            config[key] = value
    created = mtime
    if tool == VLLM and isinstance(record.get("date"), str):
        try:  # vLLM's "%Y%m%d-%H%M%S", local time of the benchmark host (taken as offset +00:00)
            moment = _dt.datetime.strptime(record["date"], "%Y%m%d-%H%M%S")
            created = moment.replace(tzinfo=_dt.timezone.utc).isoformat(timespec="seconds")
        except ValueError:
            raise _Bad(f"'date' is not %Y%m%d-%H%M%S: {record['date']!r}") from None
    engine = subject or (backend.split("-")[0] if tool == SGLANG else "vllm")
    throughput = metrics["output_throughput"]
    return {
        "kind": "serving",
        "subject": engine,
        "provider": provider or str(label or backend),
        "config": config,
        "metric": "output_throughput",
        "unit": "tok/s",
        "p20": throughput,
        "p50": throughput,
        "p80": throughput,
        "metrics": metrics,
        "gpu": gpu,
        "versions": {"sglang": server["version"]} if server.get("version") else None,
        "git_sha": None,
        "command": launch_command(server),
        "source": f"{path}:{lineno}",
        "fingerprint": hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest(),
        "created_at": created,
    }


def parse_files(paths: Iterable[str | Path], *, gpu: str | None = None, subject: str | None = None,
                provider: str | None = None) -> list[dict]:  # fmt: skip
    """All records of all files as rows, or ``ImportFailed`` listing every bad record."""
    rows: list[dict] = []
    errors: list[str] = []
    for p in paths:
        path = Path(p)
        try:
            stamp = os.stat(path).st_mtime
            records = list(read_records(path))
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{path}: cannot read: {exc}")
            continue
        mtime = _dt.datetime.fromtimestamp(stamp, _dt.timezone.utc).isoformat(timespec="seconds")
        if not records:
            errors.append(f"{path}:1: no records (empty file)")
        for lineno, record in records:
            try:
                if isinstance(record, _Bad):
                    raise record
                rows.append(to_row(record, path=path, lineno=lineno, mtime=mtime, gpu=gpu,
                                   subject=subject, provider=provider))  # fmt: skip
            except _Bad as exc:
                errors.append(f"{path}:{lineno}: {exc}")
    if errors:
        raise ImportFailed(errors)
    return rows
