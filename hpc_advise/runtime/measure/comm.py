"""Collective-communication benchmark: all-reduce, all-gather, reduce-scatter and all-to-all through
``torch.distributed``, one process per GPU (NCCL) or per CPU rank (gloo), message sizes 4 KB to 1 GB.

Every process this module starts gets ``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``
(NVLink multicast off: on the shared H200 hosts a program using it can take the host's GPUs down).

Sizes, algorithm bandwidth and bus bandwidth follow nccl-tests (github.com/NVIDIA/nccl-tests,
doc/PERFORMANCE.md): ``bytes`` is the per-rank buffer of all-reduce and all-to-all, the gathered output
of all-gather and the reduced input of reduce-scatter; algbw = bytes / time; busbw = algbw x factor
with factor 2(n-1)/n for all-reduce and (n-1)/n for all-gather, reduce-scatter and all-to-all, so busbw
compares with the per-direction link bandwidth whatever n is. At one rank the factor is 0.

Each timed iteration is timed on every rank (CUDA events on GPU, ``perf_counter`` on CPU); the slowest
rank's time per iteration is kept (an element-wise MAX all-reduce of the samples), and the row holds
its p20/p50/p80 in microseconds. Before timing, each op's result is checked on rank-dependent data.
Timing ``eager`` (default) launches each call from Python, so small messages measure torch.distributed's
per-call host cost too (~50 µs on an H200 host); ``graph`` (GPU only) captures up to 16
back-to-back calls in one CUDA graph and times its replays, the device-side cost a CUDA-graph-captured
decode step (SGLang's) pays. An op whose capture fails is timed eagerly, and its rows say why.
Rows: kind ``comm``, subject = op, provider ``torch.distributed.<backend>``, config {op, bytes,
world_size, backend, device, dtype, iters, timing, algbw_gbps, busbw_gbps (both at p50), busbw_factor,
env (the two multicast variables as the rank-0 process saw them)}: what ``advisor.comm_model`` fits.
``measured_figures`` turns rows into GPU-profile figures: peak bus bandwidths and those fits.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterable

from hpc_advise.advisor import comm_model
from hpc_advise.runtime.measure.dist_run import MULTICAST_OFF, join_within, multicast_off
from hpc_advise.runtime.measure.harness import Timing, _percentiles, capture_graph, environment, run_row

OPS = tuple(comm_model.OP_NAMES)  # torch.distributed's names; the advisor's are the values
BUSBW_FACTOR = {op: comm_model.BUSBW_FACTOR[name] for op, name in comm_model.OP_NAMES.items()}
DTYPE_BYTES = 4  # float32 buffers
DEFAULT_SIZES = tuple(1 << p for p in range(12, 31))  # 4 KiB .. 1 GiB


def sizes_between(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two from ``lo`` to ``hi`` bytes inclusive."""
    if lo <= 0 or hi < lo:
        raise ValueError(f"bad size range {lo}..{hi}")
    out, s = [], 1 << (lo - 1).bit_length()
    while s <= hi:
        out.append(s)
        s <<= 1
    return tuple(out)


def bus_bandwidth_gbps(op: str, nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10**9 bytes/s) as nccl-tests defines them."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * BUSBW_FACTOR[op](world_size)


def world_sizes(n_devices: int) -> list[int]:
    """GPU counts to measure on a host with ``n_devices``: powers of two up to n, and n (1 only if n == 1)."""
    if n_devices <= 1:
        return [1]
    sizes = {1 << p for p in range(1, n_devices.bit_length()) if 1 << p <= n_devices}
    return sorted(sizes | {n_devices})


def _iters_for(nbytes: int, base: int) -> int:
    return max(5, min(base, int(base * (1 << 24) / max(nbytes, 1)))) if nbytes > (1 << 24) else base


