"""Event-level simulation of SGLang 0.5.23 serving a trace: the scheduler of one replica step by step
(``engine``), its radix cache (``radix``), its server arguments (``config``), the step-cost interface
the fitted model implements (``cost``), the replayed requests and the windows of a long trace
(``workload``), what comes out (``metrics``), several replicas behind a router (``replicas``) and the
capacity search (``search``). Numpy only; nothing here imports torch, triton, kernels or runtime."""

from hpc_advise.advisor.simulate.config import (
    SchedulerConfig,
    default_chunked_prefill_size,
    default_cuda_graph_max_bs,
    default_max_running_requests,
    default_mem_fraction_static,
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
    "default_cuda_graph_max_bs",
    "default_max_running_requests",
    "default_mem_fraction_static",
    "merge",
    "percentile",
    "select_windows",
    "simulate",
]
