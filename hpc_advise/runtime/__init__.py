"""Runtime: plan/run objects, the dispatch table, the SGLang plugin, microbenchmarks, the profile command.

May import: ``kernels``, ``advisor``, ``profiles``, ``knowledge_base``, torch and triton (lazily where a
CPU-only install must still work). ``sglang`` is imported only inside ``sglang_plugin.py`` and the
backend modules it loads, lazily.
"""
