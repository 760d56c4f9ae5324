"""Event-level simulation of SGLang 0.5.23 serving a trace: the scheduler of one replica step by step
(``engine``), its radix cache (``radix``), its server arguments (``config``), the step-cost interface
the fitted model implements (``cost``), the replayed requests and the windows of a long trace
(``workload``), what comes out (``metrics``), several replicas behind a router (``replicas``) and the
capacity search (``search``). Numpy only; nothing here imports torch, triton, kernels or runtime.

How ``recommend`` uses it (``advisor/simulated.py``; 1,000,000 requests in <= 15 s on 2 cores):
candidates are screened analytically first; the windows are chosen once per trace from its arrival
and token arrays (``select_windows``: the busiest 5 minutes, shortened to at most 1,000 requests, plus
a sampled one, each with a warm-up, described by ``Window.describe`` for the report); each window's
requests are split over the replicas once (``replicas.split_for``); for each surviving candidate the
load factor is bisected on the busiest window (``search.capacity_search`` over ``replicas.run_split``,
the window tiled (``workload.tiled``) so a high load is sustained, a run stopping at the window's end
plus a drain), and the sampled window is simulated once at the trace's load for the reported
distributions."""

from hpc_advise.advisor.simulate.config import (
    SchedulerConfig,
    default_chunked_prefill_size,
    default_max_running_requests,
)
from hpc_advise.advisor.simulate.cost import LinearStepCost, PrefillShape, StepCost
from hpc_advise.advisor.simulate.engine import simulate
from hpc_advise.advisor.simulate.metrics import SimResult, merge, percentile
from hpc_advise.advisor.simulate.workload import Window, Workload, WorkloadError, select_windows, tiled

__all__ = [
    "LinearStepCost",
    "PrefillShape",
    "SchedulerConfig",
    "SimResult",
    "StepCost",
    "Window",
    "Workload",
    "WorkloadError",
    "default_chunked_prefill_size",
    "default_max_running_requests",
    "merge",
    "percentile",
    "select_windows",
    "simulate",
    "tiled",
]
