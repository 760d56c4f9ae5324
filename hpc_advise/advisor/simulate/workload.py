"""The requests a simulation replays, as arrays, and the windows of a long trace worth simulating.

``Workload`` holds, per request: arrival (seconds, sorted), prompt and output tokens, the prompt's
prefix-block hashes (Mooncake / Bailian ``hash_ids``; ``block_size`` tokens each) or a count of
cached prompt tokens (OpenAI logs' ``cached_tokens``), and ``max_new_tokens`` (the scheduler reserves
KV by it; ``bench_serving`` sends the output length with ``ignore_eos``, the default here).
``Workload.from_requests`` takes the ``Request`` records ``hpc_advise.advisor.traces.read_trace``
yields (any object with their fields).

``select_windows`` picks what to simulate of a trace too long to replay for every candidate: the
busiest stretch (most prompt + output tokens arriving in ``window_s``) and a seeded sample of other
stretches of the same length, each with a warm-up lead-in whose requests are simulated (they fill the
batch and the prefix cache) but not measured.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

# prompt hashes up to which ``Workload.prompt_chains`` keeps chains (~22 MiB at 60 blocks a prompt)
SHARED_CHAIN_HASHES = 1 << 18


class WorkloadError(ValueError):
    """A workload the simulator cannot replay (one line, for the CLI)."""


@dataclass
class Workload:
    arrival_s: np.ndarray  # float64, non-decreasing
    input_len: np.ndarray  # int64
    output_len: np.ndarray  # int64, >= 1
    cached: np.ndarray  # int64, cached prompt tokens from the trace; -1 = not given
    hash_offsets: np.ndarray  # int64 [n + 1]: request i's hashes are hashes[off[i]:off[i+1]]
    hashes: np.ndarray  # int64
    block_size: int | None = None
    max_new_tokens: np.ndarray | None = None  # int64; None = output_len

    def __post_init__(self) -> None:
        n = self.arrival_s.size
        for name in ("input_len", "output_len", "cached"):
            if getattr(self, name).size != n:
                raise WorkloadError(
                    f"workload: {name} has {getattr(self, name).size} values for {n} requests"
                )
        if self.hash_offsets.size != n + 1:
            raise WorkloadError("workload: hash_offsets must have one more value than requests")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise WorkloadError("workload: arrival times must be sorted")
        if n and int(self.output_len.min()) < 1:
            raise WorkloadError("workload: every request must generate at least one token")
        if n and int(self.input_len.min()) < 1:
            raise WorkloadError("workload: every request needs at least one prompt token")
        if self.hashes.size and not self.block_size:
            raise WorkloadError("workload: prefix hashes need a block size")

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def has_hashes(self) -> bool:
        return bool(self.hashes.size)

    def prompt_chains(self) -> dict | None:
        """Where the simulator keeps each request's prompt chain (``engine``) across replays of this
        workload, which the capacity search replays at several loads; None past
        ``SHARED_CHAIN_HASHES`` hashes: a replay then builds its own and drops each when its request
        finishes."""
        if self.hashes.size > SHARED_CHAIN_HASHES:
            return None
        if "_chains" not in self.__dict__:
            self._chains: dict = {}
        return self._chains

    @classmethod
    def from_requests(cls, records, block_size: int | None = None) -> Workload:
        """From ``Request``-like records (``t``, ``input_len``, ``output_len``, ``cached``, ``failed``,
        ``hash_ids``, ``block_size``). Failed requests and those generating no token are skipped; a
        missing ``t`` is 0 (closed-loop replays ignore arrivals). Records are sorted by arrival."""
        t, n_in, n_out, cached, counts, hashes = [], [], [], [], [], []
        for r in records:
            if getattr(r, "failed", False) or r.output_len < 1 or r.input_len < 1:
                continue
            t.append(0.0 if r.t is None else float(r.t))
            n_in.append(r.input_len)
            n_out.append(r.output_len)
            c = getattr(r, "cached", None)
            cached.append(-1 if c is None else int(c))
            h = getattr(r, "hash_ids", None) or ()
            counts.append(len(h))
            hashes.extend(h)
            bs = getattr(r, "block_size", None)
            if h and block_size is None:
                block_size = bs
            elif h and bs is not None and bs != block_size:
                raise WorkloadError(f"workload: block sizes {block_size} and {bs} in one trace")
        if hashes and not block_size:
            raise WorkloadError("workload: the trace has hash_ids but no block size; give block_size")
        arrival = np.asarray(t, dtype=np.float64)
        order = np.argsort(arrival, kind="stable")
        off = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(np.asarray(counts, dtype=np.int64), out=off[1:])
        w = cls(
            arrival,
            np.asarray(n_in, dtype=np.int64),
            np.asarray(n_out, dtype=np.int64),
            np.asarray(cached, dtype=np.int64),
            off,
            np.asarray(hashes, dtype=np.int64),
            block_size if hashes else None,
        )
        if np.all(order == np.arange(order.size)):
            return w
        return w.select(order)

    def select(self, idx: np.ndarray) -> Workload:
        """The requests at ``idx`` (in that order; keep it sorted by arrival)."""
        idx = np.asarray(idx, dtype=np.int64)
        counts = (self.hash_offsets[1:] - self.hash_offsets[:-1])[idx]
        off = np.zeros(idx.size + 1, dtype=np.int64)
        np.cumsum(counts, out=off[1:])
        if self.hashes.size and idx.size:
            starts = self.hash_offsets[idx]
            gather = np.repeat(starts - off[:-1], counts) + np.arange(int(off[-1]), dtype=np.int64)
            hashes = self.hashes[gather]
        else:
            hashes = self.hashes[:0]
        return Workload(
            self.arrival_s[idx],
            self.input_len[idx],
            self.output_len[idx],
            self.cached[idx],
            off,
            hashes,
            self.block_size,
            None if self.max_new_tokens is None else self.max_new_tokens[idx],
        )


def tiled(w: Workload, copies: int, period_s: float) -> Workload:
    """``w`` repeated ``copies`` times, copy j's arrivals ``j * period_s`` later, so a window can be
    replayed for longer than its own span (at a high load factor its requests arrive within less than
    one request's lifetime: one burst, absorbed, where the same rate sustained would not be). Each
    copy's prefix hashes are offset past the previous copy's, so a copy finds no cached prefix of an
    earlier copy (a sustained trace brings new sessions)."""
    if copies <= 1:
        return w
    n = len(w)
    stride = int(w.hashes.max()) + 1 if w.hashes.size else 0
    counts = w.hash_offsets[1:] - w.hash_offsets[:-1]
    cnt = np.tile(counts, copies)
    off = np.zeros(cnt.size + 1, dtype=np.int64)
    np.cumsum(cnt, out=off[1:])
    hashes = np.concatenate([w.hashes + j * stride for j in range(copies)]) if w.hashes.size else w.hashes
    return Workload(
        np.concatenate([w.arrival_s + j * period_s for j in range(copies)]),
        np.tile(w.input_len, copies),
        np.tile(w.output_len, copies),
        np.tile(w.cached, copies),
        off,
        hashes,
        w.block_size,
        None if w.max_new_tokens is None else np.tile(w.max_new_tokens, copies),
    ) if n else w


@dataclass(frozen=True)
class Window:
    """A stretch of the trace to simulate: requests arriving in [start_s - warmup_s, end_s) are
    replayed; those in [start_s, end_s) are measured."""

    kind: str  # "busiest" or "sample"
    start_s: float
    end_s: float
    warmup_s: float
    n_requests: int  # measured requests
    tokens_per_s: float  # prompt + output tokens arriving per second in the window

    def describe(self, origin_s: float = 0.0) -> str:
        """One line for the report; times in seconds after ``origin_s`` (the trace's first arrival)."""
        return (
            f"{self.kind} window {self.start_s - origin_s:.0f}-{self.end_s - origin_s:.0f} s of the trace "
            f"({self.n_requests} requests, {self.tokens_per_s:,.0f} tok/s arriving; "
            f"{self.warmup_s:.0f} s warm-up before it)"
        )

    @property
    def period_s(self) -> float:
        """Warm-up plus window: the spacing of ``tiled`` copies of the window's requests."""
        return self.warmup_s + (self.end_s - self.start_s)

    def shifted(self, by_s: float) -> Window:
        """The same window ``by_s`` later (the last of ``tiled`` copies)."""
        return replace(self, start_s=self.start_s + by_s, end_s=self.end_s + by_s)

    def indices(self, arrival_s: np.ndarray) -> tuple[np.ndarray, float]:
        """(indices of the requests to replay, the measured start in the same time base)."""
        lo = int(np.searchsorted(arrival_s, self.start_s - self.warmup_s, side="left"))
        hi = int(np.searchsorted(arrival_s, self.end_s, side="left"))
        return np.arange(lo, hi, dtype=np.int64), self.start_s


def select_windows(
    arrival_s: np.ndarray,
    tokens: np.ndarray,
    window_s: float = 300.0,
    n_samples: int = 2,
    warmup_s: float = 60.0,
    seed: int = 0,
) -> list[Window]:
    """The busiest ``window_s`` of a trace (most ``tokens`` arriving: prompt + output per request)
    and up to ``n_samples`` other windows of that length drawn with ``seed``, not overlapping the
    busiest (with its warm-up) or each other. Takes bare arrays (sorted arrivals) so that a long
    trace's windows are chosen before its requests are loaded. A trace shorter than one window is
    one window: the whole trace, no warm-up."""
    t = np.asarray(arrival_s, dtype=np.float64)
    load = np.asarray(tokens, dtype=np.float64)
    if t.size == 0:
        raise WorkloadError("workload: no requests")
    if load.size != t.size:
        raise WorkloadError("select_windows: one token count per arrival")
    span = float(t[-1] - t[0])
    cum = np.zeros(t.size + 1)
    np.cumsum(load, out=cum[1:])
    if span <= window_s:
        return [
            Window(
                "busiest",
                float(t[0]),
                float(t[-1]) + 1e-9,
                0.0,
                int(t.size),
                float(cum[-1]) / max(span, 1e-9),
            )
        ]
    # Candidate starts: every arrival that leaves a full window before the trace ends.
    starts = t[t <= t[-1] - window_s]
    ends = np.searchsorted(t, starts + window_s, side="left")
    begins = np.searchsorted(t, starts, side="left")
    best = int(np.argmax(cum[ends] - cum[begins]))

    def make(kind: str, s: float) -> Window:
        lo = int(np.searchsorted(t, s, side="left"))
        hi = int(np.searchsorted(t, s + window_s, side="left"))
        return Window(
            kind,
            s,
            s + window_s,
            min(warmup_s, s - float(t[0])),
            hi - lo,
            float(cum[hi] - cum[lo]) / window_s,
        )

    out = [make("busiest", float(starts[best]))]
    rng = np.random.default_rng(seed)
    taken = [(out[0].start_s - warmup_s, out[0].end_s)]
    tries = 0
    while len(out) < 1 + n_samples and tries < 50 * (n_samples + 1):
        tries += 1
        s = float(rng.uniform(t[0], t[-1] - window_s))
        if any(s + window_s > a and s - warmup_s < b for a, b in taken):
            continue
        out.append(make("sample", s))
        taken.append((s - warmup_s, s + window_s))
    return out
