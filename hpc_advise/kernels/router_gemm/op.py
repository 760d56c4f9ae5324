"""Launcher of the FP32-accurate router GEMM, and the routing step it feeds.

- ``prepare(weight)``: split an fp32 gate weight [N, K] once into hi = bf16(W) and
  lo = bf16((W − hi)·256), both bf16 [N, K].
- ``router_gemm(x, hi, lo, bias=None)``: fp32 logits [M, N] = x·hiᵀ + (x·loᵀ)/256 (+ bias) in one
  Triton launch (``kernel.py``); x bf16 (2 tensor-core products) or fp32 (split into x_hi + x_lo/256
  in registers: 3 products; ``split_x=False`` rounds fp32 x to bf16 instead, 2 products). Configs with
  ``impl='gemv'`` (a few tokens) run the same split on the CUDA cores (``router_gemv_kernel``).
- ``route_topk``: top-k expert choice on those logits (``routing.py``), re-exported here.

Supported shapes: N in 64..512 and a multiple of 16, K in 1024..8192, M in 1..16384; anything else
raises ValueError (never a silently wrong result). Launch configs come from ``configs.py``.
"""

from __future__ import annotations

import torch

from .configs import Config, pick_config
from .kernel import X_BF16, X_FP32_ROUND, X_FP32_SPLIT, router_gemm_kernel, router_gemv_kernel
from .routing import route_topk

__all__ = ["prepare", "router_gemm", "route_topk", "Config", "N_RANGE", "K_RANGE", "M_RANGE"]

N_RANGE = (64, 512)
K_RANGE = (1024, 8192)
M_RANGE = (1, 16384)
_COUNTER_SLICE = 4096  # arrival counters per stream = most output tiles of a split-K launch
_COUNTER_SLICES = 64  # streams per device

_counter_buffers: dict[tuple[str, int], torch.Tensor] = {}
_counter_slices: dict[tuple[str, int], dict[int, int]] = {}
_num_sms: dict[int, int] = {}


def prepare(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split an fp32 weight [N, K] into (hi, lo), bf16 [N, K] each, with W ≈ hi + lo/256.

    hi = bf16(W) (round to nearest even); W − hi is exact in fp32; lo = bf16((W − hi)·256).
    |W − hi − lo/256| ≤ 2⁻¹⁶·|W| element-wise (two roundings to 8 significant bits).
    """
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError("prepare: weight must be a 2-D tensor [N, K]")
    if weight.dtype != torch.float32:
        raise ValueError(f"prepare: weight must be float32, got {weight.dtype}")
    _check_nk(*weight.shape, where="prepare")
    w = weight.contiguous()
    _counter_buffer(w.device)  # zero-filled here, at load time, never inside a graph capture
    hi = w.to(torch.bfloat16)
    lo = ((w - hi.to(torch.float32)) * 256.0).to(torch.bfloat16)
    return hi, lo


def _check_nk(N: int, K: int, *, where: str) -> None:
    if not (N_RANGE[0] <= N <= N_RANGE[1] and N % 16 == 0):
        raise ValueError(
            f"{where}: N={N} unsupported (experts must be a multiple of 16 in {N_RANGE[0]}..{N_RANGE[1]})"
        )
    if not K_RANGE[0] <= K <= K_RANGE[1]:
        raise ValueError(f"{where}: K={K} unsupported (hidden size must be in {K_RANGE[0]}..{K_RANGE[1]})")


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # interpreter (CPU tensors): any small number
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _num_sms:
        _num_sms[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _num_sms[idx]


def _device_key(device: torch.device) -> tuple[str, int]:
    if device.type == "cuda":
        return ("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return (device.type, 0)


def _counter_buffer(device: torch.device) -> torch.Tensor:
    """The device's zeroed int32 arrival-counter buffer, created on first use (``prepare`` creates it)."""
    key = _device_key(device)
    buf = _counter_buffers.get(key)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "router_gemm: run prepare() or one router_gemm call on this device before CUDA-graph "
                "capture (its split-K counters are zero-filled once, outside any graph)"
            )
        buf = torch.zeros(_COUNTER_SLICE * _COUNTER_SLICES, dtype=torch.int32, device=device)
        _counter_buffers[key] = buf
    return buf


