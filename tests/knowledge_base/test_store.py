"""KnowledgeBase on a real SQLite file: runs, GPUs, traces, recommendations, notes and links."""

from __future__ import annotations

import sqlite3

import pytest

from hpc_advise.knowledge_base.store import KnowledgeBase
from hpc_advise.runtime.measure.harness import run_row
from tests.knowledge_base.conftest import kernel_row


def _count(kb, table):
    return kb.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_run_row_output_round_trips(kb, db_path):
    env = {"python": "3.12.3", "torch": "2.13.0", "gpu": "NVIDIA H200"}
    row = run_row(kind="kernel", subject="router_gemm", provider="hpc_advise",
                  config={"m": 128, "n": 256, "k": 7168}, metric="latency", unit="us", value=31.5, env=env)  # fmt: skip
    [run_id] = kb.add_runs([row])
    with KnowledgeBase(db_path) as other:  # read back through a second connection
        got = other.run(run_id)
    assert got["config"] == {"m": 128, "n": 256, "k": 7168}
    assert got["versions"] == env
    assert (got["p20"], got["p50"], got["p80"]) == (31.5, 31.5, 31.5)
    assert got["gpu"] == "NVIDIA H200" and got["command"] == row["command"]
    assert got["created_at"] == row["created_at"]


def test_add_runs_is_all_or_nothing(kb):
    rows = [kernel_row(), kernel_row(p50=float("nan")), kernel_row()]
    with pytest.raises(ValueError, match="run row 1: 'p50' must be a finite number"):
        kb.add_runs(rows)
    assert _count(kb, "runs") == 0
    bad_config = [kernel_row(), kernel_row(config={"x": float("inf")})]
    with pytest.raises(ValueError, match="run row 1: config"):
        kb.add_runs(bad_config)
    with pytest.raises(ValueError, match=r"run row 0: unknown keys \['colour'\]"):
        kb.add_runs([kernel_row(colour="red")])
    with pytest.raises(ValueError, match="'metric' must be a non-empty string"):
        kb.add_runs([kernel_row(metric="")])
    assert _count(kb, "runs") == 0


def test_run_filters_and_limit(kb):
    kb.add_runs([
        kernel_row(provider="hpc_advise", gpu="NVIDIA H200"),
        kernel_row(provider="flashinfer", gpu="NVIDIA H200"),
        kernel_row(subject="fused_moe", gpu="NVIDIA H100 80GB HBM3"),
        kernel_row(kind="microbench", subject="copy", gpu=None, metric="bandwidth", unit="TB/s", p50=4.1),
    ])  # fmt: skip
    assert len(kb.runs()) == 4
    assert [r["provider"] for r in kb.runs(subject="decode_attention")] == ["hpc_advise", "flashinfer"]
    assert [r["subject"] for r in kb.runs(gpu="h100")] == ["fused_moe"]
    assert len(kb.runs(gpu="H200")) == 2
    assert kb.runs(gpu="%") == []  # LIKE wildcards are literal
    assert [r["subject"] for r in kb.runs(kind="microbench")] == ["copy"]
    assert [r["id"] for r in kb.runs(limit=2)] == [3, 4]  # newest two, oldest first
    with pytest.raises(KeyError, match="no run with id 99"):
        kb.run(99)


def test_gpus_traces_recommendations(kb):
    gid = kb.add_gpu({"name": "NVIDIA H200", "count": 8, "memory_gib": 139.8, "cc": [9, 0]})
    assert kb.gpus()[0]["id"] == gid and kb.gpus()[0]["facts"]["cc"] == [9, 0]
    assert kb.gpus()[0]["count"] == 8
    tid = kb.add_trace({"n_requests": 1000, "rate_rps": 3.2}, source="mooncake.jsonl")
    assert kb.traces()[0] == {**kb.traces()[0], "id": tid, "source": "mooncake.jsonl"}
    assert kb.traces()[0]["summary"]["rate_rps"] == 3.2
    rid = kb.add_recommendation({"trace": "t.jsonl", "model": "hy3"}, {"ranked": [{"tp": 8}]}, "sha256:abc")
    rec = kb.recommendation(rid)
    assert rec["inputs"]["model"] == "hy3" and rec["outputs"]["ranked"][0]["tp"] == 8
    assert rec["model_hash"] == "sha256:abc"
    with pytest.raises(KeyError):
        kb.recommendation(rid + 1)


def test_notes_tags_links_and_cascade(kb):
    [r1, r2] = kb.add_runs([kernel_row(), kernel_row(provider="flashinfer")])
    nid = kb.add_note("FlashInfer loses at 128K.", title="decode", tags=["Attention", "h200", "attention"],
                      run_ids=[r1, r2])  # fmt: skip
    note = kb.note(nid)
    assert note["tags"] == ["attention", "h200"]  # lower-cased, de-duplicated
    assert note["run_ids"] == [r1, r2]
    kb.delete_notes([nid])
    assert _count(kb, "note_tags") == 0 and _count(kb, "note_runs") == 0
    assert _count(kb, "runs") == 2  # runs stay


def test_note_with_unknown_run_writes_nothing(kb):
    with pytest.raises(KeyError, match="no run with id 7"):
        kb.add_note("orphan", tags=["x"], run_ids=[7])
    assert _count(kb, "notes") == 0 and _count(kb, "note_tags") == 0
    assert kb.search_notes("orphan") == []


def test_delete_notes_all_or_nothing(kb):
    a = kb.add_note("first")
    with pytest.raises(KeyError, match="no note with id 999"):
        kb.delete_notes([a, 999])
    assert kb.note(a)["body"] == "first"


def test_empty_note_is_refused(kb):
    with pytest.raises(ValueError, match="non-empty body"):
        kb.add_note("   \n")


def test_default_path_honours_hpc_advise_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_ADVISE_HOME", str(tmp_path / "elsewhere"))
    with KnowledgeBase() as kb:
        assert kb.path == tmp_path / "elsewhere" / "kb.db"
    assert sqlite3.connect(tmp_path / "elsewhere" / "kb.db").execute(
        "SELECT count(*) FROM runs"
    ).fetchone() == (0,)


def test_compare_kernel_runs_and_mismatch_warning(kb):
    from hpc_advise.knowledge_base.compare import compare

    ids = kb.add_runs([
        kernel_row(),
        kernel_row(provider="flashinfer", p20=120.0, p50=131.0, p80=140.0),
        kernel_row(metric="bandwidth", unit="TB/s", p20=3.0, p50=3.5, p80=3.9),
    ])  # fmt: skip
    result = compare([kb.run(i) for i in ids[:2]])
    rows = {r["name"]: r for r in result.rows}
    assert rows["provider"]["values"] == ["hpc_advise", "flashinfer"]
    assert rows["latency p50 [us]"]["ratios"] == [pytest.approx(131.0 / 113.0)]
    assert rows["config"]["values"] == ["(same)", "(same)"]
    assert result.warnings == []
    mixed = compare([kb.run(i) for i in ids])
    assert mixed.warnings and "bandwidth [TB/s]" in mixed.warnings[0]
    with pytest.raises(ValueError, match="at least two"):
        compare([kb.run(ids[0])])
