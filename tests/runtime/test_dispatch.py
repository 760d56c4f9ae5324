"""The dispatch table: documented answers for four models on H200 vs A100, rule order, the CLI."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpc_advise import measured, rules
from hpc_advise.profiles import get_gpu, get_model
from hpc_advise.runtime import dispatch
from hpc_advise.runtime.cli import runtime


def _table(model, gpu, **kw):
    c = rules.conditions(get_model(model), get_gpu(gpu) if gpu else None, **kw)
    return {d.op: d for d in dispatch.table(c)}


# (model, gpu) -> expected outcome per op, with a fragment of the reason
EXPECTED = {
    ("hy3", "h200"): {
        "decode_attention": ("ours", "GQA 64/8"),
        "fused_moe": ("ours", "fp8-per-tensor"),
        "router_gemm": ("fallback", "launch sets it for this fp32 gate: decode steps with it"),
    },
    ("hy3", "a100"): {
        "decode_attention": ("fallback", "sm80"),
        "fused_moe": ("fallback", "no FP8 tensor cores"),
        "router_gemm": ("fallback", "sm80"),
    },
    ("qwen3-235b-a22b", "h200"): {
        "decode_attention": ("ours", "GQA 64/4"),
        "fused_moe": ("fallback", "experts are bf16"),
        "router_gemm": ("fallback", "opt-in: set HPC_ADVISE_ROUTER_GEMM=1"),
    },
    ("qwen3-235b-a22b", "a100"): {
        "decode_attention": ("fallback", "sm80"),
        "fused_moe": ("fallback", "experts are bf16"),
        "router_gemm": ("fallback", "sm80"),
    },
    ("qwen3-30b-a3b", "h200"): {
        "decode_attention": ("ours", "GQA 32/4"),
        "fused_moe": ("fallback", "experts are bf16"),
        "router_gemm": ("fallback", "opt-in: set HPC_ADVISE_ROUTER_GEMM=1"),
    },
    ("qwen3-30b-a3b", "a100"): {
        "decode_attention": ("fallback", "sm80"),
        "fused_moe": ("fallback", "experts are bf16"),
        "router_gemm": ("fallback", "sm80"),
    },
    ("deepseek-v3", "h200"): {
        "decode_attention": ("ours", "MLA 128 heads per rank, latent 512 + rope 64, bf16 KV, page 64"),
        "fused_moe": ("ours", "fp8-block128"),
        "router_gemm": ("fallback", "bf16 MoEGate"),
    },
    ("deepseek-v3", "a100"): {
        "decode_attention": ("fallback", "sm80"),
        "fused_moe": ("fallback", "no FP8 tensor cores"),
        "router_gemm": ("fallback", "bf16 MoEGate"),
    },
}


@pytest.mark.parametrize("model,gpu", sorted(EXPECTED))
def test_documented_answers(model, gpu):
    got = _table(model, gpu, router_opt_in=False)
    for op, (outcome, fragment) in EXPECTED[(model, gpu)].items():
        assert got[op].outcome == outcome, (op, got[op])
        assert got[op].use_ours == (outcome == "ours")
        assert fragment in got[op].reason, (op, got[op].reason)


def test_fallback_names_the_sglang_path():
    h200 = _table("qwen3-30b-a3b", "h200", router_opt_in=False, page_size=1)
    assert h200["decode_attention"].provider == "fa3"
    assert "--page-size 64" in h200["decode_attention"].reason
    a100 = _table("qwen3-30b-a3b", "a100", router_opt_in=False)
    assert a100["decode_attention"].provider == "flashinfer"
    assert a100["fused_moe"].provider.startswith("auto")


def test_router_opt_in_and_tp():
    on = _table("hy3", "h200", router_opt_in=True, tp=8)
    assert on["router_gemm"].use_ours and "fp32 gate" in on["router_gemm"].reason
    # Hy3 at TP8: 8 query heads and 1 KV head per rank, MoE width 1536/8 = 192 per rank
    assert "GQA 8/1" in on["decode_attention"].reason
    assert "width 192" in on["fused_moe"].reason
    qwen = _table("qwen3-30b-a3b", "h200", router_opt_in=True)
    assert qwen["router_gemm"].use_ours  # bf16 ReplicatedLinear gate: fp32 logits instead of bf16 ones


def test_first_rule_wins_and_no_gpu():
    # DSA on no GPU: the sparse-MLA reason comes first (more basic than "no CUDA GPU")
    dsa = _table("glm-5", None, router_opt_in=False)["decode_attention"]
    assert dsa.reason.startswith("DSA sparse MLA") and dsa.provider.startswith("dsa")
    none = _table("deepseek-v3", None, router_opt_in=False)
    assert none["decode_attention"].reason == "no CUDA GPU"
    assert none["fused_moe"].reason == "no CUDA GPU"
    dense = _table("qwen3-32b", "h200", router_opt_in=False)
    assert dense["fused_moe"].outcome == "n/a" and dense["router_gemm"].outcome == "n/a"


def test_fp8_kv_and_bad_inputs():
    fp8 = _table("hy3", "h200", kv_dtype="fp8_e4m3", router_opt_in=False)
    assert fp8["decode_attention"].use_ours and "fp8_e4m3 KV" in fp8["decode_attention"].reason
    with pytest.raises(ValueError, match="kv_dtype"):
        _table("hy3", "h200", kv_dtype="int4")
    with pytest.raises(ValueError, match="unknown op"):
        dispatch.decide("rmsnorm", rules.conditions(get_model("hy3"), get_gpu("h200")))


def test_router_env_parsing():
    assert rules.router_env_enabled({"HPC_ADVISE_ROUTER_GEMM": "1"})
    assert not rules.router_env_enabled({"HPC_ADVISE_ROUTER_GEMM": "0"})
    assert not rules.router_env_enabled({})


def _router_row(subject, provider, router, p50, mix="agentic", batch=8):
    cfg = {"router": router, "mix": mix, "batch": batch}
    return {"kind": "layer_step", "unit": "us", "p50": p50, "subject": subject, "provider": provider,
            "config": cfg, "command": "bench_layer", "created_at": "2026-01-01T00:00:00"}  # fmt: skip


def test_router_comparisons_pair_rows_by_router_only():
    """A row with our router pairs with its twin at SGLang's gate (same run, subject, combination, mix,
    batch); rows without a twin and subjects naming no profile are left out."""
    rows = [
        _router_row("hy3-tp8-rank", "attn=triton,moe=triton", "sglang", 110.0),
        _router_row("hy3-tp8-rank", "attn=triton,moe=triton,router=hpc_advise", "hpc_advise", 100.0),
        _router_row("hy3-tp8-rank", "attn=triton,moe=triton", "sglang", 90.0, batch=32),
        _router_row(
            "hy3-tp8-rank", "attn=triton,moe=triton,router=hpc_advise", "hpc_advise", 100.0, batch=32
        ),
        _router_row("hy3-tp8-rank", "attn=hpc_advise,moe=triton", "sglang", 50.0),  # no twin
        _router_row("nosuch-tp8-rank", "attn=triton,moe=triton", "sglang", 1.0),
        _router_row("nosuch-tp8-rank", "attn=triton,moe=triton,router=hpc_advise", "hpc_advise", 1.0),
    ]
    (cmp,) = measured.router_comparisons(rows)
    assert (cmp.experts, cmp.hidden, cmp.gate_dtype) == (192, 4096, "fp32")
    assert sorted(cmp.ratios) == [0.9, 1.1] and cmp.subjects == ("hy3-tp8-rank",)
    assert "1.00x" in cmp.figure() and "median of 2" in cmp.figure() and "0.90-1.10" in cmp.figure()


def test_router_for_launch_only_fp32_gates_measured_faster(monkeypatch):
    """launch turns the router on for an fp32 gate whose layer steps measured it faster; never for a bf16
    gate (a change of numerics), a gate nobody measured, one measured slower, or off SM90."""
    hy3 = rules.conditions(get_model("hy3"), get_gpu("h200"), tp=8, router_opt_in=False)
    shipped = measured.router_for_launch(hy3)
    assert shipped is not None and shipped.gate_dtype == "fp32"  # the shipped Hy3 layer steps
    qwen = rules.conditions(get_model("qwen3-235b-a22b"), get_gpu("h200"), tp=4, router_opt_in=False)
    assert measured.router_comparison(qwen.num_experts, qwen.hidden_size, "bf16") is not None
    assert measured.router_for_launch(qwen) is None
    assert measured.router_for_launch(replace(hy3, sm=(8, 0))) is None
    slower = measured.RouterComparison(192, 4096, "fp32", (0.97, 0.99, 1.01), ("hy3-tp8-rank",))
    monkeypatch.setattr(measured, "shipped_router_comparisons", lambda: (slower,))
    assert measured.router_for_launch(hy3) is None
    monkeypatch.setattr(measured, "shipped_router_comparisons", lambda: ())
    assert measured.router_for_launch(hy3) is None
    assert "opt-in" in dispatch.table(hy3)[2].reason and "launch sets it" not in dispatch.table(hy3)[2].reason


def test_cli_check_json_and_text_fake_nvml(monkeypatch):
    """NVML is a hardware boundary: the report is faked to a machine without a GPU."""
    from hpc_advise.runtime import env_report

    monkeypatch.setattr(env_report, "_nvml", lambda: {"gpu": "missing (NVML: no driver)"})
    res = CliRunner().invoke(runtime, ["check", "--model", "hy3", "--gpu", "h200", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert [d["op"] for d in data["dispatch"]] == list(dispatch.OPS)
    assert data["environment"]["gpu"].startswith("missing")
    assert data["environment"]["driver"] == "missing"
    assert "torch" in data["environment"] and "flashinfer" in data["environment"]
    text = CliRunner().invoke(
        runtime, ["check", "--model", "deepseek-v3", "--gpu", "h200", "--kv-dtype", "fp8_e4m3"]
    )
    assert text.exit_code == 0, text.output
    assert "fp8_e4m3 KV on MLA" in text.output and "Environment:" in text.output
    bad = CliRunner().invoke(runtime, ["check", "--model", "no-such-model", "--gpu", "h200"])
    assert bad.exit_code != 0 and "no-such-model" in bad.output


def test_cli_local_gpu_without_profile_fake_nvml(monkeypatch):
    from hpc_advise.runtime import env_report

    monkeypatch.setattr(env_report, "_nvml", lambda: {"gpu": "NVIDIA Imaginary X1", "driver": "999.1"})
    res = CliRunner().invoke(runtime, ["check", "--model", "hy3"])
    assert res.exit_code != 0 and "--gpu" in res.output
    known = {"gpu": "NVIDIA H200", "driver": "570.1", "cuda_driver": "12.8", "compute_capability": "9.0"}
    monkeypatch.setattr(env_report, "_nvml", lambda: dict(known))
    ok = CliRunner().invoke(runtime, ["check", "--model", "hy3"])
    assert ok.exit_code == 0 and "H200" in ok.output and "570.1" in ok.output


def test_plugin_status_in_report():
    """The entry point is installed in the test venv (pip install -e .); SGLANG_PLUGINS and the version
    decide whether SGLang will run it."""
    from hpc_advise.runtime import env_report

    assert env_report.plugin_status("0.5.23", {}).startswith("active")
    assert "disabled by SGLANG_PLUGINS" in env_report.plugin_status("0.5.23", {"SGLANG_PLUGINS": "other"})
    assert env_report.plugin_status("0.5.23", {"SGLANG_PLUGINS": "other,hpc_advise"}).startswith("active")
    assert "not supported" in env_report.plugin_status("0.6.0", {})
    assert "sglang not installed" in env_report.plugin_status(env_report.MISSING, {})


def test_config_json_model_uses_its_architecture(tmp_path):
    """A model given as config.json: the router hook is found by the SGLang architecture, and block-FP8
    experts whose per-rank width is not a multiple of 128 are reported as SGLang rejects them."""
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_hidden_layers": 48,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "intermediate_size": 6144,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    path = tmp_path / "my-model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    res = CliRunner().invoke(
        runtime,
        ["check", "--model", str(path), "--gpu", "h200", "--tp", "4", "--json"],
        env={"HPC_ADVISE_ROUTER_GEMM": "1"},
    )
    assert res.exit_code == 0, res.output
    rows = {d["op"]: d for d in json.loads(res.output)["dispatch"]}
    assert rows["router_gemm"]["use_ours"], rows["router_gemm"]
    assert not rows["fused_moe"]["use_ours"] and "use --ep-size" in rows["fused_moe"]["reason"]
    tp1 = CliRunner().invoke(runtime, ["check", "--model", str(path.parent), "--gpu", "h200", "--json"])
    assert {d["op"]: d for d in json.loads(tp1.output)["dispatch"]}["fused_moe"]["use_ours"]


def test_fused_moe_reason_says_whether_launch_configs_were_tuned():
    from hpc_advise.kernels.fused_moe import op

    h200 = get_gpu("h200")
    hy3 = {d.op: d for d in dispatch.table(rules.conditions(get_model("hy3"), h200))}["fused_moe"]
    points = dispatch.moe_tuned_points(192, 4096, 1536, 8)  # Hy3 at TP1, as shipped in configs.json
    assert dispatch.MOE_CONFIGS == op.CONFIG_PATH  # the file the kernel reads
    assert hy3.use_ours and points and "launch configs tuned on the H200" in hy3.reason
    small = [t for t, path in points["tensor-static"].items() if path == "small"]
    assert (f"small-T path at T = {', '.join(map(str, small))}" in hy3.reason) == bool(small)
    # DeepSeek-V3 at TP1 (256 experts of width 2048): only its EP8 shard (32 local experts) was tuned
    ds = {d.op: d for d in dispatch.table(rules.conditions(get_model("deepseek-v3"), h200))}["fused_moe"]
    assert ds.use_ours and "no tuned launch configs for this shape" in ds.reason


def test_docs_sample_is_what_runtime_check_prints():
    """docs/runtime.md shows one ``runtime check`` output: the block after its ``$ hpc-advise`` line must be
    the table this tree prints (the environment report that follows it depends on the machine)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "runtime.md").read_text(encoding="utf-8")
    block = doc.split("\n$ hpc-advise runtime check ", 1)[1].split("\n```", 1)[0]
    args, shown = block.split("\n", 1)
    res = CliRunner().invoke(runtime, ["check", *shlex.split(args)])
    assert res.exit_code == 0, res.output
    assert res.output.split("\n\n", 1)[0] == shown


