"""Sweep launch configs of the router GEMM on the GPU and merge the fastest into a configs.json.

    python benchmarks/tune_router_gemm.py [--ms 1,8] [--out PATH]

Times every candidate (``candidates``: tensor-core tiles with a K split for small M, plus the CUDA-core
``gemv`` forms up to ``GEMV_MAX_M``) per (N, K, M) of ``SHAPES_FULL`` x the M buckets, on the bench's
rotating inputs (x and W from HBM, CUDA-graph replay), and keeps the lowest p50. The candidates are
compiled in parallel processes first. The picks replace their (N, K, M bucket) in a copy of the package
table, written to ``--out`` (default: ``router_gemm_configs.json`` under $HPC_ADVISE_RESULTS, $OUT or
benchmarks/results), every trial to ``router_gemm_trials.json`` beside it; both are rewritten after each
bucket, so a run cut short keeps what it timed. ``bench_router_gemm.py --configs PATH`` then measures that table;
ship it by copying it over hpc_advise/kernels/router_gemm/configs.json (``benchmarks/gpu.sh tune
router_gemm`` runs both).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpc_advise.kernels.router_gemm.configs import GEMV_MAX_M  # noqa: E402
from hpc_advise.runtime.measure.cases.router_gemm import (  # noqa: E402
    M_FULL,
    SHAPES_FULL,
    ceilings,
    input_sets,
    precompile,
    time_sets,
)


def _smem_bytes(c, x32: bool) -> int:
    """Shared memory of a config's pipeline stages, bytes (candidates keep it <= 200 KB)."""
    if c.get("impl") == "gemv":  # stages of (x, hi, lo) strips when the K loop is pipelined
        return (
            0
            if c["num_stages"] == 1
            else c["num_stages"] * c["block_n"] * c["block_k"] * 3 * (4 if x32 else 2)
        )
    xb = 4 if x32 else 2
    return c["num_stages"] * (c["block_m"] * c["block_k"] * xb + 2 * c["block_k"] * c["block_n"] * 2)


