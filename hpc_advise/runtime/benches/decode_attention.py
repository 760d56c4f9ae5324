"""Benchmark of paged decode attention (ours, dynamic and static) against its peers, on one GPU.

Cases (issue 5): Hq/Hkv 8/1 and 64/8, head_dim 128, page 64, bf16 and fp8 e4m3 KV; batches mixing short
and long contexts. Each case's pages are scattered at random over a pool, and the timed loop rotates over
several page tables (distinct pages) so the KV read each call is at least 512 MB across the rotation,
far over the 60 MB L2. Timing: CUDA-graph replay of one graph holding the rotated calls
(``benchmarking.time_cuda``), events around each replay; a peer that cannot be captured falls back to
event-timed back-to-back launches, and its row says so. Plan/update time is excluded everywhere and
reported separately. Peers (same process): FlashInfer ``BatchAttention`` and
``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)``, torch's FA2 varlen
(``aten._flash_attention_forward``) on contiguous KV (bf16 only), our static split-k schedule.
Ceiling: a copy kernel measured in the same process (``microbench.copy_ceiling``, bytes read + written).

torch and the kernels are imported inside the functions; FlashInfer is optional (a missing or failing
peer gives a row with the reason instead of a time).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import contextmanager

from hpc_advise.runtime.measure.harness import Timing, environment, rotating, run_row, time_cuda

HEAD_DIM = 128
PAGE = 64
ROTATE_BYTES = 512e6  # KV bytes touched per rotation cycle (>> 60 MB L2)
MAX_ROTATIONS = 8

CASES: dict[str, list[tuple[int, int]]] = {
    # name -> list of (count, length); length < 0 means log-uniform in [1K, 32K]
    "64 x U(1K-32K)": [(64, -1)],
    "128 x U(1K-32K)": [(128, -1)],
    "64 x 4K": [(64, 4096)],
    "32 x 128 + 32 x 4K": [(32, 128), (32, 4096)],
    "2 x 32K + 30 x 4K": [(2, 32768), (30, 4096)],
    "1 x 64K + 15 x 4K": [(1, 65536), (15, 4096)],
    "1 x 128K + 31 x 4K": [(1, 131072), (31, 4096)],
    "1 x 128K": [(1, 131072)],
}
HEADS = ((8, 1), (64, 8))
SMALL = [("64 x 4K", 8, 1), ("1 x 128K + 31 x 4K", 8, 1), ("64 x 4K", 64, 8)]
PEERS = ("static", "fi_batch_attention", "fi_decode_tc", "torch_fa2")
PEER_TITLES = {
    "static": "ours static",
    "fi_batch_attention": "FI BatchAttention",
    "fi_decode_tc": "FI decode (TC)",
    "torch_fa2": "torch FA2 varlen",
}
# Launch configurations tried by sweep() / --tune: (tile, ctas_per_sm, num_stages, num_warps, variant);
# variant = loop ('nested' | 'flat') plus flags: '-desc' (first segment from the planner's per-program
# descriptor, the next segment's q rows and length loaded one segment ahead), '-prefetch' (hand-written
# register prefetch), '-mN' (the merge combines N partials per step instead of 16), '-w' (adaptive merge:
# segments split over more than N programs go to a second, wide launch), '-pcN' (page >= tile: the page ids
# of N tiles are loaded before an inner tile loop, so Triton double-buffers K/V at 3 stages), '-sN' (the
# planner charges N tiles per segment start when balancing programs), '-f16' (fp8 KV: products in fp16),
# '-pdl' (the merge launches as a programmatic dependent of the attention pass: its idle programs exit
# while that pass still runs, the others wait for it in griddepcontrol.wait) and '-ws' (op.py's warp_split).
# Runs 1-7 (kernel TUNING_LOG.md, "Tuning"; benchmarks/results/decode_attention_sweep_run*.md) measured the tile /
# CTAs / stages / warps grid, the loop variants and the flags above. Run 7 (2026-11-29 13:33 UTC): '-pdl'
# faster on all 12 cases; '-ws' (a tile's tokens split over the warps, own softmax state per warp: 2
# barriers per tile in the SASS instead of 8, but 255 registers) slower for bf16 everywhere, faster for fp8
# 64/8 at 2 warps x 32 tokens and 4 programs/SM (64 x 4K 232 -> 208 us) and slower for fp8 8/1. What is
# left after run 8: the fp8 warp split with smaller tiles and more programs per SM (1 warp x 32 tokens:
# 7 programs/SM by shared memory; registers / spills from the offline sm_90a compile,
# tests/kernels/sm90_compile.py: 255 / 32 bytes), first timed in run 10.
# Sweep run 10 (deeper K/V pipelining, larger tiles): since page ids come 32 tiles per load, Triton's pipeliner
# gives K/V num_stages - 1 buffers (before, the page-id load in the loop held it to one buffer, so runs 1-2
# saw no effect of stages). Offline sm_90a (tests/kernels/sm90_compile.py), bf16 tile 64: 3 stages 70 KB of
# shared memory (two 32 KB buffers), 4 stages 102 KB (three), 161 registers, 2 programs/SM either way;
# tile 128 at 2 stages: one 64 KB buffer, 241 registers, 2 programs/SM; tile 128 at 3 stages, 8 warps:
# 136 KB, 1 program/SM; page id per tile (pt_chunk 0) at 7 stages: three buffers too (5-6 stages: two),
# with no pipeline drain every 32 tiles. fp8 warp split (2 warps) at 4 stages: 72 KB, 3 programs/SM, not 4.
# Outcome (2026-11-29 16:33 UTC, benchmarks/results/decode_attention_sweep_run10.md), against the default's
# timing at each case's end: bf16 64/8 three buffers -0.3..+1.3 %, 128-token tiles +0.2..+15 % (no gain);
# bf16 8/1 3-26 % slower, but for 128-token tiles at 8 warps, 1 program/SM on 1 x 128K (28.4 vs 30.0 us;
# +5 and +15 % on the other two 8/1 cases); fp8 64/8: 1 warp x 32 tokens at 7 programs/SM 3.5-9 % faster on
# all four cases (op.TUNED_MANY_KV_HEADS since), three buffers 8-17 % slower.
# Sweep run 12 (boundary snap, '-snN': op.plan(snap=N), 2026-11-29 17:32 UTC,
# benchmarks/results/decode_attention_sweep_run12.md), before the gate: snap 25 made bf16 64/8 64 x 4K 4 % faster
# (260.3 -> 249.9 us, every segment whole) and every mixed case slower (up to +15 %, +34 % at snap 50; 8/1 and fp8
# too); three K/V buffers no faster with whole segments either (256.0). Since then the planner keeps a snap only
# when no program exceeds its share by more than op.SNAP_GATE %, and bf16 with >= 8 KV heads runs snap 25 by
# default. Sweep run 13 (lead's call, 17:53 UTC): gated snap 25 kept 64 x 4K's gain (261.0 -> 249.8 us), the mixed
# cases within -0.4 / +0 % of snap 0. Sweep run 15 (2026-11-29 19:34 UTC, --sweep-set run15,
# benchmarks/results/decode_attention_sweep_run15.md): the whole-segment plan ('-wbN': op.plan(whole_below=N), short
# segments never split, each region of one class over its proportional number of programs, gated at
# op.WHOLE_GATE) at seg_cost 2 / 4 / 6 against the gated snap 25 (first, and again last) and the snap at seg_cost 4:
# whole_below 100 at seg_cost 2 made 64/8 1 x 128K + 31 x 4K 3 % faster (254.0 -> 246.3 us) and left the other
# cases within the default's spread, the bf16 default with >= 8 KV heads since; larger seg_cost no faster. On 8/1
# the shipped plan is snap 0, which gated snap 25 and whole_below 100 reproduce on the three 8/1 cases swept.
SWEEP_CONFIGS = [
    (64, 2, 3, 4, "nested-desc-w-pc32-s2-pdl-wb100"),  # bf16 default with >= 8 KV heads since run 15
    (64, 2, 3, 4, "nested-desc-w-pc32-s2-pdl-sn25"),  # ... from run 12 to 15 (gated snap)
    (64, 2, 3, 4, "nested-desc-w-pc32-s4-pdl-wb100"),
    (64, 2, 3, 4, "nested-desc-w-pc32-s6-pdl-wb100"),
    (64, 2, 3, 4, "nested-desc-w-pc32-s4-pdl-sn25"),
]
SWEEP_CONFIGS_FP8 = [
    (32, 7, 3, 1, "nested-desc-w-pc32-s4-f16-ws-pdl"),  # fp8 default at >= 8 KV heads, sweep run 10 to fp8t
]


def whole_segments(entry: tuple, seg_cost: int, whole_below: int = 100) -> tuple:
    """Sweep entry ``entry`` with the whole-segment plan ('-wbN') at ``seg_cost`` ('-sN') instead of its own."""
    loop, *flags = entry[4].split("-")
    flags = [f for f in flags if not (f[:1] == "s" and f[1:].isdigit()) and f[:2] not in ("sn", "wb")]
    return (*entry[:4], "-".join([loop, *flags, f"s{seg_cost}", f"wb{whole_below}"]))


# sweep run 15: the whole-segment plan at seg_cost 2 / 4 / 6 in the fp8 default's launch form
SWEEP_CONFIGS_FP8 += [whole_segments(SWEEP_CONFIGS_FP8[0], c) for c in (2, 4, 6)]
SWEEP_CASES = [(name, 64, 8, "bf16") for name in CASES] + [
    ("64 x 4K", 8, 1, "bf16"),
    ("1 x 128K", 8, 1, "bf16"),
    ("32 x 128 + 32 x 4K", 8, 1, "bf16"),
    ("64 x 4K", 64, 8, "fp8"),
    ("32 x 128 + 32 x 4K", 64, 8, "fp8"),
    ("1 x 128K + 31 x 4K", 64, 8, "fp8"),
]
# A configuration whose output differs from the float64 reference by more than this (relative Frobenius
# norm; the tests' tolerances) is reported as failed and never chosen.
SWEEP_TOL = {"bf16": 5e-3, "fp8": 2e-2}
# Named sweeps (bench_decode_attention.py --sweep-set NAME): keyword arguments of sweep().
# 'fp8t': the transposed fp8 kernel (kernel_transposed.py, '-tr': tokens on wgmma's M side, 4 warps x 64
# tokens) against the fp8 64/8 default (timed first and again last) on the 8 fp8 64/8 cases and 2 fp8 8/1
# ones: programs per SM 2 (no register cap) / 3 / 4 (op caps registers at 168 / 128 so they fit), 4, 3 or 2
# stages, seg_cost 4 or 2 (page 64 holds tiles of at most 64 tokens). Offline sm_90a per warp and 64-token
# tile (kernel TUNING_LOG.md, "What limits it"): 373-389 SASS instructions, 5 barriers, 16 wgmma; spills only outside the
# loop at 168 registers, inside it at 128.
_FP8T = "nested-desc-w-pc32-s4-f16-pdl-tr"
# the shipped defaults with fewer than op.MANY_KV_HEADS KV heads (op.TUNED_BY_KV_DTYPE), as sweep entries; _FP8_8_1 is
# fp8's nested-loop form, shipped for 8/1 until sweep t2 (since then op.TUNED_FEW_KV_HEADS: transposed, 2 programs/SM)
_BF16_8_1 = (64, 2, 3, 4, "nested-desc-w-pc32-s2-pdl")
_FP8_8_1 = (64, 3, 3, 4, "nested-desc-w-pc32-s4-f16-pdl")
_T2_BF16 = ((2, 3), (3, 2))  # (programs per SM, stages) of the transposed bf16 candidates
SWEEP_SETS = {
    "fp8t": dict(
        cases=[(name, 64, 8, "fp8") for name in CASES]
        + [("64 x 4K", 8, 1, "fp8"), ("32 x 128 + 32 x 4K", 8, 1, "fp8")],
        configs=[],
        fp8_configs=[
            SWEEP_CONFIGS_FP8[0],
            (64, 2, 3, 4, _FP8T),
            (64, 2, 4, 4, _FP8T),
            (64, 3, 3, 4, _FP8T),
            (64, 3, 2, 4, _FP8T),
            (64, 3, 3, 4, _FP8T.replace("-s4-", "-s2-")),
            (64, 4, 2, 4, _FP8T),
            (64, 4, 3, 4, _FP8T),
        ],
    ),
    # 'run15' (issue 5): the default sweep's cases and bf16 configs; fp8 64/8 in the transposed default's form
    # (op.TUNED_MANY_KV_HEADS since sweep fp8t) first and again last, against its whole-segment plan at
    # seg_cost 2 / 4 / 6
    "run15": dict(
        configs=SWEEP_CONFIGS,
        fp8_configs=[(64, 3, 3, 4, _FP8T)] + [whole_segments((64, 3, 3, 4, _FP8T), c) for c in (2, 4, 6)],
    ),
    # 't2' (issue 5): the transposed kernel on 16-bit KV and on fp8 8/1, against each head count's shipped default
    # (first, and again last) on the 8 bf16 64/8, 8 bf16 8/1 and 8 fp8 8/1 cases. Offline sm_90a, bf16 tile 64,
    # 4 warps: both products wgmma with every operand in shared memory (K straight from its async-copy buffer,
    # Vᵀ as a transposed descriptor, no register staging); per warp and tile 402 SASS instructions, 6 barriers,
    # 16 wgmma (the plain loop at its default: 478, 9, 32 mma.sync + 28 ldmatrix); num_stages K/V buffers of
    # 32 KB: 3 stages 104 KB and 252 registers (2 programs/SM), 2 stages 72 KB capped at 168 registers (3/SM,
    # 424 instructions, spills outside the loop only); 4 stages 137 KB (1/SM, not swept). fp8 8/1: 2 programs/SM
    # (sweep fp8t's best 8/1 form), 3 (the 64/8 default's) at 3 and 4 stages (72 KB, spill-free loop at 168).
    "t2": dict(
        cases=[(name, hq, hkv, "bf16") for hq, hkv in ((64, 8), (8, 1)) for name in CASES]
        + [(name, 8, 1, "fp8") for name in CASES],
        configs_by_heads={
            ("bf16", "64/8"): [SWEEP_CONFIGS[0]]
            + [(64, c, s, 4, SWEEP_CONFIGS[0][4] + "-tr") for c, s in _T2_BF16],
            ("bf16", "8/1"): [_BF16_8_1] + [(64, c, s, 4, _BF16_8_1[4] + "-tr") for c, s in _T2_BF16],
            ("fp8", "8/1"): [_FP8_8_1]
            + [(64, c, s, 4, _FP8_8_1[4] + "-tr") for c, s in ((2, 3), (3, 3), (3, 4))],
        },
    ),
    # 'mip' (issue 5): split segments of at most N programs merged inside the attention pass ('-mipN':
    # op.plan(merge_in_pass=N), the last participant to arrive merges) against each head count's shipped bf16
    # default (first, and again last) on the 8 bf16 64/8 and 8 bf16 8/1 cases
    "mip": dict(
        cases=[(name, hq, hkv, "bf16") for hq, hkv in ((64, 8), (8, 1)) for name in CASES],
        configs_by_heads={
            ("bf16", "64/8"): [SWEEP_CONFIGS[0]]
            + [(*SWEEP_CONFIGS[0][:4], f"{SWEEP_CONFIGS[0][4]}-mip{n}") for n in (2, 4, 16)],
            ("bf16", "8/1"): [_BF16_8_1] + [(*_BF16_8_1[:4], f"{_BF16_8_1[4]}-mip{n}") for n in (2, 4, 16)],
        },
    ),
}


# 'fp8w' (issue 5): the transposed fp8 kernel over 128-token tiles (two pages of 64), one cross-warp max per 128
# tokens, against each head count's shipped default (first, and again last) on the 8 fp8 64/8 cases and 2 fp8 8/1:
# 8 warps (two warpgroups, each an m64 half of Sᵀ and of Oᵀ; registers capped at 128 for 2 programs/SM) and
# 4 warps (each tile as two m64 products, kernel_transposed._attend_t's HALVES; 255 registers, 2 programs/SM), at
# 3 / 2 stages, seg_cost 4 / 2 (a segment start in 128-token tiles). Offline sm_90a per program and token (TUNING_LOG.md,
# "What limits it"): the 64-token default 24.3 warp-instructions and 0.078 barriers, 8 warps x 128 25.6 (3 stages) /
# 24.4 (2) and 0.039, 4 warps x 128 20.0 and 0.055; no spill in any loop.
_FP8W_64_8 = [(64, 3, 3, 4, _FP8T)] + [(128, 2, s, w, _FP8T) for w in (8, 4) for s in (3, 2)]
_FP8W_64_8 += [(128, 2, 3, w, _FP8T.replace("-s4-", "-s2-")) for w in (8, 4)]
SWEEP_SETS["fp8w"] = dict(
    cases=[(name, 64, 8, "fp8") for name in CASES]
    + [("64 x 4K", 8, 1, "fp8"), ("32 x 128 + 32 x 4K", 8, 1, "fp8")],
    configs_by_heads={
        ("fp8", "64/8"): _FP8W_64_8,
        ("fp8", "8/1"): [(64, 2, 3, 4, _FP8T)] + [(128, 2, s, w, _FP8T) for w, s in ((8, 3), (8, 2), (4, 3))],
    },
)


# Sweep flags that set an op.py module constant for the calls of one entry instead of a plan argument (the merge
# launch's build: kernel.merge_kernel's register cap, partials per wide step, columns per wide program): flag
# prefix -> (row / config key, op.py constant). '-mr0': the merge launch uncapped (ptxas's choice).
OP_CONSTANT_FLAGS = {
    "mr": ("merge_maxnreg", "MERGE_MAXNREG"),
    "wp": ("wide_merge_block", "WIDE_MERGE_BLOCK"),
    "wc": ("wide_merge_cols", "WIDE_MERGE_COLS"),
    # '-mh0' / '-mh1': the merge programs' planner loads after / before their griddepcontrol.wait (op.MERGE_HOIST, 1 by default)
    "mh": ("merge_hoist", "MERGE_HOIST"),
}
OP_CONSTANT_KEYS = {key: const for key, const in OP_CONSTANT_FLAGS.values()}


def _constant_flag(flag: str) -> str | None:
    """The OP_CONSTANT_FLAGS prefix of a variant flag ('mr0' -> 'mr'), or None."""
    head, digits = flag[:2], flag[2:]
    return head if head in OP_CONSTANT_FLAGS and digits.isdigit() else None


def variant_constants(variant: str) -> dict:
    """The op.py constants a sweep variant sets ('-mrN', '-wpN', '-wcN', '-mhN'), as {config key: value}; {} for
    none."""
    _, *flags = variant.split("-")
    return {OP_CONSTANT_FLAGS[f[:2]][0]: int(f[2:]) for f in flags if _constant_flag(f)}


@contextmanager
def swapped(obj, **attrs):
    """``obj``'s attributes set to ``attrs`` inside the block, restored after it (also on an exception)."""
    old = {name: getattr(obj, name) for name in attrs}
    try:
        for name, value in attrs.items():
            setattr(obj, name, value)
        yield obj
    finally:
        for name, value in old.items():
            setattr(obj, name, value)


