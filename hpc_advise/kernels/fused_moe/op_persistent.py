"""Launcher of the FP8 fused MoE's persistent decode path (``kernel_persistent.py``): one launch.

``op.fused_moe`` calls ``fused_moe_persistent`` when its launch config (configs.json) has
``"PATH": "persistent"``; the path serves T <= ``PERSISTENT_T_MAX`` (one dot column per token).
Config keys: GU_N / GU_K (phase-A tile rows of I and K step; GU_N = 128 with dynamic a2, GU_K = 128
with dynamic a13), S_MAX (most K segments per (expert, I group) in phase A and K splits per (entry,
H tile) in phase B; the kernel takes what evens the programs' shares), DN_N / DN_K (phase-B H rows and K step; DN_K = 128 with dynamic a2), WARPS,
GU_STAGES / DN_STAGES (software-pipelining depths), and optionally PROGS_PER_SM (1 or 2; capped by what
fits on an SM at once), PROGS_PER_SM up to 4, PDL (programmatic dependent launch, SM90+), PREFETCH (L2 prefetch of a
phase-B item's W2 tile before it waits; 2: all of the program's W2 tiles at its start) and PREFETCH_A (of the program's phase-A tiles before its
input-quantization prologue); the prefetches run on the GPU only.

The grid must be co-resident (programs wait on each other's counters), so the program count is the
SM count times the programs that fit per SM, read from the compiled kernel (registers, shared memory);
under the Triton interpreter, which runs programs one after another, it is 1. Workspace buffers and the
launch go through ``launch_plan`` (``empty``, ``launch``) so that ``op.fused_moe`` can record and replay them.
"""

from __future__ import annotations

import torch
import triton

from . import kernel_persistent as KP
from . import launch_plan as LP
from .op_small import _counters, use_pdl
from .reference import FP8

GROUP = 128
PERSISTENT_T_MAX = 16  # one dot column (of 16) per token
PERSISTENT_KEYS = ("GU_N", "GU_K", "S_MAX", "DN_N", "DN_K", "WARPS", "GU_STAGES", "DN_STAGES")
_RESIDENT: dict[tuple, int] = {}  # (device, compile key) -> programs per SM that fit
# (device, config items, per-call constexpr inputs) -> (constexprs, PDL?, co-resident program cap): the
# per-call host work an eager call would otherwise redo (sorted compile key, device queries)
_PLANS: dict[tuple, tuple[dict, bool, int]] = {}


def is_persistent(cfg: dict | None) -> bool:
    return bool(cfg) and cfg.get("PATH") == "persistent"


def default_persistent_config(a2_group: bool) -> dict:
    """Untuned starting point, from the first H200 sweep (2026-11-29, T = 1 / 4, five shapes): 128-row
    down tiles beat 64-row ones at every point; with static a2, 64-row gate/up tiles at 4 warps, two
    programs per SM; with dynamic a2, 128-row gate/up tiles (one h group each) at 8 warps, one per SM
    (238 registers: no room for two)."""
    return dict(
        PATH="persistent",
        GU_N=GROUP if a2_group else 64,
        GU_K=GROUP,
        S_MAX=8,
        DN_N=GROUP,
        DN_K=GROUP,
        WARPS=8 if a2_group else 4,
        GU_STAGES=3 if a2_group else 4,
        DN_STAGES=3,
        PROGS_PER_SM=1 if a2_group else 2,
    )


