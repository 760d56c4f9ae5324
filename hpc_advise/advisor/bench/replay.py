"""Trace replay: the request plan read from a trace, and the asyncio loop that sends it.

``read_plan`` reads the trace through the advisor's trace reader (any supported format) into compact
arrays: arrival offsets from the first request, input/output lengths, and the ``hash_ids`` blocks;
``--requests`` keeps the first N, ``--duration`` the ones that arrive within S seconds (after
``--rate-scale``).

``replay`` sends the plan to one or two servers (A/B):
- open loop (default when the trace has timestamps): request i leaves at ``offset_i / rate_scale``; for
  A/B both servers get it at that moment, the order alternating per request so neither side is always
  second;
- closed loop (``concurrency`` N): N workers per server, each sending the next request when its last
  one finished, timestamps ignored.
Requests longer than the server's context length (when it says) are skipped and counted, not sent.
``stop()`` (SIGINT) ends the run: nothing new is sent, in-flight requests are cancelled and dropped,
and what finished is returned with ``interrupted`` set.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from hpc_advise.advisor.bench.client import Result, ServerFacts, Streamer, stream_completion
from hpc_advise.advisor.bench.prompts import PromptBuilder


@dataclass
class Plan:
    """The requests to send. ``t``: arrival offsets in seconds (None when the trace has none)."""

    t: np.ndarray | None
    n_in: np.ndarray
    n_out: np.ndarray
    hash_start: np.ndarray  # request i's hash ids: hash_flat[hash_start[i]:hash_start[i + 1]]
    hash_flat: np.ndarray
    block_size: np.ndarray  # 0 = no hash ids
    source: str = ""
    fmt: str = ""
    n_bad: int = 0

    def __len__(self) -> int:
        return len(self.n_in)

    def hash_ids(self, i: int):
        a, b = self.hash_start[i], self.hash_start[i + 1]
        return self.hash_flat[a:b] if b > a else None


def read_plan(path: str, fmt: str | None = None, skip_bad: bool = False, requests: int | None = None,
              duration_s: float | None = None, rate_scale: float = 1.0) -> Plan:  # fmt: skip
    """The plan of a trace file (``TraceError`` for an unreadable one)."""
    from hpc_advise.advisor.traces import TraceError, read_trace

    reader = read_trace(path, fmt, skip_bad)
    ts, ins, outs, starts, flat, blocks = [], [], [], [0], [], []
    t0 = None
    try:
        for req in reader:
            if requests is not None and len(ins) >= requests:
                break
            if req.t is not None:
                if t0 is None:
                    t0 = req.t
                if duration_s is not None and (req.t - t0) / rate_scale > duration_s:
                    break
            ts.append(req.t)
            ins.append(req.input_len)
            outs.append(max(1, req.output_len))
            if req.hash_ids:
                flat.extend(req.hash_ids)
            starts.append(len(flat))
            blocks.append(req.block_size or 0)
    finally:
        reader.close()
    if not ins:
        raise TraceError("no requests in the trace", reader.name)
    timed = all(t is not None for t in ts)
    return Plan(
        t=np.array([t - t0 for t in ts], dtype=np.float64) if timed else None,
        n_in=np.array(ins, dtype=np.int64),
        n_out=np.array(outs, dtype=np.int64),
        hash_start=np.array(starts, dtype=np.int64),
        hash_flat=np.array(flat, dtype=np.int64),
        block_size=np.array(blocks, dtype=np.int64),
        source=reader.name,
        fmt=reader.format,
        n_bad=reader.n_bad,
    )


@dataclass
class Outcome:
    """One server's side of a run."""

    facts: ServerFacts
    results: list[Result] = field(default_factory=list)
    duration_s: float = 0.0
    cancelled: int = 0


class Progress:
    """One stderr line, redrawn at most 4 times a second, when stderr is a terminal."""

    def __init__(self, total: int, enabled: bool | None = None) -> None:
        self.total = total
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.t0 = time.perf_counter()

    def draw(self, done: int, failed: int, final: bool = False) -> None:
        if not self.enabled:
            return
        width = 30
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        el = time.perf_counter() - self.t0
        sys.stderr.write(
            f"\r[{bar}] {done}/{self.total} failed {failed} {el:6.1f} s {done / max(el, 1e-9):6.1f} req/s"
        )
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