def load_package(path: str):
    """The op module of another copy of the decode_attention package at ``path`` (its own kernel modules alongside),
    for timing it beside this checkout's in one process (benchmarks/plan_time_decode_attention.py, the merge A/B)."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    pkg = Path(path)
    spec = importlib.util.spec_from_file_location(
        "decode_attention_before", pkg / "__init__.py", submodule_search_locations=[str(pkg)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(spec.name + ".op")


def op_constants(values: dict):
    """Context setting op.py's constants from {OP_CONSTANT_KEYS key: value} (None values: left as they are)."""
    from hpc_advise.kernels.decode_attention import op

    unknown = set(values) - set(OP_CONSTANT_KEYS)
    if unknown:
        raise ValueError(f"unknown op.py constant keys {sorted(unknown)}; known: {sorted(OP_CONSTANT_KEYS)}")
    return swapped(op, **{OP_CONSTANT_KEYS[k]: v for k, v in values.items() if v is not None})


# 'split' (issue 5, after `--split`: where bf16 8/1's time between our call and its stream floor goes): each head
# count's shipped bf16 default (first, and again last) on the 8 bf16 8/1 and 8 bf16 64/8 cases against the merge
# launch uncapped ('-mr0', ptxas's 96 registers, 10 programs/SM instead of 64 and 16), with 16 columns per wide
# program (half as many wide programs; uncapped, as 16 columns spill at 64) and with 256 partials per wide step
# (1 x 128K's 264 partials in 2 steps instead of 3; uncapped); on 8/1 also the pass at 3 programs per SM and at
# 32-token tiles x 4 programs per SM (the grid and tile chosen before the one-launch merge existed).
# the shipped bf16 default with >= 8 KV heads
_BF16_64_8 = (64, 2, 3, 4, "nested-desc-w-pc32-s2-pdl-wb100-mip32")
_SPLIT_MERGE = ("-mr0", "-wc16-mr0", "-wp256-mr0")
SWEEP_SETS["split"] = dict(
    cases=[(name, hq, hkv, "bf16") for hq, hkv in ((8, 1), (64, 8)) for name in CASES],
    configs_by_heads={
        ("bf16", "8/1"): [_BF16_8_1]
        + [(*_BF16_8_1[:4], _BF16_8_1[4] + m) for m in _SPLIT_MERGE]
        + [(64, 3, 3, 4, _BF16_8_1[4]), (32, 4, 3, 4, _BF16_8_1[4])],
        ("bf16", "64/8"): [_BF16_64_8] + [(*_BF16_64_8[:4], _BF16_64_8[4] + m) for m in _SPLIT_MERGE],
    },
)

