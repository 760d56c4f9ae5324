"""SGLang MoE runner ``hpc_advise``: FP8 MoE layers on ``hpc_advise.kernels.fused_moe``.

Selected with ``--moe-runner-backend hpc_advise``. Registration uses SGLang's own extension points
(verified in sglang 0.5.23's source): ``register_moe_runner_core`` registers the name and our
``DispatchMoeRunnerCore``, so SGLang's ``MoeRunner.run`` hands us the standard dispatch output
directly (no ``MoeRunner.run`` hook is needed). Two hooks on ``Fp8MoEMethod`` do the rest:

- ``create_moe_runner`` (AROUND): with our backend selected, an FP8 layer we cover gets a
  ``MoeRunner`` of ours; anything else gets what SGLang's own ``auto`` selection picks (deep_gemm
  under DeepEP / mooncake / nixl all-to-all, triton otherwise), and the reason is logged once per
  (layer type, reason). (bf16 checkpoints build ``UnquantizedFusedMoEMethod`` and never reach
  this hook.)
- ``apply`` (AROUND): for layers on our runner, builds :class:`HpcAdviseMoeQuantInfo` from the loaded
  weights (checked once per layer after loading: fp8 weights, ``[E]`` or 128x128 block scales, scalar
  static input scales) and calls the runner; a layer whose loaded weights we cannot take gets SGLang's
  ``auto`` runner, with its reason logged. Quantization methods other than Fp8MoEMethod never reach
  these hooks: the plugin's resolution step (``resolution.py``) turns our runner name into ``auto``
  for them before any layer is built.

Never slower than SGLang's default: where SGLang's own Triton MoE measured faster than ours at this layer's
rank shape for a bucket of token counts (``dispatch.moe_handoff``, from measured rows), the layer also gets
SGLang's triton ``MoeRunner`` and ``apply`` sends calls of that many tokens to it (:func:`path_for`; the
token count of a decode step is fixed per captured CUDA graph, so the choice is made once per graph).

Expert ids arrive as SGLang's dispatcher leaves them for a non-global-id backend: local ids, -1 for
experts of other EP ranks; ``fused_moe`` skips -1, so ``expert_offset`` stays 0. The routed scaling
factor is applied exactly where SGLang's triton runner applies it (``MoeRunnerConfig``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from sglang.srt.layers.moe.moe_runner.base import DispatchMoeRunnerCore, MoeQuantInfo, MoeRunnerConfig
from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput

from hpc_advise import rules
from hpc_advise.runtime import dispatch

logger = logging.getLogger(__name__)

NAME = "hpc_advise"
_logged: set[tuple[str, str]] = set()


def log_fallback_once(layer_type: str, reason: str) -> None:
    key = (layer_type, reason)
    if key not in _logged:
        _logged.add(key)
        logger.warning(
            "hpc_advise MoE runner: %s layers run on SGLang's auto choice: %s", layer_type, reason
        )


@dataclass
class HpcAdviseMoeQuantInfo(MoeQuantInfo):
    """FP8 expert weights and scales as ``fused_moe`` takes them."""

    w13_weight: torch.Tensor
    w2_weight: torch.Tensor
    w13_scale: torch.Tensor  # [E] per-tensor or [E, ceil(2I/128), ceil(H/128)] blocks, fp32
    w2_scale: torch.Tensor
    a13_scale: torch.Tensor | None = None  # static per-tensor activation scale; None = dynamic 1x128
    a2_scale: torch.Tensor | None = None
    block_shape: tuple[int, int] | None = None


class HpcAdviseMoeRunnerCore(DispatchMoeRunnerCore):
    """Runs a standard dispatch output through ``fused_moe`` (registered with SGLang by name)."""

    @property
    def runner_backend(self):
        from sglang.srt.layers.moe.utils import resolve_moe_runner_backend

        return resolve_moe_runner_backend(NAME)

    def run_from_dispatch(self, dispatch_output, quant_info, runner_config: MoeRunnerConfig, hooks=None):
        from hpc_advise.kernels.fused_moe.op import fused_moe

        if not isinstance(quant_info, HpcAdviseMoeQuantInfo):
            raise TypeError(
                f"hpc_advise MoE runner got {type(quant_info).__name__}, expected HpcAdviseMoeQuantInfo"
            )
        if hooks is not None:
            raise ValueError("hpc_advise MoE runner: LoRA hooks are not supported")
        if getattr(dispatch_output, "hidden_states_scale", None) is not None:
            raise ValueError(
                "hpc_advise MoE runner: pre-quantized dispatch (hidden_states_scale) is not supported"
            )
        topk_weights, topk_ids, _ = dispatch_output.topk_output
        scale = runner_config.routed_scaling_factor
        out = fused_moe(
            dispatch_output.hidden_states,
            quant_info.w13_weight,
            quant_info.w2_weight,
            topk_weights.to(torch.float32),
            topk_ids.to(torch.int32),
            w13_scale=quant_info.w13_scale,
            w2_scale=quant_info.w2_scale,
            a13_scale=quant_info.a13_scale,
            a2_scale=quant_info.a2_scale,
            block_shape=quant_info.block_shape,
            expert_offset=0,
            routed_scaling_factor=1.0 if scale is None else float(scale),
        )
        return StandardCombineInput(hidden_states=out)


def config_unsupported_reason(runner_config: MoeRunnerConfig) -> str | None:
    """Why this layer's runner configuration is outside ``fused_moe`` (None: covered)."""
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend

    if runner_config.activation != "silu" or not runner_config.is_gated:
        return f"activation {runner_config.activation} (gated={runner_config.is_gated}); we run SiLU*up only"
    if runner_config.apply_router_weight_on_input:
        return "apply_router_weight_on_input"
    if runner_config.no_combine:
        return "no_combine (our kernel always sums over the top-k experts)"
    if any(
        x is not None
        for x in (runner_config.gemm1_alpha, runner_config.gemm1_clamp_limit, runner_config.swiglu_limit)
    ):
        return "clamped/alpha SwiGLU (gemm1_alpha, gemm1_clamp_limit or swiglu_limit)"
    if not get_moe_a2a_backend().is_none():
        return f"all-to-all backend {get_moe_a2a_backend().value} (we take the standard dispatch only)"
    return None


