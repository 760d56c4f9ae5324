"""Event-level simulation of SGLang 0.5.23 serving a trace: the scheduler of one replica step by step
(``engine``), its radix cache (``radix``), its server arguments (``config``), the step-cost interface
the fitted model implements (``cost``), the replayed requests and the windows of a long trace
(``workload``), what comes out (``metrics``), several replicas behind a router (``replicas``) and the
capacity search (``search``). Numpy only; nothing here imports torch, triton, kernels or runtime.

How ``recommend`` is meant to use it on a long trace (1,000,000 requests in <= 15 s on 2 cores):
screen candidates analytically (memory, prefill saturation) first; choose the windows once per trace
from its arrival and token arrays (``select_windows``: the busiest 5 minutes plus sampled ones,
each with a 60 s warm-up, described by ``Window.describe`` for the report), load only those
requests (``Workload.from_requests`` on the window's records); for each surviving candidate bisect
the load factor on the busiest window (``search.capacity_search`` over ``replicas.simulate_replicas``
with ``window=``; a run stops at the window's end plus a drain, so an overloaded one is cut short and
its unfinished requests fail the SLOs), then simulate the sampled windows once at the chosen load for
the reported distributions. A busiest-window run of the synthetic agentic trace (2,200 requests,
20-50K scheduler steps) costs about 0.1-0.15 s of CPU; a bisection to 5 % about 7 of them."""

from hpc_advise.advisor.simulate.config import (
    SchedulerConfig,
    default_chunked_prefill_size,
    default_max_running_requests,
)
from hpc_advise.advisor.simulate.cost import LinearStepCost, PrefillShape, StepCost
from hpc_advise.advisor.simulate.engine import simulate
from hpc_advise.advisor.simulate.metrics import SimResult, merge, percentile
from hpc_advise.advisor.simulate.workload import Window, Workload, WorkloadError, select_windows

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
]
