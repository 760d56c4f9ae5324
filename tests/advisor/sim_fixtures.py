"""Workloads for the simulator tests: hand-written requests, Poisson traffic, agentic sessions."""

from __future__ import annotations

import numpy as np

from hpc_advise.advisor.simulate import Workload
from hpc_advise.advisor.traces import Request


def req(t, n_in, n_out, cached=None, hashes=None, block=None) -> Request:
    return Request(t, n_in, n_out, cached, False, tuple(hashes) if hashes else None, block)


def workload(records) -> Workload:
    return Workload.from_requests(records)


def poisson_workload(n: int, rate: float, seed: int, mean_in: int = 1500, mean_out: int = 200) -> Workload:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    n_in = np.maximum(1, rng.exponential(mean_in, n)).astype(int)
    n_out = np.maximum(2, rng.exponential(mean_out, n)).astype(int)
    return workload([req(float(a), int(b), int(c)) for a, b, c in zip(t, n_in, n_out, strict=True)])


def agentic_workload(n: int, seed: int, **kwargs) -> Workload:
    """``agentic_requests`` (same arguments) as a ``Workload``."""
    return workload(agentic_requests(n, seed, **kwargs))


def agentic_requests(
    n: int,
    seed: int,
    block: int = 512,
    rate: float = 5.5,
    system_blocks: int = 4,
    growth_blocks: int = 9,
    turns: float = 5.0,
    mean_out: float = 361.0,
    think_s: float = 20.0,
    max_blocks: int = 250,
) -> list[Request]:
    """Coding-agent sessions: every prompt starts with one shared system prompt, then the session's
    context, which grows by about ``growth_blocks`` new blocks per turn (so a turn re-sends all of
    the previous turn's blocks); about ``turns`` turns per session, ``think_s`` apart; outputs
    log-normal with mean ``mean_out``. Arrivals are rescaled to ``rate`` requests/s."""
    rng = np.random.default_rng(seed)
    recs = []
    next_id = system_blocks
    t_session = 0.0
    while len(recs) < n * 1.3:
        t_session += rng.exponential(turns / rate)
        t = t_session
        ctx: list[int] = []
        for _ in range(max(1, int(rng.geometric(1.0 / turns)))):
            g = int(rng.integers(1, 2 * growth_blocks))
            if system_blocks + len(ctx) + g > max_blocks:
                break
            ctx.extend(range(next_id, next_id + g))
            next_id += g
            hashes = list(range(system_blocks)) + ctx
            n_in = len(hashes) * block - int(rng.integers(0, block))
            n_out = max(2, int(rng.lognormal(np.log(mean_out) - 0.5, 1.0)))
            recs.append((t, n_in, n_out, hashes))
            t += rng.exponential(think_s)
    recs.sort(key=lambda x: x[0])
    recs = recs[:n]
    span = recs[-1][0] - recs[0][0]
    scale = (n / rate) / span if span > 0 else 1.0
    return [req((x[0] - recs[0][0]) * scale, x[1], x[2], hashes=x[3], block=block) for x in recs]
