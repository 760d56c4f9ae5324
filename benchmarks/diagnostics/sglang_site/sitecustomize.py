"""SGLang 0.5.23's HTTP server on the GPU machine without sgl-kernel, in every process it starts.

``python -m sglang.launch_server`` spawns its scheduler and detokenizer as fresh interpreters, so what
SGLang's model runner needs there (``benchmarks/bench_layer.py`` sets it up inside one process) has to
happen at interpreter start: this folder goes on ``PYTHONPATH`` of the server command only, and with
``HPC_ADVISE_SGLANG_STAND_INS=1`` set this module

- installs the import-only ``sgl_kernel`` stand-in with SGLang's own twins for the few names the
  Triton attention / MoE paths call (``bench_layer._sgl_kernel_twins``, reused as is);
- sends the bf16 MoE method (``UnquantizedFusedMoEMethod``) back to its ``forward_cuda`` when its module
  is first imported: ``SGLANG_FORCE_FUSED_OP_BACKEND=torch`` (norms, activation, top-k and rotary on
  torch, as sgl-kernel is missing) also puts that method, a ``BaseFusedOp``, on the per-expert torch
  loop, which syncs with the host every layer and cannot be captured in a CUDA graph.

Without the variable nothing happens, so the folder is harmless on any other command's path.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

_MOE_MODULE = "sglang.srt.layers.quantization.unquant"


class _PatchAfterExec(importlib.abc.MetaPathFinder):
    """Finds ``_MOE_MODULE`` through the other finders and patches it right after it executes."""

    def find_spec(self, name, path=None, target=None):
        if name != _MOE_MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            cls = module.UnquantizedFusedMoEMethod

            def forward(self, *args, **kwargs):
                return self.forward_cuda(*args, **kwargs)

            cls.forward = forward

        spec.loader.exec_module = exec_and_patch
        return spec


def _install() -> None:
    root = Path(__file__).resolve().parents[3]
    for p in (root, root / "benchmarks"):
        if str(p) not in sys.path:
            sys.path.append(str(p))
    import bench_layer

    bench_layer._sgl_kernel_twins()
    sys.meta_path.insert(0, _PatchAfterExec())


if os.environ.get("HPC_ADVISE_SGLANG_STAND_INS") == "1":
    _install()
