"""Schema migrations on real SQLite files: fresh file, upgrade, refusal of newer/foreign files."""

from __future__ import annotations

import sqlite3

import pytest
import sqlite_utils
from click.testing import CliRunner

from hpc_advise.cli import main
from hpc_advise.knowledge_base import migrations
from hpc_advise.knowledge_base.store import KnowledgeBase, SchemaError


def test_fresh_file_gets_every_migration_once(db_path):
    KnowledgeBase(db_path).close()
    KnowledgeBase(db_path).close()  # second open applies nothing
    con = sqlite3.connect(db_path)
    names = [r[0] for r in con.execute("SELECT name FROM _migrations ORDER BY rowid")]
    assert names == [m.__name__ for m in migrations.MIGRATIONS]
    assert con.execute("PRAGMA user_version").fetchone()[0] == len(migrations.MIGRATIONS)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {
        "gpus",
        "runs",
        "notes",
        "note_tags",
        "note_runs",
        "traces",
        "recommendations",
        "notes_fts",
    } <= tables
    triggers = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
    assert {"notes_ai", "notes_ad", "notes_au"} <= triggers
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_busy_timeout_is_set(kb):
    assert kb.conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 10_000
    assert kb.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_upgrade_applies_missing_migration_and_indexes_old_notes(db_path):
    db = sqlite_utils.Database(sqlite3.connect(db_path))
    assert migrations.migrate(db, migrations.MIGRATIONS[:1]) == ["m001_initial"]
    db.conn.execute(
        "INSERT INTO notes (title, body, created_at, updated_at) VALUES ('old', 'written before FTS existed',"
        " '2026-01-01T00:00:00+00:00', '2026-01-01T00:00:00+00:00')"
    )
    db.conn.commit()
    db.conn.close()
    with KnowledgeBase(db_path) as kb:
        assert migrations.applied(kb.db) == [m.__name__ for m in migrations.MIGRATIONS]
        hits = kb.search_notes("before")
        assert [h["title"] for h in hits] == ["old"]


def test_failed_migration_leaves_file_untouched(db_path):
    def m002_broken(db):
        db.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("boom")

    db = sqlite_utils.Database(sqlite3.connect(db_path))
    with pytest.raises(RuntimeError, match="boom"):
        migrations.migrate(db, [migrations.m001_initial, m002_broken])
    assert db.table_names() == []  # the whole batch rolled back, m001 included


def _future(db_path):
    KnowledgeBase(db_path).close()
    con = sqlite3.connect(db_path)
    con.execute("INSERT INTO _migrations VALUES ('m999_from_the_future', '2030-01-01T00:00:00+00:00')")
    con.commit()
    con.close()


def test_newer_schema_is_refused(db_path):
    _future(db_path)
    with pytest.raises(SchemaError, match="newer hpc-advise.*m999_from_the_future"):
        KnowledgeBase(db_path)


def test_newer_schema_is_refused_by_the_cli(db_path):
    _future(db_path)
    result = CliRunner().invoke(main, ["notes", "list", "--db", str(db_path)])
    assert result.exit_code == 1
    assert "newer hpc-advise" in result.output and "m999_from_the_future" in result.output
    assert "Traceback" not in result.output


def test_foreign_sqlite_file_is_refused(db_path):
    con = sqlite3.connect(db_path)
    con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    con.commit()
    con.close()
    with pytest.raises(SchemaError, match="not an hpc-advise knowledge base"):
        KnowledgeBase(db_path)
    con = sqlite3.connect(db_path)  # and nothing was added to it
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["customers"]


def test_non_sqlite_file_is_refused(db_path):
    db_path.write_text("this is not a database, " * 100)
    with pytest.raises(SchemaError, match="damaged or not a knowledge base"):
        KnowledgeBase(db_path)
