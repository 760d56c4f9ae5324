"""Benchmark the MoE layer under expert parallelism (EP) and tensor parallelism (TP) on several GPUs.

    python benchmarks/bench_ep_moe.py [--world-size 2] [--shapes hy3,deepseek-v3] [--ts 1,16,128,1024,4096]
                                      [--no-kb] [--no-precompile]

Shapes: Hy3 (E 192, H 4096, I 1536, top-8, per-tensor fp8 weights, static activation scales) and
DeepSeek-V3 (E 256, H 7168, I 2048, top-8, 128x128 block fp8, dynamic 1x128 activation groups).
T = tokens per rank (each EP rank's own tokens, as under attention data parallelism); the global batch
is world_size x T. Providers, same weights (fp8 from N(0,1), random scales) and same tokens:
- ``ep1``: our fused FP8 op on one GPU with all experts over the global batch (no communication);
- ``ep{n}``: ``hpc_advise.runtime.ep_moe.ep_moe`` on n GPUs (E/n experts each), stages dispatch
  (counts all-to-all, host sync, packed-row all-to-all), experts (our op on the received rows),
  combine (all-to-all back + rank-order sum);
- ``tp{n}``: ``tp_moe`` on n GPUs (I/n of every expert, the global batch on every rank), stages
  experts and combine (the all-reduce).
Routing: uniform random distinct top-8 per token, softmax weights, fixed seeds; 8 routings cycled so
the activated weights come from HBM. Timing: eager launches, one layer per iteration; before each
iteration a 1-element all-reduce lines the ranks up on the GPU; CUDA events at each stage; the slowest
rank's time of each iteration (element-wise MAX over ranks) is kept; p20/p50/p80 over the iterations
after warm-up. Stage medians are taken separately, so they need not add up to the total. Every
variant's output is compared with ``ep1``'s on the same tokens (relative Frobenius difference).

Rows go to the knowledge base (kind ``ep_moe``, unless --no-kb) and to ep_moe_h200x2.md/.jsonl under
benchmarks/results/ (or $OUT / $HPC_ADVISE_RESULTS).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {  # name -> (E, H, I, top_k, mode)
    "hy3": (192, 4096, 1536, 8, "tensor-static"),
    "deepseek-v3": (256, 7168, 2048, 8, "block-dynamic"),
    "tiny": (8, 256, 256, 4, "block-dynamic"),  # --cpu-smoke only
}
TS = (1, 16, 128, 1024, 4096)
ROUTINGS = 8
HEADERS = ["shape", "T/rank", "tokens", "EP1 µs", "EP2 µs", "dispatch", "experts", "combine", "TP2 µs",
           "TP experts", "all-reduce", "EP1/EP2", "EP1/TP2", "TP2/EP2", "EP2 diff", "TP2 diff"]  # fmt: skip


def _iters(t: int) -> tuple[int, int]:
    """(warm-up, timed) iterations for T tokens per rank."""
    return (5, 60) if t <= 128 else ((4, 30) if t <= 1024 else (3, 20))


def _op_kwargs(w: dict, mode: str, s13, s2, device) -> dict:
    import torch

    kw = dict(w13_scale=s13, w2_scale=s2)
    if mode.endswith("static"):  # device tensors (as the fused-MoE benchmark: Hy3 ships static scales)
        kw.update(
            a13_scale=torch.full((1,), 4.5 / 448.0, device=device),
            a2_scale=torch.full((1,), 0.05, device=device),
        )
    if w["block"]:
        kw["block_shape"] = (128, 128)
    return kw


def _make_weights(e: int, h: int, i: int, mode: str, device: str, seed: int = 0) -> dict:
    """fp8 weights from N(0,1) with random per-tensor [E] or 128x128 block scales (as the fused-MoE
    benchmark makes them); seeded, so every rank builds the same."""
    import torch

    fp8 = torch.float8_e4m3fn
    g = torch.Generator(device=device).manual_seed(seed)
    w13 = torch.empty(e, 2 * i, h, dtype=fp8, device=device)
    w2 = torch.empty(e, h, i, dtype=fp8, device=device)
    for x in range(e):  # per expert: keeps the fp32 temporaries small
        w13[x] = torch.randn(2 * i, h, device=device, generator=g).to(fp8)
        w2[x] = torch.randn(h, i, device=device, generator=g).to(fp8)
    block = mode.startswith("block")
    n13, n2 = (
        ((e, -(-2 * i // 128), -(-h // 128)), (e, -(-h // 128), -(-i // 128))) if block else ((e,), (e,))
    )
    s13 = (torch.rand(n13, device=device, generator=g) + 0.5) / h**0.5
    s2 = (torch.rand(n2, device=device, generator=g) + 0.5) / i**0.5
    return {"w13": w13, "w2": w2, "s13": s13, "s2": s2, "block": block}


def _tokens(t: int, ws: int, e: int, h: int, k: int, device: str, seed: int) -> list[list[dict]]:
    """ROUTINGS sets of every rank's tokens (the same on every rank: seeded)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    sets = []
    for _ in range(ROUTINGS):
        per_rank = []
        for _ in range(ws):
            ids = torch.rand(t, e, device=device, generator=g).topk(k, dim=1).indices.to(torch.int32)
            w = torch.softmax(torch.randn(t, k, device=device, generator=g), dim=1)
            x = torch.randn(t, h, device=device, generator=g).to(torch.bfloat16)
            per_rank.append({"ids": ids, "w": w, "x": x})
        sets.append(per_rank)
    return sets


