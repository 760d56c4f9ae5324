"""Paged decode attention: ours (dynamic, static) vs FlashInfer and torch FA2 on this GPU.

Writes decode_attention.{md,jsonl} under benchmarks/results/ (or $OUT / $HPC_ADVISE_RESULTS). With --ship the
jsonl is also copied into the package (hpc_advise/advisor/data/kernel_results/, benchmarks/ship.py); without it
the advisor's data is not touched.
  python benchmarks/bench_decode_attention.py [--grid full|small] [--kv all|bf16|fp8] [--no-peers] [--ship]
  python benchmarks/bench_decode_attention.py --kv fp8 --heads 8/1 --config '{"transposed": false, "ctas_per_sm": 3}'
        # Config fields replaced in every case's tuned config (kernels/decode_attention/config.py)
  python benchmarks/bench_decode_attention.py --warm-flashinfer   # JIT-compile FlashInfer's modules only
  python benchmarks/bench_decode_attention.py --kv bf16,fp8 --peers '' --floor   # ours beside its stream floor
  python benchmarks/bench_decode_attention.py --kv bf16 --heads 8/1 --peers '' --split --cases '64 x 4K,1 x 128K'
        # ... and our pass and merge launch timed apart
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ship import ship  # noqa: E402  (benchmarks/ship.py, beside this script)

from hpc_advise.kernels.decode_attention.config import KEYS  # noqa: E402
from hpc_advise.runtime.measure.cases import decode_attention as da  # noqa: E402
from hpc_advise.runtime.measure.harness import write_results  # noqa: E402


def _grid_notes(args, keys) -> list[str]:
    """The notes under the grid's table: the copy ceiling, timing, our launch configuration and, with
    --floor / --split, what those columns mean."""
    notes = [
        f"Copy ceiling measured in the same process: {da.bench.copy_tbps:.2f} TB/s (a copy kernel, "
        "torch.mul(x, 1, out=) in a CUDA graph, bytes read + written). floor = KV bytes / ceiling; TB/s = KV bytes read (K and V, every "
        "token once) / our p50. 'vs X' = X's time / ours (> 1: we are faster).",
        "Timing: CUDA-graph replay (events around each replay of a graph of rotated calls over distinct "
        "page tables; pool >> L2); rows in the .jsonl say 'graph' or 'eager' per provider. Plan excluded "
        "everywhere; 'plan µs' is our plan.update replayed in a graph (eager figure in the jsonl).",
        f"Launch configuration of ours (dynamic and static): {da.defaults_note()}"
        + (f"; with {keys} replaced in every case" if keys else "")
        + ".",
    ]
    if args.floor or args.split:
        notes.append(
            "Stream floor (--floor, hpc_advise/runtime/measure/cases/decode_attention_floor.py): one Triton launch "
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
        "runtime/measure/cases/decode_attention_floor.py); --peers '' leaves the peers and static out",
    )
    ap.add_argument(
        "--split",
        action="store_true",
        help="--floor, then our attention pass alone (merge launch held back) and our merge launch alone",
    )
    ap.add_argument("--cases", help="comma-separated case names of the full grid to run (default: all)")
    ap.add_argument(
        "--config",
        help="a JSON object of Config fields (" + ", ".join(KEYS) + ") replaced in every case's tuned config",
    )
    ap.add_argument("--warm-flashinfer", action="store_true", help="compile FlashInfer's modules and exit")
    ap.add_argument("--ship", action="store_true", help="copy the jsonl into the package's kernel tables")
    args = ap.parse_args()

    if args.warm_flashinfer:
        print(json.dumps(da.warm_flashinfer(), indent=1))
        return
    keys = {}
    if args.config:
        try:
            keys = json.loads(args.config)
        except json.JSONDecodeError as exc:
            ap.error(f"--config: not JSON ({exc})")
        unknown = set(keys) - set(KEYS) if isinstance(keys, dict) else {"(not an object)"}
        if unknown:
            ap.error(f"--config: a JSON object with keys among {list(KEYS)}; unknown: {sorted(unknown)}")
    if args.ship and (keys or args.grid != "full" or args.kv != "all" or args.heads != "all" or args.cases):
        ap.error(
            "--ship: only the full grid with the tuned configs is shipped (no --config / --kv / --heads / --cases)"
        )
    asked = {p for p in args.peers.split(",") if p}
    peers = [p for p in da.PEERS if p in asked]  # table columns in the canonical order

    def emit(rows, table, headers, final=False):
        notes = _grid_notes(args, keys)
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
        kv=args.kv,
        heads=args.heads,
        floor=args.floor,
        split=args.split,
        cases=[c.strip() for c in args.cases.split(",")] if args.cases else None,
        keys=keys or None,
    )
    md, jl = emit(rows, table, headers, final=True)
    print(md.read_text())
    if args.ship:
        print(f"shipped {ship(jl)}")


if __name__ == "__main__":
    main()
