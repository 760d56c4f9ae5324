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
