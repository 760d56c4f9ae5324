"""SGLang's KV pool size (``rules.kv_cell_bytes`` / ``rules.kv_pool_tokens``) on hand-computed cases,
and the memory check and simulator pool that use it."""

from __future__ import annotations

import pytest

from hpc_advise import rules
from hpc_advise.advisor import roofline as F
from hpc_advise.advisor import step_model as sm
from hpc_advise.advisor.candidates import Candidate, memory_check, rank_weight_bytes
from hpc_advise.profiles import get_gpu, get_model

GIB = 2**30


def test_gqa_cell_hy3_tp8_bf16_and_fp8():
    hy3 = get_model("hy3")  # 80 layers, 8 KV heads of 128
    # TP8: one KV head per rank, K and V of 128 each, 80 layers
    assert rules.kv_cell_bytes(hy3, 8, 2.0) == 80 * 1 * (128 + 128) * 2 == 40960
    assert rules.kv_cell_bytes(hy3, 8, 1.0) == 20480
    # TP16: fewer KV heads than ranks, each rank keeps one
    assert rules.kv_cell_bytes(hy3, 16, 2.0) == 40960
    assert rules.kv_cell_bytes(hy3, 1, 2.0) == 8 * 40960


def test_mla_cell_deepseek_v3_tp8_and_attention_dp8():
    ds = get_model("deepseek-v3")  # 61 layers, kv_lora_rank 512 + rope 64
    # the latent is whole on every rank whatever attention-TP (TP8: attn-TP 8; attn-DP8: attn-TP 1)
    assert rules.kv_cell_bytes(ds, 8, 2.0) == rules.kv_cell_bytes(ds, 1, 2.0) == 61 * 576 * 2 == 70272
    assert rules.kv_cell_bytes(ds, 8, 1.0) == 35136


def test_dsa_fp8_latent_layout_by_gpu():
    glm = get_model("glm-5")  # 78 layers, 512 + 64, indexer keys 128 fp8 + one fp32 scale
    indexer = 78 * (128 + 4)
    assert rules.kv_cell_bytes(glm, 8, 2.0) == 78 * 576 * 2 + indexer
    assert rules.kv_cell_bytes(glm, 8, 1.0) == 78 * (512 + 512 // 128 * 4 + 64 * 2) + indexer
    # Blackwell's default DSA backend (trtllm) keeps the raw FP8 rows
    assert rules.kv_cell_bytes(glm, 8, 1.0, sm_major=10) == 78 * 576 + indexer


def test_hybrid_linear_attention_layers_hold_no_kv():
    qwen = get_model("qwen3.5-397b-a17b")  # 60 layers, every 4th full attention; 2 KV heads of 256
    assert qwen.num_full_attention_layers == 15
    assert rules.kv_cell_bytes(qwen, 1, 2.0) == 15 * 2 * 512 * 2 == 30720
    assert rules.kv_cell_bytes(qwen, 8, 2.0) == 15360


def test_sliding_window_layers_at_the_swa_pool_ratio():
    oss = get_model("gpt-oss-120b")  # 36 layers, 18 sliding; 8 KV heads of 64
    full = 18 * 1 * 128 * 2
    assert rules.kv_cell_bytes(oss, 8, 2.0) == pytest.approx(full + 0.8 * full)


def test_pool_tokens_by_hand():
    hy3 = get_model("hy3")
    # (140 x 0.9 - 60) GiB = 66 GiB over 40960 bytes a token, whole pages of 64
    got = rules.kv_pool_tokens(hy3, 8, 2.0, memory_gib=140, fraction=0.9, weight_bytes=60 * GIB, page_size=64)
    assert got == int(66 * GIB // 40960) // 64 * 64 == 1730112
    assert rules.kv_pool_tokens(hy3, 8, 2.0, memory_gib=140, fraction=0.9, weight_bytes=130 * GIB) == 0


def test_simulator_pool_is_sglangs_for_the_deployment():
    ds, gpu = get_model("deepseek-v3"), get_gpu("h200")
    q = F.normalize_quant(ds.quantization)
    for dp in (1, 8):
        dep = F.Deployment(8, dp, 8, q, q, 1.0)
        frac = rules.static_memory_fraction(rules.Setup(tp=8, ep=8, attn_dp=dp), gpu.memory_gib, mla=True)
        free = gpu.memory_gib * GIB * frac - rank_weight_bytes(ds, dep)
        assert sm.kv_pool_tokens(ds, gpu, dep) == int(free // 35136)


def test_memory_check_charges_sglangs_cell_per_token():
    qwen, gpu = get_model("qwen3.5-397b-a17b"), get_gpu("h200")
    c = Candidate(tp=8, ep=8, attn_dp=1, moe_runner="auto", kv_dtype="auto")
    _, _, one = memory_check(c, qwen, gpu, 1, 3000, 5000)
    _, _, two = memory_check(c, qwen, gpu, 2, 3000, 5000)
    assert (two["kv_gib"] - one["kv_gib"]) * GIB == pytest.approx(3000 * 15360)