# 'mprol' (issue 5, after sweep split put bf16 8/1's miss in the merge launch): each head count's shipped default
# (first, and again last; since the lead's call of 2026-11-30 ~03:02 UTC the merge's planner loads before
# griddepcontrol.wait, op.MERGE_HOIST 1) against the same with the pre-mprol merge ('-mh0': the wait first, then each
# step's slots, then its partials), on the 8 bf16 8/1, 8 bf16 64/8 and 8 fp8 64/8 cases (the merge launch is shared
# by both kernels). On bf16 8/1, where the rule is read (>= 2 % in geometric mean), each form twice, alternating:
# default, -mh0, default, -mh0, default. (Sweep mprol and the lead's call ran it with MERGE_HOIST 0 the default and
# '-mh1' the candidate; TUNING_LOG.md, "Sweep mprol".)
_FP8_64_8 = (64, 3, 3, 4, _FP8T)
SWEEP_SETS["mprol"] = dict(
    cases=[
        (name, hq, hkv, kv)
        for kv, hq, hkv in (("bf16", 8, 1), ("bf16", 64, 8), ("fp8", 64, 8))
        for name in CASES
    ],
    configs_by_heads={
        (kv, heads): [entry, (*entry[:4], entry[4] + "-mh0")] * (2 if heads == "8/1" else 1)
        for kv, heads, entry in (
            ("bf16", "8/1", _BF16_8_1),
            ("bf16", "64/8", _BF16_64_8),
            ("fp8", "64/8", _FP8_64_8),
        )
    },
)


