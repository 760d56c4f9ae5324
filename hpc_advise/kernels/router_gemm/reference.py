"""Float64 references of the router GEMM and of top-k routing (ground truth for tests/benchmarks).

``router_gemm_reference`` uses the original fp32 weight, not hi/lo: the reference is the exact product
of the inputs as given (x as given, bf16 or fp32; W in fp32), so it measures the split error too.
``route_topk_reference`` follows the same definitions as ``routing.route_topk`` but computes in
float64 and selects by a stable descending sort (ties go to the lower expert id).
"""

from __future__ import annotations

import torch

from .routing import check_routing_args


def router_gemm_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """float64 [M, N] = x·Wᵀ (+ bias), computed in float64 on x's device."""
    out = x.double() @ weight.double().t()
    if bias is not None:
        out = out + bias.double()
    return out


def route_topk_reference(
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
    """(weights float64 [M, top_k], ids int64 [M, top_k]), best first."""
    check_routing_args(logits, top_k, scoring, correction_bias, num_groups, topk_groups)
    z = logits.double()
    m, n = z.shape
    if scoring == "softmax":
        e = torch.exp(z - z.max(dim=-1, keepdim=True).values)
        scores = e / e.sum(dim=-1, keepdim=True)
        choice = scores.clone()
    else:
        scores = 1.0 / (1.0 + torch.exp(-z))
        choice = scores + (0.0 if correction_bias is None else correction_bias.double())
    if num_groups is not None and num_groups > 1:
        size = n // num_groups
        grouped = choice.reshape(m, num_groups, size)
        srt = torch.sort(grouped, dim=-1, descending=True, stable=True).values
        group_score = srt[..., 0] if scoring == "softmax" else srt[..., : min(2, size)].sum(-1)
        order = torch.sort(group_score, dim=-1, descending=True, stable=True).indices
        dropped = order[:, topk_groups:]
        for g in range(num_groups):
            rows = (dropped == g).any(dim=-1)
            choice[rows, g * size : (g + 1) * size] = float("-inf")
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = torch.gather(scores, 1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * routed_scaling_factor, ids
