"""``TraceSummary`` (what the advisor and the knowledge base get) and ``Summarizer``, which builds it
from a stream of ``Request`` records in constant memory (see ``traces.stats`` for the sketches).

Definitions (the user-facing version is the reference section of ``examples/traces/README.md``):

- ``n_requests`` counts every request read (after ``--window`` / ``--sample``), failed ones included;
  ``n_failed`` those marked failed; ``n_bad`` malformed lines skipped with ``skip_bad``.
- Arrival statistics use every timed request (failed ones arrived too): ``duration_s`` = last - first
  arrival, ``rate_rps`` = (n - 1) / duration = 1 / mean inter-arrival gap, ``burstiness_cv`` = standard
  deviation / mean of the gaps (1 for Poisson arrivals, > 1 bursty, < 1 regular), ``peak_rps_1min`` the
  highest rate over any 60 s window.
- Length statistics (``isl``, ``osl``, histograms, ``sample``) use completed requests only.
- ``ctx_cv`` / ``ctx_max_over_median``: the spread of context lengths inside one decode batch at
  ``ctx_concurrency`` requests in flight, by a seeded simulation: a request stays in the decode batch
  for as many steps as it has output tokens, so batch members are drawn with probability proportional
  to ``max(output_len, 1)``, each at a uniform point of its decode (context = input + tokens decoded so
  far); 256 batches; the medians over batches of std/mean and max/median are reported.
- ``prefix_reuse``: fraction of ``hash_ids`` blocks seen earlier in the trace (KV a prefix cache could
  reuse, with unlimited capacity); ``cached_fraction``: cached prompt tokens / prompt tokens where
  the trace reports cached tokens (OpenAI logs).
- ``implied_concurrency(latency_s)`` = rate x latency (Little's law).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from itertools import chain, islice

import numpy as np

from hpc_advise.advisor.traces.source import Request
from hpc_advise.advisor.traces.stats import (
    QUANTILE_REL_ERROR,
    Arrivals,
    LengthSketch,
    PrefixTracker,
    PrefixWindow,
    Reservoir,
    splitmix64,
)

SCHEMA_VERSION = 1
SAMPLE_SIZE = 2048
DEFAULT_CONCURRENCY = 64
SPREAD_BATCHES = 256
CHUNK = 1 << 16
_SAMPLE_SEED = np.uint64(0xC0FFEE)


def context_spread(
    pairs: np.ndarray | list, concurrency: int, *, batches: int = SPREAD_BATCHES, seed: int = 0
) -> tuple[float | None, float | None]:
    """``(cv, max_over_median)`` of decode-batch context lengths at ``concurrency`` (see module doc)."""
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if arr.shape[0] < 2 or concurrency < 2:
        return None, None
    isl, osl = arr[:, 0], arr[:, 1]
    weights = np.maximum(osl, 1).astype(np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.choice(arr.shape[0], size=(batches, concurrency), p=weights / weights.sum())
    ctx = isl[idx] + np.floor(rng.random((batches, concurrency)) * osl[idx])
    mean = ctx.mean(axis=1)
    ok = mean > 0
    if not ok.any():
        return None, None
    cv = ctx.std(axis=1)[ok] / mean[ok]
    med = np.median(ctx, axis=1)
    ratio = ctx.max(axis=1)[med > 0] / med[med > 0]
    return float(np.median(cv)), (float(np.median(ratio)) if ratio.size else None)


@dataclass
class TraceSummary:
    """A workload described by its trace. ``to_dict()`` is JSON-ready and what the KB stores."""

    source: str
    format: str
    n_requests: int
    n_failed: int
    n_bad: int
    duration_s: float | None
    rate_rps: float | None
    burstiness_cv: float | None
    peak_rps_1min: float | None
    isl: dict
    osl: dict
    total_input_tokens: int
    total_output_tokens: int
    cached_fraction: float | None
    prefix_reuse: float | None
    prefix_block_size: int | None
    prefix_blocks: int
    ctx_concurrency: int
    ctx_cv: float | None
    ctx_max_over_median: float | None
    sample: list = field(default_factory=list)
    histograms: dict = field(default_factory=dict)
    selection: dict = field(default_factory=dict)
    observed: dict | None = None
    notes: list = field(default_factory=list)
    quantile_rel_error: float = QUANTILE_REL_ERROR
    schema_version: int = SCHEMA_VERSION

    def implied_concurrency(self, latency_s: float) -> float | None:
        """Requests in flight at the mean arrival rate if each takes ``latency_s`` (Little's law)."""
        if self.rate_rps is None:
            return None
        return self.rate_rps * latency_s

    def context_spread(self, concurrency: int, *, seed: int = 0) -> tuple[float | None, float | None]:
        """``(cv, max_over_median)`` of decode-batch contexts at another concurrency (same method)."""
        return context_spread(self.sample, concurrency, seed=seed)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TraceSummary:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})


def _percentiles_ms(values: list[float]) -> dict | None:
    if not values:
        return None
    arr = np.asarray(values) * 1000.0
    return {
        "n": int(arr.size),
        "p50": float(np.percentile(arr, 50)),
        "p90": float(np.percentile(arr, 90)),
        "p99": float(np.percentile(arr, 99)),
        "mean": float(arr.mean()),
    }