def variant_config(tile: int, ctas: int, stages: int, warps: int, variant: str) -> dict:
    """op.plan keyword arguments of one sweep entry (flags of op.py constants, OP_CONSTANT_FLAGS, are accepted and
    left to ``variant_constants``)."""
    loop, *flags = variant.split("-")
    consts = [f for f in flags if _constant_flag(f)]
    merge = [f for f in flags if f[:1] == "m" and f[1:].isdigit()]
    chunk = [f for f in flags if f[:2] == "pc" and f[2:].isdigit()]
    cost = [f for f in flags if f[:1] == "s" and f[1:].isdigit()]
    snap = [f for f in flags if f[:2] == "sn" and f[2:].isdigit()]
    whole = [f for f in flags if f[:2] == "wb" and f[2:].isdigit()]  # '-wbN': op.plan(whole_below=N)
    mip = [f for f in flags if f[:3] == "mip" and f[3:].isdigit()]  # '-mipN': op.plan(merge_in_pass=N)
    known = (
        {"desc", "prefetch", "w", "f16", "pdl", "ws", "tr"} | set(merge) | set(chunk) | set(cost) | set(snap)
    )
    known |= set(whole) | set(mip) | set(consts)
    unknown = set(flags) - known
    repeated = [g for g in (merge, chunk, cost, snap, whole, mip) if len(g) > 1]
    repeated += [[f for f in consts if f[:2] == h] for h in {f[:2] for f in consts}]
    repeated = [g for g in repeated if len(g) > 1]
    if unknown or repeated:
        raise ValueError(f"unknown variant flags {sorted(unknown) or sum(repeated, [])} in {variant!r}")
    return dict(
        tile=tile,
        ctas_per_sm=ctas,
        num_stages=stages,
        num_warps=warps,
        loop=loop,
        prefetch="prefetch" in flags,
        desc="desc" in flags,
        merge_block=int(merge[0][1:]) if merge else 16,
        pt_chunk=int(chunk[0][2:]) if chunk else 0,
        wide_merge="w" in flags,
        seg_cost=int(cost[0][1:]) if cost else 0,
        f16_dot="f16" in flags,
        pdl="pdl" in flags,
        warp_split="ws" in flags,
        snap=int(snap[0][2:]) if snap else 0,
        whole_below=int(whole[0][2:]) if whole else 0,
        # '-tr': op.plan(transposed=True), kernel_transposed.py. Always explicit: an entry without it must run
        # the nested loop's kernel, not whatever op.TUNED_* picks now (fp8 defaults to the transposed kernel)
        transposed="tr" in flags,
        merge_in_pass=int(mip[0][3:]) if mip else 0,
    )


def case_lengths(name: str, seed: int = 0) -> list[int]:
    """Lengths of a case; log-uniform draws come from a fixed seed so every provider sees the same."""
    import random

    rng = random.Random(seed)
    lens: list[int] = []
    for count, length in CASES[name]:
        for _ in range(count):
            lens.append(int(math.exp(rng.uniform(math.log(1024), math.log(32768)))) if length < 0 else length)
    return lens


