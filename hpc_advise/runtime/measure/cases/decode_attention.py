"""Benchmark of paged decode attention (ours, dynamic and static) against its peers, on one GPU.

Cases: Hq/Hkv 8/1 and 64/8, head_dim 128, page 64, bf16 and fp8 e4m3 KV; batches mixing short
and long contexts. Each case's pages are scattered at random over a pool, and the timed loop rotates over
several page tables (distinct pages) so the KV read each call is at least 512 MB across the rotation,
far over the 60 MB L2. Timing: CUDA-graph replay of one graph holding the rotated calls
(``harness.time_cuda``), events around each replay; a peer that cannot be captured falls back to
event-timed back-to-back launches, and its row says so. Plan/update time is excluded everywhere and
reported separately. Peers (same process): FlashInfer ``BatchAttention`` and
``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)``, torch's FA2 varlen
(``aten._flash_attention_forward``) on contiguous KV (bf16 only), our static split-k schedule.
Ceiling: a copy kernel measured in the same process (``microbench.copy_ceiling``, bytes read + written).

torch and the kernels are imported inside the functions; FlashInfer is optional (a missing or failing
peer gives a row with the reason instead of a time).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from hpc_advise.runtime.measure.harness import Timing, environment, rotating, run_row, time_cuda

HEAD_DIM = 128
PAGE = 64
ROTATE_BYTES = 512e6  # KV bytes touched per rotation cycle (>> 60 MB L2)
MAX_ROTATIONS = 8

CASES: dict[str, list[tuple[int, int]]] = {
    # name -> list of (count, length); length < 0 means log-uniform in [1K, 32K]
    "64 x U(1K-32K)": [(64, -1)],
    "128 x U(1K-32K)": [(128, -1)],
    "64 x 4K": [(64, 4096)],
    "32 x 128 + 32 x 4K": [(32, 128), (32, 4096)],
    "2 x 32K + 30 x 4K": [(2, 32768), (30, 4096)],
    "1 x 64K + 15 x 4K": [(1, 65536), (15, 4096)],
    "1 x 128K + 31 x 4K": [(1, 131072), (31, 4096)],
    "1 x 128K": [(1, 131072)],
}
HEADS = ((8, 1), (64, 8))
SMALL = [("64 x 4K", 8, 1), ("1 x 128K + 31 x 4K", 8, 1), ("64 x 4K", 64, 8)]
PEERS = ("static", "fi_batch_attention", "fi_decode_tc", "torch_fa2")
PEER_TITLES = {
    "static": "ours static",
    "fi_batch_attention": "FI BatchAttention",
    "fi_decode_tc": "FI decode (TC)",
    "torch_fa2": "torch FA2 varlen",
}


def case_lengths(name: str, seed: int = 0, cases: dict | None = None) -> list[int]:
    """Lengths of a case of ``cases`` (None: CASES); log-uniform draws come from a fixed seed so every provider
    sees the same."""
    import random

    rng = random.Random(seed)
    lens: list[int] = []
    for count, length in (CASES if cases is None else cases)[name]:
        for _ in range(count):
            lens.append(int(math.exp(rng.uniform(math.log(1024), math.log(32768)))) if length < 0 else length)
    return lens


COPY_SIZES = (1 << 30, 2 << 30)  # bytes per buffer, each far over L2


def copy_ceiling_tbps(sizes=COPY_SIZES) -> float:
    """The copy ceiling of the table, TB/s of bytes read + written: ``microbench.copy_ceiling`` (an elementwise
    copy kernel in a CUDA graph) over buffers far over L2 (a graph-captured ``copy_`` runs on the copy engines,
    well under what a kernel reads)."""
    from hpc_advise.runtime.measure.microbench import copy_ceiling

    return copy_ceiling(sizes)[0]


class Workload:
    """One case on the GPU: a KV pool, R rotations of (page table, lengths), q."""

    def __init__(self, lens: list[int], hq: int, hkv: int, kv_dtype, seed: int = 0):
        import torch

        self.lens, self.hq, self.hkv, self.kv_dtype = lens, hq, hkv, kv_dtype
        elem = 1 if kv_dtype == torch.float8_e4m3fn else 2
        self.kv_bytes = 2 * sum(lens) * hkv * HEAD_DIM * elem  # K and V, each token read once
        self.rotations = max(1, min(MAX_ROTATIONS, math.ceil(ROTATE_BYTES / self.kv_bytes)))
        gen = torch.Generator(device="cuda").manual_seed(seed)
        need = [math.ceil(n / PAGE) for n in lens]
        self.max_pages = max(need)
        pool_pages = sum(need) * self.rotations + 16
        shape = (pool_pages, PAGE, hkv, HEAD_DIM)
        self.k = torch.randn(shape, device="cuda", generator=gen).to(kv_dtype)
        self.v = torch.randn(shape, device="cuda", generator=gen).to(kv_dtype)
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        self.tables, self.indices = rotated_page_tables(need, pool_pages, self.rotations, gen)
        self.indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device="cuda")
        self.indptr[1:] = torch.cumsum(torch.tensor(need, device="cuda"), 0)
        self.last_page_len = (self.seq_lens - 1) % PAGE + 1
        self.q = torch.randn(len(lens), hq, HEAD_DIM, device="cuda", generator=gen).bfloat16()

    def floor_us(self, copy_tbps: float) -> float:
        return self.kv_bytes / (copy_tbps * 1e12) * 1e6


def rotated_page_tables(need: list[int], pool_pages: int, rotations: int, gen):
    """``rotations`` page tables [B, max(need)] int32 over disjoint random pages of a pool of ``pool_pages``
    (request b holds need[b] pages; unused columns 0), and each table's pages in order (FlashInfer's indices)."""
    import torch

    perm = torch.randperm(pool_pages, device="cuda", generator=gen).int()
    used = torch.arange(max(need), device="cuda")[None, :] < torch.tensor(need, device="cuda")[:, None]
    tables, indices = [], []
    for r in range(rotations):
        flat = perm[r * sum(need) : (r + 1) * sum(need)]
        table = torch.zeros(len(need), max(need), dtype=torch.int32, device="cuda")
        table[used] = flat
        tables.append(table)
        indices.append(flat)
    return tables, indices


def _time(calls: list[Callable[[], object]]) -> tuple[Timing, str]:
    """Graph replay of all rotations (a multiple of them per graph); eager launches if capture fails."""
    inner = len(calls) * max(1, 8 // len(calls))
    try:
        return time_cuda(rotating(calls, lambda call: call()), graph=True, inner=inner, reps=20), "graph"
    except Exception:
        import torch

        torch.cuda.synchronize()
        return time_cuda(rotating(calls, lambda call: call()), graph=False, inner=inner, reps=20), "eager"


def _ours(w: Workload, schedule: str, config=None):
    """Our plans over the workload's rotations and one call per rotation; ``config``: op.plan's (None: the
    tuned config of the workload's KV dtype and heads)."""
    from hpc_advise.kernels.decode_attention import op

    plans = [
        op.plan(
            w.seq_lens,
            t,
            page_size=PAGE,
            num_q_heads=w.hq,
            num_kv_heads=w.hkv,
            head_dim=HEAD_DIM,
            schedule=schedule,
            kv_dtype=w.kv_dtype,
            config=config,
        )
        for t in w.tables
    ]
    out = [w.q.new_empty(w.q.shape) for _ in plans]
    calls = [lambda p=p, o=o: op.run(p, w.q, w.k, w.v, out=o) for p, o in zip(plans, out, strict=True)]
    return calls, plans, out


def case_config(kv_dtype, hkv: int, keys: dict | None):
    """The tuned config of a case with ``keys`` (Config fields) replaced; None without keys (op.plan's own)."""
    if not keys:
        return None
    from dataclasses import replace

    from hpc_advise.kernels.decode_attention.config import tuned_config

    return replace(tuned_config(kv_dtype, hkv, HEAD_DIM, PAGE), **keys)


def _fi_batch_attention(w: Workload):
    import flashinfer
    import torch

    calls, outs = [], []
    qo_indptr = torch.arange(len(w.lens) + 1, dtype=torch.int32, device="cuda")
    for idx in w.indices:
        wrapper = flashinfer.BatchAttention(kv_layout="NHD")
        wrapper.plan(
            qo_indptr,
            w.indptr,
            idx,
            w.seq_lens,
            w.hq,
            w.hkv,
            HEAD_DIM,
            HEAD_DIM,
            PAGE,
            causal=False,
            q_data_type=torch.bfloat16,
            kv_data_type=w.kv_dtype,
        )
        o = w.q.new_empty(w.q.shape)
        lse = torch.empty(w.q.shape[:2], dtype=torch.float32, device="cuda")
        outs.append(o)
        calls.append(lambda wr=wrapper, o=o, lse=lse: wr.run(w.q, (w.k, w.v), out=o, lse=lse))
    return calls, outs


def _fi_decode_tc(w: Workload):
    import flashinfer
    import torch

    calls, outs = [], []
    for idx in w.indices:
        ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        wrapper.plan(
            w.indptr,
            idx,
            w.last_page_len,
            w.hq,
            w.hkv,
            HEAD_DIM,
            PAGE,
            q_data_type=torch.bfloat16,
            kv_data_type=w.kv_dtype,
        )
        o = w.q.new_empty(w.q.shape)
        outs.append(o)
        calls.append(lambda wr=wrapper, o=o, keep=ws: wr.run(w.q, (w.k, w.v), out=o))
    return calls, outs


def _torch_fa2(w: Workload):
    import torch

    if w.kv_dtype != torch.bfloat16:
        raise NotImplementedError("FA2 in torch takes bf16/fp16 KV only")
    b = len(w.lens)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    cu_k = torch.zeros(b + 1, dtype=torch.int32, device="cuda")
    cu_k[1:] = torch.cumsum(w.seq_lens, 0)
    tok = torch.cat([torch.arange(n, device="cuda") for n in w.lens])
    req = torch.repeat_interleave(torch.arange(b, device="cuda"), w.seq_lens.long())
    calls, outs = [], []
    max_k = max(w.lens)
    for table in w.tables:
        pages = table[req, tok // PAGE].long()
        k = w.k[pages, tok % PAGE].contiguous()  # [total, Hkv, D], this rotation's tokens, contiguous
        v = w.v[pages, tok % PAGE].contiguous()
        holder: dict = {}

        def call(k=k, v=v, holder=holder):
            holder["out"] = torch.ops.aten._flash_attention_forward(
                w.q, k, v, cu_q, cu_k, 1, max_k, 0.0, False, False
            )[0]
            return holder["out"]

        calls.append(call)
        outs.append(holder)
    return calls, outs


PEER_BUILDERS = {
    "fi_batch_attention": _fi_batch_attention,
    "fi_decode_tc": _fi_decode_tc,
    "torch_fa2": _torch_fa2,
}


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _dtype_name(dt) -> str:
    return "fp8" if "float8" in str(dt) else "bf16"


def _progress(name: str, hq: int, hkv: int, who: str, us: float) -> None:
    """One line per timed provider, so a grid that stalls shows where."""
    print(f"grid {time.strftime('%H:%M:%S')} {name} {hq}/{hkv} {who}: {us:.1f} us", flush=True)


def bench_case(
    name: str,
    hq: int,
    hkv: int,
    kv_dtype,
    copy_tbps: float,
    peers=PEERS,
    env=None,
    floor=False,
    split=False,
    keys=None,
):
    """Rows and one table line for one case; ``keys``: Config fields replaced in the case's tuned config;
    ``floor``: the stream floor of our plans beside ours (decode_attention_floor.py), its columns last;
    ``split``: that, then our pass and our merge launch timed apart (its columns after the floor's)."""
    import torch

    env = env or environment()
    w = Workload(case_lengths(name), hq, hkv, kv_dtype)
    base = {
        "case": name,
        "num_q_heads": hq,
        "num_kv_heads": hkv,
        "head_dim": HEAD_DIM,
        "page_size": PAGE,
        "kv_dtype": _dtype_name(kv_dtype),
        "batch": len(w.lens),
        "kv_bytes": w.kv_bytes,
        "rotations": w.rotations,
        **{f"cfg_{k}": v for k, v in (keys or {}).items()},
    }
    rows = []
    config = case_config(kv_dtype, hkv, keys)
    calls, plans, outs = _ours(w, "dynamic", config)
    t_ours, how = _time(calls)
    _progress(name, hq, hkv, "ours", t_ours.p50)
    rows.append(
        run_row(
            kind="kernel",
            subject="decode_attention",
            provider="hpc_advise_dynamic",
            config=base | {"timing": how, "tbps": w.kv_bytes / t_ours.p50 / 1e6},
            metric="latency",
            unit="us",
            timing=t_ours,
            env=env,
        )
    )
    floor_cells = []
    if floor or split:
        from hpc_advise.runtime.measure.cases import decode_attention_floor

        floor_rows, floor_cells = decode_attention_floor.bench_cells(
            w, plans, calls, t_ours, _time, base, env, split=split
        )
        rows += floor_rows
        _progress(name, hq, hkv, "stream floor (+ tail)", floor_rows[0]["p50"])
    calls[0]()
    torch.cuda.synchronize()
    ours_out = outs[0].clone()
    plan_graph, _ = _time([lambda: plans[0].update(w.seq_lens, w.tables[0], validate=False)])
    plan_eager = time_cuda(
        lambda: plans[0].update(w.seq_lens, w.tables[0], validate=False), graph=False, reps=10
    )
    rows.append(
        run_row(
            kind="kernel",
            subject="decode_attention.plan",
            provider="hpc_advise_dynamic",
            config=base | {"timing": "graph", "eager_us": plan_eager.p50},
            metric="latency",
            unit="us",
            timing=plan_graph,
            env=env,
        )
    )
    results: dict[str, object] = {}
    for peer in peers:
        try:
            if peer == "static":
                pc, _, po = _ours(w, "static", config)
            else:
                pc, po = PEER_BUILDERS[peer](w)
            t, how = _time(pc)
            pc[0]()
            torch.cuda.synchronize()
            o = po[0]["out"] if isinstance(po[0], dict) else po[0]
            diff = _rel(o, ours_out)
            results[peer] = t
            _progress(name, hq, hkv, peer, t.p50)
            rows.append(
                run_row(
                    kind="kernel",
                    subject="decode_attention",
                    provider=peer,
                    config=base | {"timing": how, "rel_diff_vs_ours": diff, "tbps": w.kv_bytes / t.p50 / 1e6},
                    metric="latency",
                    unit="us",
                    timing=t,
                    env=env,
                )
            )
            del pc, po
        except Exception as e:  # a peer that cannot run here: say why, keep going
            results[peer] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            torch.cuda.synchronize()
    tbps = w.kv_bytes / t_ours.p50 / 1e6
    line = [
        name,
        f"{hq}/{hkv}",
        _dtype_name(kv_dtype),
        round(w.kv_bytes / 1e6, 1),
        round(w.floor_us(copy_tbps), 1),
        round(t_ours.p50, 1),
        round(tbps, 2),
        f"{100 * tbps / copy_tbps:.0f}%",
    ]
    for peer in peers:
        r = results.get(peer)
        line.append(round(r.p50, 1) if isinstance(r, Timing) else "n/a")
    for peer in peers:
        r = results.get(peer)
        line.append(f"{r.p50 / t_ours.p50:.2f}x" if isinstance(r, Timing) else "")
    line.append(round(plan_graph.p50, 1))
    line += floor_cells
    failures = {p: r for p, r in results.items() if isinstance(r, str)}
    return rows, line, failures


def headers(peers=PEERS, floor=False, split=False) -> list[str]:
    cols = (
        ["case", "Hq/Hkv", "KV", "KV MB", "floor µs", "ours µs", "TB/s", "of copy"]
        + [f"{PEER_TITLES[p]} µs" for p in peers]
        + [f"vs {PEER_TITLES[p]}" for p in peers]
        + ["plan µs"]
    )
    if floor or split:  # the stream floor's columns, then the split's (its module imports triton)
        from hpc_advise.runtime.measure.cases.decode_attention_floor import HEADERS, SPLIT_HEADERS

        cols += HEADERS + (SPLIT_HEADERS if split else [])
    return cols


KV_DTYPES = ("bf16", "fp8")


def bench(
    grid: str = "full",
    peers: bool = True,
    *,
    peer_list=PEERS,
    progress=None,
    kv="all",
    heads="all",
    floor=False,
    split=False,
    cases=None,
    keys=None,
):
    """Run the grid; returns (rows, table, headers). ``kv`` ('all', or KV dtypes in the order to run them:
    'fp8', 'fp8,bf16', ...) picks the KV dtypes of the full grid, ``heads`` ('all' or 'Hq/Hkv' of HEADS, e.g.
    '64/8') its head counts. ``peers=False`` times ours only (and static); ``progress(rows, table, headers)`` is
    called after each case with everything so far; ``keys`` (Config fields) replace those of each case's tuned
    config. ``floor``: the stream floor of our plans beside ours in every case (decode_attention_floor.py);
    ``split``: that and our pass / merge launch timed apart. ``cases``: names of CASES to run (the full grid's
    order kept), None for all."""
    import torch

    if grid not in ("full", "small"):
        raise ValueError(f"grid must be 'full' or 'small', got {grid!r}")
    if heads != "all" and heads not in {f"{hq}/{hkv}" for hq, hkv in HEADS}:
        raise ValueError(
            f"heads must be 'all' or one of {[f'{hq}/{hkv}' for hq, hkv in HEADS]}, got {heads!r}"
        )
    unknown = sorted(set(cases or ()) - set(CASES))
    if unknown:
        raise ValueError(f"unknown cases {unknown}; known: {list(CASES)}")
    kv_order = list(KV_DTYPES) if kv == "all" else kv.split(",")
    if not kv_order or any(k not in KV_DTYPES for k in kv_order) or len(set(kv_order)) < len(kv_order):
        raise ValueError(f"kv must be 'all' or a comma-separated order of {KV_DTYPES}, got {kv!r}")
    chosen = tuple(peer_list) if peers else ("static",)
    env = environment()
    copy = copy_ceiling_tbps()
    rows = [
        run_row(
            kind="microbench",
            subject="copy_bandwidth",
            provider="torch.mul(x, 1, out=)",
            config={"bytes_tried": list(COPY_SIZES), "method": "kernel", "cuda_graph": True},  # the best kept
            metric="bandwidth",
            unit="TB/s",
            value=copy,
            env=env,
        )
    ]
    if grid == "small":
        todo = [(n, hq, hkv, torch.bfloat16) for n, hq, hkv in SMALL]
    else:
        todo = [
            (n, hq, hkv, dt)
            for dt in (torch.float8_e4m3fn if k == "fp8" else torch.bfloat16 for k in kv_order)
            for hq, hkv in HEADS
            if heads in ("all", f"{hq}/{hkv}")
            for n in CASES
            if cases is None or n in cases
        ]
    table, failures = [], {}
    bench.copy_tbps, bench.failures = copy, failures
    for name, hq, hkv, dt in todo:
        r, line, fail = bench_case(
            name, hq, hkv, dt, copy, peers=chosen, env=env, floor=floor, split=split, keys=keys
        )
        rows += r
        table.append(line)
        if progress:
            progress(rows, table, headers(chosen, floor, split))
        torch.cuda.empty_cache()
        for p, why in fail.items():
            failures.setdefault(p, why)
    return rows, table, headers(chosen, floor, split)


def defaults_note() -> str:
    """The launch configuration each case's KV dtype and head count gets (config.tuned_config), for the notes."""
    import torch

    from hpc_advise.kernels.decode_attention.config import tuned_config

    parts = [
        f"{_dtype_name(dt)} {hq}/{hkv}: {tuned_config(dt, hkv, HEAD_DIM, PAGE)}"
        for dt in (torch.bfloat16, torch.float8_e4m3fn)
        for hq, hkv in HEADS
    ]
    return "config.tuned_config: " + "; ".join(parts)


def warm_flashinfer() -> dict[str, str]:
    """JIT-compile the FlashInfer modules the benchmark uses (bf16 and fp8 KV); returns status per module."""
    import torch

    status = {}
    t0 = time.time()
    for dt in (torch.bfloat16, torch.float8_e4m3fn):
        w = Workload([300, 70], 8, 1, dt)
        w.indices, w.tables = w.indices[:1], w.tables[:1]
        for peer in ("fi_batch_attention", "fi_decode_tc"):
            try:
                calls, _ = PEER_BUILDERS[peer](w)
                calls[0]()
                torch.cuda.synchronize()
                status[f"{peer}/{_dtype_name(dt)}"] = f"ok ({time.time() - t0:.0f}s)"
            except Exception as e:
                status[f"{peer}/{_dtype_name(dt)}"] = f"{type(e).__name__}: {str(e)[:300]}"
        del w
    return status
