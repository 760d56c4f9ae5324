"""Router GEMM hooks (opt-in, ``HPC_ADVISE_ROUTER_GEMM=1``): gate logits from ``kernels.router_gemm``.

Per model, because each model builds its gate differently (SGLang 0.5.23 source):
- hunyuan_v3 ``HYV3MoEFused.gate``: a ``ReplicatedLinear`` with fp32 weights, called on
  ``hidden_states.to(float32)``; SGLang runs it as an fp32 cuBLAS GEMM.
- qwen3_moe ``Qwen3MoeSparseMoeBlock.gate``: a bf16 ``ReplicatedLinear`` whose logits come back
  rounded to bf16; ours returns them in fp32.
- deepseek_v2 ``MoEGate.forward``: with fp32 weights (``router_fp32``) SGLang runs ``F.linear`` in fp32;
  with bf16 weights it already computes fp32 logits exactly, so the hook leaves it alone.

The two ``ReplicatedLinear`` gates are swapped per instance (an AFTER hook on the MoE block's
``__init__`` replaces that gate's ``forward``; parameter names, hence weight loading, are unchanged).
The weight is split into (hi, lo) bf16 halves once after loading (an AFTER hook on SGLang's
``DefaultModelLoader.load_weights_and_postprocess``) and again if the weight tensor is replaced; a
gate whose shape the kernel does not take keeps SGLang's own path.
"""

from __future__ import annotations

import logging
import os
import types

import torch
import torch.nn.functional as F

from hpc_advise.runtime import dispatch

logger = logging.getLogger(__name__)

MARK = "_hpc_advise_router"
_logged: set[str] = set()


def _log_once(msg: str) -> None:
    if msg not in _logged:
        _logged.add(msg)
        logger.warning("hpc_advise router GEMM: %s", msg)


def shape_supported(weight: torch.Tensor) -> str | None:
    """None when the kernel takes this [N, K] gate weight, else the reason."""
    n, k = weight.shape
    lo_n, hi_n = dispatch.ROUTER_N_RANGE
    if not (lo_n <= n <= hi_n and n % 16 == 0):
        return f"{n} experts (kernel needs a multiple of 16 in {dispatch.ROUTER_N_RANGE})"
    if not dispatch.ROUTER_K_RANGE[0] <= k <= dispatch.ROUTER_K_RANGE[1]:
        return f"hidden size {k} outside {dispatch.ROUTER_K_RANGE}"
    if not weight.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return "weight is not on a CUDA device"
    return None


def prepare_gate(module: torch.nn.Module) -> bool:
    """Split ``module.weight`` into (hi, lo) once; returns whether our kernel will serve it."""
    from hpc_advise.kernels.router_gemm.op import prepare

    w = module.weight
    state = getattr(module, MARK, None)
    if state is not None and state[0] == w.data_ptr():
        return state[1] is not None
    reason = shape_supported(w)
    if reason is not None:
        _log_once(f"{type(module).__name__} keeps SGLang's GEMM: {reason}")
        setattr(module, MARK, (w.data_ptr(), None, None))
        return False
    hi, lo = prepare(w.detach().to(torch.float32))
    setattr(module, MARK, (w.data_ptr(), hi, lo))
    return True


def _logits(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """fp32 logits from our kernel, or None when the gate stays on SGLang's path."""
    from hpc_advise.kernels.router_gemm.op import router_gemm

    state = getattr(module, MARK, None)
    if state is None or state[0] != module.weight.data_ptr():
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return None  # never allocate while a CUDA graph is being captured
        if not prepare_gate(module):
            return None
        state = getattr(module, MARK)
    if state[1] is None or x.shape[0] == 0:
        return None
    return router_gemm(x, state[1], state[2])


def replicated_gate_forward(self, x: torch.Tensor):
    """Replacement ``forward`` of a ReplicatedLinear gate: (fp32 logits, None) like SGLang's."""
    out = _logits(self, x)
    if out is None:
        return type(self).forward(self, x)
    return out, None


def install_on_gate(gate: torch.nn.Module) -> None:
    if getattr(gate, "bias", None) is not None:
        _log_once(f"{type(gate).__name__} with a bias keeps SGLang's GEMM")
        return
    gate.forward = types.MethodType(replicated_gate_forward, gate)
    setattr(gate, MARK, None)


def block_init_hook(result, block, *args, **kwargs):
    """AFTER hook on a MoE block's ``__init__`` (HYV3MoEFused, Qwen3MoeSparseMoeBlock)."""
    install_on_gate(block.gate)


def moegate_forward_hook(original, gate, hidden_states, *args, **kwargs):
    """AROUND ``deepseek_v2.MoEGate.forward``: ours only for fp32 gate weights."""
    if gate.weight.dtype == torch.float32:
        out = _logits(gate, hidden_states)
        if out is not None:
            return out
    return original(gate, hidden_states, *args, **kwargs)


def after_load_hook(result, model, *args, **kwargs):
    """AFTER hook on ``DefaultModelLoader.load_weights_and_postprocess``: prepare every hooked gate."""
    from sglang.srt.models.deepseek_v2 import MoEGate

    for module in model.modules():
        if hasattr(module, MARK) or (isinstance(module, MoEGate) and module.weight.dtype == torch.float32):
            prepare_gate(module)


def gate_reference(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """fp32 logits as SGLang's fp32 gate computes them (tests compare against it)."""
    return F.linear(x.float(), weight.float())
