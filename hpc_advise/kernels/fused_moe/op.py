"""Launcher of the FP8 fused MoE: validation, launch-config choice, workspace, the launches.

``fused_moe(hidden, w13, w2, topk_weights, topk_ids, *, w13_scale, w2_scale, ...)`` → bf16 [T, H].
Every step runs on the GPU with shapes fixed by (T, k, E, H, I, config), so a call can be captured in
a CUDA graph. Launch configs come from ``configs.json`` (written by ``benchmarks/tune_fused_moe.py``)
keyed by (E, H, I, top_k, scale mode) and T (nearest tuned T within a factor 2), else
from ``default_config``. A config holds the keys of one path: the regular path's (``REGULAR_KEYS``) or,
with ``"PATH": "small"``, the small-T path's (op_small.py); any other key is refused (the keys are the
fields of ``config.Config`` / ``config.SmallConfig``). PDL chooses programmatic dependent launches (kernel
README, "Launch configs"); ROUTE (the ranked router on many programs) and BLOCK_EXIT (GEMM programs exit on the block's
expert, one dependent load fewer) are regular-path variants; none of them changes the result. GU_SWAP_AB /
DN_SWAP_AB run the gate/up / down GEMM with the weight tile as the MMA's M side (decode tiles: wgmma at 16
token rows; same products). DN_TILES (default 1) gives each down program that many adjacent H tiles of its
block in one flattened, software-pipelined loop over (tile, K step) (bitwise the one-tile programs' output);
DN_GLUON = 3 runs the down GEMM as a persistent ping-pong Gluon kernel (kernel_gluon_down.py: a TMA producer
warp and two consumer warpgroups on alternate DN_GLUON_M x DN_N tiles, per-tensor prefill form only, SM90;
bitwise the Triton down GEMM). GU_MAXNREG (default 0:
ptxas' choice) caps the gate/up kernel's registers per thread on the GPU (Triton's ``maxnreg``; the same
arithmetic in the same order, so bitwise). GU_HALF (BLOCK_M 128, unsplit gate/up) runs the gate/up tile at
64 rows in a block whose rows 64.. are padding only and stores those rows' h as zeros; DN_HALF the same for
the Triton down GEMM's tiles (padding rows store nothing; bitwise).
The first call of a call signature is recorded and later calls replay its compiled launches
(``launch_plan.py``; ``_plan_key``, ``_replay``): the eager host cost.

``moe_unfused`` is the benchmark's unfused baseline built from the same GEMM kernels: torch routing,
a gathered copy of the token rows, gate/up GEMM writing fp32 gate and up, torch SiLU·mul and
quantization, down GEMM, torch weighted sum.
"""

from __future__ import annotations

import functools
import math

import torch
import triton

from . import config as C
from . import kernel as K
from . import kernel_route as KR
from . import launch_plan as LP
from .op_small import (
    COUNTER_SLICE,
    SMALL_T_DEFAULT,
    SMALL_T_MAX,
    check_small_config,
    default_small_config,
    fused_moe_small,
    is_small,
    use_pdl,
)
from .reference import FP8, moe_align_reference, quantize_group, quantize_static

GROUP = 128
NUM_SMS_H200 = 132
# the router runs on many CTAs (kernel_route.py) from this many (token, slot) entries up; below it the
# single-CTA router in the prep launch is cheaper (one launch fewer)
ROUTE_MULTI_MIN_ENTRIES = 4096
ROUTE_CHUNK = 1024  # entries per routing CTA
INTERPRET_SMS = 2  # SMs of the CPU interpreter (the unit of a persistent grid there)
RANKED_CHUNK = 64  # entries per router program of the ranked decode router (config ROUTE = 1)
MAXNREG_MIN = 64  # the lowest gate/up register cap accepted (config GU_MAXNREG; 4 warps at 64: 8 programs/SM)
T_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
CONFIG_PATH = C.CONFIG_PATH
CONFIG_KEYS = tuple(k.upper() for k in C.Config.REQUIRED)  # the regular path's required keys
REGULAR_KEYS = C.Config.keys()  # every key the regular path takes (config.Config's fields)


class FusedMoEError(ValueError):
    """Inputs the fused MoE kernels do not support (with the reason)."""


def scale_mode(w_block: bool, a_static: bool) -> str:
    """Key of the scale mode in configs.json: weights 'tensor'|'block', activations 'static'|'dynamic'."""
    return f"{'block' if w_block else 'tensor'}-{'static' if a_static else 'dynamic'}"


def t_bucket(t: int) -> int:
    for b in T_BUCKETS:
        if t <= b:
            return b
    return T_BUCKETS[-1]


