"""Roofline composition of a serving step: per-operator times from a model profile, a GPU profile and a
deployment, and the feature vector the serving-level calibration learns from.

Everything here is physics, no fitting: each operator's time is ``max(bytes / BW, FLOPs / peak)``
(its roofline floor) on one rank, from the GPU profile's datasheet bandwidth and tensor-core rates for
every GPU (one basis, so fitted efficiencies transfer between GPUs; see ``Rates.of``; 4-bit weights
compute at the bf16 rate on GPUs without FP4 tensor cores). Fitted corrections live elsewhere: kernel
efficiencies per backend in ``kernel_models`` and the end-to-end calibration in ``serving_model``.

Conventions (SGLang's): ``n_gpus`` GPUs serve one model replica; attention runs ``attn_dp`` data-parallel
groups of ``attn_tp = n_gpus / attn_dp`` GPUs each; MoE experts are split ``moe_ep`` ways and each
expert ``moe_tp = n_gpus / moe_ep`` ways. ``concurrency`` is the number of requests in flight on the
replica (all attention-DP groups together). Times are microseconds, bytes are bytes.

Decode step per rank and layer: attention projections (weights), KV read of the batch's contexts
(plus bounded state: linear-attention recurrent state read and written, sliding-window KV), router
GEMM, MoE experts touched by the step's tokens (expected distinct experts under uniform routing),
shared experts / dense FFN; the all-reduces of attention TP (which also combine the experts' outputs
under EP without attention DP: every rank holds every token, so no all-to-all) or all-gather +
reduce-scatter around the MoE under attention DP: the collective's fitted time where the GPU profile's
measured figures hold one for that op and world size (``comm_model``), else bytes over link bandwidth;
a collective over more ranks than one node (``gpus_per_node``) is hierarchical: the same collective
inside the node plus the inter-node exchange of each GPU's 1/node share over its NIC (``nic_gbps``);
plus the LM head once per step. Prefill: the same operators at ``tokens`` tokens, compute-bound for long prompts, plus causal
attention FLOPs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from hpc_advise.advisor import comm_model

# Bytes per weight parameter for a quantization mode (scales included: NVFP4 = 4 bit + one fp8 scale
# per 16 values; MXFP4 = 4 bit + one e8m0 scale per 32; int4 weight-only with a bf16 scale per 128).
WEIGHT_BYTES: dict[str, float] = {
    "bf16": 2.0,
    "fp8": 1.0,
    "fp8_block": 1.0 + 4.0 / (128 * 128),
    "nvfp4": 0.5 + 1.0 / 16,
    "mxfp4": 0.5 + 1.0 / 32,
    "int4_wo": 0.5 + 2.0 / 128,
}

# Which tensor-core rate a quantization mode computes at (weight-only int4 computes in bf16).
COMPUTE_RATE: dict[str, str] = {
    "bf16": "bf16_tflops",
    "fp8": "fp8_tflops",
    "fp8_block": "fp8_tflops",
    "nvfp4": "fp4_tflops",
    "mxfp4": "fp4_tflops",
    "int4_wo": "bf16_tflops",
}


def normalize_quant(text: str | None) -> str:
    """Map a quantization label ('fp8-per-tensor', 'fp8-block128', 'nvfp4', '', ...) to a WEIGHT_BYTES key."""
    t = (text or "").strip().lower().replace("-", "_")
    if not t or t in ("bf16", "bfloat16", "fp16", "float16", "auto", "none"):
        return "bf16"
    if "nvfp4" in t or t == "fp4":
        return "nvfp4"
    if "mxfp4" in t:
        return "mxfp4"
    if "int4" in t or "w4a16" in t:
        return "int4_wo"
    if "fp8" in t and "block" in t:
        return "fp8_block"
    if "fp8" in t:
        return "fp8"
    raise ValueError(f"unknown quantization {text!r}; known: {sorted(WEIGHT_BYTES)}")


@dataclass(frozen=True)
class Deployment:
    """How one model replica is spread over its GPUs, and its weight / KV precisions."""

    n_gpus: int
    attn_dp: int = 1
    moe_ep: int = 1
    dense_quant: str = "bf16"
    moe_quant: str = "bf16"
    kv_bytes: float = 2.0

    def __post_init__(self) -> None:
        if self.n_gpus < 1 or self.attn_dp < 1 or self.moe_ep < 1:
            raise ValueError(f"sizes must be >= 1: {self}")
        if self.n_gpus % self.attn_dp or self.n_gpus % self.moe_ep:
            raise ValueError(
                f"attn_dp {self.attn_dp} and moe_ep {self.moe_ep} must divide n_gpus {self.n_gpus}"
            )

    @property
    def attn_tp(self) -> int:
        return self.n_gpus // self.attn_dp

    @property
    def moe_tp(self) -> int:
        return self.n_gpus // self.moe_ep


@dataclass(frozen=True)
class Shapes:
    """Parameter counts of one model, split by operator (derived from a ModelProfile)."""

    layers: int
    moe_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mla: bool
    attn_params: float  # per layer
    dense_ffn_params: float  # per dense layer
    shared_params: float  # shared experts, per MoE layer
    expert_params: float  # one routed expert
    experts: int
    top_k: int
    vocab: int
    kv_bytes_per_token_layer_bf16: float  # all KV heads of one layer, bf16
    # bounded per-sequence attention state, all layers, unsplit: linear-attention (Gated DeltaNet)
    # recurrent state + conv window, read and written every decode step (fp32 state, the profile's
    # ``LinearAttention.state_bytes`` default), and sliding-window KV (bf16) at its full window
    state_bytes_per_seq: float = 0.0
    window_kv_bytes_per_seq_bf16: float = 0.0
    state_heads: int = 1  # heads the linear-attention state splits over attention-TP ranks

    @property
    def is_moe(self) -> bool:
        return self.moe_layers > 0 and self.experts > 0

    @property
    def active_params(self) -> float:
        dense_layers = self.layers - self.moe_layers
        per_moe = self.shared_params + self.top_k * self.expert_params
        return (
            self.layers * self.attn_params
            + dense_layers * self.dense_ffn_params
            + self.moe_layers * per_moe
            + self.vocab * self.hidden
        )


def shapes_of(model) -> Shapes:
    """Operator parameter counts from a ``hpc_advise.profiles.ModelProfile``.

    Attention parameters per layer are what remains of ``total_params()`` after the FFN/MoE and the
    embeddings, so MLA's low-rank projections and linear-attention mixers are counted without
    modelling them one by one (the GQA formula is the floor). KV bytes per token and layer are the
    profile's ``kv_bytes_per_token`` spread over all layers (bounded-state layers hold none).
    Counted once per profile (every prepared point asks); a model object that cannot be hashed is
    counted on each call.
    """
    try:
        hash(model)
    except TypeError:
        return _shapes(model)
    return _shapes_of_profile(model)


@functools.lru_cache(maxsize=64)
def _shapes_of_profile(model) -> Shapes:
    return _shapes(model)


def _shapes(model) -> Shapes:
    layers = int(model.num_layers)
    hidden = int(model.hidden_size)
    heads = int(model.num_heads)
    kv_heads = int(model.num_kv_heads or heads)
    head_dim = int(model.head_dim)
    is_moe = bool(model.is_moe)
    moe_layers = int(model.num_moe_layers) if is_moe else 0
    experts = int(model.num_experts) if is_moe else 0
    expert_params = float(model.expert_params()) / (moe_layers * experts) if moe_layers and experts else 0.0
    shared_width = getattr(model, "shared_expert_intermediate_size", None)
    if shared_width is None:
        shared_width = (model.moe_intermediate_size or 0) * (model.num_shared_experts or 0)
    shared_params = 3.0 * hidden * float(shared_width) if is_moe else 0.0
    dense_ffn = 3.0 * hidden * float(model.intermediate_size or 0)
    vocab = int(model.vocab_size)
    embed = vocab * hidden * (1 if getattr(model, "tie_word_embeddings", False) else 2)
    ffn_total = (layers - moe_layers) * dense_ffn + moe_layers * (
        shared_params + experts * expert_params + hidden * experts
    )
    residual = (float(model.total_params()) - ffn_total - embed) / layers
    gqa_attn = float(hidden * head_dim * (2 * heads + 2 * kv_heads))
    attn_params = max(residual, gqa_attn if model.attention != "mla" else 0.25 * gqa_attn)
    lin = getattr(model, "linear_attention", None)
    n_lin = int(getattr(model, "num_linear_attention_layers", 0) or 0)
    state = float(n_lin * lin.state_bytes()) if lin is not None and n_lin else 0.0
    n_win = int(getattr(model, "num_sliding_window_layers", 0) or 0)
    window = int(getattr(model, "sliding_window", 0) or 0)
    win_kv = float(n_win * window * 2 * kv_heads * head_dim * 2) if n_win and window else 0.0
    return Shapes(
        layers=layers,
        moe_layers=moe_layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        mla=model.attention == "mla",
        attn_params=attn_params,
        dense_ffn_params=dense_ffn,
        shared_params=shared_params,
        expert_params=expert_params,
        experts=experts,
        top_k=int(model.top_k) if is_moe else 0,
        vocab=vocab,
        kv_bytes_per_token_layer_bf16=float(model.kv_bytes_per_token(2)) / layers,
        state_bytes_per_seq=state,
        window_kv_bytes_per_seq_bf16=win_kv,
        state_heads=int(lin.num_value_heads) if lin is not None and n_lin else 1,
    )


NIC_FALLBACK_GBPS = 25.0  # a profile without ``nic_gbps``: one 200 Gb/s NIC per GPU (recommend flags it)


@dataclass(frozen=True)
class Rates:
    """The GPU rates the roofline uses, in bytes/µs and FLOP/µs."""

    bw: float
    flops: dict[str, float]
    link: float  # all-reduce bus bandwidth, bytes/µs
    # measured collective times: ((op, world size), CommFit) pairs from the profile's figures
    comm: tuple = ()
    node: int = 8  # GPUs in one NVLink domain (``GpuProfile.node_gpus``)
    nic: float = NIC_FALLBACK_GBPS * 1e3  # inter-node bandwidth per GPU per direction, bytes/µs

    @classmethod
    def of(cls, gpu) -> Rates:
        """Datasheet bandwidth and tensor-core rates for every GPU, on purpose: the calibration learns
        the achieved fraction of the roofline, which transfers across GPUs only when every GPU's
        roofline is on the same basis (a measured copy bandwidth, 86% of the datasheet on the H200, next
        to datasheet figures of the other GPUs made H200 rows look slower than they are). Link
        bandwidth stays measured when known (no datasheet all-reduce figure exists)."""
        bw = float(gpu.mem_bw_tbps) * 1e6
        bf16 = float(gpu.bf16_tflops)
        fp8 = gpu.fp8_tflops or bf16
        # no FP4 tensor cores (Hopper and older): 4-bit weights are dequantized in the kernel and
        # multiplied in bf16 (Marlin / Triton W4A16 paths of SGLang, vLLM, TensorRT-LLM on H100/H200)
        fp4 = getattr(gpu, "fp4_tflops", None) or bf16
        flops = {"bf16_tflops": bf16 * 1e6, "fp8_tflops": float(fp8) * 1e6, "fp4_tflops": float(fp4) * 1e6}
        link = gpu.rate("allreduce_busbw_gbps") or getattr(gpu, "pcie_gbps", None) or 25.0
        comm = tuple(sorted(comm_model.fits_from_figures(getattr(gpu, "measured", None) or {}).items()))
        node = int(getattr(gpu, "node_gpus", 8))
        nic = float(getattr(gpu, "nic_gbps", None) or NIC_FALLBACK_GBPS) * 1e3
        return cls(bw=bw, flops=flops, link=float(link) * 1e3, comm=comm, node=node, nic=nic)

    def peak(self, quant: str) -> float:
        return self.flops[COMPUTE_RATE[quant]]


def kv_heads_per_rank(s: Shapes, attn_tp: int) -> float:
    """KV heads one attention-TP rank stores: MLA's latent is replicated, GQA heads are split (and
    replicated when there are fewer KV heads than ranks)."""
    if s.mla:
        return float(s.kv_heads)
    return s.kv_heads / min(attn_tp, s.kv_heads)


def kv_bytes_per_token_rank(s: Shapes, dep: Deployment) -> float:
    """KV bytes one token occupies on one rank, all layers."""
    frac = kv_heads_per_rank(s, dep.attn_tp) / s.kv_heads
    return s.layers * s.kv_bytes_per_token_layer_bf16 * frac * dep.kv_bytes / 2.0


def expected_experts_touched(experts_local: float, experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct local experts that ``tokens`` tokens route to (uniform routing)."""
    if experts <= 0 or tokens <= 0:
        return 0.0
    p_miss = (1.0 - top_k / experts) ** tokens
    return experts_local * (1.0 - p_miss)


