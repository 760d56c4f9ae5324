"""Several replicas behind a router: split the requests, simulate each replica, pool the results.

Round robin splits in arrival order. Prefix-aware follows sgl-router's ``cache_aware`` policy
(defaults ``--cache-threshold 0.3``, ``--balance-abs-threshold 64``, ``--balance-rel-threshold 1.5``):
when the loads are imbalanced (max - min > abs and max > rel * min) the least loaded replica takes
the request; otherwise the replica whose tree matches the largest share of the prompt's blocks, when
that share exceeds the threshold, else the replica with the smallest tree. The router's trees are
the block hashes each replica was sent (no eviction: sgl-router's default tree bound is far above
a window's size).

What differs: the split is made before simulating, so a replica's load (its requests in flight) is
estimated: a request counts as in flight for ``hold_s(input_len, output_len)`` seconds after its
arrival (default 2 s + 30 ms per output token). A closed loop of N clients gives each replica
N / replicas clients (rounded, at least 1).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hpc_advise.advisor.simulate.config import SchedulerConfig
from hpc_advise.advisor.simulate.cost import StepCost
from hpc_advise.advisor.simulate.engine import simulate
from hpc_advise.advisor.simulate.metrics import SimResult, merge
from hpc_advise.advisor.simulate.workload import Window, Workload, WorkloadError, tiled

CACHE_THRESHOLD = 0.3
BALANCE_ABS = 64
BALANCE_REL = 1.5


def _default_hold(n_in: int, n_out: int) -> float:
    return 2.0 + 0.03 * n_out


def split_replicas(
    workload: Workload,
    n_replicas: int,
    policy: str = "auto",
    *,
    cache_threshold: float = CACHE_THRESHOLD,
    balance_abs: int = BALANCE_ABS,
    balance_rel: float = BALANCE_REL,
    hold_s: Callable[[int, int], float] = _default_hold,
) -> list[np.ndarray]:
    """Indices of the requests each replica gets (each in arrival order). ``policy``: "round_robin",
    "prefix" (needs hashes) or "auto" (prefix when the trace has hashes)."""
    if n_replicas < 1:
        raise WorkloadError(f"replicas must be at least 1, not {n_replicas}")
    if policy not in ("auto", "round_robin", "prefix"):
        raise WorkloadError(f"router policy {policy!r}: known are auto, round_robin, prefix")
    n = len(workload)
    if policy == "auto":
        policy = "prefix" if workload.has_hashes else "round_robin"
    if policy == "prefix" and not workload.has_hashes:
        raise WorkloadError("prefix-aware routing needs a trace with hash_ids")
    if n_replicas == 1:
        return [np.arange(n, dtype=np.int64)]
    if policy == "round_robin":
        return [np.arange(k, n, n_replicas, dtype=np.int64) for k in range(n_replicas)]

    trees: list[set[int]] = [set() for _ in range(n_replicas)]
    inflight: list[list[float]] = [[] for _ in range(n_replicas)]
    dest = np.empty(n, dtype=np.int64)
    t = workload.arrival_s.tolist()
    off = workload.hash_offsets.tolist()
    hashes = workload.hashes.tolist()
    n_in = workload.input_len.tolist()
    n_out = workload.output_len.tolist()
    for i in range(n):
        now = t[i]
        loads = []
        for q in inflight:
            while q and q[0] <= now:
                heapq.heappop(q)
            loads.append(len(q))
        h = hashes[off[i] : off[i + 1]]
        hi, lo = max(loads), min(loads)
        if hi - lo > balance_abs and hi > balance_rel * lo:
            k = loads.index(lo)
        else:
            best, k = -1, 0
            for j, tree in enumerate(trees):
                m = 0
                for x in h:
                    if x not in tree:
                        break
                    m += 1
                if m > best:
                    best, k = m, j
            if not h or best / len(h) <= cache_threshold:
                sizes = [len(tr) for tr in trees]
                k = sizes.index(min(sizes))
        dest[i] = k
        trees[k].update(h)
        heapq.heappush(inflight[k], now + hold_s(n_in[i], n_out[i]))
    return [np.flatnonzero(dest == k) for k in range(n_replicas)]


@dataclass
class Split:
    """A workload (or one window of it) split over replicas once, for runs at several loads and
    costs (``split_for``): each replica's requests, and what the window measures."""

    parts: list[Workload]
    origin_s: float
    window: Window | None = None


def split_for(
    workload: Workload, n_replicas: int, policy: str = "auto", window: Window | None = None, copies: int = 1
) -> Split:
    """``split_replicas`` of ``workload`` (only ``window``'s requests and its warm-up's, when given;
    ``copies`` > 1: those ``workload.tiled`` that many times, the last copy's window measured).
    The split does not depend on the load: the router's in-flight estimate uses trace time."""
    if window is not None:
        idx, _ = window.indices(workload.arrival_s)
        origin = float(workload.arrival_s[idx[0]]) if idx.size else window.start_s
        workload = workload.select(idx)
        if copies > 1:
            workload = tiled(workload, copies, window.period_s)
            window = window.shifted((copies - 1) * window.period_s)
    else:
        origin = float(workload.arrival_s[0]) if len(workload) else 0.0
    parts = [workload.select(idx) for idx in split_replicas(workload, n_replicas, policy) if idx.size]
    return Split(parts, origin, window)


def run_split(
    split: Split,
    cost: StepCost,
    config: SchedulerConfig,
    *,
    concurrency: int | None = None,
    load: float = 1.0,
    drain_s: float | None = None,
    **simulate_kw,
) -> SimResult:
    """Simulate every part of ``split`` (same config and cost) and pool the results with
    ``metrics.merge``. With a window its own requests are measured and the run stops ``drain_s``
    simulated seconds after the window's end (default: max(120 s, twice the window's simulated
    length)); what is not finished by then counts as such. Other keywords go to ``simulate``."""
    window = split.window
    if window is not None:
        length = (window.end_s - window.start_s) / load
        drain = max(120.0, 2 * length) if drain_s is None else drain_s
        simulate_kw.setdefault("measure_from_s", window.start_s)
        simulate_kw.setdefault("measure_until_s", window.end_s)
        if concurrency is None:
            simulate_kw.setdefault("horizon_s", (window.end_s - split.origin_s) / load + drain)
    simulate_kw["load"] = load
    simulate_kw.setdefault("origin_s", split.origin_s)
    n = len(split.parts)
    per = None if concurrency is None else max(1, round(concurrency / max(n, 1)))
    return merge([simulate(part, cost, config, concurrency=per, **simulate_kw) for part in split.parts])


def simulate_replicas(
    workload: Workload,
    cost: StepCost,
    config: SchedulerConfig,
    n_replicas: int,
    policy: str = "auto",
    *,
    concurrency: int | None = None,
    window: Window | None = None,
    load: float = 1.0,
    drain_s: float | None = None,
    **simulate_kw,
) -> SimResult:
    """Split with ``split_replicas``, simulate every replica (same config and cost), pool the results
    with ``metrics.merge`` (``split_for`` then ``run_split``). With ``window`` only its requests (and
    its warm-up's) are replayed and its own are measured; the run stops ``drain_s`` simulated seconds
    after the window's end (default: max(120 s, twice the window's simulated length)), what is not
    finished by then counts as such. Other keywords go to ``simulate``."""
    split = split_for(workload, n_replicas, policy, window)
    return run_split(split, cost, config, concurrency=concurrency, load=load, drain_s=drain_s, **simulate_kw)
