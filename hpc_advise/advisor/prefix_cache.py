"""The prefix reuse a candidate's own KV pools keep, replayed from a stretch of the trace.

The trace summary's ``prefix_reuse`` counts the ``hash_ids`` blocks seen before anywhere in the trace:
what one cache with unlimited capacity would reuse. A deployment has one radix cache per attention
group, of the KV pool that memory leaves it, and the requests spread over them. ``PrefixReuse``
replays the summary's ``PrefixWindow`` (the first requests of the trace, up to
``traces.stats.PrefixWindow.max_blocks`` block ids) through ``simulate.radix.BlockRadixCache``:

- requests are split over the replicas as ``simulate.replicas.split_replicas`` does (sgl-router's
  cache-aware policy when the trace has hashes), then round robin over each replica's attention-DP
  groups (SGLang 0.5.23 resolves ``--load-balance-method auto`` to ``round_robin`` outside PD
  disaggregation, ``arg_groups/serving_hook.py``: the data-parallel controller's dispatch does
  not look at the groups' caches, so a session's turns land on different groups);
- each group's cache matches the request's blocks (the hit), inserts them and evicts least recently
  used leaves down to the pool size in blocks.

The hit rate (blocks matched / blocks sent) at the candidate's pools, over the same window's hit rate
of one unlimited cache, is the share of the unlimited reuse the pools keep; the candidate's reuse is
the summary's reuse times that share (so a pool that holds the window's working set gets exactly the
summary's figure). What differs from a served replica: the pool holds only prompt blocks (the output
tokens of running requests, which also take pool pages, are not charged), and nothing is locked.
"""

from __future__ import annotations

import math

import numpy as np

from hpc_advise.advisor.simulate.radix import BlockRadixCache
from hpc_advise.advisor.simulate.replicas import split_replicas
from hpc_advise.advisor.simulate.workload import Workload


def replay_hits(hashes: list[list], pool_blocks: float) -> tuple[int, int]:
    """(blocks matched, blocks sent) when the prompts ``hashes`` (in arrival order) go through one
    radix cache holding at most ``pool_blocks`` blocks (``math.inf``: unlimited)."""
    cache = BlockRadixCache(1)
    hit = sent = 0
    for now, h in enumerate(hashes):
        n = len(h)
        if not n:
            continue
        _, m = cache.match(h, float(now))
        hit += m
        sent += n
        cache.insert(h, range(n + 1), n, float(now))
        if cache.total > pool_blocks:
            cache.evict(int(cache.total - pool_blocks))
    return hit, sent


class PrefixReuse:
    """Per-candidate prefix reuse from a ``PrefixWindow`` (``None``: every pool gets ``unlimited``).
    ``block_size``: tokens per hash block; ``unlimited``: the summary's whole-trace reuse."""

    def __init__(self, window, block_size: int | None, unlimited: float) -> None:
        self.unlimited = unlimited
        self.block_size = block_size or 0
        self._workload: Workload | None = None
        self._splits: dict = {}
        self._routed: dict = {}  # replicas -> ``split_replicas`` (shared by their attention-DP groups)
        self._hits: dict = {}
        self._base: float | None = None
        if window is None or not self.block_size or unlimited <= 0:
            return
        t, n_in, n_out, counts, hashes = window.arrays()
        t = np.where(np.isnan(t), 0.0, t)
        order = np.argsort(t, kind="stable")
        off = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=off[1:])
        w = Workload(
            t,
            np.maximum(n_in, 1),
            np.maximum(n_out, 1),
            np.full(t.size, -1, dtype=np.int64),
            off,
            hashes.view(np.int64),
            self.block_size,
        )
        self._workload = w if np.all(order == np.arange(order.size)) else w.select(order)
        off = self._workload.hash_offsets.tolist()
        flat = self._workload.hashes.tolist()
        self._chains = [flat[off[i] : off[i + 1]] for i in range(len(self._workload))]
        # a pool of at least this many blocks never evicts: the same hits as an unlimited one
        self._distinct = len(set(flat))
        hit, sent = replay_hits(self._chains, math.inf)
        self._base = hit / sent if sent else 0.0
        self._hits[(math.inf, 1, 1)] = self._base  # the same replay: one replica, one group, in order

    @property
    def replayed(self) -> bool:
        return self._workload is not None and bool(self._base)

    def _groups(self, replicas: int, groups: int) -> list[list[int]]:
        key = (replicas, groups)
        if key not in self._splits:
            if replicas not in self._routed:
                self._routed[replicas] = split_replicas(self._workload, replicas, "auto")
            out = []
            for idx in self._routed[replicas]:
                if groups == 1:
                    out.append(idx.tolist())
                else:
                    out += [idx[k::groups].tolist() for k in range(groups)]
            self._splits[key] = out
        return self._splits[key]

    def hit_rate(self, pool_tokens: float, replicas: int, groups: int = 1) -> float:
        """Blocks matched / blocks sent over the window with ``replicas`` x ``groups`` caches of
        ``pool_tokens`` tokens each (cached per distinct triple)."""
        pool = math.floor(pool_tokens / self.block_size) if math.isfinite(pool_tokens) else math.inf
        if pool >= self._distinct:
            pool = math.inf
        key = (pool, replicas, groups)
        if key not in self._hits:
            hit = sent = 0
            for part in self._groups(replicas, groups):
                h, s = replay_hits([self._chains[i] for i in part], pool)
                hit += h
                sent += s
            self._hits[key] = hit / sent if sent else 0.0
        return self._hits[key]

    def reuse(self, pool_tokens: float, replicas: int, groups: int = 1) -> float:
        """The prefix reuse a deployment of ``replicas`` x ``groups`` pools of ``pool_tokens`` keeps."""
        if not self.replayed:
            return self.unlimited
        share = self.hit_rate(pool_tokens, replicas, groups) / self._base
        return self.unlimited * min(share, 1.0)
