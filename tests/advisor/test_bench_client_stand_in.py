"""``bench``'s own HTTP/1.1 streaming client (``client.Streamer``) against raw asyncio stand-in servers
that answer with exact bytes: keep-alive reuse, a server-closed idle connection, chunks split and
merged across reads, bodies by Content-Length and up to the close, timeouts, errors."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from hpc_advise.advisor.bench.client import Result, Streamer, stream_completion


def _sse(n: int, usage: bool = True, done: bool = True) -> list[bytes]:
    events = [b"data: " + orjson.dumps({"choices": [{"text": f" t{i}"}]}) + b"\n\n" for i in range(n)]
    if usage:
        events.append(b"data: " + orjson.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}})
                      + b"\n\n")  # fmt: skip
    if done:
        events.append(b"data: [DONE]\n\n")
    return events


def _chunked(events: list[bytes]) -> list[bytes]:
    return [f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events] + [b"0\r\n\r\n"]


class StandIn:
    """A raw TCP server: ``answer(n)`` gives the byte pieces of the n-th request's response (None: say
    nothing), written with ``gap_s`` between pieces; ``close_after`` closes the connection after it."""

    def __init__(self, answer, gap_s: float = 0.0, close_after: bool = False):
        self.answer, self.gap_s, self.close_after = answer, gap_s, close_after
        self.connections = self.requests = 0

    async def handle(self, reader, writer):
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length"))
                             .split(b":")[1])  # fmt: skip
                await reader.readexactly(length)
                self.requests += 1
                pieces = self.answer(self.requests)
                if pieces is None:
                    await asyncio.sleep(30)
                for p in pieces:
                    writer.write(p)
                    await writer.drain()
                    if self.gap_s:
                        await asyncio.sleep(self.gap_s)
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def _send(s, url, n_out=3):
    return await stream_completion(s, url, "m", [1, 2, 3], n_out, Result(0, 0, 0.0))


def test_keep_alive_reuses_one_connection_and_measures_each_chunk_stand_in():
    async def go():
        async with StandIn(lambda k: [HEAD_CHUNKED, *_chunked(_sse(3))], gap_s=0.02) as srv:
            async with Streamer(10.0) as s:
                out = [await _send(s, srv.url) for _ in range(4)]
            return srv, out

    srv, out = asyncio.run(go())
    assert srv.connections == 1 and srv.requests == 4
    for r in out:
        assert r.ok and r.n_in == 7 and r.n_out == 3 and len(r.itl) == 2
        assert all(0.015 < g < 0.2 for g in r.itl) and r.ttft < r.e2e


def test_chunks_split_and_merged_across_reads_stand_in():
    body = b"".join(_chunked(_sse(5)))
    pieces = [HEAD_CHUNKED[:10], HEAD_CHUNKED[10:] + body[:7]] + [body[i : i + 13] for i in range(7, len(body), 13)]

    async def go():
        async with StandIn(lambda k: pieces) as srv, Streamer(10.0) as s:
            return await _send(s, srv.url, 5)

    r = asyncio.run(go())
    assert r.ok and r.n_out == 5 and len(r.itl) == 4


def test_server_closed_idle_connection_is_retried_once_stand_in():
    async def go():
        async with StandIn(lambda k: [HEAD_CHUNKED, *_chunked(_sse(2))], close_after=True) as srv:
            async with Streamer(10.0) as s:
                a = await _send(s, srv.url)
                await asyncio.sleep(0.1)  # the server has closed the kept connection by now
                b = await _send(s, srv.url)
            return srv, a, b

    srv, a, b = asyncio.run(go())
    assert a.ok and b.ok and srv.connections == 2


@pytest.mark.parametrize(
    "pieces, cause",
    [
        ([b"HTTP/1.1 400 Bad Request\r\nContent-Length: 52\r\n\r\n", b'{"message": "exceeds the maximum context length ok"}'],
         "too_long"),
        ([b"HTTP/1.1 503 Unavailable\r\nConnection: close\r\n\r\n", b"busy"], "http_503"),
        ([HEAD_CHUNKED, *_chunked(_sse(2, done=False))], "dropped_stream"),
        ([HEAD_CHUNKED, *_chunked([b'data: {"object": "error", "message": "x"}\n\n'])], "server_error"),
        ([HEAD_CHUNKED, *_chunked([b"data: {not json\n\n"])], "bad_chunk"),
        ([HEAD_CHUNKED, *_chunked(_sse(2))[:2]], "dropped_stream"),  # cut mid-stream
    ],
)  # fmt: skip
def test_failures_are_classified_stand_in(pieces, cause):
    async def go():
        async with StandIn(lambda k: pieces, close_after=True) as srv, Streamer(10.0) as s:
            return await _send(s, srv.url)

    assert asyncio.run(go()).error == cause


def test_close_delimited_stream_and_timeout_stand_in():
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"

    async def go():
        async with StandIn(lambda k: [head, *_sse(3)], close_after=True) as srv, Streamer(10.0) as s:
            ok = await _send(s, srv.url)
        async with StandIn(lambda k: None) as srv, Streamer(0.3) as s:
            late = await _send(s, srv.url)
        async with Streamer(1.0) as s:
            refused = await _send(s, "http://127.0.0.1:9")
        return ok, late, refused

    ok, late, refused = asyncio.run(go())
    assert ok.ok and ok.n_out == 3
    assert late.error == "timeout" and refused.error == "connection"
