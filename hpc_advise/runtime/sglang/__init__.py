"""The SGLang bridge: the general plugin (``plugin.py``, entry point ``sglang.srt.plugins: hpc_advise``),
the decode attention backend (``attention.py``), the FP8 MoE runner (``moe.py``) and the router GEMM
hooks (``router.py``). The only place ``sglang`` is imported; this ``__init__`` imports nothing, so
naming the package costs no SGLang import.
"""