def _gather_fn(dist):
    """torch >= 2.13 renames all_gather_into_tensor / reduce_scatter_tensor to *_single."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _scatter_fn(dist):
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _make_op(op: str, nbytes: int, rank: int, ws: int, device):
    """Buffers and a closure running the collective once (out of place where torch allows)."""
    import torch
    import torch.distributed as dist

    n = nbytes // DTYPE_BYTES
    if op == "all_reduce":
        buf = torch.empty(n, device=device).uniform_()
        return (lambda: dist.all_reduce(buf)), buf
    chunk = n // ws
    if op == "all_gather":
        src, dst = torch.empty(chunk, device=device).uniform_(), torch.empty(chunk * ws, device=device)
        gather = _gather_fn(dist)
        return (lambda: gather(dst, src)), dst
    if op == "reduce_scatter":
        src, dst = torch.empty(chunk * ws, device=device).uniform_(), torch.empty(chunk, device=device)
        scatter = _scatter_fn(dist)
        return (lambda: scatter(dst, src)), dst
    src, dst = torch.empty(chunk * ws, device=device).uniform_(), torch.empty(chunk * ws, device=device)
    return (lambda: dist.all_to_all_single(dst, src)), dst


def _check_op(op: str, rank: int, ws: int, device) -> None:
    """Run ``op`` once on rank-dependent data and compare with the answer computed by hand."""
    import torch
    import torch.distributed as dist

    chunk = 4
    if op == "all_reduce":
        x = torch.full((chunk,), float(rank + 1), device=device)
        dist.all_reduce(x)
        want = torch.full((chunk,), ws * (ws + 1) / 2, device=device)
    elif op == "all_gather":
        src = torch.full((chunk,), float(rank), device=device)
        x = torch.empty(chunk * ws, device=device)
        _gather_fn(dist)(x, src)
        want = torch.arange(ws, device=device, dtype=torch.float32).repeat_interleave(chunk)
    elif op == "reduce_scatter":
        src = torch.arange(chunk * ws, device=device, dtype=torch.float32) + rank
        x = torch.empty(chunk, device=device)
        _scatter_fn(dist)(x, src)
        want = (
            ws * (torch.arange(chunk, device=device, dtype=torch.float32) + rank * chunk) + ws * (ws - 1) / 2
        )
    else:  # all_to_all: block j of rank i goes to block i of rank j
        src = 100.0 * rank + torch.arange(ws, device=device, dtype=torch.float32).repeat_interleave(chunk)
        x = torch.empty(chunk * ws, device=device)
        dist.all_to_all_single(x, src)
        want = 100.0 * torch.arange(ws, device=device, dtype=torch.float32).repeat_interleave(chunk) + rank
    if not torch.equal(x, want):
        raise RuntimeError(f"{op} gave a wrong result on rank {rank}: {x.tolist()} != {want.tolist()}")


def _time_op(fn, iters: int, warmup: int, device) -> list[float]:
    """Microseconds of each of ``iters`` calls on this rank."""
    import torch

    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        pairs = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)
        ]
        for start, end in pairs:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) * 1000.0 for s, e in pairs]
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _time_op_graph(fn, iters: int, warmup: int, nbytes: int) -> list[float]:
    """Microseconds per call of ``iters`` replays of a CUDA graph holding up to 16 calls of ``fn``."""
    import torch

    inner = max(1, min(16, (1 << 24) // max(nbytes, 1)))
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    graph = capture_graph(fn, inner)
    graph.replay()
    torch.cuda.synchronize()
    pairs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)
    ]
    for start, end in pairs:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 / inner for s, e in pairs]


def _worker(
    rank: int,
    ws: int,
    store_file: str,
    device_kind: str,
    ops,
    sizes,
    iters: int,
    warmup: int,
    queue,
    graph: bool = False,
) -> None:
    os.environ.update(MULTICAST_OFF)
    import torch
    import torch.distributed as dist

    if device_kind == "cuda":
        torch.cuda.set_device(rank)
        device, backend = torch.device("cuda", rank), "nccl"
    else:
        torch.set_num_threads(1)
        device, backend = torch.device("cpu"), "gloo"
    # rendezvous through a file (one host): no TCP port to pick, so no race for a free one
    dist.init_process_group(backend, init_method=f"file://{store_file}", rank=rank, world_size=ws)
    results: list[tuple[str, int, int, list[float], str]] = []
    try:
        for op in ops:
            _check_op(op, rank, ws, device)
            timing = "graph" if graph else "eager"
            for nbytes in sizes:
                fn, _ = _make_op(op, nbytes, rank, ws, device)
                n_iter = _iters_for(nbytes, iters)
                if timing == "graph":
                    try:
                        times = _time_op_graph(fn, n_iter, warmup, nbytes)
                    except Exception as exc:  # same on every rank: capture is a local decision
                        torch.cuda.synchronize(device)
                        timing = f"eager (graph capture failed: {type(exc).__name__}: {str(exc)[:120]})"
                if timing != "graph":
                    times = _time_op(fn, n_iter, warmup, device)
                samples = torch.tensor(times, dtype=torch.float64, device=device)
                dist.all_reduce(samples, op=dist.ReduceOp.MAX)
                if rank == 0:
                    results.append((op, nbytes, n_iter, samples.cpu().tolist(), timing))
                del fn
        dist.barrier(device_ids=[rank] if device_kind == "cuda" else None)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        seen_env = {k: os.environ.get(k) for k in MULTICAST_OFF}  # as this process saw them
        queue.put((seen_env, results))


def measure(
    world_size: int,
    *,
    device: str = "cuda",
    ops: Iterable[str] = OPS,
    sizes: Iterable[int] = DEFAULT_SIZES,
    iters: int = 20,
    warmup: int = 5,
    timeout_s: float = 600.0,
    env: dict[str, str] | None = None,
    graph: bool = False,
) -> list[dict]:
    """Spawn ``world_size`` processes, measure every op at every size, return ``runs`` rows
    (``graph``: CUDA-graph replay timing, module docstring)."""
    import torch.multiprocessing as mp

    ops = tuple(ops)
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise ValueError(f"unknown ops {bad}; known: {list(OPS)}")
    if device not in ("cuda", "cpu"):
        raise ValueError("device must be 'cuda' or 'cpu'")
    if graph and device != "cuda":
        raise ValueError("graph timing needs device 'cuda'")
    if device == "cuda":
        import torch

        if torch.cuda.device_count() < world_size:
            raise RuntimeError(
                f"world size {world_size} needs {world_size} GPUs; {torch.cuda.device_count()} visible"
            )
    unit = DTYPE_BYTES * world_size
    sizes = tuple(sorted({max(unit, s - s % unit) for s in sizes}))
    store_dir = tempfile.mkdtemp(prefix="hpc_advise_comm_")
    try:
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        store_file = os.path.join(store_dir, "store")  # must not exist yet: FileStore creates it
        args = (world_size, store_file, device, ops, sizes, iters, warmup, queue, graph)
        with multicast_off():  # inherited by the spawned processes
            procs = mp.start_processes(
                _worker, args=args, nprocs=world_size, join=False, start_method="spawn"
            )
            join_within(procs, timeout_s, "communication benchmark")
        seen_env, results = queue.get()
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
    env = env or environment()
    backend = "nccl" if device == "cuda" else "gloo"
    rows = []
    for op, nbytes, n_iter, samples, timing in results:
        p20, p50, p80 = _percentiles(samples)
        algbw, busbw = bus_bandwidth_gbps(op, nbytes, p50 * 1e-6, world_size)
        config = {
            "op": op, "bytes": nbytes, "world_size": world_size, "backend": backend, "device": device,
            "dtype": "float32", "iters": n_iter, "timing": timing, "algbw_gbps": algbw, "busbw_gbps": busbw,
            "busbw_factor": BUSBW_FACTOR[op](world_size), "env": seen_env,
        }  # fmt: skip
        rows.append(
            run_row(
                kind="comm",
                subject=op,
                provider=f"torch.distributed.{backend}",
                config=config,
                metric="latency",
                unit="us",
                timing=Timing(p20, p50, p80, len(samples)),
                env=env,
            )  # fmt: skip
        )
    return rows


def measured_figures(rows: list[dict]) -> dict[str, float]:
    """Peak bus bandwidth per op at the largest world size measured (none at one rank: busbw is 0),
    plus ``advisor.comm_model``'s fitted time per op and world size (``{op}_ws{n}_s{i}_…`` figures)
    of the graph-timed rows when there are any, else of the eager ones."""
    comm = [r for r in rows if r.get("kind") == "comm" and r["config"]["world_size"] > 1]
    if not comm:
        return {}
    timings = {r["config"].get("timing", "eager") for r in comm}
    pick = "graph" if "graph" in timings else "eager"
    fitted = comm_model.to_figures(
        comm_model.fit_rows([r for r in comm if r["config"].get("timing", "eager") == pick])
    )
    top = max(r["config"]["world_size"] for r in comm)
    out: dict[str, float] = {}
    for r in comm:
        if r["config"]["world_size"] == top:
            key = f"{comm_model.OP_NAMES[r['subject']]}_busbw_gbps"
            out[key] = max(out.get(key, 0.0), float(r["config"]["busbw_gbps"]))
    out["comm_world_size"] = float(top)
    out.update(fitted)
    return out
