"""The advisor reads the support rules (hpc_advise.rules): what it emits and what launch prints."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import pytest

from hpc_advise import rules
from hpc_advise.advisor import launch as L
from hpc_advise.advisor.candidates import Candidate, enumerate_candidates, support_reason
from hpc_advise.profiles import get_gpu, get_model


def _ok(model, gpu):
    m, g = get_model(model), get_gpu(gpu)
    return [c for c in enumerate_candidates(m, 8) if support_reason(c, m, g) is None]


def test_b200_gets_neither_fa3_nor_our_backend():
    for key in ("qwen3-32b", "hy3", "deepseek-v3"):
        backends = {c.attention_backend for c in _ok(key, "b200")}
        assert backends and not backends & {"fa3", "hpc_advise", "hpc_ops"}, (key, backends)
        assert "hpc_advise" not in {c.moe_runner for c in _ok(key, "b200")}


def test_fa3_on_a100_only_without_mla():
    assert "fa3" in {c.attention_backend for c in _ok("llama-3.1-8b", "a100")}
    assert "fa3" not in {c.attention_backend for c in _ok("deepseek-v3", "a100")}


def test_deepseek_on_h200_defaults_and_penalties():
    ok = _ok("deepseek-v3", "h200")
    assert "fa3" in {c.attention_backend for c in ok}
    assert not [c for c in ok if c.attention_backend == "flashinfer" and c.kv_dtype == "fp8_e4m3"]
    why = support_reason(
        Candidate(8, 1, 1, 1, "flashinfer", "auto", "fp8_e4m3"), get_model("deepseek-v3"), get_gpu("h200")
    )
    assert "copies each layer's KV" in why
    # our decode attention's MLA form: bf16 KV only
    assert "hpc_advise" in {c.attention_backend for c in ok if c.kv_dtype == "auto"}
    assert support_reason(
        Candidate(8, 1, 1, 1, "hpc_advise", "auto", "auto"), get_model("deepseek-v3"), get_gpu("h200")
    ) is None
    assert "fp8_e4m3 KV on MLA" in support_reason(
        Candidate(8, 1, 1, 1, "hpc_advise", "auto", "fp8_e4m3"), get_model("deepseek-v3"), get_gpu("h200")
    )
    assert "DSA sparse MLA" in support_reason(
        Candidate(8, 1, 1, 1, "hpc_advise", "auto", "auto"), get_model("glm-5"), get_gpu("h200")
    )


def test_hpc_ops_needs_the_hpc_package_and_fp8_kv_only_on_hy3(monkeypatch):
    hy3, qwen, h200 = get_model("hy3"), get_model("qwen3-30b-a3b"), get_gpu("h200")
    monkeypatch.setattr(rules, "hpc_ops_installed", lambda: False)
    assert "not installed" in support_reason(Candidate(8, 1, 1, 1, "hpc_ops", "auto", "auto"), hy3, h200)
    monkeypatch.setattr(rules, "hpc_ops_installed", lambda: True)
    assert support_reason(Candidate(8, 1, 1, 1, "hpc_ops", "auto", "fp8_e4m3"), hy3, h200) is None
    why = support_reason(Candidate(4, 2, 1, 1, "hpc_ops", "auto", "fp8_e4m3"), qwen, h200)
    assert why and "hunyuan_v3" in why


def test_hpc_ops_moe_on_deepseek_prints_disable_shared_experts_fusion(monkeypatch):
    monkeypatch.setattr(rules, "hpc_ops_installed", lambda: True)
    ds, h200 = get_model("deepseek-v3"), get_gpu("h200")
    c = Candidate(8, 1, 1, 1, "fa3", "hpc_ops", "auto")
    assert support_reason(c, ds, h200) is None
    assert "--disable-shared-experts-fusion" in L.build_command(c, "deepseek-ai/DeepSeek-V3").argv
    fused = rules.Setup(prefill_attention="fa3", moe_runner="hpc_ops", tp=8, hpc_ops_installed=True)
    assert "fused shared experts" in rules.launch_refusal(fused, ds, (9, 0))


def test_our_moe_runner_is_not_emitted_where_auto_runs_instead():
    for key in ("kimi-k2.5", "qwen3-235b-a22b"):  # compressed-tensors / bf16 experts
        assert "hpc_advise" not in {c.moe_runner for c in _ok(key, "h200")}
    assert "hpc_advise" in {c.moe_runner for c in _ok("hy3", "h200")}


def test_speculative_and_local_attention_refused_with_our_decode():
    m = get_model("qwen3-32b")
    s = rules.Setup(
        prefill_attention="fa3", decode_attention="hpc_advise", tp=8, page_size=64, speculative="EAGLE"
    )
    assert "speculative" in rules.launch_refusal(s, m, (9, 0))
    local = rules.Setup(
        prefill_attention="fa3",
        decode_attention="hpc_advise",
        tp=8,
        page_size=64,
        chunked_local_attention=True,
    )
    assert "chunked local attention" in rules.launch_refusal(local, m, (9, 0))


def test_hy3_is_launched_as_the_fp8_it_is_planned_as():
    argv = L.build_command(
        Candidate(8, 1, 8, 1, "hpc_advise", "hpc_advise", "auto"), "tencent/Hy3-preview"
    ).argv
    assert argv[argv.index("--quantization") + 1] == "fp8"
    assert (
        "--quantization" not in L.build_command(Candidate(8), "deepseek-ai/DeepSeek-V3").argv
    )  # FP8 checkpoint


def test_config_json_prints_its_folder(tmp_path):
    d = tmp_path / "my-model"
    d.mkdir()
    shipped = Path(rules.__file__).parent / "profiles" / "models" / "qwen3-32b.json"
    (d / "config.json").write_text(json.dumps(json.loads(shipped.read_text())["config"]))
    argv = L.build_command(Candidate(1), str(d / "config.json")).argv
    assert argv[argv.index("--model-path") + 1] == str(d.resolve())
    prof = get_model(str(d / "config.json"))
    argv = L.build_command(Candidate(1), prof.hf_id, model=prof).argv  # recommend passes the hf_id
    assert argv[argv.index("--model-path") + 1] == str(d.resolve())


def test_sglang_plugins_is_extended_never_set_alone():
    assert L.plugins_env({}) == {} and L.plugins_env({"SGLANG_PLUGINS": ""}) == {}
    assert L.plugins_env({"SGLANG_PLUGINS": "other"}) == {"SGLANG_PLUGINS": "other,hpc_advise"}
    assert L.plugins_env({"SGLANG_PLUGINS": "hpc_advise,x"}) == {}
    c = Candidate(8, 1, 1, 1, "hpc_advise", None, "auto")
    assert L.build_command(c, "m", environ={"SGLANG_PLUGINS": "a"}).env == {"SGLANG_PLUGINS": "a,hpc_advise"}


def test_extra_args_contradicting_the_plan_need_force():
    c = Candidate(8, 1, 1, 1, "hpc_advise", None, "auto")
    for extra in (("--tp", "2"), ("--tp-size=2",), ("--page-size", "16"), ("--attention-backend", "triton")):
        with pytest.raises(click.ClickException, match="contradicts the recommended"):
            L.build_command(c, "m", extra=extra)
    forced = L.build_command(c, "m", extra=("--tp", "2", "--force"))
    assert forced.argv[-2:] == ["--tp", "2"] and "--force" not in forced.argv and forced.forced
    assert L.build_command(c, "m", extra=("--port", "3000")).argv[-2:] == ["--port", "3000"]


def test_use_ray_refused_with_our_backends():
    with pytest.raises(click.ClickException, match="--use-ray"):
        L.build_command(
            Candidate(8, 1, 1, 1, "hpc_advise", None, "auto"), "m", extra=("--use-ray",), force=True
        )
    assert "--use-ray" in L.build_command(Candidate(8), "m", extra=("--use-ray",)).argv


def test_launch_check_says_why_the_plugin_did_not_register(tmp_path):
    """When register() raises in the child, SGLang only logs it and then rejects the backend name
    (``invalid choice: 'hpc_advise'``); the check now names the exception. The failure is made real and
    the same on any machine: an importable ``torchvision`` that raises, which SGLang's model configs
    import when our plugin registers its attention backend."""
    (tmp_path / "torchvision.py").write_text('raise ImportError("torchvision broken on purpose")\n')
    cmd = L.build_command(Candidate(8, 1, 1, 1, "hpc_advise", None, "auto"), str(tmp_path))
    cmd.env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    ok, why = L.validate(cmd)
    if ok is None:
        pytest.skip(f"SGLang not importable here: {why}")
    assert ok is False and "invalid choice: 'hpc_advise'" in why, why
    assert "failed to register: ImportError: torchvision broken on purpose" in why, why
