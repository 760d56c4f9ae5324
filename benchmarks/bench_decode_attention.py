"""Paged decode attention: ours (dynamic, static) vs FlashInfer and torch FA2 on this GPU.

Writes benchmarks/results/decode_attention.{md,jsonl} (or $OUT / $HPC_ADVISE_RESULTS).
  python benchmarks/bench_decode_attention.py [--grid full|small] [--kv all|bf16|fp8] [--no-peers]
  python benchmarks/bench_decode_attention.py --sweep        # launch-configuration sweep
  python benchmarks/bench_decode_attention.py --tune         # sweep, then the grid with the best config
  python benchmarks/bench_decode_attention.py --tune --heads 64/8   # ... best over the swept 64/8 cases
  python benchmarks/bench_decode_attention.py --best-from sweep.jsonl --heads 8/1 --kv bf16   # an earlier sweep's
  python benchmarks/bench_decode_attention.py --best-from sweep.jsonl --kv bf16 --margin 0.02   # per head count;
        the sweep's first (default) configuration unless another is > 2 % faster (geometric mean)
  python benchmarks/bench_decode_attention.py --kv bf16 --snap 25   # op.plan(snap=25) for every case
  python benchmarks/bench_decode_attention.py --kv bf16 --whole-below 100 --seg-cost 4   # whole-segment plan
  python benchmarks/bench_decode_attention.py --kv bf16 --merge-in-pass 4   # in-pass merge of small splits
  python benchmarks/bench_decode_attention.py --sweep --sweep-set mip   # in-pass merge against the defaults
  python benchmarks/bench_decode_attention.py --variant nested-desc-m128-pc64 --ctas-per-sm 3
  python benchmarks/bench_decode_attention.py --kv fp8 --heads 8/1 --config '{"transposed": true, "tile": 64}'
  python benchmarks/bench_decode_attention.py --warm-flashinfer   # JIT-compile FlashInfer's modules only
  python benchmarks/bench_decode_attention.py --kv bf16,fp8 --peers '' --floor   # ours beside its stream floor
  python benchmarks/bench_decode_attention.py --kv bf16 --heads 8/1 --peers '' --split --cases '64 x 4K,1 x 128K'
        # ... and our pass and merge launch timed apart
"""

from __future__ import annotations

import argparse
import json

from hpc_advise.runtime.benches import decode_attention as da
from hpc_advise.runtime.measure.harness import write_results


