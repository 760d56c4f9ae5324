"""Merge launch A/B of paged decode attention: this checkout's ``op._merge`` against the one of another copy of the
decode_attention package (``--before DIR``), on the same plans, attention pass and partials, in one process.

Per case (the benchmark's workloads, page 64, D 128, each KV dtype's tuned launch as ``op.plan(kv_dtype=...)``
picks it): our call with this checkout's merge (``now``) and with the copy's merge swapped in (``before``), timed
alternately as the sweep times a configuration (CUDA-graph replay over rotated page tables, p50 µs): now, before,
now, before, now, after one dropped warm-up timing. Also whether the two outputs of rotation 0 are bitwise equal.
Writes decode_attention_merge_ab.{md,jsonl} (or $HPC_ADVISE_RESULTS).
  python benchmarks/merge_ab_decode_attention.py --before benchmarks/_merge_before/decode_attention --groups bf16:8/1
"""

from __future__ import annotations

import argparse
import math

from hpc_advise.kernels.decode_attention import op
from hpc_advise.runtime.benches import decode_attention as da
from hpc_advise.runtime.measure.harness import environment, run_row, write_results

ROUNDS = 2  # 'before' timed ROUNDS times, 'now' ROUNDS + 1 times, alternating


def ab_case(before, name: str, hq: int, hkv: int, kv: str, env) -> tuple[list[dict], list]:
    """Rows and one table line of the A/B on one case."""
    import torch

    w = da.Workload(da.case_lengths(name), hq, hkv, torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16)
    calls, _, outs = da._ours(w, "dynamic")

    def old(call):
        with da.swapped(op, _merge=before._merge):
            return call()

    forms = {"now": calls, "before": [lambda c=c: old(c) for c in calls]}
    got = {}
    for which, cs in forms.items():
        outs[0].fill_(float("nan"))
        cs[0]()
        torch.cuda.synchronize()
        got[which] = outs[0].clone()
    equal = torch.equal(got["now"], got["before"])
    da._time(calls)  # warm-up timing, dropped (a case's first timing reads slow: sweep run 10)
    us = {"now": [], "before": []}
    for which in ["now", "before"] * ROUNDS + ["now"]:
        t, how = da._time(forms[which])
        us[which].append(t.p50)
        config = {"case": name, "num_q_heads": hq, "num_kv_heads": hkv, "kv_dtype": kv, "merge": which}
        config |= {"timing": how, "bitwise_equal": equal}
        ab_case.rows.append(
            run_row(
                kind="kernel",
                subject="decode_attention.merge_ab",
                provider="hpc_advise_dynamic",
                config=config,
                metric="latency",
                unit="us",
                timing=t,
                env=env,
            )
        )
    now, old_us = (sum(v) / len(v) for v in (us["now"], us["before"]))
    spread = 100 * (max(us["now"]) - min(us["now"])) / now
    line = [name, f"{hq}/{hkv}", kv, round(now, 2), round(old_us, 2), f"{100 * (now / old_us - 1):+.2f}%"]
    return line + [f"{spread:.2f}%", "yes" if equal else "NO"], [now / old_us]


ab_case.rows = []


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--before", metavar="DIR", required=True, help="another copy of the decode_attention package"
    )
    ap.add_argument(
        "--groups",
        default="bf16:8/1,fp8:64/8",
        help="KV dtype:Hq/Hkv pairs, comma-separated (bf16 / fp8; 8/1 / 64/8)",
    )
    args = ap.parse_args()
    before = da.load_package(args.before)
    env = environment()
    table, ratios = [], {}
    for group in args.groups.split(","):
        kv, heads = group.split(":")
        hq, hkv = (int(x) for x in heads.split("/"))
        for name in da.CASES:
            line, ratio = ab_case(before, name, hq, hkv, kv, env)
            table.append(line)
            ratios.setdefault(f"{kv} {heads}", []).extend(ratio)
            print("ab", *line, flush=True)
            torch.cuda.empty_cache()
    geo = {k: 100 * (math.exp(sum(map(math.log, v)) / len(v)) - 1) for k, v in ratios.items()}
    md, _ = write_results(
        ab_case.rows,
        table,
        ["case", "Hq/Hkv", "KV", "now µs", "before µs", "now / before", "now's spread", "bitwise"],
        stem="decode_attention_merge_ab",
        title="Decode attention: merge launch A/B (this checkout's op._merge vs another copy's)",
        notes=f"Copy: {args.before}. Means of {ROUNDS + 1} (now) and {ROUNDS} (before) alternating timings, CUDA-graph "
        "replay over rotated page tables, p50 µs each; 'now's spread': (max - min) / mean of now's timings; "
        "'bitwise': rotation 0's outputs equal. Geometric mean of now / before: "
        + "; ".join(f"{k} {v:+.2f} %" for k, v in geo.items()),
    )
    print(md.read_text(), flush=True)


if __name__ == "__main__":
    main()
