"""Tests of the transposed attention pass (hpc_advise/kernels/decode_attention/kernel_transposed.py).

CPU: the Triton interpreter at small sizes against the float64 reference on the dequantised inputs (the
tolerances of test_decode_attention.py: fp8 2e-2, bf16 / fp16 5e-3), NaN-poisoned outputs and unused pool
slots, split segments (a small grid), both schedules, fp8 / bf16 / fp16 KV (16-bit KV in q's dtype, no
conversion), batch 1 at each edge length; the fp8 path's permuted int32 K load and its fallback to the plain
conversion for a K layout that is not 4-byte aligned; plan validation and the tuned-default fallback; the
sweep sets' entries (fp8t, t2, fp8w: each head count's shipped default first). The 128-token forms (sweep fp8w; two
pages of 64 per tile): 8 warps (one product over both pages) and 4 warps (two products of 64 rows, op._halves) at
lengths around 64 and 128 tokens. Offline sm_90a build (slow): warpgroup MMAs, pipelined K/V copies, no spills (in
the loop, for the register-capped forms), programs per SM by shared memory and registers. GPU (``-m gpu``): CUDA-graph replays with
new lengths, bitwise equal to eager (fp8 64/8, bf16 64/8 and 8/1; first, so a time-limited device stage runs
them), then real sizes at the benchmark's shapes for every sweep form.
"""

from __future__ import annotations

import pytest
import torch

from hpc_advise.kernels.decode_attention import op
from hpc_advise.kernels.decode_attention.reference import decode_attention_reference
from hpc_advise.runtime.benches import decode_attention as da
from tests.kernels.test_decode_attention import (
    BF16,
    DEVICE,
    EDGE,
    FP8,
    TOL,
    check,
    check_graph_replay,
    make_case,
    rel_err,
)

EDGE_LENS = [1, 63, 64, 65, 97]
EDGE_LENS_128 = EDGE_LENS + [127, 128, 129]  # around the 128-token tile and its second page
# the 128-token forms of sweep fp8w: (num_warps, products per tile)
WIDE_FORMS = [(8, 1), (4, 2)]
# the transposed form at the interpreter's sizes: 4 warps (wgmma on sm_90a at tile 64), a grid of 5
# programs so that segments are split between programs and merged
SMALL = dict(transposed=True, num_warps=4, num_programs=5)


@pytest.mark.parametrize("schedule", ["dynamic", "static"])
@pytest.mark.parametrize(
    "kv_dtype,group,d,tile",
    [
        (FP8, 8, 128, 64),  # the target shape's group and head_dim
        (FP8, 1, 64, 32),
        (FP8, 16, 64, 64),
        (BF16, 8, 64, 32),
        (BF16, 16, 128, 64),
        (BF16, 8, 128, 64),  # the bf16 target shape (sweep t2): both products wgmma from shared memory
        (BF16, 1, 64, 64),
    ],
)
def test_matches_reference(kv_dtype, group, d, tile, schedule):
    scales = (0.8, 1.3) if kv_dtype == FP8 else (1.0, 1.0)
    p, _ = check(
        EDGE_LENS,
        hq=2 * group,
        hkv=2,
        d=d,
        page=64,
        kv_dtype=kv_dtype,
        schedule=schedule,
        scales=scales,
        tuned=True,
        tile=tile,
        **SMALL,
    )
    assert p.transposed


@pytest.mark.parametrize("schedule", ["dynamic", "static"])
@pytest.mark.parametrize("warps,halves", WIDE_FORMS)
@pytest.mark.parametrize(
    "kv_dtype,group,d", [(FP8, 8, 128), (FP8, 1, 64), (FP8, 16, 64), (BF16, 8, 128), (BF16, 16, 64)]
)
def test_128_token_tiles_match_reference(kv_dtype, group, d, warps, halves, schedule):
    # tiles of 128 tokens over two pages of 64, split between the 5 programs and merged
    scales = (0.8, 1.3) if kv_dtype == FP8 else (1.0, 1.0)
    form = SMALL | dict(num_warps=warps, tile=128)
    p, _ = check(
        EDGE_LENS_128,
        hq=2 * group,
        hkv=2,
        d=d,
        page=64,
        kv_dtype=kv_dtype,
        schedule=schedule,
        scales=scales,
        tuned=True,
        **form,
    )
    assert p.transposed and (p.tile, p.num_warps, op._halves(p)) == (128, warps, halves)