def check_persistent_config(cfg: dict, a1_group: bool, a2_group: bool, error=ValueError) -> dict:
    """Validate a persistent-path config (``error``: the exception class to raise)."""
    missing = [k for k in PERSISTENT_KEYS if k not in cfg]
    if missing:
        raise error(f"persistent-path launch config lacks {missing}")
    for key in ("GU_N", "DN_N"):
        v = cfg[key]
        if v < 64 or v > 256 or v & (v - 1):
            raise error(f"{key}={v} must be 64, 128 or 256 (the wgmma M side)")
    for key in ("GU_K", "DN_K"):
        v = cfg[key]
        if v < 32 or v > GROUP or v & (v - 1):
            raise error(f"{key}={v} must be a power of two in [32, 128]")
    if a1_group and cfg["GU_K"] != GROUP:
        raise error("dynamic per-group activation scales need GU_K == 128 (the K step is the group)")
    if a2_group and (cfg["GU_N"] != GROUP or cfg["DN_K"] != GROUP):
        raise error("dynamic per-group h scales need GU_N == DN_K == 128 (a tile is the 1x128 group)")
    if not 1 <= int(cfg["S_MAX"]) <= 16:
        raise error(f"S_MAX={cfg['S_MAX']} must be in [1, 16]")
    if cfg["WARPS"] not in (4, 8):
        raise error(f"WARPS={cfg['WARPS']} must be 4 or 8")
    for key in ("GU_STAGES", "DN_STAGES"):
        if not 1 <= int(cfg[key]) <= 8:
            raise error(f"{key}={cfg[key]} must be in [1, 8]")
    if cfg.get("PROGS_PER_SM", 1) not in (1, 2, 3, 4):
        raise error(f"PROGS_PER_SM={cfg['PROGS_PER_SM']} must be 1 to 4")
    for key in ("PDL", "PREFETCH_A"):
        if cfg.get(key, 0) not in (0, 1):
            raise error(f"{key}={cfg[key]} must be 0 or 1")
    if cfg.get("PREFETCH", 0) not in (0, 1, 2):
        raise error(
            f"PREFETCH={cfg['PREFETCH']} must be 0, 1 (each phase-B tile before its wait) or 2 (all at the start)"
        )
    return cfg


