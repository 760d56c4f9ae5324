"""Launcher of the FP8 fused MoE's small-T path (``kernel_small.py``): two launches, no routing pass.

``op.fused_moe`` calls ``fused_moe_small`` when the launch config it picked (tuned in configs.json, or
``default_small_config`` for T <= ``SMALL_T_DEFAULT``) has ``"PATH": "small"``. The path serves
T <= ``SMALL_T_MAX`` (one A-tile row per token); larger T raises (the dispatcher never sends it here).
Small configs hold GU_N, GU_K, SPLIT_K, GU_WARPS, GU_STAGES (gate/up) and DN_N (= BLOCK_H), DN_K,
DN_WARPS, DN_STAGES (down), and optionally PRE_Q = 1: quantize the inputs in a launch of their own
first (three launches) instead of in every gate/up K step; GU_RED = 1 (with SPLIT_K > 1): the gate/up
kernel sums its split-K partials itself (the last-arriving split of each tile, in split order) and
hands the down kernel h as with one split; DN_SPLIT = s: s programs per (entry, H tile) over the K = I
steps, summed in split order by the token's last-arriving program; PDL = 1: programmatic dependent
launches (``use_pdl``); PREFETCH = 1 (with PDL): each GEMM grid prefetches its weight tiles into L2
before it waits for the previous grid (the gate/up grid only with PRE_Q); FUSE_QUANT = 1 (with PRE_Q,
T <= ``FUSE_T_MAX``): no quantization launch; every gate/up program that owns an expert quantizes the
T rows of its K range into a private scratch slice first (bitwise launch 0's values), so the path runs
two launches; FUSE_QUANT = 2: the same, and on SM90 the program's first GU_STAGES K steps of weights are
prefetched to L2 before it quantizes. The gate/up loop reads the scratch through L2 only (``.cg``). Above ``FUSE_T_MAX`` (a T = 4 entry serves up to
T = 8) a FUSE_QUANT config runs as plain PRE_Q: the same values, the scratch would grow as T · programs.
H_GROUP (dynamic intermediate scales only; 128, the default, or 64): the width of h's dynamic quantization
groups. 128 is the checkpoints' 1×128 recipe (the reference's default). 64 lets a 64-wide gate/up tile
(GU_N = 64) quantize its own columns as one group in the epilogue, so the block-scaled shapes get twice the
gate/up programs with fp8 h. The down kernel's K step holds DN_K / H_GROUP whole groups (DN_K 64: one;
DN_K 128: two, at the 1×128 form's 128-wide weight loads: group r's products land in column r of the dot's
activation side and are scaled there), one activation scale per (row, 64 columns) times the 128×128 weight
block scale of that K range. The two down forms sum the same products in another order (not bitwise each
other). Finer groups are more accurate per element but not bitwise the 1×128 result: tests compare with
``fused_moe_reference(..., h_group=64)``.

Workspace buffers and launches go through ``launch_plan`` (``empty``, ``launch``) so that ``op.fused_moe``
can record and replay them; the arrival counters are kept for the process (``launch_plan.keep``).
"""

from __future__ import annotations

import torch
import triton

from . import config as C
from . import kernel_small as KS
from . import launch_plan as LP
from .reference import FP8

GROUP = 128
NUM_SMS_H200 = 132
SMALL_T_MAX = 32  # one A-tile row per token: BLOCK_M = 16 up to T = 16, else 32
# untuned shapes take the small path up to this T; 0 since the first H200 sweep measured
# the small path slower than the regular one at every shape and T (configs.json decides per shape)
SMALL_T_DEFAULT = 0
FUSE_T_MAX = 4  # FUSE_QUANT serves T <= this (scratch: T rows per gate/up program), else runs as PRE_Q
FUSE_MAXNREG = 128  # FUSE_QUANT gate/up with 8 warps: 65536 / (2 · 256) registers, 2 CTAs per SM
SMALL_KEYS = tuple(k.upper() for k in C.SmallConfig.REQUIRED)  # the small path's required keys
SMALL_ALL_KEYS = C.SmallConfig.keys()  # every key it takes (config.SmallConfig's fields and PATH)
H_GROUPS = (GROUP, 64)  # widths of h's dynamic quantization group (config key H_GROUP, default GROUP)