@pytest.mark.parametrize("length", EDGE_LENS_128)
@pytest.mark.parametrize("warps,halves", WIDE_FORMS)
def test_128_token_tiles_batch_one(length, warps, halves):
    p, _ = check(
        [length],
        hq=8,
        hkv=1,
        d=64,
        page=64,
        kv_dtype=FP8,
        scales=(0.8, 1.3),
        tuned=True,
        tile=128,
        **(SMALL | dict(num_warps=warps)),
    )
    assert p.transposed and op._halves(p) == halves


def test_fp8_scales_from_tensors_and_long_segment_split():
    # scales as device tensors (read by the kernel), one request over many tiles split over the grid
    lens = [700, 3, 129]
    q, k, v, table, seq_lens = make_case(lens, hq=8, hkv=1, d=64, page=64, kv_dtype=FP8)
    p = op.plan(
        seq_lens,
        table,
        page_size=64,
        num_q_heads=8,
        num_kv_heads=1,
        head_dim=64,
        tile=64,
        kv_dtype=FP8,
        **SMALL,
    )
    ks, vs = torch.tensor([0.45]), torch.tensor([2.5])
    out = torch.full_like(q, float("nan"))
    op.run(p, q, k, v, k_scale=ks, v_scale=vs, out=out)
    ref = decode_attention_reference(q, k, v, table, seq_lens, page_size=64, k_scale=0.45, v_scale=2.5)
    assert rel_err(out, ref) <= TOL[FP8]


def _check_16bit(lens, *, dtype, hq, hkv, d, page=64, **plan_kw):
    """``check`` (NaN-poisoned output and pool slots, the tolerance of ``dtype``) with q and KV both in
    ``dtype`` and the tuned variant of that KV dtype for the knobs ``plan_kw`` leaves unset; returns the plan."""
    p, _ = check(lens, hq=hq, hkv=hkv, d=d, page=page, kv_dtype=dtype, q_dtype=dtype, tuned=True, **plan_kw)
    return p


@pytest.mark.parametrize("schedule", ["dynamic", "static"])
@pytest.mark.parametrize("group,d,tile", [(8, 128, 64), (1, 64, 32), (16, 64, 64)])
def test_fp16_kv_matches_reference(group, d, tile, schedule):
    p = _check_16bit(
        EDGE_LENS, dtype=torch.float16, hq=2 * group, hkv=2, d=d, schedule=schedule, tile=tile, **SMALL
    )
    assert p.transposed and not p.f16_dot


@pytest.mark.parametrize("length", EDGE_LENS)
def test_bf16_batch_one(length):
    # one request of each edge length, group 8, D 128, split over the 5 programs where it has > 1 tile of 32
    p = _check_16bit([length], dtype=BF16, hq=8, hkv=1, d=128, tile=32, **SMALL)
    assert p.transposed


def test_fp8_k_layout_not_4_byte_aligned_takes_plain_conversion():
    # the fp16-product path reads K as int32 (4 e4m3); a K whose head stride is 2 mod 4 converts K and V to
    # q's dtype instead (op.run decides per call), still exact inputs and the same tolerance
    lens = [97, 65]
    q, k, v, table, seq_lens = make_case(lens, hq=4, hkv=2, d=64, page=64, kv_dtype=FP8)
    pad = torch.zeros(*k.shape[:3], 66, dtype=torch.uint8).view(FP8)
    pad[..., :64] = k
    k_odd = pad[..., :64]
    assert k_odd.stride(2) % 4 == 2
    p = op.plan(
        seq_lens,
        table,
        page_size=64,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=64,
        tile=64,
        kv_dtype=FP8,
        **SMALL,
    )
    out = torch.full_like(q, float("nan"))
    op.run(p, q, k_odd, v, out=out)
    ref = decode_attention_reference(q, k, v, table, seq_lens, page_size=64)
    assert rel_err(out, ref) <= TOL[FP8]