def candidates(M: int, N: int, K: int, num_sms: int) -> list[dict]:
    """Launch configs worth timing for one (M, N, K)."""
    out = []

    def add(bm, bn, bk, split, warps, stages):
        k_blocks = -(-K // bk)
        if split > k_blocks or bn > max(64, 1 << (N - 1).bit_length()):
            return
        c = dict(block_m=bm, block_n=bn, block_k=bk, split_k=split, num_warps=warps, num_stages=stages)
        if _smem_bytes(c, False) <= 200 * 1024 and c not in out:
            out.append(c)

    if M <= 64:
        bms = [16] if M <= 16 else ([32] if M <= 32 else [32, 64])
        for bm in bms:
            for bn in (32, 64):
                for bk in (64, 128, 256):
                    tiles = -(-M // bm) * -(-N // bn)
                    k_blocks = -(-K // bk)
                    for mult in (1, 2, 4):
                        s = max(1, min(k_blocks, (mult * num_sms) // tiles))
                        while s > 1 and k_blocks % s:
                            s -= 1
                        add(bm, bn, bk, s, 4, 3)
    elif M <= 512:
        for bm, bn in ((64, 64), (64, 128), (128, 64)):
            for bk in (64, 128):
                tiles = -(-M // bm) * -(-N // bn)
                k_blocks = -(-K // bk)
                for s in (1, 2, 4):
                    if s == 1 or tiles * s <= 2 * num_sms:
                        while s > 1 and k_blocks % s:
                            s -= 1
                        add(bm, bn, bk, s, 4, 3)
    else:
        for bm, bn, warps in ((64, 64, 4), (128, 64, 4), (128, 128, 8), (64, 128, 4), (128, 256, 8)):
            for bk in (64, 128):
                for stages in (3, 4):
                    add(bm, bn, bk, 1, warps, stages)
    if M <= GEMV_MAX_M:
        out += gemv_candidates(M, K)
    return out


def gemv_candidates(M: int, K: int) -> list[dict]:
    """CUDA-core small-M configs: experts per program x K strip x warps x stages, keeping each operand
    strip at <= 64 elements per thread (more spills registers at M_PAD = 8, sm_90a compile)."""
    m_pad = 1 << (M - 1).bit_length()
    k_pow2 = 1 << (K - 1).bit_length()
    out = []
    for rows in (1, 2, 4):
        for bk in (512, 1024, 2048, 4096, 8192):
            for warps in (4, 8):
                if bk > k_pow2 or m_pad * rows * bk > 64 * 32 * warps:
                    continue
                for stages in (1, 3):
                    if stages > 1 and bk >= K:  # one strip: nothing to pipeline
                        continue
                    c = dict(
                        block_m=1, block_n=rows, block_k=bk, split_k=1, num_warps=warps, num_stages=stages
                    )
                    c["impl"] = "gemv"
                    if _smem_bytes(c, False) <= 200 * 1024:
                        out.append(c)
    return out


def tune(shapes=SHAPES_FULL, ms=M_FULL, log=print, path=None, on_entries=None) -> dict:
    """Time every candidate config; ``{"entries": [best per (N, K, M)], "trials": [every timing]}``. After
    each bucket both are written to ``path`` and the entries so far handed to ``on_entries``."""
    import torch

    from hpc_advise.kernels.router_gemm import op
    from hpc_advise.kernels.router_gemm.configs import Config

    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    _, _, l2 = ceilings()
    plan = {(N, K, M): candidates(M, N, K, num_sms) for N, K in shapes for M in ms}
    jobs = [(N, K, c, False, M) for (N, K, M), cs in plan.items() for c in cs]
    log(f"tune: {len(jobs)} candidate timings, compiling in parallel ...")
    log(f"tune: compiled {precompile(jobs)}")
    entries, trials = [], []
    for (N, K, M), cs in plan.items():
        sets = input_sets(N, K, M, l2, False)
        best = None
        for c in cs:
            cfg = Config(**c)
            try:
                t = time_sets(sets, lambda s, cfg=cfg: op.router_gemm(s["x"], s["hi"], s["lo"], config=cfg))
            except Exception as exc:
                log(f"  skip {c}: {type(exc).__name__}")
                continue
            trials.append({"n": N, "k": K, "m": M, **c, "us": t.p50})
            if best is None or t.p50 < best[0]:
                best = (t.p50, c)
        del sets
        if best is not None:
            entries.append({"n": N, "k": K, "m_max": M, **best[1], "us": round(best[0], 2)})
            log(f"tune N={N} K={K} M={M}: {best[0]:.2f} us {best[1]}")
        if path is not None:  # progress survives a time limit
            path.write_text(json.dumps({"entries": entries, "trials": trials}, indent=1) + "\n")
        if on_entries is not None and entries:
            on_entries(entries)
    return {"entries": entries, "trials": trials}


def merge(entries: list[dict], out: Path, base: Path | None = None) -> Path:
    """Write the config table ``base`` (default: the package's) to ``out`` with ``entries`` replacing the
    (n, k, m_max) buckets they tuned; the other entries are kept."""
    from hpc_advise.kernels.router_gemm import configs

    base = base or configs.CONFIG_FILE
    data = json.loads(base.read_text()) if base.exists() else {}
    tuned = {(e["n"], e["k"], e["m_max"]) for e in entries}
    kept = [e for e in data.get("entries", []) if (e["n"], e["k"], e["m_max"]) not in tuned]
    data["entries"] = sorted(kept + list(entries), key=lambda e: (e["n"], e["k"], e["m_max"]))
    tmp = out.with_name(out.name + ".tmp")  # replaced in one step: a killed run leaves a whole file
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(out)
    return out


def use_table(path: Path) -> None:
    """Make this process's ``router_gemm`` read its launch configs from ``path`` (a configs.json)."""
    from hpc_advise.kernels.router_gemm import configs

    if not path.is_file():
        raise SystemExit(
            f"router_gemm configs: no file {path}; pass a configs.json (tune_router_gemm.py --out)"
        )
    configs.CONFIG_FILE = path
    configs._table.cache_clear()


def main() -> None:
    from hpc_advise.kernels.router_gemm import configs
    from hpc_advise.runtime.measure.harness import results_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default=None, help="comma list of M buckets to tune (default: all)")
    ap.add_argument("--out", type=Path, default=None, help="where the merged configs.json goes")
    args = ap.parse_args()
    try:
        ms = [int(m) for m in args.ms.split(",")] if args.ms else M_FULL
    except ValueError:
        raise SystemExit(f"--ms takes a comma list of whole numbers, got {args.ms!r}") from None
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("tune_router_gemm needs a CUDA GPU")
    out = args.out or results_dir() / "router_gemm_configs.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    base = Path(configs.CONFIG_FILE)
    tuned = tune(
        ms=ms, path=out.with_name("router_gemm_trials.json"), on_entries=lambda es: merge(es, out, base)
    )
    print(f"tune_router_gemm: {len(tuned['entries'])} buckets merged into {out}")


if __name__ == "__main__":
    main()
