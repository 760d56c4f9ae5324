"""Advisor: GPU probe (NVML), traffic traces, candidates, fitted performance model, recommend, launch.

May import: ``profiles``, ``knowledge_base``, numpy, scikit-learn, pynvml (only in ``gpu_probe``).
Never imports torch, triton, ``kernels`` or ``runtime``: the advisor runs on a CPU-only laptop;
measurements reach it through the knowledge base.
"""
