"""Runtime: what runs on the GPU host. The support rules (``dispatch.py``), the SGLang bridge
(``sglang/``), the measurements behind ``hpc-advise profile --bench`` (``measure/``), the
expert-/tensor-parallel MoE layers (``ep_moe.py``) and the ``hpc-advise runtime`` command (``cli.py``,
``env_report.py``).

May import: ``kernels``, ``advisor``, ``profiles``, ``knowledge_base``, torch and triton (lazily where a
CPU-only install must still work). ``sglang`` is imported only inside ``sglang/``, lazily: nothing
imports that subpackage until SGLang loads the plugin or a backend is built.
"""
