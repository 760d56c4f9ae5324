"""``hpc-advise kb|notes|runs`` through click's CliRunner and real subprocesses."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpc_advise.cli import main
from tests.knowledge_base.conftest import SGLANG_BROKEN, SGLANG_JSONL, VLLM_JSON

REPO = Path(__file__).resolve().parents[2]


def run(db, *args, input=None, ok=True):
    result = CliRunner().invoke(main, [*args, "--db", str(db)], input=input)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def test_notes_add_search_show_list_edit_rm(db_path, tmp_path):
    assert run(db_path, "notes", "add", "FlashInfer decode wrapper degrades at 128K context.",
               "--title", "long context", "--tag", "attention", "--tag", "H200").output == "added note 1\n"  # fmt: skip
    run(db_path, "notes", "add", "-", "--tag", "moe", input="Fused MoE per-tensor fp8 reached 4 TB/s.\n")
    body = tmp_path / "body.md"
    body.write_text("Router GEMM: two-BF16 split keeps fp32 accuracy; context is short.")
    run(db_path, "notes", "add", "--file", str(body), "--title", "router")

    hits = json.loads(run(db_path, "notes", "search", "context", "--json").output)
    assert [h["id"] for h in hits] == [1, 3]
    assert "**context**" in hits[0]["snippet"]
    out = run(db_path, "notes", "search", "context", "--tag", "attention").output
    assert out.startswith("#1  long context  [attention, h200]") and "**context**" in out
    assert "no matching notes" in run(db_path, "notes", "search", "nothing-like-this").output

    shown = json.loads(run(db_path, "notes", "show", "2", "--json").output)
    assert shown["body"] == "Fused MoE per-tensor fp8 reached 4 TB/s.\n" and shown["tags"] == ["moe"]
    listed = run(db_path, "notes", "list").output
    assert "long context" in listed and "router" in listed

    run(db_path, "notes", "edit", "3", "Router GEMM notes, rewritten.", "--tag", "router")
    assert json.loads(run(db_path, "notes", "list", "--tag", "router", "--json").output)[0]["id"] == 3
    assert json.loads(run(db_path, "notes", "search", "short", "--json").output) == []

    run(db_path, "notes", "rm", "1", "2")
    assert [n["id"] for n in json.loads(run(db_path, "notes", "list", "--json").output)] == [3]
    missing = run(db_path, "notes", "show", "1", ok=False)
    assert missing.exit_code == 1 and "no note with id 1" in missing.output


def test_notes_add_needs_a_body(db_path):
    result = run(db_path, "notes", "add", "--title", "t", ok=False)
    assert result.exit_code == 2 and "give the note" in result.output


def test_note_links_to_imported_run(db_path):
    run(db_path, "runs", "import", str(VLLM_JSON))
    run(db_path, "notes", "add", "baseline vLLM run", "--run", "1")
    assert json.loads(run(db_path, "notes", "show", "1", "--json").output)["run_ids"] == [1]
    bad = run(db_path, "notes", "add", "dangling", "--run", "42", ok=False)
    assert bad.exit_code == 1 and "no run with id 42" in bad.output


def test_import_then_list_show_compare(db_path):
    out = run(db_path, "runs", "import", str(SGLANG_JSONL), str(VLLM_JSON), "--gpu", "NVIDIA H200").output
    assert out.startswith("imported 5 run(s) from 2 file(s)")
    again = json.loads(run(db_path, "runs", "import", str(VLLM_JSON), "--json").output)
    assert again == {"ids": [5], "new": 0}
    assert "4 already present" in run(db_path, "runs", "import", str(SGLANG_JSONL)).output

    table = run(db_path, "runs", "list", "--kind", "serving").output
    assert "output_throughput" in table and "hpc_advise-decode" in table and "NVIDIA H200" in table
    rows = json.loads(run(db_path, "runs", "list", "--subject", "sglang", "--json").output)
    assert [r["id"] for r in rows] == [1, 2, 3, 4]
    assert json.loads(run(db_path, "runs", "list", "--provider", "vllm", "--json").output)[0]["id"] == 5

    show = run(db_path, "runs", "show", "3").output
    assert "median_ttft_ms" in show and "command: python -m sglang.launch_server" in show

    cmp = json.loads(run(db_path, "runs", "compare", "1", "3", "5", "--json").output)
    by_name = {r["name"]: r for r in cmp["rows"]}
    raw = [json.loads(line) for line in SGLANG_JSONL.read_text().splitlines()]
    tpot = by_name["median_tpot_ms"]
    assert tpot["values"][:2] == [raw[0]["median_tpot_ms"], raw[2]["median_tpot_ms"]]
    assert tpot["ratios"][0] == pytest.approx(raw[2]["median_tpot_ms"] / raw[0]["median_tpot_ms"])
    assert by_name["config.page_size"]["values"][:2] == [1, 64]
    text = run(db_path, "runs", "compare", "1", "2").output
    assert "÷#1" in text and "p99_ttft_ms" in text and "4.000" in text  # 64 vs 16 concurrency


def test_import_is_all_or_nothing_across_files(db_path):
    result = run(db_path, "runs", "import", str(SGLANG_JSONL), str(SGLANG_BROKEN), ok=False)
    assert result.exit_code == 1
    assert f"{SGLANG_BROKEN}:2: invalid JSON" in result.output
    assert f"{SGLANG_BROKEN}:3: sglang.bench_serving result without 'median_ttft_ms'" in result.output
    assert "nothing imported" in result.output
    assert json.loads(run(db_path, "runs", "list", "--json").output) == []


def test_compare_errors(db_path):
    run(db_path, "runs", "import", str(VLLM_JSON))
    assert run(db_path, "runs", "compare", "1", ok=False).exit_code == 2
    bad = run(db_path, "runs", "compare", "1", "9", ok=False)
    assert bad.exit_code == 1 and "no run with id 9" in bad.output


def test_kb_path_stats_export(db_path, tmp_path):
    assert run(db_path, "kb", "path").output.strip() == str(db_path)
    assert json.loads(run(db_path, "kb", "path", "--json").output) == {"path": str(db_path), "exists": False}
    run(db_path, "runs", "import", str(SGLANG_JSONL))
    run(db_path, "notes", "add", "hello", "--tag", "x")
    stats = json.loads(run(db_path, "kb", "stats", "--json").output)
    assert stats["counts"]["runs"] == 4 and stats["counts"]["notes"] == 1 and stats["journal_mode"] == "wal"
    assert "runs" in run(db_path, "kb", "stats").output

    dump = json.loads(run(db_path, "kb", "export").output)
    assert dump["schema"] == ["m001_initial", "m002_notes_fts"]
    assert len(dump["runs"]) == 4 and dump["runs"][0]["metrics"]["median_ttft_ms"] > 0
    assert dump["notes"][0]["body"] == "hello"
    out = tmp_path / "runs.csv"
    run(db_path, "kb", "export", "--format", "csv", "-o", str(out))
    table = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(table) == 4 and json.loads(table[0]["config"])["max_concurrency"] == 16
    notes_csv = run(db_path, "kb", "export", "--format", "csv", "--table", "notes").output
    assert notes_csv.splitlines()[0] == "id,title,body,created_at,updated_at"
    bad = run(db_path, "kb", "export", "--table", "secrets", ok=False)
    assert bad.exit_code == 1 and "unknown table" in bad.output


def test_default_db_is_under_hpc_advise_home(tmp_path):
    runner = CliRunner()
    env = {"HPC_ADVISE_HOME": str(tmp_path / "h")}
    assert runner.invoke(main, ["notes", "add", "x"], env=env).exit_code == 0
    assert (tmp_path / "h" / "kb.db").exists()
    assert runner.invoke(main, ["kb", "path"], env=env).output.strip() == str(tmp_path / "h" / "kb.db")


def _cli(*args, home):
    env = {**os.environ, "HPC_ADVISE_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "hpc_advise", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)  # fmt: skip


def test_real_subprocess_import_list_compare(tmp_path):
    imp = _cli("runs", "import", str(SGLANG_JSONL), "--gpu", "NVIDIA H200", home=tmp_path)
    assert imp.returncode == 0, imp.stderr
    listed = _cli("runs", "list", "--json", home=tmp_path)
    assert [r["provider"] for r in json.loads(listed.stdout)] == [
        "sglang",
        "sglang",
        "hpc_advise-decode",
        "smoke-details",
    ]
    cmp = _cli("runs", "compare", "1", "2", home=tmp_path)
    assert cmp.returncode == 0 and "median_ttft_ms" in cmp.stdout
    broken = _cli("runs", "import", str(SGLANG_BROKEN), home=tmp_path)
    assert broken.returncode == 1 and f"{SGLANG_BROKEN}:2:" in broken.stderr
