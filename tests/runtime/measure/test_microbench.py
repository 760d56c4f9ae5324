"""Microbenchmark plumbing that needs no GPU: the case grid, latency -> rate percentiles, the figures
taken from rows. The measurements themselves run in the ``gpu`` test of test_profile_cli.py."""

from __future__ import annotations

import pytest

from hpc_advise.runtime.measure import microbench as mb
from hpc_advise.runtime.measure.harness import Timing


def test_small_grid_covers_copy_methods_and_every_dtype():
    cases = mb.cases("small")
    assert {c.method for c in cases if c.kind == "copy"} == set(mb.COPY_METHODS)
    assert {c.dtype for c in cases if c.kind == "gemm"} == set(mb.GEMM_DTYPES)
    assert [c.fast_accum for c in cases if c.dtype == "fp8"] == [False, True]
    with pytest.raises(ValueError, match="unknown grid"):
        mb.cases("huge")


def test_rate_percentiles_invert_latency_percentiles():
    # 2 GB moved in 500 us = 4 TB/s; the slow (p80) latency gives the low (p20) rate
    r = mb._rate_timing(Timing(p20=400.0, p50=500.0, p80=800.0, reps=20), 2e9, 1e12)
    assert (r.p20, r.p50, r.p80) == pytest.approx((2.5, 4.0, 5.0))
    assert r.p20 <= r.p50 <= r.p80 and r.reps == 20


def test_measured_figures_take_the_best_p50():
    rows = [
        {"kind": "microbench", "config": {"op": "copy", "method": "graph"}, "p50": 2.7},
        {"kind": "microbench", "config": {"op": "copy", "method": "eager"}, "p50": 4.2},
        {"kind": "microbench", "config": {"op": "gemm", "dtype": "fp8", "fast_accum": False}, "p50": 1258.0},
        {"kind": "microbench", "config": {"op": "gemm", "dtype": "fp8", "fast_accum": True}, "p50": 1310.0},
        {"kind": "microbench", "config": {"op": "gemm", "dtype": "tf32"}, "p50": 359.0},
        {"kind": "kernel", "config": {"op": "gemm", "dtype": "bf16"}, "p50": 9999.0},
    ]
    assert mb.measured_figures(rows) == {"copy_bw_tbps": 4.2, "fp8_tflops": 1310.0, "tf32_tflops": 359.0}


def test_run_case_without_cuda_says_so():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="need a CUDA GPU"):
        mb.run_case(mb.cases()[0])


def test_a_settled_case_says_so_in_its_label():
    quick = mb.Case("gemm", "fp8", 8192, fast_accum=True)
    held = mb.Case("gemm", "fp8", 8192, fast_accum=True, settle_s=3.0)
    assert quick.label == "gemm fp8 8192^3 fast-accum"
    assert held.label == "gemm fp8 8192^3 fast-accum after 3 s"


def test_copy_ceiling_times_the_copy_kernel_at_each_size_mocked_gpu(monkeypatch):
    """No GPU here: run_case (the hardware boundary) is replaced. The kernel benchmarks' ceiling is the
    elementwise copy kernel, never the graph-captured copy_ (a memcpy node on the copy engines), and the best
    size wins."""
    seen = []

    def fake_run_case(case, env=None):
        seen.append(case)
        return {"p50": {1 << 30: 4.21, 2 << 30: 4.26}[case.size]}

    monkeypatch.setattr(mb, "run_case", fake_run_case)
    best, rows = mb.copy_ceiling((1 << 30, 2 << 30))
    assert best == 4.26 and len(rows) == 2
    assert [(c.kind, c.method, c.size) for c in seen] == [
        ("copy", "kernel", 1 << 30),
        ("copy", "kernel", 2 << 30),
    ]
    assert mb.COPY_METHODS["kernel"] == ("torch.mul(x, 1, out=)", True)
