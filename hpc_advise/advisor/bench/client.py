"""The HTTP side of ``bench``: probing a server and streaming one completion (aiohttp, asyncio).

``probe(url)`` checks that the URL is an OpenAI-compatible server (``GET /v1/models`` answers JSON
``{"data": [{"id": ...}]}``) with bounded retries while it does not answer at all, and reads what it
says about itself: model id, context length (``max_model_len``), and SGLang's ``/get_server_info``
(launch arguments and version) when there is one.

``stream_completion`` sends ``POST /v1/completions`` with ``stream: true``, ``max_tokens`` and
``ignore_eos`` (so the output length is the trace's) and ``stream_options.include_usage``, and records
on the client's monotonic clock: TTFT (first non-empty text chunk), the gap before every later chunk
(ITL, one per chunk as SGLang's ``bench_serving`` counts them), E2E, and the server's token counts.
A failure is classified into one cause: ``too_long`` (the server's context-length 400, the request is
skipped), ``http_<status>``, ``dropped_stream`` (connection cut or no ``[DONE]``), ``timeout``,
``connection``, ``server_error`` (an error object inside the stream).
"""

from __future__ import annotations

import asyncio
import time
from array import array
from dataclasses import dataclass, field

import aiohttp
import orjson

CONTEXT_WORDS = ("context length", "maximum context", "too long", "longer than", "max_model_len", "exceeds")


class ServerError(RuntimeError):
    """The server cannot be benchmarked (unreachable, or not OpenAI-compatible): one line."""


@dataclass
class ServerFacts:
    url: str
    model: str
    context_length: int | None = None
    engine: str = "openai"  # sglang when /get_server_info answers
    server_info: dict = field(default_factory=dict)


class Result:
    """One request's outcome; times in seconds on ``time.perf_counter``."""

    __slots__ = ("index", "target", "scheduled", "start", "ttft", "e2e", "n_in", "n_out", "itl", "error")

    def __init__(self, index: int, target: int, scheduled: float) -> None:
        self.index = index
        self.target = target
        self.scheduled = scheduled
        self.start = 0.0
        self.ttft: float | None = None
        self.e2e: float | None = None
        self.n_in = 0
        self.n_out = 0
        self.itl = array("d")
        self.error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        if self.error is None and self.n_out > 1 and self.ttft is not None:
            return (self.e2e - self.ttft) / (self.n_out - 1)
        return None


def session(timeout_s: float) -> aiohttp.ClientSession:
    """One session per run: no connection limit (an open loop must not queue in the client)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
        timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=10),
        json_serialize=lambda o: orjson.dumps(o).decode(),
    )


async def _get_json(s: aiohttp.ClientSession, url: str) -> tuple[int, str, object]:
    async with s.get(url) as r:
        body = await r.read()
        kind = r.headers.get("Content-Type", "").split(";")[0]
        try:
            return r.status, kind, orjson.loads(body)
        except orjson.JSONDecodeError:
            return r.status, kind, None


async def probe(url: str, retries: int = 3, backoff_s: float = 0.5, timeout_s: float = 10.0) -> ServerFacts:
    """Facts about the server at ``url``; ``ServerError`` after ``retries`` failed connections."""
    base = url.rstrip("/")
    last = ""
    async with session(timeout_s) as s:
        for attempt in range(retries):
            try:
                status, kind, data = await _get_json(s, base + "/v1/models")
                break
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as exc:
                last = str(exc) or type(exc).__name__
                if attempt + 1 < retries:
                    await asyncio.sleep(backoff_s * 2**attempt)
        else:
            raise ServerError(f"cannot reach {base} after {retries} tries: {last}")
        models = data.get("data") if isinstance(data, dict) else None
        if status != 200 or not isinstance(models, list) or not models or not isinstance(models[0], dict):
            what = f"HTTP {status}, {kind or 'no content type'}" + ("" if data is not None else ", not JSON")
            raise ServerError(
                f"{base} is not an OpenAI-compatible server: GET /v1/models answered {what}; "
                'expected JSON {"object": "list", "data": [{"id": MODEL, ...}]}'
            )
        first = models[0]
        facts = ServerFacts(url=base, model=str(first.get("id") or "unknown"))
        ctx = first.get("max_model_len") or first.get("context_length")
        if isinstance(ctx, int) and ctx > 0:
            facts.context_length = ctx
        try:
            status, _, info = await _get_json(s, base + "/get_server_info")
            if status == 200 and isinstance(info, dict):
                facts.engine = "sglang"
                facts.server_info = info
                ctx = info.get("context_length")
                if facts.context_length is None and isinstance(ctx, int) and ctx > 0:
                    facts.context_length = ctx
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
    return facts


def _classify(status: int, body: bytes) -> str:
    text = body[:2000].decode("utf-8", "replace").lower()
    if status == 400 and any(w in text for w in CONTEXT_WORDS):
        return "too_long"
    return f"http_{status}"


async def stream_completion(
    s: aiohttp.ClientSession,
    url: str,
    model: str,
    prompt,
    max_tokens: int,
    res: Result,
    extra: dict | None = None,
) -> Result:
    """Send one streamed completion and fill ``res`` (never raises for a failed request)."""
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": int(max_tokens),
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if extra:
        payload.update(extra)
    data = orjson.dumps(payload)
    clock = time.perf_counter
    n_chunks = 0
    done = False
    try:
        res.start = t0 = clock()
        async with s.post(
            url + "/v1/completions", data=data, headers={"Content-Type": "application/json"}
        ) as r:
            if r.status != 200:
                res.error = _classify(r.status, await r.read())
                return res
            last = t0
            pending = b""
            # whole reads, split into lines here: one await per network read, not per line
            async for data in r.content.iter_any():
                now = clock()
                lines = (pending + data).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue
                    body = line[5:].strip()
                    if body == b"[DONE]":
                        done = True
                        break
                    obj = orjson.loads(body)
                    choices = obj.get("choices")
                    if choices and choices[0].get("text"):
                        if res.ttft is None:
                            res.ttft = now - t0
                        else:
                            res.itl.append(now - last)
                        last = now
                        n_chunks += 1
                    usage = obj.get("usage")
                    if usage:
                        res.n_in = int(usage.get("prompt_tokens") or 0)
                        res.n_out = int(usage.get("completion_tokens") or 0)
                    if obj.get("error") or obj.get("object") == "error":
                        res.error = "server_error"
                        return res
                if done:
                    break
            res.e2e = last - t0 if res.ttft is not None else clock() - t0
    except asyncio.TimeoutError:
        res.error = "timeout"
        return res
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
        res.error = "dropped_stream"
        return res
    except aiohttp.ClientConnectionError:
        res.error = "dropped_stream" if res.start and n_chunks else "connection"
        return res
    except orjson.JSONDecodeError:
        res.error = "bad_chunk"
        return res
    if not done:
        res.error = "dropped_stream"
    elif res.ttft is None:
        res.error = "no_output"
    elif not res.n_out:
        res.n_out = n_chunks  # no usage chunk: one token per chunk, as bench_serving assumes
    return res