def test_validation_and_tuned_fallback(monkeypatch):
    _, _, _, table, seq_lens = make_case([70], hq=8, hkv=1, d=64, page=16)
    geo = dict(page_size=16, num_q_heads=8, num_kv_heads=1, head_dim=64)
    # asked for explicitly where it cannot run: a clear error naming what it needs
    with pytest.raises(ValueError, match="page_size >= tile"):
        op.plan(seq_lens, table, tile=64, transposed=True, desc=True, pt_chunk=32, **geo)
    with pytest.raises(ValueError, match="loop='nested'"):
        op.plan(seq_lens, table, tile=16, transposed=True, loop="flat", pt_chunk=32, **geo)
    with pytest.raises(ValueError, match="pt_chunk > 0"):
        op.plan(seq_lens, table, tile=16, transposed=True, desc=True, pt_chunk=0, **geo)
    # 128-token tiles need pages of 64 (two page ids per tile); 16-token pages do not hold them
    with pytest.raises(ValueError, match=r"page_size >= tile or == tile / 2.*page_size 16 and tile 128"):
        op.plan(seq_lens, table, tile=128, transposed=True, desc=True, pt_chunk=32, **geo)
    # as a tuned default it falls back to the nested loop's kernel where it cannot run
    tuned = dict(op.TUNED_MANY_KV_HEADS)
    tuned[FP8] = tuned[FP8] | {"transposed": True, "tile": 64}
    monkeypatch.setattr(op, "TUNED_MANY_KV_HEADS", tuned)
    _, _, _, table8, lens8 = make_case([70], hq=64, hkv=8, d=64, page=16)
    geo8 = geo | dict(num_q_heads=64, num_kv_heads=8)
    assert not op.plan(lens8, table8, kv_dtype=FP8, **geo8).transposed  # page 16 < tile 64
    _, _, _, table64, lens64 = make_case([70], hq=64, hkv=8, d=64, page=64)
    assert op.plan(lens64, table64, kv_dtype=FP8, **(geo8 | dict(page_size=64))).transposed


def test_sweep_set_fp8t_entries_are_valid_plans():
    # the benchmark's 'fp8t' sweep: every transposed candidate builds a transposed plan at its shape
    assert da.variant_config(64, 3, 3, 4, "nested-desc-pc32-tr")["transposed"] is True
    # an entry without '-tr' runs the nested loop's kernel even where the tuned default is the transposed one
    assert da.variant_config(64, 3, 3, 4, "nested-desc-pc32")["transposed"] is False
    _, _, _, t8, l8 = make_case([300], hq=64, hkv=8, d=128, page=64, kv_dtype=FP8)
    base = da.variant_config(*da.SWEEP_CONFIGS_FP8[0])
    base.pop("ctas_per_sm")
    geo8 = dict(page_size=64, num_q_heads=64, num_kv_heads=8, head_dim=128, num_programs=7, kv_dtype=FP8)
    assert not op.plan(l8, t8, **base, **geo8).transposed
    _, _, _, table, seq_lens = make_case(
        [4096, 70], hq=64, hkv=8, d=128, page=64, kv_dtype=FP8, extra_pages=0
    )
    entries = da.SWEEP_SETS["fp8t"]["fp8_configs"]
    assert entries[0] == da.SWEEP_CONFIGS_FP8[0]  # the default first (and again last in sweep())
    for entry in entries[1:]:
        cfg = da.variant_config(*entry)
        cfg.pop("ctas_per_sm")
        p = op.plan(
            seq_lens, table, page_size=64, num_q_heads=64, num_kv_heads=8, head_dim=128, num_programs=7, **cfg
        )
        assert p.transposed and p.f16_dot, entry