def test_deepseek_fused_shared_expert_is_257_experts_top9_untuned():
    """SGLang fuses DeepSeek-V3's shared expert into the routed MoE at EP 1 (257 experts, top-9): the
    shape whose launch configs count is that one, not (256, top-8)."""
    ds, h200 = get_model("deepseek-v3"), get_gpu("h200")
    c = rules.conditions(ds, h200, tp=8)
    assert (c.num_experts, c.top_k, c.moe_inter) == (257, 9, 256)
    moe = dispatch.decide("fused_moe", c)
    assert moe.use_ours and "257 experts" in moe.reason
    assert ("no tuned" in moe.reason) == (dispatch.moe_tuned_points(257, 7168, 256, 9) == {})
    ep = rules.conditions(ds, h200, tp=8, ep=8)  # no fusion under EP: 256 experts, full width per rank
    assert (ep.num_experts, ep.top_k, ep.moe_inter) == (256, 8, 2048)
    res = CliRunner().invoke(
        runtime, ["check", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert (
        "257 experts"
        in next(d for d in json.loads(res.output)["dispatch"] if d["op"] == "fused_moe")["reason"]
    )


def _hy3_points(sglang_faster_at_32: bool):
    """Measured layer-step pairs at Hy3's TP8 rank shape (tests/measured_rows.py): ours faster at bs 1,
    SGLang's triton faster at bs 32 or not."""
    from hpc_advise import measured
    from tests.measured_rows import layer_row

    ours_32 = 1040.0 if sglang_faster_at_32 else 960.0
    rows = [layer_row("hpc_advise", "triton", "agentic", 1, 700.0), layer_row("hpc_advise", "hpc_advise", "agentic", 1, 650.0),
            layer_row("hpc_advise", "triton", "agentic", 32, 1000.0), layer_row("hpc_advise", "hpc_advise", "agentic", 32, ours_32)]  # fmt: skip
    return tuple(measured.moe_points(rows))


def test_moe_buckets_where_sglang_measured_faster_are_handed_off(monkeypatch):
    """The hand-off comes from measured rows: the same shape is handed to SGLang's triton at T = 6-64 when
    the rows say SGLang's was faster there, and not when they say ours was, or when nothing was measured."""
    from hpc_advise import measured

    c = rules.conditions(get_model("hy3"), get_gpu("h200"), tp=8)
    monkeypatch.setattr(measured, "shipped_points", lambda: _hy3_points(True))
    handed = dispatch.moe_handoffs(c)
    assert [(d.op, d.outcome, d.provider) for d in handed] == [
        ("fused_moe", "handoff", dispatch.HANDOFF_PROVIDER)
    ]
    assert handed[0].reason.startswith("T = 6-64: SGLang's triton measured faster")
    assert (
        "at T = 32: ours 0.96x SGLang's triton MoE runner, the median of 1 measured pair(s)"
        in handed[0].reason
    )
    shape = measured.moe_shape_of(c)
    assert [dispatch.moe_handoff(shape, t).runner for t in (1, 5, 6, 32, 64, 65)] == [
        "hpc_advise", "hpc_advise", "triton", "triton", "triton", "hpc_advise"]  # fmt: skip
    moe = {d.op: d for d in dispatch.table(c)}["fused_moe"]
    assert moe.use_ours and "handed to SGLang's triton at T = 6-64" in moe.reason
    assert moe.reason.endswith("; above T = 64 ours runs (no pair measured there)")  # 64 -> 65 above
    res = CliRunner().invoke(runtime, ["check", "--model", "hy3", "--gpu", "h200", "--tp", "8", "--json"])
    assert [d["reason"] for d in json.loads(res.output)["moe_handoff"]] == [handed[0].reason]
    text = CliRunner().invoke(runtime, ["check", "--model", "hy3", "--gpu", "h200", "--tp", "8"]).output
    assert "handed to SGLang's triton (measured faster than ours)" in text and "ours 0.96x" in text
    # another TP: another rank shape, nothing measured there
    assert dispatch.moe_handoffs(rules.conditions(get_model("hy3"), get_gpu("h200"), tp=4)) == []
    monkeypatch.setattr(measured, "shipped_points", lambda: _hy3_points(False))
    assert dispatch.moe_handoffs(c) == []
    assert "ours faster at T = 1-5, T = 6-64" in {d.op: d for d in dispatch.table(c)}["fused_moe"].reason
    monkeypatch.setattr(measured, "shipped_points", lambda: ())
    assert dispatch.moe_handoffs(c) == [] and dispatch.moe_handoff(shape, 32).runner == "hpc_advise"


def test_mla_decode_attention_goes_to_our_mla_form_where_it_fits():
    """MLA on SM90: our kernel's MLA form with bf16 KV at pages 1/16/64 and 1-16 or 16k (<= 128) heads per
    rank; fp8 KV, other latent / rope widths, other head counts and page sizes go to SGLang's MLA backend
    with the reason; GQA rules (head_dim, group, page 64 only) do not apply to MLA."""
    ds, h200 = get_model("deepseek-v3"), get_gpu("h200")
    for tp, heads in ((1, 128), (8, 16), (16, 8)):
        for page in rules.DECODE_MLA_PAGE_SIZES:
            d = dispatch.decide("decode_attention", rules.conditions(ds, h200, tp=tp, page_size=page))
            assert d.use_ours and d.provider == dispatch.OURS_MLA, (tp, page, d)
            assert f"MLA {heads} heads per rank" in d.reason and f"page {page}" in d.reason
    fp8 = dispatch.decide("decode_attention", rules.conditions(ds, h200, tp=8, kv_dtype="fp8_e4m3"))
    assert not fp8.use_ours and fp8.provider.startswith("SGLang's MLA default")
    assert fp8.reason.startswith("fp8_e4m3 KV on MLA: our MLA decode reads bf16 latent rows only")
    c = rules.conditions(ds, h200, tp=8)
    cases = {
        "MLA latent 256 + rope 64": replace(c, kv_lora_rank=256),
        "MLA latent 512 + rope 32": replace(c, rope_dim=32),
        "MLA with 24 query heads per rank": replace(c, q_heads=24),
        "MLA with 144 query heads per rank": replace(c, q_heads=144),
        "page size 32: our MLA decode takes": replace(c, page_size=32),
        "DSA sparse MLA": replace(c, sparse_attention=True),
    }
    for fragment, cond in cases.items():
        d = dispatch.decide("decode_attention", cond)
        assert not d.use_ours and fragment in d.reason, (fragment, d)
    kimi = dispatch.decide("decode_attention", rules.conditions(get_model("kimi-k2.5"), h200, tp=8))
    assert kimi.use_ours and "MLA 8 heads per rank" in kimi.reason


def test_decode_rules_state_the_kernels_own_limits():
    """The rules (no torch) restate the decode kernel's supported geometry; they must say what op.py checks."""
    pytest.importorskip("torch")
    from hpc_advise.kernels.decode_attention import op

    assert rules.DECODE_HEAD_DIMS == op.HEAD_DIMS and rules.DECODE_MAX_GROUP == op.MAX_GROUP
    assert rules.REQUIRED_PAGE_SIZE in op.PAGE_SIZES
    assert (rules.DECODE_MLA_LORA, rules.DECODE_MLA_ROPE) == (op.MLA_LORA, op.MLA_ROPE)
    assert rules.DECODE_MLA_MAX_HEADS == op.MLA_MAX_HEADS and rules.DECODE_MLA_PAGE_SIZES == op.PAGE_SIZES
