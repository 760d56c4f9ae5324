"""Plan time of paged decode attention: op.plan's update of one decode step, per case, for this checkout's
planner and (``--before DIR``) another copy of the decode_attention package, in one process.

Each plan is timed as the benchmark times it (``plan.update`` replayed in a CUDA graph, p50 µs) on the
benchmark's workloads (the sweep's cases, page 64, D 128), with the launch knobs each copy's op.py tunes for
the case's KV dtype and head count; ``--whole-below N`` / ``--seg-cost N`` add a column of this checkout's
planner with those knobs. Writes decode_attention_plan_time.{md,jsonl} (or $HPC_ADVISE_RESULTS).
  python benchmarks/plan_time_decode_attention.py --before /tmp/plan_before/decode_attention --whole-below 100
"""

from __future__ import annotations

import argparse

from hpc_advise.kernels.decode_attention import op
from hpc_advise.runtime.benches import decode_attention as da
from hpc_advise.runtime.measure.harness import run_row, write_results


def plan_us(mod, w: da.Workload, **cfg) -> float:
    """p50 µs of one plan update of workload ``w`` through op module ``mod``, replayed in a CUDA graph."""
    p = mod.plan(
        w.seq_lens,
        w.tables[0],
        page_size=da.PAGE,
        num_q_heads=w.hq,
        num_kv_heads=w.hkv,
        head_dim=da.HEAD_DIM,
        kv_dtype=w.kv_dtype,
        **cfg,
    )
    t, _ = da._time([lambda: p.update(w.seq_lens, w.tables[0], validate=False)])
    return t.p50


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", metavar="DIR", help="another copy of hpc_advise/kernels/decode_attention")
    ap.add_argument("--whole-below", type=int)
    ap.add_argument("--seg-cost", type=int)
    args = ap.parse_args()
    extra = {
        k: v for k, v in (("whole_below", args.whole_below), ("seg_cost", args.seg_cost)) if v is not None
    }
    before = da.load_package(args.before) if args.before else None
    rows, table = [], []
    for name, hq, hkv, kv in da.SWEEP_CASES:
        w = da.Workload(
            da.case_lengths(name), hq, hkv, torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
        )
        times = {"before": plan_us(before, w) if before else None, "now": plan_us(op, w)}
        if extra:
            times["now, " + ", ".join(f"{k}={v}" for k, v in extra.items())] = plan_us(op, w, **extra)
        for which, us in times.items():
            if us is not None:
                config = {
                    "case": name,
                    "num_q_heads": hq,
                    "num_kv_heads": hkv,
                    "kv_dtype": kv,
                    "planner": which,
                }
                rows.append(
                    run_row(
                        kind="kernel",
                        subject="decode_attention.plan",
                        provider="hpc_advise_dynamic",
                        config=config,
                        metric="latency",
                        unit="us",
                        value=us,
                    )
                )
        table.append([name, f"{hq}/{hkv}", kv] + [round(us, 1) for us in times.values() if us is not None])
        print(*table[-1], flush=True)
        del w
        torch.cuda.empty_cache()
    columns = [c for c, us in times.items() if us is not None]
    md, _ = write_results(
        rows,
        table,
        ["case", "Hq/Hkv", "KV"] + [f"plan µs ({c})" for c in columns],
        stem="decode_attention_plan_time",
        title="Decode attention: plan time per decode step (plan.update replayed in a CUDA graph, p50 µs)",
        notes="Each planner with the launch knobs its op.py tunes for the case's KV dtype and head count"
        + (f"; 'before' is the package copy at {args.before}" if before else "")
        + ".",
    )
    print(md.read_text())


main()
