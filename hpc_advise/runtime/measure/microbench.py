"""Microbenchmarks of one CUDA GPU: device-to-device copy bandwidth and dense GEMM rates (bf16, fp8,
tf32, fp32), each as a knowledge-base ``runs`` row (kind ``microbench``).

- copy: buffers far larger than L2, three ways: ``dst.copy_(src)`` launched eagerly, the same captured
  in a CUDA graph (a graph memcpy node: on one H200 this path gave 2.70 TB/s against
  about 4.2 for eager copies, so it is kept as its own row), and an elementwise kernel
  (``torch.mul(src, 1, out=dst)``) in a graph; bytes counted = bytes read + bytes written (2 x buffer),
  the convention of the device notes and of ``shared/DESIGN.md`` section 7; the figure is the best;
- GEMM: ``torch.matmul`` (bf16; fp32 with TF32 allowed; fp32 with TF32 forbidden) and
  ``torch._scaled_mm`` (fp8 e4m3 x e4m3 -> bf16, per-tensor scales, with and without fast
  accumulation), M = N = K, random inputs (never zeros), FLOPs = 2 M N K.

Every case checks a corner of its result against a float64 reference before it is timed. Rows carry
rates: metric ``bandwidth`` (TB/s) or ``throughput`` (TFLOP/s), with p20/p50/p80 the percentiles of the
rate (p20 from the slow end: the rate at the 80th-percentile latency), and the latency p50 in config.
torch is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpc_advise.runtime.measure.harness import Timing, run_row, time_cuda

GRIDS: dict[str, dict[str, tuple]] = {
    "small": {"copy_bytes": (1 << 30,), "gemm_sizes": (8192,)},
    "full": {"copy_bytes": (256 << 20, 1 << 30, 4 << 30), "gemm_sizes": (4096, 8192, 16384)},
}
GEMM_DTYPES = ("bf16", "fp8", "tf32", "fp32")
# relative error of a 64x64 corner against float64 that a correct GEMM stays under
GEMM_TOLERANCE = {"bf16": 1e-2, "fp8": 2e-2, "tf32": 2e-3, "fp32": 1e-5}
# the measured-figure name each case feeds (GpuProfile.measured keys)
# copy method -> (provider, captured in a CUDA graph)
COPY_METHODS = {
    "eager": ("torch.Tensor.copy_", False),
    "graph": ("torch.Tensor.copy_", True),
    "kernel": ("torch.mul(x, 1, out=)", True),
}
FIGURE = {
    "copy": "copy_bw_tbps",
    "bf16": "bf16_tflops",
    "fp8": "fp8_tflops",
    "tf32": "tf32_tflops",
    "fp32": "fp32_tflops",
}


@dataclass(frozen=True)
class Case:
    """One microbenchmark: ``kind`` 'copy' (size = bytes) or 'gemm' (size = M = N = K)."""

    kind: str
    dtype: str
    size: int
    fast_accum: bool = False
    method: str = ""  # copy: a key of COPY_METHODS
    settle_s: float = 0.1  # seconds of untimed calls first (``_spin_up``); >= 1 s: the sustained rate

    @property
    def label(self) -> str:
        base = self._base_label
        return base if self.settle_s == 0.1 else f"{base} after {self.settle_s:g} s"

    @property
    def _base_label(self) -> str:
        if self.kind == "copy":
            return f"copy {self.size / 2**30:g} GiB ({self.method})"
        extra = " fast-accum" if self.fast_accum else ""
        return f"gemm {self.dtype} {self.size}^3{extra}"


def cases(grid: str = "small") -> list[Case]:
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; choose from {sorted(GRIDS)}")
    g = GRIDS[grid]
    out = [Case("copy", "bf16", n, method=m) for n in g["copy_bytes"] for m in COPY_METHODS]
    for n in g["gemm_sizes"]:
        for dtype in GEMM_DTYPES:
            out.append(Case("gemm", dtype, n))
            if dtype == "fp8":
                out.append(Case("gemm", dtype, n, fast_accum=True))
    return out


def _rate_timing(t: Timing, work: float, unit_scale: float) -> Timing:
    """Latency percentiles (us) -> rate percentiles (work per second / unit_scale)."""

    def rate(us: float) -> float:
        return work / (us * 1e-6) / unit_scale

    return Timing(p20=rate(t.p80), p50=rate(t.p50), p80=rate(t.p20), reps=t.reps)


def _check(out, ref, tol: float, what: str) -> None:
    import torch

    if not torch.isfinite(out).all():
        raise RuntimeError(f"{what}: non-finite output")
    err = (torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref)).item()
    if not err < tol:
        raise RuntimeError(f"{what}: relative error {err:.2e} exceeds {tol:.0e}")


def _gemm_fn(case: Case, device) -> tuple[Callable[[], object], Callable[[], None]]:
    """(the timed call, a check against float64 on a 64x64 corner)."""
    import torch

    n = case.size
    if case.dtype == "fp8":
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLAS wants
        scale = torch.ones((), device=device, dtype=torch.float32)

        def fn():
            return torch._scaled_mm(
                a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16, use_fast_accum=case.fast_accum
            )

        def check():
            ref = a[:64].double() @ b[:, :64].double()
            _check(fn()[:64, :64], ref, GEMM_TOLERANCE["fp8"], case.label)

        return fn, check
    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def fn():
        return torch.matmul(a, b, out=out)

    def check():
        fn()
        ref = a[:64].double() @ b[:, :64].double()
        _check(out[:64, :64], ref, GEMM_TOLERANCE[case.dtype], case.label)

    return fn, check


def _spin_up(fn: Callable[[], object], seconds: float = 0.1) -> None:
    """Run ``fn`` untimed for about ``seconds`` so an idle GPU's clocks are up before timing starts (0.1 s);
    ~3 s of a compute-bound load bring the H200 to its power cap, the clocks it holds sustained."""
    import time

    import torch

    torch.cuda.synchronize()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()
        torch.cuda.synchronize()


def run_case(case: Case, env: dict[str, str] | None = None) -> dict:
    """Run one case on the current CUDA device; returns its ``runs`` row."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("microbenchmarks need a CUDA GPU (torch.cuda.is_available() is False)")
    device = torch.device("cuda")
    if case.kind == "copy":
        provider, graph = COPY_METHODS[case.method]
        src = torch.rand(case.size // 2, device=device, dtype=torch.bfloat16)
        dst = torch.full_like(src, float("nan"))

        def fn():
            if case.method == "kernel":
                return torch.mul(src, 1, out=dst)
            return dst.copy_(src)

        fn()
        if not torch.equal(dst, src):
            raise RuntimeError(f"{case.label}: copy result differs")
        _spin_up(fn, case.settle_s)
        t = time_cuda(fn, graph=graph, inner=10, reps=20)
        moved = 2 * case.size
        rate = _rate_timing(t, moved, 1e12)
        config = {"op": "copy", "method": case.method, "cuda_graph": graph, "bytes": case.size,
                  "bytes_moved": moved, "latency_us_p50": t.p50}  # fmt: skip
        row = run_row(
            kind="microbench", subject="copy", provider=provider, config=config,
            metric="bandwidth", unit="TB/s", timing=rate, env=env,
        )  # fmt: skip
        del src, dst
        return row
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = case.dtype == "tf32"
    try:
        fn, check = _gemm_fn(case, device)
        check()
        _spin_up(fn, case.settle_s)
        flops = 2.0 * case.size**3
        est_ms = flops / 50e12 * 1e3 if case.dtype == "fp32" else flops / 500e12 * 1e3
        inner = max(1, min(10, int(20 / max(est_ms, 1e-3))))
        t = time_cuda(fn, graph=True, inner=inner, reps=10 if case.dtype == "fp32" else 20)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    rate = _rate_timing(t, flops, 1e12)
    provider = "torch._scaled_mm" if case.dtype == "fp8" else "torch.matmul"
    config = {"op": "gemm", "dtype": case.dtype, "m": case.size, "n": case.size, "k": case.size,
              "flops": flops, "latency_us_p50": t.p50}  # fmt: skip
    if case.dtype == "fp8":
        config["fast_accum"] = case.fast_accum
    if case.settle_s != 0.1:
        config["settle_s"] = case.settle_s
    torch.cuda.empty_cache()
    return run_row(
        kind="microbench", subject="gemm", provider=provider, config=config,
        metric="throughput", unit="TFLOP/s", timing=rate, env=env,
    )  # fmt: skip


def copy_ceiling(sizes=(1 << 30,), env: dict[str, str] | None = None) -> tuple[float, list[dict]]:
    """The copy ceiling the kernel benchmarks divide by: the best p50 (TB/s, bytes read + written) of the
    ``kernel`` copy (an elementwise copy kernel in a CUDA graph) over ``sizes`` (each far over L2), and its
    rows. Not a graph-captured ``copy_``: that is a memcpy node served by the copy engines (2.71 TB/s on one
    H200 beside 4.26 for the kernel and 4.23 for an eager ``copy_``, benchmarks/results/profile_bench_h200.md),
    a path no SM kernel takes, so fractions of it read over 100 %."""
    rows = [run_case(Case("copy", "bf16", n, method="kernel"), env) for n in sizes]
    return max(float(r["p50"]) for r in rows), rows


def measured_figures(rows: list[dict]) -> dict[str, float]:
    """Best p50 per figure (copy_bw_tbps, bf16_tflops, ...) over microbench rows: the machine's ceilings."""
    best: dict[str, float] = {}
    for row in rows:
        if row.get("kind") != "microbench":
            continue
        cfg = row["config"]
        key = FIGURE["copy"] if cfg.get("op") == "copy" else FIGURE.get(cfg.get("dtype", ""))
        if key is not None:
            best[key] = max(best.get(key, 0.0), float(row["p50"]))
    return best
