"""Writers: ``Request`` records to text in a trace format (``trace convert --to``, the example
generator, round-trip tests).

Each writer yields the lines (with newline) of the file. Times are written relative to nothing: they
are the request's ``t`` as given (seconds; Mooncake in whole milliseconds, Azure as a date-time at offset +00:00
with microseconds). Fields a format cannot carry are dropped: ``cached`` outside canonical/OpenAI,
``hash_ids`` outside canonical/Mooncake/Bailian, ``failed`` outside canonical/BurstGPT/OpenAI.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Iterable, Iterator

from hpc_advise.advisor.traces.source import Request, TraceError

_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _need_t(r: Request, fmt: str) -> float:
    if r.t is None:
        raise TraceError(f"cannot write {fmt}: a request has no timestamp")
    return r.t


def write_canonical(requests: Iterable[Request]) -> Iterator[str]:
    """``{"t","in","out"}`` plus ``cached``, ``failed``, ``hash_ids``/``block_size`` when present;
    ``t`` rounded to the microsecond."""
    for r in requests:
        obj: dict = {"t": None if r.t is None else round(r.t, 6), "in": r.input_len, "out": r.output_len}
        if r.cached is not None:
            obj["cached"] = r.cached
        if r.failed:
            obj["failed"] = True
        if r.hash_ids:
            obj["hash_ids"] = list(r.hash_ids)
            obj["block_size"] = r.block_size
        yield _dumps(obj) + "\n"


def write_mooncake(requests: Iterable[Request]) -> Iterator[str]:
    for r in requests:
        if r.failed:
            continue
        obj: dict = {
            "timestamp": int(round(_need_t(r, "mooncake") * 1000)),
            "input_length": r.input_len,
            "output_length": r.output_len,
            "hash_ids": list(r.hash_ids or []),
        }
        yield _dumps(obj) + "\n"


def write_bailian(requests: Iterable[Request]) -> Iterator[str]:
    for i, r in enumerate(requests):
        if r.failed:
            continue
        obj = {
            "chat_id": i,
            "parent_chat_id": -1,
            "timestamp": round(_need_t(r, "bailian"), 6),
            "input_length": r.input_len,
            "output_length": r.output_len,
            "type": "text",
            "turn": 1,
            "hash_ids": list(r.hash_ids or []),
        }
        yield _dumps(obj) + "\n"


def write_burstgpt(requests: Iterable[Request], model: str = "ChatGPT") -> Iterator[str]:
    yield "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    for r in requests:
        out = 0 if r.failed else r.output_len
        t = _need_t(r, "burstgpt")
        yield f"{round(t, 6)!r},{model},{r.input_len},{out},{r.input_len + out},Conversation log\n"


def _iso(t: float) -> str:
    dt = _dt.datetime(1970, 1, 1) + _dt.timedelta(microseconds=round(t * 1e6))
    return dt.strftime("%Y-%m-%d %H:%M:%S.%f")


def write_azure(requests: Iterable[Request]) -> Iterator[str]:
    yield "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    for r in requests:
        if r.failed:
            continue
        yield f"{_iso(_need_t(r, 'azure'))},{r.input_len},{r.output_len}\n"


def write_openai(requests: Iterable[Request]) -> Iterator[str]:
    """Chat-completion response objects (one per line) with ``usage``; failed requests as Batch API
    error lines."""
    for i, r in enumerate(requests):
        created = None if r.t is None else round(r.t, 6)
        if r.failed:
            line = {
                "id": f"batch_req_{i}",
                "custom_id": f"request-{i}",
                "response": {"status_code": 500, "body": {"created": created}},
                "error": {"code": "server_error", "message": "failed"},
            }
            yield _dumps(line) + "\n"
            continue
        usage: dict = {
            "prompt_tokens": r.input_len,
            "completion_tokens": r.output_len,
            "total_tokens": r.input_len + r.output_len,
        }
        if r.cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": r.cached}
        obj = {"id": f"chatcmpl-{i}", "object": "chat.completion", "created": created, "usage": usage}
        yield _dumps(obj) + "\n"


DROPS_FAILED = {"mooncake", "bailian", "azure"}  # formats that cannot mark a failed request

WRITERS: dict[str, Callable[[Iterable[Request]], Iterator[str]]] = {
    "canonical": write_canonical,
    "mooncake": write_mooncake,
    "bailian": write_bailian,
    "burstgpt": write_burstgpt,
    "azure": write_azure,
    "openai": write_openai,
}