def _sm_conditions(method, layer) -> rules.Conditions:
    w = layer.w13_weight
    if w.is_cuda:
        sm, interp = tuple(torch.cuda.get_device_capability(w.device)), False
    else:
        sm, interp = None, os.environ.get("TRITON_INTERPRET") == "1"
    return rules.Conditions(
        model=type(layer).__name__,
        gpu=None,
        sm=sm,
        attention="gqa",
        head_dim=128,
        q_heads=1,
        kv_heads=1,
        kv_dtype="bf16",
        page_size=rules.REQUIRED_PAGE_SIZE,
        sliding_window=False,
        linear_attention=False,
        attention_sinks=False,
        is_moe=True,
        quantization="fp8-block128" if method.block_quant else "fp8-per-tensor",
        num_experts=int(w.shape[0]),
        hidden_size=int(w.shape[2]),
        moe_inter=int(w.shape[1]) // 2,
        router_dtype="bf16",
        router_family=None,
        router_opt_in=False,
        interpreter=interp,
    )


def method_unsupported_reason(method, layer) -> str | None:
    """Why an ``Fp8MoEMethod`` layer is not covered, from its quant config (before weights load)."""
    if getattr(method, "use_mxfp8", False):
        return "MXFP8 experts"
    if getattr(method, "is_fp4_expert", False):
        return "FP4 experts"
    if method.block_quant and list(method.weight_block_size or []) != [128, 128]:
        return f"weight blocks {method.weight_block_size} (we take 128x128)"
    return None


def weights_unsupported_reason(method, layer) -> str | None:
    """Why the loaded weights of a layer cannot go to ``fused_moe`` (None: they can)."""
    fp8 = torch.float8_e4m3fn
    if layer.w13_weight.dtype != fp8 or layer.w2_weight.dtype != fp8:
        return f"expert weights are {layer.w13_weight.dtype}, not float8_e4m3fn"
    if (
        getattr(layer, "w13_weight_bias", None) is not None
        or getattr(layer, "w2_weight_bias", None) is not None
    ):
        return "expert biases"
    decision = dispatch.decide("fused_moe", _sm_conditions(method, layer))
    if not decision.use_ours:
        return decision.reason
    if not method.block_quant:
        if layer.w13_weight_scale.dim() != 1 or layer.w2_weight_scale.dim() != 1:
            return f"per-tensor scales of shape {tuple(layer.w13_weight_scale.shape)} (we take [E])"
        for name in ("w13_input_scale", "w2_input_scale"):
            s = getattr(layer, name, None)
            if s is not None and s.numel() != 1:
                return f"{name} has {s.numel()} values (we take one static scale per layer)"
    return None


def quant_info(method, layer) -> HpcAdviseMoeQuantInfo:
    if method.block_quant:
        return HpcAdviseMoeQuantInfo(
            w13_weight=layer.w13_weight,
            w2_weight=layer.w2_weight,
            w13_scale=layer.w13_weight_scale_inv,
            w2_scale=layer.w2_weight_scale_inv,
            block_shape=(128, 128),
        )
    return HpcAdviseMoeQuantInfo(
        w13_weight=layer.w13_weight,
        w2_weight=layer.w2_weight,
        w13_scale=layer.w13_weight_scale,
        w2_scale=layer.w2_weight_scale,
        a13_scale=getattr(layer, "w13_input_scale", None),
        a2_scale=getattr(layer, "w2_input_scale", None),
    )


def _selected() -> bool:
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    return get_moe_runner_backend().value == NAME


def _is_ours(runner) -> bool:
    return runner is not None and runner.runner_backend.value == NAME