def test_sweep_set_fp8w_defaults_first_and_128_token_forms():
    # sweep fp8w: each head count's shipped fp8 default first (timed first and again last); every other entry a
    # transposed 128-token plan with fp16 products at page 64, 8 warps as one product, 4 warps as two
    by_heads = da.SWEEP_SETS["fp8w"]["configs_by_heads"]
    assert {(kv, f"{hq}/{hkv}") for _, hq, hkv, kv in da.SWEEP_SETS["fp8w"]["cases"]} == set(by_heads)
    for (_, heads), entries in by_heads.items():
        hq, hkv = map(int, heads.split("/"))
        _, _, _, table, seq_lens = make_case([4096, 70], hq=hq, hkv=hkv, d=128, page=64, kv_dtype=FP8)
        geo = dict(page_size=64, num_q_heads=hq, num_kv_heads=hkv, head_dim=128, num_programs=7)
        shipped = op.plan(seq_lens, table, kv_dtype=FP8, **geo)
        for i, entry in enumerate(entries):
            cfg = da.variant_config(*entry)
            ctas = cfg.pop("ctas_per_sm")
            p = op.plan(seq_lens, table, **cfg, **geo)
            assert p.transposed and p.f16_dot, entry
            if i == 0:
                same = ("tile", "num_warps", "num_stages", "seg_cost", "transposed")
                assert all(getattr(p, f) == getattr(shipped, f) for f in same), heads
                assert op.tuned_config(FP8, hkv)["ctas_per_sm"] == ctas, heads
            else:
                assert (p.tile, op._halves(p)) == (128, 2 if p.num_warps == 4 else 1), entry


def test_fp8_few_kv_heads_default_and_its_page_fallback():
    # fp8 8/1 (op.TUNED_FEW_KV_HEADS, sweep t2): the transposed kernel at 2 programs/SM where pages hold a tile;
    # with page 16 the plain loop at its previous knobs (3 programs/SM), not the transposed form's grid
    sms = op._num_sms(torch.device(DEVICE))
    for page, transposed, ctas in ((64, True, 2), (16, False, 3)):
        _, _, _, table, seq_lens = make_case([300, 5], hq=8, hkv=1, d=128, page=page, kv_dtype=FP8)
        p = op.plan(
            seq_lens, table, page_size=page, num_q_heads=8, num_kv_heads=1, head_dim=128, kv_dtype=FP8
        )
        assert (p.transposed, p.num_programs, p.tile, p.num_warps) == (transposed, sms * ctas, 64, 4), page
    # bf16 and head_dim 256 keep their tables
    assert "transposed" not in op.tuned_config(BF16, 1) and "transposed" not in op.tuned_config(FP8, 1, 256)


