"""Candidates: enumeration, support rules with their reasons, memory fit, launch flags."""

from __future__ import annotations

import pytest

from hpc_advise.advisor.candidates import (
    Candidate,
    check_all,
    enumerate_candidates,
    memory_check,
    support_reason,
)
from hpc_advise.profiles import get_gpu, get_model


def test_enumeration_covers_tp_ep_dp_backends_for_moe():
    model = get_model("hy3")
    cands = enumerate_candidates(model, 8)
    assert {c.tp for c in cands} == {1, 2, 4, 8}
    assert {c.ep for c in cands if c.tp == 8} == {1, 8}
    assert {c.attn_dp for c in cands if c.tp == 4} == {1, 4}
    assert {c.attention_backend for c in cands} == {"fa3", "flashinfer", "triton", "hpc_ops", "hpc_advise"}
    assert {c.moe_runner for c in cands} == {"auto", "deep_gemm", "hpc_ops", "hpc_advise"}
    assert all(c.n_gpus == 8 for c in cands)


def test_dense_model_has_no_moe_dimensions():
    cands = enumerate_candidates(get_model("llama-3.1-8b"), 2)
    assert {c.moe_runner for c in cands} == {None}
    assert {(c.ep, c.attn_dp) for c in cands} == {(1, 1)}


def test_support_reasons():
    h200, b200 = get_gpu("h200"), get_gpu("b200")
    hy3, ds = get_model("hy3"), get_model("deepseek-v3")
    assert "SM90" in support_reason(Candidate(8, attention_backend="fa3"), hy3, b200)
    assert "MLA" in support_reason(Candidate(8, attention_backend="hpc_ops", moe_runner="auto"), ds, h200)
    # ours runs MLA in its MLA form with bf16 KV, not with fp8 KV
    assert support_reason(Candidate(8, attention_backend="hpc_advise", moe_runner="auto"), ds, h200) is None
    fp8 = Candidate(8, attention_backend="hpc_advise", moe_runner="auto", kv_dtype="fp8_e4m3")
    assert "fp8_e4m3 KV on MLA" in support_reason(fp8, ds, h200)
    # deep_gemm needs block-128 FP8: hy3 is per-tensor FP8, DeepSeek-V3 is block-128
    assert "deep_gemm" in support_reason(Candidate(8, moe_runner="deep_gemm"), hy3, h200)
    assert (
        support_reason(Candidate(8, attention_backend="flashinfer", moe_runner="deep_gemm"), ds, h200) is None
    )
    assert (
        support_reason(Candidate(8, attention_backend="hpc_advise", moe_runner="hpc_advise"), hy3, h200)
        is None
    )


def test_memory_fit_weights_and_kv_reasons():
    hy3, h200 = get_model("hy3"), get_gpu("h200")
    ok, why, mem = memory_check(Candidate(1, 8, moe_runner="auto"), hy3, h200, 8, 2000, 4000)
    assert not ok and "weights" in why
    ok, why, mem = memory_check(Candidate(8, moe_runner="auto"), hy3, h200, 8, 2000, 4000)
    assert ok and mem["headroom_gib"] > 0
    # 512 requests of 100K tokens cannot fit, fp8 KV halves the KV bytes
    ok, why, mem_bf16 = memory_check(Candidate(8, moe_runner="auto"), hy3, h200, 512, 100_000, 128_000)
    assert not ok and "KV for 512 requests" in why
    _, _, mem_fp8 = memory_check(
        Candidate(8, moe_runner="auto", kv_dtype="fp8_e4m3"), hy3, h200, 512, 100_000, 128_000
    )
    assert abs(mem_fp8["kv_gib"] * 2 - mem_bf16["kv_gib"]) < 1e-6 * mem_bf16["kv_gib"]


def test_fp8_reupload_is_sized_at_fp8_by_the_memory_check():
    from hpc_advise.profiles.resolve import resolve_model

    h200 = get_gpu("h200")
    c = Candidate(8, ep=8, moe_runner="auto")
    # GLM-5 (744B) in bf16 does not fit 8 x H200; its -FP8 re-upload does, at half the weight bytes
    ok_bf16, why, bf16 = memory_check(c, resolve_model("zai-org/GLM-5"), h200, 8, 2000, 4000)
    ok_fp8, _, fp8 = memory_check(c, resolve_model("zai-org/GLM-5-FP8"), h200, 8, 2000, 4000)
    assert not ok_bf16 and "weights" in why and ok_fp8
    assert fp8["weights_gib"] == pytest.approx(bf16["weights_gib"] / 2, rel=0.01)
    # a row's own precision given explicitly sizes the bf16 profile the same way
    _, _, given = memory_check(
        c, resolve_model("zai-org/GLM-5"), h200, 8, 2000, 4000, ("fp8_block", "fp8_block")
    )
    assert given["weights_gib"] == pytest.approx(fp8["weights_gib"], rel=1e-12)


def test_check_all_keeps_reasons_for_excluded():
    checked = check_all(get_model("hy3"), get_gpu("h200"), 8, lambda c: 16.0, 3000, 8000)
    excluded = [c for c in checked if not c.ok]
    assert excluded and all(c.reason for c in excluded)
    assert any(c.ok for c in checked)
    assert {c.candidate.page_size for c in checked if c.candidate.attention_backend == "hpc_advise"} == {64}
