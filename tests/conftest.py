"""Shared test set-up.

Triton's interpreter (``TRITON_INTERPRET=1``, used for kernel tests on CPU) has two bf16 defects in
triton 3.5–3.7: ``tl.dot`` on bf16 operands multiplies the raw uint16
bit patterns (bf16 is stored as uint16 there), and fp32 -> bf16 casts truncate instead of rounding to
nearest even. With numpy >= 2.4 a third one: a tensor used as a Python index (``range(0, n)`` with a
runtime ``n``) fails, since numpy no longer converts a 1-element array to a scalar. The GPU compiler
has none of these defects. A fourth: fp32 -> float8e4nv casts round wrongly when the rounding carries
into the exponent (31.2 -> 16 instead of 32); we round to nearest even through torch, as the GPU's
cvt instruction does. We patch the interpreter's builder for the test
session only, so kernel tests on CPU check our kernels and not the interpreter.
"""

from __future__ import annotations

import os

import numpy as np
import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    # Must be set before any @triton.jit function is defined (triton reads it at decoration time).
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_bits_rne(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def _patch_triton_interpreter() -> None:
    try:
        import triton.language as tl
        from triton.runtime import interpreter as itp
    except Exception:  # triton not installed: kernel tests skip themselves
        return
    builder = itp.InterpreterBuilder
    if getattr(builder, "_hpc_advise_patched", False):
        return
    original_dot = builder.create_dot
    original_cast = builder.cast_impl

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            a = itp.TensorHandle(_bf16_bits_to_f32(a.data), tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = itp.TensorHandle(_bf16_bits_to_f32(b.data), tl.float32)
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return itp.TensorHandle(_f32_to_bf16_bits_rne(src.data), tl.bfloat16)
        return original_cast(self, src, dst_type)

    builder.create_dot = create_dot
    builder.cast_impl = cast_impl

    original_patch_tensor = itp._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    itp._patch_lang_tensor = patch_lang_tensor

    original_fp_to_fp = builder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if dst_type.scalar == tl.float8e4nv and src.dtype.scalar == tl.float32:
            import torch

            q = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.float8_e4m3fn)
            return itp.TensorHandle(q.view(torch.uint8).numpy(), dst_type.scalar)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    builder.create_fp_to_fp = create_fp_to_fp
    builder._hpc_advise_patched = True


_patch_triton_interpreter()


# fixtures that hold one HPC_ADVISE_HOME for a whole module (a fitted model cached there makes later loads cheap)
SHARED_HOMES = ("advisor_home", "golden_home")


@pytest.fixture(autouse=True)
def _private_home(request, tmp_path_factory, monkeypatch):
    """Every test gets its own ``HPC_ADVISE_HOME``: no test reads or writes the user's knowledge base or cache.
    A test that asks for one of ``SHARED_HOMES`` keeps that module-wide home."""
    for name in SHARED_HOMES:
        if name in request.fixturenames:
            monkeypatch.setenv("HPC_ADVISE_HOME", str(request.getfixturevalue(name)))
            return
    monkeypatch.setenv("HPC_ADVISE_HOME", str(tmp_path_factory.mktemp("home")))


def pytest_collection_modifyitems(config, items):
    """Skip tests marked ``gpu`` when no CUDA device is present."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200 machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
