"""Ground truth for paged decode attention: plain torch, float64 math, one request at a time.

Same signature as ``op.decode_attention`` (minus the schedule). fp8 KV is dequantised exactly
(e4m3 -> float64, times the per-tensor scale) before the math, so the reference sees the same values the
kernel reads.
"""

from __future__ import annotations

import math

import torch


def decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    page_size: int,
    sm_scale: float | None = None,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """softmax(q K^T * sm_scale) V per request and query head, in float64 on q's device.

    q [B, Hq, D]; k_cache/v_cache [num_pages, page_size, Hkv, D]; page_table [B, max_pages] int32;
    seq_lens [B]. Query head i attends to KV head i // (Hq / Hkv). Returns float64 [B, Hq, D]."""
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    group = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    ks = float(k_scale) if not isinstance(k_scale, torch.Tensor) else float(k_scale.reshape(-1)[0])
    vs = float(v_scale) if not isinstance(v_scale, torch.Tensor) else float(v_scale.reshape(-1)[0])
    lens = seq_lens.tolist()
    table = page_table.long()
    out = torch.empty(B, Hq, D, dtype=torch.float64, device=q.device)
    for b in range(B):
        n = int(lens[b])
        tok = torch.arange(n, device=q.device)
        pages = table[b, tok // page_size]
        slots = tok % page_size
        k = k_cache[pages, slots].to(torch.float64) * ks  # [n, Hkv, D]
        v = v_cache[pages, slots].to(torch.float64) * vs
        k = k.repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        qb = q[b].to(torch.float64)  # [Hq, D]
        logits = torch.einsum("hd,nhd->hn", qb, k) * scale
        probs = torch.softmax(logits, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", probs, v)
    return out


def mla_decode_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    page_size: int,
    kv_lora_rank: int,
    sm_scale: float,
) -> torch.Tensor:
    """The MLA form (``op.run_mla``): every head of request b attends to the request's latent rows
    ``kv_i = [c_i, k_rope_i]`` with logits ``sm_scale q . kv_i`` and values ``c_i`` (the first ``kv_lora_rank``
    columns), in float64 on q's device. q [B, H, R + rope]; kv_cache [num_pages, page_size, 1, R + rope].
    Returns float64 [B, H, R]."""
    B, H, _ = q.shape
    table = page_table.long()
    out = torch.empty(B, H, kv_lora_rank, dtype=torch.float64, device=q.device)
    for b, n in enumerate(seq_lens.tolist()):
        tok = torch.arange(int(n), device=q.device)
        kv = kv_cache[table[b, tok // page_size], tok % page_size, 0].to(torch.float64)  # [n, R + rope]
        probs = torch.softmax(q[b].to(torch.float64) @ kv.T * float(sm_scale), dim=-1)  # [H, n]
        out[b] = probs @ kv[:, :kv_lora_rank]
    return out
