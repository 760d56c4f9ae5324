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
``connection``, ``server_error`` (an error object inside the stream), ``bad_chunk``.

The replayed requests do not go through aiohttp: ``Streamer`` keeps its own keep-alive HTTP/1.1
connections, each an ``asyncio.Protocol`` whose ``data_received`` timestamps and parses the bytes as
the event loop reads them (status line, chunked transfer coding, SSE lines), so a streamed token costs
no task wake-up and no stream-reader objects, and a request wakes its task once, when it ends
(docs/bench.md has the measured saving). ``probe`` and the consistency check, a few requests per run,
keep aiohttp.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from dataclasses import dataclass, field
from urllib.parse import urlsplit

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


class _Target:
    """Where a URL's streamed completions go: address, TLS, and the request head up to Content-Length."""

    __slots__ = ("key", "host", "port", "ssl", "head")

    def __init__(self, url: str, path: str) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ServerError(f"{url}: expected an http:// or https:// URL")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = u.scheme == "https"
        self.key = (self.host, self.port, self.ssl)
        host = u.netloc.rpartition("@")[2]
        self.head = (
            f"POST {u.path.rstrip('/')}{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            "Accept: text/event-stream\r\nContent-Length: "
        ).encode()


class _Exchange:
    """One streamed request's response, parsed as its bytes arrive: status line and headers, then the
    body (chunked, by Content-Length, or up to the close), whose SSE ``data:`` lines fill the Result."""

    __slots__ = ("res", "fut", "t0", "last", "buf", "head_done", "status", "chunked", "left", "close_delim",
                 "keep_alive", "body", "pending", "done", "n_chunks", "got_bytes", "finished", "reusable")  # fmt: skip

    def __init__(self, res: Result, fut: asyncio.Future, t0: float) -> None:
        self.res = res
        self.fut = fut
        self.t0 = self.last = t0
        self.buf = bytearray()
        self.head_done = False
        self.status = 0
        self.chunked = False
        self.left = -1  # chunked: bytes left in the chunk (-1: a size line next, -2: the trailer); else body bytes
        self.close_delim = False
        self.keep_alive = True
        self.body = b""  # a non-200 answer's body, for the cause
        self.pending = b""  # an SSE line split over chunks
        self.done = False  # [DONE] seen
        self.n_chunks = 0
        self.got_bytes = False
        self.finished = False
        self.reusable = False

    # --- the wire

    def feed(self, data: bytes, now: float) -> bool:
        """Consume bytes read at ``now``; True when the exchange is over."""
        self.got_bytes = True
        buf = self.buf
        buf += data
        if not self.head_done:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                return False
            self._head(bytes(buf[:i]))
            del buf[: i + 4]
            if self.finished:  # an empty body
                return True
        if self.chunked:
            # every complete chunk of this read, parsed as one payload (they share the read's time)
            parts = []
            ended = False
            while True:
                if self.left == -2:  # after the last chunk: an empty trailer line, or trailers and one
                    if buf[:2] == b"\r\n":
                        del buf[:2]
                    else:
                        k = buf.find(b"\r\n\r\n")
                        if k < 0:
                            break
                        del buf[: k + 4]
                    ended = True
                    break
                if self.left < 0:
                    j = buf.find(b"\r\n")
                    if j < 0:
                        break
                    try:
                        size = int(bytes(buf[:j]).split(b";", 1)[0], 16)
                    except ValueError:
                        return self._fail("dropped_stream")
                    del buf[: j + 2]
                    if size == 0:
                        self.left = -2
                        continue
                    self.left = size
                if len(buf) < self.left + 2:
                    break
                parts.append(bytes(buf[: self.left]))
                del buf[: self.left + 2]
                self.left = -1
            if parts and self._payload(parts[0] if len(parts) == 1 else b"".join(parts), now):
                return True
            return self._end(now) if ended else False
        if not buf:
            return False
        if self.close_delim:
            payload = bytes(buf)
            buf.clear()
            return self._payload(payload, now)
        take = min(self.left, len(buf))
        payload = bytes(buf[:take])
        del buf[:take]
        self.left -= take
        if self._payload(payload, now):
            return True
        return self._end(now) if self.left == 0 else False

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        first = lines[0].split(b" ", 2)
        self.status = int(first[1]) if len(first) > 1 and first[1].isdigit() else 0
        self.keep_alive = first[0] == b"HTTP/1.1"
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value:
                self.chunked = True
            elif name == b"content-length" and value.isdigit():
                length = int(value)
            elif name == b"connection":
                self.keep_alive = b"close" not in value and (self.keep_alive or b"keep-alive" in value)
        self.head_done = True
        if not self.chunked:
            if length is None:
                self.close_delim = True
                self.keep_alive = False
            else:
                self.left = length
                if length == 0:
                    self._end(time.perf_counter())

    def _payload(self, payload: bytes, now: float) -> bool:
        """Body bytes: kept for a non-200 answer, else SSE lines; True when the exchange is over."""
        if self.status != 200:
            if len(self.body) < 4096:
                self.body += payload
            return False
        if self.pending:
            payload = self.pending + payload
        lines = payload.split(b"\n")
        self.pending = lines.pop()
        res = self.res
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            body = line[5:].strip()
            if body == b"[DONE]":
                self.done = True
                continue
            try:
                obj = orjson.loads(body)
            except orjson.JSONDecodeError:
                return self._fail("bad_chunk")
            choices = obj.get("choices")
            if choices and choices[0].get("text"):
                if res.ttft is None:
                    res.ttft = now - self.t0
                else:
                    res.itl.append(now - self.last)
                self.last = now
                self.n_chunks += 1
            usage = obj.get("usage")
            if usage:
                res.n_in = int(usage.get("prompt_tokens") or 0)
                res.n_out = int(usage.get("completion_tokens") or 0)
            if obj.get("error") or obj.get("object") == "error":
                return self._fail("server_error")
        return False

    # --- endings (each resolves the future once)

    def _end(self, now: float) -> bool:
        """The response is complete."""
        res = self.res
        if self.status != 200:
            res.error = _classify(self.status, self.body)
        else:
            res.e2e = self.last - self.t0 if res.ttft is not None else now - self.t0
            if not self.done:
                res.error = "dropped_stream"
            elif res.ttft is None:
                res.error = "no_output"
            elif not res.n_out:
                res.n_out = self.n_chunks  # no usage chunk: one token per chunk, as bench_serving assumes
        self.reusable = self.keep_alive and not self.buf
        return self._finish()

    def _fail(self, cause: str) -> bool:
        self.res.error = cause
        return self._finish()

    def _finish(self) -> bool:
        self.finished = True
        if not self.fut.done():
            self.fut.set_result(None)
        return True

    def lost(self) -> None:
        """The connection closed before the response ended (the normal end of a close-delimited body)."""
        if self.finished:
            return
        if self.head_done and self.close_delim:
            self._end(time.perf_counter())
        else:
            self._fail("dropped_stream")

    def expire(self) -> None:
        if not self.finished:
            self._fail("timeout")


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; at most one exchange in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.ex: _Exchange | None = None
        self.lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        ex = self.ex
        if ex is None:  # bytes nobody asked for: the connection is not reusable
            self.lost = True
            self.transport.close()
            return
        if ex.finished:
            return
        if ex.feed(data, time.perf_counter()) and not ex.reusable:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self.ex is not None:
            self.ex.lost()


