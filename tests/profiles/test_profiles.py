"""Shipped GPU and model profiles: every file loads, names resolve, derived numbers match hand-computed
values (Llama-3.1-8B dense GQA; DeepSeek-V3 MLA MoE; Hy3 GQA MoE; Qwen3-30B-A3B), config.json parsing."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import pytest

from hpc_advise.profiles import (
    GpuProfile,
    ModelConfigError,
    ModelProfile,
    ProfileNotFound,
    find_gpu,
    get_gpu,
    get_model,
    list_gpus,
    list_models,
)
from hpc_advise.profiles.hf_config import from_hf_config, quantization_scheme

ISSUE_GPUS = {"h20", "h100", "h200", "h800", "a100", "l40s", "b200", "b300"}
ISSUE_MODELS = {
    "hy3",
    "deepseek-v3",
    "qwen3-235b-a22b",
    "qwen3-30b-a3b",
    "qwen3-32b",
    "qwen3.5-397b-a17b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "glm-5",
    "kimi-k2.5",
    "minimax-m2.5",
    "gpt-oss-120b",
}


# ----- GPUs ---------------------------------------------------------------------------------------
def test_every_issue_gpu_is_shipped_and_sane():
    gpus = {g.key: g for g in list_gpus()}
    assert ISSUE_GPUS <= set(gpus)
    for g in gpus.values():
        assert isinstance(g, GpuProfile)
        assert g.memory_gib > 0 and g.mem_bw_tbps > 0 and g.bf16_tflops > 0 and g.sm_count > 0
        assert g.tf32_tflops < g.bf16_tflops, g.key  # dense tensor rates: tf32 is half of bf16
        if g.fp8_tflops is not None:
            assert g.fp8_tflops == pytest.approx(2 * g.bf16_tflops, rel=0.05), g.key
        assert g.vendor_source
        if g.measured:
            assert g.measured_source


@pytest.mark.parametrize("name", ["h200", "H200", "NVIDIA H200", "nvidia_h200", "h200-sxm", " H200 SXM "])
def test_gpu_names_resolve(name):
    assert get_gpu(name).key == "h200"


def test_nvml_names_resolve_and_unknown_does_not():
    assert find_gpu("NVIDIA H100 80GB HBM3").key == "h100"
    assert find_gpu("NVIDIA A100-SXM4-80GB").key == "a100"
    assert find_gpu("NVIDIA H100 PCIe") is None  # different part: no silent match to SXM figures
    with pytest.raises(ProfileNotFound, match="did you mean h200"):
        get_gpu("h2000")


def test_rate_prefers_measured_then_vendor():
    h200, h100, a100 = get_gpu("h200"), get_gpu("h100"), get_gpu("a100")
    assert h200.rate("bf16_tflops") == 758.0 and h200.bf16_tflops == 989.4
    assert h200.rate("copy_bw_tbps") == 4.12
    assert h100.rate("copy_bw_tbps") == 3.35  # falls back to mem_bw_tbps
    assert h100.rate("allreduce_busbw_gbps") == 450.0  # falls back to NVLink per direction
    assert a100.rate("fp8_tflops") is None
    with pytest.raises(KeyError):
        h100.rate("warp_speed")


def test_with_measured_overlays_without_mutating():
    h100 = get_gpu("h100")
    local = h100.with_measured({"copy_bw_tbps": 3.0, "bf16_tflops": 700}, "this machine")
    assert local.rate("copy_bw_tbps") == 3.0 and local.rate("bf16_tflops") == 700.0
    assert local.measured_source == "this machine"
    assert h100.measured == {} and get_gpu("h100").rate("copy_bw_tbps") == 3.35


# ----- models: shipped files -------------------------------------------------------------------------
def test_every_issue_model_is_shipped_with_source_and_derived_numbers():
    models = {m.key: m for m in list_models()}
    assert ISSUE_MODELS <= set(models)
    for m in models.values():
        assert isinstance(m, ModelProfile)
        assert m.source and m.hf_id
        d = m.derived()
        assert d["weight_bytes"] > 0, m.key
        assert 0 < d["active_params_per_token"] <= d["total_params"]
        assert d["kv_bytes_per_token_fp8"] * 2 == pytest.approx(
            d["kv_bytes_per_token_bf16"], abs=m.indexer_bytes_per_token() + 1
        )
        assert m.is_moe == (m.num_experts > 0)


# published totals (model cards), as a cross-check of the shapes in the shipped files
@pytest.mark.parametrize(
    "key,total_b,active_b",
    [
        ("deepseek-v3", 671, 37),
        ("qwen3-235b-a22b", 235, 22),
        ("qwen3-30b-a3b", 30.5, 3.3),
        ("qwen3-32b", 32.8, None),
        ("llama-3.1-70b", 70.6, None),
        ("glm-5", 744, 40),
        ("kimi-k2.5", 1030, 32),
        ("minimax-m2.5", 229, None),
        ("gpt-oss-120b", 116.8, None),
        ("hy3", 295, 21),
        ("qwen3.5-397b-a17b", 397, 17),
    ],
)
def test_totals_match_model_cards(key, total_b, active_b):
    m = get_model(key)
    assert m.total_params() / 1e9 == pytest.approx(total_b, rel=0.02)
    if active_b is not None:
        assert m.active_params_per_token() / 1e9 == pytest.approx(active_b, rel=0.05)


@pytest.mark.parametrize(
    "name",
    ["hy3", "HY3", "tencent/Hy3-preview", "Hy3-preview", "deepseek-ai/DeepSeek-R1", "Qwen/Qwen3-235B-A22B"],
)
def test_model_names_resolve(name):
    get_model(name)


def test_unknown_model_suggests():
    with pytest.raises(ProfileNotFound, match="did you mean"):
        get_model("qwen3-32")


# ----- hand-computed derived numbers ----------------------------------------------------------------
def test_llama_3_1_8b_by_hand():
    m = get_model("llama-3.1-8b")
    assert m.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131072
    assert m.kv_bytes_per_token(1) == 65536
    per_layer = (4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096) + 3 * 4096 * 14336 + 2 * 4096
    total = 32 * per_layer + 2 * 128256 * 4096 + 4096
    assert total == 8_030_261_248  # Meta's published count
    assert m.total_params() == total == m.active_params_per_token()
    assert m.weight_bytes() == 2 * total
    assert m.kv_bytes(1000) == 1000 * 131072


def test_deepseek_v3_by_hand():
    m = get_model("deepseek-v3")
    assert m.attention == "mla" and m.num_moe_layers == 58 and m.num_dense_layers == 3
    assert m.kv_bytes_per_token() == 61 * (512 + 64) * 2 == 70272
    mla = (7168 * 1536 + 1536 + 1536 * 128 * 192) + (7168 * 576 + 512 + 512 * 128 * 256) + 128 * 128 * 7168
    assert mla == 187_107_328
    expert = 3 * 7168 * 2048
    moe_layer = mla + 256 * expert + expert + (256 * 7168 + 256) + 2 * 7168
    dense_layer = mla + 3 * 7168 * 18432 + 2 * 7168
    total = 58 * moe_layer + 3 * dense_layer + 2 * 129280 * 7168 + 7168
    assert m.total_params() == total == 671_026_419_200
    assert m.active_params_per_token() == total - 58 * 248 * expert == 37_552_297_472
    # fp8 128x128 block weights + one fp32 scale per block; embedding, LM head, norms, router in bf16
    emb_norm = 2 * 129280 * 7168 + (2 * 61 + 1) * 7168
    router = 58 * (256 * 7168 + 256)
    quantized = total - emb_norm - router
    assert m.weight_bytes() == math.ceil(quantized * (1 + 4 / 16384) + 2 * (emb_norm + router))


def test_hy3_by_hand():
    m = get_model("hy3")
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim) == (80, 4096, 64, 8, 128)
    assert (m.num_experts, m.top_k, m.num_shared_experts, m.moe_intermediate_size) == (192, 8, 1, 1536)
    assert (m.router_dtype, m.router_scoring, m.router_bias, m.quantization) == (
        "fp32",
        "sigmoid",
        True,
        "fp8-per-tensor",
    )
    assert m.kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2 == 327680
    attn = 4096 * 64 * 128 + 2 * 4096 * 8 * 128 + 64 * 128 * 4096 + 2 * 128  # + per-head q/k norm
    expert = 3 * 4096 * 1536
    router = 192 * 4096 + 192
    moe_layer = attn + 192 * expert + expert + router + 2 * 4096
    dense_layer = attn + 3 * 4096 * 13312 + 2 * 4096
    emb = 120832 * 4096
    total = 79 * moe_layer + dense_layer + 2 * emb + 4096
    assert m.total_params() == total
    assert m.active_params_per_token() == total - 79 * 184 * expert
    norms = (2 * 80 + 1) * 4096
    fp8 = total - 79 * router - 2 * emb - norms
    assert m.weight_bytes() == fp8 * 1 + 79 * router * 4 + (2 * emb + norms) * 2


def test_qwen3_30b_a3b_by_hand():
    m = get_model("qwen3-30b-a3b")
    assert m.kv_bytes_per_token() == 2 * 48 * 4 * 128 * 2 == 98304
    layer = (2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 256) + 128 * 3 * 2048 * 768 + 128 * 2048 + 2 * 2048
    assert m.total_params() == 48 * layer + 2 * 151936 * 2048 + 2048 == 30_532_122_624


def test_hybrid_and_sliding_layers():
    q = get_model("qwen3.5-397b-a17b")
    assert (q.num_linear_attention_layers, q.num_full_attention_layers) == (45, 15)
    assert q.kv_bytes_per_token() == 15 * 2 * 2 * 256 * 2
    state = 64 * 128 * 128 * 4 + (2 * 16 * 128 + 64 * 128) * 3 * 2  # fp32 delta-rule state + bf16 conv window
    assert q.kv_bytes(100) == 100 * q.kv_bytes_per_token() + 45 * state
    g = get_model("gpt-oss-120b")
    assert (g.num_sliding_window_layers, g.sliding_window) == (18, 128)
    assert g.kv_bytes_per_token() == 18 * 2 * 8 * 64 * 2
    per_sliding_token = 18 * 2 * 8 * 64 * 2
    assert g.kv_bytes(1000) == 1000 * g.kv_bytes_per_token() + 128 * per_sliding_token
    assert g.kv_bytes(64) == 64 * g.kv_bytes_per_token() + 64 * per_sliding_token


# ----- config.json parsing ---------------------------------------------------------------------------
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "_name_or_path": "meta-llama/Llama-3.1-8B-Instruct",
}


def test_config_json_path_equals_shipped_profile(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_CONFIG))
    for arg in (str(path), str(tmp_path)):
        m = get_model(arg)
        assert m.hf_id == "meta-llama/Llama-3.1-8B-Instruct" and m.head_dim == 128
        assert m.derived() == get_model("llama-3.1-8b").derived()


def test_malformed_config_json_names_file_and_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "hidden_size": 4096,\n  oops\n}')
    with pytest.raises(ModelConfigError, match=r"config\.json:3: malformed JSON"):
        get_model(str(path))
    path.write_text(json.dumps({k: v for k, v in LLAMA_CONFIG.items() if k != "num_hidden_layers"}))
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        get_model(str(path))


def test_moe_config_variants():
    mixtral_style = dict(
        LLAMA_CONFIG,
        model_type="minimax_m2",
        num_local_experts=8,
        num_experts_per_tok=2,
        intermediate_size=1024,
        scoring_func="sigmoid",
        use_routing_bias=True,
    )
    m = from_hf_config(mixtral_style)
    assert (m.num_experts, m.top_k, m.moe_intermediate_size, m.intermediate_size) == (8, 2, 1024, None)
    assert m.router_scoring == "sigmoid" and m.router_bias and m.num_moe_layers == 32
    with pytest.raises(ModelConfigError, match="top_k"):
        from_hf_config(dict(mixtral_style, num_experts_per_tok=9))
    interleaved = dict(
        LLAMA_CONFIG,
        n_routed_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=512,
        first_k_dense_replace=2,
        moe_layer_freq=2,
    )
    m = from_hf_config(interleaved)
    assert m.num_moe_layers == len([i for i in range(32) if i >= 2 and i % 2 == 0]) == 15


def test_moe_layer_count_equals_the_layers_is_moe_layer_picks():
    """``num_moe_layers`` is counted in closed form; it must equal the per-layer rule it stands for."""
    base = get_model("qwen3-30b-a3b")
    for experts in (0, 8):
        for layers in range(0, 13):
            for first in range(-1, 6):
                for freq in range(0, 5):
                    m = dataclasses.replace(
                        base, num_experts=experts, num_layers=layers, first_k_dense=first, moe_layer_freq=freq
                    )
                    assert m.num_moe_layers == sum(m.is_moe_layer(i) for i in range(layers)), m


@pytest.mark.parametrize(
    "qc,scheme",
    [
        (None, "bf16"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8-block128"),
        ({"quant_method": "fp8", "activation_scheme": "static"}, "fp8-per-tensor"),
        ({"quant_method": "mxfp4"}, "mxfp4"),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "group_size": 32}}},
            },
            "int4-group32",
        ),
        ({"quant_method": "awq"}, "awq"),
    ],
)
def test_quantization_schemes(qc, scheme):
    assert quantization_scheme(qc) == scheme


def test_unknown_quantization_keeps_other_numbers():
    m = from_hf_config(dict(LLAMA_CONFIG, quantization_config={"quant_method": "awq"}))
    assert m.kv_bytes_per_token() == 131072
    with pytest.raises(ModelConfigError, match="unknown quantization 'awq'"):
        m.weight_bytes()
    assert m.derived()["weight_bytes"] is None


def test_profiles_import_no_torch():
    code = (
        "import sys, hpc_advise.profiles as p; p.list_models(); p.list_gpus(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_hy3_config_json_router_follows_sglang(tmp_path):
    """A Hy3 config.json says nothing about the router dtype; SGLang always builds it fp32 + sigmoid + bias."""
    shipped = get_model("hy3")
    cfg = dict(
        architectures=["HYV3ForCausalLM"], model_type="hy_v3", num_hidden_layers=80, hidden_size=4096,
        num_attention_heads=64, num_key_value_heads=8, head_dim=128, intermediate_size=13312, num_experts=192,
        num_experts_per_tok=8, num_shared_experts=1, moe_intermediate_size=1536, first_k_dense_replace=1,
        vocab_size=120832, use_qk_norm=True, route_norm=True, _name_or_path="tencent/Hy3-preview",
    )  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = get_model(str(path))
    assert (m.router_dtype, m.router_scoring, m.router_bias) == ("fp32", "sigmoid", True)
    assert m.quantization == "bf16"  # the preview checkpoint is bf16; the shipped profile says fp8
    assert (
        m.total_params() == shipped.total_params() and m.kv_bytes_per_token() == shipped.kv_bytes_per_token()
    )
