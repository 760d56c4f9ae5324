"""Parse a Hugging Face ``config.json`` (a dict) into a ``ModelProfile``.

Handles the field names of the model families the advisor knows: Llama/Qwen3 (GQA), Qwen3-MoE,
DeepSeek-V3 and Kimi-K2.x (MLA, ``n_routed_experts``), GLM-5 (MLA + DSA indexer), Qwen3.5 (hybrid Gated
DeltaNet + gated attention, ``text_config``), MiniMax-M2 (``num_local_experts``), gpt-oss (sliding-window
layers, ``experts_per_token``, MXFP4), Hunyuan/Hy3 (``num_experts``, ``first_k_dense_replace``).
Vision-language configs are read through their ``text_config``.
"""

from __future__ import annotations

from typing import Any

from hpc_advise.profiles.model import LinearAttention, ModelConfigError, ModelProfile


def _first(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return default


def quantization_scheme(qc: dict[str, Any] | None) -> str:
    """Map a ``quantization_config`` to one of our scheme names (unknown methods keep their name)."""
    if not qc:
        return "bf16"
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block:
            if list(block) != [128, 128]:
                return f"fp8-block{block[0]}x{block[1]}"
            return "fp8-block128"
        return "fp8-per-tensor"
    if method == "mxfp4":
        return "mxfp4"
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        return {"FP8": "fp8-per-tensor", "NVFP4": "nvfp4"}.get(algo, f"modelopt-{algo.lower()}")
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        for group in groups.values():
            w = group.get("weights") or {}
            bits, kind, size = w.get("num_bits"), w.get("type"), w.get("group_size")
            fmt = str(group.get("format") or qc.get("format") or "")
            if "nvfp4" in fmt:
                return "nvfp4"
            if bits == 4 and kind == "int" and size:
                return f"int4-group{size}"
            if bits == 8 and kind == "float":
                return "fp8-per-channel" if w.get("strategy") == "channel" else "fp8-per-tensor"
        return "compressed-tensors"
    return method or "bf16"


def sglang_quant_method(qc: dict[str, Any] | None) -> str:
    """The quantization method SGLang 0.5.23 loads a ``quantization_config`` with (``ModelConfig.
    _parse_quant_hf_config``): ModelOpt checkpoints become ``modelopt_fp8`` / ``modelopt_fp4`` by their
    ``quant_algo``; "" for none. Two FP8 checkpoints of the same layout load through different MoE
    methods (``fp8``: Fp8MoEMethod; ``compressed-tensors``: its W8A8-FP8 MoE method; ``modelopt_fp8``:
    ModelOptFp8MoEMethod), which decides which MoE runners can serve them."""
    if not qc:
        return ""
    method = str(qc.get("quant_method", "")).lower()
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        return "modelopt_fp8" if algo == "FP8" else "modelopt_fp4" if "FP4" in algo else method
    return method


def _layer_counts(cfg: dict[str, Any], num_layers: int) -> tuple[int, int]:
    """(linear-attention layers, sliding-window layers) from ``layer_types`` or the interval field."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != num_layers:
            raise ModelConfigError(f"layer_types has {len(types)} entries for {num_layers} layers")
        linear = sum(t in ("linear_attention", "linear") for t in types)
        sliding = sum(t == "sliding_attention" for t in types)
        return linear, sliding
    interval = cfg.get("full_attention_interval")
    if interval and cfg.get("linear_num_value_heads"):
        return num_layers - num_layers // int(interval), 0
    return 0, 0


# ModelProfile field -> the config.json name an error names (None-valued optional fields are skipped)
_POSITIVE_FIELDS = (
    ("num_layers", "num_hidden_layers"),
    ("hidden_size", "hidden_size"),
    ("num_heads", "num_attention_heads"),
    ("num_kv_heads", "num_key_value_heads"),
    ("head_dim", "head_dim"),
    ("vocab_size", "vocab_size"),
    ("intermediate_size", "intermediate_size"),
    ("moe_intermediate_size", "moe_intermediate_size"),
)


def from_hf_config(
    config: dict[str, Any],
    *,
    key: str | None = None,
    hf_id: str | None = None,
    source: str = "",
    aliases: tuple[str, ...] = (),
    overrides: dict[str, Any] | None = None,
) -> ModelProfile:
    """Build a ``ModelProfile`` from a Hugging Face config dict; ``overrides`` win over parsed fields."""
    if not isinstance(config, dict):
        raise ModelConfigError("config.json must hold a JSON object")
    cfg = dict(config)
    if isinstance(cfg.get("text_config"), dict):  # VLM wrapper: the decoder lives in text_config
        text = dict(cfg["text_config"])
        for k in ("quantization_config", "tie_word_embeddings", "_name_or_path"):
            if k in cfg and k not in text:
                text[k] = cfg[k]
        cfg = text
    model_type = str(cfg.get("model_type", ""))
    try:
        num_layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        num_heads = int(cfg["num_attention_heads"])
        vocab = int(cfg["vocab_size"])
    except KeyError as exc:
        raise ModelConfigError(f"config.json lacks required field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ModelConfigError(f"config.json has a non-integer shape field: {exc}") from None

    kv_lora = cfg.get("kv_lora_rank")
    attention = "mla" if kv_lora else "gqa"
    if attention == "mla":
        nope, rope = int(cfg.get("qk_nope_head_dim", 0)), int(cfg.get("qk_rope_head_dim", 0))
        head_dim = nope + rope
        num_kv_heads = num_heads
    else:
        head_dim = int(_first(cfg, "head_dim", default=hidden // num_heads))
        num_kv_heads = int(_first(cfg, "num_key_value_heads", default=num_heads))

    num_experts = int(_first(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0) or 0)
    top_k = int(
        _first(cfg, "num_experts_per_tok", "experts_per_token", "num_experts_per_token", default=0) or 0
    )
    moe_inter = cfg.get("moe_intermediate_size")
    inter = cfg.get("intermediate_size")
    first_k_dense = int(_first(cfg, "first_k_dense_replace", default=0) or 0)
    if num_experts and moe_inter is None:
        # Mixtral-style configs (gpt-oss, MiniMax-M2): intermediate_size is the expert width.
        moe_inter, inter = inter, (inter if first_k_dense else None)
    shared_width = cfg.get("shared_expert_intermediate_size")
    n_shared = int(_first(cfg, "n_shared_experts", "num_shared_experts", default=0) or 0)
    if shared_width and not n_shared:
        n_shared = 1
    if n_shared and shared_width is None and (model_type.startswith("hunyuan") or model_type == "hy_v3"):
        shared_width = int(moe_inter or 0) * n_shared

    scoring = str(_first(cfg, "scoring_func", "moe_router_activation_func", default="softmax")).lower()
    router_bias = bool(
        cfg.get("topk_method") == "noaux_tc"
        or cfg.get("use_routing_bias")
        or cfg.get("moe_router_enable_expert_bias")
        or model_type == "gpt_oss"
    )
    router_dtype = "fp32" if str(cfg.get("router_dtype", "")).lower() in ("fp32", "float32") else "bf16"
    hy_v3 = model_type in ("hy_v3", "hunyuan_v3") or "HYV3ForCausalLM" in (cfg.get("architectures") or ())
    if hy_v3:
        # SGLang 0.5.23 sglang/srt/models/hunyuan_v3.py builds every Hy3 router this way whatever the config
        # says: fp32 gate weight, sigmoid scores, fp32 per-expert correction bias.
        scoring, router_bias, router_dtype = "sigmoid", True, "fp32"
    if model_type == "gpt_oss":
        qk_norm = "none"
    elif cfg.get("qk_norm_type") == "per_layer":
        qk_norm = "full"
    elif cfg.get("use_qk_norm") or cfg.get("qk_norm") or model_type.startswith(("qwen3", "hunyuan", "hy_v3")):
        qk_norm = "head"
    else:
        qk_norm = "none"
    gated = model_type.startswith(("qwen3_next", "qwen3_5"))
    attn_output_gate = bool(cfg.get("attn_output_gate", gated))

    n_linear, n_sliding = _layer_counts(cfg, num_layers)
    linear = None
    if n_linear:
        try:
            linear = LinearAttention(
                num_key_heads=int(cfg["linear_num_key_heads"]),
                num_value_heads=int(cfg["linear_num_value_heads"]),
                key_head_dim=int(cfg["linear_key_head_dim"]),
                value_head_dim=int(cfg["linear_value_head_dim"]),
                conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
            )
        except KeyError as exc:
            raise ModelConfigError(f"linear-attention layers need {exc.args[0]!r}") from None

    fields: dict[str, Any] = dict(
        key=key or str(cfg.get("_name_or_path") or model_type or "custom").split("/")[-1].lower(),
        hf_id=hf_id or str(cfg.get("_name_or_path") or ""),
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        attention=attention,
        vocab_size=vocab,
        intermediate_size=int(inter) if inter else None,
        num_experts=num_experts,
        top_k=top_k,
        num_shared_experts=n_shared,
        moe_intermediate_size=int(moe_inter) if moe_inter else None,
        shared_expert_intermediate_size=int(shared_width) if shared_width else None,
        first_k_dense=first_k_dense,
        moe_layer_freq=int(_first(cfg, "moe_layer_freq", "decoder_sparse_step", default=1) or 1),
        router_dtype=router_dtype,
        router_scoring="sigmoid" if scoring == "sigmoid" else "softmax",
        router_bias=router_bias,
        quantization=quantization_scheme(cfg.get("quantization_config")),
        quant_method=sglang_quant_method(cfg.get("quantization_config")),
        kv_lora_rank=int(kv_lora) if kv_lora else None,
        q_lora_rank=int(cfg["q_lora_rank"]) if cfg.get("q_lora_rank") else None,
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]) if attention == "mla" else None,
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]) if attention == "mla" else None,
        v_head_dim=int(cfg["v_head_dim"]) if attention == "mla" else None,
        index_n_heads=int(cfg.get("index_n_heads", 0) or 0),
        index_head_dim=int(cfg.get("index_head_dim", 0) or 0),
        index_topk=int(cfg.get("index_topk", 0) or 0),
        qk_norm=qk_norm,
        attn_output_gate=attn_output_gate,
        attention_bias=bool(cfg.get("attention_bias", False)),
        attention_sinks=model_type == "gpt_oss",
        expert_bias=model_type == "gpt_oss",
        shared_expert_gate=bool(shared_width)
        and model_type.startswith(("qwen2_moe", "qwen3_next", "qwen3_5")),
        num_linear_attention_layers=n_linear,
        linear_attention=linear,
        num_sliding_window_layers=n_sliding,
        sliding_window=int(cfg["sliding_window"]) if n_sliding and cfg.get("sliding_window") else None,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_mtp_layers=int(_first(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0) or 0),
        aliases=tuple(aliases),
        source=source,
    )
    for name, value in (overrides or {}).items():
        if name not in fields:
            raise ModelConfigError(f"unknown override {name!r}")
        fields[name] = value
    # shapes divide and take logarithms downstream: zero or negative is a broken config, said here
    for name, cfg_name in _POSITIVE_FIELDS:
        value = fields[name]
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ModelConfigError(f"{cfg_name} must be a positive integer (got {value!r})")
    if fields["num_experts"] < 0:
        raise ModelConfigError(f"num_experts must be >= 0 (got {fields['num_experts']})")
    if fields["attention"] == "mla" and (fields["v_head_dim"] is None or fields["qk_rope_head_dim"] is None):
        raise ModelConfigError("MLA configs need qk_rope_head_dim, qk_nope_head_dim and v_head_dim")
    if fields["num_experts"] and not fields["moe_intermediate_size"]:
        raise ModelConfigError("MoE config without moe_intermediate_size/intermediate_size")
    if fields["num_experts"] and not 0 < fields["top_k"] <= fields["num_experts"]:
        raise ModelConfigError(f"top_k={fields['top_k']} must be in 1..{fields['num_experts']}")
    return ModelProfile(**fields)
