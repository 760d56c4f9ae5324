"""Import-only stand-in for ``sgl_kernel`` (SGLang's CUDA kernel package), for the runtime tests on a GPU
machine that has no sgl-kernel.

On a CUDA machine SGLang 0.5.23 takes its CUDA branches at import time, and several of them import
``sgl_kernel`` at module level even in modules the runtime tests need (the KV pool, the fp8 MoE method,
the linear layers). Found by importing every SGLang module the runtime tests import, with CUDA reported
present and every missing package recorded:

- ``sglang/srt/layers/quantization/utils.py:27``: ``scalar_type.ScalarType, scalar_types`` (and module-level
  reads of ``scalar_types.uint4``, ``uint4b8``, ``uint8``, ``uint8b128`` in ``utils.py:521``, ``awq/awq.py:250``,
  ``gptq/gptq.py:299``, ``compressed_tensors/schemes/compressed_tensors_wNa16.py:56``);
  reached from ``mem_cache/memory_pool.py:63`` -> ``layers/quantization/__init__.py:18``
- ``layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:30``,
  ``layers/quantization/w8a8_int8.py:45``: ``int8_scaled_mm``
- ``layers/quantization/gguf.py:48-49``: ``moe_sum``, ``quantization.ggml_*``
- ``layers/moe/moe_runner/triton_utils/fused_moe.py:59``: ``moe_sum_reduce``
- ``layers/layernorm.py:102``: ``rmsnorm``, ``fused_add_rmsnorm``, ``gemma_rmsnorm``, ``gemma_fused_add_rmsnorm``
- ``layers/activation.py:60-62``: ``gelu_and_mul``, ``gelu_tanh_and_mul``, ``silu_and_mul``
- ``layers/sampler.py:40``: ``top_k_renorm_prob``, ``top_p_renorm_prob``
- ``mem_cache/pool_host/mha.py:61``, ``pool_host/unified.py:20``, ``hisparse_memory_pool.py:27``:
  ``kvcacheio.transfer_kv_*``

sgl-kernel's wheel (hundreds of MB of CUDA binaries) does not fit the GPU machine's 64 MiB carry, and
none of these functions is called by what the runtime tests exercise: our attention backend and
SGLang's torch_native reference (plain torch), our MoE runner behind SGLang's ``MoeRunner``, our router
GEMM behind a ``ReplicatedLinear``. So :func:`install` provides exactly those names, and only when the
real package cannot be imported and CUDA is present (without CUDA SGLang never imports it). Each
function name is a placeholder that raises :class:`SglKernelUnavailable` when called, the four
``scalar_types`` members are opaque placeholders, ``ScalarType`` cannot be instantiated, and any other
attribute raises AttributeError: a tested path that reached sgl-kernel fails loudly instead of being
faked. This is a packaging boundary of the carried GPU environment, not a mock of anything we test.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

PACKAGE = "sgl_kernel"
FUNCTIONS: dict[str, tuple[str, ...]] = {
    "sgl_kernel": (
        "fused_add_rmsnorm",
        "gelu_and_mul",
        "gelu_tanh_and_mul",
        "gemma_fused_add_rmsnorm",
        "gemma_rmsnorm",
        "int8_scaled_mm",
        "moe_sum",
        "moe_sum_reduce",
        "rmsnorm",
        "silu_and_mul",
        "top_k_renorm_prob",
        "top_p_renorm_prob",
    ),
    "sgl_kernel.kvcacheio": (
        "transfer_kv_all_layer",
        "transfer_kv_all_layer_direct_lf_pf",
        "transfer_kv_all_layer_lf_pf",
        "transfer_kv_all_layer_lf_ph",
        "transfer_kv_all_layer_mla",
        "transfer_kv_all_layer_mla_lf_pf",
        "transfer_kv_direct",
        "transfer_kv_per_layer",
        "transfer_kv_per_layer_direct_pf_lf",
        "transfer_kv_per_layer_mla",
        "transfer_kv_per_layer_mla_pf_lf",
        "transfer_kv_per_layer_pf_lf",
        "transfer_kv_per_layer_ph_lf",
    ),
    "sgl_kernel.quantization": ("ggml_dequantize", "ggml_moe_a8", "ggml_mul_mat_a8", "ggml_mul_mat_vec_a8"),
    "sgl_kernel.scalar_type": (),
}
SCALAR_TYPES = ("uint4", "uint4b8", "uint8", "uint8b128")


class SglKernelUnavailable(RuntimeError):
    """A tested code path called into sgl-kernel, which this machine does not have."""


def _message(name: str) -> str:
    return (
        f"{name}: sgl-kernel is not installed on this machine; tests/runtime/sglang/sgl_kernel_stand_in.py "
        "provides SGLang's import-time names only, so this path cannot be tested here"
    )


class _Placeholder:
    """A name SGLang imports at module level; calling or using it raises."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise SglKernelUnavailable(_message(self._name))

    def __getattr__(self, attr: str):
        raise AttributeError(_message(f"{self._name}.{attr}"))

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self._name}>"


class _ScalarType:
    """Stands for ``sgl_kernel.scalar_type.ScalarType`` in annotations; cannot be instantiated."""

    def __new__(cls, *args, **kwargs):
        raise SglKernelUnavailable(_message("sgl_kernel.scalar_type.ScalarType"))


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(_message(f"{self.__name__}.{name}"))


def is_installed() -> bool:
    """Whether ``sys.modules['sgl_kernel']`` is this stand-in."""
    return getattr(sys.modules.get(PACKAGE), "__stand_in__", False)


def _real_package_importable() -> bool:
    if is_installed():
        return False
    try:
        import sgl_kernel  # noqa: F401

        return True
    except Exception:
        return False


def install(*, cuda: bool | None = None) -> bool:
    """Install the stand-in when CUDA is present and the real package cannot be imported; returns
    whether the stand-in is (now) in place. ``cuda`` overrides ``torch.cuda.is_available()``."""
    if is_installed():
        return True
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if not cuda or _real_package_importable():
        return False
    for name in FUNCTIONS:
        sys.modules.pop(name, None)
    for name, functions in FUNCTIONS.items():
        mod = _StandInModule(name)
        mod.__path__ = []
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__stand_in__ = True
        for fn in functions:
            setattr(mod, fn, _Placeholder(f"{name}.{fn}"))
        sys.modules[name] = mod
    for name in FUNCTIONS:
        if name != PACKAGE:
            setattr(sys.modules[PACKAGE], name.rpartition(".")[2], sys.modules[name])
    scalar = sys.modules["sgl_kernel.scalar_type"]
    scalar.ScalarType = _ScalarType
    scalar.scalar_types = types.SimpleNamespace(
        **{t: _Placeholder(f"sgl_kernel.scalar_type.scalar_types.{t}") for t in SCALAR_TYPES}
    )
    return True