def _gemm(params: float, tokens: float, wbytes: float, rates: Rates, quant: str) -> tuple[float, float]:
    """(bytes-bound µs, compute-bound µs) of a weight GEMM over ``params`` parameters."""
    return params * wbytes / rates.bw, 2.0 * params * tokens / rates.peak(quant)


def _collective(nbytes: float, ranks: int, rates: Rates, kind: str) -> float:
    """µs of one collective on ``ranks`` GPUs: the measured fit (latency + size / bandwidth, piecewise)
    when the GPU profile has one for ``kind`` at this world size, else the bandwidth term alone (ring
    bus-bandwidth factors over the link rate: measured peak bus bandwidth, or the vendor's)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    if ranks > rates.node:
        # hierarchical, as NCCL runs it over rail-connected nodes: the collective inside each node,
        # then every GPU exchanges its 1/node share with its peers on the other nodes over its own
        # NIC (bandwidth term only: no inter-node latency is measured)
        nodes = math.ceil(ranks / rates.node)
        inter = comm_model.BUSBW_FACTOR[kind](nodes) * nbytes / rates.node / rates.nic
        return _collective(nbytes, rates.node, rates, kind) + inter
    for key, fit in rates.comm:
        if key == (kind, ranks):
            return fit.time_us(nbytes)
    return comm_model.BUSBW_FACTOR[kind](ranks) * nbytes / rates.link


def decode_step(
    s: Shapes, rates: Rates, dep: Deployment, ctx_sum: float, batch: float, extra_tokens: float = 0.0
) -> dict[str, float]:
    """Roofline µs of one decode step on one rank, per operator (whole model, all layers).

    ``batch`` requests per attention-DP group, ``ctx_sum`` = sum of their context lengths (tokens).
    ``extra_tokens`` = prompt tokens per group that chunked prefill mixes into the same step: they
    share the step's weight reads and add their GEMM FLOPs, activations and MoE experts touched
    (their attention FLOPs are the caller's, see ``roofline_serving``).
    Keys: attn_kv, attn_proj, moe, dense_ffn, router, lm_head, comm, and counts n_collectives; and
    moe_routed, outside the step's total (``TIME_KEYS``): the bandwidth time of the routed tokens'
    activations, gathered into expert order and scattered back (bf16 hidden in, hidden out per
    (token, expert) pair on this rank), which the weight-bytes roofline of the MoE does not count.
    """
    tp, dp = dep.attn_tp, dep.attn_dp
    lm_tokens = batch  # logits only for the decoding requests
    batch = batch + extra_tokens  # tokens through the GEMMs, router, MoE and collectives
    wq = WEIGHT_BYTES[dep.dense_quant]
    wm = WEIGHT_BYTES[dep.moe_quant]
    kv_layer = s.kv_bytes_per_token_layer_bf16 * kv_heads_per_rank(s, tp) / s.kv_heads * dep.kv_bytes / 2.0
    attn_kv = s.layers * ctx_sum * kv_layer / rates.bw
    # bounded-state layers: the recurrent state is read and written back every step (split over the
    # attention-TP ranks by head); sliding-window KV is read at its window (contexts here exceed it)
    state = 2.0 * s.state_bytes_per_seq / min(tp, s.state_heads)
    window = (
        s.window_kv_bytes_per_seq_bf16 * kv_heads_per_rank(s, tp) / max(s.kv_heads, 1) * dep.kv_bytes / 2.0
    )
    attn_kv += lm_tokens * (state + window) / rates.bw
    b, f = _gemm(s.attn_params / tp, batch, wq, rates, dep.dense_quant)
    attn_proj = s.layers * max(b, f)
    dense_layers = s.layers - s.moe_layers
    b, f = _gemm(s.dense_ffn_params / tp, batch, wq, rates, dep.dense_quant)
    dense_ffn = dense_layers * max(b, f)
    moe = router = moe_routed = 0.0
    tokens_all = batch * dp  # MoE sees every attention-DP group's tokens
    comm = 0.0
    n_coll = 0
    act = 2.0 * s.hidden  # bf16 activation bytes per token
    if s.is_moe:
        local = s.experts / dep.moe_ep
        touched = expected_experts_touched(local, s.experts, s.top_k, tokens_all)
        wbytes = touched * s.expert_params / dep.moe_tp * wm
        flops = 2.0 * tokens_all * s.top_k * s.expert_params / dep.n_gpus
        b_sh, f_sh = _gemm(s.shared_params / tp, batch, wq, rates, dep.dense_quant)  # shared: dense quant
        moe = s.moe_layers * (max(wbytes / rates.bw, flops / rates.peak(dep.moe_quant)) + max(b_sh, f_sh))
        # each rank holds 1/moe_ep of the experts, so of the (token, expert) pairs
        moe_routed = s.moe_layers * tokens_all * s.top_k / dep.moe_ep * 2.0 * act / rates.bw
        # fp32 router weights, fp32 math on tensor cores at tf32-ish rates: bytes-bound at decode sizes
        router = s.moe_layers * max(
            s.hidden * s.experts * 4.0 / rates.bw, 2.0 * batch * s.hidden * s.experts / rates.peak("bf16")
        )
        if dp > 1:
            # gather every group's tokens before the MoE, scatter after
            comm += s.moe_layers * (
                _collective(tokens_all * act, dep.n_gpus, rates, "allgather")
                + _collective(tokens_all * act, dep.n_gpus, rates, "reducescatter")
            )
            n_coll += 2 * s.moe_layers
        # EP under attention TP (no attention DP): every rank already holds every token after the
        # attention all-reduce, runs its local experts on them, and the all-reduce after the MoE
        # sums the experts' outputs (SGLang's --ep-size with --tp-size, vLLM's expert parallel at
        # DP 1, TensorRT-LLM's moe_ep without attention DP): no all-to-all of its own
    # attention-TP all-reduces: after attention, after the FFN/MoE
    if tp > 1:
        comm += s.layers * 2 * _collective(batch * act, tp, rates, "allreduce")
        n_coll += 2 * s.layers
    b, f = _gemm(s.vocab * s.hidden / tp, lm_tokens, 2.0, rates, "bf16")
    lm_head = max(b, f)
    return {
        "attn_kv": attn_kv,
        "attn_proj": attn_proj,
        "moe": moe,
        "dense_ffn": dense_ffn,
        "router": router,
        "lm_head": lm_head,
        "comm": comm,
        "n_collectives": float(n_coll),
        "moe_routed": moe_routed,
    }


def prefill(
    s: Shapes, rates: Rates, dep: Deployment, tokens: float, ctx_before: float = 0.0
) -> dict[str, float]:
    """Roofline µs to prefill ``tokens`` new tokens of one request (attending to ``ctx_before`` cached
    tokens) on one attention-DP group. Keys as ``decode_step`` plus attn_flops (causal attention)."""
    tp = dep.attn_tp
    wq = WEIGHT_BYTES[dep.dense_quant]
    wm = WEIGHT_BYTES[dep.moe_quant]
    qk_dim = s.head_dim if not s.mla else s.head_dim + 64
    # causal: token i attends to ctx_before + i keys; QK^T and PV, 2 FLOPs per MAC
    pairs = tokens * ctx_before + tokens * (tokens + 1) / 2.0
    attn_flops = s.layers * 2.0 * pairs * (s.heads / tp) * (qk_dim + s.head_dim) / rates.peak("bf16")
    b, f = _gemm(s.attn_params / tp, tokens, wq, rates, dep.dense_quant)
    attn_proj = s.layers * max(b, f)
    b, f = _gemm(s.dense_ffn_params / tp, tokens, wq, rates, dep.dense_quant)
    dense_ffn = (s.layers - s.moe_layers) * max(b, f)
    moe = comm = 0.0
    n_coll = 0
    act = 2.0 * s.hidden
    if s.is_moe:
        local = s.experts / dep.moe_ep
        touched = expected_experts_touched(local, s.experts, s.top_k, tokens)
        wbytes = touched * s.expert_params / dep.moe_tp * wm
        # a single group's prefill is spread over all GPUs of the MoE
        flops = 2.0 * tokens * s.top_k * s.expert_params / dep.n_gpus
        b_sh, f_sh = _gemm(s.shared_params / tp, tokens, wq, rates, dep.dense_quant)
        moe = s.moe_layers * (max(wbytes / rates.bw, flops / rates.peak(dep.moe_quant)) + max(b_sh, f_sh))
        if dep.attn_dp > 1:  # dispatch to / combine from the experts across groups
            comm += (
                s.moe_layers
                * 2
                * _collective(
                    tokens * s.top_k * act / max(dep.moe_ep, 1),
                    max(dep.moe_ep, dep.attn_dp),
                    rates,
                    "alltoall",
                )
            )
            n_coll += 2 * s.moe_layers
    if tp > 1:
        comm += s.layers * 2 * _collective(tokens * act, tp, rates, "allreduce")
        n_coll += 2 * s.layers
    kv_write = (
        s.layers
        * tokens
        * s.kv_bytes_per_token_layer_bf16
        * dep.kv_bytes
        / 2.0
        / min(tp, s.kv_heads)
        / rates.bw
    )
    lm_head = 2.0 * s.vocab * s.hidden / tp / rates.peak("bf16")  # last token only
    return {
        "attn_flops": attn_flops + kv_write,
        "attn_proj": attn_proj,
        "moe": moe,
        "dense_ffn": dense_ffn,
        "lm_head": lm_head,
        "comm": comm,
        "n_collectives": float(n_coll),
    }


TIME_KEYS = ("attn_kv", "attn_flops", "attn_proj", "moe", "dense_ffn", "router", "lm_head", "comm")


def total_us(parts: dict[str, float]) -> float:
    return float(sum(parts.get(k, 0.0) for k in TIME_KEYS))


@dataclass(frozen=True)
class ClosedLoopLoad:
    """A closed-loop serving point (a benchmark at a fixed concurrency): mean lengths, concurrency and
    the prefix-cache reuse."""

    isl: float
    osl: float
    concurrency: float
    prefix_reuse: float = 0.0  # fraction of prompt tokens served from the prefix cache


def roofline_serving(s: Shapes, rates: Rates, dep: Deployment, w: ClosedLoopLoad) -> dict[str, float]:
    """Roofline TPOT and TTFT (ms) of a closed-loop benchmark at ``w.concurrency`` (aggregated serving).

    TPOT = decode step at the mean context (isl + osl/2) + the prefill work that enters during one
    request's decode: ``batch`` prefills of ``isl`` spread over ``osl`` steps, mixed into the decode
    steps as chunked prefill does, so they share the step's weight reads and add their FLOPs,
    activations, extra MoE experts touched and causal-attention work (``interference`` = mixed step
    minus pure decode step; a prefill timed alone would read every weight again). TTFT = one prefill of ``isl`` + waiting for the prefills ahead of it: in steady state a
    closed loop admits ``batch / (osl * TPOT)`` requests per unit time per group, so the prefill server
    utilisation is ``rho = arrival * prefill``; M/D/1 waiting ``rho * prefill / (2 (1 - rho))`` (capped
    at rho 0.95; the calibration learns what the queue misses).
    """
    batch = max(w.concurrency / dep.attn_dp, 1.0)
    ctx_mean = w.isl + w.osl / 2.0
    step = decode_step(s, rates, dep, ctx_sum=batch * ctx_mean, batch=batch)
    new_tokens = max(w.isl * (1.0 - w.prefix_reuse), 1.0)
    pf = prefill(s, rates, dep, tokens=new_tokens, ctx_before=w.isl - new_tokens)
    t_step = total_us(step)
    t_pf = total_us(pf)
    per_step = batch / max(w.osl, 1.0)  # prefills entering per decode step and group
    mixed = decode_step(
        s, rates, dep, ctx_sum=batch * ctx_mean, batch=batch, extra_tokens=per_step * new_tokens
    )
    interference = max(total_us(mixed) - t_step, 0.0) + per_step * pf["attn_flops"]
    # the same prefill work timed as separate one-request prefills (each reads the weights again):
    # the upper bound when an engine runs prefills as their own iterations
    interference_alone = per_step * t_pf
    tpot_us = t_step + interference
    arrival = batch / (max(w.osl, 1.0) * tpot_us)
    rho = min(arrival * t_pf, 0.95)
    wait = rho * t_pf / (2.0 * (1.0 - rho))
    ttft_us = t_pf + wait + t_step
    return {
        "tpot_ms": tpot_us / 1e3,
        "ttft_ms": ttft_us / 1e3,
        "step_us": t_step,
        "prefill_us": t_pf,
        "interference_us": interference,
        "interference_alone_us": interference_alone,
        "wait_us": wait,
        "rho": rho,
        "batch": batch,
        **{f"d_{k}": v for k, v in step.items()},
        **{f"p_{k}": v for k, v in pf.items()},
    }


# Features the calibration sees: dimensionless or log-scaled, no GPU or model identity, so it can
# transfer to GPUs and models it has not seen.
FEATURE_NAMES = (
    "log_batch",
    "log_concurrency",
    "log_isl",
    "log_osl",
    "log_step_us",
    "log_prefill_us",
    "frac_attn_kv",
    "frac_weights",
    "frac_moe",
    "frac_comm",
    "frac_interference",
    "rho",
    "log_n_gpus",
    "log_attn_tp",
    "attn_dp_gt1",
    "log_moe_ep",
    "is_moe",
    "mla",
    "log_active_params_per_gpu",
    "collectives_per_layer",
    "quant_bits",
    "log_bw_tbps",
    "log_flops_per_byte",
    "backend_sglang",
    "backend_vllm",
    "backend_trtllm",
)

BACKEND_FEATURES = {"sglang": "backend_sglang", "vllm": "backend_vllm", "trtllm": "backend_trtllm"}


def feature_vector(
    s: Shapes, rates: Rates, dep: Deployment, w: ClosedLoopLoad, rf: dict[str, float], engine: str
) -> np.ndarray:
    """One row of FEATURE_NAMES for the calibration, from a ``roofline_serving`` result ``rf``."""
    step = rf["step_us"]
    tpot = rf["tpot_ms"] * 1e3
    weights = rf["d_attn_proj"] + rf["d_dense_ffn"] + rf["d_lm_head"]
    f = {
        "log_batch": math.log(rf["batch"]),
        "log_concurrency": math.log(max(w.concurrency, 1.0)),
        "log_isl": math.log(max(w.isl, 1.0)),
        "log_osl": math.log(max(w.osl, 1.0)),
        "log_step_us": math.log(step),
        "log_prefill_us": math.log(rf["prefill_us"]),
        "frac_attn_kv": rf["d_attn_kv"] / step,
        "frac_weights": weights / step,
        "frac_moe": rf["d_moe"] / step,
        "frac_comm": rf["d_comm"] / step,
        "frac_interference": rf["interference_us"] / tpot,
        "rho": rf["rho"],
        "log_n_gpus": math.log(dep.n_gpus),
        "log_attn_tp": math.log(dep.attn_tp),
        "attn_dp_gt1": float(dep.attn_dp > 1),
        "log_moe_ep": math.log(dep.moe_ep),
        "is_moe": float(s.is_moe),
        "mla": float(s.mla),
        "log_active_params_per_gpu": math.log(s.active_params / dep.n_gpus),
        "collectives_per_layer": rf["d_n_collectives"] / s.layers,
        "quant_bits": 8.0 * WEIGHT_BYTES[dep.moe_quant if s.is_moe else dep.dense_quant],
        "log_bw_tbps": math.log(rates.bw / 1e6),
        "log_flops_per_byte": math.log(rates.peak(dep.moe_quant if s.is_moe else dep.dense_quant) / rates.bw),
    }
    for name in BACKEND_FEATURES.values():
        f[name] = 0.0
    if engine in BACKEND_FEATURES:
        f[BACKEND_FEATURES[engine]] = 1.0
    return np.array([f[n] for n in FEATURE_NAMES], dtype=float)