COPY_SIZES = (1 << 30, 2 << 30)  # bytes per buffer, each far over L2


def copy_ceiling_tbps(sizes=COPY_SIZES) -> float:
    """The copy ceiling of the table, TB/s of bytes read + written: ``microbench.copy_ceiling`` (an elementwise
    copy kernel in a CUDA graph) over buffers far over L2. (Until 2026-11-30 it was a graph-captured ``copy_``,
    the copy engines' 2.72-2.77 TB/s, so 'of copy' read up to 157 %.)"""
    from hpc_advise.runtime.measure.microbench import copy_ceiling

    return copy_ceiling(sizes)[0]


class Workload:
    """One case on the GPU: a KV pool, R rotations of (page table, lengths), q."""

    def __init__(self, lens: list[int], hq: int, hkv: int, kv_dtype, seed: int = 0):
        import torch

        self.lens, self.hq, self.hkv, self.kv_dtype = lens, hq, hkv, kv_dtype
        elem = 1 if kv_dtype == torch.float8_e4m3fn else 2
        self.kv_bytes = 2 * sum(lens) * hkv * HEAD_DIM * elem  # K and V, each token read once
        self.rotations = max(1, min(MAX_ROTATIONS, math.ceil(ROTATE_BYTES / self.kv_bytes)))
        gen = torch.Generator(device="cuda").manual_seed(seed)
        need = [math.ceil(n / PAGE) for n in lens]
        self.max_pages = max(need)
        pool_pages = sum(need) * self.rotations + 16
        shape = (pool_pages, PAGE, hkv, HEAD_DIM)
        self.k = torch.randn(shape, device="cuda", generator=gen).to(kv_dtype)
        self.v = torch.randn(shape, device="cuda", generator=gen).to(kv_dtype)
        perm = torch.randperm(pool_pages, device="cuda", generator=gen).int()
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        self.tables, self.indices = [], []
        cols = torch.arange(self.max_pages, device="cuda")
        used = cols[None, :] < torch.tensor(need, device="cuda")[:, None]
        offset = 0
        for _ in range(self.rotations):
            flat = perm[offset : offset + sum(need)]
            offset += sum(need)
            table = torch.zeros(len(lens), self.max_pages, dtype=torch.int32, device="cuda")
            table[used] = flat
            self.tables.append(table)
            self.indices.append(flat)
        self.indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device="cuda")
        self.indptr[1:] = torch.cumsum(torch.tensor(need, device="cuda"), 0)
        self.last_page_len = (self.seq_lens - 1) % PAGE + 1
        self.q = torch.randn(len(lens), hq, HEAD_DIM, device="cuda", generator=gen).bfloat16()

    def floor_us(self, copy_tbps: float) -> float:
        return self.kv_bytes / (copy_tbps * 1e12) * 1e6


