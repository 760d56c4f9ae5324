"""The trace formats we read: one reader per format, the registry ``FORMATS`` and ``detect()``.

A reader is ``reader(source, options, meta) -> iterator of (line, Request | reason)``; ``meta`` is a
dict the reader may fill with run-level facts (a benchmark's duration, observed latencies).

Formats (field names as their producers write them):

- ``canonical``  JSONL ``{"t": s, "in": tokens, "out": tokens, "cached"?, "failed"?, "hash_ids"?,
  "block_size"?}`` -- ours; ``trace convert`` writes it.
- ``mooncake``   JSONL ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
  (512-token blocks) -- Mooncake / FAST'25 traces.
- ``bailian``    JSONL ``chat_id``, ``parent_chat_id``, ``timestamp`` (s), ``input_length``,
  ``output_length``, ``type``, ``turn``, ``hash_ids`` (16-token blocks) -- Alibaba Bailian traces.
- ``azure``      CSV ``TIMESTAMP`` (date-time), ``ContextTokens``, ``GeneratedTokens`` -- Azure LLM
  inference traces 2023 / 2024.
- ``burstgpt``   CSV ``Timestamp`` (s), ``Model``, ``Request tokens``, ``Response tokens``,
  ``Total tokens``, ``Log Type``; 0 response tokens = a failed request.
- ``openai``     JSONL of API responses (``created``, ``usage.prompt_tokens``,
  ``usage.completion_tokens``, ``usage.prompt_tokens_details.cached_tokens``; the Responses API's
  ``input_tokens``/``output_tokens`` too) or Batch API output lines (``custom_id``,
  ``response.status_code``, ``response.body``, ``error``).
- ``sharegpt``   JSON array of ``{"id", "conversations": [{"from", "value"}]}``; see
  ``traces.tokens`` for how text becomes tokens. Every assistant turn is one request whose input is
  the whole conversation before it (what a chat server receives), its output that turn.
- ``sglang-bench`` / ``vllm-bench``  ``python -m sglang.bench_serving --output-details`` JSONL and
  ``vllm bench serve --save-result`` JSON: per-request ``input_lens``, ``output_lens``, ``errors``,
  ``ttfts``, ``itls`` and the run's ``duration``. No per-request arrival times.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hpc_advise.advisor.traces.parse import (
    BadField,
    csv_rows,
    datetime_seconds,
    fast_loads,
    int_list,
    json_array,
    json_documents,
    json_lines,
    number,
    parse_json_line,
    tokens,
)
from hpc_advise.advisor.traces.source import Request, TraceError, TraceSource

Item = tuple[int, "Request | str"]


@dataclass
class ReadOptions:
    """Reader options: ``count_tokens`` turns text into a token count (ShareGPT); ``block_size``
    overrides the tokens per ``hash_ids`` block of Mooncake (512) / Bailian (16) traces."""

    count_tokens: Callable[[str], int] | None = None
    block_size: int | None = None


def _missing(exc: KeyError) -> str:
    return f"missing field {exc.args[0]!r}"


def read_canonical(source: TraceSource, options: ReadOptions, meta: dict) -> Iterator[Item]:
    for line, obj in json_lines(source):
        if type(obj) is str:
            yield line, obj
            continue
        try:
            t = obj.get("t")
            cached = obj.get("cached")
            hash_ids = obj.get("hash_ids")
            yield (
                line,
                Request(
                    None if t is None else number(t, "t"),
                    tokens(obj["in"], "in"),
                    tokens(obj["out"], "out"),
                    None if cached is None else tokens(cached, "cached"),
                    bool(obj.get("failed", False)),
                    None if hash_ids is None else int_list(hash_ids, "hash_ids"),
                    None if hash_ids is None else tokens(obj.get("block_size", 512), "block_size"),
                ),
            )
        except KeyError as exc:
            yield line, _missing(exc)
        except BadField as exc:
            yield line, str(exc)


def _hashed_jsonl(time_scale: float, block_size: int):
    def reader(source: TraceSource, options: ReadOptions, meta: dict) -> Iterator[Item]:
        block = options.block_size or block_size
        loads = fast_loads
        for line, text in source.lines():  # json_lines() inlined: this is the hot loop of big traces
            try:
                obj = loads(text)
            except ValueError:
                if text.isspace():
                    continue
                try:
                    obj = parse_json_line(text)
                except BadField as exc:
                    yield line, str(exc)
                    continue
            if type(obj) is not dict:
                yield line, f"expected a JSON object, got {type(obj).__name__}"
                continue
            try:
                # Inline fast paths for the common case (ints, a list of ints); the helpers give
                # the error messages.
                t = obj["timestamp"]
                if type(t) is not int and type(t) is not float:
                    t = number(t, "timestamp")
                elif t != t or t in (_INF, -_INF):
                    t = number(t, "timestamp")
                n_in = obj["input_length"]
                if type(n_in) is not int:
                    n_in = tokens(n_in, "input_length")
                n_out = obj["output_length"]
                if type(n_out) is not int:
                    n_out = tokens(n_out, "output_length")
                hash_ids = obj.get("hash_ids")
                if hash_ids is not None:
                    int_list(hash_ids, "hash_ids")
                yield (
                    line,
                    Request(
                        t * time_scale,
                        n_in,
                        n_out,
                        None,
                        False,
                        hash_ids,
                        None if hash_ids is None else block,
                    ),
                )
            except KeyError as exc:
                yield line, _missing(exc)
            except BadField as exc:
                yield line, str(exc)

    return reader


_INF = float("inf")
read_mooncake = _hashed_jsonl(1e-3, 512)
read_bailian = _hashed_jsonl(1.0, 16)


def read_azure(source: TraceSource, options: ReadOptions, meta: dict) -> Iterator[Item]:
    columns = {"t": ("TIMESTAMP",), "in": ("ContextTokens",), "out": ("GeneratedTokens",)}
    for line, row in csv_rows(source, columns):
        if type(row) is str:
            yield line, row
            continue
        try:
            yield (
                line,
                Request(
                    datetime_seconds(row["t"], "TIMESTAMP"),
                    tokens(row["in"], "ContextTokens"),
                    tokens(row["out"], "GeneratedTokens"),
                ),
            )
        except BadField as exc:
            yield line, str(exc)


def read_burstgpt(source: TraceSource, options: ReadOptions, meta: dict) -> Iterator[Item]:
    columns = {"t": ("Timestamp",), "in": ("Request tokens",), "out": ("Response tokens",)}
    for line, row in csv_rows(source, columns):
        if type(row) is str:
            yield line, row
            continue
        try:
            out = tokens(row["out"], "Response tokens")
            yield (
                line,
                Request(
                    number(row["t"], "Timestamp"), tokens(row["in"], "Request tokens"), out, None, out == 0
                ),
            )
        except BadField as exc:
            yield line, str(exc)


def _usage_tokens(usage: dict) -> tuple[int, int, int | None]:
    if "prompt_tokens" in usage:
        prompt = tokens(usage["prompt_tokens"], "usage.prompt_tokens")
        completion = tokens(usage.get("completion_tokens", 0), "usage.completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
    elif "input_tokens" in usage:  # Responses API
        prompt = tokens(usage["input_tokens"], "usage.input_tokens")
        completion = tokens(usage.get("output_tokens", 0), "usage.output_tokens")
        details = usage.get("input_tokens_details") or {}
    else:
        raise BadField("usage has neither prompt_tokens nor input_tokens")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return prompt, completion, None if cached is None else tokens(cached, "cached_tokens")


def read_openai(source: TraceSource, options: ReadOptions, meta: dict) -> Iterator[Item]:
    for line, obj in json_lines(source):
        if type(obj) is str:
            yield line, obj
            continue
        try:
            failed = False
            body = obj
            if "custom_id" in obj:  # Batch API output line
                if "response" not in obj:
                    yield line, "Batch API line without 'response' (is this the batch *input* file?)"
                    continue
                response = obj.get("response") or {}
                body = response.get("body") or {}
                status = response.get("status_code")
                failed = obj.get("error") is not None or (status is not None and status != 200)
            if body.get("error") is not None:
                failed = True
            usage = body.get("usage")
            created = body.get("created", body.get("created_at"))
            t = None if created is None else number(created, "created")
            if not isinstance(usage, dict):
                if failed:
                    yield line, Request(t, 0, 0, None, True)
                    continue
                raise BadField("no 'usage' object")
            prompt, completion, cached = _usage_tokens(usage)
            yield line, Request(t, prompt, completion, cached, failed)
        except BadField as exc:
            yield line, str(exc)


_USER_ROLES = {"human", "user", "system", "tool", "function"}
_ASSISTANT_ROLES = {"gpt", "assistant", "chatgpt", "bing", "bard", "model"}


def read_sharegpt(source: TraceSource, options: ReadOptions, meta: dict) -> Iterator[Item]:
    from hpc_advise.advisor.traces.tokens import estimate_tokens

    count = options.count_tokens or estimate_tokens
    meta["token_counter"] = getattr(count, "description", "estimate")
    for line, element in json_array(source):
        if not isinstance(element, dict):
            yield line, f"expected a conversation object, got {type(element).__name__}"
            continue
        turns = element.get("conversations")
        if not isinstance(turns, list):
            yield line, "conversation without a 'conversations' list"
            continue
        context = 0
        for turn in turns:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                yield line, "a turn is not {from, value} with a text value"
                break
            role = str(turn.get("from", "")).lower()
            n = count(turn["value"])
            if role in _ASSISTANT_ROLES:
                if context > 0:
                    yield line, Request(None, context, n)
            elif role not in _USER_ROLES:
                yield line, f"unknown speaker {turn.get('from')!r}"
                break
            context += n


def _bench_requests(doc: dict, line: int, meta: dict) -> Iterator[Item]:
    ins, outs = doc.get("input_lens"), doc.get("output_lens")
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
        yield line, "benchmark result without per-request input_lens/output_lens of equal length"
        return
    errors = doc.get("errors") or [None] * len(ins)
    if "duration" in doc:
        meta["duration_s"] = meta.get("duration_s", 0.0) + number(doc["duration"], "duration")
    ttfts, itls = doc.get("ttfts"), doc.get("itls")
    observed = meta.setdefault("observed", {"ttft_s": [], "tpot_s": []})
    for i, (n_in, n_out) in enumerate(zip(ins, outs, strict=True)):
        failed = bool(errors[i]) if i < len(errors) else False
        try:
            req = Request(None, tokens(n_in, "input_lens[i]"), tokens(n_out, "output_lens[i]"), None, failed)
        except BadField as exc:
            yield line, f"request {i}: {exc}"
            continue
        if not failed and isinstance(ttfts, list) and i < len(ttfts) and isinstance(ttfts[i], (int, float)):
            if ttfts[i] > 0:
                observed["ttft_s"].append(float(ttfts[i]))
            if isinstance(itls, list) and i < len(itls) and isinstance(itls[i], list) and itls[i]:
                observed["tpot_s"].append(sum(itls[i]) / len(itls[i]))
        yield line, req


def read_bench(source: TraceSource, options: ReadOptions, meta: dict) -> Iterator[Item]:
    for line, doc in json_documents(source):
        if type(doc) is str:
            yield line, doc
            return
        if not isinstance(doc, dict):
            yield line, f"expected a benchmark result object, got {type(doc).__name__}"
            continue
        yield from _bench_requests(doc, line, meta)


@dataclass(frozen=True)
class TraceFormat:
    name: str
    reader: Callable[[TraceSource, ReadOptions, dict], Iterator[Item]]
    description: str
    timestamps: bool


FORMATS: dict[str, TraceFormat] = {
    f.name: f
    for f in (
        TraceFormat("canonical", read_canonical, 'JSONL {"t": s, "in", "out", "cached"?} (ours)', True),
        TraceFormat(
            "mooncake", read_mooncake, "JSONL timestamp(ms), input_length, output_length, hash_ids(512)", True
        ),
        TraceFormat(
            "bailian", read_bailian, "JSONL chat_id, parent_chat_id, timestamp(s), ..., hash_ids(16)", True
        ),
        TraceFormat(
            "azure", read_azure, "CSV TIMESTAMP, ContextTokens, GeneratedTokens (Azure 2023/2024)", True
        ),
        TraceFormat(
            "burstgpt", read_burstgpt, "CSV Timestamp, Model, Request tokens, Response tokens, ...", True
        ),
        TraceFormat("openai", read_openai, "JSONL API responses / Batch API output with usage", True),
        TraceFormat(
            "sharegpt", read_sharegpt, "JSON [{id, conversations:[{from, value}]}], tokens estimated", False
        ),
        TraceFormat("sglang-bench", read_bench, "sglang.bench_serving --output-details JSONL", False),
        TraceFormat("vllm-bench", read_bench, "vllm bench serve --save-result JSON", False),
    )
}


def _detect_object(keys: set[str]) -> str | None:
    if "input_lens" in keys:
        return (
            "vllm-bench" if keys & {"date", "model_id", "endpoint_type", "tokenizer_id"} else "sglang-bench"
        )
    if "chat_id" in keys and "input_length" in keys:
        return "bailian"
    if "input_length" in keys and "timestamp" in keys:
        return "mooncake"
    if "in" in keys and "out" in keys:
        return "canonical"
    if "custom_id" in keys or "usage" in keys or ("created" in keys and "object" in keys):
        return "openai"
    return None


def detect(source: TraceSource) -> str:
    """Name of the format of ``source``, from the first bytes of its content."""
    head = source.head.lstrip()
    if not head:
        raise TraceError("empty trace (no data)", source.name)
    if head[0] == "[":
        if '"conversations"' in head[:HEAD_SCAN]:
            return "sharegpt"
        raise TraceError(
            "a JSON array that is not ShareGPT (no 'conversations'); use --trace-format", source.name
        )
    first_line = head.split("\n", 1)[0].strip()
    if head[0] == "{":
        try:
            obj = json.loads(first_line)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            found = _detect_object(set(obj))
            if found:
                return found
        elif '"input_lens"' in head:  # a pretty-printed benchmark result
            return "vllm-bench" if '"model_id"' in head or '"date"' in head else "sglang-bench"
        raise TraceError(
            f"unknown JSON trace format (first keys: {', '.join(list(obj)[:8]) if obj else '?'}); "
            f"use --trace-format ({', '.join(FORMATS)})",
            source.name,
            1,
        )
    header = first_line.replace(" ", "").replace("_", "").lower()
    if "contexttokens" in header and "generatedtokens" in header:
        return "azure"
    if "requesttokens" in header and "responsetokens" in header:
        return "burstgpt"
    raise TraceError(
        f"unknown trace format (first line: {first_line[:80]!r}); use --trace-format ({', '.join(FORMATS)})",
        source.name,
        1,
    )


HEAD_SCAN = 16 * 1024
