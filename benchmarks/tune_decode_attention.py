"""Launch-configuration sweep of paged decode attention on this GPU: each case's tuned config against variants.

For every case (the benchmark's workloads: head_dim 128, page 64, CUDA-graph replay over rotated page tables)
the tuned config (kernels/decode_attention/config.py) is timed first, then each variant (Config fields replaced
in it), then the tuned config again (its spread within the process, against which the differences are read).
Every output is checked against the float64 reference (rotation 0); a variant above the tolerance is marked
FAIL. Writes decode_attention_tune.{md,jsonl} under benchmarks/results/ (or $OUT / $HPC_ADVISE_RESULTS); it
changes no table of the package: a new default goes into config.py by hand, with the table as its evidence.

  python benchmarks/tune_decode_attention.py --kv bf16 --heads 8/1 \\
      --variants '[{"ctas_per_sm": 3}, {"seg_cost": 0}, {"merge_in_pass": 32}]'
  python benchmarks/tune_decode_attention.py --kv fp8 --heads 64/8 --cases '64 x 4K,1 x 128K' \\
      --variants '[{"transposed": false, "num_warps": 1, "tile": 32, "warp_split": true, "ctas_per_sm": 7}]'
  python benchmarks/tune_decode_attention.py --form mla --variants '[{"ctas_per_sm": 1}, {"merge_cols": 64}]'
      # the MLA form (runtime/measure/cases/decode_attention_mla.py): bf16 latent pool, 16 heads, page 64
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpc_advise.kernels.decode_attention.config import KEYS, tuned_config  # noqa: E402
from hpc_advise.runtime.measure.cases import decode_attention as da  # noqa: E402
from hpc_advise.runtime.measure.harness import environment, run_row, write_results  # noqa: E402

TOL = {"bf16": 5e-3, "fp8": 2e-2}  # tests/kernels/decode_attention/helpers.py says why


def sweep(cases, variants: list[dict]) -> tuple[list[dict], list[list]]:
    """Rows and table lines: per case (name, hq, hkv, kv), the tuned config, each variant, the tuned again."""
    import torch

    from hpc_advise.kernels.decode_attention.reference import decode_attention_reference

    env, rows, table, t0 = environment(), [], [], time.time()
    for name, hq, hkv, kv in cases:
        dt = torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
        w = da.Workload(da.case_lengths(name), hq, hkv, dt)
        # e4m3 -> bf16 is exact; the reference then gathers bf16
        kr, vr = (w.k.to(torch.bfloat16), w.v.to(torch.bfloat16)) if kv == "fp8" else (w.k, w.v)
        ref = decode_attention_reference(w.q, kr, vr, w.tables[0], w.seq_lens, page_size=da.PAGE)
        del kr, vr
        tuned = tuned_config(dt, hkv, da.HEAD_DIM, da.PAGE)
        for i, keys in enumerate([{}, *variants, {}]):
            label = "tuned" + (" (again)" if i and not keys else "") if not keys else json.dumps(keys)
            try:
                calls, plans, outs = da._ours(w, "dynamic", replace(tuned, **keys))
                calls[0]()
                torch.cuda.synchronize()
            except Exception as exc:  # a variant that does not build or launch here: say so, go on
                table.append(
                    [name, f"{hq}/{hkv}", kv, label, "n/a", f"ERROR {type(exc).__name__}: {exc}"[:120]]
                )
                print(*table[-1], flush=True)
                continue
            err = ((outs[0].double() - ref).norm() / ref.norm()).item()  # NaN compares False: fails
            ok = err <= TOL[kv]
            if i == 0:
                da._time(
                    calls
                )  # a case's first timing, right after building the workload, reads slow: dropped
            t, how = da._time(calls)
            rows.append(
                run_row(
                    kind="kernel",
                    subject="decode_attention.tune",
                    provider="hpc_advise_dynamic",
                    config={
                        "case": name,
                        "num_q_heads": hq,
                        "num_kv_heads": hkv,
                        "kv_dtype": kv,
                        "timing": how,
                    }
                    | {"rel_err": err, "ok": ok, "keys": keys, "again": i > 0 and not keys}
                    | {"config": replace(tuned, **keys).to_dict()},
                    metric="latency",
                    unit="us",
                    timing=t,
                    env=env,
                )
            )
            table.append(
                [name, f"{hq}/{hkv}", kv, label, round(t.p50, 1), f"{err:.1e}" + ("" if ok else " FAIL")]
            )
            print(f"tune {time.time() - t0:5.0f}s", *table[-1], flush=True)
            del calls, plans, outs
        del w, ref
        torch.cuda.empty_cache()
    return rows, table


def geomean_note(rows: list[dict]) -> str:
    """Each variant's geometric mean of p50 against the tuned config's first timing, over the cases it ran."""
    first, by = {}, {}
    for r in rows:
        c = r["config"]
        case = (c["case"], c["num_q_heads"], c["num_kv_heads"], c["kv_dtype"])
        if not c["keys"] and not c["again"]:
            first[case] = r["p50"]
        elif c["ok"]:
            by.setdefault(json.dumps(c["keys"]) if c["keys"] else "tuned (again)", []).append(
                (case, r["p50"])
            )
    parts = []
    for label, vals in by.items():
        logs = [math.log(p / first[case]) for case, p in vals if case in first]
        if logs:
            parts.append(
                f"{label}: {100 * (math.exp(sum(logs) / len(logs)) - 1):+.1f} % over {len(logs)} cases"
            )
    return "Geometric mean of p50 against the tuned config's first timing: " + "; ".join(parts) + "."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--form", choices=("gqa", "mla"), default="gqa")
    ap.add_argument("--kv", choices=("bf16", "fp8"), help="KV dtype (gqa form)")
    ap.add_argument("--heads", help="gqa: Hq/Hkv, one of " + ", ".join(f"{hq}/{hkv}" for hq, hkv in da.HEADS)
                    + "; mla: the query heads (default 16)")  # fmt: skip
    ap.add_argument("--cases", help="comma-separated case names (default: all of the benchmark's)")
    ap.add_argument(
        "--variants", required=True, help="a JSON list of objects of Config fields: " + ", ".join(KEYS)
    )
    args = ap.parse_args()
    try:
        variants = json.loads(args.variants)
    except json.JSONDecodeError as exc:
        ap.error(f"--variants: not JSON ({exc})")
    if not isinstance(variants, list) or not all(isinstance(v, dict) and v for v in variants):
        ap.error("--variants: a JSON list of non-empty objects")
    unknown = sorted({k for v in variants for k in v} - set(KEYS))
    if unknown:
        ap.error(f"--variants: unknown Config fields {unknown}; known: {list(KEYS)}")
    if args.form == "mla":
        _tune_mla(ap, args, variants)
        return
    if args.kv is None or args.heads not in [f"{hq}/{hkv}" for hq, hkv in da.HEADS]:
        ap.error("--kv and --heads (Hq/Hkv of the benchmark) are needed for the gqa form")
    names = [c.strip() for c in args.cases.split(",")] if args.cases else list(da.CASES)
    if set(names) - set(da.CASES):
        ap.error(f"--cases: unknown {sorted(set(names) - set(da.CASES))}; known: {list(da.CASES)}")
    hq, hkv = (int(x) for x in args.heads.split("/"))
    rows, table = sweep([(n, hq, hkv, args.kv) for n in names], variants)
    md, _ = write_results(
        rows,
        table,
        ["case", "Hq/Hkv", "KV", "config", "µs", "rel err"],
        stem="decode_attention_tune",
        title=f"Decode attention: launch-configuration sweep ({args.kv}, {args.heads}, page 64, D 128)",
        notes="CUDA-graph replay over rotated page tables (pool >> L2); p50 µs per call. 'rel err': relative "
        f"Frobenius error against the float64 reference (FAIL above {TOL}). " + geomean_note(rows),
    )
    print(md.read_text())


def _tune_mla(ap, args, variants) -> None:
    from hpc_advise.runtime.measure.cases import decode_attention_mla as mla

    names = [c.strip() for c in args.cases.split(",")] if args.cases else list(mla.CASES)
    if set(names) - set(mla.CASES):
        ap.error(f"--cases: unknown {sorted(set(names) - set(mla.CASES))}; known: {list(mla.CASES)}")
    heads = int(args.heads or 16)
    copy = da.copy_ceiling_tbps()
    rows, table = mla.sweep(names, variants, heads=heads, copy_tbps=copy)
    md, _ = write_results(
        rows,
        table,
        ["case", "config", "µs", "floor µs", "TB/s", "rel err", ""],
        stem="decode_attention_mla_tune",
        title=f"Decode attention, MLA form: launch-configuration sweep (bf16, {heads} heads, page 64, 512 + 64)",
        notes=f"CUDA-graph replay over rotated page tables (pool >> L2); p50 µs per call. TB/s = latent bytes "
        f"(576 x 2 per token) / p50; floor = those bytes / the copy ceiling measured here ({copy:.2f} TB/s). "
        f"'rel err' against the float64 reference (FAIL above {mla.TOL}).",
    )
    print(md.read_text())


if __name__ == "__main__":
    main()
