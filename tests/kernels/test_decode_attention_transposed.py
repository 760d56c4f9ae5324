"""Tests of the transposed attention pass (hpc_advise/kernels/decode_attention/kernel_transposed.py).

CPU: the Triton interpreter at small sizes against the float64 reference on the dequantised inputs (the
tolerances of test_decode_attention.py: fp8 2e-2, bf16 5e-3), NaN-poisoned outputs and unused pool slots,
split segments (a small grid), both schedules; the fp8 path's permuted int32 K load and its fallback to the
plain conversion for a K layout that is not 4-byte aligned; plan validation and the tuned-default fallback.
Offline sm_90a build (slow): warpgroup MMAs, pipelined K/V copies, no spills. GPU (``-m gpu``): real sizes at
the benchmark's shapes and a CUDA-graph replay with new lengths, bitwise equal to eager.
"""

from __future__ import annotations

import pytest
import torch

from hpc_advise.kernels.decode_attention import op
from hpc_advise.kernels.decode_attention.reference import decode_attention_reference
from hpc_advise.runtime.benches import decode_attention as da
from tests.kernels.test_decode_attention import (
    BF16,
    EDGE,
    FP8,
    TOL,
    check,
    check_graph_replay,
    make_case,
    rel_err,
)

EDGE_LENS = [1, 63, 64, 65, 97]
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
    assert "transposed" not in da.variant_config(64, 3, 3, 4, "nested-desc-pc32")
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


# ---------------------------------------------------------------- GPU, real sizes


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens,hq,hkv,kv_dtype,schedule,entry",
    [
        (EDGE + [70000], 64, 8, FP8, "dynamic", 1),
        ([128] * 8 + [3000] * 8 + [70000], 64, 8, FP8, "static", 1),
        (EDGE, 8, 1, FP8, "dynamic", 3),
        (EDGE + [70000], 64, 8, FP8, "dynamic", 6),  # 4 programs/SM: registers capped at 128
        (EDGE + [70000], 64, 8, FP8, "dynamic", 7),  # 4 programs/SM, 3 stages
        ([128] * 8 + [3000] * 8, 64, 8, BF16, "dynamic", 1),
    ],
)
def test_gpu_real_sizes(lens, hq, hkv, kv_dtype, schedule, entry):
    cfg = da.variant_config(*da.SWEEP_SETS["fp8t"]["fp8_configs"][entry])
    if schedule == "static":
        cfg.pop("ctas_per_sm")
    scales = (0.8, 1.3) if kv_dtype == FP8 else (1.0, 1.0)
    p, _ = check(
        lens, hq=hq, hkv=hkv, d=128, page=64, kv_dtype=kv_dtype, schedule=schedule, scales=scales, **cfg
    )
    assert p.transposed


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_matches_eager():
    hq, hkv, d, page = 64, 8, 128, 64
    q, k, v, table, _ = make_case([12800, 100, 12800, 5000], hq=hq, hkv=hkv, d=d, page=page, kv_dtype=FP8)
    lens_buf = torch.tensor([4000, 100, 9000, 64], dtype=torch.int32, device="cuda")
    cfg = da.variant_config(*da.SWEEP_SETS["fp8t"]["fp8_configs"][3])  # 3 programs/SM, registers capped
    p = op.plan(lens_buf, table, page_size=page, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, **cfg)
    assert p.transposed
    steps = ([4001, 1, 12000, 65], [64, 64, 64, 64], [12800, 100, 300, 5000])
    check_graph_replay(p, q, k, v, table, lens_buf, steps, page=page)
