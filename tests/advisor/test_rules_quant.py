"""FP8 checkpoints of three kinds, told apart from a user's config.json (``quantization_config``): native
``fp8`` (SGLang's Fp8MoEMethod: our MoE runner hooks it), ModelOpt FP8 (``quant_method: modelopt``,
``quant_algo: FP8``: ModelOptFp8MoEMethod, which runs SGLang's triton runner whatever the runner flag
says) and compressed-tensors W8A8-FP8 (its own MoE method, which builds no runner for ours). The sizing
is FP8 for all three; only the first may get ``--moe-runner-backend hpc_advise``."""

from __future__ import annotations

import json

import pytest

from hpc_advise import rules
from hpc_advise.advisor.candidates import Candidate, enumerate_candidates, support_reason
from hpc_advise.profiles import get_gpu, get_model

# the MoE shapes of Qwen3-30B-A3B (128 experts, top-8)
BASE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "torch_dtype": "bfloat16",
}
NATIVE = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
NATIVE_TENSOR = {"quant_method": "fp8", "activation_scheme": "static"}
MODELOPT = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None}
COMPRESSED = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False},
        }
    },
    "ignore": ["lm_head"],
}
COMPRESSED_CHANNEL = json.loads(json.dumps(COMPRESSED))
COMPRESSED_CHANNEL["config_groups"]["group_0"]["weights"]["strategy"] = "channel"
COMPRESSED_CHANNEL["config_groups"]["group_0"]["input_activations"] = {
    "num_bits": 8, "type": "float", "strategy": "token", "dynamic": True,
}  # fmt: skip
OURS = Candidate(8, 1, 8, 1, "fa3", "hpc_advise", "auto")


def _model(tmp_path, name, qc):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**BASE, "quantization_config": qc}), encoding="utf-8")
    return get_model(str(folder / "config.json"))


@pytest.mark.parametrize(
    ("name", "qc", "method", "scheme"),
    [
        ("native-block", NATIVE, "fp8", "fp8-block128"),
        ("native-tensor", NATIVE_TENSOR, "fp8", "fp8-per-tensor"),
        ("modelopt", MODELOPT, "modelopt_fp8", "fp8-per-tensor"),
        ("ct-tensor", COMPRESSED, "compressed-tensors", "fp8-per-tensor"),
        ("ct-channel", COMPRESSED_CHANNEL, "compressed-tensors", "fp8-per-channel"),
    ],
)
def test_fp8_flavour_is_read_from_config_json(tmp_path, name, qc, method, scheme):
    m = _model(tmp_path, name, qc)
    assert (m.quant_method, m.quantization) == (method, scheme)
    assert rules.quant_method_of(m) == method


def test_all_three_are_sized_as_fp8(tmp_path):
    bf16 = get_model("qwen3-30b-a3b").weight_bytes()
    sizes = {n: _model(tmp_path, n, qc).weight_bytes() for n, qc in
             (("native", NATIVE_TENSOR), ("modelopt", MODELOPT), ("ct", COMPRESSED))}  # fmt: skip
    assert len(set(sizes.values())) == 1, sizes
    assert 0.5 * bf16 < sizes["native"] < 0.6 * bf16


@pytest.mark.parametrize(("name", "qc"), [("modelopt", MODELOPT), ("ct-tensor", COMPRESSED),
                                          ("ct-channel", COMPRESSED_CHANNEL)])  # fmt: skip
def test_our_moe_runner_is_not_emitted_for_modelopt_or_compressed_tensors_fp8(tmp_path, name, qc):
    m, h200 = _model(tmp_path, name, qc), get_gpu("h200")
    why = support_reason(OURS, m, h200)
    assert why is not None and m.quant_method in why, why
    assert "hpc_advise" not in {c.moe_runner for c in enumerate_candidates(m, 8) if not support_reason(c, m, h200)}
    # the op table (``hpc-advise runtime check``) agrees
    rule = rules.first_rule("fused_moe", rules.conditions(m, h200, tp=8, ep=8))
    assert rule is not None and m.quant_method in rule.reason(rules.conditions(m, h200, tp=8, ep=8))


def test_native_fp8_keeps_our_moe_runner(tmp_path):
    m, h200 = _model(tmp_path, "native", NATIVE), get_gpu("h200")
    assert support_reason(OURS, m, h200) is None
    assert rules.first_rule("fused_moe", rules.conditions(m, h200, tp=8, ep=8)) is None
