"""Speed of the SGLang replica simulator (hpc_advise.advisor.simulate): wall time, scheduler steps/s
and requests/s on the example traces and a synthetic agentic trace (5,000 requests, mean prompt
~22K tokens, output ~361, 5.5 req/s, Mooncake-style 512-token prefix blocks).

    python benchmarks/bench_simulate.py [--repeat 3]

Times are this process's CPU time (min over --repeat): on a shared machine wall time mostly measures
the neighbours. The step cost is a fixed linear model of the order of an H200 TP8 replica of a large MoE model
(its numbers only set how busy the replica is, not the simulator's cost per step).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpc_advise.advisor.simulate import (  # noqa: E402
    LinearStepCost,
    SchedulerConfig,
    Workload,
    select_windows,
    simulate,
)
from hpc_advise.advisor.simulate.replicas import simulate_replicas  # noqa: E402
from hpc_advise.advisor.simulate.search import capacity_search  # noqa: E402
from hpc_advise.advisor.traces import read_trace  # noqa: E402
from tests.advisor.sim_fixtures import agentic_workload  # noqa: E402

COST = LinearStepCost(
    prefill_fixed_s=0.010,
    per_token_s=1.5e-5,
    per_pair_s=5e-12,
    decode_fixed_s=0.012,
    per_seq_s=1e-4,
    per_kv_token_s=3e-9,
)
CONFIG = SchedulerConfig.for_gpu(141, max_total_tokens=900_000)


def run(name: str, w: Workload, repeat: int, **kw) -> None:
    best = None
    for _ in range(repeat):
        t0 = time.process_time()
        r = simulate(w, COST, CONFIG, **kw)
        dt = time.process_time() - t0
        best = dt if best is None else min(best, dt)
    s = r.summary()
    steps = r.prefill_steps + r.decode_steps
    print(
        f"{name:34s} {len(w):6d} req {steps:7d} steps  {best:6.3f} s  {steps / best:9,.0f} steps/s "
        f"{len(w) / best:8,.0f} req/s | TTFT p50 {s['ttft_s']['p50']:.3f} p99 {s['ttft_s']['p99']:.3f} s, "
        f"TPOT p50 {s['tpot_s']['p50'] * 1e3:.1f} ms, hit {s['cache_hit_rate']:.2f}, "
        f"retract {r.retractions}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for f in ("agentic_coding.jsonl", "bursty.csv", "chat_uniform.csv"):
        w = Workload.from_requests(read_trace(ROOT / "examples" / "traces" / f))
        run(f, w, args.repeat)
    w = agentic_workload(5000, seed=0)
    seen: set[int] = set()
    reused = 0
    for i in range(len(w)):
        h = w.hashes[w.hash_offsets[i] : w.hash_offsets[i + 1]].tolist()
        reused += sum(x in seen for x in h)
        seen.update(h)
    print(
        f"synthetic agentic: mean input {w.input_len.mean():.0f}, output {w.output_len.mean():.0f}, "
        f"{len(w) / (w.arrival_s[-1] - w.arrival_s[0]):.2f} req/s, {reused / w.hashes.size:.0%} of blocks seen before"
    )
    run("synthetic agentic (open loop)", w, args.repeat)
    run("synthetic agentic (64 clients)", w, args.repeat, concurrency=64)
    for win in select_windows(
        w.arrival_s, w.input_len + w.output_len, window_s=300, n_samples=1, warmup_s=60
    ):
        idx, _ = win.indices(w.arrival_s)
        print(" ", win.describe())
        run(
            f"  {win.kind} window",
            w.select(idx),
            args.repeat,
            measure_from_s=win.start_s,
            measure_until_s=win.end_s,
        )
    # What recommend would do per surviving candidate: bisect the load factor on the busiest window
    # under SLOs (TTFT p99 <= 10 s, TPOT p99 <= 80 ms), one replica.
    busiest = select_windows(w.arrival_s, w.input_len + w.output_len, window_s=300, n_samples=0)[0]
    t0 = time.process_time()
    res = capacity_search(
        lambda x: simulate_replicas(w, COST, CONFIG, 1, window=busiest, load=x).meets(10.0, 0.080),
        lo=1 / 16,
        hi=16,
        rel_tol=0.05,
    )
    dt = time.process_time() - t0
    print(
        f"capacity search on the busiest window: load {res.load:.3f} (fails at {res.fail_at}), "
        f"{len(res.evaluations)} simulations in {dt:.2f} s"
    )


if __name__ == "__main__":
    main()