def _grid_notes(args, cfg, best_fp8, by_heads) -> list[str]:
    """The notes under the grid's table: the copy ceiling, timing, our launch configuration and, with
    --floor / --split, what those columns mean."""
    notes = [
        f"Copy ceiling measured in the same process: {da.bench.copy_tbps:.2f} TB/s (a copy kernel, "
        "torch.mul(x, 1, out=) in a CUDA graph, bytes read + written). floor = KV bytes / ceiling; TB/s = KV bytes read (K and V, every "
        "token once) / our p50. 'vs X' = X's time / ours (> 1: we are faster).",
        "Timing: CUDA-graph replay (events around each replay of a graph of rotated calls over distinct "
        "page tables; pool >> L2); rows in the .jsonl say 'graph' or 'eager' per provider. Plan excluded "
        "everywhere; 'plan µs' is our plan.update replayed in a graph (eager figure in the jsonl).",
        f"Launch configuration of ours (dynamic and static): {cfg or da.defaults_note()}"
        + (f"; fp8 KV: {best_fp8}" if best_fp8 else "")
        + "".join(f"; {kv} KV, {h}: {c}" for (kv, h), c in by_heads.items())
        + ".",
    ]
    if args.floor or args.split:
        notes.append(
            "Stream floor (--floor, hpc_advise/runtime/benches/decode_attention_floor.py): one Triton launch "
            "over our plan (same grid, program ranges, page table, pool, tile, stages, warps, register cap) "
            "that reads every K/V byte our pass reads and adds it into an fp32 sum per program, no math, no "
            "merge; 'floor + tail' adds a dependent launch in the merge launch's slot under PDL (its grid, "
            "all programs exit but one, which waits); 'floor + 1-program tail': that tail as one program; "
            "'floor + duty tail': the merge grid whose merging programs wait and exit (no merge work); "
            "'empty launch': one launch of the attention grid that "
            "reads no K/V. Timed right after ours; 'ours again' is ours timed once more after them. "
            "'floor of 4.12' against DESIGN.md §7's 4.12 TB/s device copy."
        )
    if args.split:
        notes.append(
            "Split (--split): 'pass' is our call with its merge launch held back (op.run with op._merge "
            "replaced by a recorder: the attention pass alone, writing its partials and the rows of unsplit "
            "segments); 'merge alone' is that held launch (same arguments and PDL flag) on the partials the "
            "pass left; both timed after the floor, in the same graph replay. 'ours − pass': what the merge "
            "adds to the call (the merge overlaps the pass's tail under PDL, so it can be less than 'merge "
            "alone'); 'pass − floor': the pass's math, q and partial traffic beyond streaming the bytes."
        )
    return notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", choices=("full", "small"), default="full")
    ap.add_argument(
        "--kv", default="all", help="KV dtypes of the full grid, in order: all, bf16, fp8, fp8,bf16"
    )
    ap.add_argument("--heads", choices=("all", "8/1", "64/8"), default="all", help="Hq/Hkv of the full grid")
    ap.add_argument("--no-peers", action="store_true", help="time ours only (dynamic and static)")
    ap.add_argument(
        "--peers", default=",".join(da.PEERS), help="comma-separated subset of " + ",".join(da.PEERS)
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="time the stream floor of our plans beside ours (K/V bytes read in our schedule, no math; "
        "runtime/benches/decode_attention_floor.py); --peers '' leaves the peers and static out",
    )
    ap.add_argument(
        "--split",
        action="store_true",
        help="--floor, then our attention pass alone (merge launch held back) and our merge launch alone",
    )
    ap.add_argument("--cases", help="comma-separated case names of the full grid to run (default: all)")
    ap.add_argument("--sweep", action="store_true", help="sweep tile / CTAs per SM / stages / warps")
    ap.add_argument(
        "--sweep-set", choices=sorted(da.SWEEP_SETS), help="--sweep: a named set of cases and configs"
    )
    ap.add_argument("--tune", action="store_true", help="sweep first, then run the grid with the best config")
    ap.add_argument("--warm-flashinfer", action="store_true", help="compile FlashInfer's modules and exit")
    ap.add_argument(
        "--best-from",
        metavar="JSONL",
        help="run the grid with the best configuration (per KV dtype of --kv, over the cases of --heads) of "
        "a sweep's .jsonl from an earlier process; with --heads all, per head count of the sweep",
    )
    ap.add_argument(
        "--margin",
        type=float,
        default=0.0,
        help="--best-from: keep the sweep's first configuration unless the best is faster by more than this "
        "fraction (geometric mean over the cases)",
    )
    ap.add_argument("--snap", type=int, help="op.plan(snap=...): boundary snap, %% of a program's share")
    ap.add_argument(
        "--whole-below",
        type=int,
        help="op.plan(whole_below=...): segments costing <= this %% of a program's share are never split",
    )
    ap.add_argument("--seg-cost", type=int, help="op.plan(seg_cost=...): tiles charged per segment start")
    ap.add_argument(
        "--merge-in-pass",
        type=int,
        help="op.plan(merge_in_pass=N): split segments of <= N programs merge in the pass",
    )
    ap.add_argument("--tile", type=int)
    ap.add_argument("--ctas-per-sm", type=int)
    ap.add_argument("--num-stages", type=int)
    ap.add_argument("--num-warps", type=int)
    ap.add_argument(
        "--variant",
        help="loop and flags as in the sweep, e.g. nested-desc-m128-pc64 (overrides loop, prefetch, desc, "
        "merge_block, pt_chunk, wide_merge, seg_cost, f16_dot)",
    )
    ap.add_argument(
        "--config",
        metavar="JSON",
        help="op.plan keyword arguments as a JSON object (e.g. a sweep row's config keys); the flags above "
        "override it",
    )
    args = ap.parse_args()

    if args.warm_flashinfer:
        print(json.dumps(da.warm_flashinfer(), indent=1))
        return
    best, best_fp8, by_heads = {}, None, {}
    if args.sweep or args.tune:
        rows, table, headers = da.sweep(**da.SWEEP_SETS.get(args.sweep_set, {}))
        # --tune with --heads H/K: the best over the swept cases of those heads (the grid's)
        pick = args.heads if args.tune else "all"
        kvs = {r["config"]["kv_dtype"] for r in rows}  # a --sweep-set may hold one KV dtype only
        best = da.best_config(rows, "bf16", pick) if "bf16" in kvs else {}
        best_fp8 = da.best_config(rows, "fp8", pick) if "fp8" in kvs else None
        swept = sorted(
            {
                (r["config"]["kv_dtype"], f"{r['config']['num_q_heads']}/{r['config']['num_kv_heads']}")
                for r in rows
            }
        )
        per_heads = "; ".join(f"{kv} {h}: {da.best_config(rows, kv, h)}" for kv, h in swept)
        md, _ = write_results(
            rows,
            table,
            headers,
            stem="decode_attention_sweep" + (f"_{args.sweep_set}" if args.sweep_set else ""),
            title="Decode attention: launch-configuration sweep (dynamic schedule, page 64, D 128)",
            notes="CUDA-graph replay over rotated page tables (pool >> L2); p50 µs per call. 'rel err': "
            "relative Frobenius error of the configuration's output against the float64 reference "
            f"(FAIL above {da.SWEEP_TOL}; failed configurations are never chosen). "
            f"Best (geometric mean over the cases of each KV dtype and head count): {per_heads}. "
            f"Sweep wall time (compiles included): {da.sweep.seconds:.0f} s.",
        )
        print(md.read_text(), flush=True)
        if args.sweep:
            return
    elif args.best_from:
        with open(args.best_from) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        rows = [r for r in rows if r.get("subject") == "decode_attention.sweep"]
        kvs = ("bf16", "fp8") if args.kv == "all" else args.kv.split(",")
        if args.heads == "all":  # per head count the sweep has; the others keep op.py's defaults
            swept = {
                (c.get("kv_dtype", "bf16"), f"{c.get('num_q_heads')}/{c.get('num_kv_heads')}")
                for c in (r["config"] for r in rows)
            }
            by_heads = {
                key: da.best_config(rows, *key, margin=args.margin) for key in sorted(swept) if key[0] in kvs
            }
            print(f"best of {args.best_from} per KV dtype and heads: {by_heads}", flush=True)
        else:
            best = da.best_config(rows, "bf16", args.heads, args.margin) if "bf16" in kvs else {}
            best_fp8 = da.best_config(rows, "fp8", args.heads, args.margin) if "fp8" in kvs else None
            print(
                f"best of {args.best_from} over heads {args.heads}: bf16 {best}; fp8 {best_fp8}", flush=True
            )
    cfg = dict(best)
    if args.config:
        given = json.loads(args.config)
        unknown = set(given) - set(da.CONFIG_KEYS) if isinstance(given, dict) else {"(not an object)"}
        if unknown:
            ap.error(f"--config: a JSON object with keys among {da.CONFIG_KEYS}; unknown: {sorted(unknown)}")
        cfg |= given
    cfg |= {
        k: v
        for k, v in dict(
            tile=args.tile,
            ctas_per_sm=args.ctas_per_sm,
            num_stages=args.num_stages,
            num_warps=args.num_warps,
            snap=args.snap,
            whole_below=args.whole_below,
            seg_cost=args.seg_cost,
            merge_in_pass=args.merge_in_pass,
        ).items()
        if v is not None
    }
    if args.variant:
        v = da.variant_config(0, 0, 0, 0, args.variant)
        cfg |= {
            k: v[k]
            for k in da.CONFIG_KEYS
            if k in v and k not in ("tile", "ctas_per_sm", "num_stages", "num_warps")
        }
    asked = {p for p in args.peers.split(",") if p}
    peers = [p for p in da.PEERS if p in asked]  # table columns in the canonical order

    def emit(rows, table, headers, final=False):
        notes = _grid_notes(args, cfg, best_fp8, by_heads)
        notes += [f"{da.PEER_TITLES[p]} did not run: {why}" for p, why in da.bench.failures.items()]
        if not final:
            notes.append(f"PARTIAL: {len(table)} cases so far.")
        print(table[-1] if table else "", flush=True)
        return write_results(
            rows,
            table,
            headers,
            stem="decode_attention",
            title="Paged decode attention (head_dim 128, page 64): ours vs peers",
            notes="\n\n".join(notes),
        )

    rows, table, headers = da.bench(
        args.grid,
        peers=not args.no_peers,
        peer_list=peers,
        progress=emit,
        fp8_cfg=best_fp8,
        kv=args.kv,
        heads=args.heads,
        cfg_by_heads=by_heads,
        floor=args.floor,
        split=args.split,
        cases=[c.strip() for c in args.cases.split(",")] if args.cases else None,
        **cfg,
    )
    md, _ = emit(rows, table, headers, final=True)
    print(md.read_text())


main()
