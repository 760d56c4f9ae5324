"""Two real processes writing to one knowledge-base file at the same time both succeed."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent(
    """
    import sys
    from hpc_advise.knowledge_base.store import KnowledgeBase
    path, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    row = dict(kind="kernel", subject="decode_attention", provider=name, config={}, metric="latency",
               unit="us", p50=1.0)
    with KnowledgeBase(path) as kb:  # both processes may run the migrations on the fresh file
        for i in range(n):
            kb.add_note(f"note {i} from {name}", tags=[name])
            kb.add_runs([dict(row, p50=float(i)), dict(row, p50=float(i) + 0.5)])
    print("done", name)
    """
)

HOLDER = textwrap.dedent(
    """
    import sys, time
    from hpc_advise.knowledge_base.store import KnowledgeBase
    with KnowledgeBase(sys.argv[1]) as kb:
        with kb._write():
            kb.conn.execute("INSERT INTO notes (body, created_at, updated_at) VALUES ('held', 'x', 'x')")
            print("locked", flush=True)
            time.sleep(1.5)
            print(time.monotonic(), flush=True)  # system-wide clock, read just before COMMIT
    """
)


def _spawn(script, *args):
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_two_processes_write_at_once(tmp_path):
    db = tmp_path / "kb.db"  # does not exist yet: migrations race too
    n = 60
    procs = [_spawn(WRITER, db, name, n) for name in ("alpha", "beta")]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.startswith("done")
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(*) FROM notes").fetchone()[0] == 2 * n
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 4 * n
    assert dict(con.execute("SELECT provider, count(*) FROM runs GROUP BY provider").fetchall()) == {
        "alpha": 2 * n,
        "beta": 2 * n,
    }
    assert con.execute("SELECT count(*) FROM _migrations").fetchone()[0] == 2
    assert con.execute("SELECT count(*) FROM notes_fts WHERE notes_fts MATCH 'beta'").fetchone()[0] == n


def test_writer_waits_for_a_held_lock(tmp_path):
    db = tmp_path / "kb.db"
    sqlite3.connect(db).close()
    from hpc_advise.knowledge_base.store import KnowledgeBase

    KnowledgeBase(db).close()
    holder = _spawn(HOLDER, db)
    assert holder.stdout.readline().strip() == "locked"
    start = time.monotonic()
    with KnowledgeBase(db) as kb:
        kb.add_note("waited for the lock")
        done = time.monotonic()
        assert {n["body"] for n in kb.notes()} == {"held", "waited for the lock"}
    assert holder.wait(timeout=30) == 0
    released = float(holder.stdout.readline())
    # it asked while the other process held the write lock and finished only after that one's COMMIT
    # (an order of events on one clock, not a duration: a slow CI machine cannot make it fail unless
    # this process stalls for the holder's whole 1.5 s)
    assert start < released < done, (start, released, done)


def test_lock_held_past_the_busy_timeout_is_a_clear_error(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from hpc_advise.cli import main
    from hpc_advise.knowledge_base import store
    from hpc_advise.knowledge_base.store import KnowledgeBase

    db = tmp_path / "kb.db"
    KnowledgeBase(db).close()
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        result = CliRunner().invoke(main, ["notes", "add", "blocked", "--db", str(db)])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.exit_code == 1
    assert "database is locked: another process kept writing" in result.output
    assert KnowledgeBase(db).notes() == []
