"""Expert-parallel (EP) and tensor-parallel (TP) MoE layers over ``torch.distributed``.

EP (``ep_moe`` = ``dispatch`` → local experts → ``combine``): rank r of an EP group of size ep holds
experts [r·E/ep, (r+1)·E/ep) and its own tokens (attention data-parallel). A token goes once to every
rank that holds at least one of its top-k experts, with its k ids remapped to that rank's local ids
(−1 for the slots of other ranks) and its k routing weights:
1. one ``all_to_all_single`` exchanges the per-rank row counts (plus H, k and a bad-id count, so a rank
   with invalid input makes every rank raise the same error instead of leaving its peers waiting);
2. one ``all_to_all_single`` moves the rows: each is [hidden bf16 | local ids int32 | weights fp32]
   packed into one byte row (16-byte aligned fields), sent grouped by destination rank, tokens in order;
3. the local experts run on the received rows (``fused_experts``: our FP8 fused MoE, which sums each
   row's local slots in slot order);
4. one ``all_to_all_single`` returns each row's partial sum to its source rank, which adds the ep
   partials of a token in fp32 in rank order and rounds once: a fixed order, so the layer is
   deterministic.
Tokens none of whose ids is valid get zeros. The counts exchange needs one host sync per layer.

TP (``tp_moe``): every rank holds I/tp of every expert (``shard_tp``) and all tokens; the local experts
give a partial output that one ``all_reduce`` sums.

Ids are global expert ids in [0, E) or −1 (unused slot). The local-experts function has the signature
``experts(x [R, H], local_ids [R, k] int32, weights [R, k] fp32) -> [R, H]``, so the tests can run the
torch reference where the Triton kernels would be too slow (CPU, gloo).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

ExpertsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ALIGN = 16  # bytes: every packed field and row starts 16-byte aligned
GROUP = 128  # block-scale width of the fp8 weights


class EPMoEError(ValueError):
    """Input the EP/TP layer cannot serve (with the reason)."""


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def expert_range(num_experts: int, ep: int, rank: int) -> tuple[int, int]:
    """(first expert, count) held by ``rank`` of ``ep``."""
    if ep < 1 or num_experts % ep:
        raise EPMoEError(f"{num_experts} experts cannot be split evenly over {ep} ranks")
    if not 0 <= rank < ep:
        raise EPMoEError(f"rank {rank} outside 0..{ep - 1}")
    local = num_experts // ep
    return rank * local, local


def packed_layout(hidden: int, top_k: int) -> tuple[int, int, int]:
    """(byte offset of the ids, byte offset of the weights, row bytes) of one dispatched row."""
    ids_off = _round_up(2 * hidden, ALIGN)
    w_off = ids_off + _round_up(4 * top_k, ALIGN)
    return ids_off, w_off, w_off + _round_up(4 * top_k, ALIGN)


@dataclass
class Dispatched:
    """What ``dispatch`` received, and what ``combine`` needs to send it back."""

    hidden: torch.Tensor  # [R, H] bf16 received rows (a strided view into the receive buffer)
    ids: torch.Tensor  # [R, k] int32 local expert ids, -1 = a slot of another rank
    weights: torch.Tensor  # [R, k] fp32 routing weights
    src_tokens: torch.Tensor  # [S] int64: this rank's token of each sent row, grouped by destination
    send_counts: list[int]  # rows sent to each rank
    recv_counts: list[int]  # rows received from each rank
    num_tokens: int  # T of this rank


def _check_local(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
    if hidden.dim() != 2 or hidden.dtype != torch.bfloat16:
        raise EPMoEError(f"hidden must be bf16 [T, H], got {hidden.dtype} {tuple(hidden.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != hidden.shape[0] or topk_weights.shape != topk_ids.shape:
        raise EPMoEError(
            f"topk_ids and topk_weights must both be [T, k] with T = {hidden.shape[0]}, got "
            f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise EPMoEError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")


def dispatch(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    num_experts: int,
    group=None,
) -> Dispatched:
    """Send every token to the ranks that hold its experts (module docstring, steps 1–2)."""
    _check_local(hidden, topk_ids, topk_weights)
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    _, e_local = expert_range(num_experts, ep, rank)
    dev = hidden.device
    t, h = hidden.shape
    k = topk_ids.shape[1]
    ids = topk_ids.long()
    bad = ((ids < -1) | (ids >= num_experts)).sum()
    dest = torch.where(ids >= 0, ids // e_local, -1)  # [T, k] destination rank of each slot
    ranks = torch.arange(ep, device=dev)
    to_rank = (dest[:, :, None] == ranks).any(dim=1)  # [T, ep]: the token goes to that rank
    meta = torch.stack(
        [to_rank.sum(dim=0), bad.expand(ep), torch.full_like(ranks, h), torch.full_like(ranks, k)], dim=1
    )  # [ep, 4]: (rows for that rank, bad ids here, H, k)
    peer_meta = torch.empty_like(meta)
    dist.all_to_all_single(peer_meta, meta, group=group)
    # rows grouped by destination rank, tokens in order inside a group: a stable sort puts the
    # (rank, token) pairs to send first (no nonzero(), whose size would cost a second host sync)
    order = torch.argsort((~to_rank.t().reshape(-1)).to(torch.uint8), stable=True)
    both = torch.stack([meta, peer_meta]).tolist()  # the one host sync of the layer
    send_counts = [row[0] for row in both[0]]
    recv_counts = [row[0] for row in both[1]]
    bad_ranks = [r for r, row in enumerate(both[1]) if row[1]]
    if bad_ranks:
        raise EPMoEError(f"expert ids outside [-1, {num_experts}) on rank(s) {bad_ranks}")
    shapes = {(row[2], row[3]) for row in both[1]}
    if len(shapes) != 1:
        raise EPMoEError(f"ranks disagree on (H, top_k): {sorted(shapes)}")
    order = order[: sum(send_counts)]
    dest_rank, src_tokens = order // max(t, 1), order % max(t, 1)
    ids_off, w_off, row_bytes = packed_layout(h, k)
    send = torch.empty(src_tokens.numel(), row_bytes, dtype=torch.uint8, device=dev)
    send[:, : 2 * h] = hidden.reshape(t, h).contiguous().view(torch.uint8)[src_tokens]
    sent_ids = ids[src_tokens]
    local = sent_ids - (dest_rank * e_local)[:, None]
    mine = (sent_ids >= 0) & (dest[src_tokens] == dest_rank[:, None])
    local_ids = torch.where(mine, local, -1).to(torch.int32)
    send[:, ids_off : ids_off + 4 * k] = local_ids.view(torch.uint8)
    send[:, w_off : w_off + 4 * k] = topk_weights.float()[src_tokens].contiguous().view(torch.uint8)
    recv = torch.empty(sum(recv_counts), row_bytes, dtype=torch.uint8, device=dev)
    dist.all_to_all_single(
        recv, send, output_split_sizes=recv_counts, input_split_sizes=send_counts, group=group
    )
    return Dispatched(
        hidden=recv[:, : 2 * h].view(torch.bfloat16),
        ids=recv[:, ids_off : ids_off + 4 * k].view(torch.int32),
        weights=recv[:, w_off : w_off + 4 * k].view(torch.float32),
        src_tokens=src_tokens,
        send_counts=send_counts,
        recv_counts=recv_counts,
        num_tokens=t,
    )


def combine(d: Dispatched, expert_out: torch.Tensor, group=None, out_dtype=None) -> torch.Tensor:
    """Return the partial outputs to their source ranks and add a token's partials in rank order
    (module docstring, step 4). ``expert_out`` [R, H] in the dtype every rank sends (all must agree)."""
    r, h = d.hidden.shape
    if tuple(expert_out.shape) != (r, h):
        raise EPMoEError(f"expert output must be [{r}, {h}], got {tuple(expert_out.shape)}")
    back = torch.empty(d.src_tokens.numel(), h, dtype=expert_out.dtype, device=expert_out.device)
    dist.all_to_all_single(
        back,
        expert_out.contiguous(),
        output_split_sizes=d.send_counts,
        input_split_sizes=d.recv_counts,
        group=group,
    )
    acc = torch.zeros(d.num_tokens, h, dtype=torch.float32, device=expert_out.device)
    start = 0
    for count in d.send_counts:  # rank order; a token occurs at most once per rank: no collisions
        if count:
            acc.index_add_(0, d.src_tokens[start : start + count], back[start : start + count].float())
        start += count
    return acc.to(out_dtype or expert_out.dtype)


def ep_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: ExpertsFn,
    num_experts: int,
    *,
    group=None,
    combine_dtype: torch.dtype = torch.bfloat16,
    mark: Callable[[str], None] | None = None,
) -> torch.Tensor:
    """The EP layer: [T, H] in ``combine_dtype``. ``experts`` runs this rank's E/ep experts on the
    received rows (local ids); its output is cast to ``combine_dtype`` for the return trip.
    ``mark(stage)`` is called after 'dispatch', 'experts' and 'combine' (the benchmark times stages)."""
    d = dispatch(hidden, topk_ids, topk_weights, num_experts, group)
    if mark:
        mark("dispatch")
    if d.hidden.shape[0]:
        out = experts(d.hidden, d.ids, d.weights).to(combine_dtype)
    else:  # nothing routed here: skip the experts (their kernels need no launch)
        out = torch.empty(0, hidden.shape[1], dtype=combine_dtype, device=hidden.device)
    if mark:
        mark("experts")
    result = combine(d, out, group)
    if mark:
        mark("combine")
    return result


def tp_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: ExpertsFn,
    *,
    group=None,
    mark: Callable[[str], None] | None = None,
) -> torch.Tensor:
    """The TP layer: ``experts`` holds an I/tp shard of every expert and sees every token (global
    ids); the partial outputs are summed by one ``all_reduce`` (in the partials' dtype)."""
    _check_local(hidden, topk_ids, topk_weights)
    partial = experts(hidden, topk_ids.to(torch.int32), topk_weights.float())
    if mark:
        mark("experts")
    dist.all_reduce(partial, group=group)
    if mark:
        mark("combine")
    return partial


def shard_ep(
    tensors: dict[str, torch.Tensor], num_experts: int, ep: int, rank: int
) -> dict[str, torch.Tensor]:
    """This rank's experts of every tensor whose first dimension is the expert (weights, [E] or
    block scales); other entries pass through."""
    start, count = expert_range(num_experts, ep, rank)
    return {
        name: t[start : start + count] if torch.is_tensor(t) and t.dim() and t.shape[0] == num_experts else t
        for name, t in tensors.items()
    }


def shard_tp(
    w13: torch.Tensor, w2: torch.Tensor, s13: torch.Tensor, s2: torch.Tensor, tp: int, rank: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """I/tp shard of every expert: w13 [E, 2I, H] keeps gate rows and up rows of the shard
    (→ [E, 2I/tp, H]), w2 [E, H, I] its columns (→ [E, H, I/tp]); per-tensor scales [E] unchanged,
    128×128 block scales sliced with them (needs I/tp divisible by 128)."""
    e, two_i, h = w13.shape
    inter = two_i // 2
    if inter % tp:
        raise EPMoEError(f"intermediate size {inter} cannot be split evenly over {tp} ranks")
    part = inter // tp
    lo, hi = rank * part, (rank + 1) * part
    w13_s = torch.cat([w13[:, lo:hi], w13[:, inter + lo : inter + hi]], dim=1).contiguous()
    w2_s = w2[:, :, lo:hi].contiguous()
    if s13.dim() == 1:
        return w13_s, w2_s, s13, s2
    if part % GROUP:
        raise EPMoEError(f"block scales need I/tp = {part} divisible by {GROUP}")
    blo, bhi, bi = lo // GROUP, hi // GROUP, inter // GROUP
    s13_s = torch.cat([s13[:, blo:bhi], s13[:, bi + blo : bi + bhi]], dim=1).contiguous()
    return w13_s, w2_s, s13_s, s2[:, :, blo:bhi].contiguous()


def fused_experts(w13: torch.Tensor, w2: torch.Tensor, **op_kwargs) -> ExpertsFn:
    """Local experts as our FP8 fused MoE over ``w13``/``w2`` (EP: the local experts, ids local;
    TP: the I shard, ids global). ``op_kwargs``: w13_scale, w2_scale, a13_scale, a2_scale,
    block_shape, routed_scaling_factor (see ``hpc_advise.kernels.fused_moe.op.fused_moe``)."""
    from hpc_advise.kernels.fused_moe.op import fused_moe

    def run(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return fused_moe(x, w13, w2, weights, ids, **op_kwargs)

    return run
