"""Sweep launch configs of the FP8 fused MoE on the GPU and merge the fastest into a configs.json.

    python benchmarks/tune_fused_moe.py [--shapes hy3,qwen3-235b,...] [--ts 1,16,128,4096] [--out PATH]
        [--budget-s S]

Times every candidate (``candidates``: a space shared across shapes, so each form compiles once; the
small-T path's candidates up to T = ``SMALL_TUNE_T_MAX``) per (shape, scale mode, T) of
``hpc_advise.runtime.measure.cases.fused_moe.SHAPES`` with CUDA-graph replay, and keeps the fastest. Every
candidate goes through ``hpc_advise.kernels.fused_moe.config.parse`` first (a key no path takes is a bug
here, not a form to time). A candidate whose output differs from the first candidate's by more than
``TUNE_MAX_REL_DIFF`` is dropped. At a prefill T (>= ``PREFILL_T_MIN``) the ``SUSTAINED_FINALISTS``
fastest of the short screen are timed again, each after ``PREFILL_SETTLE_S`` of its own load (the clocks
an H200 holds under its power cap), in ``SUSTAINED_ROUNDS`` interleaved rounds, and the pick is the lowest
median. The entries are merged into ``--out`` (same (E, H, I, top_k, mode, T) replaced, others kept);
default: $OUT/fused_moe_configs.json on the device machine, else a copy beside the package file. Ship by
copying it over hpc_advise/kernels/fused_moe/configs.json (``benchmarks/gpu.sh tune fused_moe``).

The round-by-round tuning modes of the earlier tuner (variants, route/reduce, prefill variants, decode
forms, swap-AB, multi-tile, ping-pong, half tiles, launch-overhead and breakdown studies) went with the
keys they timed: ``git show 41fb96b:benchmarks/tune_fused_moe.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpc_advise.kernels.fused_moe import config as C  # noqa: E402
from hpc_advise.runtime.measure.cases.fused_moe import (  # noqa: E402
    FUSED_SHARED,
    MODES,
    PREFILL_SETTLE_S,
    PREFILL_T_MIN,
    SHAPES,
    _kwargs,
    _time,
    compile_job,
    make_routings,
    make_weights,
    precompile,
)
from hpc_advise.runtime.measure.harness import rotating  # noqa: E402

TUNE_TS = (1, 16, 128, 4096)
TUNE_MAX_REL_DIFF = 1e-2  # a candidate whose output differs more from the first candidate's is dropped
SMALL_TUNE_T_MAX = 16  # the small-T path's candidates are timed up to this T
# prefill points: the fastest few of the short screen re-timed in the sustained state (module docstring).
# Short windows after other configs read the same change from -4 % to +9 %; two processes' sustained
# windows agreed within 0.2 % (benchmarks/results/spread_fused_moe.md).
SUSTAINED_FINALISTS = 3
SUSTAINED_ROUNDS = 3


def candidates(t: int, top_k: int, a2_group: bool) -> list[dict]:
    """Launch configs worth timing at this T (the space is shared across shapes, so each compiles once)."""
    n = t * top_k

    def cfg(bm, gu_n, split, dn_n, gu_w=4, gu_s=4, dn_w=4, dn_s=4, gm=1):
        return dict(
            BLOCK_M=bm,
            GU_N=gu_n,
            GU_K=128,
            SPLIT_K=split,
            GU_GROUP_M=gm,
            GU_WARPS=gu_w,
            GU_STAGES=gu_s,
            DN_N=dn_n,
            DN_K=128,
            DN_GROUP_M=gm,
            DN_WARPS=dn_w,
            DN_STAGES=dn_s,
        )

    # the small-T path's candidates last: the tuner's accuracy reference is the first candidate
    small = small_candidates(a2_group) if t <= SMALL_TUNE_T_MAX else []
    if n <= 256:
        if a2_group:
            return [
                cfg(16, 128, 1, 64),
                cfg(16, 128, 2, 64),
                cfg(16, 64, 2, 64),
                cfg(16, 64, 4, 64),
                cfg(16, 32, 4, 32),
                cfg(16, 128, 1, 128),
            ] + small
        return [
            cfg(16, 32, 1, 64),
            cfg(16, 64, 1, 64),
            cfg(16, 64, 2, 64),
            cfg(16, 32, 1, 32),
            cfg(16, 128, 1, 128),
            cfg(16, 32, 4, 64),
        ] + small
    if n <= 2048:
        if a2_group:
            return [
                cfg(16, 128, 1, 64),
                cfg(32, 128, 1, 128),
                cfg(16, 128, 2, 64),
                cfg(32, 128, 1, 64),
                cfg(64, 128, 1, 128, gm=4),
            ] + small
        return [
            cfg(16, 64, 1, 64),
            cfg(32, 64, 1, 64),
            cfg(16, 128, 1, 128),
            cfg(32, 128, 1, 128),
            cfg(64, 128, 1, 128, gm=4),
            # I = 192 shards (Hy3 TP8): a 64-wide down K step (3 unmasked steps), 64-wide gate/up tiles
            dict(cfg(16, 64, 1, 64), DN_K=64),
            dict(cfg(32, 64, 1, 64), DN_K=64),
            dict(cfg(16, 64, 1, 32, dn_s=6), DN_K=64),
        ] + small
    return prefill_candidates(a2_group, cfg)


def prefill_candidates(a2_group: bool, cfg) -> list[dict]:
    """T·k > 2048. The first candidate is the reference of the tuner's accuracy check (fp32 promotion
    every 128-K step). Block/dynamic scales: BLOCK_M 64 with 8 warps (two warpgroups split the merged
    gate|up N = 256: no register spills, checked offline for sm_90a), 128 only as the old baseline.
    Per-tensor scales: BLOCK_M 128 or 64, promotion (two dots); GU_N 64 / DN_K 64 for I = 192 shards."""
    if a2_group:
        return [
            cfg(64, 128, 1, 128, 8, 3, 8, 3, 8),
            cfg(64, 128, 1, 128, 8, 4, 8, 4, 8),
            cfg(64, 128, 1, 256, 8, 3, 8, 3, 8),
            cfg(64, 128, 1, 128, 8, 3, 4, 3, 8),
            cfg(128, 128, 1, 128, 8, 3, 8, 3, 8),
        ]
    return [
        cfg(128, 128, 1, 128, 8, 3, 8, 3, 8),
        cfg(128, 128, 1, 128, 8, 4, 8, 4, 8),
        cfg(64, 128, 1, 128, 8, 4, 8, 4, 8),
        dict(cfg(128, 64, 1, 128, 8, 4, 8, 4, 8), DN_K=64),
    ]


def small_candidates(a2_group: bool) -> list[dict]:
    """Small-T path configs (op_small.py): gate/up tile width and split-K, down H tile and depth."""

    def cfg(gu_n, split, dn_n, gu_s=4, dn_s=4, dn_w=4, dn_k=128, gu_w=4, pre_q=1):
        return dict(
            PATH="small",
            PRE_Q=pre_q,
            GU_N=gu_n,
            GU_K=128,
            SPLIT_K=split,
            GU_WARPS=gu_w,
            GU_STAGES=gu_s,
            DN_N=dn_n,
            DN_K=dn_k,
            DN_WARPS=dn_w,
            DN_STAGES=dn_s,
        )

    # tiles of >= 64 weight rows (Hopper wgmma); wide gate/up tiles amortize the on-the-fly activation
    # quantization of PRE_Q = 0; split-K for few active experts. PRE_Q = 1 (inputs quantized by a launch of
    # their own) won the first H200 sweep where the small path won at all; PRE_Q = 0 lost everywhere.
    out = [
        cfg(64, 1, 64),
        cfg(128, 1, 64, gu_w=8, gu_s=3),
        cfg(128, 2, 64, gu_w=8, gu_s=3),
        cfg(64, 4, 64),
        cfg(64, 1, 64, gu_s=6),
        cfg(128, 1, 64, gu_w=8, gu_s=3, pre_q=0),
    ]
    if not a2_group:  # static a2: the down K step need not be the 128-wide group (I = 192: 3 steps)
        out.append(cfg(64, 1, 64, dn_k=64))
    return out


def checked(cfgs: list[dict]) -> list[dict]:
    """``cfgs`` with every one read through the config dataclasses (raises ConfigError on a bad key)."""
    return [C.parse(c).to_dict() for c in cfgs]


def sustained_finalists(timed: list[tuple], t: int, log=print) -> list[tuple]:
    """Of ``timed`` ((short-window p50, config, call) per candidate) the SUSTAINED_FINALISTS fastest, each timed
    again after PREFILL_SETTLE_S of its own load in SUSTAINED_ROUNDS interleaved rounds: (median p50, config)."""
    import statistics

    keep = sorted(timed, key=lambda x: x[0])[:SUSTAINED_FINALISTS]
    per: list[list[float]] = [[] for _ in keep]
    for _ in range(SUSTAINED_ROUNDS):
        for (_, _, fn), got in zip(keep, per, strict=True):
            got.append(_time(fn, t, PREFILL_SETTLE_S)[0].p50)
    out = []
    for (short, cfg, _), got in zip(keep, per, strict=True):
        med = statistics.median(got)
        log(f"  sustained: {short:.1f} us short -> {med:.1f} us, rounds {[round(r, 1) for r in got]} {cfg}")
        out.append((med, cfg))
    return out


def tune(shapes=None, ts=TUNE_TS, log=print, budget_s: float | None = None, on_entry: Callable | None = None):
    """Time every candidate at every (shape, mode, T); returns configs.json entries (the pick's p50 µs).
    With ``budget_s``, stops starting new points once that many seconds of timing have passed;
    ``on_entry(entries)`` runs after each point (a run cut short keeps the points it finished)."""
    import torch

    from hpc_advise.kernels.fused_moe import op

    shapes = shapes or list(SHAPES)
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; known: {', '.join(SHAPES)}")
    plan = {}
    for shape in shapes:
        e, h, i, k = SHAPES[shape][:4]
        for mode in MODES[shape]:
            for t in ts:
                plan[shape, mode, t] = checked(candidates(t, k, mode.endswith("dynamic")))
    jobs = [compile_job(shape, mode, c) for (shape, mode, _t), cs in plan.items() for c in cs]
    log(f"tune: precompiled {precompile(jobs)} of {len(jobs)} jobs")
    t0 = time.monotonic()  # the budget covers the timing, not the compilation
    entries = []
    for shape in shapes:
        e, h, i, k, eg, off = SHAPES[shape]
        for mode in MODES[shape]:
            wts = make_weights(e, h, i, mode)
            kw = _kwargs(wts, mode, off)
            for t in ts:
                if budget_s is not None and time.monotonic() - t0 > budget_s:
                    log(f"  tune: budget of {budget_s:.0f} s spent, skipping {shape} {mode} T={t}")
                    continue
                sets = make_routings(t, k, eg, h, 8 if t <= 128 else 1, shared=shape in FUSED_SHARED)
                first, timed = None, []  # (p50 µs, config, timed call)
                for c in plan[shape, mode, t]:

                    def body(s, c=c, wts=wts, kw=kw):
                        return op.fused_moe(s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], config=c, **kw)

                    try:
                        out = body(sets[0]).float()  # accuracy check against the first candidate
                        first = out if first is None else first
                        diff = float((out - first).norm() / first.norm().clamp(min=1e-30))
                        if diff > TUNE_MAX_REL_DIFF:
                            log(f"  {shape} {mode} T={t} {c}: dropped, rel diff {diff:.2e} vs first")
                            continue
                        fn = rotating(sets, body)
                        timing, why = _time(fn, t)
                    except Exception as exc:
                        log(f"  {shape} {mode} T={t} {c}: {type(exc).__name__}: {str(exc)[:200]}")
                        continue
                    if why is not None:  # eager timing is not comparable with the others' graph replay
                        log(f"  {shape} {mode} T={t} {c}: dropped, graph capture failed: {why}")
                        continue
                    log(
                        f"  cand {shape} {mode} T={t} p50 {timing.p50:.2f} us {json.dumps(c, sort_keys=True)}"
                    )
                    timed.append((timing.p50, c, fn))
                if not timed:
                    continue
                picks = sustained_finalists(timed, t, log) if t >= PREFILL_T_MIN else [x[:2] for x in timed]
                us, cfg = min(picks, key=lambda x: x[0])
                log(f"  {shape} {mode} T={t}: {us:.1f} us {cfg}")
                entries.append(dict(E=e, H=h, I=i, top_k=k, mode=mode, T=t, config=cfg, p50_us=round(us, 2)))
                if on_entry:
                    on_entry(entries)
            del wts
            torch.cuda.empty_cache()
    return entries


def write_configs(entries: list[dict], path, gpu: str) -> None:
    """Merge ``entries`` into the configs.json at ``path`` (same key replaced)."""
    import datetime as dt

    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {"version": 1, "entries": []}
    keys = {(x["E"], x["H"], x["I"], x["top_k"], x["mode"], x["T"]) for x in entries}
    kept = [
        x
        for x in data.get("entries", [])
        if (x["E"], x["H"], x["I"], x["top_k"], x["mode"], x["T"]) not in keys
    ]
    data = {
        "version": 1,
        "gpu": gpu,
        "tuned_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "entries": kept + entries,
    }
    tmp = path.with_name(path.name + ".tmp")  # replaced in one step: a killed run leaves a whole file
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=None, help=f"comma list of {', '.join(SHAPES)} (default: all)")
    ap.add_argument("--ts", default=",".join(map(str, TUNE_TS)), help="comma list of T")
    ap.add_argument("--out", type=Path, default=None, help="configs.json to merge into")
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting new points after this")
    args = ap.parse_args()
    try:
        ts = tuple(int(t) for t in args.ts.split(","))
    except ValueError:
        raise SystemExit(f"--ts takes a comma list of whole numbers, got {args.ts!r}") from None
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("tune_fused_moe needs a CUDA GPU")
    out = args.out or Path(os.environ.get("OUT", C.CONFIG_PATH.parent)) / "fused_moe_configs.json"
    gpu = torch.cuda.get_device_name(0)
    shapes = args.shapes.split(",") if args.shapes else None
    entries = tune(shapes, ts, budget_s=args.budget_s, on_entry=lambda es: write_configs(es, out, gpu))
    print(f"tune_fused_moe: {len(entries)} entries merged into {out}")


if __name__ == "__main__":
    main()
