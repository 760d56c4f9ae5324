"""Model profiles: the frozen ``ModelProfile`` dataclass, the Hugging Face ``config.json`` parser, and the
numbers derived from the shapes (KV bytes per token, parameter counts, weight bytes).

A shipped profile (``profiles/models/<key>.json``) holds our metadata (key, Hugging Face id, aliases,
source) plus a ``config`` object that is a subset of the model's own ``config.json`` with the original
field names, and optional ``overrides`` (facts the config does not state, e.g. the router dtype). The
same parser reads shipped profiles and a user's ``config.json``, so both take one code path.

Conventions of the derived numbers (all computed, never stored):

- parameters are the text decoder only: vision towers and multi-token-prediction (MTP) layers are left
  out (``num_mtp_layers`` records how many MTP layers the checkpoint carries);
- ``total_params()`` counts every parameter, embedding and LM head included (tied embeddings once);
- ``active_params_per_token()`` counts what one token touches: attention, dense MLPs, ``top_k`` routed
  experts, shared experts, routers, norms, the embedding and the LM head (the convention model cards
  use, e.g. 37B for DeepSeek-V3);
- ``kv_bytes_per_token()`` is the per-token cache that grows with context: K and V of every full
  attention layer (GQA), or the compressed latent plus RoPE key (MLA), plus the DSA indexer key cache
  where the model has one. Sliding-window and linear-attention layers hold bounded state, given by
  ``kv_bytes(context_len)``;
- ``weight_bytes()`` applies the checkpoint's quantization scheme to the modules it covers; the rest is
  bf16, the router in its own dtype.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

# scheme -> (bytes per quantized parameter, which modules the scheme covers)
# 'linear': every projection of attention and MLP/experts (not embedding, LM head, router, norms);
# 'experts': routed experts only. Scale overheads: fp8 block 128x128 -> one fp32 per 16384 weights;
# mxfp4 -> one e8m0 byte per 32 fp4 weights; int4 group 32 -> one bf16 scale per 32; nvfp4 -> one fp8
# scale per 16 fp4 weights (the per-tensor fp32 global scale is negligible).
QUANT_SCHEMES: dict[str, tuple[float, str]] = {
    "bf16": (2.0, "none"),
    "fp16": (2.0, "none"),
    "fp8-per-tensor": (1.0, "linear"),
    "fp8-per-channel": (1.0, "linear"),
    "fp8-block128": (1.0 + 4.0 / (128 * 128), "linear"),
    "mxfp4": (0.5 + 1.0 / 32, "experts"),
    "int4-group32": (0.5 + 2.0 / 32, "experts"),
    "nvfp4": (0.5 + 1.0 / 16, "linear"),
}

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


class ModelConfigError(ValueError):
    """A config.json (or shipped profile) that cannot be turned into a ModelProfile."""


@dataclass(frozen=True)
class LinearAttention:
    """Shapes of a Gated-DeltaNet linear-attention layer (Qwen3-Next, Qwen3.5)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    def params(self, hidden: int) -> int:
        conv_dim = 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
        v_dim = self.num_value_heads * self.value_head_dim
        return (
            hidden * conv_dim  # in_proj_qkv
            + hidden * v_dim  # in_proj_z (output gate)
            + 2 * hidden * self.num_value_heads  # in_proj_a, in_proj_b
            + conv_dim * self.conv_kernel  # depthwise conv1d
            + 2 * self.num_value_heads  # A_log, dt_bias
            + self.value_head_dim  # gated RMSNorm
            + v_dim * hidden  # out_proj
        )

    def state_bytes(self, ssm_dtype_bytes: int = 4, conv_dtype_bytes: int = 2) -> int:
        """Per-sequence recurrent state of one layer: the delta-rule matrix plus the conv window."""
        conv_dim = 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
        ssm = self.num_value_heads * self.key_head_dim * self.value_head_dim * ssm_dtype_bytes
        return ssm + conv_dim * (self.conv_kernel - 1) * conv_dtype_bytes


