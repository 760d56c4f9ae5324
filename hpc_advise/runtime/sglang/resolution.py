"""Our checks inside SGLang's server-args resolution: wrong set-ups fail before any weight is read.

SGLang 0.5.23 resolves server arguments in ``sglang/srt/arg_groups/pipeline.py``, every step through
``run_hook`` so a plugin may wrap it (``register_resolution_hook``, ``arg_groups/resolution_hooks.py``).
The launcher loads plugins before it resolves, so the wrappers registered by ``plugin.register()`` run
there, minutes before the weights of a 300-700 GB model would load. Two steps are wrapped:

- ``handle_moe_kernel_config`` (before SGLang's MoE choices): ``--moe-runner-backend hpc_advise`` on a
  set-up our runner does not take (a quantization other than Fp8MoEMethod's, an all-to-all backend, a GPU
  other than SM90) is declared ``auto``, so SGLang's own selection picks the runner (deep_gemm under
  DeepEP, triton otherwise) and the reason is logged;
- ``handle_model_capability_adjustments`` (the last backend decision): the ``refuse`` launch rules of
  ``hpc_advise.rules`` that concern our backends raise :class:`SetupRefused`, one line saying what to use.

The facts come from SGLang's own resolving view and ``ModelConfig``; the model's shapes are parsed from
its HF config by ``hpc_advise.profiles.hf_config`` (the parser the advisor uses).
"""

from __future__ import annotations

import importlib.util
import logging

from hpc_advise import rules

logger = logging.getLogger(__name__)

MOE_STEP = "handle_moe_kernel_config"
CHECK_STEP = "handle_model_capability_adjustments"


class SetupRefused(ValueError):
    """A set-up with one of our backends that would fail later (the message says what to use)."""


def _sm() -> tuple[int, int] | None:
    from sglang.srt.runtime_context import get_platform

    platform = get_platform()
    if not platform.is_cuda:
        return None
    cap = platform.device_capability
    if cap is None:
        return None
    if hasattr(cap, "major"):
        return int(cap.major), int(cap.minor)
    return int(cap[0]), int(cap[1])


def _kv_dtype(name) -> str:
    name = str(name or "auto")
    return {"bfloat16": "bf16", "fp8": "fp8_e4m3"}.get(name, name)


def model_profile(model_config):
    """Our ModelProfile of SGLang's ``ModelConfig`` (None when its HF config does not parse: the model
    rules are then skipped, with a log line)."""
    from hpc_advise.profiles.hf_config import from_hf_config
    from hpc_advise.profiles.model import ModelConfigError

    hf = model_config.hf_config
    cfg = hf.to_dict() if hasattr(hf, "to_dict") else dict(vars(hf))
    archs = list(cfg.get("architectures") or getattr(hf, "architectures", None) or [])
    # the family key the rules know a model by (hy3, qwen3, deepseek), else the path's last part
    key = (
        rules.router_family("", archs[0] if archs else None)
        or str(model_config.model_path).rstrip("/").split("/")[-1]
    )
    overrides = None
    if model_config.quantization == "fp8" and not cfg.get("quantization_config"):
        overrides = {"quantization": "fp8-per-tensor"}  # SGLang's online FP8 (--quantization fp8)
    try:
        return from_hf_config(cfg, key=key.lower(), hf_id=str(model_config.model_path), overrides=overrides)
    except (ModelConfigError, KeyError, TypeError, ValueError) as exc:
        logger.warning("hpc_advise: cannot read the model's shapes (%s); model rules not checked", exc)
        return None


def facts_of(server_args):
    """(Setup, ModelProfile or None, compute capability) of a server-args record being resolved."""
    from sglang.srt.arg_groups.model_override_base import (
        attention_backends_of,
        model_config_of,
        resolved_view,
    )

    v = resolved_view(server_args)
    prefill, decode = attention_backends_of(v)
    mc = model_config_of(server_args)
    a2a = getattr(v, "moe_a2a_backend", "none")
    setup = rules.Setup(
        prefill_attention=prefill,
        decode_attention=decode,
        moe_runner=str(v.moe_runner_backend or "auto"),
        tp=int(v.tp_size),
        ep=int(v.ep_size or 1),
        attn_dp=int(getattr(v, "attn_dp_size", 1) or 1),
        dp=int(getattr(v, "dp_size", 1) or 1),
        kv_dtype=_kv_dtype(v.kv_cache_dtype),
        page_size=int(v.page_size or 1),
        speculative=v.speculative_algorithm or None,
        dcp=int(getattr(v, "dcp_size", 1) or 1),
        moe_a2a=str(getattr(a2a, "value", a2a) or "none"),
        disable_shared_experts_fusion=bool(v.disable_shared_experts_fusion),
        use_ray=bool(getattr(v, "use_ray", False)),
        quant_method=str(mc.quantization or ""),
        hpc_ops_installed=importlib.util.find_spec("hpc") is not None,
        chunked_local_attention=bool(getattr(mc, "is_local_attention_model", False)),
        mixed_chunk=bool(getattr(v, "enable_mixed_chunk", False)),
        pdmux=bool(getattr(v, "enable_pdmux", False)),
    )
    return setup, model_profile(mc), _sm()


def moe_step(server_args, previous) -> None:
    """Wrapper of ``handle_moe_kernel_config``: our MoE runner where it falls back becomes ``auto``."""
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.arg_groups.overrides import declare_resolution

    if resolved_view(server_args).moe_runner_backend == rules.NAME:
        setup, model, sm = facts_of(server_args)
        found = (
            []
            if model is None
            else rules.launch_violations(setup, model, sm, kinds=("fallback",), ours_only=True)
        )
        if found:
            logger.warning("hpc_advise: %s", found[0][1])
            declare_resolution(server_args, "hpc_advise.moe_fallback", moe_runner_backend="auto")
    previous(server_args)


def check_step(server_args, previous) -> None:
    """Wrapper of ``handle_model_capability_adjustments``: refuse what would fail with our backends."""
    previous(server_args)
    setup, model, sm = facts_of(server_args)
    if not setup.uses_ours():
        return
    found = rules.launch_violations(setup, model, sm, kinds=("refuse",), ours_only=True)
    if found:
        raise SetupRefused(f"hpc_advise: {found[0][1]}")


HOOKS = ((MOE_STEP, moe_step), (CHECK_STEP, check_step))


def install() -> list[str]:
    """Register our wrappers (once per process); returns the steps they did not take on."""
    from sglang.srt.arg_groups import resolution_hooks

    missing = []
    for name, fn in HOOKS:
        if not any(h is fn for h in resolution_hooks._HOOKS.get(name, ())):
            try:
                resolution_hooks.register_resolution_hook(name)(fn)
            except ValueError as exc:
                logger.error("hpc_advise: resolution hook %s not registered: %s", name, exc)
        if not any(h is fn for h in resolution_hooks._HOOKS.get(name, ())):
            missing.append(name)
    return missing