def max_padded_rows(n_entries: int, num_experts: int, block_m: int) -> int:
    """Upper bound of the padded sorted rows: every non-empty expert wastes < block_m rows."""
    rows = n_entries + min(num_experts, n_entries) * (block_m - 1)
    return max(block_m, -(-rows // block_m) * block_m)


def default_config(
    t: int, top_k: int, num_experts: int, hidden: int, inter: int, a2_group: bool, num_sms: int = NUM_SMS_H200
) -> dict:
    """Heuristic launch config (used when configs.json has no entry for the shape)."""
    n = t * top_k
    active = max(1, min(num_experts, n))
    if n <= 256:  # decode: stream weights, spread them over every SM
        block_m = 16
        gu_n = 128 if a2_group else (32 if inter <= 256 else 64)
        tiles = active * -(-inter // gu_n)
        split = 1
        if tiles < 2 * num_sms:
            split = min(8, max(1, -(-2 * num_sms // tiles)), max(1, hidden // 512))
        if a2_group and split == 1 and tiles < num_sms:
            split = 2
        return dict(
            BLOCK_M=block_m,
            GU_N=gu_n,
            GU_K=128,
            SPLIT_K=split,
            GU_GROUP_M=1,
            GU_WARPS=4,
            GU_STAGES=4,
            DN_N=64,
            DN_K=128,
            DN_GROUP_M=1,
            DN_WARPS=4,
            DN_STAGES=4,
        )
    if n <= 2048:  # every tuned pick here has 16-row blocks, ungrouped, unsplit (configs.json)
        return dict(
            BLOCK_M=16,
            GU_N=128 if a2_group else 64,
            GU_K=128,
            SPLIT_K=1,
            GU_GROUP_M=1,
            GU_WARPS=4,
            GU_STAGES=4,
            DN_N=64,
            DN_K=128,
            DN_GROUP_M=1,
            DN_WARPS=4,
            DN_STAGES=4,
        )
    # prefill, as tuned on the H200 (configs.json): dynamic group scales take BLOCK_M 64
    # with 8 warps for gate/up (the per-step scaled product needs a second accumulator's registers;
    # at BLOCK_M 128 it spills) and a 4-warp down kernel; per-tensor scales take BLOCK_M 64 up to ~256
    # rows per expert (each expert pads its rows up to BLOCK_M), 128 above. With dynamic scales the
    # weight tiles come by TMA with scalar block scales and 4 gate/up stages where the shape allows
    # (W_TMA, W_SCALAR: 2-16% faster on all three block-scaled shapes at T = 1024-16384 in the prefill-forms
    # sweep, see the README's decisions table; without block weight scales W_SCALAR changes nothing).
    block_m = 64 if a2_group or n / max(num_experts, 1) <= 256 else 128
    tma = a2_group and hidden % 16 == 0 and inter % 16 == 0
    cfg = dict(
        BLOCK_M=block_m,
        GU_N=128,
        GU_K=128,
        SPLIT_K=1,
        GU_GROUP_M=8,
        GU_WARPS=8,
        GU_STAGES=4 if tma or not a2_group else 3,
        DN_N=128,
        DN_K=128,
        DN_GROUP_M=8,
        DN_WARPS=4 if a2_group else 8,
        DN_STAGES=3 if a2_group else 4,
    )
    if tma:
        cfg.update(W_TMA=1, W_SCALAR=int(inter % GROUP == 0))
    return cfg


@functools.lru_cache(maxsize=1)
def _config_table() -> dict:
    """configs.json as {(E, H, I, top_k, mode): {T: config dict}}, every entry read through config.parse."""
    table: dict = {}
    for (e, h, i, k, mode, t), cfg in C.load_entries(CONFIG_PATH):
        table.setdefault((e, h, i, k, mode), {})[t] = cfg.to_dict()
    return table


def get_config(
    t: int,
    top_k: int,
    num_experts: int,
    hidden: int,
    inter: int,
    mode: str,
    a2_group: bool,
    allow_small: bool = True,
) -> dict:
    """Tuned config of the tuned T nearest to t within a factor 2 (configs.json), else
    ``default_config`` (a decode config is never stretched over prefill sizes, or the reverse).
    Small-T path configs (``"PATH": "small"``, op_small.py) only with ``allow_small`` and
    t <= SMALL_T_MAX; untuned shapes take the small path's default up to SMALL_T_DEFAULT."""
    small_ok = allow_small and t <= SMALL_T_MAX
    per_t = _config_table().get((num_experts, hidden, inter, top_k, mode)) or {}
    near = [b for b in per_t if b / 2 <= t <= b * 2 and (small_ok or not is_small(per_t[b]))]
    a1_group = mode.endswith("dynamic")
    if near:
        cfg = dict(per_t[min(near, key=lambda b: abs(math.log(b / max(t, 1))))])
    elif small_ok and t <= SMALL_T_DEFAULT:
        cfg = default_small_config(t, top_k, num_experts, hidden, inter, a2_group)
    else:
        cfg = default_config(t, top_k, num_experts, hidden, inter, a2_group)
    return check_config(cfg, a2_group, a1_group)


def _reject_small_only_keys(cfg: dict) -> None:
    if "H_GROUP" in cfg and not is_small(cfg):
        raise FusedMoEError("H_GROUP (h's quantization group width) is a small-T path key (PATH 'small')")
    if is_small(cfg) and any(cfg.get(k, 0) for k in ("DN_GLUON", "DN_GLUON_M")):
        raise FusedMoEError("DN_GLUON (the ping-pong Gluon down GEMM) is a regular prefill path key")
    if is_small(cfg) and (cfg.get("GU_HALF", 0) or cfg.get("DN_HALF", 0)):
        raise FusedMoEError(
            "GU_HALF / DN_HALF (64-row tiles for the padding-half blocks) are regular path keys"
        )


def check_config(cfg: dict, a2_group: bool, a1_group: bool | None = None) -> dict:
    _reject_small_only_keys(cfg)
    if is_small(cfg):
        return check_small_config(cfg, a2_group if a1_group is None else a1_group, a2_group, FusedMoEError)
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise FusedMoEError(f"launch config lacks {missing}")
    unknown = sorted(set(cfg) - REGULAR_KEYS)
    if unknown:
        raise FusedMoEError(f"launch config has keys the regular path does not take: {unknown}")
    for key in ("BLOCK_M", "GU_N", "GU_K", "DN_N", "DN_K"):
        v = cfg[key]
        if v < 16 or v & (v - 1):
            raise FusedMoEError(f"{key}={v} must be a power of two >= 16")
    if max(cfg["GU_K"], cfg["DN_K"]) > 2 * GROUP:
        raise FusedMoEError("BLOCK_K must divide the 128-wide scale groups (<= 128; 256 per-tensor)")
    if a2_group and cfg["SPLIT_K"] == 1 and cfg["GU_N"] != GROUP:
        raise FusedMoEError("the fused per-group epilogue needs GU_N == 128 (or SPLIT_K > 1)")
    for key in (
        "PDL",
        "ROUTE",
        "BLOCK_EXIT",
        "W_TMA",
        "GU_TWO_DOTS",
        "W_SCALAR",
        "DN_A_TMA",
        "GU_SWAP_AB",
        "DN_SWAP_AB",
        "GU_HALF",
        "DN_HALF",
    ):
        if cfg.get(key, 0) not in (0, 1):
            raise FusedMoEError(f"{key}={cfg[key]} must be 0 or 1")
    _check_program_keys(cfg)
    return cfg


def _check_program_keys(cfg: dict) -> None:
    """The keys that shape the GEMM programs rather than their tiles: the gate/up register cap, down tiles per
    program, the half-height tiles and the down GEMM's kernel (Triton or the ping-pong Gluon one)."""
    # a register cap for the gate/up build (0: none): ptxas allocates registers in steps of 8, 255 at most
    cap = cfg.get("GU_MAXNREG", 0)
    if type(cap) is not int or (cap and not (MAXNREG_MIN <= cap <= 248 and cap % 8 == 0)):
        raise FusedMoEError(
            f"GU_MAXNREG={cap!r} must be 0 (no cap) or a multiple of 8 in [{MAXNREG_MIN}, 248]"
        )
    v = cfg.get("DN_TILES", 1)
    if type(v) is not int or v < 1:
        raise FusedMoEError(f"DN_TILES={v!r} must be a whole number of tiles per program (>= 1)")
    # GU_HALF: a 128-row block whose rows 64.. are padding only runs a 64-row gate/up tile (kernel._gate_up_kernel
    # HALF): built into the unsplit program with the fused epilogue only
    if cfg.get("GU_HALF", 0) and (cfg["BLOCK_M"] != 128 or cfg["SPLIT_K"] != 1):
        raise FusedMoEError(
            "GU_HALF (64-row gate/up tiles for the padding-half blocks) needs BLOCK_M 128 and SPLIT_K 1, "
            f"got BLOCK_M={cfg['BLOCK_M']}, SPLIT_K={cfg['SPLIT_K']}"
        )
    # DN_HALF: the same for the Triton down GEMM (kernel._down_kernel HALF), not its A-by-TMA form (the TMA
    # block is BLOCK_M rows) nor the Gluon down GEMM
    down_keys = {k: cfg.get(k, 0) for k in ("DN_A_TMA", "DN_GLUON")}
    if cfg.get("DN_HALF", 0) and (cfg["BLOCK_M"] != 128 or any(down_keys.values())):
        raise FusedMoEError(
            "DN_HALF (64-row down tiles for the padding-half blocks) needs BLOCK_M 128 and the Triton down GEMM "
            f"without DN_A_TMA, got BLOCK_M={cfg['BLOCK_M']}, {down_keys}"
        )
    if cfg.get("DN_GLUON", 0) not in (0, 3):
        raise FusedMoEError(
            f"DN_GLUON={cfg['DN_GLUON']!r} must be 0 (Triton down GEMM) or 3 (persistent ping-pong Gluon down GEMM)"
        )


def check_forms(cfg: dict, a1_group: bool, a2_group: bool, w_block: bool, hidden: int, inter: int) -> None:
    """The regular path's tile forms against the shape, before anything is launched (every T: the forms
    first tuned at prefill sizes run at decode sizes too, BLOCK_M 16 and split-K included). A K step wider
    than a 128-wide scale group only where that GEMM has no group scales (with per-tensor weights and a
    static activation scale, GU_K / DN_K = 256 promotes the fp8 partial sums every 256 instead of every
    128); W_SCALAR / block-scaled GU_TWO_DOTS need tile halves inside one 128-row group (any GU_N <= 128
    with I % 128 == 0: a 64-wide half lies in one group too; split-K slices are whole K steps, so the
    scalar of each step is the one its columns need); TMA (W_TMA, DN_A_TMA) needs 16-byte rows (H, I
    multiples of 16). The small-T path has its own checks and never takes these keys."""
    _check_scale_forms(cfg, a1_group, a2_group, w_block, inter)
    _check_tile_forms(cfg, a1_group, a2_group, w_block, hidden, inter)
    if cfg.get("DN_GLUON", 0) or cfg.get("DN_GLUON_M", 0):
        _check_gluon_form(cfg, a2_group, w_block, hidden, inter)


# config keys the ping-pong Gluon down kernel (DN_GLUON = 3, kernel_gluon_down.py) has no form of
GLUON_DOWN_EXCLUDES = (
    "PDL",
    "DN_SWAP_AB",
    "DN_A_TMA",
    "W_SCALAR",
    "DN_HALF",
)
# the ping-pong kernel's TMA ring: at most this many bytes (228 KiB per SM less barriers and the compiler's scratch)
GLUON_SMEM = 200 * 1024


def _check_gluon_form(cfg: dict, a2_group: bool, w_block: bool, hidden: int, inter: int) -> None:
    """DN_GLUON = 3: the persistent ping-pong down GEMM in Gluon (kernel_gluon_down.py): per-tensor w2 scales and
    a static intermediate scale only; 128-wide K steps; DN_WARPS 4 (each consumer is one warpgroup); a
    consumer tile of DN_GLUON_M (default BLOCK_M; 64 or 128 dividing BLOCK_M) x DN_N rows with at most 64 fp32
    values per thread (the sum plus two partials in flight: 128 x 128 needs 256 registers > 255); TMA tiles
    inside one expert (H % DN_N == 0, 16-byte rows); the STAGES-deep ring in shared memory."""
    if not cfg.get("DN_GLUON", 0):
        raise FusedMoEError(
            "DN_GLUON_M is the ping-pong Gluon down GEMM's tile height: it needs DN_GLUON = 3"
        )
    if w_block or a2_group:
        raise FusedMoEError(
            "DN_GLUON (Gluon down GEMM) serves per-tensor weight scales with a static intermediate scale only"
        )
    extra = [k for k in GLUON_DOWN_EXCLUDES if cfg.get(k, 0)] + (
        ["DN_TILES"] if cfg.get("DN_TILES", 1) > 1 else []
    )
    if extra:
        raise FusedMoEError(f"DN_GLUON (Gluon down GEMM) has no form with {extra}")
    bm, bn, tm = cfg["BLOCK_M"], cfg["DN_N"], cfg.get("DN_GLUON_M", 0) or cfg["BLOCK_M"]
    if (
        cfg["DN_K"] != GROUP
        or cfg["DN_WARPS"] != 4
        or tm not in (64, 128)
        or bm % tm
        or not 64 <= bn <= 256
        or tm * bn > 64 * 128
    ):
        raise FusedMoEError(
            "DN_GLUON (Gluon down GEMM) needs DN_K == 128, DN_WARPS == 4, a tile of DN_GLUON_M (64 or 128, dividing "
            "BLOCK_M) x DN_N (64-256) rows with DN_GLUON_M·DN_N <= 8192 (64 fp32 per thread), got "
            f"BLOCK_M={bm}, DN_GLUON_M={tm}, DN_N={bn}, DN_K={cfg['DN_K']}, DN_WARPS={cfg['DN_WARPS']}"
        )
    if cfg["DN_STAGES"] < 2 or cfg["DN_STAGES"] * (tm + bn) * GROUP > GLUON_SMEM:
        raise FusedMoEError(
            f"DN_GLUON (Gluon down GEMM) needs 2 <= DN_STAGES and a ring of <= {GLUON_SMEM} bytes, got "
            f"DN_STAGES={cfg['DN_STAGES']} x {(tm + bn) * GROUP} bytes"
        )
    if hidden % bn or inter % 16:
        raise FusedMoEError(
            f"DN_GLUON (Gluon down GEMM) needs H % DN_N == 0 and I % 16 == 0 (TMA tiles inside one expert), "
            f"got H={hidden}, DN_N={bn}, I={inter}"
        )


def _check_scale_forms(cfg: dict, a1_group: bool, a2_group: bool, w_block: bool, inter: int) -> None:
    """check_forms' keys that depend on where the scales sit: the K step width, W_SCALAR and GU_TWO_DOTS."""
    for key, grouped in (("GU_K", a1_group or w_block), ("DN_K", a2_group or w_block)):
        if cfg[key] > GROUP and (grouped or cfg[key] > 2 * GROUP):
            raise FusedMoEError(
                f"{key}={cfg[key]}: a K step may exceed the 128-wide scale group only with per-tensor "
                "weight and static activation scales, and only up to 256"
            )
    if cfg.get("W_SCALAR", 0) and (cfg["GU_N"] > GROUP or cfg["DN_N"] > GROUP or inter % GROUP):
        raise FusedMoEError(
            "W_SCALAR (one weight block scale per tile half and K step) needs GU_N, DN_N <= 128 and "
            f"I % 128 == 0, got GU_N={cfg['GU_N']}, DN_N={cfg['DN_N']}, I={inter}"
        )
    if cfg.get("GU_TWO_DOTS", 0) and w_block and (cfg["GU_N"] != GROUP or inter % GROUP):
        raise FusedMoEError(
            "GU_TWO_DOTS with block scales need GU_N == 128 and I % 128 == 0 (one weight scale per "
            f"tile half and K step), got GU_N={cfg['GU_N']}, I={inter}"
        )


def _check_tile_forms(
    cfg: dict, a1_group: bool, a2_group: bool, w_block: bool, hidden: int, inter: int
) -> None:
    """check_forms' tile-shape keys: TMA rows, multi-tile down programs and swap AB."""
    if (cfg.get("W_TMA", 0) or cfg.get("DN_A_TMA", 0)) and (hidden % 16 or inter % 16):
        raise FusedMoEError(
            f"W_TMA / DN_A_TMA need 16-byte rows: H and I multiples of 16, got H={hidden}, I={inter}"
        )
    # multi-tile down programs: a program takes DN_TILES adjacent H tiles of one block, so the count must
    # divide the tiles per block
    tiles, per_block = cfg.get("DN_TILES", 1), -(-hidden // cfg["DN_N"])
    if per_block % tiles:
        raise FusedMoEError(
            f"DN_TILES={tiles} must divide the {per_block} tiles of DN_N={cfg['DN_N']} over {hidden} columns"
        )
    # swap AB (weights as the MMA's M side) exists to reach wgmma at decode tiles: <= 32 token rows, and
    # a weight side of >= 64 rows per dot (the merged gate|up dot has 2·GU_N, separate dots GU_N)
    two_dots = not (a1_group or w_block) or cfg.get("GU_TWO_DOTS", 0)
    for key, rows in (("GU_SWAP_AB", cfg["GU_N"] * (1 if two_dots else 2)), ("DN_SWAP_AB", cfg["DN_N"])):
        if cfg.get(key, 0) and (cfg["BLOCK_M"] > 32 or rows < 64):
            raise FusedMoEError(
                f"{key} is a decode form: BLOCK_M <= 32 and a weight tile of >= 64 rows per dot, got "
                f"BLOCK_M={cfg['BLOCK_M']}, {rows} rows"
            )


def triton_down_form(cfg: dict) -> dict:
    """``cfg`` with its down GEMM as the Triton kernel instead of the ping-pong Gluon one (DN_GLUON = 3): the
    same DN_N x BLOCK_M tile on 8 warps (the 4-warp consumer tile is the Gluon kernel's), the rest unchanged;
    bitwise the same result. A pick from configs.json takes it on devices the Gluon kernel does not serve
    (not SM90, or the CPU interpreter)."""
    out = {k: v for k, v in cfg.items() if k not in ("DN_GLUON", "DN_GLUON_M")}
    if cfg.get("DN_GLUON", 0):
        out["DN_WARPS"] = 8
    return out


def _is_sm90(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


@functools.cache
def _num_sms(device: torch.device) -> int:
    """SMs of ``device`` (the Gluon down GEMM's persistent grid); INTERPRET_SMS off the GPU."""
    if device.type != "cuda":
        return INTERPRET_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


_ONES: dict[torch.device, torch.Tensor] = {}  # device -> float32 [1] = 1.0, never written


def _one(device: torch.device) -> torch.Tensor:
    """The activation-scale argument of the dynamic modes (1.0; the kernels read no scale there): one
    tensor per device, made at the first call outside a graph capture. A per-call ``torch.ones`` cost
    a fill launch per eager call (an H200 cProfile: ~29 µs of host time per
    call under the profiler) and a fill node in front of every captured call. Inside a capture before
    any eager call it is a fresh tensor (its fill is a node of that graph), never cached: an eager call
    would read it before the graph ever ran."""
    one = _ONES.get(device)
    if one is None:
        one = torch.ones(1, dtype=torch.float32, device=device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _ONES[device] = LP.keep(one)
    return one


def _scale_tensor(value, name: str, device) -> torch.Tensor:
    """A static per-tensor activation scale as a float32 [1] on ``device``. A host number (or a tensor on
    another device) needs a copy to the GPU, which a CUDA-graph capture forbids: refused there by name."""
    on_device = isinstance(value, torch.Tensor) and value.device == torch.device(device)
    if not on_device and torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise FusedMoEError(
            f"{name} is a host value inside a CUDA-graph capture: pass it as a tensor on {device} (its copy to "
            "the GPU cannot be captured)"
        )
    t = torch.as_tensor(value, dtype=torch.float32, device=device).reshape(-1)
    if t.numel() != 1:
        raise FusedMoEError(f"{name} must be a single per-tensor scale, got {tuple(t.shape)}")
    return t


def _kernel_inputs(topk_weights, topk_ids, w13_scale, w2_scale) -> tuple:
    """(ids int32, routing weights fp32, w13 scales fp32, w2 scales fp32), contiguous: the tensors
    themselves where they already are."""
    return (
        topk_ids.to(torch.int32).contiguous(),
        topk_weights.float().contiguous(),
        w13_scale.float().contiguous(),
        w2_scale.float().contiguous(),
    )


def _check_inputs(hidden, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, block_shape):
    if hidden.dim() != 2 or hidden.dtype != torch.bfloat16:
        raise FusedMoEError(f"hidden must be bf16 [T, H], got {hidden.dtype} {tuple(hidden.shape)}")
    if hidden.stride(1) != 1:
        raise FusedMoEError("hidden rows must be contiguous (stride(1) == 1)")
    if w13.dtype != FP8 or w2.dtype != FP8 or w13.dim() != 3 or w2.dim() != 3:
        raise FusedMoEError("w13 [E, 2I, H] and w2 [E, H, I] must be float8_e4m3fn")
    num_experts, two_i, h = w13.shape
    if h != hidden.shape[1] or two_i % 2 or tuple(w2.shape) != (num_experts, h, two_i // 2):
        raise FusedMoEError(
            f"shape mismatch: hidden {tuple(hidden.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}"
        )
    if w13.stride(2) != 1 or w2.stride(2) != 1 or w13.stride(1) != h or w2.stride(1) != two_i // 2:
        raise FusedMoEError("w13 and w2 rows must be contiguous ([E, N, K] with stride(2) == 1)")
    if topk_ids.dim() != 2 or topk_weights.shape != topk_ids.shape or topk_ids.shape[0] != hidden.shape[0]:
        raise FusedMoEError("topk_ids and topk_weights must both be [T, k]")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise FusedMoEError(f"topk_ids must be int32, got {topk_ids.dtype}")
    devices = {t.device for t in (hidden, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)}
    if len(devices) != 1:
        raise FusedMoEError(f"all tensors must be on one device, got {devices}")
    if block_shape is not None and tuple(block_shape) != (GROUP, GROUP):
        raise FusedMoEError(f"only 128x128 weight blocks are supported, got {block_shape}")
    inter = two_i // 2
    if w13_scale.dim() == 1 and w2_scale.dim() == 1:
        if w13_scale.numel() != num_experts or w2_scale.numel() != num_experts:
            raise FusedMoEError("per-tensor weight scales must be [E]")
        return False
    want13 = (num_experts, -(-two_i // GROUP), -(-h // GROUP))
    want2 = (num_experts, -(-h // GROUP), -(-inter // GROUP))
    if tuple(w13_scale.shape) != want13 or tuple(w2_scale.shape) != want2:
        raise FusedMoEError(
            f"block scales must be w13 {want13} and w2 {want2}, got {tuple(w13_scale.shape)} "
            f"and {tuple(w2_scale.shape)}"
        )
    return True


class _Launch:
    """Validated inputs + config + workspace of one call."""

    def __init__(
        self,
        hidden,
        w13,
        w2,
        topk_weights,
        topk_ids,
        w13_scale,
        w2_scale,
        a13_scale,
        a2_scale,
        block_shape,
        expert_offset,
        config,
        allow_small=False,
    ):
        self.w_block = _check_inputs(
            hidden, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, block_shape
        )
        dev = hidden.device
        self.T, self.H = hidden.shape
        self.E, two_i, _ = w13.shape
        self.I = two_i // 2
        self.k = topk_ids.shape[1]
        self.n = self.T * self.k
        self.a1_group = a13_scale is None
        self.a2_group = a2_scale is None
        if self.w_block and (w13_scale.dtype != torch.float32 or w2_scale.dtype != torch.float32):
            raise FusedMoEError("weight scales must be float32")
        self.ids, self.weights, self.w13_scale, self.w2_scale = _kernel_inputs(
            topk_weights, topk_ids, w13_scale, w2_scale
        )
        one = _one(dev)
        self.a13 = one if self.a1_group else _scale_tensor(a13_scale, "a13_scale", dev)
        self.a2 = one if self.a2_group else _scale_tensor(a2_scale, "a2_scale", dev)
        mode = scale_mode(self.w_block, not self.a1_group)
        if config is not None and is_small(config) and allow_small and self.T > SMALL_T_MAX:
            raise FusedMoEError(f"the small-T path serves T <= {SMALL_T_MAX}, got T={self.T}")
        picked = config is None or (is_small(config) and not allow_small)
        if picked:
            config = get_config(self.T, self.k, self.E, self.H, self.I, mode, self.a2_group, allow_small)
            if config.get("DN_GLUON", 0) and not _is_sm90(dev):  # a pick tuned on the H200, run elsewhere
                config = triton_down_form(config)
        self.cfg = check_config(dict(config), self.a2_group, self.a1_group)
        if not is_small(self.cfg):  # the regular path's forms only
            check_forms(self.cfg, self.a1_group, self.a2_group, self.w_block, self.H, self.I)
            if self.cfg.get("DN_GLUON", 0) and not _is_sm90(dev):
                raise FusedMoEError(
                    "DN_GLUON (Gluon down GEMM) runs on SM90 GPUs only (Gluon has no interpreter)"
                )
        self.offset = int(expert_offset)
        if is_small(self.cfg):  # the small path allocates its own workspace
            return
        self.pdl = use_pdl(self.cfg, dev)  # programmatic dependent launches (config PDL = 1, SM90+)
        self.launch_kw = {"launch_pdl": True} if self.pdl else {}
        bm = self.cfg["BLOCK_M"]
        self.P = max_padded_rows(self.n, self.E, bm)
        self.sorted_ids = LP.empty(self.P, dtype=torch.int32, device=dev)
        self.block_expert = LP.empty(self.P // bm, dtype=torch.int32, device=dev)
        self.num_padded = LP.empty(1, dtype=torch.int32, device=dev)
        self.e_pad = max(16, triton.next_power_of_2(self.E))
        self.route_chunks = triton.cdiv(self.n, ROUTE_CHUNK) if self.n >= ROUTE_MULTI_MIN_ENTRIES else 0
        # ROUTE = 1: the ranked router on cdiv(n, RANKED_CHUNK) programs (decode; prefill sizes keep the
        # multi-CTA router)
        self.ranked = bool(self.cfg.get("ROUTE", 0)) and not self.route_chunks
        self.num_route = triton.cdiv(self.n, RANKED_CHUNK) if self.ranked else 1
        self.num_n_down = triton.cdiv(self.H, self.cfg["DN_N"])
        self.cursor = LP.empty(max(1, self.route_chunks) * self.e_pad, dtype=torch.int32, device=dev)
        self.hist = LP.empty(self.route_chunks * self.e_pad, dtype=torch.int32, device=dev)
        self.xq = LP.empty(self.T, self.H, dtype=FP8, device=dev)
        self.xs = LP.empty(self.T, -(-self.H // GROUP), dtype=torch.float32, device=dev)
        self.inter = LP.empty(self.P, self.I, dtype=FP8, device=dev)
        self.inter_s = LP.empty(self.P, -(-self.I // GROUP), dtype=torch.float32, device=dev)
        self.y = LP.empty(self.n, self.H, dtype=torch.bfloat16, device=dev)

    def weight_desc(self, w, halves: int, rows: int, block_n: int, block_k: int):
        """W_TMA: host-side TMA descriptor over ``w`` viewed as [E, halves, N, K] (w13: gate and up
        halves of N = I rows; w2: one half of N = H rows), block [1, rows, block_n, block_k]. The copy
        engine zero-fills rows past N and columns past K. Built per call (a few µs of host work, the
        tensor map is encoded at launch); a CUDA graph keeps it with the launch."""
        from triton.tools.tensor_descriptor import TensorDescriptor

        e, n_all, k = w.shape
        n = n_all // halves
        if (w.stride(0) * w.element_size()) % 16 or (k * w.element_size()) % 16 or w.data_ptr() % 16:
            raise FusedMoEError("W_TMA needs 16-byte aligned weights and row strides")
        return TensorDescriptor(w, [e, halves, n, k], [w.stride(0), n * k, k, 1], [1, rows, block_n, block_k])

    def inter_desc(self, block_m: int, block_k: int):
        """DN_A_TMA: TMA descriptor over the fp8 intermediate [P, I] (rows contiguous in the padded
        sorted order, so the down GEMM's A tile needs no gather), block [block_m, block_k]."""
        from triton.tools.tensor_descriptor import TensorDescriptor

        return TensorDescriptor.from_tensor(self.inter, [block_m, block_k])  # I % 16 == 0: checked

    def scale_strides(self, scale):
        return (scale.stride(0), scale.stride(1)) if self.w_block else (0, 0)

    def prep(self, hidden):
        """Routing + input quantization."""
        qrows = 16 if self.T <= 1024 else 64
        if self.route_chunks:
            return self._prep_multi(hidden, qrows)
        grid = (self.num_route + triton.cdiv(self.T, qrows) * triton.cdiv(self.H, GROUP),)
        LP.launch(K._prep_kernel, grid)(
            self.ids,
            self.n,
            self.offset,
            self.E,
            self.sorted_ids,
            self.block_expert,
            self.num_padded,
            self.cursor,
            self.P,
            hidden,
            self.xq,
            self.xs,
            self.a13,
            self.T,
            self.H,
            hidden.stride(0),
            self.num_route,
            BLOCK_M=self.cfg["BLOCK_M"],
            E_PAD=self.e_pad,
            ROUTE_BLK=256,
            QROWS=qrows,
            GROUP=GROUP,
            A_GROUP=self.a1_group,
            USE_PDL=self.pdl,
            RANKED=self.ranked,
            CHUNK=RANKED_CHUNK,
            num_warps=4,
            **self.launch_kw,
        )

    def _prep_multi(self, hidden, qrows: int):
        """Prefill routing on route_chunks CTAs (kernel_route.py) + the input quantization."""
        c = self.route_chunks
        grid = (c + triton.cdiv(self.T, qrows) * triton.cdiv(self.H, GROUP),)
        LP.launch(KR._prep_chunks_kernel, grid)(
            self.ids,
            self.n,
            self.offset,
            self.E,
            self.hist,
            self.sorted_ids,
            self.P,
            c,
            hidden,
            self.xq,
            self.xs,
            self.a13,
            self.T,
            self.H,
            hidden.stride(0),
            CHUNK=ROUTE_CHUNK,
            E_PAD=self.e_pad,
            ROUTE_BLK=256,
            QROWS=qrows,
            GROUP=GROUP,
            A_GROUP=self.a1_group,
            num_warps=4,
        )
        LP.launch(KR._route_scatter_kernel, (c,))(
            self.ids,
            self.n,
            self.offset,
            self.E,
            self.hist,
            self.cursor,
            self.sorted_ids,
            self.block_expert,
            self.num_padded,
            self.P,
            c,
            BLOCK_M=self.cfg["BLOCK_M"],
            CHUNK=ROUTE_CHUNK,
            E_PAD=self.e_pad,
            ROUTE_BLK=256,
            HIST_ROWS=max(1, min(16, 4096 // self.e_pad)),
            num_warps=4,
        )

    def gate_up(
        self,
        w13,
        out,
        outs,
        out_mode: int,
        split_k: int,
        xq=None,
        xs=None,
        sorted_ids=None,
        top_k=None,
        n_entries=None,
    ):
        """Gate/up GEMM: out_mode 0 fp8 h (+ group scales) into out / outs; 1 fp32 split partials into out."""
        c = self.cfg
        grid = ((self.P // c["BLOCK_M"]) * triton.cdiv(self.I, c["GU_N"]), split_k)
        # separate gate and up dots: per-tensor promoted (default there), or as config GU_TWO_DOTS
        two_dots = not (self.a1_group or self.w_block) or bool(c.get("GU_TWO_DOTS", 0))
        tma = bool(c.get("W_TMA", 0))
        desc = self.weight_desc(w13, 2, 1 if two_dots else 2, c["GU_N"], c["GU_K"]) if tma else None
        LP.launch(K._gate_up_kernel, grid)(
            self.xq if xq is None else xq,
            self.xs if xs is None else xs,
            self.a13,
            w13,
            self.w13_scale,
            self.sorted_ids if sorted_ids is None else sorted_ids,
            self.block_expert,
            self.num_padded,
            out,
            outs,
            self.a2,
            self.H,
            self.I,
            self.k if top_k is None else top_k,
            self.n if n_entries is None else n_entries,
            self.P,
            w13.stride(0),
            w13.stride(1),
            *self.scale_strides(self.w13_scale),
            BLOCK_M=c["BLOCK_M"],
            BLOCK_N=c["GU_N"],
            BLOCK_K=c["GU_K"],
            GROUP_M=c["GU_GROUP_M"],
            SPLIT_K=split_k,
            A_GROUP=self.a1_group,
            W_BLOCK=self.w_block,
            A2_GROUP=self.a2_group,
            OUT_MODE=out_mode,
            EVEN_K=self.H % c["GU_K"] == 0,
            TWO_DOTS=two_dots,
            USE_PDL=self.pdl,
            BLOCK_EXIT=bool(c.get("BLOCK_EXIT", 0)),
            W_TMA=tma,
            w_desc=desc,
            W_SCALAR=self.w_block and bool(c.get("W_SCALAR", 0)),
            SWAP_AB=bool(c.get("GU_SWAP_AB", 0)),
            HALF=bool(c.get("GU_HALF", 0)) and out_mode == 0,  # fp32 outputs (moe_unfused) run full tiles
            num_warps=c["GU_WARPS"],
            num_stages=c["GU_STAGES"],
            **self.launch_kw,
            # GU_MAXNREG: ptxas' register cap (a build option; the interpreter compiles nothing)
            **({"maxnreg": c["GU_MAXNREG"]} if c.get("GU_MAXNREG", 0) and w13.device.type == "cuda" else {}),
        )

    def act_quant(self, part, split_k: int):
        grid = (self.P // self.cfg["BLOCK_M"], triton.cdiv(self.I, GROUP))
        LP.launch(K._act_quant_kernel, grid)(
            part,
            self.block_expert,
            self.num_padded,
            self.inter,
            self.inter_s,
            self.a2,
            self.I,
            self.P,
            BLOCK_M=self.cfg["BLOCK_M"],
            SPLIT_K=split_k,
            A2_GROUP=self.a2_group,
            USE_PDL=self.pdl,
            num_warps=4,
            **self.launch_kw,
        )

    def down(self, w2, routed_scaling: float):
        """Down GEMM → bf16 rows y (one per (token, slot))."""
        c = self.cfg
        if c.get("DN_GLUON", 0):  # check_forms: the prefill per-tensor form
            return self.down_gluon(w2, routed_scaling)
        tiles = c.get("DN_TILES", 1)  # H tiles per program (check_forms: divides them)
        grid = ((self.P // c["BLOCK_M"]) * (self.num_n_down // tiles),)
        tma = bool(c.get("W_TMA", 0))
        desc = self.weight_desc(w2, 1, 1, c["DN_N"], c["DN_K"]) if tma else None
        a_tma = bool(c.get("DN_A_TMA", 0))
        a_desc = self.inter_desc(c["BLOCK_M"], c["DN_K"]) if a_tma else None
        LP.launch(K._down_kernel, grid)(
            self.inter,
            self.inter_s,
            self.a2,
            w2,
            self.w2_scale,
            self.sorted_ids,
            self.block_expert,
            self.num_padded,
            self.weights,
            self.y,
            self.H,
            self.I,
            self.n,
            self.P,
            float(routed_scaling),
            w2.stride(0),
            w2.stride(1),
            *self.scale_strides(self.w2_scale),
            BLOCK_M=c["BLOCK_M"],
            BLOCK_N=c["DN_N"],
            BLOCK_K=c["DN_K"],
            GROUP_M=c["DN_GROUP_M"],
            A_GROUP=self.a2_group,
            W_BLOCK=self.w_block,
            EVEN_K=self.I % c["DN_K"] == 0,
            USE_PDL=self.pdl,
            BLOCK_EXIT=bool(c.get("BLOCK_EXIT", 0)),
            W_TMA=tma,
            w_desc=desc,
            W_SCALAR=self.w_block and bool(c.get("W_SCALAR", 0)),
            A_TMA=a_tma,
            a_desc=a_desc,
            SWAP_AB=bool(c.get("DN_SWAP_AB", 0)),
            TILES=tiles,
            HALF=bool(c.get("DN_HALF", 0)),
            num_warps=c["DN_WARPS"],
            num_stages=c["DN_STAGES"],
            **self.launch_kw,
        )

    def down_gluon(self, w2, routed_scaling: float):
        """DN_GLUON = 3: the down GEMM by ``kernel_gluon_down`` (one persistent ping-pong program per SM) → y.
        Its TMA descriptors are Gluon's (with the shared-memory layout); the weight one is over a 2-D view of
        w2, which is no slot of a launch plan, so a call with it is never recorded (launch_plan.Recorder.finish:
        every call runs these launches eagerly, as it does in a CUDA-graph capture)."""
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from .kernel_gluon_down import MAXNREG, _down_pingpong_kernel

        c = self.cfg
        tm, bn = c.get("DN_GLUON_M", 0) or c["BLOCK_M"], c["DN_N"]
        if not w2.is_contiguous() or w2.data_ptr() % 16:
            raise FusedMoEError("DN_GLUON needs a contiguous, 16-byte aligned w2 (its TMA view is [E·H, I])")

        def desc(t, rows):
            return TensorDescriptor.from_tensor(
                t, [rows, GROUP], gl.NVMMASharedLayout.get_default_for([rows, GROUP], gl.float8e4nv)
            )

        tiles = (self.P // tm) * (self.H // bn)
        LP.launch(_down_pingpong_kernel, (min(tiles, _num_sms(w2.device)),))(
            desc(self.inter, tm),
            desc(w2.view(self.E * self.H, self.I), bn),
            self.a2,
            self.w2_scale,
            self.sorted_ids,
            self.block_expert,
            self.num_padded,
            self.weights,
            self.y,
            self.H,
            self.I,
            self.n,
            float(routed_scaling),
            BLOCK_M=c["BLOCK_M"],
            GROUP_M=c["DN_GROUP_M"],
            STAGES=c["DN_STAGES"],
            num_warps=4,
            maxnreg=MAXNREG,
        )

    def reduce(self, out):
        block_h = min(1024, triton.next_power_of_2(self.H))
        LP.launch(K._reduce_kernel, (self.T, triton.cdiv(self.H, block_h)))(
            self.y,
            self.ids,
            out,
            self.H,
            self.k,
            self.offset,
            self.E,
            out.stride(0),
            BLOCK_H=block_h,
            USE_PDL=self.pdl,
            num_warps=4,
            **self.launch_kw,
        )


def _is_raw(scale, given) -> bool:
    """The static scale tensor the kernels read is the caller's own (no copy): replays pass it as is."""
    return isinstance(given, torch.Tensor) and scale is not None and scale.data_ptr() == given.data_ptr()


def _output(out, t, h, device):
    if out is None:
        return torch.empty(t, h, dtype=torch.bfloat16, device=device)
    if out.shape != (t, h) or out.dtype != torch.bfloat16 or out.stride(1) != 1:
        raise FusedMoEError(f"out must be bf16 [{t}, {h}] with contiguous rows")
    return out


def fused_moe(
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
    config: dict | C.Config | C.SmallConfig | None = None,
) -> torch.Tensor:
    """FP8 MoE layer: out[t] = Σ_j w_tj · s · W2_e(q(SiLU(W1_e q(x_t)) ⊙ W3_e q(x_t))), bf16 [T, H].

    w13 [E, 2I, H] (rows [0, I) gate, [I, 2I) up) and w2 [E, H, I] fp8 e4m3 with per-tensor scales
    [E] or 128×128 block scales. a13_scale / a2_scale: static per-tensor activation scales of the
    hidden / intermediate; None = dynamic per-1×128 group. EP: ids are global, ``expert_offset`` is
    the first local expert; ids outside [offset, offset + E) (or −1) are skipped, and a token with no
    local slot gets zeros. TP: I is the local shard; the output is this rank's partial sum.

    Host cost: the first call of a signature (device, stream, every input's shape / stride / dtype /
    alignment, config, offset, scaling factor) runs the checks, the config lookup and Triton's launch
    dispatch and is recorded; later calls of that signature replay its compiled launches directly
    with their own tensors (launch_plan.py; bitwise the same launches). Off with
    ``launch_plan.ENABLED = False``.
    """
    if isinstance(config, (C.Config, C.SmallConfig)):
        config = config.to_dict()
    args = (hidden, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, a13_scale, a2_scale)
    rest = (block_shape, expert_offset, routed_scaling_factor, out, config)
    key = _plan_key(*args, *rest) if LP.usable() else None
    if key is None:
        return _fused_moe_calls(*args, *rest)
    capturing = key[0][0] >= 0 and torch.cuda.is_current_stream_capturing()
    plan = _PLANS.get(key)
    if plan is not None:
        return _replay(plan, *args, out, key[0][1], capturing)
    rec = None if capturing else LP.Recorder()  # a capture's buffers belong to its graph
    with LP.recording(rec):
        result = _fused_moe_calls(*args, *rest)
    plan = rec.finish() if rec is not None else None
    if plan is not None:
        _PLANS.put(key, plan)
    return result


_PLANS = LP.PlanCache()


def _settings() -> tuple:
    """The module settings a call's path depends on (tests and the tuner change them at run time): the
    tuned table (its path and a generation that grows each time it is re-read), the router thresholds,
    the small path's default, the counter slice and the form check."""
    _config_table()
    return (
        CONFIG_PATH,
        _config_table.cache_info().misses,
        ROUTE_MULTI_MIN_ENTRIES,
        ROUTE_CHUNK,
        RANKED_CHUNK,
        SMALL_T_DEFAULT,
        COUNTER_SLICE,
        check_forms,
    )


def _tensor_key(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % 16)


def _plan_key(
    hidden, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, a13_scale, a2_scale, block_shape,
    expert_offset, routed_scaling_factor, out, config,
):  # fmt: skip
    """Everything of a call that the checks, the config and Triton's specialization depend on (tensor
    16-byte alignment included; data never), or None for arguments of unexpected types (the unplanned
    path then checks them and raises as before). The first item is (current device, current stream)."""
    tensors = (hidden, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    scales = []
    for s in (a13_scale, a2_scale):
        if s is None or isinstance(s, (float, int)):
            scales.append(type(s))  # a host number becomes a per-call tensor (a slot)
        elif isinstance(s, torch.Tensor):
            scales.append(_tensor_key(s))
        else:
            return None
    if out is not None and not isinstance(out, torch.Tensor):
        return None
    if not (type(expert_offset) is int and isinstance(routed_scaling_factor, (float, int))):
        return None
    if config is not None and type(config) is not dict:
        return None
    try:
        key = (
            LP.stream_of(hidden.get_device()),
            _settings(),
            *(_tensor_key(t) for t in tensors),
            *scales,
            None if out is None else _tensor_key(out),
            None if block_shape is None else tuple(block_shape),
            expert_offset,
            routed_scaling_factor,
            None if config is None else tuple(config.items()),
        )
        hash(key)
    except TypeError:  # unhashable config values or block shape: unplanned
        return None
    return key


def _replay(plan, hidden, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, a13_scale, a2_scale, out,
            stream, capturing):  # fmt: skip
    """Run a recorded plan with this call's tensors (``_fused_moe_calls`` made the same ones)."""
    same, a13_raw, a2_raw = plan.meta
    if same:
        ids, weights, ws13, ws2 = topk_ids, topk_weights, w13_scale, w2_scale
    else:
        ids, weights, ws13, ws2 = _kernel_inputs(topk_weights, topk_ids, w13_scale, w2_scale)
    a13 = a13_scale if a13_raw or a13_scale is None else _scale_tensor(a13_scale, "a13_scale", hidden.device)
    a2 = a2_scale if a2_raw or a2_scale is None else _scale_tensor(a2_scale, "a2_scale", hidden.device)
    if out is None:
        out = torch.empty(hidden.shape[0], hidden.shape[1], dtype=torch.bfloat16, device=hidden.device)
    plan.run((hidden, w13, w2, weights, ids, ws13, ws2, a13, a2, out), stream, capturing)
    return out


def _fused_moe_calls(
    hidden, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, a13_scale, a2_scale, block_shape,
    expert_offset, routed_scaling_factor, out, config,
):  # fmt: skip
    """``fused_moe`` without a plan: checks, config, workspace, launches (recorded where a plan is)."""
    launch = _Launch(
        hidden,
        w13,
        w2,
        topk_weights,
        topk_ids,
        w13_scale,
        w2_scale,
        a13_scale,
        a2_scale,
        block_shape,
        expert_offset,
        config,
        allow_small=True,
    )
    result = _output(out, launch.T, launch.H, hidden.device)
    a13 = None if launch.a1_group else launch.a13  # the unit scale of the dynamic modes is kept (LP.keep)
    a2 = None if launch.a2_group else launch.a2
    io = (hidden, w13, w2, launch.weights, launch.ids, launch.w13_scale, launch.w2_scale, a13, a2, result)
    given = (topk_ids, topk_weights, w13_scale, w2_scale)
    made = (launch.ids, launch.weights, launch.w13_scale, launch.w2_scale)
    same = all(a is b for a, b in zip(made, given, strict=True))
    LP.set_io(io, (same, _is_raw(a13, a13_scale), _is_raw(a2, a2_scale)))
    if launch.T == 0:
        return result
    if is_small(launch.cfg):  # the small-T path takes the same validated inputs
        return fused_moe_small(
            hidden,
            w13,
            w2,
            launch.weights,
            launch.ids,
            w13_scale=launch.w13_scale,
            w2_scale=launch.w2_scale,
            a13=launch.a13,
            a2=launch.a2,
            a1_group=launch.a1_group,
            a2_group=launch.a2_group,
            w_block=launch.w_block,
            expert_offset=launch.offset,
            routed_scaling_factor=routed_scaling_factor,
            out=result,
            config=launch.cfg,
        )
    launch.prep(hidden)
    split = launch.cfg["SPLIT_K"]
    if split == 1:
        launch.gate_up(w13, launch.inter, launch.inter_s, 0, 1)
    else:
        part = LP.empty(split, launch.P, 2 * launch.I, dtype=torch.float32, device=hidden.device)
        launch.gate_up(w13, part, part, 1, split)
        launch.act_quant(part, split)
    launch.down(w2, routed_scaling_factor)
    launch.reduce(result)
    return result


def moe_unfused(
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
    config: dict | None = None,
) -> torch.Tensor:
    """Same math as ``fused_moe`` with every stage a separate pass (the benchmark's unfused baseline):
    torch routing and input quantization, a gathered copy of the rows, gate/up GEMM → fp32, torch
    SiLU·mul and quantization, down GEMM, torch weighted sum."""
    launch = _Launch(
        hidden,
        w13,
        w2,
        topk_weights,
        topk_ids,
        w13_scale,
        w2_scale,
        a13_scale,
        a2_scale,
        block_shape,
        expert_offset,
        config,
    )
    launch.pdl, launch.launch_kw = False, {}  # the baseline's stages are plain launches
    result = _output(out, launch.T, launch.H, hidden.device)
    if launch.T == 0:
        return result
    dev = hidden.device
    sorted_ids, block_expert, num_padded = moe_align_reference(
        launch.ids, launch.E, launch.offset, launch.cfg["BLOCK_M"], launch.P
    )
    launch.sorted_ids.copy_(sorted_ids)
    launch.block_expert.copy_(block_expert)
    launch.num_padded.copy_(num_padded)
    # gathered copy of the token rows (padding rows read token 0; their results are never used)
    tok = torch.where(sorted_ids < launch.n, sorted_ids // launch.k, 0).long()
    if launch.a1_group:
        xq, xs = quantize_group(hidden)
        gxq, gxs = xq[tok], xs[tok].contiguous()
    else:
        gxq, gxs = quantize_static(hidden, launch.a13)[tok], launch.xs
    identity = torch.arange(launch.P, dtype=torch.int32, device=dev)
    part = torch.empty(1, launch.P, 2 * launch.I, dtype=torch.float32, device=dev)
    launch.gate_up(
        w13, part, part, 1, 1, xq=gxq.contiguous(), xs=gxs, sorted_ids=identity, top_k=1, n_entries=launch.P
    )
    gate, up = part[0, :, : launch.I], part[0, :, launch.I :]
    h = torch.nn.functional.silu(gate) * up
    if launch.a2_group:
        hq, hs = quantize_group(h)
        launch.inter.copy_(hq)
        launch.inter_s.copy_(hs)
    else:
        launch.inter.copy_(quantize_static(h, launch.a2))
    launch.down(w2, routed_scaling_factor)
    local = launch.ids.long() - launch.offset
    valid = ((local >= 0) & (local < launch.E)).reshape(-1, 1)
    y = torch.where(valid, launch.y.float(), 0.0).view(launch.T, launch.k, launch.H)
    result.copy_(y.sum(dim=1))
    return result


def flops_and_bytes(
    topk_ids: torch.Tensor,
    num_experts: int,
    hidden: int,
    inter: int,
    expert_offset: int = 0,
    w_block: bool = False,
) -> tuple[float, float]:
    """(FLOPs of the local (token, slot) rows, bytes of the activated experts' weights + scales)."""
    local = topk_ids.long().reshape(-1) - expert_offset
    local = local[(local >= 0) & (local < num_experts)]
    rows = local.numel()
    active = int(torch.unique(local).numel())
    w_bytes = 3 * hidden * inter  # w13 (2I·H) + w2 (H·I), one byte each
    if w_block:
        w_bytes += 4 * (
            math.ceil(2 * inter / GROUP) * math.ceil(hidden / GROUP)
            + math.ceil(hidden / GROUP) * math.ceil(inter / GROUP)
        )
    else:
        w_bytes += 8
    return 2.0 * rows * 3 * hidden * inter, float(active * w_bytes)
