"""What Triton builds for the H200 (sm_90a, offline: tests/kernels/sm90_compile.py) from the shipped forms of
paged decode attention: each tuned config's attention pass fits the programs per SM its config asks for, with
K/V copies pipelined and no spills in the tile loop; the merge launch stays at its register cap without spilling
(16 programs per SM); the planner needs next to no stack. The interpreter runs none of this, so a CPU test of
outputs cannot see it."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from hpc_advise.kernels.decode_attention import op  # noqa: E402

KERNEL = "hpc_advise.kernels.decode_attention.kernel"
STRIDES = ["stride_qb", "stride_qh", "stride_kp", "stride_ks", "stride_kh", "stride_vp", "stride_vs"]
STRIDES += ["stride_vh", "stride_ob", "stride_oh"]  # multiples of 16 at the benchmark's shapes
PASS_TYPES = "*bf16 *{kv} *{kv} *bf16 " + "*i32 " * 3 + "*fp32 *fp32 *fp32 fp32 fp32 " + "i32 " * 12


def attention_job(kv: str, cfg, *, d=128, page=64, mip=False, cap=None) -> list:
    """The attention pass op.run launches for ``cfg`` (group 8, pages of ``page``, on the GPU: PDL on)."""
    f16 = cfg.f16_dot and kv != "bf16"
    consts = dict(GROUP=8, GROUP_PAD=16, HEAD_DIM=d, PAGE=page, TILE=cfg.tile, NUM_STAGES=op.NUM_STAGES)
    consts |= dict(SCALES_FROM_PTR=False, PT_CHUNK=op.PT_CHUNK, F16_DOT=f16, ASM_CVT=f16, PDL=True)
    consts |= dict(MERGE_IN_PASS=mip)
    if cfg.transposed:
        module, name = KERNEL + "_transposed", "decode_transposed_kernel"
    else:
        module, name = KERNEL, "decode_kernel"
        split = cfg.warp_split and page >= cfg.tile and cfg.tile // cfg.num_warps >= 16
        consts |= dict(WARP_SPLIT=cfg.num_warps if split else 0)
    job = [module, name, PASS_TYPES.format(kv=kv), consts, cfg.num_warps, op.NUM_STAGES, STRIDES]
    return job + ([cap] if cap else [])


def transposed_cap(cfg) -> int:
    """op._register_cap's maxnreg for a grid of cfg.ctas_per_sm programs per SM."""
    return 65536 // (cfg.ctas_per_sm * 32 * cfg.num_warps) // 8 * 8


# name -> (KV type, tuned_config arguments (KV, KV heads, head_dim, page), attention_job keywords, programs per SM
# that fit, stack bytes at most)
FORMS = {
    "bf16 8/1": ("bf16", ("bf16", 1, 128, 64), {}, 3, 0),
    "bf16 64/8, in-pass merge": ("bf16", ("bf16", 8, 128, 64), dict(mip=True), 3, 0),
    "fp8 8/1 page 16, fp16 products": ("fp8e4nv", ("fp8", 1, 128, 16), {}, 3, 8),
    "fp8 8/1 transposed": ("fp8e4nv", ("fp8", 1, 128, 64), {}, 2, 0),
    # registers capped for 3 programs per SM (op._register_cap): spills outside the tile loop only
    "fp8 64/8 transposed, capped": ("fp8e4nv", ("fp8", 8, 128, 64), dict(cap=True), 3, 72),
    # the warp split's per-warp [16, 256] fp32 accumulators: 255 registers and spills; shared memory lets 3
    # programs share an SM where the tuned config asks for 4 (the grid then runs in more than one wave)
    "fp8 64/8 D 256 warp split": ("fp8e4nv", ("fp8", 8, 256, 64), dict(d=256), 3, 144),
}
GROUPS = [list(FORMS)[:3], list(FORMS)[3:]]


@pytest.mark.slow
@pytest.mark.parametrize("names", GROUPS, ids=["nested", "transposed-and-split"])
def test_shipped_forms_build_for_sm90_at_their_residency(names):
    from tests.kernels.sm90_compile import compile_sm90

    jobs = []
    for name in names:
        kv, args, kw, _, _ = FORMS[name]
        kw, cfg = dict(kw), op.tuned_config(*args)
        if kw.pop("cap", False):
            kw["cap"] = transposed_cap(cfg)
        jobs.append(attention_job(kv, cfg, page=args[3], **kw))
    for name, r in zip(names, compile_sm90(jobs), strict=True):
        _, args, _, ctas, stack = FORMS[name]
        assert r["async_copies"] > 0 and r["ctas_per_sm"] == ctas and r["stack"] <= stack, (name, r)
        if op.tuned_config(*args).transposed:
            assert r["wgmma"] == 2 and r["loop"]["local"] == 0, (name, r)


@pytest.mark.slow
def test_merge_and_planner_build_for_sm90():
    # the merge launch at its register cap without spills: 16 programs per SM; the planner with the in-pass
    # merge's bookkeeping, both schedules, next to no stack
    from tests.kernels.sm90_compile import compile_sm90

    merge_types = "*bf16 " + "*i32 " * 4 + "*fp32 *fp32 *i32 i32 i32 i32 i32"
    merge_consts = dict(NUM_KV_HEADS=8, GROUP=8, HEAD_DIM=128, D_CHUNK=64, PDL=True, BLOCK_P=op.MERGE_BLOCK)
    merge_consts |= dict(WIDE_COLS=op.WIDE_MERGE_COLS, WIDE_BLOCK_P=op.WIDE_MERGE_BLOCK)
    merge = [KERNEL, "merge_kernel", merge_types, merge_consts, 2, 1, ["stride_ob"], op.MERGE_MAXNREG]
    plan_types = "*i32 " * 13 + "i32 " * 7
    plan_consts = dict(
        NUM_KV_HEADS=8, TILE=64, BLOCK_B=256, BLOCK_G=512, G_STEPS=1, SEARCH_STEPS=9, BLOCK_P=16
    )
    plans = [[KERNEL, "plan_kernel", plan_types, plan_consts | {"STATIC": s, "MERGE_IN_PASS": 32}, 4, 1, []]
             for s in (False, True)]  # fmt: skip
    m, *p = compile_sm90([merge, *plans])
    assert m["stack"] == 0 and m["registers"] <= op.MERGE_MAXNREG and m["ctas_per_sm"] == 16, m
    assert all(r["stack"] <= 8 for r in p), p
