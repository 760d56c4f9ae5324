"""Constant-memory streaming statistics used by the trace summary. All take numpy chunks.

- ``LengthSketch``: token-length histogram with exact counts: one bin per value below 1024, then 64
  log-spaced bins per octave. Quantiles are nearest-rank and exact below 1024 tokens; above, the
  reported value is the bin's geometric centre, within 0.55 % (2^(1/128) - 1) of the true order
  statistic. Count, sum, min and max are exact. ~2.6 k bins = 21 KB whatever the trace size.
- ``Moments``: count / mean / variance merged chunk by chunk (Chan et al.'s parallel update).
- ``Arrivals``: arrival times, re-sorted within a bounded reorder window, giving duration, the
  inter-arrival gap moments (burstiness = CV of gaps) and per-bucket counts (1 s buckets, doubled in
  width whenever there would be more than 2^20 of them) for peak rates and the busiest window.
- ``Reservoir``: a fixed-size uniform sample of (input, output) pairs: every item gets a priority
  ``splitmix64(index)`` and the ``size`` smallest priorities are kept (deterministic, independent of
  chunk boundaries).
- ``PrefixTracker``: fraction of prefix blocks (``hash_ids``) seen before, via a blocked Bloom filter
  (2^22 64-bit words = 32 MiB; each id sets 3 bits of one word) plus exact de-duplication inside each
  chunk. A false positive can only count a new block as seen; for n distinct blocks the rate is
  E[(1 - (63/64)^(3X))^3] with X ~ Poisson(n / 2^22): 0.004 % at n = 1 M, 0.04 % at 4 M, 0.18 % at
  8.6 M, 1.9 % at 25 M.
- ``PrefixWindow``: the first requests of the trace (file order) with their ``hash_ids``, up to
  ``max_blocks`` ids in all: a bounded stretch the advisor replays through a finite prefix cache
  (``advisor.prefix_cache``) to see how much of ``PrefixTracker``'s unlimited reuse a KV pool keeps.
"""

from __future__ import annotations

import numpy as np

LINEAR = 1024
PER_OCTAVE = 64
OCTAVES = 26
N_BINS = LINEAR + PER_OCTAVE * OCTAVES
QUANTILE_REL_ERROR = 2 ** (1 / (2 * PER_OCTAVE)) - 1

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser of ``x`` (uint64, wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64, copy=True) + _M1
        z = (z ^ (z >> np.uint64(30))) * _M2
        z = (z ^ (z >> np.uint64(27))) * _M3
        return z ^ (z >> np.uint64(31))


def length_bins(values: np.ndarray) -> np.ndarray:
    idx = values.astype(np.int64, copy=True)
    big = idx >= LINEAR
    if big.any():
        idx[big] = LINEAR + np.floor(PER_OCTAVE * np.log2(values[big] / LINEAR)).astype(np.int64)
    return idx


def bin_lower(i: int) -> float:
    return float(i) if i < LINEAR else LINEAR * 2 ** ((i - LINEAR) / PER_OCTAVE)


class LengthSketch:
    """Histogram of non-negative token lengths (see module docstring for the error bound)."""

    def __init__(self) -> None:
        self.counts = np.zeros(N_BINS, dtype=np.int64)
        self.n = 0
        self.total = 0
        self.min: int | None = None
        self.max: int | None = None

    def add(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        self.counts += np.bincount(length_bins(values), minlength=N_BINS)[:N_BINS]
        self.n += int(values.size)
        self.total += int(values.sum(dtype=np.int64))
        lo, hi = int(values.min()), int(values.max())
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)

    def quantile(self, q: float) -> int | None:
        """Nearest-rank quantile: the smallest value with at least ``ceil(q * n)`` values <= it."""
        if self.n == 0:
            return None
        rank = max(1, int(np.ceil(q * self.n - 1e-9)))
        i = int(np.searchsorted(np.cumsum(self.counts), rank))
        if i < LINEAR:
            return i
        centre = LINEAR * 2 ** ((i - LINEAR + 0.5) / PER_OCTAVE)
        return int(round(min(max(centre, self.min), self.max)))

    def stats(self) -> dict[str, float | int | None]:
        if self.n == 0:
            return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None}
        return {
            "p50": self.quantile(0.50),
            "p90": self.quantile(0.90),
            "p99": self.quantile(0.99),
            "max": self.max,
            "mean": self.total / self.n,
        }

    def octaves(self) -> list[list[int]]:
        """Counts per power-of-two range ``[lo, hi)`` (``[0, 1)`` first), empty ranges left out."""
        out: list[list[int]] = []
        if self.n == 0:
            return out
        nz = np.nonzero(self.counts)[0]
        bounds = [0, 1]
        while bounds[-1] <= (self.max or 0):
            bounds.append(bounds[-1] * 2)
        lows = np.array([bin_lower(int(i)) for i in nz])
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            sel = (lows >= lo) & (lows < hi)
            c = int(self.counts[nz[sel]].sum())
            if c:
                out.append([lo, hi, c])
        return out


