"""The dispatch table: for each op we replace, whether our kernel or SGLang's runs, what, and why.

The rules are ``hpc_advise.rules.RULES`` (one list, shared with the advisor): each names an op, a
predicate over :class:`~hpc_advise.rules.Conditions` that, when true, sends the op to the fallback, and
the reason. Rules are checked in order; the first one that fires decides (so the reason printed is the
most basic one). When none fires, our kernel runs. This module turns that into decisions: the provider
that runs instead (SGLang's names), our kernel's description and whether its launch configs were tuned.
The same table answers ``hpc-advise runtime check`` and guards the SGLang plugin at start-up
(``sglang/attention.py``/``sglang/moe.py`` raise or fall back with these reasons), so the printed table and
what runs cannot drift apart.

Ops: ``decode_attention`` (paged GQA or MLA decode, the ``hpc_advise`` attention backend), ``fused_moe``
(FP8 MoE experts, the ``hpc_advise`` MoE runner), ``router_gemm`` (FP32-accurate router logits, opt-in
with ``HPC_ADVISE_ROUTER_GEMM=1``, which ``hpc-advise launch`` sets for fp32 gates where layer steps measured
it faster: ``measured.router_for_launch``).

Never slower than SGLang's default: where SGLang's own Triton MoE measured faster than ours at a rank's
MoE shape for a bucket of token counts (``hpc_advise.measured``: layer-step or kernel rows shipped as
package data), ``moe_handoffs`` gives a ``handoff`` decision for that bucket with the measured figure (printed under
the table by ``hpc-advise runtime check``), and the plugin's
runner calls SGLang's Triton path for it (``moe_handoff``, read by ``sglang/moe.py``). The buckets come
from the rows, not from shapes written here.

Imports only the standard library, ``hpc_advise.rules`` and ``hpc_advise.measured`` (no torch): the table
is computed from profiles, so it answers for a GPU you do not have.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpc_advise import measured
from hpc_advise.rules import SM90, Conditions, first_rule

OPS = ("decode_attention", "fused_moe", "router_gemm")


# What runs instead, per op (SGLang's names).
def fallback_name(op: str, c: Conditions) -> str:
    if op == "decode_attention":
        if c.attention == "mla" and c.sparse_attention:
            return "dsa (SGLang's sparse MLA backend)"
        if c.attention == "mla":
            return "SGLang's MLA default (fa3/flashmla on SM90, flashinfer otherwise)"
        return "fa3" if c.sm == SM90 else ("flashinfer" if c.sm is not None else "torch_native")
    if op == "fused_moe":
        return "auto (SGLang's own MoE runner choice)"
    return "SGLang's gate (unchanged)"


OURS = {
    "decode_attention": "hpc_advise (decode_attention: dynamic persistent paged decode)",
    "fused_moe": "hpc_advise (fused_moe: FP8 fused MoE)",
    "router_gemm": "hpc_advise (router_gemm: two-bf16 fp32-accurate)",
}
OURS_MLA = "hpc_advise (decode_attention, MLA form: one latent + rope row per token for all heads)"


def _ours_reason(op: str, c: Conditions) -> str:
    if op == "decode_attention" and c.attention == "mla":
        return (
            f"MLA {c.q_heads} heads per rank, latent {c.kv_lora_rank} + rope {c.rope_dim}, {c.kv_dtype} KV, "
            f"page {c.page_size}; prefill/extend stay on SGLang's prefill backend"
        )
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
    return (
        f"{c.router_dtype} gate weight -> fp32 logits, {c.num_experts} experts x hidden {c.hidden_size}; "
        + _router_comparison(c)
    )


def _router_comparison(c: Conditions) -> str:
    """What the shipped layer steps measured with our router GEMM at this gate shape, in a few words."""
    cmp = measured.router_comparison(c.num_experts, c.hidden_size, c.router_dtype)
    return cmp.figure() if cmp is not None else "no layer step measured it at this gate shape"


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
    rule = first_rule(op, c)
    if rule is not None:
        provider = "-" if rule.outcome == "n/a" else fallback_name(op, c)
        return Decision(op, False, provider, rule.reason(c), rule.outcome)
    ours = OURS_MLA if op == "decode_attention" and c.attention == "mla" else OURS[op]
    return Decision(op, True, ours, _ours_reason(op, c), "ours")


HANDOFF_PROVIDER = "triton (SGLang's fused_experts)"


def moe_buckets(shape: measured.MoeShape) -> list[measured.MoeBucket]:
    """Our MoE runner against SGLang's triton at exactly this rank shape, per measured token bucket."""
    return measured.moe_buckets(list(measured.shipped_points()), shape)


def moe_handoff(shape: measured.MoeShape, tokens: int) -> measured.Handoff:
    """Which runner a MoE layer of ``shape`` gets at ``tokens`` tokens (the plugin's runner asks this)."""
    return measured.handoff_in(moe_buckets(shape), tokens)


def moe_handoffs(c: Conditions, ep: int = 1) -> list[Decision]:
    """A ``handoff`` decision per token bucket where SGLang's triton measured faster than ours at this
    rank's MoE shape (none when our runner does not take the layer at all)."""
    if not decide("fused_moe", c).use_ours:
        return []
    return [
        Decision("fused_moe", False, HANDOFF_PROVIDER, f"{b.span()}: SGLang's triton measured faster; {b.figure()}",
                 "handoff")  # fmt: skip
        for b in moe_buckets(measured.moe_shape_of(c, ep))
        if b.default_faster
    ]


def _moe_comparison(c: Conditions, ep: int) -> str:
    """What was measured against SGLang's triton at this rank's MoE shape, in a few words."""
    buckets = moe_buckets(measured.moe_shape_of(c, ep))
    if not buckets:
        return "not compared with SGLang's triton at this shape (no measured rows)"
    ours = [b.span() for b in buckets if not b.default_faster]
    handed = [b.span() for b in buckets if b.default_faster]
    text = f"measured against SGLang's triton ({buckets[0].source}): "
    text += f"ours faster at {', '.join(ours)}" if ours else "ours faster in no measured bucket"
    text += f"; handed to SGLang's triton at {', '.join(handed)}" if handed else ""
    last = buckets[-1]
    if last.hi is not None:  # beyond the last measured bucket nothing is handed off
        text += f"; above T = {last.hi} ours runs (no pair measured there)"
    return text


def table(c: Conditions, ep: int = 1) -> list[Decision]:
    """One decision per op, in ``OPS`` order; the fused_moe row says what was measured against SGLang's
    triton at this rank's shape (its hand-off buckets are ``moe_handoffs``)."""
    out = []
    for op in OPS:
        d = decide(op, c)
        if op == "fused_moe" and d.use_ours:
            d = Decision(d.op, True, d.provider, f"{d.reason}; {_moe_comparison(c, ep)}", d.outcome)
        elif op == "router_gemm" and not c.router_opt_in and (cmp := measured.router_for_launch(c)):
            reason = f"{d.reason} (hpc-advise launch sets it for this fp32 gate: {cmp.figure()})"
            d = Decision(d.op, False, d.provider, reason, d.outcome)
        out.append(d)
    return out