def test_sweep_set_t2_defaults_first_and_transposed_candidates():
    # sweep t2: each head count's first entry is the default of the time (the baseline timed first and again last:
    # for bf16 today's default, for fp8 8/1 the plain loop, still the default where pages are shorter than 64);
    # every other entry builds a transposed plan at its shape, fp16 products only for fp8; fp8 8/1 now ships the
    # sweep's pick, entry 1 (2 programs/SM)
    by_heads = da.SWEEP_SETS["t2"]["configs_by_heads"]
    assert {(kv, f"{hq}/{hkv}") for _, hq, hkv, kv in da.SWEEP_SETS["t2"]["cases"]} == set(by_heads)
    same = (
        "tile",
        "num_stages",
        "num_warps",
        "seg_cost",
        "snap",
        "whole_below",
        "pt_chunk",
        "pdl",
        "warp_split",
    )
    for (kv, heads), entries in by_heads.items():
        dtype = FP8 if kv == "fp8" else BF16
        hq, hkv = map(int, heads.split("/"))
        _, _, _, table, seq_lens = make_case([4096, 70], hq=hq, hkv=hkv, d=128, page=64, kv_dtype=dtype)
        geo = dict(page_size=64, num_q_heads=hq, num_kv_heads=hkv, head_dim=128, num_programs=7)
        shipped = op.plan(seq_lens, table, kv_dtype=dtype, **geo)
        plans = []
        for i, entry in enumerate(entries):
            cfg = da.variant_config(*entry)
            cfg.pop("ctas_per_sm")
            plans.append(op.plan(seq_lens, table, **cfg, **geo))
            assert plans[-1].transposed == (i > 0) and plans[-1].f16_dot == (kv == "fp8"), entry
        ships = 1 if kv == "fp8" else 0
        assert all(getattr(plans[ships], f) == getattr(shipped, f) for f in same + ("transposed",)), kv
        assert op.tuned_config(dtype, hkv).get("ctas_per_sm", op.DEFAULT_CTAS_PER_SM) == entries[ships][1]
        before = op.tuned_config(dtype, hkv, page_size=16)  # fp8: the plain loop's knobs (page < 64)
        assert (
            before.get("ctas_per_sm", op.DEFAULT_CTAS_PER_SM) == entries[0][1] and "transposed" not in before
        )


@pytest.mark.slow
def test_bf16_compiles_for_sm90_with_wgmma_and_kv_buffers():
    # 16-bit KV (sweep t2's forms, bf16 64/8 and 8/1, D 128, tile 64, 4 warps): both products are warpgroup MMAs
    # with K and Vᵀ read from their async-copy buffers (no conversion, no register staging); 3 stages: 3 K/V
    # buffers, 2 programs per SM; 2 stages: 2 buffers, room for 3 programs by shared memory (op.run caps the
    # registers at 168 for them)
    from tests.kernels.sm90_compile import compile_sm90

    types = "*bf16 *bf16 *bf16 *bf16 *i32 *i32 *i32 *fp32 *fp32 *fp32 fp32 fp32 " + "i32 " * 12
    strides = ["stride_qb", "stride_qh", "stride_kp", "stride_ks", "stride_kh", "stride_vp", "stride_vs"]
    strides += ["stride_vh", "stride_ob", "stride_oh"]
    job = ["hpc_advise.kernels.decode_attention.kernel_transposed", "decode_transposed_kernel", types]
    consts = dict(GROUP=8, GROUP_PAD=16, HEAD_DIM=128, PAGE=64, TILE=64, SCALES_FROM_PTR=False, PT_CHUNK=32)
    jobs = [job + [consts | dict(NUM_STAGES=st, PDL=True), 4, st, strides] for st in (3, 2)]
    three, two = compile_sm90(jobs)
    for r in (three, two):
        assert r["wgmma"] == 2 and r["stack"] == 0 and r["ctas_per_sm"] >= 2, r
    assert three["async_copies"] == 6 and two["async_copies"] == 4, (three, two)  # K and V, a copy per buffer
    assert 3 * (two["shared"] + 1024) <= 228 * 1024 < 3 * (three["shared"] + 1024), (three, two)


