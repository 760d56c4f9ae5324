"""The helpers of hpc_advise.runtime.measure.harness (the GPU-free ones, and time_cuda's settling on a GPU)."""

import time

import pytest

from hpc_advise.runtime.measure import harness as bm


def test_rotating_cycles_through_the_inputs_in_order():
    seen = []
    call = bm.rotating(["a", "b", "c"], lambda x: seen.append(x) or x.upper())
    assert [call() for _ in range(7)] == ["A", "B", "C", "A", "B", "C", "A"]
    assert seen == ["a", "b", "c", "a", "b", "c", "a"]


def test_percentiles_interpolate_between_samples():
    assert bm._percentiles([5.0, 1.0, 3.0, 2.0, 4.0]) == (1.8, 3.0, 4.2)


def test_run_row_takes_a_timing_or_a_single_value():
    env = {"gpu": "NVIDIA H200", "torch": "2.11.0"}
    row = bm.run_row(
        kind="kernel",
        subject="x",
        provider="ours",
        config={"M": 1},
        metric="latency",
        unit="us",
        timing=bm.Timing(1.0, 2.0, 3.0, 10),
        env=env,
        extra={"note": "n"},
    )
    assert (row["p20"], row["p50"], row["p80"], row["gpu"]) == (1.0, 2.0, 3.0, "NVIDIA H200")
    assert row["config"] == {"M": 1, "note": "n"}
    row = bm.run_row(kind="k", subject="x", provider="p", config={}, metric="m", unit="u", value=7, env=env)
    assert row["p20"] == row["p50"] == row["p80"] == 7.0


def test_command_line_shows_python_dash_m(monkeypatch):
    monkeypatch.setattr(bm.sys, "argv", ["/x/hpc_advise/__main__.py", "profile", "--bench", "all"])
    assert bm.command_line().endswith("-m hpc_advise profile --bench all")
    monkeypatch.setattr(bm.sys, "argv", ["benchmarks/bench_router_gemm.py", "--grid", "full"])
    assert bm.command_line().endswith("benchmarks/bench_router_gemm.py --grid full")


@pytest.mark.gpu
def test_time_cuda_runs_the_load_for_settle_s_before_timing():
    torch = pytest.importorskip("torch")
    x = torch.ones(1024, device="cuda")
    calls = []

    def fn():
        calls.append(1)
        x.mul_(1.0)

    bm.time_cuda(fn, graph=False, inner=2, reps=3, warmup=1)
    plain = len(calls)
    assert plain == 1 + 2 * 3
    calls.clear()
    t0 = time.perf_counter()
    bm.time_cuda(fn, graph=False, inner=2, reps=3, warmup=1, settle_s=0.2)
    assert time.perf_counter() - t0 >= 0.2
    assert len(calls) > plain + 2 * 10  # at least ten settling bodies of 2 calls (each ~10 µs here)
    assert (len(calls) - plain) % 2 == 0  # whole bodies only