def is_small(cfg: dict | None) -> bool:
    return bool(cfg) and cfg.get("PATH") == "small"


def h_group(cfg: dict) -> int:
    """Width of h's dynamic quantization group (config key H_GROUP; GROUP = 128 when absent)."""
    return int(cfg.get("H_GROUP", GROUP))


def h_mode(cfg: dict, a2_group: bool) -> int:
    """How gate/up hands h to the down kernel: 1 fp8 (quantized in the gate/up epilogue: static a2, or
    a GU_N = H_GROUP tile that holds one whole 1×H_GROUP group), 0 fp32, 2 fp32 split-K partials (summed by
    the down kernel; with GU_RED the gate/up kernel sums them itself and hands over h as with one split).
    In modes 0 / 2 the down kernel quantizes each 1×H_GROUP group of its K steps itself."""
    if int(cfg["SPLIT_K"]) > 1 and not cfg.get("GU_RED", 0):
        return 2
    return 1 if (not a2_group or cfg["GU_N"] == h_group(cfg)) else 0


def use_pdl(cfg: dict, device: torch.device) -> bool:
    """Programmatic dependent launch (config key PDL = 1): on SM90+ GPUs only (the interpreter and older
    GPUs run the launches plainly). Each kernel of the path waits for the prior grid (griddepcontrol.wait)
    before it reads or writes anything but weights, so the launch overlaps only the prior grid's tail."""
    return (
        bool(cfg.get("PDL", 0)) and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
    )


COUNTER_SLICE = 16384  # arrival counters per stream: T <= 32 tokens x H / DN_N <= 512 tiles
COUNTER_SLICES = 16  # streams per device
_COUNTERS: dict[str, torch.Tensor] = {}  # device -> zeroed int32 [COUNTER_SLICES, COUNTER_SLICE]
_SLICES: dict[str, dict[int, int]] = {}  # device -> stream -> slice


def _counters(device: torch.device, size: int) -> torch.Tensor:
    """Zeroed int32 arrival counters of the down launch: one slice per stream of a per-device buffer
    (the kernel leaves them at 0, so they are reused). The buffer is zero-filled at the first call
    outside a graph capture; a capture's stream (torch.cuda.graph uses a side stream) then takes a free
    slice, so the captured graph holds no memset. Only a call whose first use of the device is inside a
    capture, or a 17th stream, gets a fresh zeroed buffer there (a memset node in the graph)."""
    if size > COUNTER_SLICE:
        raise ValueError(f"small-T path: {size} (token, H tile) counters > {COUNTER_SLICE}")
    dev = str(device)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if dev not in _COUNTERS:
        if capturing:
            return torch.zeros(size, dtype=torch.int32, device=device)
        _COUNTERS[dev] = LP.keep(torch.zeros(COUNTER_SLICES, COUNTER_SLICE, dtype=torch.int32, device=device))
        _SLICES[dev] = {}
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    slices = _SLICES[dev]
    if stream not in slices:
        if len(slices) == COUNTER_SLICES:
            return torch.zeros(size, dtype=torch.int32, device=device)
        slices[stream] = len(slices)
    return _COUNTERS[dev][slices[stream]]


