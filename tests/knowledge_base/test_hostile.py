"""The knowledge base under damage, read-only folders and hostile queries: one line, nothing written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpc_advise.cli import main
from hpc_advise.knowledge_base.store import KnowledgeBase
from tests.knowledge_base.conftest import SGLANG_JSONL

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


def _cli(db: Path, *args: str):
    return CliRunner().invoke(main, [*args, "--db", str(db)])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _notes_kb(path: Path, n: int = 300) -> None:
    kb = KnowledgeBase(path)
    for i in range(n):
        kb.add_note(f"note {i} about flashinfer decode " + "x" * 400, title=f"n{i}")
    kb.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    kb.close()


def _damage(path: Path) -> None:
    """Overwrite pages in the middle of the file; the 100-byte header stays valid."""
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big") or 65536
    assert len(data) > 8 * page
    for p in range(3, len(data) // page - 1, 2):
        data[p * page : p * page + 64] = os.urandom(64)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "command", [["kb", "stats"], ["runs", "list"], ["kb", "export"], ["notes", "add", "x"]]
)
def test_damaged_pages_give_one_line_and_write_nothing(tmp_path, command):
    db = tmp_path / "kb.db"
    _notes_kb(db)
    _damage(db)
    before = _digest(db)
    result = _cli(db, *command)
    assert result.exit_code == 1, result.output
    assert "damaged or not a knowledge base" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert _digest(db) == before


def _as_nobody(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HPC_ADVISE_HOME": str(home)}
    cmd = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        sys.executable,
        "-m",
        "hpc_advise",
    ]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


needs_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="read-only folders are only real for a non-root user: needs root and setpriv to drop to one",
)


def _world_readable(path: Path) -> None:
    for p in [path, *path.parents]:
        if p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o555)


@needs_setpriv
def test_read_only_folder_reads_and_refuses_writes_in_one_line(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    _notes_kb(home / "kb.db", n=3)
    _world_readable(home / "kb.db")
    home.chmod(0o555)
    (home / "kb.db").chmod(0o444)
    listed = _as_nobody("notes", "search", "flashinfer", home=home)
    assert listed.returncode == 0, listed.stderr
    assert "#3" in listed.stdout
    before = _digest(home / "kb.db")
    wrote = _as_nobody("notes", "add", "hello", home=home)
    assert wrote.returncode == 1
    assert "read-only (nothing written)" in wrote.stderr and "Traceback" not in wrote.stderr
    assert len(wrote.stderr.strip().splitlines()) == 1
    assert _digest(home / "kb.db") == before
    assert sorted(p.name for p in home.iterdir()) == ["kb.db"]


@needs_setpriv
def test_missing_kb_in_read_only_folder_names_the_fix(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    _world_readable(home)
    home.chmod(0o555)
    result = _as_nobody("kb", "stats", home=home)
    assert result.returncode == 1
    assert "is not writable" in result.stderr and "HPC_ADVISE_HOME" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def three_notes(tmp_path):
    db = tmp_path / "kb.db"
    kb = KnowledgeBase(db)
    ids = {
        "fi": kb.add_note("flashinfer decode is slow at page 16", title="FlashInfer page 16"),
        "fa3": kb.add_note("fa3 prefill on hopper", title="fa3"),
        "tr": kb.add_note("triton decode kernel", title="Triton attention"),
    }
    kb.close()
    return db, ids


@pytest.mark.parametrize(
    "query, expected",
    [
        ("NOT flashinfer", {"fa3", "tr"}),
        ("-decode", {"fa3"}),
        ("decode -flashinfer", {"tr"}),
        ("decode NOT triton", {"fi"}),
        ("title:fa3", {"fa3"}),
        ("title:decode", set()),
        ('body:"decode kernel"', {"tr"}),
        ("title:triton OR title:flashinfer", {"fi", "tr"}),
    ],
)
def test_search_negation_and_column_filters(three_notes, query, expected):
    db, ids = three_notes
    kb = KnowledgeBase(db)
    got = {h["id"] for h in kb.search_notes(query)}
    kb.close()
    assert got == {ids[k] for k in expected}


def test_import_of_many_runs_prints_a_range_not_every_id(tmp_path):
    record = json.loads(SGLANG_JSONL.read_text().splitlines()[0])
    lines = [json.dumps({**record, "duration": record["duration"] + i}) for i in range(60)]
    trace = tmp_path / "runs.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    db = tmp_path / "kb.db"
    result = _cli(db, "runs", "import", str(trace))
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("ids 1-60 (60 rows)"), result.output
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 60


def test_the_same_trace_summary_is_stored_once(tmp_path):
    kb = KnowledgeBase(tmp_path / "kb.db")
    first = kb.add_trace({"requests": 5, "rate": 1.5}, "a.jsonl")
    assert kb.add_trace({"rate": 1.5, "requests": 5}, "a.jsonl") == first
    assert kb.add_trace({"requests": 6, "rate": 1.5}, "a.jsonl") != first
    assert kb.add_trace({"requests": 5, "rate": 1.5}, "b.jsonl") != first
    assert len(kb.traces()) == 3
    kb.close()