@dataclass
class Columns:
    """A chunk of requests as arrays: ``t`` and ``cached`` are float64 with NaN for "none";
    ``hashes`` holds every request's ``hash_ids`` one after the other, ``hash_counts`` how many each;
    ``lines`` (when known) the line each request came from."""

    t: np.ndarray
    n_in: np.ndarray
    n_out: np.ndarray
    cached: np.ndarray
    failed: np.ndarray
    hash_counts: np.ndarray
    hashes: np.ndarray
    block_sizes: set
    lines: np.ndarray | None = None
    # per request, only when the chunk mixes block sizes (0 = no hash_ids)
    each_block_size: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.t.size)

    def request_arrays(self) -> tuple[np.ndarray, ...]:
        """(t, n_in, n_out, cached, failed, hashes): the arrays a summary reads."""
        return self.t, self.n_in, self.n_out, self.cached, self.failed, self.hashes

    def requests(self) -> Iterator[Request]:
        """The chunk as ``Request`` records (``hash_ids`` as tuples of their 64-bit values)."""
        block = next(iter(self.block_sizes)) if len(self.block_sizes) == 1 else None
        each = None if self.each_block_size is None else self.each_block_size.tolist()
        counts = self.hash_counts.tolist()
        hashes = self.hashes.tolist()
        pos = 0
        for i, (t, n_in, n_out, cached, failed, k) in enumerate(
            zip(
                self.t.tolist(),
                self.n_in.tolist(),
                self.n_out.tolist(),
                self.cached.tolist(),
                self.failed.tolist(),
                counts,
                strict=True,
            )
        ):
            ids = None
            if k:
                ids = tuple(hashes[pos : pos + k])
                pos += k
            yield Request(
                None if t != t else t,
                n_in,
                n_out,
                None if cached != cached else int(cached),
                failed,
                ids,
                None if ids is None else (block if each is None else each[i]),
            )

    def select(self, keep: np.ndarray) -> Columns:
        hashes = self.hashes[np.repeat(keep, self.hash_counts)] if self.hashes.size else self.hashes
        return Columns(
            self.t[keep],
            self.n_in[keep],
            self.n_out[keep],
            self.cached[keep],
            self.failed[keep],
            self.hash_counts[keep],
            hashes,
            self.block_sizes,
            None if self.lines is None else self.lines[keep],
            None if self.each_block_size is None else self.each_block_size[keep],
        )


def to_columns(chunk: list, lines: list[int] | None = None) -> Columns:
    """``Columns`` of a list of ``Request`` records."""
    n = len(chunk)
    if n == 0:
        empty_f, empty_i = np.empty(0), np.empty(0, dtype=np.int64)
        return Columns(
            empty_f,
            empty_i,
            empty_i,
            empty_f,
            np.empty(0, dtype=bool),
            empty_i,
            np.empty(0, dtype=np.uint64),
            set(),
        )
    columns = list(zip(*chunk, strict=True))
    hash_lists = columns[5]
    n_none = hash_lists.count(None)
    block_sizes: set = set()
    if n_none == n:
        hash_counts = np.zeros(n, dtype=np.int64)
        hashes = np.empty(0, dtype=np.uint64)
    else:
        if n_none:
            hash_lists = [h or () for h in hash_lists]
        hash_counts = np.fromiter(map(len, hash_lists), dtype=np.int64, count=n)
        hashes = _as_uint64(chain.from_iterable(hash_lists), int(hash_counts.sum()))
        block_sizes = set(columns[6]) - {None}
    each = None
    if len(block_sizes) > 1:
        each = np.array([b or 0 for b in columns[6]], dtype=np.int64)
    return Columns(
        np.array(columns[0], dtype=np.float64),  # None -> NaN
        np.array(columns[1], dtype=np.int64),
        np.array(columns[2], dtype=np.int64),
        np.array(columns[3], dtype=np.float64),
        np.array(columns[4], dtype=bool),
        hash_counts,
        hashes,
        block_sizes,
        None if lines is None else np.array(lines, dtype=np.int64),
        each,
    )