@dataclass(frozen=True)
class ModelProfile:
    """Shapes of one model's text decoder, with the numbers derived from them."""

    key: str
    hf_id: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # q/k head dim (MLA: qk_nope_head_dim + qk_rope_head_dim)
    attention: str  # 'gqa' | 'mla'
    vocab_size: int
    intermediate_size: int | None = None  # dense FFN
    num_experts: int = 0
    top_k: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None  # total width of the shared expert(s)
    first_k_dense: int = 0
    moe_layer_freq: int = 1
    router_dtype: str = "bf16"
    router_scoring: str = "softmax"  # 'softmax' | 'sigmoid'
    router_bias: bool = False  # expert-score correction bias (DeepSeek-V3 style) or linear bias
    quantization: str = "bf16"
    # SGLang's quantization method for the checkpoint (ModelConfig.quantization: "fp8", "modelopt_fp8",
    # "modelopt_fp4", "compressed-tensors", "mxfp4", ...); "" = none or SGLang's online --quantization
    quant_method: str = ""
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    index_n_heads: int = 0  # DSA indexer (DeepSeek-V3.2, GLM-5)
    index_head_dim: int = 0
    index_topk: int = 0
    qk_norm: str = "none"  # 'none' | 'head' (RMSNorm per head) | 'full' (over all heads)
    attn_output_gate: bool = False
    attention_bias: bool = False
    attention_sinks: bool = False
    expert_bias: bool = False
    shared_expert_gate: bool = False
    num_linear_attention_layers: int = 0
    linear_attention: LinearAttention | None = None
    num_sliding_window_layers: int = 0
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    num_mtp_layers: int = 0
    aliases: tuple[str, ...] = ()
    source: str = ""

    # ----- layer layout -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, i: int) -> bool:
        return self.is_moe and i >= self.first_k_dense and i % max(self.moe_layer_freq, 1) == 0

    @property
    def num_moe_layers(self) -> int:
        """How many i in [0, num_layers) satisfy ``is_moe_layer(i)``, counted without the loop (the
        advisor asks for it on every prepared point)."""
        if not self.is_moe:
            return 0
        freq = max(self.moe_layer_freq, 1)
        first = -(-max(self.first_k_dense, 0) // freq) * freq  # first multiple of freq >= first_k_dense
        return len(range(first, self.num_layers, freq))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_linear_attention_layers - self.num_sliding_window_layers

    # ----- parameter counts ---------------------------------------------------------------------
    def _attention_params(self) -> int:
        h, hq, hkv, d = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        if self.attention == "mla":
            nope, rope, v = self.qk_nope_head_dim or 0, self.qk_rope_head_dim or 0, self.v_head_dim or 0
            r_kv = self.kv_lora_rank or 0
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * hq * (nope + rope)
            else:
                q = h * hq * (nope + rope)
            kv = h * (r_kv + rope) + r_kv + r_kv * hq * (nope + v)
            n = q + kv + hq * v * h
            if self.index_n_heads:
                idx_q_in = self.q_lora_rank or h
                n += (
                    idx_q_in * self.index_n_heads * self.index_head_dim  # wq_b
                    + h * self.index_head_dim  # wk
                    + 2 * self.index_head_dim  # k LayerNorm (weight, bias)
                    + h * self.index_n_heads  # per-head weights
                )
            return n
        gate = 2 if self.attn_output_gate else 1
        n = h * hq * d * gate + 2 * h * hkv * d + hq * d * h
        if self.attention_bias:
            n += hq * d * gate + 2 * hkv * d + h
        if self.qk_norm == "head":
            n += 2 * d
        elif self.qk_norm == "full":
            n += hq * d + hkv * d
        if self.attention_sinks:
            n += hq
        return n

    def _expert_params(self) -> int:
        h, i = self.hidden_size, self.moe_intermediate_size or 0
        n = 3 * h * i
        if self.expert_bias:
            n += 2 * i + h
        return n

    def _shared_params(self) -> int:
        width = self.shared_expert_intermediate_size
        if width is None:
            width = (self.moe_intermediate_size or 0) * self.num_shared_experts
        n = 3 * self.hidden_size * width
        if self.shared_expert_gate and width:
            n += self.hidden_size
        return n

    def _router_params(self) -> int:
        return self.hidden_size * self.num_experts + (self.num_experts if self.router_bias else 0)

    def _dense_mlp_params(self) -> int:
        if not self.intermediate_size:
            raise ModelConfigError(f"{self.key}: a dense layer needs intermediate_size")
        return 3 * self.hidden_size * self.intermediate_size

    def _mixer_params_total(self) -> int:
        n_attn = self.num_layers - self.num_linear_attention_layers
        n = n_attn * self._attention_params()
        if self.num_linear_attention_layers:
            assert self.linear_attention is not None
            n += self.num_linear_attention_layers * self.linear_attention.params(self.hidden_size)
        return n

    def _embedding_params(self) -> tuple[int, int]:
        emb = self.vocab_size * self.hidden_size
        return emb, 0 if self.tie_word_embeddings else emb

    def _norm_params(self) -> int:
        return (2 * self.num_layers + 1) * self.hidden_size

    def total_params(self) -> int:
        """All text-decoder parameters (embedding and LM head included, MTP layers excluded)."""
        emb, head = self._embedding_params()
        n = emb + head + self._norm_params() + self._mixer_params_total()
        n += self.num_dense_layers * (self._dense_mlp_params() if self.num_dense_layers else 0)
        n += self.num_moe_layers * (
            self.num_experts * self._expert_params() + self._shared_params() + self._router_params()
        )
        return n

    def active_params_per_token(self) -> int:
        """Parameters one token touches: as total_params() but with top_k routed experts per MoE layer."""
        if not self.is_moe:
            return self.total_params()
        inactive = self.num_moe_layers * (self.num_experts - self.top_k) * self._expert_params()
        return self.total_params() - inactive

    def expert_params(self) -> int:
        """Parameters of all routed experts (the part expert parallelism splits)."""
        return self.num_moe_layers * self.num_experts * self._expert_params()

    # ----- bytes --------------------------------------------------------------------------------
    def weight_bytes(self) -> int:
        """Bytes of the text decoder's weights under ``quantization`` (scales included)."""
        if self.quantization not in QUANT_SCHEMES:
            raise ModelConfigError(
                f"{self.key}: unknown quantization {self.quantization!r}; known: {sorted(QUANT_SCHEMES)}"
            )
        q_bytes, scope = QUANT_SCHEMES[self.quantization]
        router_bytes = DTYPE_BYTES.get(self.router_dtype, 2)
        experts = self.expert_params()
        routers = self.num_moe_layers * self._router_params()
        emb, head = self._embedding_params()
        norms = self._norm_params()
        linear = self.total_params() - experts - routers - emb - head - norms
        if scope == "linear":
            total = (experts + linear) * q_bytes
        elif scope == "experts":
            total = experts * q_bytes + linear * 2
        else:
            total = (experts + linear) * q_bytes
        total += routers * router_bytes + (emb + head + norms) * 2
        return int(math.ceil(total))

    def indexer_bytes_per_token(self) -> int:
        """DSA indexer key cache per token: fp8 keys plus one fp32 scale per 128 values, per layer."""
        if not self.index_n_heads:
            return 0
        per_layer = self.index_head_dim + 4 * math.ceil(self.index_head_dim / 128)
        return self.num_full_attention_layers * per_layer

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2) -> int:
        """KV-cache bytes per token of context in the layers whose cache grows with context."""
        n = self.num_full_attention_layers
        if self.attention == "mla":
            per_layer = ((self.kv_lora_rank or 0) + (self.qk_rope_head_dim or 0)) * kv_dtype_bytes
        else:
            per_layer = 2 * self.num_kv_heads * self.head_dim * kv_dtype_bytes
        return int(n * per_layer) + self.indexer_bytes_per_token()

    def kv_bytes(self, context_len: int, kv_dtype_bytes: float = 2, ssm_dtype_bytes: int = 4) -> int:
        """Cache bytes of one sequence of ``context_len`` tokens, bounded layers included."""
        total = context_len * self.kv_bytes_per_token(kv_dtype_bytes)
        if self.num_sliding_window_layers:
            window = min(context_len, self.sliding_window or context_len)
            total += int(
                self.num_sliding_window_layers
                * window
                * 2
                * self.num_kv_heads
                * self.head_dim
                * kv_dtype_bytes
            )
        if self.num_linear_attention_layers and self.linear_attention is not None:
            total += self.num_linear_attention_layers * self.linear_attention.state_bytes(ssm_dtype_bytes)
        return total

    def derived(self) -> dict[str, Any]:
        """The derived numbers, for display (``profiles show``) and JSON."""
        out: dict[str, Any] = {
            "total_params": self.total_params(),
            "active_params_per_token": self.active_params_per_token(),
            "kv_bytes_per_token_bf16": self.kv_bytes_per_token(2),
            "kv_bytes_per_token_fp8": self.kv_bytes_per_token(1),
            "num_moe_layers": self.num_moe_layers,
            "num_dense_layers": self.num_dense_layers,
        }
        try:
            out["weight_bytes"] = self.weight_bytes()
        except ModelConfigError as exc:
            out["weight_bytes"] = None
            out["weight_bytes_error"] = str(exc)
        return out

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["aliases"] = list(self.aliases)
        return d
