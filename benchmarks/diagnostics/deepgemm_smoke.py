"""DeepGEMM smoke check on the GPU machine: ``import deep_gemm`` and the two grouped FP8 GEMMs SGLang 0.5.23's
DeepGEMM MoE runner calls (``sglang/srt/layers/deep_gemm_wrapper/entrypoint.py``): the contiguous layout
(``m_grouped_fp8_gemm_nt_contiguous``, eager extend steps) and the masked one (``fp8_m_grouped_gemm_nt_masked``,
what CUDA-graph decode takes), with DeepSeek-V3's recipe: activations in 1x128 groups, weights in 128x128 blocks,
fp32 scales, the activation scales MN-major and TMA-aligned as SGLang hands them over on Hopper. Each output is
compared with an fp32 matmul of the dequantized operands.

Prints one line per GEMM and a last line ``deepgemm smoke: PASS|FAIL ...``; exit status 0 only on PASS.
``gpu.sh``'s ``install_deepgemm`` runs it under a timeout (the first call of each kernel JIT-compiles it with nvcc).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# the fused MoE's reference quantizers: 1x128 activation groups and 128x128 weight blocks, scale = amax / 448
from hpc_advise.kernels.fused_moe.reference import (  # noqa: E402
    dequantize_group,
    dequantize_weight,
    quantize_group,
    quantize_weight,
)

REL_TOL = 2e-2  # max |d - ref| / max |ref|: bf16 output of an fp8 GEMM with fp32 accumulation
DIFF_TOL = 1e-3  # DeepGEMM's own tests' calc_diff bound


def _groups_cast(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., K) -> fp8 e4m3 and fp32 scales per 1x128 group (..., K / 128)."""
    q, s = quantize_group(x.reshape(-1, x.shape[-1]))
    return q.view(x.shape), s.view(*x.shape[:-1], -1)


def _dequant_groups(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return dequantize_group(q.reshape(-1, q.shape[-1]), s.reshape(-1, s.shape[-1])).view(q.shape)


def _errors(d: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    d, ref = d.double(), ref.double()
    rel = ((d - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()
    den = (d * d + ref * ref).sum()
    diff = (1 - 2 * (d * ref).sum() / den).item() if den > 0 else 0.0
    return rel, diff


def contiguous_case(deep_gemm, tma_align, groups=4, n=512, k=1024) -> tuple[float, float]:
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    align = align[0] if isinstance(align, tuple) else int(align)
    rows = [align // 2 + 3, align + 5, 1, 2 * align - 7][:groups]
    padded = [-(-r // align) * align for r in rows]
    m = sum(padded)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    m_indices = torch.full((m,), -1, device="cuda", dtype=torch.int32)
    start, real = 0, torch.zeros(m, dtype=torch.bool, device="cuda")
    for gi, (r, p) in enumerate(zip(rows, padded, strict=True)):
        m_indices[start : start + r] = gi
        real[start : start + r] = True
        x[start + r : start + p] = 0
        start += p
    xq, xs = _groups_cast(x)
    wq, ws = quantize_weight(w, "block")
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((xq, tma_align(xs)), (wq, ws), d, m_indices)
    torch.cuda.synchronize()
    xd, wd = _dequant_groups(xq, xs), dequantize_weight(wq, ws)
    ref = torch.zeros(m, n, device="cuda")
    for gi in range(groups):
        sel = m_indices == gi
        ref[sel] = xd[sel] @ wd[gi].T
    return _errors(d[real].float(), ref[real])


def masked_case(deep_gemm, tma_align, groups=4, max_m=128, n=512, k=1024) -> tuple[float, float]:
    x = torch.randn(groups, max_m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    masked = torch.tensor([3, 17, 0, 64][:groups], device="cuda", dtype=torch.int32)
    expected_m = max(1, int(masked.float().mean().ceil().item()))
    xq, xs = _groups_cast(x)
    wq, ws = quantize_weight(w, "block")
    d = torch.zeros(groups, max_m, n, device="cuda", dtype=torch.bfloat16)
    deep_gemm.fp8_m_grouped_gemm_nt_masked((xq, tma_align(xs)), (wq, ws), d, masked, expected_m)
    torch.cuda.synchronize()
    ref = torch.einsum("gmk,gnk->gmn", _dequant_groups(xq, xs), dequantize_weight(wq, ws))
    sel = torch.arange(max_m, device="cuda")[None, :] < masked[:, None]
    return _errors(d[sel].float(), ref[sel])


def main() -> int:
    t0 = time.perf_counter()
    try:
        import deep_gemm
        from deep_gemm.utils.layout import get_mn_major_tma_aligned_tensor
    except Exception as e:  # noqa: BLE001 - any load failure is the answer
        print(f"deepgemm smoke: FAIL import deep_gemm: {type(e).__name__}: {e}")
        return 1
    where = getattr(deep_gemm, "__file__", "?")
    print(
        f"deep_gemm {getattr(deep_gemm, '__version__', '?')} from {where}, import {time.perf_counter() - t0:.1f} s,"
        f" {torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    )
    torch.manual_seed(0)
    worst, ok = 0.0, True
    for name, case in (("contiguous", contiguous_case), ("masked", masked_case)):
        t = time.perf_counter()
        try:
            rel, diff = case(deep_gemm, get_mn_major_tma_aligned_tensor)
        except Exception as e:  # noqa: BLE001
            print(f"  {name}: FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            ok = False
            continue
        good = rel < REL_TOL and diff < DIFF_TOL and rel == rel
        ok &= good
        worst = max(worst, rel)
        print(
            f"  {name}: {'ok' if good else 'BAD'} max rel err {rel:.3e}, calc_diff {diff:.2e},"
            f" {time.perf_counter() - t:.1f} s (first call JIT-compiles)"
        )
    print(
        f"deepgemm smoke: {'PASS' if ok else 'FAIL'} max rel err {worst:.3e} (tol {REL_TOL}),"
        f" {time.perf_counter() - t0:.1f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
