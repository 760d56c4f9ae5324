"""Top-k expert routing on fp32 router logits (torch; a few small fused ops, graph-capturable).

Scoring as the models define it:
- ``softmax`` (Qwen3-MoE, Mixtral): p = softmax(logits); choose the top-k of p; weights = those p,
  renormalized to sum 1 when ``renormalize``. With groups: group score = max p in the group.
- ``sigmoid`` (DeepSeek-V3, Hy3): s = sigmoid(logits); choose on s + correction_bias (the
  "expert score correction" bias steers load balance, it never enters the weights); weights = s of the
  chosen experts, renormalized when ``renormalize``. With groups: group score = sum of the two largest
  biased scores in the group (DeepSeek-V3's group-limited routing).
Grouped routing keeps the ``topk_groups`` best of ``num_groups`` equal expert groups and masks the
rest with -inf before the final top-k. Weights are finally multiplied by ``routed_scaling_factor``.
"""

from __future__ import annotations

import torch


def check_routing_args(logits, top_k, scoring, correction_bias, num_groups, topk_groups) -> None:
    """Shared validation of ``route_topk`` and its reference."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("route_topk: logits must be a 2-D tensor [M, N]")
    n = logits.shape[1]
    if not 1 <= top_k <= n:
        raise ValueError(f"route_topk: top_k={top_k} outside 1..{n}")
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"route_topk: scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    if correction_bias is not None:
        if scoring != "sigmoid":
            raise ValueError("route_topk: correction_bias is used with scoring='sigmoid' only")
        if correction_bias.shape != (n,):
            raise ValueError(f"route_topk: correction_bias must have shape [{n}]")
    if (num_groups is None) != (topk_groups is None):
        raise ValueError("route_topk: give both num_groups and topk_groups, or neither")
    if num_groups is not None:
        if num_groups < 1 or n % num_groups:
            raise ValueError(f"route_topk: {n} experts do not split into {num_groups} groups")
        if not 1 <= topk_groups <= num_groups:
            raise ValueError(f"route_topk: topk_groups={topk_groups} outside 1..{num_groups}")
        if top_k > topk_groups * (n // num_groups):
            raise ValueError("route_topk: top_k exceeds the experts of the kept groups")


def route_topk(
    logits: torch.Tensor,
    top_k: int,
    *,
    scoring: str = "softmax",
    correction_bias: torch.Tensor | None = None,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    num_groups: int | None = None,
    topk_groups: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights fp32 [M, top_k], expert ids int32 [M, top_k]), best first."""
    check_routing_args(logits, top_k, scoring, correction_bias, num_groups, topk_groups)
    logits = logits.float()
    m, n = logits.shape
    if scoring == "softmax":
        scores = torch.softmax(logits, dim=-1)
        choice = scores
    else:
        scores = torch.sigmoid(logits)
        choice = scores if correction_bias is None else scores + correction_bias.float()
    if num_groups is not None and num_groups > 1:
        grouped = choice.view(m, num_groups, n // num_groups)
        if scoring == "softmax":
            group_score = grouped.amax(dim=-1)
        else:
            group_score = grouped.topk(min(2, n // num_groups), dim=-1).values.sum(dim=-1)
        keep = group_score.topk(topk_groups, dim=-1).indices
        group_mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep, True)
        choice = choice.masked_fill(~group_mask.repeat_interleave(n // num_groups, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights, ids.to(torch.int32)
