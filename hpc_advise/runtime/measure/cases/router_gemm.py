"""Benchmark cases of the router GEMM (``hpc_advise.kernels.router_gemm``) against cuBLAS.

``bench(grid, peers)`` times, per (N, K, M), with CUDA-graph replay (``time_cuda``):
- ``ours``: ``router_gemm`` on bf16 x (2 bf16 tensor-core products, fp32 out);
- ``ours_x32``: ``router_gemm`` on fp32 x split in registers (3 products), full grid only;
- ``cublas_fp32``: ``x.float() @ W.t()`` with TF32 off, the x→fp32 cast included (how a framework
  runs an fp32 gate); ``cublas_tf32``: the same with TF32 on; ``cublas_bf16``: ``x @ bf16(W).t()``
  with bf16 output (reference only: it fails the accuracy bar).
Inputs rotate: every timed call reads its own x and its own weight copy, and one graph replay walks
through enough sets that their bytes exceed 2× the L2 size, so neither x nor W is served from L2
(in serving, each layer's router weight is evicted by the rest of the forward pass between uses).
``accuracy(...)`` adds relative errors vs float64 and top-8 set changes vs cuBLAS FP32.
``precompile`` compiles launch configs in parallel processes. The launch-config tuner, which times its
candidates on these same inputs, is ``benchmarks/tune_router_gemm.py``.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor

from hpc_advise.runtime.measure.harness import environment, rotating, run_row, time_cuda

SHAPES_FULL = [(192, 4096), (128, 4096), (256, 7168)]  # Hy3, Qwen3-235B, DeepSeek-V3 (N experts, K hidden)
M_FULL = [1, 8, 32, 64, 128, 512, 2048, 8192]
SHAPES_SMALL = [(192, 4096)]
M_SMALL = [1, 64, 2048]

HEADERS = [
    "N",
    "K",
    "M",
    "ours µs",
    "ours fp32-x µs",
    "cuBLAS FP32 µs",
    "cuBLAS TF32 µs",
    "cuBLAS BF16 µs",
    "floor µs",
    "ours % floor",
    "ours GB/s",
    "ours TFLOP/s",
    "× FP32",
    "× TF32",
    "ours hot-W µs",
    "FP32 hot-W µs",
]


def ceilings() -> tuple[float, float, float]:
    """(copy bytes/s, bf16 FLOP/s, L2 bytes) of this GPU: measured profile values where known."""
    import torch

    name = torch.cuda.get_device_name()
    l2 = float(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20))
    try:
        from hpc_advise.profiles import get_gpu

        gpu = get_gpu(name)
        return gpu.rate("copy_bw_tbps") * 1e12, gpu.rate("bf16_tflops") * 1e12, l2
    except Exception:
        from hpc_advise.runtime.measure.harness import DESIGN_COPY_TBPS

        return DESIGN_COPY_TBPS * 1e12, 758e12, l2  # H200 measured (shared/DESIGN.md §7)


def input_sets(N: int, K: int, M: int, l2_bytes: float, x32: bool, hot_w: bool = False):
    """Rotating input sets; a replay of ``n`` calls touches > 2× L2 bytes. ``hot_w``: every set shares
    one weight (L2-resident weights, rotating x only)."""
    import torch

    from hpc_advise.kernels.router_gemm import op

    per_call = (0 if hot_w else 4 * N * K) + 2 * M * K + 4 * M * N
    n = max(2, min(64, math.ceil(2 * l2_bytes / per_call)))
    sets = []
    shared = None
    for _ in range(n):
        if shared is None or not hot_w:
            w = torch.randn(N, K, device="cuda") * 0.02
            hi, lo = op.prepare(w)
            shared = (w, hi, lo)
        w, hi, lo = shared
        xf = torch.randn(M, K, device="cuda")
        x = xf.to(torch.bfloat16)
        sets.append(
            {"w": w, "hi": hi, "lo": lo, "wb": hi, "x": x, "xf": xf if x32 else None},
        )
    return sets


def time_sets(sets, body):
    """Timing of ``body`` in CUDA-graph replays that walk through ``sets`` (10 calls or more each)."""
    n = len(sets)
    inner = n * max(1, math.ceil(10 / n))
    return time_cuda(rotating(sets, body), inner=inner, reps=20, warmup=2)


def _providers(peers: bool, x32: bool):
    import torch

    from hpc_advise.kernels.router_gemm import op

    def mm(tf32: bool):
        def body(s):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            return torch.matmul(s["x"].float(), s["w"].t())

        return body

    prov = {"ours": lambda s: op.router_gemm(s["x"], s["hi"], s["lo"])}
    if x32:
        prov["ours_x32"] = lambda s: op.router_gemm(s["xf"], s["hi"], s["lo"])
    if peers:
        prov["cublas_fp32"] = mm(False)
        prov["cublas_tf32"] = mm(True)
        prov["cublas_bf16"] = lambda s: torch.matmul(s["x"], s["wb"].t())
    return prov


def _latency_row(provider, N, K, M, n_sets, weights, timing, env) -> dict:
    config = {"N": N, "K": K, "M": M, "rotating_sets": n_sets, "weights": weights, "graph": True}
    return run_row(
        kind="kernel",
        subject="router_gemm",
        provider=provider,
        config=config,
        metric="latency",
        unit="us",
        timing=timing,
        env=env,
    )


def bench(grid: str = "full", peers: bool = True):
    """(rows, table, headers): latency rows for every (shape, M, provider) and the summary table."""
    import torch

    if grid not in ("full", "small"):
        raise ValueError(f"grid must be 'full' or 'small', got {grid!r}")
    shapes, ms = (SHAPES_FULL, M_FULL) if grid == "full" else (SHAPES_SMALL, M_SMALL)
    x32 = grid == "full"
    env = environment()
    bw, flops_rate, l2 = ceilings()
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    rows, table = [], []
    _precompile_grid(shapes, ms, x32)
    try:
        for N, K in shapes:
            for M in ms:
                sets = input_sets(N, K, M, l2, x32)
                t = {}
                for name, body in _providers(peers, x32).items():
                    t[name] = time_sets(sets, body)
                    rows.append(_latency_row(name, N, K, M, len(sets), "hbm", t[name], env))
                del sets
                if x32 and M <= 64:  # weights L2-resident (x still rotating): the optimistic case
                    hot = input_sets(N, K, M, l2, False, hot_w=True)
                    prov = _providers(peers, False)
                    for name in ("ours", "cublas_fp32"):
                        if name not in prov:
                            continue
                        t[name + "_hotw"] = time_sets(hot, prov[name])
                        row = _latency_row(name + "_hotw", N, K, M, len(hot), "l2", t[name + "_hotw"], env)
                        rows.append(row)
                    del hot
                nbytes = 4 * N * K + 2 * M * K + 4 * M * N
                flops = 2 * 2 * M * N * K
                floor = max(nbytes / bw, flops / flops_rate) * 1e6
                ours = t["ours"].p50
                p50 = {k: v.p50 for k, v in t.items()}
                table.append(
                    [N, K, M, ours]
                    + [p50.get(k) for k in ("ours_x32", "cublas_fp32", "cublas_tf32", "cublas_bf16")]
                    + [floor, 100 * floor / ours, nbytes / ours / 1e3, flops / ours / 1e6]
                    + [p50[k] / ours if k in p50 else None for k in ("cublas_fp32", "cublas_tf32")]
                    + [p50.get("ours_hotw"), p50.get("cublas_fp32_hotw")]
                )
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
        torch.cuda.empty_cache()
    return rows, table, list(HEADERS)


def _precompile_grid(shapes, ms, x32: bool) -> None:
    import torch

    from hpc_advise.kernels.router_gemm.configs import pick_config

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    jobs = [
        (N, K, pick_config(M, N, K, sms).to_dict(), xf, M)
        for N, K in shapes
        for M in ms
        for xf in ((False, True) if x32 else (False,))
    ]
    precompile(jobs)


def accuracy(shapes=SHAPES_FULL, M: int = 2048, top_k: int = 8):
    """(rows, lines): relative error vs float64 and top-k set changes vs cuBLAS FP32, per provider."""
    import torch

    from hpc_advise.kernels.router_gemm import op, reference

    env = environment()
    rows, lines = [], []
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    try:
        for N, K in shapes:
            w = torch.randn(N, K, device="cuda") * 0.02
            hi, lo = op.prepare(w)
            xf = torch.randn(M, K, device="cuda")
            x = xf.to(torch.bfloat16)
            exact = reference.router_gemm_reference(x, w)
            torch.backends.cuda.matmul.allow_tf32 = False
            fp32 = x.float() @ w.t()
            torch.backends.cuda.matmul.allow_tf32 = True
            tf32 = x.float() @ w.t()
            outs = {
                "ours": op.router_gemm(x, hi, lo),
                "cublas_fp32": fp32,
                "cublas_tf32": tf32,
                "cublas_bf16": (x @ hi.t()).float(),
            }
            ref_set = fp32.topk(top_k, -1).indices.sort(-1).values
            top = exact.topk(top_k + 1, -1).values
            norm = torch.sqrt((x.double() ** 2) @ (w.double() ** 2).t()).amax(-1)
            near_tie = (top[:, top_k - 1] - top[:, top_k]) < 2.0**-12 * norm
            parts = []
            for name, y in outs.items():
                rel = ((y.double() - exact).norm() / exact.norm()).item()
                changed = (y.topk(top_k, -1).indices.sort(-1).values != ref_set).any(-1)
                frac = changed.float().mean().item()
                base = {"N": N, "K": K, "M": M, "near_ties": int(near_tie.sum())}
                for metric, value in (("rel_error", rel), ("top8_changed_frac", frac)):
                    rows.append(
                        run_row(
                            kind="kernel",
                            subject="router_gemm",
                            provider=name,
                            config=base,
                            metric=metric,
                            unit="ratio",
                            value=value,
                            env=env,
                        )
                    )
                parts.append(f"{name} rel err {rel:.2e}, top-{top_k} changed {100 * frac:.2f}%")
            # ours_x32 against the fp32-x float64 product
            exact32 = reference.router_gemm_reference(xf, w)
            y32 = op.router_gemm(xf, hi, lo)
            rel32 = ((y32.double() - exact32).norm() / exact32.norm()).item()
            rows.append(
                run_row(
                    kind="kernel",
                    subject="router_gemm",
                    provider="ours_x32",
                    config={"N": N, "K": K, "M": M},
                    metric="rel_error",
                    unit="ratio",
                    value=rel32,
                    env=env,
                )
            )
            parts.append(f"ours_x32 rel err {rel32:.2e} (vs fp64 of fp32 x)")
            lines.append(f"- N={N} K={K} M={M} ({int(near_tie.sum())} near ties): " + "; ".join(parts))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    return rows, lines


# ---------------------------------------------------------------- compiling


def _compile_jobs(jobs: list[tuple]) -> int:
    """Worker: launch each (N, K, config, x_fp32, M) once so Triton compiles it into its disk cache (M is
    not a specialization key of the tensor-core kernel, so its compile serves every M; the gemv kernel
    is specialized on the power of two above M, so it is launched at the job's M)."""
    import torch

    from hpc_advise.kernels.router_gemm import op
    from hpc_advise.kernels.router_gemm.configs import Config

    done = 0
    for N, K, cfg, x32, M in jobs:
        w = torch.randn(N, K, device="cuda") * 0.02
        hi, lo = op.prepare(w)
        m = M if cfg.get("impl") == "gemv" else 2
        x = torch.randn(m, K, device="cuda", dtype=torch.float32 if x32 else torch.bfloat16)
        try:
            op.router_gemm(x, hi, lo, config=Config(**cfg))
            done += 1
        except Exception as exc:  # out of resources etc.: the timing pass skips it too
            print(f"compile failed N={N} K={K} {cfg}: {type(exc).__name__}: {exc}", flush=True)
    torch.cuda.synchronize()
    return done


def precompile(jobs: list[tuple], workers: int | None = None) -> int:
    """Compile (N, K, config dict, x_fp32, M) jobs in parallel processes (Triton's disk cache is shared)."""
    import multiprocessing as mp

    uniq = list({repr(j): j for j in jobs}.values())
    workers = workers or max(1, min(14, (os.cpu_count() or 2) - 2, len(uniq)))
    chunks = [uniq[i::workers] for i in range(workers)]
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        return sum(pool.map(_compile_jobs, chunks))