def _glob(per_rank: list[dict]) -> dict:
    import torch

    return {key: torch.cat([r[key] for r in per_rank]) for key in ("ids", "w", "x")}


class _HostEvent:
    """``torch.cuda.Event``'s two methods on the host clock (the --cpu-smoke run)."""

    def record(self) -> None:
        import time

        self.t = time.perf_counter()

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.t - self.t) * 1e3


def _timed(run, n_warm: int, n_iter: int, stages: tuple[str, ...], solo: bool, device: str) -> dict:
    """Per-iteration µs of the whole layer and of each stage, the slowest rank's (solo: this rank's)."""
    import torch
    import torch.distributed as dist

    cuda = device == "cuda"
    event = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else _HostEvent
    align = torch.zeros(1, device=device)
    samples: list[list[float]] = []
    for it in range(n_warm + n_iter):
        if not solo:
            dist.all_reduce(align)
        events = {"start": event()}
        events["start"].record()

        def mark(name: str, events=events) -> None:
            events[name] = event()
            events[name].record()

        run(it, mark)
        if cuda:
            torch.cuda.synchronize()
        if it >= n_warm:
            names = ["start", *stages]
            row = [events["start"].elapsed_time(events[stages[-1]]) * 1e3]
            row += [events[a].elapsed_time(events[b]) * 1e3 for a, b in zip(names, names[1:], strict=False)]
            samples.append(row)
    t = torch.tensor(samples, dtype=torch.float64, device=device)
    if not solo:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    cols = t.cpu().t().tolist()
    return {"total": cols[0], **{s: c for s, c in zip(stages, cols[1:], strict=True)}}


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def _experts_factory(device: str):
    """Our fused op on the GPU; the fp32 torch reference in the --cpu-smoke run."""
    from hpc_advise.runtime import ep_moe as EP

    if device == "cuda":
        return EP.fused_experts
    import torch

    from hpc_advise.kernels.fused_moe.reference import fused_moe_reference

    def make(w13, w2, **kw):
        return lambda x, ids, w: fused_moe_reference(x, w13, w2, w, ids, **kw).to(torch.bfloat16)

    return make