def _resident_per_sm(compiled, warps: int) -> int:
    """Programs of this compiled kernel that fit on one SM at once (registers, shared memory, threads)."""
    compiled._init_handles()
    threads = 32 * warps
    regs = -(-max(int(compiled.n_regs), 1) // 8) * 8
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    shared = int(compiled.metadata.shared)
    by_smem = smem_sm // (shared + 1024) if shared else 32
    return max(0, min(65536 // (threads * regs), by_smem, 2048 // threads))


def _plan(
    c: dict, dev, k: int, n_pad: int, h: int, a1_group, a2_group, w_block, args
) -> tuple[dict, bool, int]:
    """(constexprs, PDL?, program cap) of a config at these compile-time inputs, computed once per key
    (``fused_moe_persistent`` caches it): the cap is the SM count times the programs per SM that fit,
    read from the compiled kernel (``args()`` gives warm-up arguments); 1 off the GPU."""
    on_gpu = dev.type == "cuda"
    pdl = use_pdl(c, dev)
    consts = dict(
        BLOCK_N=c["GU_N"],
        BLOCK_K=c["GU_K"],
        BLOCK_H=c["DN_N"],
        BLOCK_KB=c["DN_K"],
        S_MAX=int(c["S_MAX"]),
        K_PAD=triton.next_power_of_2(k),
        N_PAD=n_pad,
        A_GROUP=a1_group,
        A2_GROUP=a2_group,
        W_BLOCK=w_block,
        USE_PDL=pdl,
        G_PAD=triton.next_power_of_2(triton.cdiv(h, GROUP)),
        PREFETCH=int(c.get("PREFETCH", 0)) if on_gpu else 0,
        PREFETCH_A=on_gpu and bool(c.get("PREFETCH_A", 0)),
        STAGES_A=int(c["GU_STAGES"]),
        STAGES_B=int(c["DN_STAGES"]),
        num_warps=c["WARPS"],
    )
    if not on_gpu:
        return consts, pdl, 1
    key = (str(dev), tuple(sorted((kk, str(v)) for kk, v in consts.items())))
    if key not in _RESIDENT:
        compiled = KP._persistent_moe_kernel.warmup(*args(), grid=(1,), **consts)
        _RESIDENT[key] = _resident_per_sm(compiled, c["WARPS"])
    fit = min(int(c.get("PROGS_PER_SM", 1)), _RESIDENT[key])
    if fit < 1:
        raise ValueError(f"persistent path: config {c} does not fit one program per SM")
    return consts, pdl, torch.cuda.get_device_properties(dev).multi_processor_count * fit


def fused_moe_persistent(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    a13: torch.Tensor,
    a2: torch.Tensor,
    a1_group: bool,
    a2_group: bool,
    w_block: bool,
    expert_offset: int,
    routed_scaling_factor: float,
    out: torch.Tensor,
    config: dict,
    programs: int | None = None,
) -> torch.Tensor:
    """The one launch on inputs ``op.fused_moe`` has validated; writes and returns ``out``.
    ``programs`` overrides the grid (tests); it is capped at what is co-resident on the GPU. Under the
    interpreter the grid is one program, and ``programs`` only sizes the K splits."""
    t, h = hidden.shape
    e, two_i, _ = w13.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    n = t * k
    if t > PERSISTENT_T_MAX:
        raise ValueError(f"the persistent path serves T <= {PERSISTENT_T_MAX}, got T={t}")
    if t == 0:
        return out
    c = config
    dev = hidden.device
    ids = topk_ids.to(torch.int32).contiguous()
    weights = topk_weights.float().contiguous()
    ws13 = w13_scale.float().contiguous()
    ws2 = w2_scale.float().contiguous()
    s_max = int(c["S_MAX"])
    num_h = triton.cdiv(h, c["DN_N"])
    num_g = triton.cdiv(inter, c["GU_N"])
    hbuf = LP.empty(n, inter, dtype=FP8, device=dev)
    hs = LP.empty(n, triton.cdiv(inter, GROUP), dtype=torch.float32, device=dev)
    part = LP.empty(s_max, n, two_i, dtype=torch.float32, device=dev) if s_max > 1 else hs
    y = LP.empty(s_max, n, h, dtype=torch.float32, device=dev)  # [K split of phase B, entry, H]
    # one zeroed per-stream slice (op_small._counters), left at 0 by the kernel
    cnt = _counters(dev, t * num_h + n * num_g + n + 1)
    c_out, c_grp = cnt[: t * num_h], cnt[t * num_h : t * num_h + n * num_g]
    ready = cnt[t * num_h + n * num_g : t * num_h + n * num_g + n]
    done = cnt[t * num_h + n * num_g + n :]
    on_gpu = dev.type == "cuda"
    s13 = (ws13.stride(0), ws13.stride(1)) if w_block else (0, 0)
    s2 = (ws2.stride(0), ws2.stride(1)) if w_block else (0, 0)

    def launch_args(work: int, xq: torch.Tensor, xs: torch.Tensor) -> tuple:
        return (
            hidden, ids, weights, a13, a2, w13, ws13, w2, ws2, xq, xs, hbuf, hs, part, y, out,
            c_out, c_grp, ready, done,
            t, h, inter, k, n, int(expert_offset), e, float(routed_scaling_factor), work,
            hidden.stride(0), out.stride(0), w13.stride(0), w13.stride(1), w2.stride(0), w2.stride(1),
            *s13, *s2,
        )  # fmt: skip

    n_pad = max(32, triton.next_power_of_2(n))  # T <= 4 at top-8: one build (the tuner precompiles T = 3)
    plan_key = (dev, tuple(c.items()), k, n_pad, h, a1_group, a2_group, w_block)
    plan = _PLANS.get(plan_key)
    if plan is None:
        plan = _plan(c, dev, k, n_pad, h, a1_group, a2_group, w_block, lambda: launch_args(1, hbuf, hs))
        _PLANS[plan_key] = plan
    consts, pdl, cap = plan
    if on_gpu:  # every program resident at once (they wait on each other's counters)
        p = cap if programs is None else max(1, min(programs, cap))
        work = p
    else:  # the interpreter runs programs one after another: one program does every item in order,
        p, work = 1, programs or 1  # with the K splits sized for ``programs`` (CPU tests reach them)
    # each program's own fp8 copy of the hidden rows (and group scales), written in its prologue
    xq = LP.empty(p, t, h, dtype=FP8, device=dev)
    xs = LP.empty(p, t, triton.cdiv(h, GROUP), dtype=torch.float32, device=dev)
    launch_kw = {"launch_pdl": True} if pdl else {}
    LP.launch(KP._persistent_moe_kernel, (p,))(*launch_args(work, xq, xs), **consts, **launch_kw)
    return out


__all__ = [
    "PERSISTENT_KEYS",
    "PERSISTENT_T_MAX",
    "check_persistent_config",
    "default_persistent_config",
    "fused_moe_persistent",
    "is_persistent",
]