class Moments:
    """Streaming count, mean and variance (population) merged per chunk."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0

    def add(self, x: np.ndarray) -> None:
        nb = int(x.size)
        if nb == 0:
            return
        mb = float(x.mean())
        m2b = float(((x - mb) ** 2).sum())
        total = self.n + nb
        delta = mb - self.mean
        self.mean += delta * nb / total
        self.m2 += m2b + delta * delta * self.n * nb / total
        self.n = total

    @property
    def cv(self) -> float | None:
        if self.n < 2 or self.mean <= 0:
            return None
        return float(np.sqrt(self.m2 / self.n) / self.mean)


MAX_BUCKETS = 1 << 20


class Arrivals:
    """Arrival times: bounded re-sorting, gap moments, per-bucket counts (see module docstring)."""

    def __init__(self, reorder_s: float) -> None:
        self.reorder_s = reorder_s
        self.pending = np.empty(0)
        self.max_seen = -np.inf
        self.first: float | None = None
        self.last: float | None = None
        self.n = 0
        self.gaps = Moments()
        self.width = 1.0
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, ts: np.ndarray) -> None:
        if ts.size == 0:
            return
        self.max_seen = max(self.max_seen, float(ts.max()))
        merged = np.sort(np.concatenate([self.pending, ts]))
        cut = int(np.searchsorted(merged, self.max_seen - self.reorder_s, side="right"))
        self._emit(merged[:cut])
        self.pending = merged[cut:]

    def finish(self) -> None:
        self._emit(self.pending)
        self.pending = np.empty(0)

    def _emit(self, ts: np.ndarray) -> None:
        if ts.size == 0:
            return
        if self.first is None:
            self.first = float(ts[0])
            seq = ts
        else:
            seq = np.concatenate([[self.last], ts])
        self.gaps.add(np.diff(seq))
        self.last = float(ts[-1])
        self.n += int(ts.size)
        self._count(ts)

    def _count(self, ts: np.ndarray) -> None:
        rel = ts - self.first
        while float(rel[-1]) / self.width >= MAX_BUCKETS:
            if self.counts.size % 2:
                self.counts = np.append(self.counts, 0)
            self.counts = self.counts.reshape(-1, 2).sum(axis=1)
            self.width *= 2
        idx = (rel / self.width).astype(np.int64)
        add = np.bincount(idx)
        if add.size > self.counts.size:
            self.counts = np.concatenate([self.counts, np.zeros(add.size - self.counts.size, dtype=np.int64)])
        self.counts[: add.size] += add

    @property
    def duration(self) -> float | None:
        if self.first is None or self.last is None:
            return None
        return self.last - self.first

    def busiest(self, seconds: float) -> tuple[float, float, int]:
        """``(start, end, count)`` of the window of ``seconds`` (rounded up to whole buckets) holding
        the most arrivals; the whole trace if it is shorter."""
        k = max(1, int(np.ceil(seconds / self.width - 1e-9)))
        if self.first is None:
            raise ValueError("no timestamps")
        if k >= self.counts.size:
            return self.first, self.first + k * self.width, int(self.counts.sum())
        c = np.concatenate([[0], np.cumsum(self.counts)])
        sums = c[k:] - c[:-k]
        j = int(np.argmax(sums))
        start = self.first + j * self.width
        return start, start + k * self.width, int(sums[j])

    def peak_rate(self, seconds: float = 60.0) -> float | None:
        """Highest arrival rate over any window of ``seconds`` (at least one bucket); None when the
        trace is shorter than the window."""
        if self.duration is None or self.duration < seconds:
            return None
        start, end, count = self.busiest(seconds)
        return count / (end - start)


class Reservoir:
    """Fixed-size uniform sample of (input_len, output_len) pairs."""

    def __init__(self, size: int, seed: int = 0x5EED) -> None:
        self.size = size
        self.seed = np.uint64(seed)
        self.index = 0
        self.keys = np.empty(0, dtype=np.uint64)
        self.pairs = np.empty((0, 2), dtype=np.int64)

    def add(self, isl: np.ndarray, osl: np.ndarray) -> None:
        n = int(isl.size)
        if n == 0:
            return
        keys = splitmix64(np.arange(self.index, self.index + n, dtype=np.uint64) ^ self.seed)
        self.index += n
        keys = np.concatenate([self.keys, keys])
        pairs = np.concatenate([self.pairs, np.stack([isl, osl], axis=1).astype(np.int64)])
        if keys.size > self.size:
            keep = np.argpartition(keys, self.size - 1)[: self.size]
            keys, pairs = keys[keep], pairs[keep]
        order = np.argsort(keys, kind="stable")
        self.keys, self.pairs = keys[order], pairs[order]


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """Sorted distinct values (sort-based: numpy 2.4's hash-based ``np.unique`` is ~20x slower on
    large uint64 arrays)."""
    x = np.sort(x)
    if x.size < 2:
        return x
    return x[np.concatenate([[True], x[1:] != x[:-1]])]


BLOOM_WORDS = 1 << 22  # 64-bit words: 2^28 bits, 32 MiB


class PrefixTracker:
    """Counts prefix blocks already seen (see module docstring for the false-positive rate).

    A blocked Bloom filter: each id sets 3 bits of one 64-bit word (no sort of bit positions, one
    gather and one scatter per id). Ids repeated inside a chunk are counted exactly first.
    """

    def __init__(self) -> None:
        self.words: np.ndarray | None = None
        self.blocks = 0
        self.hits = 0

    def add(self, ids: np.ndarray) -> None:
        if ids.size == 0:
            return
        if self.words is None:
            self.words = np.zeros(BLOOM_WORDS, dtype=np.uint64)
        words = self.words
        uniq = _sorted_unique(ids.astype(np.uint64, copy=False))
        repeats = int(ids.size - uniq.size)  # later occurrences inside this chunk: seen before
        h = splitmix64(uniq)
        word = (h & np.uint64(BLOOM_WORDS - 1)).astype(np.int64)
        one = np.uint64(1)
        mask = (
            (one << ((h >> np.uint64(22)) & np.uint64(63)))
            | (one << ((h >> np.uint64(28)) & np.uint64(63)))
            | (one << ((h >> np.uint64(34)) & np.uint64(63)))
        )
        seen = (words[word] & mask) == mask
        # Insert after all look-ups (no false hits among this chunk's ids). A fancy-indexed |= keeps
        # one update per word, so repeat for the ids whose bits did not land (ids sharing a word).
        todo = np.arange(uniq.size)
        while todo.size:
            w, m = word[todo], mask[todo]
            words[w] |= m
            todo = todo[(words[w] & m) != m]
        self.blocks += int(ids.size)
        self.hits += repeats + int(seen.sum())

    @property
    def reuse(self) -> float | None:
        return None if self.blocks == 0 else self.hits / self.blocks


class PrefixWindow:
    """The first requests carrying ``hash_ids``, in file order, until ``max_blocks`` ids are held (the
    request that would pass the bound and all after it are left out). Arrays: ``t`` (NaN: none),
    ``n_in``, ``n_out``, ``counts`` (ids per request), ``hashes`` (uint64, one request after the
    other)."""

    def __init__(self, max_blocks: int = 1 << 16) -> None:
        self.max_blocks = max_blocks
        self.full = False
        self._t: list[np.ndarray] = []
        self._n_in: list[np.ndarray] = []
        self._n_out: list[np.ndarray] = []
        self._counts: list[np.ndarray] = []
        self._hashes: list[np.ndarray] = []
        self.n_blocks = 0

    def add(
        self, t: np.ndarray, n_in: np.ndarray, n_out: np.ndarray, counts: np.ndarray, hashes: np.ndarray
    ) -> None:
        if self.full or counts.size == 0:
            return
        ends = np.cumsum(counts)
        k = int(np.searchsorted(ends, self.max_blocks - self.n_blocks, side="right"))
        if k < counts.size:
            self.full = True
        if k == 0:
            return
        used = int(ends[k - 1])
        self._t.append(np.asarray(t[:k], dtype=np.float64))
        self._n_in.append(np.asarray(n_in[:k], dtype=np.int64))
        self._n_out.append(np.asarray(n_out[:k], dtype=np.int64))
        self._counts.append(np.asarray(counts[:k], dtype=np.int64))
        self._hashes.append(np.asarray(hashes[:used]).astype(np.uint64, copy=False))
        self.n_blocks += used

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(t, n_in, n_out, counts, hashes) of the requests held."""

        def cat(parts, dtype):
            return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

        return (
            cat(self._t, np.float64),
            cat(self._n_in, np.int64),
            cat(self._n_out, np.int64),
            cat(self._counts, np.int64),
            cat(self._hashes, np.uint64),
        )