def _auto_create(original, method, layer, moe_runner_config, *args, **kwargs):
    """SGLang's own ``create_moe_runner`` with the runner backend seen as ``auto`` for this call only, so
    SGLang selects the runner as if ours had not been asked for (deep_gemm for DeepEP / mooncake / nixl
    output or a DeepGEMM set-up, triton otherwise: ``Fp8MoEMethod.create_moe_runner``)."""
    from sglang.srt.layers.moe.utils import MoeRunnerBackend, get_moe_runner_backend
    from sglang.srt.runtime_context import get_flags

    moe = get_flags().moe
    saved = get_moe_runner_backend()
    moe.runner_backend = MoeRunnerBackend.AUTO
    try:
        return original(method, layer, moe_runner_config, *args, **kwargs)
    finally:
        moe.runner_backend = saved


_ORIGINAL_CREATE = None  # SGLang's Fp8MoEMethod.create_moe_runner, kept by the hook's first call


def create_moe_runner_hook(original, method, layer, moe_runner_config, *args, **kwargs):
    """AROUND ``Fp8MoEMethod.create_moe_runner``."""
    global _ORIGINAL_CREATE
    _ORIGINAL_CREATE = original
    if not _selected():
        return original(method, layer, moe_runner_config, *args, **kwargs)
    from sglang.srt.layers.moe.moe_runner.runner import MoeRunner
    from sglang.srt.layers.moe.utils import resolve_moe_runner_backend
    from sglang.srt.layers.quantization.fp8 import Fp8MoEMethod

    method._owns_moe_runner = True
    method.moe_runner_config = moe_runner_config
    reason = (
        f"{type(method).__name__} subclasses Fp8MoEMethod (its apply may not take our runner)"
        if type(method) is not Fp8MoEMethod
        else method_unsupported_reason(method, layer) or config_unsupported_reason(moe_runner_config)
    )
    if reason is None:
        method.runner = MoeRunner(resolve_moe_runner_backend(NAME), moe_runner_config)
        _attach_handoff(method, layer, moe_runner_config)
    else:
        log_fallback_once(type(layer).__name__, reason)
        return _auto_create(original, method, layer, moe_runner_config, *args, **kwargs)


def layer_moe_shape(method, layer, runner_config: MoeRunnerConfig):
    """The rank MoE shape of a layer as the measured rows name it (``hpc_advise.measured.MoeShape``)."""
    from hpc_advise.measured import MoeShape

    w = layer.w13_weight
    quant = "fp8-block128" if method.block_quant else "fp8-per-tensor"
    return MoeShape(int(w.shape[0]), int(w.shape[2]), int(w.shape[1]) // 2, int(runner_config.top_k), quant)


def _attach_handoff(method, layer, runner_config: MoeRunnerConfig) -> None:
    """Give the layer SGLang's triton runner too when some token bucket is handed to it."""
    from sglang.srt.layers.moe.moe_runner.runner import MoeRunner
    from sglang.srt.layers.moe.utils import MoeRunnerBackend

    shape = layer_moe_shape(method, layer, runner_config)
    buckets = dispatch.moe_buckets(shape)
    handed = [b for b in buckets if b.default_faster]
    method._hpc_advise_buckets = buckets
    method._hpc_advise_sglang_runner = MoeRunner(MoeRunnerBackend.TRITON, runner_config) if handed else None
    for b in handed:
        key = (shape.label(), b.span())
        if key not in _logged:
            _logged.add(key)
            logger.info("hpc_advise MoE runner: %s at %s runs SGLang's triton: %s", shape.label(), b.span(), b.figure())


def path_for(method, tokens: int) -> str:
    """'triton' when this layer hands calls of ``tokens`` tokens to SGLang's triton runner, else 'hpc_advise'."""
    if getattr(method, "_hpc_advise_sglang_runner", None) is None:
        return NAME
    from hpc_advise.measured import handoff_in

    return handoff_in(method._hpc_advise_buckets, tokens).runner


def apply_hook(original, method, layer, dispatch_output, *args, **kwargs):
    """AROUND ``Fp8MoEMethod.apply``."""
    runner = getattr(method, "runner", None)
    if not _is_ours(runner):
        return original(method, layer, dispatch_output, *args, **kwargs)
    if not getattr(layer, "_hpc_advise_weights_checked", False):
        reason = weights_unsupported_reason(method, layer)
        if reason is not None:
            log_fallback_once(type(layer).__name__, reason)
            _auto_create(_ORIGINAL_CREATE, method, layer, method.moe_runner_config)
            return original(method, layer, dispatch_output, *args, **kwargs)
        layer._hpc_advise_weights_checked = True
    if path_for(method, int(dispatch_output.hidden_states.shape[0])) == "triton":
        return method._hpc_advise_sglang_runner.run(dispatch_output, method.get_triton_quant_info(layer))
    return runner.run(dispatch_output, quant_info(method, layer))