@pytest.mark.slow
def test_transposed_compiles_for_sm90_with_wgmma():
    # what Triton 3.6 builds for the H200 at the target shape (fp8 64/8, D 128, tile 64, 4 warps): both
    # products as warpgroup MMAs, K/V copies pipelined, no spills, 2 programs per SM without a register cap
    from tests.kernels.sm90_compile import compile_sm90

    types = "*bf16 *fp8e4nv *fp8e4nv *bf16 *i32 *i32 *i32 *fp32 *fp32 *fp32 fp32 fp32 " + "i32 " * 12
    strides = ["stride_qb", "stride_qh", "stride_kp", "stride_ks", "stride_kh", "stride_vp", "stride_vs"]
    consts = dict(
        GROUP=8,
        GROUP_PAD=16,
        HEAD_DIM=128,
        PAGE=64,
        TILE=64,
        NUM_STAGES=3,
        SCALES_FROM_PTR=False,
        PT_CHUNK=32,
        F16_DOT=True,
        ASM_CVT=True,
        PDL=True,
    )
    job = ["hpc_advise.kernels.decode_attention.kernel_transposed", "decode_transposed_kernel"]
    (r,) = compile_sm90([job + [types, consts, 4, 3, strides + ["stride_vh", "stride_ob", "stride_oh"]]])
    assert r["wgmma"] == 2 and r["async_copies"] > 0, r
    assert r["stack"] == 0 and r["ctas_per_sm"] >= 2, r


@pytest.mark.slow
def test_128_token_tiles_compile_for_sm90_without_loop_spills():
    # sweep fp8w's forms at the target shape (fp8 64/8, D 128, page 64, tile 128, 2 programs/SM): 8 warps with
    # registers capped at 128 (op._register_cap) and 4 warps as two m64 products (255 registers, no cap); both
    # products warpgroup MMAs, K/V copies pipelined, no local memory inside the tile loop, 2 programs per SM;
    # per program and token fewer barriers than the 64-token default (5 per 64 tokens at 4 warps)
    from tests.kernels.sm90_compile import compile_sm90

    types = "*bf16 *fp8e4nv *fp8e4nv *bf16 *i32 *i32 *i32 *fp32 *fp32 *fp32 fp32 fp32 " + "i32 " * 12
    strides = ["stride_qb", "stride_qh", "stride_kp", "stride_ks", "stride_kh", "stride_vp", "stride_vs"]
    strides += ["stride_vh", "stride_ob", "stride_oh"]
    consts = dict(GROUP=8, GROUP_PAD=16, HEAD_DIM=128, PAGE=64, TILE=128, NUM_STAGES=3, SCALES_FROM_PTR=False)
    consts |= dict(PT_CHUNK=32, F16_DOT=True, ASM_CVT=True, PDL=True)
    job = ["hpc_advise.kernels.decode_attention.kernel_transposed", "decode_transposed_kernel", types]
    eight, four = compile_sm90(
        [job + [consts, 8, 3, strides, 128], job + [consts | dict(HALVES=2), 4, 3, strides]]
    )
    for r, halves in ((eight, 1), (four, 2)):
        assert r["wgmma"] == 2 * halves and r["async_copies"] == 6 * halves, r
        assert r["loop"]["local"] == 0 and r["ctas_per_sm"] >= 2, r
        assert r["loop"]["barriers"] / 128 < 5 / 64, r
    assert eight["registers"] <= 128, eight


# ---------------------------------------------------------------- GPU, real sizes

FP8T = da.SWEEP_SETS["fp8t"]["fp8_configs"]
T2 = da.SWEEP_SETS["t2"]["configs_by_heads"]
FP8W = da.SWEEP_SETS["fp8w"]["configs_by_heads"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "hq,hkv,kv_dtype,entry",
    [
        (64, 8, FP8, FP8T[3]),  # fp8 64/8 default: 3 programs/SM, registers capped
        (64, 8, BF16, T2[("bf16", "64/8")][2]),  # bf16: 3 programs/SM, 2 stages, registers capped
        (8, 1, BF16, T2[("bf16", "8/1")][1]),  # bf16: 2 programs/SM, 3 stages
        (64, 8, FP8, FP8W[("fp8", "64/8")][1]),  # 128-token tiles: 8 warps, registers capped at 128
        (64, 8, FP8, FP8W[("fp8", "64/8")][3]),  # ... 4 warps, two products per tile
        (8, 1, FP8, FP8W[("fp8", "8/1")][1]),
    ],
    ids=["fp8-64x8", "bf16-64x8", "bf16-8x1", "fp8w-64x8-8warps", "fp8w-64x8-4warps", "fp8w-8x1-8warps"],
)
def test_gpu_cuda_graph_replay_matches_eager(hq, hkv, kv_dtype, entry):
    # first in the file: the device stage runs these before the real-size cases (-n 2)
    d, page = 128, 64
    q, k, v, table, _ = make_case(
        [12800, 100, 12800, 5000], hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv_dtype
    )
    lens_buf = torch.tensor([4000, 100, 9000, 64], dtype=torch.int32, device="cuda")
    cfg = da.variant_config(*entry)
    p = op.plan(lens_buf, table, page_size=page, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, **cfg)
    assert p.transposed
    steps = ([4001, 1, 12000, 65], [64, 64, 64, 64], [12800, 100, 300, 5000])
    check_graph_replay(p, q, k, v, table, lens_buf, steps, page=page)