class Streamer:
    """The replay's HTTP client for streamed completions: keep-alive connections per server, no limit
    on how many (an open loop must not queue in the client), ``timeout_s`` per request."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._targets: dict[str, _Target] = {}
        self._idle: dict[tuple, list[_Conn]] = {}
        self._ssl = None

    async def __aenter__(self) -> Streamer:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                if c.transport is not None:
                    c.transport.close()
        self._idle.clear()

    def _target(self, url: str) -> _Target:
        t = self._targets.get(url)
        if t is None:
            t = self._targets[url] = _Target(url, "/v1/completions")
        return t

    async def _connect(self, t: _Target) -> tuple[_Conn, bool]:
        idle = self._idle.get(t.key)
        while idle:
            c = idle.pop()
            if not c.lost and not c.transport.is_closing():
                return c, True
        ssl = None
        if t.ssl:
            if self._ssl is None:
                import ssl as _ssl

                self._ssl = _ssl.create_default_context()
            ssl = self._ssl
        loop = asyncio.get_running_loop()
        _, c = await asyncio.wait_for(loop.create_connection(_Conn, t.host, t.port, ssl=ssl), 10.0)
        return c, False

    async def post(self, url: str, data: bytes, res: Result) -> Result:
        """Send one streamed completion body and fill ``res`` (never raises but CancelledError)."""
        t = self._target(url)
        loop = asyncio.get_running_loop()
        for attempt in (0, 1):
            try:
                conn, reused = await self._connect(t)
            except (OSError, asyncio.TimeoutError):
                res.error = "connection"
                return res
            res.start = t0 = time.perf_counter()
            ex = _Exchange(res, loop.create_future(), t0)
            conn.ex = ex
            conn.transport.write(t.head + str(len(data)).encode() + b"\r\n\r\n" + data)
            timer = loop.call_later(self.timeout_s, ex.expire)
            try:
                await ex.fut
            except asyncio.CancelledError:
                conn.transport.close()
                raise
            finally:
                timer.cancel()
                conn.ex = None
            if ex.res.error == "timeout":
                conn.transport.close()
            if attempt == 0 and reused and not ex.got_bytes and res.error == "dropped_stream":
                # the server had closed the idle connection (keep-alive timeout): once more on a new one
                res.error = None
                continue
            if ex.reusable and not conn.lost:
                self._idle.setdefault(t.key, []).append(conn)
            elif not conn.transport.is_closing():
                conn.transport.close()
            return res
        return res


async def stream_completion(
    s: Streamer,
    url: str,
    model: str,
    prompt,
    max_tokens: int,
    res: Result,
    extra: dict | None = None,
) -> Result:
    """Send one streamed completion through ``s`` and fill ``res`` (never raises for a failed request)."""
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
    return await s.post(url, orjson.dumps(payload), res)
