"""The import-only ``sgl_kernel`` stand-in (tests/runtime/sglang/sgl_kernel_stand_in.py): installed only where it
is needed, raises on any use, and covers every module-level ``sgl_kernel`` import of SGLang's CUDA
branches in the modules the runtime GPU tests import (checked on CPU by reporting CUDA present to
SGLang at import time in a subprocess: ``..._fake_cuda``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.runtime.sglang import sgl_kernel_stand_in as stand_in

ROOT = Path(__file__).resolve().parents[3]

# What the GPU tests of test_sglang_attention/_moe/_plugin import, plus the plugin's own hook targets.
GPU_TEST_IMPORTS = (
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.layers.attention.torch_native_backend",
    "sglang.srt.layers.radix_attention",
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.runtime_context",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.layers.quantization.fp8",
    "sglang.srt.layers.moe.utils",
    "sglang.srt.layers.moe.token_dispatcher.standard",
    "sglang.srt.layers.moe.topk",
    "sglang.srt.layers.linear",
    "sglang.srt.server_args",
    "sglang.srt.plugins",
    "sglang.srt.models.deepseek_v2",
    "hpc_advise.runtime.sglang.attention",
    "hpc_advise.runtime.sglang.moe",
    "hpc_advise.runtime.sglang.router",
)


@pytest.fixture
def clean_sgl_kernel(monkeypatch):
    """Run with no ``sgl_kernel*`` in sys.modules; the previous entries come back afterwards."""
    for name in [n for n in sys.modules if n == "sgl_kernel" or n.startswith("sgl_kernel.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [n for n in sys.modules if n == "sgl_kernel" or n.startswith("sgl_kernel.")]:
        del sys.modules[name]


def test_not_installed_without_cuda(clean_sgl_kernel):
    assert stand_in.install(cuda=False) is False
    assert "sgl_kernel" not in sys.modules and not stand_in.is_installed()


def test_names_are_import_only_fake_cuda(clean_sgl_kernel):
    """With CUDA reported present and no real sgl-kernel: SGLang's imported names exist, and any use
    of them, or any other name, raises with the reason."""
    try:
        import sgl_kernel  # noqa: F401

        pytest.skip("real sgl-kernel is installed: the stand-in is never used")
    except ImportError:
        pass
    assert stand_in.install(cuda=True) and stand_in.is_installed()
    from sgl_kernel import rmsnorm
    from sgl_kernel.kvcacheio import transfer_kv_per_layer
    from sgl_kernel.scalar_type import ScalarType, scalar_types

    for fn in (rmsnorm, transfer_kv_per_layer, scalar_types.uint4b8):
        with pytest.raises(stand_in.SglKernelUnavailable, match="sgl-kernel is not installed"):
            fn()
    with pytest.raises(stand_in.SglKernelUnavailable):
        ScalarType()
    with pytest.raises(AttributeError, match="sgl-kernel is not installed"):
        scalar_types.uint4b8.size_bits  # noqa: B018
    with pytest.raises(ImportError):
        from sgl_kernel import fp8_scaled_mm  # noqa: F401
    with pytest.raises(ImportError):
        import sgl_kernel.elementwise  # noqa: F401
    assert stand_in.install(cuda=True)  # idempotent


_FAKE_CUDA_IMPORTS = """
import importlib, sys, types
import torch

# Report an SM90 GPU to SGLang's import-time branches (nothing here launches work on it).
torch.cuda.is_available = lambda: True
torch.version.cuda = "13.0"
torch.cuda.device_count = lambda: 1
torch.cuda.current_device = lambda: 0
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200"
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(
    name="NVIDIA H200", major=9, minor=0, total_memory=141 << 30, multi_processor_count=132
)
from tests.runtime.sglang.helpers import import_sglang
from tests.runtime.sglang import sgl_kernel_stand_in

import_sglang(*MODULES)
assert sgl_kernel_stand_in.is_installed(), "stand-in not installed with CUDA reported present"
from sglang.srt.utils.common import is_cuda
assert is_cuda(), "SGLang did not see the reported GPU: its CUDA branches were not taken"
from hpc_advise.runtime.sglang import plugin
plugin.register()
assert plugin.status()["errors"] == {}, plugin.status()
print("IMPORTED", len([m for m in sys.modules if m.startswith("sglang")]))
"""


def test_sglang_cuda_branch_imports_resolve_fake_cuda():
    """Every SGLang module the runtime GPU tests import, imported with CUDA reported present (so its
    module-level ``if _is_cuda: from sgl_kernel import ...`` branches run) and no real sgl-kernel: the
    stand-in must provide every name those branches take (without it the first of these imports fails
    with ModuleNotFoundError: sgl_kernel)."""
    pytest.importorskip("sglang", reason="real SGLang 0.5.23 is installed by scripts/test.sh")
    try:
        import sgl_kernel  # noqa: F401

        pytest.skip("real sgl-kernel is installed: the stand-in is never used")
    except ImportError:
        pass
    code = f"MODULES = {GPU_TEST_IMPORTS!r}\n" + textwrap.dedent(_FAKE_CUDA_IMPORTS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "IMPORTED" in proc.stdout, proc.stderr[-4000:]
