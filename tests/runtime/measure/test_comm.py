"""Communication benchmark: nccl-tests bus-bandwidth formulas by hand, size/world-size helpers, and real
torch.distributed runs with gloo on CPU at world size 1 and 2 (and NCCL at world size 1 on a GPU)."""

from __future__ import annotations

import pytest

from hpc_advise.runtime.measure import comm as cb


def test_bus_bandwidth_formulas_by_hand():
    # nccl-tests doc/PERFORMANCE.md: allreduce 2(n-1)/n, allgather/reducescatter/alltoall (n-1)/n
    assert cb.bus_bandwidth_gbps("all_reduce", 10**9, 1.0, 8) == (1.0, 1.75)
    assert cb.bus_bandwidth_gbps("all_gather", 10**9, 0.5, 8) == (2.0, 1.75)
    assert cb.bus_bandwidth_gbps("reduce_scatter", 4 * 10**9, 1.0, 4) == (4.0, 3.0)
    assert cb.bus_bandwidth_gbps("all_to_all", 10**9, 1.0, 2) == (1.0, 0.5)
    assert cb.bus_bandwidth_gbps("all_reduce", 10**9, 1.0, 1) == (1.0, 0.0)


def test_sizes_and_world_sizes():
    sizes = cb.sizes_between(4096, 1 << 30)
    assert sizes[0] == 4096 and sizes[-1] == 1 << 30 and len(sizes) == 19 == len(cb.DEFAULT_SIZES)
    assert cb.sizes_between(5000, 20000) == (8192, 16384)
    with pytest.raises(ValueError):
        cb.sizes_between(10, 5)
    assert cb.world_sizes(1) == [1] and cb.world_sizes(0) == [1]
    assert cb.world_sizes(8) == [2, 4, 8] and cb.world_sizes(6) == [2, 4, 6] and cb.world_sizes(2) == [2]


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown ops"):
        cb.measure(1, device="cpu", ops=("broadcast",))
    with pytest.raises(ValueError, match="device"):
        cb.measure(1, device="tpu")
    with pytest.raises(ValueError, match="graph timing needs device 'cuda'"):
        cb.measure(1, device="cpu", graph=True)


def _check_rows(rows, ws, backend, device, sizes, timing="eager"):
    assert len(rows) == len(cb.OPS) * len(sizes)
    assert {r["subject"] for r in rows} == set(cb.OPS)
    for r in rows:
        c = r["config"]
        assert (r["kind"], r["metric"], r["unit"]) == ("comm", "latency", "us")
        assert r["provider"] == f"torch.distributed.{backend}"
        assert (c["world_size"], c["backend"], c["device"]) == (ws, backend, device)
        assert c["bytes"] in sizes and c["bytes"] % (4 * ws) == 0
        assert 0 < r["p20"] <= r["p50"] <= r["p80"]
        assert c["algbw_gbps"] == pytest.approx(c["bytes"] / (r["p50"] * 1e-6) / 1e9)
        assert c["busbw_gbps"] == pytest.approx(c["algbw_gbps"] * cb.BUSBW_FACTOR[r["subject"]](ws))
        assert c["env"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
        assert c["timing"] == timing


@pytest.mark.slow
@pytest.mark.parametrize("ws", [1, 2])
def test_gloo_on_cpu(ws):
    sizes = (4096, 65536)
    rows = cb.measure(ws, device="cpu", sizes=sizes, iters=3, warmup=1, timeout_s=240)
    _check_rows(rows, ws, "gloo", "cpu", sizes)
    figures = cb.measured_figures(rows)
    if ws == 1:
        assert figures == {}  # busbw is 0 at one rank: nothing to feed the profile
        assert all(r["config"]["busbw_gbps"] == 0.0 for r in rows)
    else:
        assert figures["comm_world_size"] == 2.0
        assert figures["allreduce_busbw_gbps"] == max(
            r["config"]["busbw_gbps"] for r in rows if r["subject"] == "all_reduce"
        )
        # the communication model's fit per op at 2 ranks travels with the figures
        for op in ("allreduce", "allgather", "reducescatter", "alltoall"):
            assert figures[f"{op}_ws2_s0_alpha_us"] >= 0 and f"{op}_ws2_s0_gbps" in figures


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_nccl_world_size_1_on_gpu(graph):
    sizes = (4096, 1 << 20, 64 << 20)
    rows = cb.measure(1, device="cuda", sizes=sizes, iters=5, warmup=2, timeout_s=300, graph=graph)
    _check_rows(rows, 1, "nccl", "cuda", sizes, timing="graph" if graph else "eager")