class Replay:
    """Sends a plan to ``targets`` (one, or candidate and baseline); ``run()`` returns their outcomes."""

    def __init__(self, targets: list[ServerFacts], plan: Plan, builder: PromptBuilder, *,
                 concurrency: int | None = None, rate_scale: float = 1.0, duration_s: float | None = None,
                 timeout_s: float = 600.0, progress: bool | None = None, extra: dict | None = None) -> None:  # fmt: skip
        if concurrency is None and plan.t is None:
            raise ValueError("the trace has no arrival times: give --concurrency N for a closed loop")
        self.targets = targets
        self.plan = plan
        self.builder = builder
        self.concurrency = concurrency
        self.rate_scale = rate_scale
        self.duration_s = duration_s
        self.timeout_s = timeout_s
        self.extra = extra
        self.outcomes = [Outcome(f) for f in targets]
        self.interrupted = False
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._progress = Progress(len(plan) * len(targets), progress)
        self._failed = 0
        self._done = 0

    def stop(self) -> None:
        """End the run now: no new requests; in-flight ones are cancelled and not counted."""
        if not self._stop.is_set():
            self.interrupted = True
            self._stop.set()
            for task in list(self._tasks):
                task.cancel()

    def _prompt(self, i: int):
        bs = int(self.plan.block_size[i])
        return self.builder.prompt(
            i, int(self.plan.n_in[i]), self.plan.hash_ids(i) if bs else None, bs or None
        )

    async def _one(self, s, k: int, i: int, scheduled: float, prompt) -> None:
        facts = self.targets[k]
        res = Result(i, k, scheduled)
        n_in, n_out = int(self.plan.n_in[i]), int(self.plan.n_out[i])
        if facts.context_length is not None and n_in + n_out > facts.context_length:
            res.error = "too_long"
            res.n_in = n_in
        else:
            try:
                await stream_completion(s, facts.url, facts.model, prompt, n_out, res, self.extra)
            except asyncio.CancelledError:
                self.outcomes[k].cancelled += 1
                return
        self.outcomes[k].results.append(res)
        self._done += 1
        self._failed += res.error is not None

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open_loop(self, s, t_start: float) -> None:
        t = self.plan.t
        scale = self.rate_scale
        n_targets = len(self.targets)
        end = None if self.duration_s is None else t_start + self.duration_s
        for i in range(len(self.plan)):
            due = t_start + t[i] / scale
            wait = due - time.perf_counter()
            while wait > 0 and not self._stop.is_set():
                # plain sleeps (a wait_for per request costs a task); stop() is seen within 0.2 s
                await asyncio.sleep(min(wait, 0.2))
                wait = due - time.perf_counter()
            if self._stop.is_set() or (end is not None and time.perf_counter() > end):
                break
            prompt = self._prompt(i)
            order = range(n_targets) if i % 2 == 0 else reversed(range(n_targets))
            for k in order:
                self._spawn(self._one(s, k, i, due, prompt))
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def _closed_loop(self, s, t_start: float) -> None:
        end = None if self.duration_s is None else t_start + self.duration_s
        n = len(self.plan)

        async def worker(k: int, counter: list[int]) -> None:
            while not self._stop.is_set():
                i = counter[0]
                if i >= n or (end is not None and time.perf_counter() > end):
                    return
                counter[0] += 1
                await self._one(s, k, i, time.perf_counter(), self._prompt(i))

        counters = [[0] for _ in self.targets]
        for k in range(len(self.targets)):
            for _ in range(self.concurrency):
                self._spawn(worker(k, counters[k]))
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def _ticker(self) -> None:
        while not self._stop.is_set():
            self._progress.draw(self._done, self._failed)
            try:
                await asyncio.wait_for(self._stop.wait(), 0.25)
            except asyncio.TimeoutError:
                pass

    async def run(self, sampler=None) -> list[Outcome]:
        loop = asyncio.get_running_loop()
        handled = False
        try:
            loop.add_signal_handler(signal.SIGINT, self.stop)
            handled = True
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass
        sampling_done = asyncio.Event()
        side = [asyncio.ensure_future(self._ticker())]
        if sampler is not None:
            side.append(asyncio.ensure_future(sampler.run(sampling_done)))
        try:
            async with Streamer(self.timeout_s) as s:
                t_start = time.perf_counter() + 0.01
                if self.concurrency is None:
                    await self._open_loop(s, t_start)
                else:
                    await self._closed_loop(s, t_start)
                t_end = time.perf_counter()
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGINT)
            sampling_done.set()
            self._stop.set()  # ends the ticker; ``interrupted`` is set by stop() only
            await asyncio.gather(*side, return_exceptions=True)
        self._progress.draw(self._done, self._failed, final=True)
        for out in self.outcomes:
            out.results.sort(key=lambda r: r.index)
            out.duration_s = t_end - t_start  # as bench_serving: first send to last answer
        return self.outcomes
