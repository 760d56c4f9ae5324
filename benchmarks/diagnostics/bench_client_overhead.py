"""What `hpc-advise bench` itself costs per request (issue 28's limits: <= 1 ms of client-side latency
per request at 200 requests/s on 2 cores; a 10,000-request replay under 300 MB).

Against the zero-delay stand-in server (tests/advisor/openai_stand_in.py, its own process), a trace of
one request every 5 ms (64 input words, 16 output tokens, 50 shared prefix blocks):

- ``cpu``: drives ``Replay`` in this process for ``--requests`` requests; prints the client's CPU per
  request (user and system, ``getrusage``), the dispatch lag (sent - scheduled, median / p99: latency
  the client adds before a request leaves) and E2E (client + stand-in + kernel);
- ``closed``: one client in a closed loop, ``--requests`` requests: the whole round trip's median;
- ``rss``: the ``hpc-advise bench`` CLI on 10,000 requests as a child process; its maximum RSS.

``--cpus 0,1`` pins this process (and the CLI child) to those cores and the stand-in to the others,
so "2 cores" is what the client has. Prints one JSON line per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def write_trace(path: Path, n: int, gap_ms: int = 5) -> None:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"timestamp": i * gap_ms, "input_length": 64, "output_length": 16,
                                 "hash_ids": [i % 50]}) + "\n")  # fmt: skip


def _pin(cpus: list[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)


def run_cpu(url: str, trace: Path, n: int, concurrency: int | None = None) -> dict:
    from hpc_advise.advisor.bench import stats
    from hpc_advise.advisor.bench.client import probe
    from hpc_advise.advisor.bench.prompts import PromptBuilder
    from hpc_advise.advisor.bench.replay import Replay, read_plan

    plan = read_plan(str(trace), requests=n)
    rp = Replay([asyncio.run(probe(url))], plan, PromptBuilder(None), progress=False, concurrency=concurrency)
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = asyncio.run(rp.run())
    r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    s = stats.summarize(out[0].results, out[0].duration_s)
    user = (r1.ru_utime - r0.ru_utime) / n * 1e3
    sys_ = (r1.ru_stime - r0.ru_stime) / n * 1e3
    return {
        "mode": "closed" if concurrency else "cpu", "requests": n, "completed": s["completed"],
        "rate_req_s": round(s["completed"] / (w1 - w0), 1),
        "cpu_ms_per_request": round(user + sys_, 3), "user_ms": round(user, 3), "sys_ms": round(sys_, 3),
        "dispatch_lag_ms": {k: round(v, 3) for k, v in (s.get("dispatch_lag_ms") or {}).items()},
        "e2e_ms": {k: round(s["e2e_ms"][k], 3) for k in ("median", "p99")},
        "ttft_ms_median": round(s["ttft_ms"]["median"], 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }  # fmt: skip


def run_rss(url: str, trace: Path, cpus: list[int] | None) -> dict:
    cmd = [sys.executable, "-m", "hpc_advise", "bench", "--url", url, "--trace", str(trace), "--no-store", "--json"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=(lambda: _pin(cpus)) if cpus else None)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {"mode": "rss", "error": p.stderr.strip().splitlines()[-1:] or p.returncode}
    rep = json.loads(p.stdout)
    s = rep["targets"][0]["summary"]
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"mode": "rss", "requests": s["requests"], "completed": s["completed"], "wall_s": round(wall, 1),
            "rate_req_s": round(s["request_throughput"], 1), "max_rss_mb": round(kids.ru_maxrss / 1024, 1),
            "e2e_ms": {k: round(s["e2e_ms"][k], 3) for k in ("median", "p99")},
            "load_avg_1m": round(os.getloadavg()[0], 2)}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modes", nargs="*", default=["cpu", "closed", "rss"])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rss-requests", type=int, default=10000)
    ap.add_argument("--cpus", default=None, help="cores for the client, e.g. 0,1 (the stand-in gets the rest)")
    a = ap.parse_args(argv)
    cpus = [int(c) for c in a.cpus.split(",")] if a.cpus else None
    from tests.advisor import openai_stand_in as stand_in

    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "t.jsonl"
        write_trace(trace, max(a.requests, a.rss_requests))
        server_cpus = None
        if cpus:
            rest = sorted(set(os.sched_getaffinity(0)) - set(cpus))
            server_cpus = rest or None
        _pin(server_cpus)  # the stand-in inherits this affinity
        with stand_in.start() as url:
            _pin(cpus)
            for mode in a.modes:
                if mode == "cpu":
                    row = run_cpu(url, trace, a.requests)
                elif mode == "closed":
                    row = run_cpu(url, trace, min(a.requests, 1000), concurrency=1)
                elif mode == "rss":
                    row = run_rss(url, trace, cpus)
                else:
                    raise SystemExit(f"unknown mode {mode!r} (cpu, closed, rss)")
                row["client_cpus"] = a.cpus or "all"
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