class Summarizer:
    """Accumulates requests chunk-wise. ``sample``: keep each request with this probability (by a
    hash of its position, so repeatable); ``time_range``: keep only arrivals in ``[start, end)``."""

    def __init__(
        self,
        *,
        reorder_s: float,
        sample: float | None = None,
        time_range: tuple[float, float] | None = None,
    ) -> None:
        self.sample = sample
        self.time_range = time_range
        self.isl = LengthSketch()
        self.osl = LengthSketch()
        self.arrivals = Arrivals(reorder_s)
        self.reservoir = Reservoir(SAMPLE_SIZE)
        self.prefix = PrefixTracker()
        self.prefix_window = PrefixWindow()
        self.block_sizes: set[int] = set()
        self.n_read = 0
        self.n = 0
        self.n_failed = 0
        self.n_untimed = 0
        self.cached = 0
        self.cached_of = 0

    def consume(self, requests) -> None:
        """Add every request of an iterable (pulled ``CHUNK`` at a time)."""
        it = iter(requests)
        while True:
            chunk = list(islice(it, CHUNK))
            if not chunk:
                return
            self.add_columns(to_columns(chunk))

    def add(self, request: Request) -> None:
        self.add_columns(to_columns([request]))

    def add_columns(self, cols: Columns) -> None:
        t, n_in, n_out, cached, failed, hashes = cols.request_arrays()
        self.block_sizes |= cols.block_sizes
        first_index = self.n_read
        self.n_read += t.size

        keep = np.ones(t.size, dtype=bool)
        if self.sample is not None and self.sample < 1.0:
            idx = np.arange(first_index, first_index + t.size, dtype=np.uint64)
            keep &= splitmix64(idx ^ _SAMPLE_SEED) < np.uint64(int(self.sample * 2.0**64 - 1))
        if self.time_range is not None:
            start, end = self.time_range
            keep &= (t >= start) & (t < end)  # NaN (untimed) compares False: dropped
        if not keep.all():
            cols = cols.select(keep)
            t, n_in, n_out, cached, failed, hashes = cols.request_arrays()
        if t.size == 0:
            return

        self.n += int(t.size)
        self.n_failed += int(failed.sum())
        timed = ~np.isnan(t)
        self.n_untimed += int((~timed).sum())
        self.arrivals.add(t[timed])
        ok = ~failed
        self.isl.add(n_in[ok])
        self.osl.add(n_out[ok])
        self.reservoir.add(n_in[ok], n_out[ok])
        known = ok & ~np.isnan(cached)
        self.cached += int(cached[known].sum())
        self.cached_of += int(n_in[known].sum())
        self.prefix.add(hashes)
        self.prefix_window.add(t, n_in, n_out, cols.hash_counts, hashes)

    def result(
        self,
        *,
        source: str,
        fmt: str,
        n_bad: int,
        concurrency: int | None,
        meta: dict | None = None,
    ) -> TraceSummary:
        self.arrivals.finish()
        meta = meta or {}
        arrivals = self.arrivals
        duration = arrivals.duration
        rate = None
        if duration is not None and duration > 0 and arrivals.n >= 2:
            rate = (arrivals.n - 1) / duration
        elif meta.get("duration_s"):
            duration = float(meta["duration_s"])
            rate = self.n / duration
        conc = DEFAULT_CONCURRENCY if concurrency is None else int(concurrency)
        pairs = self.reservoir.pairs
        cv, mom = context_spread(pairs, conc)
        notes: list[str] = []
        if self.n_untimed and arrivals.n:
            notes.append(f"{self.n_untimed} requests without a timestamp (left out of arrival statistics)")
        if self.n_untimed and not arrivals.n and rate is None:
            notes.append("no arrival timestamps in this format: duration, rate and burstiness unknown")
        if meta.get("token_counter"):
            notes.append(f"token counts from text: {meta['token_counter']}")
        if len(self.block_sizes) > 1:
            notes.append(f"mixed prefix block sizes {sorted(self.block_sizes)}")
        observed = None
        obs = meta.get("observed")
        if obs and (obs.get("ttft_s") or obs.get("tpot_s")):
            observed = {
                "ttft_ms": _percentiles_ms(obs.get("ttft_s", [])),
                "tpot_ms": _percentiles_ms(obs.get("tpot_s", [])),
            }
        summary = TraceSummary(
            source=source,
            format=fmt,
            n_requests=self.n,
            n_failed=self.n_failed,
            n_bad=n_bad,
            duration_s=duration,
            rate_rps=rate,
            burstiness_cv=arrivals.gaps.cv,
            peak_rps_1min=arrivals.peak_rate(60.0),
            isl=self.isl.stats(),
            osl=self.osl.stats(),
            total_input_tokens=self.isl.total,
            total_output_tokens=self.osl.total,
            cached_fraction=(self.cached / self.cached_of) if self.cached_of else None,
            prefix_reuse=self.prefix.reuse,
            prefix_block_size=min(self.block_sizes) if self.block_sizes else None,
            prefix_blocks=self.prefix.blocks,
            ctx_concurrency=conc,
            ctx_cv=cv,
            ctx_max_over_median=mom,
            sample=pairs.tolist(),
            histograms={"isl": self.isl.octaves(), "osl": self.osl.octaves()},
            selection={"n_read": self.n_read},
            observed=observed,
            notes=notes,
        )
        # not a field: the advisor's finite-cache replay reads it; a stored summary has none
        summary.prefix_window = self.prefix_window if self.prefix_window.n_blocks else None
        return summary


def _as_uint64(values, count: int) -> np.ndarray:
    """``count`` integers as uint64 (ids beyond 64 bits keep their low 64 bits)."""
    values = list(values)
    try:
        return np.fromiter(values, dtype=np.int64, count=count).astype(np.uint64)
    except OverflowError:
        return np.array([v & 0xFFFFFFFFFFFFFFFF for v in values], dtype=np.uint64)
