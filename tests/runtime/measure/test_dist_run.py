"""hpc_advise.runtime.measure.dist_run: results in rank order, multicast off in every rank, a failing rank's
error reaches the caller (its peer blocked in a collective is ended, not left hanging), bad arguments."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hpc_advise.runtime.measure.dist_run import MULTICAST_OFF, run_ranks  # noqa: E402


def _sum_and_env(rank: int, ws: int, scale: float) -> dict:
    import os

    import torch.distributed as dist

    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x)
    return {"rank": rank, "sum": (x * scale).tolist(), "env": {k: os.environ.get(k) for k in MULTICAST_OFF}}


def _rank1_fails(rank: int, ws: int) -> None:
    import torch.distributed as dist

    if rank == 1:
        raise RuntimeError("boom on rank 1")
    dist.all_reduce(torch.ones(1))  # rank 0 waits for a peer that never comes


@pytest.mark.slow
def test_results_in_rank_order_with_multicast_off():
    res = run_ranks(_sum_and_env, 2, backend="gloo", args=(2.0,), timeout_s=120)
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["sum"] == [6.0, 6.0, 6.0] for r in res)
    assert all(r["env"] == MULTICAST_OFF for r in res)


@pytest.mark.slow
def test_a_failing_rank_raises_with_its_error():
    # the cause first, whichever process the parent saw die first (rank 0's "connection reset" may win)
    with pytest.raises(RuntimeError, match=r"first failure first:\n--- rank 1 ---\n(?s:.*)boom on rank 1"):
        run_ranks(_rank1_fails, 2, backend="gloo", timeout_s=120)


def test_bad_arguments():
    with pytest.raises(ValueError, match="backend"):
        run_ranks(_sum_and_env, 2, backend="mpi")
    with pytest.raises(ValueError, match="world size"):
        run_ranks(_sum_and_env, 0)
