"""Generate the example traces of this folder (deterministic: fixed seeds; re-run to reproduce).

    python examples/traces/generate.py            # writes the files next to this script
    python examples/traces/generate.py --out DIR

Three synthetic workloads, each in a different format (see README.md for the model behind each):

- agentic_coding.jsonl  Mooncake JSONL with hash_ids: coding-agent sessions whose context grows turn by
                        turn to 32K-128K tokens (with compaction), next to short side requests.
- chat_uniform.csv      Azure LLM inference CSV: steady Poisson chat traffic.
- bursty.csv            BurstGPT CSV: on/off bursts (Markov-modulated Poisson), 3 % failed requests.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from hpc_advise.advisor.traces.source import Request
from hpc_advise.advisor.traces.writers import write_azure, write_burstgpt, write_mooncake

BLOCK = 512  # Mooncake hash_ids blocks


class BlockIds:
    """Mooncake-style prefix block ids: equal prefixes share ids, new content gets fresh ids."""

    def __init__(self) -> None:
        self.next_id = 0

    def fresh(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids


def _lognormal(rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(rng.lognormal(math.log(median), sigma)))))


def agentic_coding(seed: int = 7, minutes: float = 10.0) -> list[Request]:
    """Coding-agent sessions plus short side requests.

    A session starts from a shared 6K-token system prompt and tool schema (the same prefix blocks for
    every session) plus a task and initial files (2K-24K tokens). Each turn the model answers with a
    tool call (log-normal, median 150 tokens) or, in 15 % of turns, a code edit (median 1,200); the
    tool's result (median 2,500 tokens: file reads, test logs) is appended, so the next input is the
    previous input + output + tool result. The next turn arrives after the modelled response time
    (0.4 s + 25 us per context token + 25 ms per output token) plus tool time (0.5-8 s). When the
    context passes the session's budget (log-uniform 32K-128K), the agent either stops (60 %) or
    compacts its history to a 6K-16K summary and goes on (at most twice). Sessions start as a Poisson
    process (one per 20 s). Side requests (titles, commit messages, quick questions: median 700 in,
    40 out) arrive at 0.3 req/s.
    """
    rng = np.random.default_rng(seed)
    ids = BlockIds()
    system_tokens = 6144
    system_ids = ids.fresh(system_tokens // BLOCK)
    horizon = minutes * 60.0
    out: list[Request] = []

    t_session = rng.exponential(10.0)
    while t_session < horizon:
        budget = int(math.exp(rng.uniform(math.log(32768), math.log(131072))))
        context = system_tokens + _lognormal(rng, 8000, 0.8, 2000, 24000)
        blocks = system_ids + ids.fresh(math.ceil(context / BLOCK) - len(system_ids))
        compactions = 0
        t = t_session
        while t < horizon:
            edit = rng.random() < 0.15
            n_out = _lognormal(rng, 1200, 0.5, 200, 4096) if edit else _lognormal(rng, 150, 0.8, 12, 1024)
            out.append(Request(round(t, 3), context, n_out, hash_ids=list(blocks), block_size=BLOCK))
            response_s = 0.4 + 25e-6 * context + 0.025 * n_out
            tool_s = rng.uniform(0.5, 8.0)
            t += response_s + tool_s
            tool_result = _lognormal(rng, 2500, 1.0, 50, 20000)
            new_context = context + n_out + tool_result
            if new_context > budget:
                if compactions >= 2 or rng.random() < 0.6:
                    break
                compactions += 1
                new_context = system_tokens + _lognormal(rng, 9000, 0.3, 6000, 16000)
                keep = len(system_ids)
            else:
                keep = context // BLOCK  # full blocks of the old context are unchanged
            blocks = blocks[:keep] + ids.fresh(math.ceil(new_context / BLOCK) - keep)
            context = new_context
        t_session += rng.exponential(20.0)

    t = rng.exponential(1 / 0.3)
    while t < horizon:
        n_in = _lognormal(rng, 700, 0.9, 30, 8000)
        n_out = _lognormal(rng, 40, 0.9, 2, 600)
        out.append(
            Request(round(t, 3), n_in, n_out, hash_ids=ids.fresh(math.ceil(n_in / BLOCK)), block_size=BLOCK)
        )
        t += rng.exponential(1 / 0.3)
    out.sort(key=lambda r: r.t)
    return out


def chat_uniform(seed: int = 11, minutes: float = 10.0, rate: float = 5.0) -> list[Request]:
    """Steady chat traffic: Poisson arrivals at ``rate`` req/s; input log-normal (median 1,000 tokens:
    a few turns of history, sigma 0.9, 20-16K), output log-normal (median 250, sigma 0.8, 5-4K)."""
    rng = np.random.default_rng(seed)
    start = 1_700_150_400.0  # 2023-11-16 16:00:00 UTC, as the Azure 2023 traces
    out: list[Request] = []
    t = rng.exponential(1.0 / rate)
    while t < minutes * 60.0:
        out.append(
            Request(
                start + round(t, 6), _lognormal(rng, 1000, 0.9, 20, 16384), _lognormal(rng, 250, 0.8, 5, 4096)
            )
        )
        t += rng.exponential(1.0 / rate)
    return out


def bursty(seed: int = 23, minutes: float = 10.0) -> list[Request]:
    """On/off traffic: a two-state Markov-modulated Poisson process, 1.5 req/s in quiet periods (mean 60
    s) and 30 req/s in bursts (mean 15 s); input log-normal (median 600, sigma 1.1), output (median
    250, sigma 0.9); 3 % of requests fail (0 response tokens, as BurstGPT logs them)."""
    rng = np.random.default_rng(seed)
    out: list[Request] = []
    t, horizon = 0.0, minutes * 60.0
    burst = False
    while t < horizon:
        state_end = t + rng.exponential(15.0 if burst else 60.0)
        rate = 30.0 if burst else 1.5
        t += rng.exponential(1.0 / rate)
        while t < min(state_end, horizon):
            failed = rng.random() < 0.03
            out.append(
                Request(
                    round(t, 3),
                    _lognormal(rng, 600, 1.1, 10, 32000),
                    0 if failed else _lognormal(rng, 250, 0.9, 1, 4096),
                    failed=failed,
                )
            )
            t += rng.exponential(1.0 / rate)
        t = state_end
        burst = not burst
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [
        ("agentic_coding.jsonl", write_mooncake, agentic_coding()),
        ("chat_uniform.csv", write_azure, chat_uniform()),
        ("bursty.csv", write_burstgpt, bursty()),
    ]
    for name, writer, requests in jobs:
        path = args.out / name
        with path.open("w") as fh:
            fh.writelines(writer(requests))
        print(f"{path}: {len(requests)} requests, {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
