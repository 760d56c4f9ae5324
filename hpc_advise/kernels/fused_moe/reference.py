"""Pure-torch references for the FP8 fused MoE: the ground truth of the tests.

- ``fused_moe_reference``: same signature as ``op.fused_moe`` (plus ``h_group``); dequantizes the fp8
  weights (per-tensor [E] or 128×128 block scales), applies the same activation quantization as the
  kernels (per-1×128 group dynamic, the intermediate h per 1×``h_group``, or per-tensor static), and
  does all the math in fp32. Returns fp32 [T, H].
- ``moe_float_reference``: the unquantized model (float weights, no activation quantization), fp32,
  to report how far FP8 inference is from it.
- ``quantize_group`` / ``quantize_static`` / ``dequantize_weight`` / ``quantize_weight``: the FP8
  conversions, shared by tests and benchmarks.
- ``moe_align_reference``: the routing preprocessing in torch ops (no host sync, so it can be captured
  in a CUDA graph); used to check the Triton router and by the torch peer pipelines.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
GROUP = 128
SCALE_EPS = 1e-10


def quantize_group(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-1×group quantization of the rows of ``x`` [R, C] → (fp8 [R, C], fp32 [R, ⌈C/group⌉])."""
    r, c = x.shape
    ng = -(-c // group)
    xf = torch.zeros(r, ng * group, dtype=torch.float32, device=x.device)
    xf[:, :c] = x.float()
    xg = xf.view(r, ng, group)
    s = xg.abs().amax(dim=2).clamp(min=SCALE_EPS) / FP8_MAX
    q = (xg / s[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(r, ng * group)[:, :c]
    return q.contiguous(), s


def dequantize_group(q: torch.Tensor, s: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    c = q.shape[1]
    return q.float() * s.repeat_interleave(group, dim=1)[:, :c]


def quantize_static(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """Per-tensor static quantization: fp8(clamp(x / scale))."""
    return (
        (x.float() / torch.as_tensor(scale, dtype=torch.float32, device=x.device))
        .clamp(-FP8_MAX, FP8_MAX)
        .to(FP8)
    )


def _block_expand(scale: torch.Tensor, n: int, k: int, block: int = GROUP) -> torch.Tensor:
    """[E, ⌈n/b⌉, ⌈k/b⌉] → [E, n, k] (each scale repeated over its block)."""
    return scale.repeat_interleave(block, dim=1)[:, :n].repeat_interleave(block, dim=2)[:, :, :k]


def dequantize_weight(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 [E, N, K] with scale [E] (per tensor) or [E, ⌈N/128⌉, ⌈K/128⌉] (block) → fp32 [E, N, K]."""
    if scale.dim() == 1:
        return w.float() * scale.float()[:, None, None]
    return w.float() * _block_expand(scale.float(), w.shape[1], w.shape[2])


def quantize_weight(w: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Float weights [E, N, K] → (fp8, scales); mode 'tensor' → [E], 'block' → [E, ⌈N/128⌉, ⌈K/128⌉]."""
    wf = w.float()
    if mode == "tensor":
        s = wf.abs().amax(dim=(1, 2)).clamp(min=SCALE_EPS) / FP8_MAX
        return (wf / s[:, None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), s
    if mode != "block":
        raise ValueError(f"unknown weight quantization mode {mode!r}")
    e, n, k = wf.shape
    nb, kb = -(-n // GROUP), -(-k // GROUP)
    pad = torch.zeros(e, nb * GROUP, kb * GROUP, dtype=torch.float32, device=w.device)
    pad[:, :n, :k] = wf
    blocks = pad.view(e, nb, GROUP, kb, GROUP)
    s = blocks.abs().amax(dim=(2, 4)).clamp(min=SCALE_EPS) / FP8_MAX
    q = (blocks / s[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(e, nb * GROUP, kb * GROUP)[:, :n, :k].contiguous(), s


def _quant_dequant(x: torch.Tensor, static_scale, group: int = GROUP) -> torch.Tensor:
    """x quantized to fp8 and back: per 1×``group`` dynamic (``static_scale`` None) or per tensor."""
    if static_scale is None:
        q, s = quantize_group(x, group)
        return dequantize_group(q, s, group)
    scale = torch.as_tensor(static_scale, dtype=torch.float32, device=x.device)
    return quantize_static(x, scale).float() * scale


def _local_slots(topk_ids: torch.Tensor, num_experts: int, expert_offset: int):
    local = topk_ids.long() - expert_offset
    valid = (local >= 0) & (local < num_experts)
    return local, valid


def fused_moe_reference(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    a13_scale=None,
    a2_scale=None,
    block_shape=None,
    expert_offset: int = 0,
    routed_scaling_factor: float = 1.0,
    out: torch.Tensor | None = None,
    h_group: int = GROUP,
) -> torch.Tensor:
    """fp32 [T, H]: Σ_j w_tj · s · W2_e · q2(SiLU(q1(x_t)·W1_eᵀ) ⊙ (q1(x_t)·W3_eᵀ)), e = ids[t, j] local.

    q1 is per 1×128 group (dynamic) or per tensor; q2 per 1×``h_group`` group (dynamic: 128, the
    checkpoints' recipe, or 64 as the small-T path's H_GROUP = 64 configs) or per tensor.
    ``block_shape`` and ``out`` are accepted for signature parity (the block shape is read from the
    scale tensors; the result is always a fresh fp32 tensor)."""
    del block_shape, out
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    w13f = dequantize_weight(w13, w13_scale)
    w2f = dequantize_weight(w2, w2_scale)
    xq = _quant_dequant(hidden.float(), a13_scale)
    local, valid = _local_slots(topk_ids, num_experts, expert_offset)
    result = torch.zeros(hidden.shape[0], w2.shape[1], dtype=torch.float32, device=hidden.device)
    for e in range(num_experts):
        t_idx, j_idx = torch.nonzero(valid & (local == e), as_tuple=True)
        if t_idx.numel() == 0:
            continue
        gu = xq[t_idx] @ w13f[e].t()
        h = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        y = _quant_dequant(h, a2_scale, h_group) @ w2f[e].t()
        wt = topk_weights[t_idx, j_idx].float() * routed_scaling_factor
        result.index_add_(0, t_idx, y * wt[:, None])
    return result


def moe_float_reference(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    expert_offset: int = 0,
    routed_scaling_factor: float = 1.0,
) -> torch.Tensor:
    """The unquantized MoE in fp32 from float weights w13 [E, 2I, H], w2 [E, H, I]."""
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    local, valid = _local_slots(topk_ids, num_experts, expert_offset)
    result = torch.zeros(hidden.shape[0], w2.shape[1], dtype=torch.float32, device=hidden.device)
    x = hidden.float()
    for e in range(num_experts):
        t_idx, j_idx = torch.nonzero(valid & (local == e), as_tuple=True)
        if t_idx.numel() == 0:
            continue
        gu = x[t_idx] @ w13[e].float().t()
        h = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        wt = topk_weights[t_idx, j_idx].float() * routed_scaling_factor
        result.index_add_(0, t_idx, (h @ w2[e].float().t()) * wt[:, None])
    return result


def moe_align_reference(
    topk_ids: torch.Tensor, num_experts: int, expert_offset: int, block_m: int, max_padded: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Routing preprocessing in torch ops, graph-capturable (no host sync).

    Returns (sorted_ids int32 [max_padded]: entry ids t·k+j grouped by local expert in stable order,
    each expert's run padded to a multiple of ``block_m`` with the sentinel n = T·k;
    block_expert int32 [max_padded / block_m]: local expert of each block, −1 past the used rows;
    num_padded int32 [1]). Entries of other EP ranks (id − offset outside [0, E), or −1) are dropped.
    """
    device = topk_ids.device
    n = topk_ids.numel()
    local = topk_ids.reshape(-1).long() - expert_offset
    valid = (local >= 0) & (local < num_experts)
    key = torch.where(valid, local, torch.full_like(local, num_experts))
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = torch.cat([ends - padded, ends[-1:]])  # index E (other ranks' entries) is never used
    # rank of each entry among its expert's entries, in entry order (a running count per expert);
    # no torch.sort, whose CUDA implementation is not always capturable in a CUDA graph
    onehot = torch.zeros(n, num_experts + 1, dtype=torch.int32, device=device)
    onehot.scatter_(1, key[:, None], 1)
    rank = torch.cumsum(onehot, 0, dtype=torch.int32).gather(1, key[:, None]).squeeze(1).long() - 1
    dest = torch.where(key < num_experts, starts[key] + rank, torch.full_like(rank, max_padded))
    order = torch.arange(n, device=device)
    sorted_ids = torch.full((max_padded + 1,), n, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    total = ends[-1:]
    block_start = torch.arange(max_padded // block_m, device=device) * block_m
    block_expert = torch.searchsorted(ends, block_start, right=True)
    block_expert = torch.where(block_start < total, block_expert, torch.full_like(block_expert, -1))
    return sorted_ids[:max_padded], block_expert.to(torch.int32), total.to(torch.int32)
