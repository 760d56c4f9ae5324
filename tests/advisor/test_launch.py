"""launch: the SGLang command per candidate, SGLang's own parser, exec with exit-code pass-through."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hpc_advise.advisor import launch as L
from hpc_advise.advisor.candidates import Candidate
from hpc_advise.advisor.cli import launch
from hpc_advise.knowledge_base.store import KnowledgeBase
from tests.advisor.advisor_helpers import advisor_home  # noqa: F401


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_command_for_our_backends_sets_plugin_and_page_size():
    c = Candidate(8, 1, 8, 1, "hpc_advise", "hpc_advise", "fp8_e4m3")
    cmd = L.build_command(c, "tencent/Hy3", python="python3", extra=("--port", "30001"))
    a = cmd.argv
    assert a[:3] == ["python3", "-m", "sglang.launch_server"]
    assert _flag(a, "--model-path") == "tencent/Hy3"
    assert _flag(a, "--tp-size") == "8" and _flag(a, "--ep-size") == "8"
    assert _flag(a, "--decode-attention-backend") == "hpc_advise"
    assert _flag(a, "--attention-backend") == "fa3"  # prefill stays on fa3
    assert _flag(a, "--page-size") == "64"
    assert _flag(a, "--moe-runner-backend") == "hpc_advise"
    assert _flag(a, "--kv-cache-dtype") == "fp8_e4m3"
    assert a[-2:] == ["--port", "30001"]
    assert cmd.env == {}  # SGLang loads every installed plugin when SGLANG_PLUGINS is unset


def test_router_gemm_on_for_measured_fp32_gates_only():
    """With our backends, Hy3's fp32 gate gets our router GEMM (its layer steps measured it faster, the note
    says by how much); Qwen3's bf16 gate and a command without our backends do not."""
    from hpc_advise.profiles import get_model

    ours = Candidate(8, 1, 8, 1, "hpc_advise", "hpc_advise", "fp8_e4m3")
    hy3 = L.build_command(ours, "tencent/Hy3-preview", model=get_model("hy3"), environ={})
    assert hy3.env == {"HPC_ADVISE_ROUTER_GEMM": "1"} and hy3.shell().startswith("HPC_ADVISE_ROUTER_GEMM=1 ")
    assert any("layer-step pairs" in n and "hy3-tp8-rank" in n for n in hy3.notes)
    qwen = L.build_command(Candidate(4, 1, 4, 1, "hpc_advise", "auto", "fp8_e4m3"), "Qwen/Qwen3-235B-A22B",
                           model=get_model("qwen3-235b-a22b"), environ={})  # fmt: skip
    assert "HPC_ADVISE_ROUTER_GEMM" not in qwen.env
    sglang_only = L.build_command(Candidate(8, 1, 8, 1, "flashinfer", "auto", "auto"), "tencent/Hy3-preview",
                                  model=get_model("hy3"), environ={})  # fmt: skip
    assert sglang_only.env == {}