def _time(calls: list[Callable[[], object]]) -> tuple[Timing, str]:
    """Graph replay of all rotations (a multiple of them per graph); eager launches if capture fails."""
    inner = len(calls) * max(1, 8 // len(calls))
    try:
        return time_cuda(rotating(calls, lambda call: call()), graph=True, inner=inner, reps=20), "graph"
    except Exception:
        import torch

        torch.cuda.synchronize()
        return time_cuda(rotating(calls, lambda call: call()), graph=False, inner=inner, reps=20), "eager"


def _ours(w: Workload, schedule: str, **cfg):
    """Our plans over the workload's rotations and one call per rotation; ``cfg``: op.plan keywords, plus
    op.py constants (OP_CONSTANT_KEYS) set around plan and each call (so also while a graph captures it)."""
    from hpc_advise.kernels.decode_attention import op

    consts = {k: cfg.pop(k) for k in list(cfg) if k in OP_CONSTANT_KEYS}
    with op_constants(consts):
        plans = _plans(w, schedule, cfg)
    out = [w.q.new_empty(w.q.shape) for _ in plans]

    def call(p, o):
        with op_constants(consts):
            return op.run(p, w.q, w.k, w.v, out=o)

    calls = [lambda p=p, o=o: call(p, o) for p, o in zip(plans, out, strict=True)]
    return calls, plans, out


def _plans(w: Workload, schedule: str, cfg: dict) -> list:
    from hpc_advise.kernels.decode_attention import op

    return [
        op.plan(
            w.seq_lens,
            t,
            page_size=PAGE,
            num_q_heads=w.hq,
            num_kv_heads=w.hkv,
            head_dim=HEAD_DIM,
            schedule=schedule,
            kv_dtype=w.kv_dtype,
            **cfg,
        )
        for t in w.tables
    ]


def _fi_batch_attention(w: Workload):
    import flashinfer
    import torch

    calls, outs = [], []
    qo_indptr = torch.arange(len(w.lens) + 1, dtype=torch.int32, device="cuda")
    for idx in w.indices:
        wrapper = flashinfer.BatchAttention(kv_layout="NHD")
        wrapper.plan(
            qo_indptr,
            w.indptr,
            idx,
            w.seq_lens,
            w.hq,
            w.hkv,
            HEAD_DIM,
            HEAD_DIM,
            PAGE,
            causal=False,
            q_data_type=torch.bfloat16,
            kv_data_type=w.kv_dtype,
        )
        o = w.q.new_empty(w.q.shape)
        lse = torch.empty(w.q.shape[:2], dtype=torch.float32, device="cuda")
        outs.append(o)
        calls.append(lambda wr=wrapper, o=o, lse=lse: wr.run(w.q, (w.k, w.v), out=o, lse=lse))
    return calls, outs


def _fi_decode_tc(w: Workload):
    import flashinfer
    import torch

    calls, outs = [], []
    for idx in w.indices:
        ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        wrapper.plan(
            w.indptr,
            idx,
            w.last_page_len,
            w.hq,
            w.hkv,
            HEAD_DIM,
            PAGE,
            q_data_type=torch.bfloat16,
            kv_data_type=w.kv_dtype,
        )
        o = w.q.new_empty(w.q.shape)
        outs.append(o)
        calls.append(lambda wr=wrapper, o=o, keep=ws: wr.run(w.q, (w.k, w.v), out=o))
    return calls, outs


def _torch_fa2(w: Workload):
    import torch

    if w.kv_dtype != torch.bfloat16:
        raise NotImplementedError("FA2 in torch takes bf16/fp16 KV only")
    b = len(w.lens)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    cu_k = torch.zeros(b + 1, dtype=torch.int32, device="cuda")
    cu_k[1:] = torch.cumsum(w.seq_lens, 0)
    tok = torch.cat([torch.arange(n, device="cuda") for n in w.lens])
    req = torch.repeat_interleave(torch.arange(b, device="cuda"), w.seq_lens.long())
    calls, outs = [], []
    max_k = max(w.lens)
    for table in w.tables:
        pages = table[req, tok // PAGE].long()
        k = w.k[pages, tok % PAGE].contiguous()  # [total, Hkv, D], this rotation's tokens, contiguous
        v = w.v[pages, tok % PAGE].contiguous()
        holder: dict = {}

        def call(k=k, v=v, holder=holder):
            holder["out"] = torch.ops.aten._flash_attention_forward(
                w.q, k, v, cu_q, cu_k, 1, max_k, 0.0, False, False
            )[0]
            return holder["out"]

        calls.append(call)
        outs.append(holder)
    return calls, outs


PEER_BUILDERS = {
    "fi_batch_attention": _fi_batch_attention,
    "fi_decode_tc": _fi_decode_tc,
    "torch_fa2": _torch_fa2,
}


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _dtype_name(dt) -> str:
    return "fp8" if "float8" in str(dt) else "bf16"


def _progress(name: str, hq: int, hkv: int, who: str, us: float) -> None:
    """One line per timed provider (a grid that stalls shows where: run 15's grids ended at their limits
    without a line of output)."""
    print(f"grid {time.strftime('%H:%M:%S')} {name} {hq}/{hkv} {who}: {us:.1f} us", flush=True)


def bench_case(
    name: str,
    hq: int,
    hkv: int,
    kv_dtype,
    copy_tbps: float,
    peers=PEERS,
    env=None,
    floor=False,
    split=False,
    **cfg,
):
    """Rows and one table line for one case; ``floor``: the stream floor of our plans beside ours
    (decode_attention_floor.py), its columns last; ``split``: that, then our pass and our merge launch timed
    apart (its columns after the floor's)."""
    import torch

    env = env or environment()
    w = Workload(case_lengths(name), hq, hkv, kv_dtype)
    base = {
        "case": name,
        "num_q_heads": hq,
        "num_kv_heads": hkv,
        "head_dim": HEAD_DIM,
        "page_size": PAGE,
        "kv_dtype": _dtype_name(kv_dtype),
        "batch": len(w.lens),
        "kv_bytes": w.kv_bytes,
        "rotations": w.rotations,
        **{f"cfg_{k}": v for k, v in cfg.items()},
    }
    rows = []
    calls, plans, outs = _ours(w, "dynamic", **cfg)
    t_ours, how = _time(calls)
    _progress(name, hq, hkv, "ours", t_ours.p50)
    rows.append(
        run_row(
            kind="kernel",
            subject="decode_attention",
            provider="hpc_advise_dynamic",
            config=base | {"timing": how, "tbps": w.kv_bytes / t_ours.p50 / 1e6},
            metric="latency",
            unit="us",
            timing=t_ours,
            env=env,
        )
    )
    floor_cells = []
    if floor or split:
        from hpc_advise.runtime.benches import decode_attention_floor

        consts = {k: cfg[k] for k in OP_CONSTANT_KEYS if cfg.get(k) is not None}
        floor_rows, floor_cells = decode_attention_floor.bench_cells(
            w, plans, calls, t_ours, _time, base, env, split=split, consts=consts
        )
        rows += floor_rows
        _progress(name, hq, hkv, "stream floor (+ tail)", floor_rows[0]["p50"])
    calls[0]()
    torch.cuda.synchronize()
    ours_out = outs[0].clone()
    plan_graph, _ = _time([lambda: plans[0].update(w.seq_lens, w.tables[0], validate=False)])
    plan_eager = time_cuda(
        lambda: plans[0].update(w.seq_lens, w.tables[0], validate=False), graph=False, reps=10
    )
    rows.append(
        run_row(
            kind="kernel",
            subject="decode_attention.plan",
            provider="hpc_advise_dynamic",
            config=base | {"timing": "graph", "eager_us": plan_eager.p50},
            metric="latency",
            unit="us",
            timing=plan_graph,
            env=env,
        )
    )
    results: dict[str, object] = {}
    for peer in peers:
        try:
            if peer == "static":
                pc, _, po = _ours(w, "static", **{k: v for k, v in cfg.items() if k != "ctas_per_sm"})
            else:
                pc, po = PEER_BUILDERS[peer](w)
            t, how = _time(pc)
            pc[0]()
            torch.cuda.synchronize()
            o = po[0]["out"] if isinstance(po[0], dict) else po[0]
            diff = _rel(o, ours_out)
            results[peer] = t
            _progress(name, hq, hkv, peer, t.p50)
            rows.append(
                run_row(
                    kind="kernel",
                    subject="decode_attention",
                    provider=peer,
                    config=base | {"timing": how, "rel_diff_vs_ours": diff, "tbps": w.kv_bytes / t.p50 / 1e6},
                    metric="latency",
                    unit="us",
                    timing=t,
                    env=env,
                )
            )
            del pc, po
        except Exception as e:  # a peer that cannot run here: say why, keep going
            results[peer] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            torch.cuda.synchronize()
    tbps = w.kv_bytes / t_ours.p50 / 1e6
    line = [
        name,
        f"{hq}/{hkv}",
        _dtype_name(kv_dtype),
        round(w.kv_bytes / 1e6, 1),
        round(w.floor_us(copy_tbps), 1),
        round(t_ours.p50, 1),
        round(tbps, 2),
        f"{100 * tbps / copy_tbps:.0f}%",
    ]
    for peer in peers:
        r = results.get(peer)
        line.append(round(r.p50, 1) if isinstance(r, Timing) else "n/a")
    for peer in peers:
        r = results.get(peer)
        line.append(f"{r.p50 / t_ours.p50:.2f}x" if isinstance(r, Timing) else "")
    line.append(round(plan_graph.p50, 1))
    line += floor_cells
    failures = {p: r for p, r in results.items() if isinstance(r, str)}
    return rows, line, failures


def headers(peers=PEERS, floor=False, split=False) -> list[str]:
    cols = (
        ["case", "Hq/Hkv", "KV", "KV MB", "floor µs", "ours µs", "TB/s", "of copy"]
        + [f"{PEER_TITLES[p]} µs" for p in peers]
        + [f"vs {PEER_TITLES[p]}" for p in peers]
        + ["plan µs"]
    )
    if floor or split:  # the stream floor's columns, then the split's (its module imports triton)
        from hpc_advise.runtime.benches.decode_attention_floor import HEADERS, SPLIT_HEADERS

        cols += HEADERS + (SPLIT_HEADERS if split else [])
    return cols


KV_DTYPES = ("bf16", "fp8")


def bench(
    grid: str = "full",
    peers: bool = True,
    *,
    peer_list=PEERS,
    progress=None,
    fp8_cfg=None,
    kv="all",
    heads="all",
    cfg_by_heads=None,
    floor=False,
    split=False,
    cases=None,
    **cfg,
):
    """Run the grid; returns (rows, table, headers). ``kv`` ('all', or KV dtypes in the order to run them:
    'fp8', 'fp8,bf16', ...) picks the KV dtypes of the full grid, ``heads`` ('all' or 'Hq/Hkv' of HEADS, e.g. '64/8') its head counts. ``peers=False`` times ours only (and static);
    ``progress(rows, table, headers)`` is called after each case with everything so far; ``cfg`` overrides op.py's launch defaults (``fp8_cfg``
    instead for fp8 KV when given, and ``cfg_by_heads[(kv, 'Hq/Hkv')]`` instead of both where it has the case's
    KV dtype name and head count). ``floor``: the stream floor of our plans beside ours in every case
    (decode_attention_floor.py); ``split``: that and our pass / merge launch timed apart. ``cases``: names of
    CASES to run (the full grid's order kept), None for all."""
    import torch

    if grid not in ("full", "small"):
        raise ValueError(f"grid must be 'full' or 'small', got {grid!r}")
    if heads != "all" and heads not in {f"{hq}/{hkv}" for hq, hkv in HEADS}:
        raise ValueError(
            f"heads must be 'all' or one of {[f'{hq}/{hkv}' for hq, hkv in HEADS]}, got {heads!r}"
        )
    unknown = sorted(set(cases or ()) - set(CASES))
    if unknown:
        raise ValueError(f"unknown cases {unknown}; known: {list(CASES)}")
    kv_order = list(KV_DTYPES) if kv == "all" else kv.split(",")
    if not kv_order or any(k not in KV_DTYPES for k in kv_order) or len(set(kv_order)) < len(kv_order):
        raise ValueError(f"kv must be 'all' or a comma-separated order of {KV_DTYPES}, got {kv!r}")
    chosen = tuple(peer_list) if peers else ("static",)
    env = environment()
    copy = copy_ceiling_tbps()
    rows = [
        run_row(
            kind="microbench",
            subject="copy_bandwidth",
            provider="torch.mul(x, 1, out=)",
            config={"bytes_tried": list(COPY_SIZES), "method": "kernel", "cuda_graph": True},  # the best kept
            metric="bandwidth",
            unit="TB/s",
            value=copy,
            env=env,
        )
    ]
    if grid == "small":
        todo = [(n, hq, hkv, torch.bfloat16) for n, hq, hkv in SMALL]
    else:
        todo = [
            (n, hq, hkv, dt)
            for dt in (torch.float8_e4m3fn if k == "fp8" else torch.bfloat16 for k in kv_order)
            for hq, hkv in HEADS
            if heads in ("all", f"{hq}/{hkv}")
            for n in CASES
            if cases is None or n in cases
        ]
    table, failures = [], {}
    bench.copy_tbps, bench.failures = copy, failures
    for name, hq, hkv, dt in todo:
        use = fp8_cfg if (fp8_cfg is not None and dt == torch.float8_e4m3fn) else cfg
        use = (cfg_by_heads or {}).get((_dtype_name(dt), f"{hq}/{hkv}"), use)
        r, line, fail = bench_case(
            name, hq, hkv, dt, copy, peers=chosen, env=env, floor=floor, split=split, **use
        )
        rows += r
        table.append(line)
        if progress:
            progress(rows, table, headers(chosen, floor, split))
        torch.cuda.empty_cache()
        for p, why in fail.items():
            failures.setdefault(p, why)
    return rows, table, headers(chosen, floor, split)


def sweep(configs=SWEEP_CONFIGS, cases=SWEEP_CASES, fp8_configs=SWEEP_CONFIGS_FP8, configs_by_heads=None):
    """Time the dynamic kernel under each launch configuration and check its output against the float64
    reference (rotation 0); returns (rows, table, headers). ``sweep.seconds`` holds the wall time.
    ``configs_by_heads[(kv, 'Hq/Hkv')]``, where given, replaces ``configs`` / ``fp8_configs`` for those cases."""
    import torch

    from hpc_advise.kernels.decode_attention.reference import decode_attention_reference

    t0 = time.time()
    env = environment()
    rows, table = [], []
    for name, hq, hkv, kv in cases:
        w = Workload(case_lengths(name), hq, hkv, torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16)
        # e4m3 -> bf16 is exact; the reference then gathers bf16 (no reliance on fp8 indexing kernels)
        kr, vr = (w.k.to(torch.bfloat16), w.v.to(torch.bfloat16)) if kv == "fp8" else (w.k, w.v)
        ref = decode_attention_reference(w.q, kr, vr, w.tables[0], w.seq_lens, page_size=PAGE)
        del kr, vr
        entries = (configs_by_heads or {}).get((kv, f"{hq}/{hkv}")) or (
            fp8_configs if kv == "fp8" else configs
        )
        entries = list(entries)
        # the first configuration once more at the end: the spread of one configuration within the process,
        # against which the differences between configurations are read (its row says repeat; never chosen)
        for i, entry in enumerate(entries + entries[:1]):
            cfg = variant_config(*entry) | variant_constants(entry[4])
            again = i == len(entries)
            if again:
                entry = (*entry[:4], entry[4] + " (again)")
            try:
                calls, plans, outs = _ours(w, "dynamic", **cfg)
                calls[0]()
                torch.cuda.synchronize()
            except Exception as exc:  # a candidate that does not build or launch here: say so, go on
                print(
                    f"sweep {time.time() - t0:5.1f}s",
                    name,
                    f"{hq}/{hkv}",
                    kv,
                    *entry,
                    "ERROR",
                    repr(exc)[:300],
                )
                table.append([name, f"{hq}/{hkv}", kv, *entry, "n/a", "ERROR " + type(exc).__name__])
                continue
            err = ((outs[0].double() - ref).norm() / ref.norm()).item()  # NaN compares False: fails
            ok = err <= SWEEP_TOL[kv]
            if i == 0:
                # a case's first timing, right after building its workload and float64 reference, read up to
                # 12 % slow in sweep run 10 (1 x 128K + 31 x 4K 64/8: 285.5 us, the same configuration at the
                # case's end 254.6): the first configuration is timed twice and the first timing dropped
                _time(calls)
            t, how = _time(calls)
            # the plan of one decode step (update replayed in a graph), and whether the gate kept the snapped /
            # whole-segment candidate (bounds[3, 0]; '-' where the plan has none)
            plan_t, _ = _time([lambda p=plans[0], w=w: p.update(w.seq_lens, w.tables[0], validate=False)])
            kept = int(plans[0].bounds[3, 0]) if cfg.get("snap") or cfg.get("whole_below") else "-"
            rows.append(
                run_row(
                    kind="kernel",
                    subject="decode_attention.sweep",
                    provider="hpc_advise_dynamic",
                    config={
                        "case": name,
                        "num_q_heads": hq,
                        "num_kv_heads": hkv,
                        "kv_dtype": kv,
                        "timing": how,
                        "rel_err": err,
                        "ok": ok,
                        "plan_us": plan_t.p50,
                        "plan_kept": kept,
                        **cfg,
                        **({"repeat": True} if again else {}),
                        **({"first": True} if i == 0 else {}),
                    },
                    metric="latency",
                    unit="us",
                    timing=t,
                    env=env,
                )
            )
            table.append(
                [name, f"{hq}/{hkv}", kv, *entry, round(t.p50, 1), f"{err:.1e}" + ("" if ok else " FAIL")]
                + [round(plan_t.p50, 1), kept]
            )
            print(f"sweep {time.time() - t0:5.1f}s", *table[-1], flush=True)  # progress if the run is cut
            del calls, plans, outs
        del w, ref
        torch.cuda.empty_cache()
    sweep.seconds = time.time() - t0
    return (
        rows,
        table,
        ["case", "Hq/Hkv", "KV", "tile", "CTAs/SM", "stages", "warps", "variant", "µs", "rel err"]
        + ["plan µs", "kept"],
    )


CONFIG_KEYS = (
    "tile",
    "ctas_per_sm",
    "num_stages",
    "num_warps",
    "loop",
    "prefetch",
    "desc",
    "merge_block",
    "pt_chunk",
    "wide_merge",
    "seg_cost",
    "f16_dot",
    "pdl",
    "warp_split",
    "snap",
    "whole_below",
    "transposed",
    "merge_in_pass",
    *OP_CONSTANT_KEYS,
)
# keys older sweeps' rows lack, with the value they ran with (None for op.py constants: op.py's value then)
OLD_SWEEP_DEFAULTS = {
    "desc": False,
    "merge_block": 16,
    "pt_chunk": 0,
    "wide_merge": False,
    "seg_cost": 0,
    "f16_dot": False,
    "pdl": False,
    "warp_split": False,
    "snap": 0,
    "whole_below": 0,
    "transposed": False,
    "merge_in_pass": 0,
} | dict.fromkeys(OP_CONSTANT_KEYS)


def defaults_note() -> str:
    """op.py's launch defaults and its measured variants per KV dtype, for a results table's notes."""
    from hpc_advise.kernels.decode_attention import op

    base = dict(
        tile=op.DEFAULT_TILE,
        ctas_per_sm=op.DEFAULT_CTAS_PER_SM,
        num_stages=op.DEFAULT_NUM_STAGES,
        num_warps=op.DEFAULT_NUM_WARPS,
        loop=op.DEFAULT_LOOP,
    )
    tuned = "; ".join(f"{_dtype_name(dt)} KV: {v}" for dt, v in op.TUNED_BY_KV_DTYPE.items() if dt != _fp16())
    many = "; ".join(f"{_dtype_name(dt)} KV: {v}" for dt, v in op.TUNED_MANY_KV_HEADS.items())
    return (
        f"op.py defaults {base}, per KV dtype (op.TUNED_BY_KV_DTYPE) {tuned}; with >= {op.MANY_KV_HEADS} KV "
        f"heads also (op.TUNED_MANY_KV_HEADS) {many}"
    )


def _fp16():
    import torch

    return torch.float16


def best_config(
    sweep_rows: list[dict], kv_dtype: str = "bf16", heads: str = "all", margin: float = 0.0
) -> dict:
    """The configuration with the lowest geometric mean of p50 over the swept cases of one KV dtype (and
    of one head count 'Hq/Hkv', unless ``heads`` is 'all'), among those timed on every such case and correct
    on all of them (rows without the 'ok' / 'desc' fields, from older sweeps, count as correct / with that
    field's old default). With ``margin`` (e.g. 0.02), the sweep's first configuration (the default it
    started from, rows marked 'first') stays unless the best is faster by more than that fraction."""
    logs: dict[tuple, list[float]] = {}
    failed: set[tuple] = set()
    first: set[tuple] = set()
    for r in sweep_rows:
        c = r["config"]
        if c.get("kv_dtype", "bf16") != kv_dtype:
            continue
        if heads != "all" and f"{c.get('num_q_heads')}/{c.get('num_kv_heads')}" != heads:
            continue
        if c.get("repeat"):  # a second timing of a configuration, for the spread only
            continue
        key = tuple(c[k] if k in c else OLD_SWEEP_DEFAULTS[k] for k in CONFIG_KEYS)
        logs.setdefault(key, []).append(math.log(r["p50"]))
        if not c.get("ok", True):
            failed.add(key)
        if c.get("first"):
            first.add(key)
    if not logs:
        raise RuntimeError(f"decode_attention sweep: no {kv_dtype} case with heads {heads} was swept")
    full = max(len(v) for v in logs.values())
    good = [k for k, v in logs.items() if len(v) == full and k not in failed]
    if not good:
        raise RuntimeError(f"decode_attention sweep: no configuration was correct on every {kv_dtype} case")
    best = min(good, key=lambda k: sum(logs[k]))
    default = next(iter(first), None) if len(first) == 1 else None
    if margin and default in good and sum(logs[default]) - sum(logs[best]) <= full * math.log1p(margin):
        best = default
    return dict(zip(CONFIG_KEYS, best, strict=True))


def warm_flashinfer() -> dict[str, str]:
    """JIT-compile the FlashInfer modules the benchmark uses (bf16 and fp8 KV); returns status per module."""
    import torch

    status = {}
    t0 = time.time()
    for dt in (torch.bfloat16, torch.float8_e4m3fn):
        w = Workload([300, 70], 8, 1, dt)
        w.indices, w.tables = w.indices[:1], w.tables[:1]
        for peer in ("fi_batch_attention", "fi_decode_tc"):
            try:
                calls, _ = PEER_BUILDERS[peer](w)
                calls[0]()
                torch.cuda.synchronize()
                status[f"{peer}/{_dtype_name(dt)}"] = f"ok ({time.time() - t0:.0f}s)"
            except Exception as e:
                status[f"{peer}/{_dtype_name(dt)}"] = f"{type(e).__name__}: {str(e)[:300]}"
        del w
    return status