def bench_worker(rank: int, ws: int, shapes: list[str], ts: list[int], device: str) -> list[dict]:
    """One rank: every (shape, T) for ep1 (rank 0 alone), ep{ws} and tp{ws}. Returns raw timings."""
    import torch
    import torch.distributed as dist

    from hpc_advise.runtime import ep_moe as EP

    dev = device if device == "cpu" else f"cuda:{rank}"
    make_experts = _experts_factory(device)
    out = []
    for shape in shapes:
        e, h, i, k, mode = SHAPES[shape]
        w = _make_weights(e, h, i, mode, dev)  # the same on every rank
        ep_w = EP.shard_ep({"w13": w["w13"], "w2": w["w2"], "s13": w["s13"], "s2": w["s2"]}, e, ws, rank)
        ep_experts = make_experts(
            ep_w["w13"], ep_w["w2"], **_op_kwargs(w, mode, ep_w["s13"], ep_w["s2"], dev)
        )
        tw13, tw2, ts13, ts2 = EP.shard_tp(w["w13"], w["w2"], w["s13"], w["s2"], ws, rank)
        tp_experts = make_experts(tw13, tw2, **_op_kwargs(w, mode, ts13, ts2, dev))
        full_experts = make_experts(w["w13"], w["w2"], **_op_kwargs(w, mode, w["s13"], w["s2"], dev))
        for t in ts:
            sets = _tokens(t, ws, e, h, k, dev, seed=1000 + t)
            globs = [_glob(s) for s in sets]  # TP's and EP1's batch, built outside the timed region
            n_warm, n_iter = _iters(t) if device == "cuda" else (1, 3)
            res: dict = {"shape": shape, "T": t, "E": e, "H": h, "I": i, "k": k, "mode": mode, "ws": ws}

            def run_ep(it, mark, sets=sets, fn=ep_experts, e=e):
                s = sets[it % ROUTINGS][rank]
                return EP.ep_moe(s["x"], s["ids"], s["w"], fn, e, mark=mark)

            def run_tp(it, mark, globs=globs, fn=tp_experts):
                s = globs[it % ROUTINGS]
                return EP.tp_moe(s["x"], s["ids"], s["w"], fn, mark=mark)

            def run_full(it, mark, globs=globs, fn=full_experts):
                s = globs[it % ROUTINGS]
                out = fn(s["x"], s["ids"], s["w"])
                mark("experts")
                return out

            res["ep"] = _timed(run_ep, n_warm, n_iter, ("dispatch", "experts", "combine"), False, device)
            res["tp"] = _timed(run_tp, n_warm, n_iter, ("experts", "combine"), False, device)
            ep_out = run_ep(0, lambda _: None)  # outputs for the first routing, compared with ep1
            tp_out = run_tp(0, lambda _: None)
            ep_all = [torch.empty_like(ep_out) for _ in range(ws)]
            dist.all_gather(ep_all, ep_out)
            if rank == 0:
                res["ep1"] = _timed(run_full, n_warm, n_iter, ("experts",), True, device)
                ref = run_full(0, lambda _: None)
                res["ep_diff"] = _rel(torch.cat(ep_all), ref)
                res["tp_diff"] = _rel(tp_out, ref)
            dist.barrier()
            out.append(res)
            print(f"rank {rank}: {shape} T={t} done", flush=True)
        del w, ep_w, ep_experts, tp_experts, full_experts, tw13, tw2
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def precompile_jobs(shapes: list[str], ts: list[int], ws: int) -> list[tuple]:
    """Distinct (mode, config, top_k) of every launch config the op will pick: EP ranks receive
    between T and ws*T rows, TP and EP1 see ws*T."""
    from hpc_advise.kernels.fused_moe import op

    jobs = {}
    for shape in shapes:
        e, h, i, k, mode = SHAPES[shape]
        a2 = mode.endswith("dynamic")
        for t in ts:
            cases = [(n, e // ws, i) for n in range(t, ws * t + 1)]  # EP: local experts, any row count
            cases += [(ws * t, e, i // ws), (ws * t, e, i)]  # TP shard, EP1
            for n, el, il in cases:
                cfg = op.get_config(n, k, el, h, il, mode, a2)
                jobs[repr((mode, sorted(cfg.items()), k))] = (mode, cfg, k)
    return list(jobs.values())


def _compile_worker(jobs: list[tuple]) -> int:
    """Run the op once per job on small inputs: Triton compiles into its shared disk cache. H and I
    enter the kernels' specializations only through divisibility by 16 and by the K tile, and the
    per-call sizes are not specialized, so H = I = 256 serves the real shapes."""
    import torch

    from hpc_advise.kernels.fused_moe.op import fused_moe

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a plumbing check under TRITON_INTERPRET=1
    done = 0
    for mode, cfg, k in jobs:
        w = _make_weights(8, 256, 256, mode, dev, seed=3)
        s = _tokens(3, 1, 8, 256, k, dev, seed=4)[0][0]
        kw = _op_kwargs(w, mode, w["s13"], w["s2"], dev)
        try:
            fused_moe(s["x"], w["w13"], w["w2"], s["w"], s["ids"], config=cfg, **kw)
            done += 1
        except Exception as exc:  # the timed run compiles it then, or reports the error itself
            print(f"precompile failed {mode} {cfg}: {type(exc).__name__}: {exc}", flush=True)
    if dev == "cuda":
        torch.cuda.synchronize()
    return done


def precompile(jobs: list[tuple], workers: int = 12) -> int:
    """Compile the jobs in parallel processes (GPU 0); returns how many compiled."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if not jobs:
        return 0
    n = max(1, min(workers, len(jobs)))
    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as pool:
        return sum(pool.map(_compile_worker, [jobs[i::n] for i in range(n)]))


def _p(xs: list[float]) -> tuple[float, float, float]:
    from hpc_advise.runtime.measure.harness import _percentiles

    return _percentiles(xs)


def to_rows(raw: list[dict], env: dict) -> tuple[list[dict], list[list]]:
    from hpc_advise.runtime.measure.harness import Timing, run_row

    rows, table = [], []
    for r in raw:
        ws = r["ws"]
        base = {"E": r["E"], "H": r["H"], "I": r["I"], "top_k": r["k"], "mode": r["mode"],
                "tokens_per_rank": r["T"], "global_tokens": ws * r["T"], "routing": "uniform random, 8 routings cycled",
                "timing": "eager, CUDA events, slowest rank per iteration"}  # fmt: skip
        med = {}
        for prov, key, n, extra in (("ep1", "ep1", 1, {}), (f"ep{ws}", "ep", ws, {"rel_diff_vs_ep1": r["ep_diff"]}),
                                    (f"tp{ws}", "tp", ws, {"rel_diff_vs_ep1": r["tp_diff"]})):  # fmt: skip
            times = r[key]
            p20, p50, p80 = _p(times["total"])
            stages = {s: statistics.median(v) for s, v in times.items() if s != "total"}
            med[key] = (p50, stages)
            cfg = {**base, "world_size": n, "stage_p50_us": stages, "iters": len(times["total"]), **extra}
            rows.append(run_row(kind="ep_moe", subject=r["shape"], provider=prov, config=cfg, metric="latency",
                                unit="us", timing=Timing(p20, p50, p80, len(times["total"])), env=env))  # fmt: skip
        (e1, _), (e2, st_e), (t2, st_t) = med["ep1"], med["ep"], med["tp"]
        us = (
            e1,
            e2,
            st_e["dispatch"],
            st_e["experts"],
            st_e["combine"],
            t2,
            st_t["experts"],
            st_t["combine"],
        )
        # whole µs from 100 up (write_results' 3-significant-digit float format would print 1.23e+03)
        table.append([r["shape"], r["T"], ws * r["T"], *(round(v) if v >= 100 else v for v in us),
                      e1 / e2, e1 / t2, t2 / e2, r["ep_diff"], r["tp_diff"]])  # fmt: skip
    return rows, table


NOTES = """\
T/rank = tokens per rank; tokens = the global batch (world size x T) that every variant processes.
EP1 = our fused FP8 op on one GPU with all experts over the global batch; EP2 = 2 GPUs with half the
experts each and their own T tokens (dispatch = counts all-to-all + host sync + packed-row all-to-all;
experts = our op on the received rows; combine = all-to-all back + rank-order sum); TP2 = 2 GPUs with
half of every expert's intermediate dimension and the whole batch (experts, then an all-reduce).
EP1/EP2 and EP1/TP2 > 1: two GPUs finish a layer of the global batch faster than one; TP2/EP2 > 1: EP
is faster than TP. Eager launches with the host in the loop (EP's dispatch needs a host sync for the
row counts, so it cannot be captured in a CUDA graph; TP and EP1 could be, which would shave their
launch gaps). Stage columns are medians of the slowest rank, taken per stage. 'diff' = relative
Frobenius difference of the layer output from EP1 on the same tokens (fp8 rounding-order noise; the
op's bound against its reference is 2e-2). NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 in
every process.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ts", default=",".join(map(str, TS)))
    ap.add_argument("--no-kb", action="store_true", help="do not store the rows in the knowledge base")
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--stem", default="ep_moe_h200x2")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="plumbing check without a GPU: gloo, shape 'tiny', torch reference experts")  # fmt: skip
    args = ap.parse_args()
    if args.cpu_smoke:
        args.shapes, args.ts, args.no_precompile = "tiny", "1,3", True
    shapes = args.shapes.split(",")
    ts = [int(t) for t in args.ts.split(",")]
    device = "cpu" if args.cpu_smoke else "cuda"
    bad = [s for s in shapes if s not in SHAPES]
    if bad or args.world_size < 2:
        ap.error(f"unknown shapes {bad} (known: {list(SHAPES)})" if bad else "--world-size must be >= 2")

    from hpc_advise.runtime.measure.dist_run import run_ranks
    from hpc_advise.runtime.measure.harness import environment, write_results

    if not args.no_precompile:
        print(
            f"precompiled {precompile(precompile_jobs(shapes, ts, args.world_size))} launch configs",
            flush=True,
        )
    backend = "gloo" if device == "cpu" else "nccl"
    raw = run_ranks(
        bench_worker, args.world_size, backend=backend, args=(shapes, ts, device), timeout_s=3600
    )[0]
    env = environment()
    rows, table = to_rows(raw, env)
    headers = [
        h.replace("EP2", f"EP{args.world_size}").replace("TP2", f"TP{args.world_size}") for h in HEADERS
    ]
    md, _ = write_results(rows, table, headers, stem=args.stem,
                          title=f"MoE layer: EP vs TP on {args.world_size} GPUs", notes=NOTES, env=env)  # fmt: skip
    if not args.no_kb:
        from hpc_advise.knowledge_base.store import KnowledgeBase

        with KnowledgeBase() as kb:
            ids = kb.add_runs(rows)
        print(f"stored {len(ids)} runs rows (kind ep_moe) in {kb.path}")
    print(md.read_text())


if __name__ == "__main__":
    main()
