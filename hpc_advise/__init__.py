"""hpc-advise: a deployment advisor for SGLang on NVIDIA GPUs, with an embedded runtime.

Subpackages (import rules in shared/DESIGN.md §1):

- ``profiles``       GPU and model profiles as data files. Imports nothing heavy.
- ``knowledge_base`` SQLite store of runs, notes, traces, recommendations. No torch.
- ``advisor``        GPU probe (NVML), traces, candidates, fitted model, recommend, launch. No torch.
- ``kernels``        Triton SM90 kernels with torch references. Imports only torch and triton.
- ``runtime``        plan/run objects, dispatch table, SGLang plugin, microbenchmarks. May import kernels.
"""

__version__ = "0.1.0"
