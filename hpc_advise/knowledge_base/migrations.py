"""Schema of the knowledge base, as an ordered list of named migration functions.

Each migration is a plain function ``mNNN_what(db)`` taking a ``sqlite_utils.Database``; its name is
recorded in the ``_migrations`` table once applied. ``migrate(db)`` applies the missing ones, in
order, inside one ``BEGIN IMMEDIATE`` transaction, so two processes opening a fresh file at the same
moment cannot both migrate it (the second waits on the busy timeout, then finds nothing to do).

A file whose ``_migrations`` table names a migration this version does not know was written by a
newer hpc-advise: ``migrate`` refuses it (``SchemaError``) instead of guessing. A file with tables but
no ``_migrations`` table is not ours and is refused too.

Never edit a released migration: add a new one at the end of ``MIGRATIONS``.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence

import sqlite_utils

MIGRATIONS_TABLE = "_migrations"


class KnowledgeBaseError(RuntimeError):
    """The knowledge-base file cannot be used (base of the errors the CLI turns into one line)."""


class SchemaError(KnowledgeBaseError):
    """The file is not a knowledge base this version of hpc-advise can use."""


def m001_initial(db: sqlite_utils.Database) -> None:
    """gpus, runs, notes (+ tags, run links), traces, recommendations."""
    db["gpus"].create(
        {"id": int, "name": str, "count": int, "facts": str, "created_at": str},
        pk="id",
        not_null={"facts", "created_at"},
    )
    db["runs"].create(
        {
            "id": int,
            "kind": str,  # kernel | microbench | serving | comm | ...
            "subject": str,  # kernel name or serving engine
            "provider": str,  # implementation, or the label of a serving configuration
            "config": str,  # JSON: shapes / launch parameters
            "metric": str,
            "unit": str,
            "p20": float,
            "p50": float,
            "p80": float,
            "metrics": str,  # JSON: further named metrics (serving: TTFT/TPOT/ITL/E2E, throughputs)
            "gpu": str,
            "versions": str,  # JSON
            "git_sha": str,
            "command": str,
            "source": str,  # FILE:LINE for imported rows
            "fingerprint": str,  # content hash of an imported record (re-imports are skipped)
            "created_at": str,
        },
        pk="id",
        not_null={"kind", "subject", "provider", "config", "metric", "unit", "p50", "created_at"},
    )
    db["runs"].create_index(["kind", "subject", "provider"])
    db["runs"].create_index(["gpu"])
    db["runs"].create_index(["fingerprint"], unique=True)
    db["notes"].create(
        {"id": int, "title": str, "body": str, "created_at": str, "updated_at": str},
        pk="id",
        not_null={"body", "created_at", "updated_at"},
    )
    # Link tables in plain SQL: deleting a note or a run must drop its links (ON DELETE CASCADE).
    db.execute(
        "CREATE TABLE note_tags (note_id INTEGER NOT NULL REFERENCES notes(id) ON DELETE CASCADE,"
        " tag TEXT NOT NULL, PRIMARY KEY (note_id, tag))"
    )
    db.execute("CREATE INDEX idx_note_tags_tag ON note_tags(tag)")
    db.execute(
        "CREATE TABLE note_runs (note_id INTEGER NOT NULL REFERENCES notes(id) ON DELETE CASCADE,"
        " run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE, PRIMARY KEY (note_id, run_id))"
    )
    db["traces"].create(
        {"id": int, "source": str, "summary": str, "created_at": str},
        pk="id",
        not_null={"summary", "created_at"},
    )
    db["recommendations"].create(
        {"id": int, "inputs": str, "outputs": str, "model_hash": str, "created_at": str},
        pk="id",
        not_null={"inputs", "outputs", "created_at"},
    )


def m002_notes_fts(db: sqlite_utils.Database) -> None:
    """FTS5 index over notes.title/body (porter stemming), kept in sync by triggers."""
    db["notes"].enable_fts(
        ["title", "body"], fts_version="FTS5", create_triggers=True, tokenize="porter", replace=True
    )
    db.execute("INSERT INTO notes_fts (notes_fts) VALUES ('rebuild')")


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [m001_initial, m002_notes_fts]


def applied(db: sqlite_utils.Database) -> list[str]:
    """Names of the migrations recorded in the file, oldest first."""
    if MIGRATIONS_TABLE not in db.table_names():
        return []
    return [r[0] for r in db.execute(f"SELECT name FROM {MIGRATIONS_TABLE} ORDER BY rowid").fetchall()]


def check(db: sqlite_utils.Database, migrations: Sequence[Callable] = MIGRATIONS) -> list[str]:
    """Raise ``SchemaError`` if the file is foreign or newer; return the applied names."""
    known = [m.__name__ for m in migrations]
    tables = [t for t in db.table_names() if not t.startswith("sqlite_")]
    if tables and MIGRATIONS_TABLE not in tables:
        raise SchemaError(
            f"not an hpc-advise knowledge base (it has tables {', '.join(sorted(tables)[:5])} "
            f"but no {MIGRATIONS_TABLE} table); use another --db"
        )
    done = applied(db)
    unknown = [name for name in done if name not in known]
    if unknown:
        raise SchemaError(
            "written by a newer hpc-advise: unknown schema migrations "
            f"{', '.join(unknown)} (this version knows {len(known)}); upgrade hpc-advise"
        )
    if done != known[: len(done)]:
        raise SchemaError(f"schema migrations applied out of order: {done}")
    return done


def migrate(db: sqlite_utils.Database, migrations: Sequence[Callable] = MIGRATIONS) -> list[str]:
    """Apply the missing migrations atomically; return the names applied now."""
    if len(check(db, migrations)) == len(migrations):
        return []  # fast path, no write lock
    db.conn.execute("BEGIN IMMEDIATE")  # waits for other writers (busy timeout), then re-checks
    try:
        if MIGRATIONS_TABLE not in db.table_names():
            db.execute(f"CREATE TABLE {MIGRATIONS_TABLE} (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
        done = check(db, migrations)
        now = []
        for fn in migrations[len(done) :]:
            fn(db)
            db.execute(
                f"INSERT INTO {MIGRATIONS_TABLE} (name, applied_at) VALUES (?, ?)",
                [fn.__name__, _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")],
            )
            now.append(fn.__name__)
        db.execute(f"PRAGMA user_version = {len(done) + len(now)}")
        db.conn.execute("COMMIT")
    except BaseException:
        if db.conn.in_transaction:
            db.conn.execute("ROLLBACK")
        raise
    return now
