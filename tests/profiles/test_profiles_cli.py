"""``hpc-advise profiles list|show`` through the real root CLI."""

from __future__ import annotations

import json

from click.testing import CliRunner

from hpc_advise.cli import main


def test_list_json_has_all_profiles():
    res = CliRunner().invoke(main, ["profiles", "list", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert {"h200", "b300", "l40s"} <= {g["key"] for g in data["gpus"]}
    assert {"hy3", "gpt-oss-120b"} <= {m["key"] for m in data["models"]}


def test_list_table():
    res = CliRunner().invoke(main, ["profiles", "list"])
    assert res.exit_code == 0 and "hy3" in res.output and "NVIDIA H200 SXM" in res.output


def test_show_model_includes_derived():
    res = CliRunner().invoke(main, ["profiles", "show", "Llama-3.1-8B", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["derived"]["kv_bytes_per_token_bf16"] == 131072
    assert data["derived"]["total_params"] == 8_030_261_248
    res = CliRunner().invoke(main, ["profiles", "show", "hy3"])
    assert "kv_bytes_per_token_bf16" in res.output and "327680" in res.output


def test_show_gpu_and_unknown():
    res = CliRunner().invoke(main, ["profiles", "show", "NVIDIA H200"])
    assert res.exit_code == 0 and "compute_capability" in res.output and "9.0" in res.output
    res = CliRunner().invoke(main, ["profiles", "show", "h2000"])
    assert res.exit_code == 1 and "no GPU profile named 'h2000'" in res.output
