"""Candidate SGLang configurations for a model on N GPUs, each checked for support and memory fit.

Dimensions: TP over the divisors of N (N / TP replicas behind SGLang's data-parallel router), EP in
{1, TP} for MoE models, attention data parallelism in {1, TP} for MoE models, attention backend
(fa3, flashinfer, triton, hpc_ops, ours = ``hpc_advise``), MoE runner (auto = SGLang's triton,
deep_gemm, hpc_ops, ours) and KV-cache dtype (auto, fp8_e4m3). The page size follows the backend
(64 for hpc_ops and ours, SGLang's default 1 otherwise). A candidate is kept only when no launch rule of
``hpc_advise.rules`` fires (the same table the plugin enforces when SGLang resolves its arguments);
every excluded candidate keeps its reason.

Memory per GPU (bytes): weights per rank (non-expert weights / attention-TP + routed experts / TP, at
the precision the profile plans, ``planned_quants``, or the one a measured row ran, ``rank_weight_bytes``) +
KV of the requests one attention group holds (concurrency x mean context during decode, isl + osl/2,
plus one request at the trace's p99 context, at SGLang's per-token cell size ``rules.kv_cell_bytes``)
must fit in the static memory SGLang gives weights + KV
pool: its default ``mem_fraction_static`` for that command on that GPU
(``rules.static_memory_fraction``); the rest is SGLang's activation / CUDA-graph reserve.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from hpc_advise import rules

ATTENTION_BACKENDS = ("fa3", "flashinfer", "triton", "hpc_ops", "hpc_advise")
MOE_RUNNERS = ("auto", "deep_gemm", "hpc_ops", "hpc_advise")
KV_DTYPES = ("auto", "fp8_e4m3")


@dataclass(frozen=True)
class Candidate:
    """One SGLang launch configuration on ``tp * replicas`` GPUs."""

    tp: int
    replicas: int = 1
    ep: int = 1
    attn_dp: int = 1
    attention_backend: str = "fa3"
    moe_runner: str | None = None  # None for dense models
    kv_dtype: str = "auto"

    @property
    def page_size(self) -> int:
        return 64 if self.attention_backend in ("hpc_ops", "hpc_advise") else 1

    @property
    def n_gpus(self) -> int:
        return self.tp * self.replicas

    def label(self) -> str:
        parts = [f"TP{self.tp}"]
        if self.replicas > 1:
            parts.insert(0, f"{self.replicas}x")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.attn_dp > 1:
            parts.append(f"attnDP{self.attn_dp}")
        parts.append(f"attn={self.attention_backend}")
        if self.moe_runner:
            parts.append(f"moe={self.moe_runner}")
        parts.append(f"kv={self.kv_dtype}")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return {
            "tp": self.tp,
            "replicas": self.replicas,
            "ep": self.ep,
            "attn_dp": self.attn_dp,
            "attention_backend": self.attention_backend,
            "moe_runner": self.moe_runner,
            "kv_dtype": self.kv_dtype,
            "page_size": self.page_size,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Candidate:
        keys = ("tp", "replicas", "ep", "attn_dp", "attention_backend", "moe_runner", "kv_dtype")
        return cls(**{k: d[k] for k in keys if k in d})


@dataclass
class Checked:
    candidate: Candidate
    ok: bool
    reason: str = ""
    memory: dict = field(default_factory=dict)  # GiB: weights, kv, reserve, usable, headroom


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def setup_of(c: Candidate) -> rules.Setup:
    """The SGLang set-up the launch command of ``c`` asks for (``launch.build_command`` prints it)."""
    ours = c.attention_backend == rules.NAME
    return rules.Setup(
        prefill_attention=rules.PREFILL_FOR_OURS if ours else c.attention_backend,
        decode_attention=c.attention_backend,
        moe_runner=c.moe_runner or "auto",
        tp=c.tp,
        ep=c.ep,
        attn_dp=c.attn_dp,
        dp=c.replicas,
        kv_dtype=c.kv_dtype,
        page_size=c.page_size,
        # printed with hpc_ops MoE: HPC-Ops rejects the shared expert SGLang fuses by default (DeepSeek-V3)
        disable_shared_experts_fusion=c.moe_runner == "hpc_ops",
        hpc_ops_installed=rules.hpc_ops_installed(),
    )


def support_reason(c: Candidate, model, gpu) -> str | None:
    """Why SGLang (or our plugin) cannot run ``c`` for this model on this GPU, or why it is not worth a
    candidate (SGLang's auto choice runs instead, or a slow path); None when it runs as asked. The rules
    are ``hpc_advise.rules.LAUNCH_RULES``, the ones the plugin enforces at server-args resolution."""
    return rules.launch_refusal(setup_of(c), model, tuple(gpu.compute_capability))


def planned_quants(model) -> tuple[str, str]:
    """(dense GEMM, routed-expert) weight formats, as ``roofline.WEIGHT_BYTES`` keys, of the checkpoint
    a model profile stands for: its ``quantization`` (a ``-FP8`` re-upload's id or a config.json's
    ``quantization_config`` set it, ``profiles.resolve``); schemes that quantize only the experts
    (MXFP4, INT4) keep the dense GEMMs in bf16."""
    return _planned_quants(model.quantization)


@functools.lru_cache(maxsize=64)
def _planned_quants(quantization: str) -> tuple[str, str]:
    """``planned_quants`` of a profile quantized as ``quantization`` (asked for every memory check)."""
    from hpc_advise.advisor.roofline import normalize_quant
    from hpc_advise.profiles.model import QUANT_SCHEMES

    q = normalize_quant(quantization)
    scope = QUANT_SCHEMES.get(quantization, (2.0, "none"))[1]
    return ("bf16" if scope == "experts" else q), q


def _param_bytes(model, quant: str) -> float:
    """Bytes per weight of format ``quant`` (a ``roofline.WEIGHT_BYTES`` key) for ``model``: the
    checkpoint's own scheme (its scales, e.g. Kimi's INT4 groups of 32) where ``quant`` is the format
    it ships in, else the format's generic size."""
    return _scheme_bytes(model.quantization, quant)


