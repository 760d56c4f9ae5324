"""A stand-in for an OpenAI-compatible (SGLang-like) streaming server, at the network boundary: the
tests named ``*_stand_in`` run ``hpc-advise bench`` against it over real HTTP.

What it serves (aiohttp): ``GET /v1/models`` (model id and ``max_model_len``), ``GET /get_server_info``
(a few SGLang launch arguments and a version), ``POST /v1/completions`` (streamed as server-sent events,
usage in the last chunk when ``stream_options.include_usage``) and ``POST /generate`` (SGLang's native
endpoint: greedy ``output_ids`` and, with ``return_logprob``, teacher-forced input logprobs with the
top-k at every position).

Behaviour (``StandInConfig``): the first token is sent ``ttft_ms`` after the request arrives and token
``i`` at ``ttft_ms + i * itl_ms``, against absolute deadlines so sleep overshoot does not accumulate;
every ``error_every``-th completion answers HTTP ``error_status``; every ``drop_every``-th stream is cut
after ``drop_after`` tokens; a prompt longer than ``max_context`` minus ``max_tokens`` gets SGLang's
400 answer; ``html`` serves an HTML page for every path (a URL that is not an OpenAI server).

Token model (deterministic, no weights): a prompt of token ids counts one token per id, a text
prompt one per whitespace-separated word. Next-token scores after token ``p`` are
``-k * 0.7`` for the candidates ``(p * 31 + 17 * k + 1) % vocab``, k = 0..top-1; greedy takes
k = 0, or k = 1 from output position ``diverge_at`` on; ``logprob_noise`` tilts the scores so a
second server's distribution differs a little.

Run in a separate process (``start()``), so its timers do not share an interpreter with the client
being measured: ``python -m tests.advisor.openai_stand_in '{"ttft_ms": 50}'`` prints ``PORT <n>``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class StandInConfig:
    model: str = "stand-in/tiny"
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    max_context: int = 4096
    report_context: bool = True  # False: /v1/models hides max_model_len (only the 400 tells)
    vocab: int = 1000
    error_every: int = 0
    error_status: int = 500
    drop_every: int = 0
    drop_after: int = 2
    html: bool = False
    diverge_at: int | None = None
    logprob_noise: float = 0.0
    top: int = 8


def _next_candidates(cfg: StandInConfig, prev: int) -> list[tuple[int, float]]:
    """(token, logprob) of the ``top`` candidates after ``prev``, best first, normalised over them."""
    toks = [(prev * 31 + 17 * k + 1) % cfg.vocab for k in range(cfg.top)]
    scores = [-0.7 * k + cfg.logprob_noise * (k % 2) for k in range(cfg.top)]
    z = math.log(sum(math.exp(s) for s in scores))
    return sorted(zip(toks, [s - z for s in scores], strict=True), key=lambda x: -x[1])


def _greedy(cfg: StandInConfig, prompt_ids: list[int], n: int) -> list[int]:
    prev = prompt_ids[-1] if prompt_ids else 0
    out = []
    for i in range(n):
        cands = _next_candidates(cfg, prev)
        pick = cands[1][0] if cfg.diverge_at is not None and i >= cfg.diverge_at else cands[0][0]
        out.append(pick)
        prev = pick
    return out


def _prompt_ids(prompt) -> list[int]:
    if isinstance(prompt, list):
        return [int(x) for x in prompt]
    return [zlib.crc32(w.encode()) % 1000 for w in str(prompt).split()]  # stable across processes


def build_app(cfg: StandInConfig):
    from aiohttp import web

    counter = {"n": 0}

    async def html(request):
        return web.Response(text="<html><body>welcome</body></html>", content_type="text/html")

    async def models(request):
        card = {"id": cfg.model, "object": "model"}
        if cfg.report_context:
            card["max_model_len"] = cfg.max_context
        return web.json_response({"object": "list", "data": [card]})

    async def server_info(request):
        return web.json_response(
            {
                "model_path": cfg.model,
                "tp_size": 1,
                "attention_backend": "stand-in",
                "version": "0.0-stand-in",
            }
        )

    def too_long(n_prompt: int, max_tokens: int):
        return web.json_response(
            {
                "object": "error",
                "message": f"Requested token count exceeds the model's maximum context length of "
                f"{cfg.max_context} tokens. You requested a total of {n_prompt + max_tokens} tokens: "
                f"{n_prompt} tokens from the input messages and {max_tokens} tokens for the completion.",
                "type": "BadRequestError",
                "code": 400,
            },
            status=400,
        )

    async def completions(request):
        t0 = time.perf_counter()
        counter["n"] += 1
        k = counter["n"]
        body = json.loads(await request.read())
        ids = _prompt_ids(body.get("prompt", ""))
        max_tokens = int(body.get("max_tokens", 16))
        if len(ids) + max_tokens > cfg.max_context:
            return too_long(len(ids), max_tokens)
        if cfg.error_every and k % cfg.error_every == 0:
            return web.json_response(
                {"object": "error", "message": "stand-in failure"}, status=cfg.error_status
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        drop = cfg.drop_every and k % cfg.drop_every == 0
        tokens = _greedy(cfg, ids, max_tokens)
        for i, tok in enumerate(tokens):
            due = t0 + (cfg.ttft_ms + i * cfg.itl_ms) / 1000.0
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if drop and i == cfg.drop_after:
                request.transport.close()  # cut the stream mid-response
                return resp
            chunk = {"id": f"cmpl-{k}", "object": "text_completion", "model": cfg.model,
                     "choices": [{"index": 0, "text": f" t{tok}", "finish_reason": None}]}  # fmt: skip
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = {
            "prompt_tokens": len(ids),
            "completion_tokens": len(tokens),
            "total_tokens": len(ids) + len(tokens),
        }
        last = {"id": f"cmpl-{k}", "object": "text_completion", "choices": [], "usage": usage}
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(b"data: " + json.dumps(last).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def generate(request):
        body = json.loads(await request.read())
        ids = body.get("input_ids")
        ids = [int(x) for x in ids] if ids is not None else _prompt_ids(body.get("text", ""))
        sp = body.get("sampling_params") or {}
        n = int(sp.get("max_new_tokens", 16))
        if len(ids) + n > cfg.max_context:
            return too_long(len(ids), n)
        out = _greedy(cfg, ids, n)
        meta = {"prompt_tokens": len(ids), "completion_tokens": n, "id": "gen"}
        if body.get("return_logprob"):
            start = int(body.get("logprob_start_len", 0))
            topn = int(body.get("top_logprobs_num", 0))
            tok_lp, top_lp = [], []
            for j in range(start, len(ids)):
                if j == 0:
                    tok_lp.append([None, ids[0], None])
                    top_lp.append(None)
                    continue
                cands = _next_candidates(cfg, ids[j - 1])
                lp = dict(cands).get(ids[j], math.log(1e-6))
                tok_lp.append([lp, ids[j], None])
                top_lp.append([[c_lp, c_tok, None] for c_tok, c_lp in cands[:topn]])
            meta["input_token_logprobs"] = tok_lp
            meta["input_top_logprobs"] = top_lp
        return web.json_response(
            {"text": " ".join(f"t{t}" for t in out), "output_ids": out, "meta_info": meta}
        )

    app = web.Application()
    if cfg.html:
        app.router.add_route("*", "/{tail:.*}", html)
    else:
        app.router.add_get("/v1/models", models)
        app.router.add_get("/get_server_info", server_info)
        app.router.add_post("/v1/completions", completions)
        app.router.add_post("/generate", generate)
    return app


async def _serve(cfg: StandInConfig) -> None:
    from aiohttp import web

    runner = web.AppRunner(build_app(cfg), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    await asyncio.Event().wait()


@contextmanager
def start(**config):
    """Start a stand-in server in its own process; yields its base URL, stops it on exit."""
    cfg = StandInConfig(**config)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.advisor.openai_stand_in", json.dumps(dataclasses.asdict(cfg))],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    try:
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"stand-in server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(10)


def free_port() -> int:
    """A port nothing listens on (for the unreachable-server case)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    asyncio.run(_serve(StandInConfig(**json.loads(sys.argv[1] if len(sys.argv) > 1 else "{}"))))
