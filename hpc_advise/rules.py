"""The support rules: what SGLang 0.5.23 with our plugin can run, as data and pure functions.

One table, read by everyone who has to agree on it: ``advisor/candidates.py`` (a candidate a rule
refuses is never emitted; the reason shows in ``--show-excluded``), ``advisor/launch.py`` (the flags a
command needs), ``runtime/dispatch.py`` (``hpc-advise runtime check``: which op runs where) and the
plugin (``runtime/sglang/plugin.py``: a hook on SGLang's server-args resolution refuses a wrong set-up
before any weight loads). It lives outside ``runtime`` because the advisor may not import the runtime
(DESIGN §1) and imports only the standard library and ``hpc_advise.profiles``: no torch, no SGLang.

Two levels:

- op rules (``RULES`` over :class:`Conditions`, the shapes of one GPU rank): when a rule of an op fires,
  our kernel does not run that op and the first rule that fires is the reason;
- launch rules (``LAUNCH_RULES`` over a :class:`Setup`, the flags one ``sglang.launch_server`` asks for,
  plus the model and the GPU's compute capability). Each has a ``kind``: ``refuse`` (SGLang or our plugin
  would fail, at start-up or at the first forward), ``fallback`` (SGLang's own ``auto`` choice runs
  instead, so the candidate is the ``auto`` one again) or ``slow`` (runs, but SGLang takes a path that
  costs every decode step). The plugin enforces the ``refuse`` rules that name one of our backends and
  applies the ``fallback`` ones; the advisor drops all three with their reasons.

Facts of SGLang 0.5.23 the rules encode are cited where they are used (file and function).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from hpc_advise.profiles import GpuProfile, ModelProfile

NAME = "hpc_advise"
SM90 = (9, 0)

# What our kernels accept (hpc_advise/kernels/*/op.py; kept here as data so the table needs no torch).
DECODE_HEAD_DIMS = (64, 128, 256)
DECODE_MAX_GROUP = 16
DECODE_KV_DTYPES = ("bf16", "fp8_e4m3")
# The backend needs --page-size 64: the kernel was tuned at page 64 (tiles of 64 tokens; 32 for fp8 KV
# with >= 8 KV heads). It also accepts pages of 1 and 16, but SGLang's default page size 1 makes the page
# table as wide as the context; we ask for 64 explicitly and fail when it is anything else.
REQUIRED_PAGE_SIZE = 64
# The MLA form of the decode kernel (decode_attention/op.py plan_mla): DeepSeek-V2/V3's latent rank and rope
# width only, 1-16 query heads per rank or a multiple of 16 up to 128, bf16 latent rows (no fp8 MLA form),
# pages of 1, 16 or 64 tokens (one 1152-byte row per token: the page table is the only page-size cost).
DECODE_MLA_LORA = 512
DECODE_MLA_ROPE = 64
DECODE_MLA_MAX_HEADS = 128
DECODE_MLA_KV_DTYPES = ("bf16",)
DECODE_MLA_PAGE_SIZES = (1, 16, 64)
# Prefill backend printed beside our decode backend: SGLang's own default on SM90, the only GPU ours runs on.
PREFILL_FOR_OURS = "fa3"
MOE_QUANTIZATIONS = ("fp8-per-tensor", "fp8-block128")
# SGLang quantization methods whose MoE layers are Fp8MoEMethod, the only method our runner hooks
# (sglang/srt/layers/quantization/fp8.py; `--quantization fp8` on a bf16 checkpoint is the same class).
MOE_QUANT_METHODS = ("fp8",)
MOE_BLOCK = 128
ROUTER_N_RANGE = (64, 512)  # experts, multiple of 16 (router_gemm/op.py N_RANGE)
ROUTER_K_RANGE = (1024, 8192)  # hidden size (router_gemm/op.py K_RANGE)
ROUTER_ENV = "HPC_ADVISE_ROUTER_GEMM"

# hpc_ops (SGLang's HPC-Ops backends, sglang/srt/layers/attention/hpc_ops_backend.py and
# layers/moe/moe_runner/hpc_ops.py): SM90 only, the `hpc` package, head_dim 128, GQA group 4 or 8, page 64.
HPC_OPS_HEAD_DIM = 128
HPC_OPS_GROUPS = (4, 8)
# Its FP8 KV path needs the fused QK-norm + RoPE + quant + store op that only hunyuan_v3 calls, at these
# per-rank (q heads, KV heads) (FP8_ROPE_SUPPORTED_HEAD_CONFIGS).
HPC_OPS_FP8_HEADS = ((8, 1), (64, 8))
HPC_OPS_FP8_MODELS = ("hy3",)
# A2A backends whose dispatch output is not the standard one our runner takes (SGLang's auto picks
# deep_gemm for them, Fp8MoEMethod.create_moe_runner).
A2A_NONE = ("none", "", None)

# SGLang's gate module per model family (the router hook is per model; sglang/router.py).
ROUTER_GATES = {
    "hy3": "hunyuan_v3 (HYV3MoEFused.gate, fp32 ReplicatedLinear)",
    "qwen3": "qwen3_moe (Qwen3MoeSparseMoeBlock.gate, bf16 ReplicatedLinear)",
    "deepseek": "deepseek_v2 (MoEGate)",
    "kimi": "deepseek_v2 (MoEGate)",
}
# SGLang model classes (EntryClass of hunyuan_v3.py, qwen3_moe.py, deepseek_v2.py) -> ROUTER_GATES key
ROUTER_ARCHITECTURES = {
    "HYV3ForCausalLM": "hy3",
    "Qwen3MoeForCausalLM": "qwen3",
    "DeepseekV2ForCausalLM": "deepseek",
    "DeepseekV3ForCausalLM": "deepseek",
    "DeepseekV32ForCausalLM": "deepseek",
}


def router_family(model_key: str, architecture: str | None = None) -> str | None:
    """The key of ``ROUTER_GATES`` that serves this model (by its config.json architecture when known,
    else by the profile key), or None."""
    if architecture:
        return ROUTER_ARCHITECTURES.get(architecture)
    for prefix in ROUTER_GATES:
        if model_key.lower().startswith(prefix):
            return prefix
    return None


def router_env_enabled(environ: dict | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ROUTER_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def fused_shared_experts(
    model: ModelProfile, *, ep: int = 1, disabled: bool = False, a2a: str = "none"
) -> int:
    """Shared experts SGLang fuses into the routed MoE of this model (0 or 1).

    ``DeepseekV2ForCausalLM.shared_experts_fusion_disable_reason`` (sglang/srt/models/deepseek_v2.py) keeps
    fusion on for DeepSeek-V3/R1 (256 routed experts, 1 shared) on NVIDIA SM80+ unless
    ``--disable-shared-experts-fusion``, expert parallelism > 1 or a DeepEP all-to-all turns it off; every
    MoE layer then has 257 experts and top-9 (the shared expert always picked).
    """
    if disabled or ep > 1 or a2a not in A2A_NONE or not model.is_moe:
        return 0
    if router_family(model.key) != "deepseek":
        return 0
    return 1 if model.num_experts == 256 and model.num_shared_experts == 1 else 0


@functools.lru_cache(maxsize=1)
def hpc_ops_installed() -> bool:
    """Whether HPC-Ops' ``hpc`` package is importable here (found, not imported: it needs CUDA); looked
    up once per process (a path search per candidate was 40 % of ranking a trace's candidates)."""
    import importlib.util

    return importlib.util.find_spec("hpc") is not None


def chunked_local_attention(model: ModelProfile) -> bool:
    """Llama-4-style chunked local attention (SGLang: ``ModelConfig.is_local_attention_model``); the
    profile has no field for it, so it is known by family here and from SGLang's config in the plugin."""
    return model.key.lower().replace("-", "").startswith("llama4")


# ------------------------------------------------------------------------------------------- op rules
@dataclass(frozen=True)
class Conditions:
    """Everything an op rule may look at, per GPU rank (heads and MoE width already divided by TP/EP)."""

    model: str
    gpu: str | None  # profile key, None = no CUDA GPU
    sm: tuple[int, int] | None
    attention: str  # 'gqa' | 'mla'
    head_dim: int
    q_heads: int  # per rank
    kv_heads: int  # per rank (replicated when TP > KV heads)
    kv_dtype: str  # 'bf16' | 'fp8_e4m3'
    page_size: int
    sliding_window: bool
    linear_attention: bool
    attention_sinks: bool
    is_moe: bool
    quantization: str
    num_experts: int  # per MoE layer as SGLang builds it (fused shared experts included)
    hidden_size: int
    moe_inter: int  # per rank
    router_dtype: str
    router_family: str | None
    router_opt_in: bool
    interpreter: bool = False  # Triton interpreter on CPU (tests)
    top_k: int = 0  # experts per token (MoE models; fused shared experts included)
    quant_method: str = "fp8"  # SGLang's quantization method (quant_method_of); only "fp8" hooks ours
    kv_lora_rank: int = 0  # MLA: latent rank of the KV row (0 for GQA)
    rope_dim: int = 0  # MLA: rope columns after the latent ones (0 for GQA)
    sparse_attention: bool = False  # MLA with a DSA indexer (DeepSeek-V3.2, GLM-5): top-k sparse decode

    @property
    def group(self) -> float:
        return self.q_heads / self.kv_heads if self.kv_heads else float("inf")


def conditions(
    model: ModelProfile,
    gpu: GpuProfile | None,
    *,
    tp: int = 1,
    ep: int = 1,
    attn_dp: int = 1,
    kv_dtype: str = "bf16",
    page_size: int = REQUIRED_PAGE_SIZE,
    router_opt_in: bool | None = None,
    architecture: str | None = None,
    disable_shared_experts_fusion: bool = False,
) -> Conditions:
    """Conditions of ``model`` served with ``tp`` GPUs per replica (``attn_dp`` attention data-parallel
    groups, ``ep`` expert-parallel ranks) on ``gpu`` (None = no GPU); ``architecture`` is the config.json
    ``architectures[0]`` when the model came from a file."""
    for name, v in (("tp", tp), ("ep", ep), ("attn_dp", attn_dp)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if tp % ep or tp % attn_dp:
        raise ValueError(f"ep {ep} and attn_dp {attn_dp} must divide tp {tp}")
    if kv_dtype not in ("bf16", "fp8_e4m3", "auto"):
        raise ValueError(f"kv_dtype must be bf16, fp8_e4m3 or auto, got {kv_dtype!r}")
    kv = "bf16" if kv_dtype == "auto" else kv_dtype
    attn_tp = tp // attn_dp
    q_heads = max(1, model.num_heads // attn_tp)
    kv_heads = max(1, model.num_kv_heads // attn_tp)
    # SGLang splits each expert's width over the MoE-TP group, tp / ep (sglang/srt/layers/moe/fused_moe_triton/layer.py)
    inter = (model.moe_intermediate_size or 0) // (tp // ep) if model.is_moe else 0
    fused = fused_shared_experts(model, ep=ep, disabled=disable_shared_experts_fusion)
    return Conditions(
        model=model.key,
        gpu=gpu.key if gpu is not None else None,
        sm=tuple(gpu.compute_capability) if gpu is not None else None,
        attention=model.attention,
        head_dim=model.head_dim,
        q_heads=q_heads,
        kv_heads=kv_heads,
        kv_dtype=kv,
        page_size=page_size,
        sliding_window=bool(model.num_sliding_window_layers),
        linear_attention=bool(model.num_linear_attention_layers),
        attention_sinks=model.attention_sinks,
        is_moe=model.is_moe,
        quantization=model.quantization,
        num_experts=model.num_experts + fused,
        hidden_size=model.hidden_size,
        moe_inter=inter,
        top_k=(model.top_k + fused) if model.is_moe else 0,
        router_dtype=model.router_dtype,
        router_family=router_family(model.key, architecture),
        router_opt_in=router_env_enabled() if router_opt_in is None else router_opt_in,
        quant_method=quant_method_of(model),
        kv_lora_rank=(model.kv_lora_rank or 0) if model.attention == "mla" else 0,
        rope_dim=(model.qk_rope_head_dim or 0) if model.attention == "mla" else 0,
        sparse_attention=model.attention == "mla" and bool(model.index_n_heads),
    )


def quant_method_of(model: ModelProfile) -> str:
    """SGLang's quantization method for ``model``: the checkpoint's (``ModelProfile.quant_method``), else
    ``fp8`` where the profile plans FP8 over an unquantized checkpoint (SGLang's online
    ``--quantization fp8``, which builds Fp8MoEMethod layers), else the scheme name."""
    if model.quant_method:
        return model.quant_method
    return "fp8" if model.quantization in MOE_QUANTIZATIONS else model.quantization


@dataclass(frozen=True)
class Rule:
    op: str
    fires: Callable[[Conditions], bool]
    reason: Callable[[Conditions], str]
    # 'fallback': SGLang's own path runs; 'n/a': the op does not occur in this model.
    outcome: str = "fallback"


def _no_gpu(c: Conditions) -> bool:
    return c.sm is None and not c.interpreter


def _not_sm90(c: Conditions) -> bool:
    return c.sm is not None and c.sm != SM90


def sm_name(sm) -> str:
    return f"sm{sm[0]}{sm[1]}" if sm else "none"


def _sm(c: Conditions) -> str:
    return sm_name(c.sm)


def _mla(c: Conditions) -> bool:
    return c.attention == "mla"


def _mla_heads_ok(q_heads: int) -> bool:
    """Query heads per rank the MLA form plans: 1-16, or a multiple of 16 up to 128 (blocks of 16)."""
    return 1 <= q_heads <= DECODE_MAX_GROUP or (
        q_heads % DECODE_MAX_GROUP == 0 and q_heads <= DECODE_MLA_MAX_HEADS
    )


RULES: list[Rule] = [
    # --- decode_attention -------------------------------------------------------------------------
    Rule(
        "decode_attention",
        lambda c: _mla(c) and c.sparse_attention,
        lambda c: "DSA sparse MLA (indexer top-k): our MLA decode attends to every token of the request",
    ),
    Rule(
        "decode_attention",
        lambda c: c.linear_attention,
        lambda c: "hybrid linear attention layers: not handled by our backend",
    ),
    Rule(
        "decode_attention",
        lambda c: c.sliding_window,
        lambda c: "sliding-window layers: our decode kernel has no window mask",
    ),
    Rule(
        "decode_attention",
        lambda c: c.attention_sinks,
        lambda c: "attention sinks: not supported by our decode kernel",
    ),
    Rule("decode_attention", _no_gpu, lambda c: "no CUDA GPU"),
    Rule(
        "decode_attention",
        _not_sm90,
        lambda c: f"GPU is {_sm(c)}: the kernel is tuned and validated on SM90 (Hopper) only",
    ),
    # MLA (the kernel's MLA form, plan_mla / run_mla)
    Rule(
        "decode_attention",
        lambda c: _mla(c) and (c.kv_lora_rank, c.rope_dim) != (DECODE_MLA_LORA, DECODE_MLA_ROPE),
        lambda c: (
            f"MLA latent {c.kv_lora_rank} + rope {c.rope_dim}: our MLA decode takes "
            f"{DECODE_MLA_LORA} + {DECODE_MLA_ROPE} only (DeepSeek-V2/V3's)"
        ),
    ),
    Rule(
        "decode_attention",
        lambda c: _mla(c) and not _mla_heads_ok(c.q_heads),
        lambda c: (
            f"MLA with {c.q_heads} query heads per rank: our MLA decode takes 1-{DECODE_MAX_GROUP} or a "
            f"multiple of {DECODE_MAX_GROUP} up to {DECODE_MLA_MAX_HEADS}"
        ),
    ),
    Rule(
        "decode_attention",
        lambda c: _mla(c) and c.kv_dtype not in DECODE_MLA_KV_DTYPES,
        lambda c: (
            f"{c.kv_dtype} KV on MLA: our MLA decode reads bf16 latent rows only (it has no fp8 form); "
            "SGLang's MLA backend reads the fp8 pool"
        ),
    ),
    Rule(
        "decode_attention",
        lambda c: _mla(c) and c.page_size not in DECODE_MLA_PAGE_SIZES,
        lambda c: f"page size {c.page_size}: our MLA decode takes --page-size 1, 16 or 64",
    ),
    # MHA / GQA
    Rule(
        "decode_attention",
        lambda c: not _mla(c) and c.head_dim not in DECODE_HEAD_DIMS,
        lambda c: f"head_dim {c.head_dim} not in {DECODE_HEAD_DIMS}",
    ),
    Rule(
        "decode_attention",
        lambda c: (
            not _mla(c)
            and (c.q_heads % c.kv_heads != 0 or not 1 <= c.q_heads // c.kv_heads <= DECODE_MAX_GROUP)
        ),
        lambda c: (
            f"GQA group {c.q_heads}/{c.kv_heads} per rank: needs an integer group 1..{DECODE_MAX_GROUP}"
        ),
    ),
    Rule(
        "decode_attention",
        lambda c: not _mla(c) and c.kv_dtype not in DECODE_KV_DTYPES,
        lambda c: f"KV cache dtype {c.kv_dtype} not in {DECODE_KV_DTYPES}",
    ),
    Rule(
        "decode_attention",
        lambda c: not _mla(c) and c.page_size != REQUIRED_PAGE_SIZE,
        lambda c: f"page size {c.page_size}: the backend needs --page-size {REQUIRED_PAGE_SIZE}",
    ),
    # --- fused_moe --------------------------------------------------------------------------------
    Rule("fused_moe", lambda c: not c.is_moe, lambda c: "dense model: no MoE layers", outcome="n/a"),
    Rule(
        "fused_moe",
        lambda c: c.quantization.startswith("fp8") and c.quant_method not in MOE_QUANT_METHODS,
        lambda c: (
            f"{c.quant_method} FP8 checkpoint: SGLang builds its own MoE method for it, not Fp8MoEMethod "
            "(the only one our runner hooks), and runs that method's runner"
        ),
    ),
    Rule(
        "fused_moe",
        lambda c: c.quantization not in MOE_QUANTIZATIONS,
        lambda c: f"experts are {c.quantization}: our fused MoE covers FP8 (per-tensor or 128x128 blocks)",
    ),
    Rule("fused_moe", _no_gpu, lambda c: "no CUDA GPU"),
    Rule(
        "fused_moe",
        lambda c: c.sm is not None and c.sm < (8, 9),
        lambda c: f"GPU is {_sm(c)}: no FP8 tensor cores (needs SM89+; tuned on SM90)",
    ),
    Rule(
        "fused_moe",
        _not_sm90,
        lambda c: f"GPU is {_sm(c)}: the kernel is tuned and validated on SM90 (Hopper) only",
    ),
    Rule(
        "fused_moe",
        lambda c: c.quantization == "fp8-block128" and (c.moe_inter % MOE_BLOCK or c.hidden_size % MOE_BLOCK),
        lambda c: (
            f"MoE width per rank {c.moe_inter} / hidden {c.hidden_size} not a multiple of the 128 block: "
            "SGLang's Fp8MoEMethod rejects this TP for block-FP8 experts (use --ep-size)"
        ),
    ),
    # --- router_gemm ------------------------------------------------------------------------------
    Rule("router_gemm", lambda c: not c.is_moe, lambda c: "dense model: no router", outcome="n/a"),
    Rule(
        "router_gemm",
        lambda c: c.router_family is None,
        lambda c: f"no router hook for {c.model} (hooks exist for hunyuan_v3, qwen3_moe, deepseek_v2 gates)",
    ),
    Rule(
        "router_gemm",
        lambda c: c.router_family in ("deepseek", "kimi") and c.router_dtype != "fp32",
        lambda c: "bf16 MoEGate: SGLang already computes fp32 logits from it exactly",
    ),
    Rule("router_gemm", _no_gpu, lambda c: "no CUDA GPU"),
    Rule(
        "router_gemm",
        _not_sm90,
        lambda c: f"GPU is {_sm(c)}: the kernel is tuned and validated on SM90 (Hopper) only",
    ),
    Rule(
        "router_gemm",
        lambda c: not (ROUTER_N_RANGE[0] <= c.num_experts <= ROUTER_N_RANGE[1] and c.num_experts % 16 == 0),
        lambda c: f"{c.num_experts} experts: kernel needs a multiple of 16 in {ROUTER_N_RANGE}",
    ),
    Rule(
        "router_gemm",
        lambda c: not ROUTER_K_RANGE[0] <= c.hidden_size <= ROUTER_K_RANGE[1],
        lambda c: f"hidden size {c.hidden_size} outside {ROUTER_K_RANGE}",
    ),
    Rule("router_gemm", lambda c: not c.router_opt_in, lambda c: f"opt-in: set {ROUTER_ENV}=1 to use it"),
]


def first_rule(op: str, c: Conditions) -> Rule | None:
    """The first rule of ``op`` that fires for ``c`` (None: our kernel runs the op)."""
    return next((r for r in RULES if r.op == op and r.fires(c)), None)


# --------------------------------------------------------------------------------------- launch rules
@dataclass(frozen=True)
class Setup:
    """What one ``sglang.launch_server`` asks for, as SGLang resolves it (None = SGLang's default)."""

    prefill_attention: str | None = None  # the prefill (or only) attention backend
    decode_attention: str | None = None
    moe_runner: str = "auto"
    tp: int = 1
    ep: int = 1
    attn_dp: int = 1
    dp: int = 1  # replicas behind SGLang's data-parallel router (--dp-size)
    kv_dtype: str = "auto"  # 'auto' | 'bf16' | 'fp8_e4m3'
    page_size: int = 1
    speculative: str | None = None  # SGLang's --speculative-algorithm
    dcp: int = 1  # decode context parallelism (--dcp-size)
    moe_a2a: str = "none"
    disable_shared_experts_fusion: bool = False
    use_ray: bool = False
    quant_method: str | None = None  # SGLang's quantization method name; None = from the model profile
    hpc_ops_installed: bool | None = None  # the `hpc` package; None = not known here
    mixed_chunk: bool = False  # --enable-mixed-chunk
    pdmux: bool = False  # --enable-pdmux
    chunked_local_attention: bool | None = None  # None = from the model profile (chunked_local_attention)

    @property
    def attention_backends(self) -> tuple[str | None, str | None]:
        return self.prefill_attention, self.decode_attention or self.prefill_attention

    def uses_ours(self) -> bool:
        return NAME in self.attention_backends or self.moe_runner == NAME


@dataclass(frozen=True)
class Facts:
    """What a launch rule reads: the setup, the model, the GPU's compute capability (None = unknown)."""

    setup: Setup
    model: ModelProfile
    sm: tuple[int, int] | None

    @property
    def mla(self) -> bool:
        return self.model.attention == "mla"

    @property
    def fp8_kv(self) -> bool:
        return self.setup.kv_dtype.startswith("fp8")

    @property
    def backends(self) -> set[str]:
        return {b for b in self.setup.attention_backends if b}

    @property
    def quant_method(self) -> str:
        if self.setup.quant_method is not None:
            return self.setup.quant_method or "none"
        return quant_method_of(self.model)

    @property
    def fused_shared(self) -> int:
        s = self.setup
        return fused_shared_experts(
            self.model, ep=s.ep, disabled=s.disable_shared_experts_fusion, a2a=s.moe_a2a
        )

    @property
    def local_attention(self) -> bool:
        c = self.setup.chunked_local_attention
        return chunked_local_attention(self.model) if c is None else c

    def op_conditions(self) -> Conditions:
        s = self.setup
        c = conditions(
            self.model,
            None,
            tp=s.tp,
            ep=s.ep,
            attn_dp=s.attn_dp,
            kv_dtype="fp8_e4m3" if self.fp8_kv else "bf16",
            page_size=s.page_size,
            router_opt_in=False,
            disable_shared_experts_fusion=s.disable_shared_experts_fusion or s.moe_a2a not in A2A_NONE,
        )
        return replace(c, sm=self.sm, interpreter=self.sm is None, quant_method=self.quant_method)

    def heads_per_rank(self) -> tuple[int, int]:
        attn_tp = self.setup.tp // self.setup.attn_dp
        return max(1, self.model.num_heads // attn_tp), max(1, self.model.num_kv_heads // attn_tp)


@dataclass(frozen=True)
class LaunchRule:
    """``fires(facts)`` true = the set-up breaks (``refuse``), is the ``auto`` one again (``fallback``) or
    costs every decode step (``slow``); ``reason`` says why and what to use instead."""

    key: str
    subject: str  # what the rule is about, for the docs table
    kind: str  # 'refuse' | 'fallback' | 'slow'
    fires: Callable[[Facts], bool]
    reason: Callable[[Facts], str]
    ours: bool = False  # the plugin enforces it (it names one of our backends)
    setup_only: bool = False  # reads the set-up only: checked even when the model's shapes are unknown


def _sm_of(f: Facts) -> str:
    return sm_name(f.sm)


def _decode_ours(f: Facts) -> bool:
    return f.setup.attention_backends[1] == NAME


def _decode_op_reason(f: Facts) -> str | None:
    rule = first_rule("decode_attention", f.op_conditions())
    return rule.reason(f.op_conditions()) if rule else None


def _moe_op_reason(f: Facts) -> str | None:
    c = f.op_conditions()
    rule = first_rule("fused_moe", c)
    return rule.reason(c) if rule and rule.outcome != "n/a" else None


def _fa3_ok(f: Facts) -> bool:
    # create_flashattention_v3_backend (sglang/srt/layers/attention/attention_registry.py): SM90, or SM80 without MLA
    return f.sm is None or f.sm[0] == 9 or (f.sm[0] == 8 and not f.mla)


def _hpc_ops_attn_reason(f: Facts) -> str | None:
    s = f.setup
    if f.sm is not None and f.sm[0] != 9:
        return f"hpc_ops attention ships sm90a kernels only (this GPU is {_sm_of(f)})"
    if f.mla:
        return "hpc_ops attention is MHA/GQA only (the model uses MLA)"
    if s.speculative:
        return "hpc_ops attention does not support speculative decoding"
    if s.page_size != REQUIRED_PAGE_SIZE:
        return f"hpc_ops attention needs --page-size {REQUIRED_PAGE_SIZE}"
    q, kv = f.heads_per_rank()
    if f.model.head_dim != HPC_OPS_HEAD_DIM or q % kv or q // kv not in HPC_OPS_GROUPS:
        return (
            f"hpc_ops attention needs head_dim 128 and GQA group 4 or 8 (model: {f.model.head_dim}, {q}/{kv})"
        )
    if f.fp8_kv and (f.model.key not in HPC_OPS_FP8_MODELS or (q, kv) not in HPC_OPS_FP8_HEADS):
        return (
            "hpc_ops FP8 KV needs the fused RoPE+quant store only hunyuan_v3 calls, at per-rank heads "
            f"{HPC_OPS_FP8_HEADS} (model {f.model.key}, {q}/{kv}); use --kv-cache-dtype auto"
        )
    if s.hpc_ops_installed is False:
        return "the `hpc` package (HPC-Ops) is not installed"
    return None


def _hpc_ops_moe_reason(f: Facts) -> str | None:
    s = f.setup
    if not f.model.is_moe:
        return None
    if f.quant_method != "fp8" or (f.sm is not None and f.sm[0] != 9):
        return (
            f"hpc_ops MoE needs FP8 experts (Fp8MoEMethod) on SM90 (model {f.quant_method}, GPU {_sm_of(f)})"
        )
    if f.fused_shared:
        return (
            "hpc_ops MoE rejects fused shared experts, which SGLang turns on for this model at EP 1: "
            "add --disable-shared-experts-fusion"
        )
    if s.hpc_ops_installed is False:
        return "the `hpc` package (HPC-Ops) is not installed"
    return None


LAUNCH_RULES: list[LaunchRule] = [
    LaunchRule(
        "heads-split",
        "attention heads split over attention-TP (tp / attn-dp)",
        "refuse",
        lambda f: f.model.num_heads % (f.setup.tp // f.setup.attn_dp) != 0,
        lambda f: (
            f"{f.model.num_heads} attention heads do not split over attention-TP {f.setup.tp // f.setup.attn_dp}"
        ),
    ),
    LaunchRule(
        "replicas-attn-dp",
        "data-parallel replicas (--dp-size) without attention DP",
        "refuse",
        lambda f: f.setup.dp > 1 and f.setup.attn_dp > 1,
        lambda f: (
            f"--dp-size {f.setup.dp} with --attn-dp-size {f.setup.attn_dp}: SGLang does not combine replicas "
            "with attention data parallelism (handle_data_parallelism)"
        ),
    ),
    LaunchRule(
        "experts-split",
        "routed experts split over EP",
        "refuse",
        lambda f: f.model.is_moe and f.model.num_experts % f.setup.ep != 0,
        lambda f: f"{f.model.num_experts} experts do not split over EP {f.setup.ep}",
    ),
    LaunchRule(
        "block-fp8-width",
        "block-FP8 experts: MoE width per MoE-TP rank a multiple of 128",
        "refuse",
        lambda f: (
            f.model.is_moe
            and f.model.quantization == "fp8-block128"
            and f.op_conditions().moe_inter % MOE_BLOCK != 0
        ),
        lambda f: (
            f"MoE width per rank {f.op_conditions().moe_inter} is not a multiple of the 128 block: "
            "SGLang's Fp8MoEMethod rejects this TP for block-FP8 experts (use --ep-size)"
        ),
    ),
    LaunchRule(
        "ours-prefill",
        "hpc_advise as prefill backend",
        "refuse",
        lambda f: f.setup.prefill_attention == NAME,
        lambda f: (
            f"{NAME} is a decode-only attention backend: use --decode-attention-backend {NAME} "
            f"--page-size {REQUIRED_PAGE_SIZE} and keep --attention-backend fa3"
        ),
        ours=True,
        setup_only=True,
    ),
    LaunchRule(
        "ours-decode-shape",
        "hpc_advise decode: SM90; GQA/MHA head_dim 64/128/256, group 1-16, bf16/fp8 KV, page 64; or MLA "
        "latent 512 + rope 64, 1-16 heads or a multiple of 16 up to 128, bf16 KV, page 1/16/64, no DSA",
        "refuse",
        lambda f: _decode_ours(f) and _decode_op_reason(f) is not None,
        lambda f: f"--decode-attention-backend {NAME}: {_decode_op_reason(f)}; use fa3 (SM90) or flashinfer",
        ours=True,
    ),
    LaunchRule(
        "ours-speculative",
        "hpc_advise decode with speculative decoding (MTP/EAGLE)",
        "refuse",
        lambda f: _decode_ours(f) and bool(f.setup.speculative),
        lambda f: (
            f"--decode-attention-backend {NAME} has no speculative (draft/verify) path: drop "
            f"--speculative-algorithm {f.setup.speculative} or use fa3"
        ),
        ours=True,
        setup_only=True,
    ),
    LaunchRule(
        "ours-dcp",
        "hpc_advise decode with decode context parallelism (--dcp-size > 1)",
        "refuse",
        lambda f: _decode_ours(f) and f.setup.dcp > 1,
        lambda f: (
            f"--decode-attention-backend {NAME} attends over the whole KV of each request on one rank; "
            f"--dcp-size {f.setup.dcp} shards it over ranks: drop --dcp-size or use SGLang's MLA backend"
        ),
        ours=True,
        setup_only=True,
    ),
    LaunchRule(
        "ours-local-attention",
        "hpc_advise decode on chunked local attention (Llama-4 iRoPE)",
        "refuse",
        lambda f: _decode_ours(f) and f.local_attention,
        lambda f: (
            f"--decode-attention-backend {NAME} attends over the whole context, this model uses chunked "
            "local attention: use fa3"
        ),
        ours=True,
    ),
    LaunchRule(
        "ours-ray",
        "hpc_advise backends with --use-ray",
        "refuse",
        lambda f: f.setup.use_ray and f.setup.uses_ours(),
        lambda f: (
            f"--use-ray starts workers that never load SGLang plugins, so {NAME} is unknown there: drop --use-ray"
        ),
        ours=True,
        setup_only=True,
    ),
    LaunchRule(
        "ours-mixed-chunk",
        "hpc_advise decode with mixed chunked prefill (--enable-mixed-chunk)",
        "refuse",
        lambda f: _decode_ours(f) and f.setup.mixed_chunk,
        lambda f: (
            f"--enable-mixed-chunk sends the decode rows of every mixed prefill+decode batch to the prefill "
            f"backend (SGLang's HybridAttnBackend routes MIXED batches to prefill), not to {NAME}: "
            "drop --enable-mixed-chunk"
        ),
        ours=True,
        setup_only=True,
    ),
    LaunchRule(
        "ours-pdmux",
        "hpc_advise decode with PD-multiplexing (--enable-pdmux)",
        "refuse",
        lambda f: _decode_ours(f) and f.setup.pdmux,
        lambda f: (
            f"--enable-pdmux runs decode on a partition of the SMs (green contexts); {NAME}'s persistent "
            "decode grid is planned for every SM of the GPU and is not validated there: drop --enable-pdmux "
            "or use fa3"
        ),
        ours=True,
        setup_only=True,
    ),
    LaunchRule(
        "ours-moe-fallback",
        "hpc_advise MoE: Fp8MoEMethod experts (FP8 per-tensor or 128x128 blocks), SM90, standard dispatch",
        "fallback",
        lambda f: f.setup.moe_runner == NAME and f.model.is_moe and moe_fallback_reason(f) is not None,
        lambda f: f"--moe-runner-backend {NAME} runs SGLang's auto choice here: {moe_fallback_reason(f)}",
        ours=True,
    ),
    LaunchRule(
        "fa3-sm",
        "fa3 (prefill or decode): SM90, or SM80 without MLA",
        "refuse",
        lambda f: "fa3" in f.backends and not _fa3_ok(f),
        lambda f: (
            f"fa3 needs SM90, or SM80 without MLA (this GPU is {_sm_of(f)}{', MLA model' if f.mla else ''}): "
            "use flashinfer or triton"
        ),
    ),
    LaunchRule(
        "hpc_ops-attention",
        "hpc_ops attention: SM90, `hpc` installed, GQA head_dim 128 group 4/8, page 64; FP8 KV only Hy3",
        "refuse",
        lambda f: "hpc_ops" in f.backends and _hpc_ops_attn_reason(f) is not None,
        lambda f: str(_hpc_ops_attn_reason(f)),
    ),
    LaunchRule(
        "hpc_ops-moe",
        "hpc_ops MoE: FP8 on SM90, `hpc` installed, no fused shared experts",
        "refuse",
        lambda f: f.setup.moe_runner == "hpc_ops" and _hpc_ops_moe_reason(f) is not None,
        lambda f: str(_hpc_ops_moe_reason(f)),
    ),
    LaunchRule(
        "deep_gemm",
        "deep_gemm MoE: FP8 block-128 checkpoint on SM90/SM100",
        "refuse",
        lambda f: (
            f.setup.moe_runner == "deep_gemm"
            and f.model.is_moe
            and (f.model.quantization != "fp8-block128" or (f.sm is not None and f.sm[0] not in (9, 10)))
        ),
        lambda f: "deep_gemm needs an FP8 block-128 checkpoint on SM90/SM100",
    ),
    LaunchRule(
        "flashinfer-fp8kv-mla",
        "flashinfer decode with FP8 KV on an MLA model",
        "slow",
        lambda f: f.setup.attention_backends[1] == "flashinfer" and f.mla and f.fp8_kv,
        lambda f: (
            "flashinfer with FP8 KV on MLA copies each layer's KV pool to bf16 every decode step "
            "(SGLang's default on SM90 is fa3): use fa3, or bf16 KV"
        ),
    ),
]


def moe_fallback_reason(f: Facts) -> str | None:
    """Why SGLang's auto MoE choice runs instead of ours for this set-up (None: ours runs)."""
    if f.quant_method not in MOE_QUANT_METHODS:
        return f"quantization {f.quant_method} does not build Fp8MoEMethod layers (ours hooks only those)"
    if f.setup.moe_a2a not in A2A_NONE:
        return f"all-to-all backend {f.setup.moe_a2a} (ours takes the standard dispatch only)"
    return _moe_op_reason(f)


def launch_violations(
    setup: Setup, model: ModelProfile | None, sm: tuple[int, int] | None, *,
    kinds=("refuse", "fallback", "slow"), ours_only: bool = False,
) -> list[tuple[LaunchRule, str]]:  # fmt: skip
    """Every launch rule of ``kinds`` that fires, with its reason, in table order (``model`` None: the
    shapes are unknown and only the rules that read the set-up alone are checked)."""
    f = Facts(setup, model, sm)  # type: ignore[arg-type]
    out = []
    for rule in LAUNCH_RULES:
        if model is None and not rule.setup_only:
            continue
        if rule.kind in kinds and (rule.ours or not ours_only) and rule.fires(f):
            out.append((rule, rule.reason(f)))
    return out


def launch_refusal(setup: Setup, model: ModelProfile | None, sm: tuple[int, int] | None, **kw) -> str | None:
    """The first reason a launch rule gives for ``setup`` (None: nothing fires)."""
    found = launch_violations(setup, model, sm, **kw)
    return found[0][1] if found else None


@dataclass(frozen=True)
class TableRow:
    subject: str
    kind: str
    enforced_by: str


def support_table() -> list[TableRow]:
    """The launch rules as rows (docs/runtime.md's table of what runs where is generated from this)."""
    return [
        TableRow(r.subject, r.kind, "plugin at server-args resolution + advisor" if r.ours else "advisor")
        for r in LAUNCH_RULES
    ]


def support_table_markdown() -> str:
    lines = ["| set-up | when it does not hold | checked by |", "|---|---|---|"]
    meaning = {"refuse": "refused", "fallback": "SGLang's auto runs", "slow": "excluded (slow path)"}
    lines += [f"| {r.subject} | {meaning[r.kind]} | {r.enforced_by} |" for r in support_table()]
    return "\n".join(lines)


# ------------------------------------------------------------------------- SGLang's static memory
# sglang/srt/arg_groups/memory_hook.py:handle_gpu_memory_settings. By GPU memory (MiB, upper bounds):
# chunked prefill tokens, decode CUDA-graph max batch below / at TP 4.
_MEMORY_TIERS = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 4096, 48, 160),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (float("inf"), 16384, 512, 512),
)
# all-to-all backends the breakable prefill CUDA graph (SGLang's default on CUDA) keeps
# (cuda_graph_hook.disable_breakable_cudagraph_if_incompatible)
_BCG_A2A = ("none", "deepep", "megamoe", "flashinfer")


def _prefill_graph_sizes(max_bs: int) -> int:
    """How many token counts SGLang captures prefill graphs for (generate_prefill_cuda_graph_batch_sizes)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64)]
    sizes += [*range(1280, 4097, 256), *range(4608, max_bs + 1, 512)]
    return sum(1 for x in sizes if x <= max_bs)


# Checkpoints with a vision tower (``...ForConditionalGeneration``), by profile key prefix: SGLang
# serves them as multimodal models (the profiles keep the text model only). Per family, the tower's
# (layers, hidden size) as adjust_mem_fraction_for_vlm reads them from SGLang's vision config
# (configs/kimi_k25.py KimiK25VisionConfig: 27 x 1152; Qwen3.5's Qwen3VLVisionConfig names its 27
# layers ``depth``, so SGLang reads its default of 24 layers).
VISION_TOWERS = {"kimi-k2": (27, 1152), "qwen3.5": (24, 1152)}


def vision_tower(model: ModelProfile) -> tuple[int, int] | None:
    key = model.key.lower()
    return next((t for prefix, t in VISION_TOWERS.items() if key.startswith(prefix)), None)


def _vlm_factor(tower: tuple[int, int]) -> float:
    """adjust_mem_fraction_for_vlm: 0.95 for a ViT-L/14-sized tower, 10 % less per doubling of its size."""
    layers, hidden = tower
    ratio = layers * hidden**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def static_memory_fraction(
    setup: Setup, memory_gib: float, *, mla: bool, vision: tuple[int, int] | None = None
) -> float:
    """SGLang's default ``mem_fraction_static`` for ``setup`` on a GPU of ``memory_gib`` (``vision``: the
    checkpoint's vision tower, :func:`vision_tower`): the share of memory that holds weights + KV pool;
    the rest is its estimate of activations and CUDA-graph buffers (``handle_gpu_memory_settings``,
    without ``--mem-fraction-static``). Not modelled: pipeline parallelism, speculative decoding and
    post-capture KV sizing (off by default)."""
    mib = float(memory_gib) * 1024
    _, chunk, small_bs, large_bs = next(t for t in _MEMORY_TIERS if mib < t[0])
    decode_bs = small_bs if setup.tp < 4 else large_bs
    reserved = 512 + max(chunk, 2048) * 1.5 + setup.tp / 8 * 1024
    graphs = decode_bs * 2.0
    if setup.attn_dp > 1:  # DP attention pads each group's batch (reserve_for_graph_mb)
        graphs += decode_bs * setup.attn_dp * 3
        if decode_bs > 300:
            graphs += decode_bs * setup.attn_dp * 1.5
    # prefill graphs: breakable by default on CUDA (kept for these multimodal models), off for other a2a
    if setup.moe_a2a in A2A_NONE or setup.moe_a2a in _BCG_A2A:
        graphs += 1.5 * 1024 if mla else _prefill_graph_sizes(chunk) * 8
    reserved += graphs
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if setup.moe_a2a == "deepep":
        reserved += 2 * 1024
    fraction = round((mib - reserved) / mib, 3)
    return fraction * _vlm_factor(vision) if vision else fraction


# SGLang's --swa-full-tokens-ratio default: a sliding-window layer's pool holds this share of the
# tokens of a full-attention layer's pool (arg_groups/fields/schedule.py).
SWA_FULL_TOKENS_RATIO = 0.8
# DSA (DeepSeek-V3.2 / GLM-5) FP8 latent rows on Hopper (SGLang's default DSA backend there,
# flashmla_kv) carry one fp32 scale per 128 values and keep the rope part in bf16; Blackwell's default
# (trtllm) stores the raw rows (mem_cache.memory_pool.DSATokenToKVPool,
# kv_cache_configurator.calculate_mla_kv_cache_dim, arg_groups/overrides.py)
_DSA_QUANT_BLOCK = 128


def kv_cell_bytes(model: ModelProfile, attn_tp: int, kv_dtype_bytes: float, sm_major: int = 9) -> float:
    """Bytes one token of SGLang's KV pool takes on one rank (``pool_configurator``'s cell size):
    the full-attention layers only (linear-attention layers keep a per-request state in their own
    pool); MLA's latent (kv_lora_rank + qk_rope_head_dim) whole on every attention-TP rank, once per
    attention-DP group; GQA's KV heads split over attention-TP, at least one per rank; plus the DSA
    indexer keys and, for sliding-window layers, their pool at ``SWA_FULL_TOKENS_RATIO`` of the
    full-layer tokens. ``sm_major``: the GPU's compute capability major (DSA's FP8 layout)."""
    full = model.num_full_attention_layers
    if model.attention == "mla":
        lora, rope = model.kv_lora_rank or 0, model.qk_rope_head_dim or 0
        if model.index_n_heads and kv_dtype_bytes < 2 and sm_major < 10:
            per_layer = lora + lora // _DSA_QUANT_BLOCK * 4 + rope * 2
        else:
            per_layer = (lora + rope) * kv_dtype_bytes
        return full * per_layer + model.indexer_bytes_per_token()
    heads = max(1, model.num_kv_heads // max(attn_tp, 1))
    per_layer = heads * (model.head_dim + (model.v_head_dim or model.head_dim)) * kv_dtype_bytes
    return full * per_layer + SWA_FULL_TOKENS_RATIO * model.num_sliding_window_layers * per_layer


def kv_pool_tokens(
    model: ModelProfile,
    attn_tp: int,
    kv_dtype_bytes: float,
    *,
    memory_gib: float,
    fraction: float,
    weight_bytes: float,
    page_size: int = 1,
    sm_major: int = 9,
) -> int:
    """SGLang's ``max_total_num_tokens`` on one rank: the static share of GPU memory
    (``fraction``, :func:`static_memory_fraction`) less this rank's weights, over
    :func:`kv_cell_bytes`, rounded down to whole pages; 0 when the weights fill it. (SGLang measures
    the free memory before loading, which the GPU's memory stands for here.)"""
    free = float(memory_gib) * 2**30 * fraction - weight_bytes
    cell = kv_cell_bytes(model, attn_tp, kv_dtype_bytes, sm_major)
    if free <= 0 or cell <= 0:
        return 0
    return int(free // cell) // page_size * page_size


# ------------------------------------------------------------------------------ what runs where (docs)
WHERE_GPUS = ("h100", "h200", "h20", "b200", "a100")
WHERE_ATTENTION = ("fa3", "flashinfer", "triton", "hpc_ops", NAME)
WHERE_MOE = ("auto", "deep_gemm", "hpc_ops", NAME)
# (column title, model profile key, TP, EP) of the representative set-ups in the table
WHERE_MODELS = (("GQA, Qwen3-32B TP8", "qwen3-32b", 8, 1), ("MLA, DeepSeek-V3 TP8", "deepseek-v3", 8, 1))
WHERE_MOE_MODEL = ("FP8 MoE, Hy3 TP8 EP8", "hy3", 8, 8)


def _attention_setup(backend: str, tp: int, ep: int) -> Setup:
    ours = backend == NAME
    page = REQUIRED_PAGE_SIZE if backend in ("hpc_ops", NAME) else 1
    return Setup(
        PREFILL_FOR_OURS if ours else backend, backend, "auto", tp, ep, page_size=page, hpc_ops_installed=True
    )


def where_table_markdown() -> str:
    """Which attention backends and MoE runners the rules let run, per GPU profile (``hpc`` installed)."""
    from hpc_advise.profiles import get_gpu, get_model

    titles = [t for t, *_ in WHERE_MODELS] + [WHERE_MOE_MODEL[0]]
    lines = ["| GPU | " + " | ".join(titles) + " |", "|---|" + "---|" * len(titles)]
    for key in WHERE_GPUS:
        gpu = get_gpu(key)
        sm = tuple(gpu.compute_capability)
        cells = []
        for _, model_key, tp, ep in WHERE_MODELS:
            model = get_model(model_key)
            ok = [
                b for b in WHERE_ATTENTION if launch_refusal(_attention_setup(b, tp, ep), model, sm) is None
            ]
            cells.append(", ".join(ok) or "-")
        _, model_key, tp, ep = WHERE_MOE_MODEL
        model = get_model(model_key)
        ok = [
            m for m in WHERE_MOE
            if launch_refusal(replace(_attention_setup("flashinfer", tp, ep), moe_runner=m,
                                      disable_shared_experts_fusion=m == "hpc_ops"), model, sm) is None
        ]  # fmt: skip
        cells.append(", ".join(ok) or "-")
        lines.append(f"| {gpu.name} ({sm_name(sm)}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


DOC_START = "<!-- generated from hpc_advise/rules.py: start -->"
DOC_END = "<!-- generated from hpc_advise/rules.py: end -->"


def docs_block() -> str:
    """The generated part of docs/runtime.md (``tests/runtime/test_rules_doc.py`` keeps them equal)."""
    return "\n\n".join([DOC_START, where_table_markdown(), support_table_markdown(), DOC_END])