def _arrival_counters(device: torch.device) -> torch.Tensor:
    """This stream's slice of the device's counter buffer.

    Every launch leaves its counters at zero, so the buffer is zeroed once; each stream gets its own
    slice, so launches on different streams never share counters (no allocation or fill happens when a
    new stream, e.g. a graph-capture stream, shows up).
    """
    buf = _counter_buffer(device)
    dkey = _device_key(device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    slices = _counter_slices.setdefault(dkey, {})
    idx = slices.get(stream)
    if idx is None:
        idx = len(slices)
        if idx >= _COUNTER_SLICES:
            raise RuntimeError(f"router_gemm: more than {_COUNTER_SLICES} streams used on {device}")
        slices[stream] = idx
    return buf[idx * _COUNTER_SLICE : (idx + 1) * _COUNTER_SLICE]


def _check_inputs(x, hi, lo, bias, out) -> tuple[int, int, int]:
    for name, t in (("x", x), ("hi", hi), ("lo", lo)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"router_gemm: {name} must be a 2-D tensor")
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"router_gemm: x must be bfloat16 or float32, got {x.dtype}")
    if hi.dtype != torch.bfloat16 or lo.dtype != torch.bfloat16:
        raise ValueError("router_gemm: hi and lo must be bfloat16 (from prepare())")
    if hi.shape != lo.shape:
        raise ValueError(f"router_gemm: hi {tuple(hi.shape)} and lo {tuple(lo.shape)} differ")
    if not (hi.is_contiguous() and lo.is_contiguous()):
        raise ValueError("router_gemm: hi and lo must be contiguous")
    M, K = x.shape
    N = hi.shape[0]
    if hi.shape[1] != K:
        raise ValueError(f"router_gemm: x has K={K} but the weight has K={hi.shape[1]}")
    _check_nk(N, K, where="router_gemm")
    if not M_RANGE[0] <= M <= M_RANGE[1]:
        raise ValueError(f"router_gemm: M={M} tokens unsupported ({M_RANGE[0]}..{M_RANGE[1]})")
    if x.stride(1) != 1:
        raise ValueError("router_gemm: x must have a unit stride along K")
    devices = {t.device for t in (x, hi, lo)}
    if bias is not None:
        if bias.dtype != torch.float32 or bias.shape != (N,) or not bias.is_contiguous():
            raise ValueError(f"router_gemm: bias must be a contiguous float32 [{N}] tensor")
        devices.add(bias.device)
    if out is not None:
        if out.dtype != torch.float32 or out.shape != (M, N) or out.stride(1) != 1:
            raise ValueError(f"router_gemm: out must be float32 [{M}, {N}] with unit column stride")
        devices.add(out.device)
    if len(devices) != 1:
        raise ValueError(f"router_gemm: tensors on different devices {sorted(map(str, devices))}")
    return M, N, K


def router_gemm(
    x: torch.Tensor,
    hi: torch.Tensor,
    lo: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    split_x: bool | None = None,
    out: torch.Tensor | None = None,
    config: Config | None = None,
) -> torch.Tensor:
    """fp32 logits [M, N] = x·hiᵀ + (x·loᵀ)/256 (+ bias), accumulated in fp32, never rounded to bf16.

    x: [M, K] bf16, or fp32. fp32 x is split in registers into x_hi + x_lo/256 (``split_x`` None or
    True: 3 products, accurate for any fp32 x), or rounded to bf16 (``split_x=False``: 2 products, for
    fp32 x that came from bf16 values). ``out`` (fp32 [M, N]) is written in place when given;
    ``config`` overrides the table lookup (tuning and tests).
    """
    M, N, K = _check_inputs(x, hi, lo, bias, out)
    if x.dtype == torch.bfloat16:
        if split_x:
            raise ValueError("router_gemm: split_x applies to float32 x only")
        x_mode = X_BF16
    else:
        x_mode = X_FP32_ROUND if split_x is False else X_FP32_SPLIT
    cfg = config or pick_config(M, N, K, _sm_count(x.device))
    cfg.validate(K)
    if not cfg.serves(M):
        raise ValueError(f"router_gemm config: impl={cfg.impl!r} does not serve M={M}")
    if out is None:
        out = torch.empty((M, N), dtype=torch.float32, device=x.device)
    if cfg.impl == "gemv":
        router_gemv_kernel[(-(-N // cfg.block_n),)](
            x,
            hi,
            lo,
            bias if bias is not None else out,
            out,
            M,
            N,
            K,
            x.stride(0),
            out.stride(0),
            X_MODE=x_mode,
            HAS_BIAS=bias is not None,
            M_PAD=1 << (M - 1).bit_length(),
            ROWS=cfg.block_n,
            BLOCK_K=cfg.block_k,
            NUM_STAGES=cfg.num_stages,
            num_warps=cfg.num_warps,
        )
        return out
    tiles = -(-M // cfg.block_m) * -(-N // cfg.block_n)
    if cfg.split_k > 1:
        if tiles > _COUNTER_SLICE:
            raise ValueError(f"router_gemm config: {tiles} tiles with split_k>1 exceed {_COUNTER_SLICE}")
        ws = torch.empty((cfg.split_k, M, N), dtype=torch.float32, device=x.device)
        counters = _arrival_counters(x.device)
    else:
        ws = out  # unused
        counters = out  # unused
    k_blocks = -(-K // cfg.block_k)
    grid = (tiles, cfg.split_k)
    router_gemm_kernel[grid](
        x,
        hi,
        lo,
        bias if bias is not None else out,
        out,
        ws,
        counters,
        M,
        N,
        K,
        x.stride(0),
        out.stride(0),
        X_MODE=x_mode,
        HAS_BIAS=bias is not None,
        MASK_K=K % cfg.block_k != 0 or k_blocks % cfg.split_k != 0,
        K_STEPS=-(-k_blocks // cfg.split_k),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT_K=cfg.split_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
