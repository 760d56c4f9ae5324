"""Launcher of paged decode attention: input checks, the plan (GPU buffers, schedule), run, convenience.

``plan(seq_lens, page_table, ...)`` returns a :class:`DecodePlan` that owns fixed-size GPU buffers (sized
from ``max_batch`` and the page-table width) and fills them with one Triton launch (two for ``loop='flat'``)
plus one copy of the page table; ``plan.update(seq_lens, page_table)`` refills them in place without a host sync, so a decode step's
``update`` + ``run`` calls can be captured in one CUDA graph and replayed with new lengths.
``run(plan, q, k_cache, v_cache, ...)`` launches the persistent attention pass, then the log-sum-exp merge
grid, whose programs without merge duty exit after their planner loads; with ``wide_merge`` the same launch
has more programs for segments split over many programs (the merge always launches, so a captured graph stays
valid whatever the lengths are).

Supported: q bf16 or fp16 ``[B, Hq, D]``; KV cache ``[num_pages, page_size, Hkv, D]`` of q's dtype or
float8_e4m3fn with per-tensor scales (python floats or 1-element fp32 tensors on the device); head_dim
64/128/256; GQA group Hq/Hkv 1-16; page size 1/16/64; batch 1-1024; lengths 1-262144. Anything else raises
``ValueError``/``TypeError`` with the reason.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from . import kernel as _k
from . import kernel_transposed as _kt

HEAD_DIMS = (64, 128, 256)
PAGE_SIZES = (1, 16, 64)
MAX_GROUP = 16
MAX_BATCH = 1024
MAX_SEQ_LEN = 256 * 1024
SCHEDULES = ("dynamic", "static")
MAX_STATIC_SPLITS = 64

# Launch configuration, chosen by measurement on an H200 (git show 41fb96b:hpc_advise/kernels/decode_attention/TUNING_LOG.md, "Tuning"): tokens per tile, programs
# per SM of the persistent grid, software-pipelining depth of the tile loop, warps per program.
DEFAULT_TILE = 64
DEFAULT_CTAS_PER_SM = 2
DEFAULT_NUM_STAGES = 3
DEFAULT_NUM_WARPS = 4
DEFAULT_PREFETCH = False
DEFAULT_DESC = False
# Partials the merge combines per step (per query row and 64 columns): a segment split over P programs
# takes ceil(P / block) dependent steps (a 128K request over a 264-program grid: 17 steps at 16, 3 at 128).
DEFAULT_MERGE_BLOCK = 16
MERGE_BLOCKS = (16, 32, 64, 128)
# Adaptive merge width: with ``wide_merge`` the merge launch's narrow programs combine merge_block partials
# per step only for segments with at most merge_block participants; its wide programs (per query row and 64
# columns: one per possible such segment, G // merge_block + 1, listed by the planner on the GPU, times 64 /
# WIDE_MERGE_COLS column slices) merge the others WIDE_MERGE_BLOCK at a time. Small splits keep the light
# merge, a 128K request over 264 programs takes 3 steps instead of 17. One launch since sweep merge1b (H200,
# 2026-11-30 00:24-00:26 UTC, benchmarks/results/decode_attention_sweep_merge1b.md, one process, the two
# launches chained by PDL first and again last): against them on the 32 tuned cases (bf16 / fp8, 8/1 / 64/8)
# -3.4 % in geometric mean, none > 1 % slower (worst bf16 64/8 1 x 128K 131.0 -> 132.1 us, the two launches'
# own repeat 131.3; their repeats moved up to 2 %); where a wide segment sits next to narrow ones the wide
# programs no longer wait for the narrow grid to complete (bf16 8/1 2 x 32K + 30 x 4K 37.5 -> 34.5, 1 x 64K +
# 15 x 4K 31.2 -> 27.1, 1 x 128K + 31 x 4K 47.8 -> 43.7, fp8 8/1 1 x 128K 29.6 -> 25.2, fp8 64/8 1 x 128K 93.2
# -> 89.5), elsewhere -0.1..-1.4 %. Sweep merge1's one launch (98a076b: [128, 64] wide tiles, 128 / 176
# registers for the whole kernel) had been 1.8-2.6 % slower where nothing is wide; this one runs at the narrow
# launch's 64 (MERGE_MAXNREG; git show 41fb96b:hpc_advise/kernels/decode_attention/TUNING_LOG.md, "Sweep merge1b").
DEFAULT_WIDE_MERGE = False
WIDE_MERGE_BLOCK = 128
# Columns of D per wide merge program: [WIDE_MERGE_BLOCK, 8] fp32 tiles keep the wide path within the narrow
# path's 64 registers at 2 warps (offline sm_90a; 16 columns spill 24 bytes there). Each column's arithmetic
# is its own, so the slice width does not change a result (bitwise under the interpreter; on the GPU a build's
# reduction order may differ by a last bit: sweep merge1b saw 1-4 elements of 3 cases differ, <= 2.6e-6).
WIDE_MERGE_COLS = 8
# Register cap of the merge launch with merge_block 16 (2 warps; 0: ptxas's choice, 96 for this kernel): 64,
# the narrow launch's count before the one launch, 16 programs per SM, no spill
# (tests/kernels/test_decode_attention.py reads it off the sm_90a build). Sweep merge1b timed the uncapped 96
# on 8/1 only: 1-2 % faster in geometric mean (bf16 -6.2 vs -5.1 %, fp8 -9.0 vs -7.2 % against the two
# launches), but 128 x U +0.8 / +1.0 % and 64/8 unmeasured, so the cap stays until it is timed on all 32
# cases. Sweep split (2026-11-30 02:37 UTC, one process, the 16 bf16 cases) timed it against the cap: 8/1 -1.2 % in
# geometric mean (128 x U +1.0 %, the default's repeat -2.0..+1.0 %), 64/8 -0.1 %: under the 2 % rule, the cap stays
# (git show 41fb96b:hpc_advise/kernels/decode_attention/TUNING_LOG.md, "Sweep split"). Other merge blocks spill at 64 and run uncapped.
MERGE_MAXNREG = 64
# Merge programs' planner loads (segment, output row, workspace slots) before or after griddepcontrol.wait
# (kernel._combine_segment's HOIST). 0, the form since the one launch: the wait, then per step the slots, then the
# partials. 1: all but the partials before the wait. Sweep mprol (2026-11-30 ~02:53 UTC, H200, one process,
# benchmarks/results/decode_attention_sweep_mprol.md) timed 1 in its first form (narrow programs with dead
# next-step slot code after the math, 990 SASS instructions after the wait instead of 730) against 0: bf16 8/1
# +0.7 % in geometric mean (32 x 128 + 32 x 4K +2.7 %; only the cases with a wide segment faster, 1 x 128K -1.6 %),
# fp8 64/8 +2.3 % (up to +4.8 %), bf16 64/8 0.0 %: 0 stays. The form 1 builds now (a narrow segment in one step,
# 536 instructions after the wait; offline sm_90a, 64 registers, no stack) was timed by the lead's call (2026-11-30
# ~03:02 UTC, sweep set 'mprol', default 0 three times against '-mh1' twice in one process,
# benchmarks/results/decode_attention_sweep_mprol2.md): bf16 8/1 -2.3 % in geometric mean, faster on all 8 (-0.7 to
# -4.3 %; 32 x 128 + 32 x 4K 28.8 -> 27.6 us, 1 x 128K 28.2 -> 27.2), bf16 64/8 -0.1 % and fp8 64/8 -0.3 % (worst
# +0.35 %, inside the default's own spread): 1 ships since.
MERGE_HOIST = 1
# The merge launch's grid (merge_grid; (G + 8 W) x GROUP x D / 64 programs, 6 400 at bf16 8/1, mostly idle) is not
# its cost: sweep mgrid (H200, 2026-11-30 04:55-05:02 UTC, benchmarks/results/decode_attention_split_mgrid.md) timed
# that grid doing nothing in the merge's slot at what one program costs, and parking its merging programs at their
# wait at <= 0.3 us more. Folding a segment's columns into fewer, longer programs (bitwise the same merge) was slower
# on bf16 8/1 (+2.8 % to +65 % in geometric mean, decode_attention_sweep_mgrid.md) and was removed (code at 2ba5ab4).
# Nor are its barriers: a narrow program's reductions over its 16 partials cross its 2 warps (Triton puts the warps
# down the partial axis: 7 CTA barriers after griddepcontrol.wait, offline sm_90a). Sweep mwarp (H200, 2026-11-30
# 05:21 UTC, benchmarks/results/decode_attention_sweep_mwarp.md, bf16 8/1, default 3x vs 2x, alternating) timed one
# warp per program (1 barrier, 96 registers uncapped) at -0.56 % in geometric mean, inside the default's spread, and
# the 2 warps across the columns (scalar column loads: 3 barriers, 706 instead of 538 instructions) at +1.9 %: both
# removed (code at 73cb3b8).
# Dynamic schedule: what starting a segment costs (q load, page ids, pipeline fill, partial write), in
# tiles. The planner balances tiles + seg_cost x segment starts per program instead of tiles alone, so a
# program walking many short requests gets fewer tiles (0: tiles alone).
DEFAULT_SEG_COST = 0
MAX_SEG_COST = 64
# Dynamic schedule: program p's boundary sits at cost position x = ceil(p T / G) and may cut a segment
# anywhere. With snap > 0 a boundary within snap % of the even share T / G of a segment boundary moves
# onto it (the nearer one), each boundary on its own inside the plan launch: where whole segments balance
# within that slack (uniform batches) no segment is split (no partials, no merge duty, one pipeline fill
# per segment), long requests are still split evenly; a program's cost grows by at most 2 x slack.
# 0: boundaries stay where the even split puts them. At most 50 (the slack stays under one share).
# Sweep run 12 (H200, 2026-11-29 17:33 UTC, benchmarks/results/decode_attention_sweep_run12.md), bf16 64/8:
# snap 25 made 64 x 4K 4 % faster (260.3 -> 249.9 us; every segment whole, the heaviest program 3.1 % over
# the share) but every mixed case slower (up to +15 %; +34 % at snap 50), where moving both ends of a range
# outwards left some program up to 1.45 shares. Hence the gate: the planner keeps the snapped boundaries
# only if no program's cost exceeds the even share by more than SNAP_GATE %, else it plans with snap 0
# (decided on the GPU in the same launch). On the swept cases the gate keeps snap 25 on 64/8 64 x 4K and
# 1 x 128K (where it changes nothing) and falls back elsewhere (tests/kernels/test_decode_attention_snap.py).
DEFAULT_SNAP = 0
MAX_SNAP = 50
SNAP_GATE = 4
# Dynamic schedule, whole segments by cost (whole_below > 0; an alternative to snap): a segment costing at most
# whole_below % of the even share T / G is *short* and no program boundary falls inside it; the others are
# split evenly. Requests of one class form *regions* (maximal runs of consecutive requests); region r of cost
# span [a, e) gets programs round(a G / T) .. round(e G / T) - 1 and its cost is split evenly over them, each
# boundary inside a short segment then moved to that segment's nearer end. So a long request next to short
# ones is split evenly over its proportional number of programs while the short ones are dealt out whole
# (1 x 128K + 31 x 4K at 64/8: 132 programs over the 128K request's 8 segments, 132 programs with two whole
# 4K segments each), with no program straddling the two. Like the snap it is gated, in the same launch: kept
# only if no program's cost-axis range exceeds the share by more than WHOLE_GATE % (whole segments saved ~7 %
# per tile against split pieces on 64 x 4K, sweep run 12; 1 x 128K + 31 x 4K needs 6.4 %), else the even
# split. 0: off.
DEFAULT_WHOLE_BELOW = 0
MAX_WHOLE_BELOW = 200
WHOLE_GATE = 8
# Merge in the attention pass (merge_in_pass=N > 0, nested loop): a split segment with at most N participating
# programs is merged by the participant that finishes last (per-segment arrival counters in the plan's buffers,
# atom.acq_rel.gpu), right after its own partial, instead of by the merge launch after the whole grid; wider
# segments keep the merge launch, which skips the ones merged in the pass. 0: every split segment is merged by
# the launch (the behaviour before this knob).
DEFAULT_MERGE_IN_PASS = 0
MAX_MERGE_IN_PASS = 64
# Nested loop with page >= tile or page == tile / 2: 0 loads each tile's page id inside the tile loop; N > 0 loads the ids of N
# tiles at once before an inner loop over them, so no load feeds the K/V addresses in that loop.
DEFAULT_PT_CHUNK = 0
PT_CHUNKS = (0, 16, 32, 64)
DEFAULT_LOOP = "nested"
# Nested loop with pt_chunk > 0 and page >= tile: split every tile's tokens over the program's warps, each
# warp with its own online-softmax state (row max / sum inside the warp, no shared-memory reduction or
# barrier per tile), merged once per segment. Needs tile / num_warps >= 16 (mma's K); otherwise the plain
# loop runs.
DEFAULT_WARP_SPLIT = False
LOOPS = ("flat", "nested")
# Per KV dtype, what the H200 sweeps of 2026-11-29 10:06 and 10:12 UTC (runs 5 and 6) measured fastest
# over their cases (geometric mean; benchmarks/results/decode_attention_sweep_run5.md / _run6.md): the
# descriptor prologue with the next segment loaded ahead, page ids of 32 tiles per load (two K/V buffers;
# 32 ids sit in every warp, so no cross-warp reduction per tile), the adaptive merge, and 2 (bf16) / 4
# (fp8) tiles charged per segment start; fp8 with fp16 products and 3 programs per SM. Sweep run 7
# (2026-11-29 13:33 UTC, benchmarks/results/decode_attention_sweep_run7.md) added the merge launches as
# programmatic dependents (pdl), faster on all 12 swept cases (bf16 64/8 1 x 64K + 15 x 4K 155 -> 137 us,
# 8/1 1 x 128K 35.0 -> 30.6, fp8 8/1 32 x 128 + 32 x 4K 30.9 -> 27.5).
# Applied by ``plan`` when it is told the KV dtype and the caller leaves these knobs unset.
_TUNED_BF16 = {
    "desc": True,
    "merge_block": 16,
    "wide_merge": True,
    "pt_chunk": 32,
    "seg_cost": 2,
    "pdl": True,
}
TUNED_BY_KV_DTYPE = {
    torch.bfloat16: _TUNED_BF16,
    torch.float16: _TUNED_BF16,
    torch.float8_e4m3fn: {
        "desc": True,
        "merge_block": 16,
        "wide_merge": True,
        "pt_chunk": 32,
        "seg_cost": 4,
        "f16_dot": True,
        "ctas_per_sm": 3,
        "pdl": True,
    },
}
# ... and on top of that, for plans with at least MANY_KV_HEADS KV heads: fp8 KV with the warp split, each
# program one warp over 32-token tiles, 7 programs per SM. Sweep run 7 (2026-11-29 13:33 UTC) took the split
# over 2 warps x 32 tokens at 4 programs/SM (64/8 64 x 4K 232 -> 208 us, 32 x 128 + 32 x 4K 140 -> 129,
# 1 x 128K + 31 x 4K 231 -> 203; on 8/1, 32 x 128 + 32 x 4K, slower: 30.9 -> 41.7, so plans with fewer KV
# heads keep the plain loop); sweep run 10 (16:33 UTC, benchmarks/results/decode_attention_sweep_run10.md)
# timed 1 warp x 32 tokens at 7 programs/SM faster on all four fp8 64/8 cases it swept: 64 x 4K 205.4 -> 197.0,
# 32 x 128 + 32 x 4K 127.8 -> 116.1, 1 x 128K + 31 x 4K 202.3 -> 192.5, 1 x 64K + 15 x 4K 112.1 -> 108.8 (the
# 2-warp form timed again at each case's end: within 1.5 % of its first timing). The head count stands in for
# the work per step (plan() sees no lengths without a host sync); only 1 and 8 KV heads were measured.
# bf16 with >= 8 KV heads: whole segments by cost, whole_below 100 (WHOLE_GATE), seg_cost 2, since sweep run 15
# (2026-11-29 19:34 UTC, benchmarks/results/decode_attention_sweep_run15.md), in place of the gated snap 25 of sweep
# run 12 (64/8 64 x 4K 260.3 -> 249.9 us with every segment whole): 64/8 1 x 128K + 31 x 4K 254.0 (again 253.3) ->
# 246.3 us (the 4K requests whole, two per program; the snap's gate fell back to the even split there), 64 x 4K the
# same 245.0 (whole segments either way), the other six 64/8 cases within the default's own spread (the plan is the
# same even split); plan 9.0-9.8 -> 10.8-15.6 us per decode step (one region search and one more boundary search).
# seg_cost 4 / 6 were no faster (64 x 4K 248.6 with the snap at 4; 1 x 128K + 31 x 4K 256.3 at 6, where the gate
# falls back). Not for 8/1 (a 4K segment is 4 shares there: the plans are the same, only the plan time grows) nor
# for fp8 (the transposed kernel's default; whole_below 100 at seg_cost 2 read 32 x 128 + 32 x 4K 108.7 -> 105.4,
# the other two swept cases equal, not adopted: two knobs at once, unswept apart).
# bf16 with >= 8 KV heads also merges split segments of <= 4 programs in the attention pass (merge_in_pass 4)
# since sweep mip (2026-11-29 21:40-21:44 UTC, benchmarks/results/decode_attention_sweep_mip.md, one process,
# the default again at each case's end within 0.5 %): 64/8 32 x 128 + 32 x 4K 147.3 -> 141.9 us, 2 x 32K + 30 x 4K
# 194.7 -> 191.6, 1 x 64K + 15 x 4K 138.8 -> 136.8, 64 x U -0.3 %, 128 x U 0; +0.5 % where no segment is merged in
# the pass (64 x 4K, 1 x 128K, 1 x 128K + 31 x 4K: the bookkeeping), -0.7 % in geometric mean over the 8. Not for
# 8/1 (64 x U 94.6 -> 97.7 us) nor fp8 (unswept with the transposed default). 8/1 again in sweep merge1 (2026-11-29
# 23:58 UTC, benchmarks/results/decode_attention_sweep_merge1.md, one process, the merge launches then one launch at
# 2 warps — since reverted —, the default merge_in_pass 0 first and again last, within 1.4 %): bf16 8/1 at 8 / 32
# faster where short splits are many (64 x 4K 46.0 -> 43.3 / 43.5 us, 128 x U 176.7 -> 171.8 / 171.6, 32 x 128 + 32 x
# 4K 30.6 -> 30.1 / 28.3) and slower next to long requests (2 x 32K + 30 x 4K 37.3 -> 39.2 / 38.7, 1 x 64K + 15 x 4K
# 30.3 -> 31.3 / 33.9, 1 x 128K + 31 x 4K 47.8 -> 49.4 / 49.3, 1 x 128K 32.7 -> 33.4 / 33.1); fp8 8/1 (transposed,
# 2/SM) the same pattern (64 x 4K 38.2 -> 35.5 / 35.6, 2 x 32K + 30 x 4K 32.2 -> 35.1 / 36.0). Geometric mean +0.2 /
# -0.1 % (bf16), +0.3 / +2.4 % (fp8), 4 cases > 1 % slower at either N (up to +16 %): 8/1 keeps 0. Gated all or nothing
# per plan (sweep gate, 2026-11-30 05:52 UTC, benchmarks/results/decode_attention_sweep_gate.md: in the pass only if every
# split is <= N programs, else the N = 0 plan, decided by plan_kernel on the GPU) bf16 8/1 was +1.67 % (N = 32) / +1.84 %
# (16) in geometric mean: where the gate opens 32 x 128 + 32 x 4K 27.5 -> 28.6 us, where it closes the in-pass build of
# the pass alone costs +0.8..2.5 % (1 x 128K 27.5 -> 28.2); 64/8 -0.02 %. Removed (code at be18c60).
# Since sweep mipw (2026-11-29 22:27-22:29 UTC, benchmarks/results/decode_attention_sweep_mipw.md, one process; the
# in-pass merge in chunks of 3 participants, kernel._merge_partials) merge_in_pass 32: the segments of the 64K / 128K
# requests mixed with 4K ones (~17 programs each) and 2 x 32K + 30 x 4K's 32K ones merge in the pass instead of the
# wide / narrow launches, against N = 4 timed first (and again last): 2 x 32K + 30 x 4K 191.9 (190.8) -> 188.6 us,
# 1 x 64K + 15 x 4K 135.0 (134.0) -> 133.3, 1 x 128K + 31 x 4K 252.3 (252.8) -> 250.2, the other five within
# -1.0..+0.4 % (the spread of N = 4 there up to 1.3 %); -0.6 % in geometric mean over the 8. N = 64 also takes
# 1 x 128K's segments of ~33 programs into the pass and is 3.3 % slower there (132.8 -> 137.2 us: one program merging
# 33 partials on the grid's tail costs more than the wide launch), so those stay with the launch.
# fp8 with >= 8 KV heads since sweep fp8t (2026-11-29 19:19 UTC, benchmarks/results/decode_attention_sweep_fp8t.md):
# the transposed kernel (kernel_transposed.py: tokens on wgmma's M side, 4 warps x 64-token tiles, 3 programs/SM,
# registers capped at 168 so that they fit), 6-15 % faster than the 1-warp split on all 8 fp8 64/8 cases (64 x 4K
# 194.9 -> 177.1 us, 1 x 128K + 31 x 4K 190.4 -> 172.3, 1 x 128K 110.3 -> 93.8; the split again at each case's
# end within 1.1 % of its first timing); 2 programs/SM (no cap) and 4 (cap 128, spills in the loop) were slower.
# Where it cannot run (page < 64) plan() falls back to the nested loop with the same warps, tile and grid.
MANY_KV_HEADS = 8
TUNED_MANY_KV_HEADS = {
    torch.float8_e4m3fn: {"transposed": True, "num_warps": 4, "ctas_per_sm": 3, "tile": 64},
    torch.bfloat16: {"whole_below": 100, "merge_in_pass": 32},
}
# Measured at head_dim 128. At 256 one warp's [16, 256] fp32 accumulator spills 656 bytes and only 4 such
# programs fit an SM (offline sm_90a, tests/kernels/test_decode_attention.py): there the run-7 form stays
# (2 warps, 4 programs/SM, 144 bytes spilled), unmeasured at 256 either way.
TUNED_MANY_KV_HEADS_WIDE = {torch.float8_e4m3fn: {"warp_split": True, "num_warps": 2, "ctas_per_sm": 4}}
# ... and with fewer KV heads at head_dim <= 128 and page >= 64: fp8 runs the transposed kernel (4 warps x 64 tokens,
# 2 programs/SM, 3 stages, no register cap) since sweep t2 (2026-11-29 19:45 UTC,
# benchmarks/results/decode_attention_sweep_t2.md): 4.8-15.8 % faster than the plain loop on all 8 fp8 8/1 cases (64 x U
# 86.6 -> 73.5 us, 128 x U 150.0 -> 130.5, 64 x 4K 40.6 -> 36.4, 32 x 128 + 32 x 4K 27.8 -> 26.5, 1 x 128K 35.2 ->
# 29.7; the plain loop again at each case's end within 1.0 %). At 3 programs/SM (registers capped at 168) it was
# 1.6-23 % faster (more on the U cases: 69.5 / 116.6 us, less on 1 x 128K: 34.5), 2.0 % slower in geometric mean.
# With page < 64 the table does not apply (the transposed kernel needs page >= tile): the plain loop's knobs stay.
# bf16 (sweep t2, 64/8 and 8/1): the transposed kernel is no faster (2 programs/SM, 3 stages: -0.3..+0.7 % on 64/8,
# -0.6..+9.5 % on 8/1; 3 programs/SM, 2 stages, never faster), so 16-bit KV keeps the plain loop.
TUNED_FEW_KV_HEADS = {torch.float8_e4m3fn: {"transposed": True, "num_warps": 4, "ctas_per_sm": 2, "tile": 64}}
# Programs of the grid when there is no GPU (Triton interpreter on CPU).
CPU_NUM_SMS = 4


def tuned_config(
    kv_dtype: torch.dtype | None, num_kv_heads: int, head_dim: int = 128, page_size: int | None = None
) -> dict:
    """The measured launch knobs for this KV dtype, KV-head count, head_dim and page size (see
    ``TUNED_BY_KV_DTYPE``); ``page_size`` None: as for pages of at least 64 tokens."""
    if head_dim > 128:
        table = TUNED_MANY_KV_HEADS_WIDE if num_kv_heads >= MANY_KV_HEADS else {}
    elif num_kv_heads >= MANY_KV_HEADS:
        table = TUNED_MANY_KV_HEADS
    else:
        few = TUNED_FEW_KV_HEADS.get(kv_dtype, {})
        table = {kv_dtype: few} if page_size is None or page_size >= few.get("tile", DEFAULT_TILE) else {}
    return TUNED_BY_KV_DTYPE.get(kv_dtype, {}) | table.get(kv_dtype, {})


def _fail(msg: str) -> None:
    raise ValueError(f"decode_attention: {msg}")


def _check_tensor(name: str, t: object, ndim: int, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"decode_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        _fail(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(
            f"decode_attention: {name} dtype {t.dtype} not supported (expected one of {[str(d) for d in dtypes]})"
        )
    if t.numel() > 0 and t.stride(-1) != 1:
        _fail(f"{name} must be contiguous in its last dimension, got strides {tuple(t.stride())}")
    return t


def _same_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        _fail(f"{name} is on {t.device}, expected {device}")


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_NUM_SMS


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass
class DecodePlan:
    """Schedule of one decode step: fixed-size GPU buffers and the launch configuration.

    Buffers (int32 unless noted): ``seq_lens[max_batch]``, ``page_table[max_batch, max_pages]``,
    ``req_start[max_batch + 1]`` (first work unit of each request), ``prog_start[G + 1]`` (first unit of
    each program), ``prog_b[G]`` (request of each program's first unit), ``ws_o[2G, group, D]`` and
    ``ws_lse[2G, group]`` fp32 (partial results of split segments), ``prog_desc[G, 8]`` (each program's
    range and first segment, read by the nested loop when ``desc``), ``req_cost[max_batch + 1]`` (cost
    position where each request starts: tiles + ``seg_cost`` per segment), ``wide_list[W]`` (programs whose
    merge goes to the merge launch's wide programs, then -1s), ``bounds[4, G + 1]`` (with ``snap`` or ``whole_below``: the
    candidate plan's boundaries as cost position, first unit and its request; ``bounds[3, 0]`` is 1 if the
    gate kept that plan, else the even split runs), ``region[max_batch, 2]`` (with ``whole_below``: the cost
    span of each request's region).
    """

    page_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    schedule: str
    max_batch: int
    max_pages: int
    tile: int
    num_programs: int  # G of the dynamic grid, or of the static grid at max_batch
    static_splits: int  # 0 for the dynamic schedule
    num_stages: int
    num_warps: int
    prefetch: bool
    desc: bool  # nested loop: first segment from prog_desc (one load) and no request-start lookups
    merge_block: int  # partials per step of the merge kernel
    pt_chunk: int  # nested loop, page >= tile or page == tile / 2: page ids of this many tiles loaded ahead (0: per tile)
    loop: str  # 'flat': one pipelined loop over unit descriptors; 'nested': segment loop + tile loop
    device: torch.device
    wide_merge: bool = False  # segments split over > merge_block programs merge WIDE_MERGE_BLOCK at a time
    seg_cost: int = 0  # dynamic schedule: cost of a segment start, in tiles
    f16_dot: bool = False  # fp8 KV, nested loop: products in fp16 (exact e4m3 -> fp16) instead of q's dtype
    pdl: bool = False  # merge launch as a programmatic dependent of the attention pass (SM90; tuned default)
    warp_split: bool = False  # nested loop: the tile's tokens split over the warps (see DEFAULT_WARP_SPLIT)
    snap: int = 0  # dynamic schedule: boundaries move onto segment boundaries within snap % of a share
    whole_below: int = 0  # dynamic schedule: segments costing <= whole_below % of a share are never split
    transposed: bool = False  # nested loop: kernel_transposed's tile loop (tokens on the MMA's M side)
    merge_in_pass: int = 0  # nested loop: split segments of <= this many programs merge in the attention pass
    batch: int = 0
    seq_lens: torch.Tensor = field(repr=False, default=None)
    page_table: torch.Tensor = field(repr=False, default=None)
    req_start: torch.Tensor = field(repr=False, default=None)
    prog_start: torch.Tensor = field(repr=False, default=None)
    prog_b: torch.Tensor = field(repr=False, default=None)
    ws_o: torch.Tensor = field(repr=False, default=None)
    ws_lse: torch.Tensor = field(repr=False, default=None)
    unit_bh: torch.Tensor = field(repr=False, default=None)
    unit_t: torch.Tensor = field(repr=False, default=None)
    merge_first: torch.Tensor = field(repr=False, default=None)
    merge_bh: torch.Tensor = field(repr=False, default=None)
    merge_seg: torch.Tensor = field(repr=False, default=None)
    prog_desc: torch.Tensor = field(repr=False, default=None)
    req_cost: torch.Tensor = field(repr=False, default=None)
    wide_list: torch.Tensor = field(repr=False, default=None)
    bounds: torch.Tensor = field(repr=False, default=None)
    region: torch.Tensor = field(repr=False, default=None)

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    def grid_size(self) -> int:
        """Programs of the attention pass for the current batch."""
        if self.static_splits:
            return self.batch * self.num_kv_heads * self.static_splits
        return self.num_programs

    def update(
        self, seq_lens: torch.Tensor, page_table: torch.Tensor, *, validate: bool = True
    ) -> DecodePlan:
        """Re-plan in place for new lengths / page table (no host sync unless ``validate`` and not
        capturing a CUDA graph). The batch may change up to ``max_batch``; a captured graph keeps the
        batch it was captured with."""
        seq_lens = _check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
        page_table = _check_tensor("page_table", page_table, 2, (torch.int32,))
        _same_device("seq_lens", seq_lens, self.device)
        _same_device("page_table", page_table, self.device)
        batch = seq_lens.shape[0]
        if not 1 <= batch <= self.max_batch:
            _fail(f"batch {batch} outside 1..{self.max_batch} (max_batch of this plan)")
        if page_table.shape[0] != batch:
            _fail(f"page_table has {page_table.shape[0]} rows, seq_lens has {batch}")
        if page_table.shape[1] > self.max_pages:
            _fail(f"page_table has {page_table.shape[1]} columns, the plan was sized for {self.max_pages}")
        if validate and not _capturing():
            lo, hi = int(seq_lens.min()), int(seq_lens.max())
            if lo < 1 or hi > MAX_SEQ_LEN:
                _fail(f"sequence lengths must lie in 1..{MAX_SEQ_LEN}, got min {lo} max {hi}")
            if hi > page_table.shape[1] * self.page_size:
                _fail(
                    f"a sequence of {hi} tokens needs {math.ceil(hi / self.page_size)} pages, "
                    f"page_table has {page_table.shape[1]} columns"
                )
        self.batch = batch
        self.page_table[:batch, : page_table.shape[1]].copy_(page_table)
        g = self.grid_size()
        block_b = max(16, _next_pow2(self.max_batch))
        # all G + 1 boundaries in one step of the planner's loops where G < 1024: each step is a chain of
        # dependent loads (binary searches), so fewer steps make a shorter plan
        block_g = min(1024, max(16, _next_pow2(g + 1)))
        _k.plan_kernel[(1,)](
            seq_lens,
            self.seq_lens,
            self.req_start,
            self.prog_start,
            self.prog_b,
            self.merge_first,
            self.merge_bh,
            self.merge_seg,
            self.prog_desc,
            self.req_cost,
            self.wide_list,
            self.bounds,
            self.region,
            batch,
            g,
            max(1, self.static_splits),
            self.seg_cost,
            self.snap,
            self.whole_below,
            WHOLE_GATE if self.whole_below else SNAP_GATE,
            self.wide_list.shape[0],
            NUM_KV_HEADS=self.num_kv_heads,
            TILE=self.tile,
            STATIC=self.static_splits > 0,
            BLOCK_B=block_b,
            BLOCK_G=block_g,
            G_STEPS=-(-(g + 1) // block_g),
            SEARCH_STEPS=int(math.log2(block_b)) + 1,
            BLOCK_P=self.merge_block if self.wide_merge else 0,
            MERGE_IN_PASS=self.merge_in_pass,
            num_warps=4,
        )
        if self.loop == "flat":
            _k.fill_units_kernel[(batch,)](
                self.seq_lens,
                self.req_start,
                self.unit_bh,
                self.unit_t,
                NUM_KV_HEADS=self.num_kv_heads,
                TILE=self.tile,
                BLOCK=1024,
                num_warps=4,
            )
        return self


def _check_geometry(page_size: int, head_dim: int, num_q_heads: int, num_kv_heads: int) -> int:
    """The GQA group of a supported (page size, head_dim, heads) geometry; ValueError otherwise."""
    if page_size not in PAGE_SIZES:
        _fail(f"page_size {page_size} not supported (supported: {PAGE_SIZES})")
    if head_dim not in HEAD_DIMS:
        _fail(f"head_dim {head_dim} not supported (supported: {HEAD_DIMS})")
    if num_kv_heads < 1 or num_q_heads < 1 or num_q_heads % num_kv_heads:
        _fail(f"num_q_heads {num_q_heads} must be a positive multiple of num_kv_heads {num_kv_heads}")
    group = num_q_heads // num_kv_heads
    if group > MAX_GROUP:
        _fail(f"GQA group {group} (= {num_q_heads}/{num_kv_heads}) exceeds {MAX_GROUP}")
    return group


def _whole_or_snap(tuned: dict, snap: int | None, whole_below: int | None) -> tuple[int, int]:
    """(snap, whole_below): the two are alternative plans. A value given here beats the tuned table's, and
    a non-zero one given for either turns the other's tuned value off; both non-zero given: ValueError."""
    if snap and whole_below:
        _fail(f"snap ({snap}) and whole_below ({whole_below}) are alternative plans: give one of them")
    if whole_below is None:
        whole_below = 0 if snap else tuned.get("whole_below", DEFAULT_WHOLE_BELOW)
    if snap is None:
        snap = 0 if whole_below else tuned.get("snap", DEFAULT_SNAP)
    return snap, whole_below


def _int_in(name: str, value, hi: int, unit: str = "") -> int:
    """``value`` if it is an int (not a bool) in 0..``hi``; ValueError naming the knob otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        _fail(f"{name} must be an int in 0..{hi}{unit}, got {value!r}")
    return value


def _choice(name: str, value, allowed: tuple):
    """``value`` if it is one of ``allowed``; ValueError naming the knob otherwise."""
    if value not in allowed:
        _fail(f"{name} must be one of {allowed}, got {value!r}")
    return value


def plan(
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    *,
    page_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    schedule: str = "dynamic",
    max_batch: int | None = None,
    max_pages: int | None = None,
    tile: int | None = None,
    ctas_per_sm: int | None = None,
    num_programs: int | None = None,
    static_splits: int | None = None,
    num_stages: int | None = None,
    num_warps: int | None = None,
    prefetch: bool | None = None,
    desc: bool | None = None,
    merge_block: int | None = None,
    pt_chunk: int | None = None,
    loop: str | None = None,
    wide_merge: bool | None = None,
    seg_cost: int | None = None,
    f16_dot: bool | None = None,
    pdl: bool | None = None,
    warp_split: bool | None = None,
    snap: int | None = None,
    whole_below: int | None = None,
    transposed: bool | None = None,
    merge_in_pass: int | None = None,
    kv_dtype: torch.dtype | None = None,
    validate: bool = True,
) -> DecodePlan:
    """Build the schedule of a decode step on the GPU (see module docstring).

    ``kv_dtype`` (the KV cache's dtype) picks the measured launch variant of ``TUNED_BY_KV_DTYPE`` (and
    ``TUNED_MANY_KV_HEADS``, see ``tuned_config``) for the knobs left unset.

    ``num_programs`` overrides the persistent grid (default: SMs x ``ctas_per_sm``); ``static_splits``
    the splits per (request, KV head) of ``schedule='static'`` (default: enough to give the grid as many
    programs as the dynamic one at ``max_batch``)."""
    if schedule not in SCHEDULES:
        _fail(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    tuned = tuned_config(kv_dtype, num_kv_heads, head_dim, page_size)
    desc = tuned.get("desc") if desc is None else desc
    merge_block = tuned.get("merge_block") if merge_block is None else merge_block
    pt_chunk = tuned.get("pt_chunk") if pt_chunk is None else pt_chunk
    wide_merge = tuned.get("wide_merge") if wide_merge is None else wide_merge
    seg_cost = tuned.get("seg_cost") if seg_cost is None else seg_cost
    f16_dot = tuned.get("f16_dot") if f16_dot is None else f16_dot
    pdl = tuned.get("pdl") if pdl is None else pdl
    warp_split = tuned.get("warp_split", DEFAULT_WARP_SPLIT) if warp_split is None else warp_split
    snap, whole_below = _whole_or_snap(tuned, snap, whole_below)
    explicit_transposed = transposed is not None
    merge_in_pass = (
        tuned.get("merge_in_pass", DEFAULT_MERGE_IN_PASS) if merge_in_pass is None else merge_in_pass
    )
    transposed = tuned.get("transposed", False) if transposed is None else bool(transposed)
    num_warps = tuned.get("num_warps") if num_warps is None else num_warps
    ctas_per_sm = tuned.get("ctas_per_sm") if ctas_per_sm is None else ctas_per_sm
    num_stages = tuned.get("num_stages") if num_stages is None else num_stages
    if tile is None and head_dim <= 128:  # measured at head_dim 128; 256 keeps its halved default tile
        tile = tuned.get("tile")
    group = _check_geometry(page_size, head_dim, num_q_heads, num_kv_heads)
    seq_lens = _check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    page_table = _check_tensor("page_table", page_table, 2, (torch.int32,))
    device = seq_lens.device
    batch = seq_lens.shape[0]
    max_batch = batch if max_batch is None else int(max_batch)
    if not 1 <= max_batch <= MAX_BATCH:
        _fail(f"max_batch {max_batch} outside 1..{MAX_BATCH}")
    max_pages = page_table.shape[1] if max_pages is None else int(max_pages)
    if max_pages < 1:
        _fail(f"page_table needs at least one column, got {max_pages}")
    # head_dim 256 doubles every tile's bytes: halve the default tile so two programs still fit an SM
    tile = (DEFAULT_TILE if head_dim <= 128 else max(16, DEFAULT_TILE // 2)) if tile is None else int(tile)
    if tile not in (16, 32, 64, 128) or (page_size < tile and tile % page_size):
        _fail(f"tile {tile} must be 16, 32, 64 or 128")
    ctas = DEFAULT_CTAS_PER_SM if ctas_per_sm is None else int(ctas_per_sm)
    g_dyn = int(num_programs) if num_programs is not None else _num_sms(device) * ctas
    if g_dyn < 1:
        _fail(f"num_programs must be >= 1, got {g_dyn}")
    splits = 0
    g = g_dyn
    if schedule == "static":
        splits = int(static_splits) if static_splits else max(1, -(-g_dyn // (max_batch * num_kv_heads)))
        splits = min(splits, MAX_STATIC_SPLITS)
        g = max_batch * num_kv_heads * splits
    merge_block = _choice(
        "merge_block", DEFAULT_MERGE_BLOCK if merge_block is None else int(merge_block), MERGE_BLOCKS
    )
    pt_chunk = _choice("pt_chunk", DEFAULT_PT_CHUNK if pt_chunk is None else int(pt_chunk), PT_CHUNKS)
    loop = _choice("loop", DEFAULT_LOOP if loop is None else loop, LOOPS)
    seg_cost = _int_in("seg_cost", DEFAULT_SEG_COST if seg_cost is None else seg_cost, MAX_SEG_COST)
    snap = _int_in("snap", snap, MAX_SNAP, " (% of a program's share)")
    whole_below = _int_in("whole_below", whole_below, MAX_WHOLE_BELOW, " (% of a program's share)")
    merge_in_pass = _int_in("merge_in_pass", merge_in_pass, MAX_MERGE_IN_PASS, " (participating programs)")
    if merge_in_pass and loop != "nested":
        _fail(f"merge_in_pass={merge_in_pass} needs loop='nested' (the flat loop merges in the launch only)")
    wide_merge = DEFAULT_WIDE_MERGE if wide_merge is None else bool(wide_merge)
    wide_merge = wide_merge and merge_block < WIDE_MERGE_BLOCK
    why_not = _transposed_unsupported(loop, prefetch, desc, pt_chunk, page_size, tile) if transposed else None
    if why_not and explicit_transposed:
        _fail(f"transposed=True needs {why_not}")
    transposed = transposed and not why_not  # a tuned default falls back to the nested loop's kernel
    i32 = dict(dtype=torch.int32, device=device)
    # flat loop: one descriptor per unit; at most max_batch * Hkv * tiles of the longest possible request
    max_units = (
        max_batch * num_kv_heads * max(1, -(-(max_pages * page_size) // tile)) if loop == "flat" else 1
    )
    if max_units >= 2**31:
        _fail(
            f"max_batch x KV heads x tiles = {max_units} work units exceeds int32; lower max_batch or max_pages"
        )
    p = DecodePlan(
        page_size=page_size,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        schedule=schedule,
        max_batch=max_batch,
        max_pages=max_pages,
        tile=tile,
        num_programs=g,
        static_splits=splits,
        num_stages=DEFAULT_NUM_STAGES if num_stages is None else int(num_stages),
        num_warps=DEFAULT_NUM_WARPS if num_warps is None else int(num_warps),
        prefetch=DEFAULT_PREFETCH if prefetch is None else bool(prefetch),
        desc=DEFAULT_DESC if desc is None else bool(desc),
        merge_block=merge_block,
        pt_chunk=pt_chunk,
        loop=loop,
        device=device,
        seq_lens=torch.ones(max_batch, **i32),
        page_table=torch.zeros(max_batch, max_pages, **i32),
        req_start=torch.zeros(max_batch + 1, **i32),
        prog_start=torch.zeros(g + 1, **i32),
        prog_b=torch.zeros(g, **i32),
        ws_o=torch.empty(2 * g, group, head_dim, dtype=torch.float32, device=device),
        ws_lse=torch.empty(2 * g, group, dtype=torch.float32, device=device),
        unit_bh=torch.zeros(max_units, **i32),
        unit_t=torch.zeros(max_units, **i32),
        merge_first=torch.full((g,), -1, **i32),
        merge_bh=torch.zeros(g, **i32),
        merge_seg=torch.zeros(g, **i32),
        # the G descriptors, then the in-pass merge's 4 rows of G (kernel._plan_merge_in_pass)
        prog_desc=torch.zeros(12 * g, **i32)[: 8 * g].view(g, 8),
        wide_merge=wide_merge,
        seg_cost=seg_cost,
        f16_dot=bool(f16_dot),
        pdl=bool(pdl),
        warp_split=bool(warp_split),
        snap=snap,
        whole_below=whole_below,
        transposed=transposed,
        merge_in_pass=merge_in_pass,
        req_cost=torch.zeros(max_batch + 1, **i32),
        wide_list=torch.full((g // merge_block + 1 if wide_merge else 1,), -1, **i32),
        bounds=torch.zeros(4, g + 1, **i32),
        region=torch.zeros(max_batch, 2, **i32),
    )
    return p.update(seq_lens, page_table, validate=validate)


def _scale_arg(name: str, s: object, device: torch.device) -> float | torch.Tensor:
    if isinstance(s, torch.Tensor):
        if s.numel() != 1:
            _fail(f"{name} must be a float or a 1-element tensor, got shape {tuple(s.shape)}")
        _same_device(name, s, device)
        return s.reshape(1).to(torch.float32)
    try:
        v = float(s)
    except (TypeError, ValueError):
        raise TypeError(f"decode_attention: {name} must be a float or a 1-element tensor") from None
    if not math.isfinite(v) or v <= 0:
        _fail(f"{name} must be positive and finite, got {v}")
    return v


def _check_run_inputs(plan: DecodePlan, q, k_cache, v_cache, out):
    """run()'s tensors checked against the plan (dtypes, devices, shapes; clear errors), ``out`` allocated
    when None: (q, k_cache, v_cache, out)."""
    if not isinstance(plan, DecodePlan):
        raise TypeError("decode_attention: run() needs the DecodePlan returned by plan()")
    q = _check_tensor("q", q, 3, (torch.bfloat16, torch.float16))
    kv_dtypes = (q.dtype, torch.float8_e4m3fn)
    k_cache = _check_tensor("k_cache", k_cache, 4, kv_dtypes)
    v_cache = _check_tensor("v_cache", v_cache, 4, kv_dtypes)
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"decode_attention: k_cache is {k_cache.dtype} but v_cache is {v_cache.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _same_device(name, t, plan.device)
    want_q = (plan.batch, plan.num_q_heads, plan.head_dim)
    if tuple(q.shape) != want_q:
        _fail(f"q has shape {tuple(q.shape)}, the plan expects {want_q}")
    want_kv = (plan.page_size, plan.num_kv_heads, plan.head_dim)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if tuple(t.shape[1:]) != want_kv:
            _fail(f"{name} has shape {tuple(t.shape)}, expected [num_pages, {', '.join(map(str, want_kv))}]")
    if k_cache.shape[0] != v_cache.shape[0]:
        _fail(f"k_cache has {k_cache.shape[0]} pages, v_cache {v_cache.shape[0]}")
    if out is None:
        return q, k_cache, v_cache, torch.empty_like(q)
    _check_tensor("out", out, 3, (q.dtype,))
    _same_device("out", out, plan.device)
    if out.shape != q.shape:
        _fail(f"out has shape {tuple(out.shape)}, expected {tuple(q.shape)}")
    return q, k_cache, v_cache, out


def run(
    plan: DecodePlan,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    sm_scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of every query against its request's paged KV; returns ``out`` ``[B, Hq, D]``."""
    q, k_cache, v_cache, out = _check_run_inputs(plan, q, k_cache, v_cache, out)
    D = q.shape[2]
    sm = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    if not math.isfinite(sm) or sm <= 0:
        _fail(f"sm_scale must be positive and finite, got {sm}")
    ks = _scale_arg("k_scale", k_scale, plan.device)
    vs = _scale_arg("v_scale", v_scale, plan.device)
    from_ptr = isinstance(ks, torch.Tensor) or isinstance(vs, torch.Tensor)
    if from_ptr:
        scales = torch.cat(
            [
                ks if isinstance(ks, torch.Tensor) else torch.full((1,), ks, device=plan.device),
                vs if isinstance(vs, torch.Tensor) else torch.full((1,), vs, device=plan.device),
            ]
        )
        qk_scale, v_arg = sm * math.log2(math.e), 1.0
    else:
        scales = plan.ws_lse  # unused pointer
        qk_scale, v_arg = sm * ks * math.log2(math.e), vs

    # fp16 products read V as int16 pairs of e4m3: only for even strides and base (else the plain path)
    f16_dot = (
        plan.f16_dot
        and v_cache.dtype == torch.float8_e4m3fn
        and v_cache.data_ptr() % 2 == 0
        and all(st % 2 == 0 for st in v_cache.stride()[:3])
    )
    # programmatic dependent launch of the merge: a GPU feature (SM90+), nothing to emulate on CPU
    pdl = plan.pdl and plan.loop == "nested" and not _interpreting() and plan.device.type == "cuda"
    g = plan.grid_size()
    group = plan.group
    warp_split = _warp_split(plan)
    common = dict(
        GROUP=group,
        GROUP_PAD=max(16, _next_pow2(group)),
        HEAD_DIM=D,
        PAGE=plan.page_size,
        TILE=plan.tile,
        NUM_STAGES=plan.num_stages,
        SCALES_FROM_PTR=from_ptr,
        num_warps=plan.num_warps,
    )
    strides = (
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        plan.page_table.stride(0),
    )
    if plan.loop == "flat":
        _k.decode_flat_kernel[(g,)](
            q,
            k_cache,
            v_cache,
            out,
            plan.page_table,
            plan.seq_lens,
            plan.unit_bh,
            plan.unit_t,
            plan.prog_start,
            plan.ws_o,
            plan.ws_lse,
            scales,
            qk_scale,
            v_arg,
            *strides,
            NUM_KV_HEADS=plan.num_kv_heads,
            **common,
        )
    elif plan.transposed:
        # K read as int32 (4 e4m3 each): its strides and base must be multiples of 4 for fp16 products
        k4 = k_cache.data_ptr() % 4 == 0 and all(st % 4 == 0 for st in k_cache.stride()[:3])
        _kt.decode_transposed_kernel[(g,)](
            q,
            k_cache,
            v_cache,
            out,
            plan.page_table,
            plan.seq_lens,
            plan.prog_desc,
            plan.ws_o,
            plan.ws_lse,
            scales,
            qk_scale,
            v_arg,
            *strides,
            plan.num_kv_heads,
            PT_CHUNK=plan.pt_chunk,
            F16_DOT=f16_dot and k4,
            ASM_CVT=f16_dot and k4 and not _interpreting(),
            PDL=pdl,
            HALVES=_halves(plan),
            MERGE_IN_PASS=plan.merge_in_pass > 0,
            **common,
            **_register_cap(plan),
        )
    else:
        _k.decode_kernel[(g,)](
            q,
            k_cache,
            v_cache,
            out,
            plan.page_table,
            plan.seq_lens,
            plan.req_start,
            plan.prog_start,
            plan.prog_b,
            plan.prog_desc,
            plan.ws_o,
            plan.ws_lse,
            scales,
            qk_scale,
            v_arg,
            *strides,
            plan.num_kv_heads,
            PREFETCH=plan.prefetch,
            DESC=plan.desc,
            PT_CHUNK=plan.pt_chunk,
            F16_DOT=f16_dot,
            ASM_CVT=f16_dot and not _interpreting(),
            PDL=pdl,
            WARP_SPLIT=warp_split,
            MERGE_IN_PASS=plan.merge_in_pass > 0,
            **common,
        )
    _merge(plan, out, pdl)
    return out


def _transposed_unsupported(loop, prefetch, desc, pt_chunk: int, page_size: int, tile: int) -> str | None:
    """What the transposed kernel (kernel_transposed.py) needs that this configuration lacks, or None."""
    if loop != "nested" or prefetch or not (DEFAULT_DESC if desc is None else desc):
        return "loop='nested' with desc=True and prefetch=False"
    if pt_chunk == 0:
        return "pt_chunk > 0 (page ids loaded ahead)"
    if page_size < tile and 2 * page_size != tile:
        return (
            f"page_size >= tile or == tile / 2 (one or two page ids per tile), got page_size {page_size} "
            f"and tile {tile}"
        )
    return None


def _halves(plan: DecodePlan) -> int:
    """Products per tile of the transposed kernel: 2 (two of tile / 2 token rows, one cross-warp max) where
    the tile holds 32 or more rows per warp (4 warps x 128 tokens: each warpgroup MMA stays m64), else 1."""
    return 2 if plan.tile >= 32 * plan.num_warps else 1


def _register_cap(plan: DecodePlan) -> dict:
    """``maxnreg`` for the transposed kernel: registers per thread capped so that the dynamic grid's
    programs per SM fit (ptxas otherwise takes up to 255 and 2 programs of 4 warps fill an SM; offline
    sm_90a, git show 41fb96b:hpc_advise/kernels/decode_attention/TUNING_LOG.md "What limits it"). Empty on CPU, for the static grid and where no cap is needed."""
    if plan.device.type != "cuda" or plan.static_splits or _interpreting():
        return {}
    ctas = max(1, plan.num_programs // _num_sms(plan.device))
    regs = 65536 // (ctas * 32 * plan.num_warps) // 8 * 8
    return {"maxnreg": regs} if regs < 255 else {}


def _warp_split(plan: DecodePlan) -> int:
    """Warps a tile's tokens are split over (0: the plain tile loop), see ``DEFAULT_WARP_SPLIT``."""
    ok = (
        plan.warp_split
        and plan.loop == "nested"
        and not plan.prefetch
        and plan.pt_chunk > 0
        and plan.page_size >= plan.tile
        and plan.tile // plan.num_warps >= 16
    )
    return plan.num_warps if ok else 0


def merge_grid(plan: DecodePlan) -> tuple[int, int, int]:
    """The merge launch's grid (kernel.merge_duty): G narrow programs + D_CHUNK // WIDE_MERGE_COLS wide ones per
    wide_list entry, times the group's query rows, times D in chunks of D_CHUNK = min(64, D)."""
    d_chunk = min(64, plan.head_dim)
    wide = plan.wide_list.shape[0] if plan.wide_merge else 0
    return plan.grid_size() + wide * (d_chunk // WIDE_MERGE_COLS), plan.group, plan.head_dim // d_chunk


def _merge(plan: DecodePlan, out: torch.Tensor, pdl: bool) -> None:
    """The log-sum-exp merge: one launch of narrow and wide programs (see ``WIDE_MERGE_BLOCK``)."""
    d_chunk = min(64, plan.head_dim)
    g = plan.grid_size()
    wide = plan.wide_list.shape[0] if plan.wide_merge else 0
    launch = {"launch_pdl": True} if pdl else {}  # only where used: the interpreter knows no such option
    if MERGE_MAXNREG and plan.merge_block <= 16 and plan.device.type == "cuda" and not _interpreting():
        launch["maxnreg"] = MERGE_MAXNREG
    _k.merge_kernel[merge_grid(plan)](
        out,
        plan.prog_start,
        plan.merge_first,
        plan.merge_bh,
        plan.merge_seg,
        plan.ws_o,
        plan.ws_lse,
        plan.wide_list,
        g,
        wide,
        out.stride(0),
        out.stride(1),
        NUM_KV_HEADS=plan.num_kv_heads,
        GROUP=plan.group,
        HEAD_DIM=plan.head_dim,
        D_CHUNK=d_chunk,
        BLOCK_P=plan.merge_block,
        NARROW=plan.merge_block if plan.wide_merge else 0,
        WIDE_COLS=WIDE_MERGE_COLS,
        WIDE_BLOCK_P=WIDE_MERGE_BLOCK,
        PDL=pdl,
        HOIST=bool(MERGE_HOIST),
        num_warps=2 if plan.merge_block <= 32 else 4,
        **launch,
    )


def decode_attention(
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
    schedule: str = "dynamic",
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """plan + run in one call. With ``validate`` (default) it also checks, with a host sync, that every
    page id the lengths reach lies in ``[0, num_pages)``."""
    _check_tensor("q", q, 3, (torch.bfloat16, torch.float16))
    _check_tensor("k_cache", k_cache, 4, (q.dtype, torch.float8_e4m3fn))
    if k_cache.shape[1] != page_size:
        _fail(f"k_cache has page size {k_cache.shape[1]}, page_size argument is {page_size}")
    _check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    if q.shape[0] != seq_lens.shape[0]:
        _fail(f"q has batch {q.shape[0]}, seq_lens has {seq_lens.shape[0]}")
    p = plan(
        seq_lens,
        page_table,
        page_size=page_size,
        num_q_heads=q.shape[1],
        num_kv_heads=k_cache.shape[2],
        head_dim=q.shape[2],
        schedule=schedule,
        kv_dtype=k_cache.dtype,
        validate=validate,
    )
    if validate and not _capturing():
        cols = torch.arange(page_table.shape[1], device=page_table.device)
        used = cols[None, :] < ((seq_lens + page_size - 1) // page_size)[:, None]
        ids = page_table[used]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= k_cache.shape[0]):
            _fail(f"page_table holds page ids outside [0, {k_cache.shape[0]}) within the sequence lengths")
    return run(p, q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale, sm_scale=sm_scale, out=out)