@functools.lru_cache(maxsize=256)
def _scheme_bytes(checkpoint: str, quant: str) -> float:
    """``_param_bytes`` of a checkpoint quantized as ``checkpoint`` (a profile's ``quantization``)."""
    from hpc_advise.advisor.roofline import WEIGHT_BYTES, normalize_quant
    from hpc_advise.profiles.model import QUANT_SCHEMES

    own = QUANT_SCHEMES.get(checkpoint)
    if own is not None and own[1] != "none" and normalize_quant(checkpoint) == quant:
        return own[0]
    return WEIGHT_BYTES[quant]


@functools.lru_cache(maxsize=64)
def _param_split(model) -> tuple[float, float, float, float]:
    """(routed experts, routers, bf16 embeddings + LM head + norms, the other weights) parameters of
    ``model``: what ``rank_weight_bytes`` sizes, counted once per profile (the screen sizes thousands
    of deployments of one model)."""
    experts = float(model.expert_params()) if model.is_moe else 0.0
    routers = float(model.num_moe_layers * model._router_params()) if model.is_moe else 0.0
    emb, head = model._embedding_params()
    bf16 = float(emb + head + model._norm_params())
    return experts, routers, bf16, float(model.total_params()) - experts - routers - bf16


def rank_weight_bytes(model, dep) -> float:
    """Weight bytes on one rank of a ``roofline.Deployment`` at its planned precisions
    (``dep.dense_quant`` / ``dep.moe_quant``): routed experts split over every GPU of the replica
    (EP x MoE-TP), the rest over attention-TP (replicated across attention-DP groups); routers in
    their own dtype, embeddings, LM head and norms in bf16. The one weight sizing of the memory check,
    the KV limit and the simulator's pool, for a user's deployment and a measured row alike."""
    from hpc_advise.profiles.model import DTYPE_BYTES

    experts, routers, bf16, linear = _param_split(model)
    return (
        experts * _param_bytes(model, dep.moe_quant) / dep.n_gpus
        + (
            linear * _param_bytes(model, dep.dense_quant)
            + routers * DTYPE_BYTES.get(model.router_dtype, 2)
            + bf16 * 2.0
        )
        / dep.attn_tp
    )


@functools.lru_cache(maxsize=256)
def _static_fraction(tp: int, attn_dp: int, memory_gib: float, mla: bool, vision) -> float:
    return rules.static_memory_fraction(
        rules.Setup(tp=tp, attn_dp=attn_dp), memory_gib, mla=mla, vision=vision
    )