@pytest.mark.gpu
def test_gpu_fp16_kv_real_sizes():
    cfg = da.variant_config(*T2[("bf16", "8/1")][2])  # the bf16 8/1 candidate's form on fp16 q and KV
    p = _check_16bit(EDGE + [70000], dtype=torch.float16, hq=8, hkv=1, d=128, **cfg)
    assert p.transposed


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens,hq,hkv,kv_dtype,schedule,entry",
    [
        ([128] * 8 + [3000] * 8 + [70000], 64, 8, BF16, "dynamic", T2[("bf16", "64/8")][1]),
        (EDGE + [70000], 8, 1, BF16, "dynamic", T2[("bf16", "8/1")][2]),
        (EDGE, 64, 8, BF16, "static", T2[("bf16", "64/8")][2]),
        (EDGE + [70000], 8, 1, FP8, "dynamic", T2[("fp8", "8/1")][3]),  # 3 programs/SM, 4 stages
        (EDGE + [70000], 64, 8, FP8, "dynamic", FP8T[7]),  # 4 programs/SM, 3 stages
        # sweep fp8t's call ran these four (passed)
        (EDGE + [70000], 64, 8, FP8, "dynamic", FP8T[1]),
        ([128] * 8 + [3000] * 8 + [70000], 64, 8, FP8, "static", FP8T[1]),
        (EDGE, 8, 1, FP8, "dynamic", FP8T[3]),
        (EDGE + [70000], 64, 8, FP8, "dynamic", FP8T[6]),  # 4 programs/SM: registers capped at 128
        # sweep fp8w's 128-token forms (lengths around 128 too)
        pytest.param(
            EDGE + [127, 129, 70000], 64, 8, FP8, "dynamic", FP8W[("fp8", "64/8")][2], id="fp8w-8w-s2"
        ),
        pytest.param(
            EDGE + [127, 129, 70000], 64, 8, FP8, "dynamic", FP8W[("fp8", "64/8")][4], id="fp8w-4w-s2"
        ),
        pytest.param(
            [128] * 8 + [3000] * 8 + [70000],
            64,
            8,
            FP8,
            "static",
            FP8W[("fp8", "64/8")][1],
            id="fp8w-8w-static",
        ),
        pytest.param(
            EDGE + [127, 129, 70000], 8, 1, FP8, "dynamic", FP8W[("fp8", "8/1")][3], id="fp8w-8x1-4w"
        ),
    ],
)
def test_gpu_real_sizes(lens, hq, hkv, kv_dtype, schedule, entry):
    cfg = da.variant_config(*entry)
    if schedule == "static":
        cfg.pop("ctas_per_sm")
    scales = (0.8, 1.3) if kv_dtype == FP8 else (1.0, 1.0)
    p, _ = check(
        lens, hq=hq, hkv=hkv, d=128, page=64, kv_dtype=kv_dtype, schedule=schedule, scales=scales, **cfg
    )
    assert p.transposed
