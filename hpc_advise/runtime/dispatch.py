"""The dispatch table: for each op we replace, which conditions send it to our kernel or to SGLang's.

One declarative list, ``RULES``: each :class:`Rule` names an op, a predicate over :class:`Conditions`
that, when true, sends the op to the fallback, and the reason. Rules are checked in order; the first
one that fires decides (so the reason printed is the most basic one). When none fires, our kernel runs.
The same table answers ``hpc-advise runtime check`` and guards the SGLang plugin at start-up
(``sglang/attention.py``/``sglang/moe.py`` raise or fall back with these reasons), so the printed table and
what runs cannot drift apart.

Ops: ``decode_attention`` (paged GQA decode, the ``hpc_advise`` attention backend), ``fused_moe``
(FP8 MoE experts, the ``hpc_advise`` MoE runner), ``router_gemm`` (FP32-accurate router logits, opt-in
with ``HPC_ADVISE_ROUTER_GEMM=1``).

Imports only the standard library and ``hpc_advise.profiles`` (no torch): the table is computed from
profiles, so it answers for a GPU you do not have.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpc_advise.profiles import GpuProfile, ModelProfile

OPS = ("decode_attention", "fused_moe", "router_gemm")

# What our kernels accept (hpc_advise/kernels/*/op.py; kept here as data so the table needs no torch).
DECODE_HEAD_DIMS = (64, 128, 256)
DECODE_MAX_GROUP = 16
DECODE_KV_DTYPES = ("bf16", "fp8_e4m3")
# The backend needs --page-size 64: the kernel was tuned at page 64 (tiles of 64 tokens; 32 for fp8 KV
# with >= 8 KV heads). It also accepts pages of 1 and 16, but SGLang's default page size 1 makes the page
# table as wide as the context; we ask for 64 explicitly and fail when it is anything else.
REQUIRED_PAGE_SIZE = 64
MOE_QUANTIZATIONS = ("fp8-per-tensor", "fp8-block128")
MOE_BLOCK = 128
ROUTER_N_RANGE = (64, 512)  # experts, multiple of 16 (router_gemm/op.py N_RANGE)
ROUTER_K_RANGE = (1024, 8192)  # hidden size (router_gemm/op.py K_RANGE)
ROUTER_ENV = "HPC_ADVISE_ROUTER_GEMM"
SM90 = (9, 0)

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


@dataclass(frozen=True)
class Conditions:
    """Everything a rule may look at, per GPU rank (heads and MoE width already divided by TP/EP)."""

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
    num_experts: int
    hidden_size: int
    moe_inter: int  # per rank
    router_dtype: str
    router_family: str | None
    router_opt_in: bool
    interpreter: bool = False  # Triton interpreter on CPU (tests)
    top_k: int = 0  # experts per token (MoE models)

    @property
    def group(self) -> float:
        return self.q_heads / self.kv_heads if self.kv_heads else float("inf")


def conditions(
    model: ModelProfile,
    gpu: GpuProfile | None,
    *,
    tp: int = 1,
    kv_dtype: str = "bf16",
    page_size: int = REQUIRED_PAGE_SIZE,
    router_opt_in: bool | None = None,
    architecture: str | None = None,
) -> Conditions:
    """Conditions of ``model`` served with tensor parallelism ``tp`` on ``gpu`` (None = no GPU);
    ``architecture`` is the config.json ``architectures[0]`` when the model came from a file."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if kv_dtype not in ("bf16", "fp8_e4m3", "auto"):
        raise ValueError(f"kv_dtype must be bf16, fp8_e4m3 or auto, got {kv_dtype!r}")
    kv = "bf16" if kv_dtype == "auto" else kv_dtype
    q_heads = max(1, model.num_heads // tp)
    kv_heads = max(1, model.num_kv_heads // tp)
    inter = (model.moe_intermediate_size or 0) // tp if model.is_moe else 0
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
        num_experts=model.num_experts,
        hidden_size=model.hidden_size,
        moe_inter=inter,
        top_k=model.top_k if model.is_moe else 0,
        router_dtype=model.router_dtype,
        router_family=router_family(model.key, architecture),
        router_opt_in=router_env_enabled() if router_opt_in is None else router_opt_in,
    )


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


def _sm(c: Conditions) -> str:
    return f"sm{c.sm[0]}{c.sm[1]}" if c.sm else "none"


RULES: list[Rule] = [
    # --- decode_attention -------------------------------------------------------------------------
    Rule(
        "decode_attention",
        lambda c: c.attention == "mla",
        lambda c: "MLA attention: our decode kernel is MHA/GQA only",
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
    Rule(
        "decode_attention",
        lambda c: c.head_dim not in DECODE_HEAD_DIMS,
        lambda c: f"head_dim {c.head_dim} not in {DECODE_HEAD_DIMS}",
    ),
    Rule(
        "decode_attention",
        lambda c: c.q_heads % c.kv_heads != 0 or not 1 <= c.q_heads // c.kv_heads <= DECODE_MAX_GROUP,
        lambda c: (
            f"GQA group {c.q_heads}/{c.kv_heads} per rank: needs an integer group 1..{DECODE_MAX_GROUP}"
        ),
    ),
    Rule(
        "decode_attention",
        lambda c: c.kv_dtype not in DECODE_KV_DTYPES,
        lambda c: f"KV cache dtype {c.kv_dtype} not in {DECODE_KV_DTYPES}",
    ),
    Rule(
        "decode_attention",
        lambda c: c.page_size != REQUIRED_PAGE_SIZE,
        lambda c: f"page size {c.page_size}: the backend needs --page-size {REQUIRED_PAGE_SIZE}",
    ),
    # --- fused_moe --------------------------------------------------------------------------------
    Rule("fused_moe", lambda c: not c.is_moe, lambda c: "dense model: no MoE layers", outcome="n/a"),
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


# What runs instead, per op (SGLang's names).
def fallback_name(op: str, c: Conditions) -> str:
    if op == "decode_attention":
        if c.attention == "mla":
            return "SGLang's MLA default (fa3/flashmla on SM90, flashinfer otherwise)"
        return "fa3" if c.sm == SM90 else ("flashinfer" if c.sm is not None else "torch_native")
    if op == "fused_moe":
        return "triton"
    return "SGLang's gate (unchanged)"


OURS = {
    "decode_attention": "hpc_advise (decode_attention: dynamic persistent paged decode)",
    "fused_moe": "hpc_advise (fused_moe: FP8 fused MoE)",
    "router_gemm": "hpc_advise (router_gemm: two-bf16 fp32-accurate)",
}


def _ours_reason(op: str, c: Conditions) -> str:
    if op == "decode_attention":
        return (
            f"GQA {c.q_heads}/{c.kv_heads}, head_dim {c.head_dim}, {c.kv_dtype} KV, page {c.page_size}; "
            "prefill/extend stay on SGLang's prefill backend"
        )
    if op == "fused_moe":
        return (
            f"{c.quantization} experts, {c.num_experts} experts, width {c.moe_inter} per rank; "
            + _moe_tuning(c)
        )
    return f"{c.router_dtype} gate weight -> fp32 logits, {c.num_experts} experts x hidden {c.hidden_size}"


# The fused MoE's launch-config table (hpc_advise/kernels/fused_moe/configs.json, written by
# benchmarks/tune_fused_moe.py), read as data: importing the kernel package would import torch.
MOE_CONFIGS = Path(__file__).resolve().parents[1] / "kernels" / "fused_moe" / "configs.json"


@functools.lru_cache(maxsize=1)
def _moe_config_entries() -> tuple[dict, ...]:
    """configs.json's entries, read once per process (the plugin asks once per MoE layer)."""
    try:
        return tuple(json.loads(MOE_CONFIGS.read_text(encoding="utf-8")).get("entries", []))
    except (OSError, ValueError):
        return ()


def moe_tuned_points(num_experts: int, hidden: int, inter: int, top_k: int) -> dict[str, dict[int, str]]:
    """{scale mode: {T: 'small'|'regular'}} of the tuned configs for this MoE shape ({} = none: the
    kernel then runs its heuristic configs)."""
    out: dict[str, dict[int, str]] = {}
    for e in _moe_config_entries():
        if (e.get("E"), e.get("H"), e.get("I"), e.get("top_k")) == (num_experts, hidden, inter, top_k):
            path = "small" if (e.get("config") or {}).get("PATH") == "small" else "regular"
            out.setdefault(str(e.get("mode")), {})[int(e["T"])] = path
    return {mode: dict(sorted(per_t.items())) for mode, per_t in out.items()}


def _moe_tuning(c: Conditions) -> str:
    """Whether the fused MoE's launch configs for this shape were measured or not."""
    points = moe_tuned_points(c.num_experts, c.hidden_size, c.moe_inter, c.top_k)
    if not points:
        return "no tuned launch configs for this shape (heuristic configs, not measured)"
    parts = []
    for mode, per_t in sorted(points.items()):
        small = [t for t, path in per_t.items() if path == "small"]
        ts = f"T = {min(per_t)}-{max(per_t)}" if len(per_t) > 1 else f"T = {min(per_t)}"
        tuned_small = f" (small-T path at T = {', '.join(map(str, small))})" if small else ""
        parts.append(f"{mode} {ts}{tuned_small}")
    return "launch configs tuned on the H200: " + ", ".join(parts)


@dataclass(frozen=True)
class Decision:
    op: str
    use_ours: bool
    provider: str  # what runs
    reason: str
    outcome: str = field(default="ours")  # 'ours' | 'fallback' | 'n/a'

    def to_dict(self) -> dict:
        return asdict(self)


def decide(op: str, c: Conditions) -> Decision:
    """First rule of ``op`` that fires sends it to the fallback; no rule firing means our kernel."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r} (known: {', '.join(OPS)})")
    for rule in RULES:
        if rule.op == op and rule.fires(c):
            provider = "-" if rule.outcome == "n/a" else fallback_name(op, c)
            return Decision(op, False, provider, rule.reason(c), rule.outcome)
    return Decision(op, True, OURS[op], _ours_reason(op, c), "ours")


def table(c: Conditions) -> list[Decision]:
    """One decision per op, in ``OPS`` order."""
    return [decide(op, c) for op in OPS]
