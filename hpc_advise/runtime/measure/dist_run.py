"""Run one function on every rank of a one-host ``torch.distributed`` group and collect the results.

``run_ranks(fn, world_size, backend=..., args=...)`` spawns ``world_size`` processes, each of which
sets ``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` (NVLink multicast off, as
``comm`` does), pins GPU ``rank`` under NCCL (one thread under gloo), joins a process group that
meets through a FileStore in a fresh temporary folder (no TCP port to race for), calls
``fn(rank, world_size, *args)`` and saves its return value with ``torch.save``. The caller gets the
values in rank order. Results travel through files, not a pipe, so a large result cannot block a child
while the parent waits for it. A rank that raises makes ``run_ranks`` raise with every failed rank's
traceback, the first failure first (a peer that then fails in a collective with "connection reset"
comes after the cause, whichever process the parent saw die first); a group that outlives ``timeout_s``
is terminated.

``fn`` must be importable by name (a module-level function): spawned children import it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def _child(rank: int, world_size: int, backend: str, store_file: str, out_dir: str, fn, args) -> None:
    os.environ.update(MULTICAST_OFF)
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
        kw = {"device_id": torch.device("cuda", rank)}
    else:
        torch.set_num_threads(1)
        kw = {}
    dist.init_process_group(
        backend, init_method=f"file://{store_file}", rank=rank, world_size=world_size, **kw
    )
    try:
        result = fn(rank, world_size, *args)
    except BaseException:
        # written before this rank's connections close, so before any peer fails because of it
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as f:
            f.write(f"{time.time_ns()}\n{traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


@contextmanager
def multicast_off() -> Iterator[None]:
    """``MULTICAST_OFF`` in this process's environment (processes spawned inside inherit it), the
    previous values restored after."""
    saved = {k: os.environ.get(k) for k in MULTICAST_OFF}
    os.environ.update(MULTICAST_OFF)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def join_within(procs, timeout_s: float, what: str) -> None:
    """Wait for the processes of a ``torch.multiprocessing`` context; past ``timeout_s`` terminate
    them and raise ``TimeoutError`` naming ``what``. A process that fails raises as ``join`` does."""
    deadline = time.monotonic() + timeout_s
    while not procs.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in procs.processes:
                p.terminate()
            raise TimeoutError(f"{what} did not finish within {timeout_s:.0f} s")


def _rank_errors(out_dir: str, world_size: int) -> list[tuple[int, str]]:
    """(rank, traceback) of the ranks that wrote an error file, in the order they failed."""
    found = []
    for r in range(world_size):
        path = os.path.join(out_dir, f"rank{r}.err")
        if os.path.exists(path):
            with open(path) as f:
                stamp, _, tb = f.read().partition("\n")
            found.append((int(stamp), r, tb))
    return [(r, tb) for _, r, tb in sorted(found)]


def run_ranks(
    fn: Callable,
    world_size: int,
    *,
    backend: str = "gloo",
    args: tuple = (),
    timeout_s: float = 600.0,
) -> list:
    """``[fn(0, world_size, *args), …, fn(world_size - 1, world_size, *args)]``, one process per rank."""
    import torch
    import torch.multiprocessing as mp

    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise RuntimeError(
            f"world size {world_size} needs {world_size} GPUs; {torch.cuda.device_count()} visible"
        )
    tmp = tempfile.mkdtemp(prefix="hpc_advise_ranks_")
    try:
        store_file = os.path.join(tmp, "store")  # must not exist yet: FileStore creates it
        with multicast_off():  # inherited by the children, too
            procs = mp.start_processes(
                _child,
                args=(world_size, backend, store_file, tmp, fn, tuple(args)),
                nprocs=world_size,
                join=False,
                start_method="spawn",
            )
            try:
                join_within(procs, timeout_s, f"{world_size} ranks of {fn.__name__}")
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
                failed = _rank_errors(tmp, world_size)
                if not failed:
                    raise
                raise RuntimeError(
                    f"{len(failed)} of {world_size} ranks of {fn.__name__} failed, first failure first:\n"
                    + "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in failed)
                ) from exc
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