def test_command_for_replicas_attention_dp_and_multinode():
    c = Candidate(4, 2, 1, 4, "flashinfer", "auto", "auto")
    cmd = L.build_command(c, "m", nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000")
    a = cmd.argv
    assert _flag(a, "--dp-size") == "2" and _flag(a, "--attn-dp-size") == "4"
    assert "--ep-size" not in a and "--page-size" not in a and "--moe-runner-backend" not in a
    assert (_flag(a, "--nnodes"), _flag(a, "--node-rank"), _flag(a, "--dist-init-addr")) == (
        "2",
        "1",
        "10.0.0.1:5000",
    )
    assert cmd.env == {}


def test_sglang_parser_accepts_our_flag_names():
    c = Candidate(4, 2, 4, 4, "flashinfer", "triton", "fp8_e4m3")
    cmd = L.build_command(c, "m", extra=("--page-size", "16"))
    ok, why = L.validate(cmd)
    if ok is None:
        pytest.skip(f"SGLang not importable here: {why}")
    assert ok is True, why


def test_sixteen_gpus_on_two_nodes_launch_as_sglang_takes_them():
    """Beyond one 8-GPU node: a TP16 replica is one server over both nodes (--nnodes 2 --node-rank
    --dist-init-addr, no --dp-size: SGLang refuses data-parallel replicas across nodes); 2 x TP8 and
    4 x TP4 are one server per node (--dp-size = replicas per node) behind a router. Each printed
    command goes through SGLang's parser and prepare_server_args."""
    tp16 = L.build_command(Candidate(16, 1, 16, 16, "flashinfer", "auto", "auto"), "m", node_gpus=8)
    a = tp16.argv
    assert (_flag(a, "--tp-size"), _flag(a, "--nnodes"), _flag(a, "--node-rank")) == ("16", "2", "0")
    assert _flag(a, "--dist-init-addr") == L.DIST_INIT_PLACEHOLDER and "--dp-size" not in a
    assert "--node-rank 0 to 1" in tp16.notes[0] and L.DIST_INIT_PLACEHOLDER in tp16.notes[0]
    given = L.build_command(
        Candidate(16, 1, 16, 16, "flashinfer", "auto", "auto"),
        "m",
        node_gpus=8,
        dist_init_addr="10.0.0.1:5000",
    )
    assert _flag(given.argv, "--dist-init-addr") == "10.0.0.1:5000" and "in place of" not in given.notes[0]
    per_node = L.build_command(Candidate(8, 2, 8, 1, "flashinfer", "auto", "auto"), "m", node_gpus=8)
    assert "--nnodes" not in per_node.argv and "--dp-size" not in per_node.argv
    assert "one server per 8-GPU node (2 nodes)" in per_node.notes[0]
    four = L.build_command(Candidate(4, 4, 1, 1, "flashinfer", "auto", "auto"), "m", node_gpus=8)
    assert _flag(four.argv, "--dp-size") == "2" and "--nnodes" not in four.argv
    one_node = L.build_command(Candidate(4, 2, 1, 1, "flashinfer", "auto", "auto"), "m", node_gpus=8)
    assert _flag(one_node.argv, "--dp-size") == "2" and one_node.notes == []
    cmds = (tp16, per_node, four)
    for cmd, parsed in zip(cmds, _sglang_parse(cmds), strict=True):
        want = {"tp_size": int(_flag(cmd.argv, "--tp-size")), "nnodes": 2 if cmd is tp16 else 1}
        want["dp_size"] = int(_flag(cmd.argv, "--dp-size")) if "--dp-size" in cmd.argv else 1
        assert {k: parsed[k] for k in want} == want and parsed["assertion"] is None, parsed
    ok, why = L.validate(tp16)  # resolution too, where this machine can run it
    assert ok is not False, (why, tp16.shell())


# SGLang's prepare_server_args on the printed arguments, then its check_server_args: the assertions
# there (tp_size divisible by nnodes, no data-parallel replicas across nodes) come before the checks
# that need resolved fields, which fail off a GPU host with other errors (reported, not asserted on)
_PARSE = r"""
import json, sys
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.validation_hook import check_server_args
res = []
for args in json.loads(sys.argv[1]):
    sa = prepare_server_args(args)
    out = {k: getattr(sa, k) for k in ("tp_size", "dp_size", "nnodes", "node_rank", "dist_init_addr")}
    try:
        check_server_args(sa)
        out["assertion"] = None
    except AssertionError as exc:
        out["assertion"] = str(exc)
    except Exception as exc:
        out["assertion"], out["unresolved"] = None, f"{type(exc).__name__}: {exc}"
    res.append(out)
print(json.dumps(res))
"""


def _sglang_parse(cmds) -> list[dict]:
    import json

    argvs = json.dumps([c.argv[3:] for c in cmds])
    res = subprocess.run([sys.executable, "-c", _PARSE, argvs], capture_output=True, text=True, timeout=300)
    if res.returncode and "No module named 'sglang'" in res.stderr:
        pytest.skip("SGLang not installed here")
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_node_layout_rule_and_plan():
    from hpc_advise.advisor.candidates import node_layout_reason
    from hpc_advise.profiles.resolve import resolve_gpu

    h200 = resolve_gpu("h200")
    assert node_layout_reason(Candidate(16, 1, 16, 16), h200) is None
    assert node_layout_reason(Candidate(8, 3), h200) is None
    assert "whole 8-GPU nodes" in node_layout_reason(Candidate(12, 2), h200)
    assert "tile" in node_layout_reason(Candidate(3, 8), h200)  # 24 GPUs: a TP3 replica would straddle
    assert L.node_plan(Candidate(16, 2), 8) == L.NodePlan(servers=2, nnodes=2, dp=1)
    assert L.node_plan(Candidate(2, 8), 8) == L.NodePlan(servers=2, nnodes=1, dp=4)
    assert L.node_plan(Candidate(8, 1), 8) == L.NodePlan(servers=1, nnodes=1, dp=1)


@pytest.mark.slow
def test_sglang_parser_rejects_unknown_backend():
    bad = L.build_command(Candidate(8, attention_backend="not_a_backend", moe_runner="auto"), "m")
    ok, why = L.validate(bad)
    if ok is None:
        pytest.skip(f"SGLang not importable here: {why}")
    assert ok is False and "not_a_backend" in why


def _kb_with_recommendation(path):
    top = {"candidate": Candidate(2, 1, 1, 1, "triton", None, "auto").to_dict()}
    return KnowledgeBase(path).add_recommendation({"model": "llama-3.1-8b"}, {"top": top}, "test")


def test_dry_run_from_recommendation_id(tmp_path):
    db = tmp_path / "kb.db"
    rec = _kb_with_recommendation(db)
    res = CliRunner().invoke(
        launch,
        [
            "--recommendation",
            str(rec),
            "--db",
            str(db),
            "--dry-run",
            "--no-validate",
            "--",
            "--port",
            "31000",
        ],
    )
    assert res.exit_code == 0, res.output
    line = res.output.strip().splitlines()[-1]
    assert "-m sglang.launch_server --model-path meta-llama/Llama-3.1-8B" in line
    assert "--tp-size 2" in line and "--attention-backend triton" in line and line.endswith("--port 31000")
    res = CliRunner().invoke(launch, ["--recommendation", "999", "--db", str(db), "--dry-run"])
    assert res.exit_code != 0 and "999" in res.output


def test_exec_passes_exit_code_through(tmp_path):
    db = tmp_path / "kb.db"
    rec = _kb_with_recommendation(db)
    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\necho "sglang argv: $*"\nexit 7\n')
    fake.chmod(0o755)
    cmd = [
        sys.executable,
        "-m",
        "hpc_advise",
        "launch",
        "--recommendation",
        str(rec),
        "--db",
        str(db),
        "--python",
        str(fake),
        "--no-validate",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert res.returncode == 7, res.stderr
    assert "sglang argv: -m sglang.launch_server" in res.stdout


def test_dry_run_from_a_trace_recommends_then_prints(tmp_path, advisor_home):  # noqa: F811
    from pathlib import Path

    trace = Path(__file__).resolve().parents[2] / "examples" / "traces" / "chat_uniform.csv"
    args = [
        "--trace",
        str(trace),
        "--model",
        "qwen3-32b",
        "--gpu",
        "h200",
        "--gpus",
        "4",
        "--db",
        str(tmp_path / "kb.db"),
    ]
    res = CliRunner().invoke(
        launch, args + ["--dry-run", "--no-validate", "--nnodes", "2", "--node-rank", "0"]
    )
    assert res.exit_code == 0, res.output
    line = res.output.strip().splitlines()[-1]
    assert "-m sglang.launch_server --model-path Qwen/Qwen3-32B" in line and "--nnodes 2" in line


def test_the_launched_checkpoint_is_the_one_whose_weights_were_planned(tmp_path, advisor_home):  # noqa: F811
    import json
    from pathlib import Path

    from hpc_advise.advisor.candidates import planned_quants

    trace = Path(__file__).resolve().parents[2] / "examples" / "traces" / "chat_uniform.csv"

    def dry_run(model, *extra):
        args = ["--trace", str(trace), "--model", model, "--gpu", "h200", "--gpus", "8"]
        args += ["--db", str(tmp_path / "kb.db"), "--dry-run", "--no-validate", *extra]
        return CliRunner().invoke(launch, args)

    # a re-upload's id: planned FP8 (sized half of GLM-5's bf16), and that checkpoint is launched
    res = dry_run("zai-org/GLM-5-FP8")
    assert res.exit_code == 0, res.output
    line = res.output.strip().splitlines()[-1]
    assert "--model-path zai-org/GLM-5-FP8 " in line and "--quantization" not in line
    # a bare name names the format but no checkpoint: one line asking for --model-path
    res = dry_run("GLM-5-FP8")
    assert res.exit_code != 0 and "give --model-path" in res.output and "Traceback" not in res.output
    res = dry_run("GLM-5-FP8", "--model-path", "/models/glm5-fp8")
    assert res.exit_code == 0 and "--model-path /models/glm5-fp8 " in res.output.strip().splitlines()[-1]
    # a config.json with an FP8 quantization_config: FP8 weights, its folder launched
    ckpt = tmp_path / "qwen3-32b-fp8"
    ckpt.mkdir()
    cfg = json.loads(
        (Path(__file__).resolve().parents[2] / "hpc_advise/profiles/models/qwen3-32b.json").read_text()
    )
    cfg = dict(cfg["config"], quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    (ckpt / "config.json").write_text(json.dumps(cfg))
    from hpc_advise.profiles.resolve import resolve_model

    assert planned_quants(resolve_model(str(ckpt / "config.json"))) == ("fp8_block", "fp8_block")
    res = dry_run(str(ckpt / "config.json"))
    assert res.exit_code == 0, res.output
    assert f"--model-path {ckpt.resolve()} " in res.output.strip().splitlines()[-1]