def default_small_config(
    t: int,
    top_k: int,
    num_experts: int,
    hidden: int,
    inter: int,
    a2_group: bool = True,
    num_sms: int = NUM_SMS_H200,
) -> dict:
    """Heuristic small-path config (not measured as a whole: the first H200 sweep timed the
    version without PRE_Q). Inputs quantized by a launch of their own (PRE_Q), so the gate/up loop
    only streams fp8 tiles; tiles of >= 64 weight rows (the dot's M side: Hopper wgmma, fp8 straight
    from shared memory). Gate/up: 64-wide tiles (more programs), 128-wide with dynamic a2 (the
    epilogue then quantizes whole 1×128 groups of h), split-K when the active experts' tiles cover
    less than half the SMs. Down: 64-wide H tiles."""
    active = max(1, min(num_experts, t * top_k))
    wide = a2_group
    gu_n = GROUP if wide else 64
    tiles = active * -(-inter // gu_n)
    split = 1
    if 2 * tiles < num_sms:
        split = max(1, min(4, -(-num_sms // tiles), hidden // 1024))
    return dict(
        PATH="small",
        GU_N=gu_n,
        GU_K=GROUP,
        SPLIT_K=split,
        GU_WARPS=8 if wide else 4,
        GU_STAGES=3 if wide else 4,
        DN_N=64,
        DN_K=GROUP,
        DN_WARPS=4,
        DN_STAGES=4,
        PRE_Q=1,
    )


def check_small_config(cfg: dict, a1_group: bool, a2_group: bool, error=ValueError) -> dict:
    """Validate a small-path config (``error``: the exception class to raise)."""
    missing = [k for k in SMALL_KEYS if k not in cfg]
    if missing:
        raise error(f"small-path launch config lacks {missing}")
    unknown = sorted(set(cfg) - SMALL_ALL_KEYS)
    if unknown:
        raise error(f"small-path launch config has keys the small path does not take: {unknown}")
    _check_small_tiles(cfg, a1_group, a2_group, error)
    _check_small_flags(cfg, error)
    return cfg


def _check_small_tiles(cfg: dict, a1_group: bool, a2_group: bool, error) -> None:
    """Tile sizes, h's quantization group width and the K steps the dynamic activation groups need."""
    for key in ("GU_N", "GU_K", "DN_N", "DN_K"):
        v = cfg[key]
        if v < 16 or v & (v - 1) or (key.endswith("_K") and v > GROUP):
            raise error(f"{key}={v} must be a power of two in [16, 128]")
    hg = cfg.get("H_GROUP", GROUP)
    if type(hg) is not int or hg not in H_GROUPS:
        raise error(f"H_GROUP={hg!r} must be 128 (the checkpoints' 1x128 groups) or 64")
    if hg != GROUP and not a2_group:
        raise error(
            f"H_GROUP={hg} sets the width of h's dynamic quantization groups; a static a2 scale has none"
        )
    if (a1_group and cfg["GU_K"] != GROUP) or (a2_group and cfg["DN_K"] % hg):
        steps = " or ".join(str(v) for v in range(hg, GROUP + 1, hg))
        raise error(
            f"dynamic per-group activation scales need GU_K / DN_K == 128 / {steps} (a gate/up K step is the "
            "input's 1x128 group; a down K step holds whole 1xH_GROUP groups of h)"
        )
    if not 1 <= int(cfg["SPLIT_K"]) <= 16:
        raise error(f"SPLIT_K={cfg['SPLIT_K']} must be in [1, 16]")
    if not 1 <= int(cfg.get("DN_SPLIT", 1)) <= 8:
        raise error(f"DN_SPLIT={cfg['DN_SPLIT']} must be in [1, 8]")


def _check_small_flags(cfg: dict, error) -> None:
    """The 0/1 (FUSE_QUANT: 0..2) launch options and the ones that need another."""
    if cfg.get("PRE_Q", 0) not in (0, 1):
        raise error(
            f"PRE_Q={cfg['PRE_Q']} must be 0 (quantize per K step) or 1 (a quantization launch first)"
        )
    if cfg.get("FUSE_QUANT", 0) not in (0, 1, 2):
        raise error(
            f"FUSE_QUANT={cfg['FUSE_QUANT']} must be 0, 1 (quantize in the gate/up prologue) "
            "or 2 (and prefetch)"
        )
    if cfg.get("FUSE_QUANT", 0) and not cfg.get("PRE_Q", 0):
        raise error(
            "FUSE_QUANT folds PRE_Q's quantization launch into the gate/up kernel: it needs PRE_Q = 1"
        )
    for key in ("GU_RED", "PDL", "PREFETCH"):
        if cfg.get(key, 0) not in (0, 1):
            raise error(f"{key}={cfg[key]} must be 0 or 1")


def fused_moe_small(
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
) -> torch.Tensor:
    """The two launches on inputs ``op.fused_moe`` has validated; writes and returns ``out``."""
    t, h = hidden.shape
    e, two_i, _ = w13.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    n = t * k
    if t > SMALL_T_MAX:
        raise ValueError(f"the small-T path serves T <= {SMALL_T_MAX}, got T={t}")
    if t == 0:
        return out
    c = config
    split = int(c["SPLIT_K"])
    dev = hidden.device
    ids = topk_ids.to(torch.int32).contiguous()
    weights = topk_weights.float().contiguous()
    ws13 = w13_scale.float().contiguous()
    ws2 = w2_scale.float().contiguous()
    mode = h_mode(c, a2_group)
    pre_q = bool(c.get("PRE_Q", 0))
    gu_red = split > 1 and bool(c.get("GU_RED", 0))
    dn_split = int(c.get("DN_SPLIT", 1))
    pdl = use_pdl(c, dev)
    launch_kw = {"launch_pdl": True} if pdl else {}
    prefetch = pdl and bool(c.get("PREFETCH", 0))  # weights to L2 before each grid's wait
    fuse = int(c.get("FUSE_QUANT", 0)) if pre_q and t <= FUSE_T_MAX else 0
    grid_gu = (n * triton.cdiv(inter, c["GU_N"]), split)
    k_span = triton.cdiv(triton.cdiv(h, c["GU_K"]), split) * c["GU_K"]
    q_groups = min(32, triton.next_power_of_2(triton.cdiv(k_span, GROUP))) if fuse else 1
    fuse_kw = {}
    if fuse:  # private scratch of T rows per gate/up program (programs that own no expert leave it)
        xq = LP.empty(grid_gu[0] * split * t, h, dtype=FP8, device=dev)
        xs = LP.empty(grid_gu[0] * split * t, triton.cdiv(h, GROUP), dtype=torch.float32, device=dev)
        sm90 = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
        fuse_kw.update(
            FUSE_QUANT=True,
            Q_GROUPS=q_groups,
            Q_CHUNKS=triton.cdiv(triton.cdiv(k_span, GROUP), q_groups),
            PF_STEPS=int(c["GU_STAGES"]) if fuse == 2 and sm90 else 0,  # inline PTX: SM90 only
        )
        if sm90 and c["GU_WARPS"] == 8:
            # the prologue lifts ptxas' pick from 92 to 136 registers (sm_90a, 128-wide block-scaled tile),
            # which leaves 1 CTA per SM; at 128 it builds without spills: 2 per SM, as the plain kernel
            fuse_kw["maxnreg"] = FUSE_MAXNREG
    elif pre_q:  # launch 0: the inputs quantized once (kernel._quant_rows tiles), no router
        xq = LP.empty(t, h, dtype=FP8, device=dev)
        xs = LP.empty(t, triton.cdiv(h, GROUP), dtype=torch.float32, device=dev)
        LP.launch(KS._small_quant_kernel, (triton.cdiv(t, 16) * triton.cdiv(h, GROUP),))(
            hidden,
            xq,
            xs,
            a13,
            t,
            h,
            hidden.stride(0),
            QROWS=16,
            GROUP=GROUP,
            A_GROUP=a1_group,
            USE_PDL=pdl,
            num_warps=4,
            **launch_kw,
        )
    else:
        xq, xs = hidden, a13  # unused
    hs = LP.empty(n, triton.cdiv(inter, h_group(c)), dtype=torch.float32, device=dev)
    if mode == 1:
        hbuf = LP.empty(n, inter, dtype=FP8, device=dev)
    elif mode == 0:
        hbuf = LP.empty(n, inter, dtype=torch.float32, device=dev)
    else:
        hbuf = LP.empty(split, n, two_i, dtype=torch.float32, device=dev)
    y = LP.empty(dn_split, n, h, dtype=torch.float32, device=dev)
    # GU_RED: split partials, summed by the gate/up kernel's last-arriving split (else unused)
    part = LP.empty(split, n, two_i, dtype=torch.float32, device=dev) if gu_red else y
    num_h = triton.cdiv(h, c["DN_N"])
    num_n = triton.cdiv(inter, c["GU_N"])
    # one zeroed slice: the down launch's (token, H tile) counters, then gate/up's (entry, N tile) ones
    counters = _counters(dev, t * num_h + (n * num_n if gu_red else 0))
    s13 = (ws13.stride(0), ws13.stride(1)) if w_block else (0, 0)
    s2 = (ws2.stride(0), ws2.stride(1)) if w_block else (0, 0)
    LP.launch(KS._small_gate_up_kernel, grid_gu)(
        hidden,
        xq,
        xs,
        a13,
        a2,
        ids,
        w13,
        ws13,
        hbuf,
        hs,
        part,
        counters[t * num_h :],
        t,
        h,
        inter,
        k,
        n,
        int(expert_offset),
        e,
        hidden.stride(0),
        w13.stride(0),
        w13.stride(1),
        *s13,
        BLOCK_M=16 if t <= 16 else SMALL_T_MAX,
        BLOCK_N=c["GU_N"],
        BLOCK_K=c["GU_K"],
        SPLIT_K=split,
        K_PAD=triton.next_power_of_2(k),
        N_PAD=triton.next_power_of_2(SMALL_T_MAX * k),  # fixed per top-k: one compile serves every T
        H_MODE=mode,
        PRE_Q=pre_q,
        A_GROUP=a1_group,
        A2_GROUP=a2_group,
        W_BLOCK=w_block,
        EVEN_K=h % c["GU_K"] == 0,
        GU_RED=gu_red,
        USE_PDL=pdl,
        PREFETCH=prefetch and pre_q and not fuse,  # nothing runs between the ids' writer and this grid
        **fuse_kw,
        num_warps=c["GU_WARPS"],
        num_stages=c["GU_STAGES"],
        **launch_kw,
    )
    LP.launch(KS._small_down_kernel, (n * num_h * dn_split,))(
        hbuf,
        hs,
        a2,
        ids,
        weights,
        w2,
        ws2,
        y,
        counters,
        out,
        t,
        h,
        inter,
        k,
        n,
        int(expert_offset),
        e,
        float(routed_scaling_factor),
        out.stride(0),
        w2.stride(0),
        w2.stride(1),
        *s2,
        BLOCK_H=c["DN_N"],
        BLOCK_K=c["DN_K"],
        SPLIT_K=split,
        K_PAD=triton.next_power_of_2(k),
        H_MODE=mode,
        A2_GROUP=a2_group,
        W_BLOCK=w_block,
        EVEN_K=inter % c["DN_K"] == 0,
        DN_SPLIT=dn_split,
        USE_PDL=pdl,
        PREFETCH=prefetch,
        H_GROUPS=c["DN_K"] // h_group(c) if a2_group else 1,
        num_warps=c["DN_WARPS"],
        num_stages=c["DN_STAGES"],
        **launch_kw,
    )
    return out


__all__ = [
    "FUSE_T_MAX",
    "SMALL_KEYS",
    "SMALL_T_DEFAULT",
    "SMALL_T_MAX",
    "check_small_config",
    "default_small_config",
    "fused_moe_small",
    "h_group",
    "is_small",
]