def memory_check(
    c: Candidate,
    model,
    gpu,
    concurrency: float,
    ctx_mean: float,
    ctx_p99: float,
    quants: tuple[str, str] | None = None,
) -> tuple[bool, str, dict]:
    """Fit of ``c`` at ``concurrency`` requests per replica (see module docstring), its weights at
    ``quants`` (dense, experts; default: the checkpoint the profile plans, ``planned_quants``)."""
    from hpc_advise.advisor.roofline import Deployment

    gib = 2.0**30
    attn_tp = c.tp // c.attn_dp
    dense_q, moe_q = quants or planned_quants(model)
    kv_elem = 1.0 if c.kv_dtype.startswith("fp8") else 2.0
    ep = c.ep if model.is_moe else 1
    weights = rank_weight_bytes(model, Deployment(c.tp, c.attn_dp, ep, dense_q, moe_q, kv_elem))
    per_tok = rules.kv_cell_bytes(model, attn_tp, kv_elem, int(gpu.compute_capability[0]))
    per_group = concurrency / c.attn_dp
    kv = per_tok * (max(per_group - 1, 0) * ctx_mean + ctx_p99)
    usable = gpu.memory_gib * gib
    fraction = _static_fraction(
        c.tp, c.attn_dp, gpu.memory_gib, model.attention == "mla", rules.vision_tower(model)
    )
    reserve = usable * (1.0 - fraction)
    headroom = usable - weights - kv - reserve
    mem = {
        "weights_gib": weights / gib,
        "kv_gib": kv / gib,
        "reserve_gib": reserve / gib,
        "usable_gib": usable / gib,
        "headroom_gib": headroom / gib,
    }
    if weights + reserve > usable:
        return (
            False,
            f"weights {weights / gib:.1f} GiB per GPU do not fit in SGLang's static "
            f"{(usable - reserve) / gib:.0f} GiB",
            mem,
        )
    if headroom < 0:
        return (
            False,
            f"KV for {per_group:.0f} requests x {ctx_mean:.0f} tokens needs {kv / gib:.1f} GiB, "
            f"{(usable - weights - reserve) / gib:.1f} GiB free per GPU",
            mem,
        )
    return True, "", mem


def kv_limit(
    c: Candidate, model, gpu, ctx_mean: float, ctx_p99: float, quants: tuple[str, str] | None = None
) -> float:
    """Most requests per replica whose KV fits (``memory_check``, linear in the concurrency: whole
    requests per attention group, one of them at ``ctx_p99``); 0 when the weights alone do not fit."""
    one = float(c.attn_dp)
    _, _, m1 = memory_check(c, model, gpu, one, ctx_mean, ctx_p99, quants)
    if m1["weights_gib"] + m1["reserve_gib"] > m1["usable_gib"]:
        return 0.0
    _, _, m2 = memory_check(c, model, gpu, 2.0 * one, ctx_mean, ctx_p99, quants)
    per_request = max(m2["kv_gib"] - m1["kv_gib"], 1e-12)  # one more request per group
    return max(one * (1.0 + math.floor(max(m1["headroom_gib"], -per_request) / per_request)), 0.0)


def enumerate_candidates(model, n_gpus: int) -> list[Candidate]:
    out: list[Candidate] = []
    for tp in _divisors(n_gpus):
        eps = sorted({1, tp}) if model.is_moe else [1]
        dps = sorted({1, tp}) if model.is_moe else [1]
        runners = MOE_RUNNERS if model.is_moe else (None,)
        for ep in eps:
            for dp in dps:
                for attn in ATTENTION_BACKENDS:
                    for moe in runners:
                        for kv in KV_DTYPES:
                            out.append(Candidate(tp, n_gpus // tp, ep, dp, attn, moe, kv))
    return out


def node_layout_reason(c: Candidate, gpu) -> str | None:
    """Why ``c``'s replicas do not fit whole nodes of the GPU profile (``node_gpus``), or None. SGLang
    runs one replica over several nodes only when its tensor-parallel group spans whole nodes
    (``tp_size`` divisible by ``--nnodes``) and no data-parallel replica across nodes; smaller replicas
    run one server per node, so they must tile every node."""
    node = gpu.node_gpus
    if c.n_gpus <= node:
        return None
    if c.tp > node:
        return None if c.tp % node == 0 else f"TP{c.tp} does not span whole {node}-GPU nodes"
    if node % c.tp or (c.n_gpus % node) % c.tp:
        return f"TP{c.tp} replicas do not tile {node}-GPU nodes"
    return None


def check_all(model, gpu, n_gpus: int, concurrency_fn, ctx_mean: float, ctx_p99: float) -> list[Checked]:
    """Every candidate with ok/reason; ``concurrency_fn(candidate)`` gives requests per replica."""
    out = []
    for c in enumerate_candidates(model, n_gpus):
        why = support_reason(c, model, gpu) or node_layout_reason(c, gpu)
        if why:
            out.append(Checked(c, False, why))
            continue
        ok, why, mem = memory_check(c, model, gpu, concurrency_fn(c), ctx_mean, ctx_p99)
        out.append(Checked(c, ok, why, mem))
    return out


def with_backend(c: Candidate, attention_backend: str) -> Candidate:
    return replace(c, attention_backend=attention_backend)
