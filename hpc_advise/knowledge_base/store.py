"""``KnowledgeBase``: the SQLite file behind ``hpc-advise kb|notes|runs`` and the advisor.

One file (default ``hpc_advise.paths.kb_path()``, i.e. ``$HPC_ADVISE_HOME/kb.db``), opened in WAL
mode with a busy timeout so several processes can read and write at once; every write method is one
``BEGIN IMMEDIATE`` transaction (all-or-nothing). The schema lives in ``migrations.py`` and is
brought up to date on open; a newer or foreign schema raises ``SchemaError``.

Tables: ``gpus`` (NVML facts), ``runs`` (one measurement each), ``notes`` (+ ``note_tags``,
``note_runs``; full-text indexed by ``notes_fts``), ``traces`` (workload summaries),
``recommendations`` (advisor inputs/outputs and the fitted model's hash).

A ``runs`` row is what ``hpc_advise.runtime.measure.harness.run_row()`` returns: kind, subject,
provider, config (dict), metric, unit, p20/p50/p80, gpu, versions (dict), git_sha, command,
created_at. Three optional keys: ``metrics`` (dict of further named values: serving imports keep
mean/median/p99 TTFT, TPOT, ITL, E2E latency and the throughputs there, while ``metric``/``p50``
hold the output throughput), ``source`` (``FILE:LINE`` of an imported record) and ``fingerprint``
(content hash; a row whose fingerprint is already stored is not inserted again). JSON columns come
back decoded to dicts.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import sqlite_utils

from hpc_advise import paths
from hpc_advise.knowledge_base.migrations import (
    MIGRATIONS,
    KnowledgeBaseError,
    SchemaError,
    applied,
    check,
    migrate,
)
from hpc_advise.knowledge_base.search import match_expression, parse_query, parse_when

BUSY_TIMEOUT_S = 30.0
TABLES = ("gpus", "runs", "notes", "note_tags", "note_runs", "traces", "recommendations")
JSON_COLUMNS = {
    "gpus": ("facts",),
    "runs": ("config", "metrics", "versions"),
    "traces": ("summary",),
    "recommendations": ("inputs", "outputs"),
}
RUN_TEXT_KEYS = ("kind", "subject", "provider", "metric", "unit")
RUN_KEYS = set(RUN_TEXT_KEYS) | {
    "config", "p20", "p50", "p80", "gpu", "versions", "git_sha", "command", "created_at",
    "metrics", "source", "fingerprint",
}  # fmt: skip

__all__ = ["KnowledgeBase", "KnowledgeBaseError", "SchemaError"]


def now_iso() -> str:
    """The current time (offset +00:00) as the ISO string stored in ``created_at`` columns."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def damaged_message(path: Path, exc: Exception) -> str:
    return (
        f"{path}: damaged or not a knowledge base ({exc}); move it aside (a new one is created) "
        "or restore it from a `kb export`"
    )


def read_only_message(path: Path) -> str:
    return f"{path}: read-only (nothing written); set {paths.ENV_HOME} or pass --db with a writable place"


def _read_only(path: Path) -> bool:
    """True when this process may read but not write ``path`` (or create it in its folder)."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if path.exists() and not os.access(path, os.W_OK):
        return True
    return not os.access(folder, os.W_OK)


def _check_integrity(conn: sqlite3.Connection) -> None:
    """Raise ``sqlite3.DatabaseError`` when a page of the file is damaged (a valid header is not enough)."""
    problems = [r[0] for r in conn.execute("PRAGMA quick_check(1)").fetchall()]
    if problems != ["ok"]:
        first = " ".join(" ".join(problems).split())
        raise sqlite3.DatabaseError(first[:160] + ("…" if len(first) > 160 else ""))


def locked_message(path: Path) -> str:
    return f"{path}: database is locked: another process kept writing for more than {BUSY_TIMEOUT_S:.0f} s"


def _dumps(value: object, what: str, sort: bool = True) -> str:
    try:
        return json.dumps(value, sort_keys=sort, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serializable without NaN/inf: {exc}") from None


def _decode(table: str, row: dict) -> dict:
    for col in JSON_COLUMNS.get(table, ()):
        if row.get(col) is not None:
            row[col] = json.loads(row[col])
    return row


def _number(value: object, what: str, *, required: bool) -> float | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


class KnowledgeBase:
    """The knowledge base file. ``KnowledgeBase(None)`` opens (and creates) the default one."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else paths.kb_path()
        self.path = self.path.expanduser()
        if self.path.is_dir():
            raise SchemaError(f"{self.path}: is a directory, not a knowledge-base file")
        self.read_only = _read_only(self.path)
        if self.read_only and not self.path.exists():
            raise KnowledgeBaseError(
                f"{self.path}: cannot create the knowledge base: {self.path.parent} is not writable "
                f"(set {paths.ENV_HOME} or pass --db with a writable place)"
            )
        try:
            if not self.read_only:
                self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KnowledgeBaseError(
                f"{self.path}: cannot create its folder ({exc.strerror}); set {paths.ENV_HOME} or pass --db"
            ) from None
        if self.read_only:
            # a folder we cannot write holds no -wal/-shm we could create: read the file as it is
            uri = "file:" + str(self.path.resolve()) + "?mode=ro&immutable=1"
            self.conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
        else:
            self.conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S)
        try:
            self.conn.execute("PRAGMA foreign_keys = ON")
            if self.read_only:
                self.journal_mode = self.conn.execute("PRAGMA journal_mode").fetchone()[0]
            else:
                self.journal_mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                self.conn.execute("PRAGMA synchronous = NORMAL")
            # no sqlite-utils plugins: the file reads the same wherever it is opened, and loading
            # them scans every installed distribution's entry points (~20 ms on each command)
            self.db = sqlite_utils.Database(self.conn, execute_plugins=False)
            _check_integrity(self.conn)
            if self.read_only:
                if len(check(self.db)) != len(MIGRATIONS):
                    raise SchemaError(
                        "read-only and written by an older hpc-advise: open it once where it can be written"
                    )
            else:
                migrate(self.db)
        except sqlite3.DatabaseError as exc:  # includes OperationalError ("database is locked")
            self.conn.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise KnowledgeBaseError(locked_message(self.path)) from None
            raise SchemaError(damaged_message(self.path, exc)) from None
        except SchemaError as exc:
            self.conn.close()
            raise SchemaError(f"{self.path}: {exc}") from None

    # -- plumbing -------------------------------------------------------------------------
    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction; takes the write lock up front so the busy timeout applies."""
        if self.read_only:
            raise KnowledgeBaseError(read_only_message(self.path))
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def _insert(self, table: str, record: dict) -> int:
        cols = ", ".join(record)
        marks = ", ".join("?" for _ in record)
        cur = self.conn.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", list(record.values()))
        return int(cur.lastrowid)

    def _rows(self, table: str, sql: str, params: Sequence = ()) -> list[dict]:
        return [_decode(table, dict(r)) for r in self.db.query(sql, params)]

    def _one(self, table: str, row_id: int, what: str) -> dict:
        rows = self._rows(table, f"SELECT * FROM {table} WHERE id = ?", [int(row_id)])
        if not rows:
            raise KeyError(f"no {what} with id {row_id}")
        return rows[0]

    # -- runs -----------------------------------------------------------------------------
    @staticmethod
    def _run_record(index: int, row: dict) -> dict:
        where = f"run row {index}"
        unknown = set(row) - RUN_KEYS
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        rec: dict = {}
        for key in RUN_TEXT_KEYS:
            value = row.get(key)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
            rec[key] = value
        config = row.get("config", {})
        if not isinstance(config, dict):
            raise ValueError(f"{where}: 'config' must be a dict")
        rec["config"] = _dumps(config, f"{where}: config")
        rec["p50"] = _number(row.get("p50"), f"{where}: 'p50'", required=True)
        for key in ("p20", "p80"):
            rec[key] = _number(row.get(key), f"{where}: {key!r}", required=False)
        for key in ("metrics", "versions"):
            value = row.get(key)
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"{where}: {key!r} must be a dict or None")
            rec[key] = None if value is None else _dumps(value, f"{where}: {key}", sort=key != "metrics")
        for key in ("gpu", "git_sha", "command", "source", "fingerprint"):
            value = row.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{where}: {key!r} must be a string or None")
            rec[key] = value
        created = row.get("created_at") or now_iso()
        try:
            rec["created_at"] = parse_when(str(created))
        except ValueError as exc:
            raise ValueError(f"{where}: 'created_at': {exc}") from None
        return rec

    def import_runs(self, rows: Iterable[dict]) -> tuple[list[int], int]:
        """Insert rows all-or-nothing; returns (ids, number newly inserted).

        A row whose ``fingerprint`` is already stored (or repeated in ``rows``) is not inserted
        again; its id is the stored row's.
        """
        records = [self._run_record(i, row) for i, row in enumerate(rows)]
        ids: list[int] = []
        new = 0
        with self._write():
            for rec in records:
                if rec["fingerprint"] is not None:
                    hit = self.conn.execute(
                        "SELECT id FROM runs WHERE fingerprint = ?", [rec["fingerprint"]]
                    ).fetchone()
                    if hit:
                        ids.append(int(hit[0]))
                        continue
                ids.append(self._insert("runs", rec))
                new += 1
        return ids, new

    def add_runs(self, rows: Iterable[dict]) -> list[int]:
        """Insert ``run_row()`` dicts all-or-nothing; returns their ids."""
        return self.import_runs(rows)[0]

    def runs(
        self,
        kind: str | None = None,
        subject: str | None = None,
        provider: str | None = None,
        gpu: str | None = None,
        limit: int | None = None,
    ) -> list[dict]:
        """Runs matching the filters (exact kind/subject/provider; ``gpu`` is a case-insensitive
        substring, so "h200" matches "NVIDIA H200"), oldest first; ``limit`` keeps the newest N."""
        where, params = [], []
        for col, value in (("kind", kind), ("subject", subject), ("provider", provider)):
            if value is not None:
                where.append(f"{col} = ?")
                params.append(value)
        if gpu is not None:
            where.append("gpu LIKE ? ESCAPE '\\'")
            params.append("%" + gpu.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
        sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._rows("runs", sql, params)[::-1]

    def run(self, run_id: int) -> dict:
        """One run by id (KeyError if absent)."""
        return self._one("runs", run_id, "run")

    # -- gpus, traces, recommendations ----------------------------------------------------
    def add_gpu(self, facts: dict) -> int:
        """Store NVML facts about one GPU model on this host (``name`` and ``count`` if given)."""
        if not isinstance(facts, dict):
            raise ValueError("GPU facts must be a dict")
        count = facts.get("count")
        rec = {
            "name": facts.get("name"),
            "count": int(count) if isinstance(count, int) else None,
            "facts": _dumps(facts, "GPU facts"),
            "created_at": now_iso(),
        }
        with self._write():
            return self._insert("gpus", rec)

    def gpus(self) -> list[dict]:
        return self._rows("gpus", "SELECT * FROM gpus ORDER BY id")

    def add_trace(self, summary: dict, source: str) -> int:
        """Store a trace summary (``TraceSummary.to_dict()``) and where it came from; the same summary of
        the same source is stored once (its id is returned again)."""
        if not isinstance(summary, dict):
            raise ValueError("trace summary must be a dict")
        rec = {"source": str(source), "summary": _dumps(summary, "trace summary"), "created_at": now_iso()}
        with self._write():
            hit = self.conn.execute(
                "SELECT id FROM traces WHERE source = ? AND summary = ?", [rec["source"], rec["summary"]]
            ).fetchone()
            if hit:
                return int(hit[0])
            return self._insert("traces", rec)

    def traces(self) -> list[dict]:
        return self._rows("traces", "SELECT * FROM traces ORDER BY id")

    def add_recommendation(self, inputs: dict, outputs: dict, model_hash: str) -> int:
        """Store what the advisor was asked, what it answered, and the fitted model's hash."""
        rec = {
            "inputs": _dumps(inputs, "recommendation inputs"),
            "outputs": _dumps(outputs, "recommendation outputs"),
            "model_hash": model_hash,
            "created_at": now_iso(),
        }
        with self._write():
            return self._insert("recommendations", rec)

    def recommendation(self, rec_id: int) -> dict:
        return self._one("recommendations", rec_id, "recommendation")

    def recommendations(self) -> list[dict]:
        return self._rows("recommendations", "SELECT * FROM recommendations ORDER BY id")

    # -- notes ----------------------------------------------------------------------------
    @staticmethod
    def _clean_tags(tags: Iterable[str]) -> list[str]:
        out = []
        for tag in tags:
            tag = str(tag).strip().lower()
            if not tag:
                raise ValueError("empty tag")
            if tag not in out:
                out.append(tag)
        return out

    def _link_runs(self, note_id: int, run_ids: Iterable[int]) -> None:
        for run_id in run_ids:
            if self.conn.execute("SELECT 1 FROM runs WHERE id = ?", [int(run_id)]).fetchone() is None:
                raise KeyError(f"no run with id {run_id}")
            self.conn.execute("INSERT OR IGNORE INTO note_runs VALUES (?, ?)", [note_id, int(run_id)])

    def add_note(
        self, body: str, title: str | None = None, tags: Iterable[str] = (), run_ids: Iterable[int] = ()
    ) -> int:
        """Add a note (searchable at once); tags are lower-cased; linked runs must exist."""
        if not isinstance(body, str) or not body.strip():
            raise ValueError("a note needs a non-empty body")
        tags = self._clean_tags(tags)
        stamp = now_iso()
        with self._write():
            note_id = self._insert(
                "notes", {"title": title, "body": body, "created_at": stamp, "updated_at": stamp}
            )
            for tag in tags:
                self.conn.execute("INSERT INTO note_tags VALUES (?, ?)", [note_id, tag])
            self._link_runs(note_id, run_ids)
        return note_id

    def update_note(
        self,
        note_id: int,
        *,
        body: str | None = None,
        title: str | None = None,
        tags: Iterable[str] | None = None,
        run_ids: Iterable[int] = (),
    ) -> None:
        """Change a note's body/title, replace its tags (if given), link more runs."""
        if body is not None and not body.strip():
            raise ValueError("a note needs a non-empty body")
        new_tags = None if tags is None else self._clean_tags(tags)
        with self._write():
            self._one("notes", note_id, "note")
            sets = {"updated_at": now_iso()}
            if body is not None:
                sets["body"] = body
            if title is not None:
                sets["title"] = title
            assignments = ", ".join(f"{k} = ?" for k in sets)
            self.conn.execute(f"UPDATE notes SET {assignments} WHERE id = ?", [*sets.values(), int(note_id)])
            if new_tags is not None:
                self.conn.execute("DELETE FROM note_tags WHERE note_id = ?", [int(note_id)])
                for tag in new_tags:
                    self.conn.execute("INSERT INTO note_tags VALUES (?, ?)", [int(note_id), tag])
            self._link_runs(int(note_id), run_ids)

    def delete_notes(self, note_ids: Iterable[int]) -> None:
        """Delete notes (all or none: an unknown id deletes nothing)."""
        ids = [int(i) for i in note_ids]
        with self._write():
            for note_id in ids:
                if self.conn.execute("DELETE FROM notes WHERE id = ?", [note_id]).rowcount != 1:
                    raise KeyError(f"no note with id {note_id}")

    def _with_links(self, notes: list[dict]) -> list[dict]:
        for note in notes:
            nid = note["id"]
            note["tags"] = [r[0] for r in self.conn.execute(
                "SELECT tag FROM note_tags WHERE note_id = ? ORDER BY tag", [nid])]  # fmt: skip
            note["run_ids"] = [r[0] for r in self.conn.execute(
                "SELECT run_id FROM note_runs WHERE note_id = ? ORDER BY run_id", [nid])]  # fmt: skip
        return notes

    @staticmethod
    def _note_filters(tags: Iterable[str], since: str | None, until: str | None) -> tuple[list[str], list]:
        where, params = [], []
        for tag in KnowledgeBase._clean_tags(tags):
            where.append("notes.id IN (SELECT note_id FROM note_tags WHERE tag = ?)")
            params.append(tag)
        if since:
            where.append("notes.created_at >= ?")
            params.append(parse_when(since))
        if until:
            where.append("notes.created_at < ?")
            params.append(parse_when(until, end=True))
        return where, params

    def note(self, note_id: int) -> dict:
        return self._with_links([self._one("notes", note_id, "note")])[0]

    def notes(
        self, tags: Iterable[str] = (), since: str | None = None, until: str | None = None,
        limit: int | None = None,
    ) -> list[dict]:  # fmt: skip
        """Notes with all the given tags, newest first."""
        where, params = self._note_filters(tags, since, until)
        sql = "SELECT * FROM notes" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY created_at DESC, id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._with_links(self._rows("notes", sql, params))

    def search_notes(
        self,
        query: str,
        tags: Iterable[str] = (),
        since: str | None = None,
        until: str | None = None,
        limit: int = 20,
        highlight: tuple[str, str] = ("**", "**"),
    ) -> list[dict]:
        """Full-text search, best first (bm25; a title hit weighs 5x a body hit).

        Each hit: id, title, snippet (matched terms wrapped in ``highlight``), score (higher is
        better), tags, run_ids, created_at. See ``search.match_expression`` for the query syntax.
        """
        where, params = self._note_filters(tags, since, until)
        parsed = parse_query(query)
        if parsed.positive is None:
            # only exclusions: every other note, newest first (no rank without a positive match)
            sql = (
                "SELECT notes.id, notes.title, notes.created_at, substr(notes.body, 1, 120) AS snippet, "
                "0.0 AS score FROM notes WHERE notes.id NOT IN "
                "(SELECT rowid FROM notes_fts WHERE notes_fts MATCH ?)"
            )
            sql += (
                "".join(" AND " + w for w in where) + " ORDER BY notes.created_at DESC, notes.id DESC LIMIT ?"
            )
            args = [parsed.negative, *params, int(limit)]
        else:
            sql = (
                "SELECT notes.id, notes.title, notes.created_at, "
                "snippet(notes_fts, -1, ?, ?, '…', 16) AS snippet, "
                "-bm25(notes_fts, 5.0, 1.0) AS score "
                "FROM notes_fts JOIN notes ON notes.id = notes_fts.rowid "
                "WHERE notes_fts MATCH ?"
            )
            sql += "".join(" AND " + w for w in where) + " ORDER BY score DESC, notes.id DESC LIMIT ?"
            args = [highlight[0], highlight[1], match_expression(query), *params, int(limit)]
        try:
            hits = [dict(r) for r in self.db.query(sql, args)]
        except sqlite3.OperationalError as exc:
            raise ValueError(f"bad search query {query!r}: {exc}") from None
        return self._with_links(hits)

    # -- whole file -----------------------------------------------------------------------
    def stats(self) -> dict:
        """Where the file is, its size, schema, and row counts."""
        files = [self.path, self.path.with_name(self.path.name + "-wal")]
        size = sum(p.stat().st_size for p in files if p.exists())
        counts = {t: self.conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
        kinds = dict(
            self.conn.execute("SELECT kind, count(*) FROM runs GROUP BY kind ORDER BY kind").fetchall()
        )
        return {
            "path": str(self.path),
            "bytes": size,
            "journal_mode": self.journal_mode,
            "schema": applied(self.db),
            "schema_version": len(MIGRATIONS),
            "counts": counts,
            "runs_by_kind": kinds,
        }

    def dump(self, tables: Iterable[str] | None = None) -> dict[str, list[dict]]:
        """Every row of the given tables (default all), JSON columns decoded."""
        chosen = list(tables) if tables else list(TABLES)
        bad = [t for t in chosen if t not in TABLES]
        if bad:
            raise ValueError(f"unknown table(s) {bad}; tables: {', '.join(TABLES)}")
        out = {}
        for t in chosen:
            out[t] = self._rows(t, f"SELECT * FROM {t} ORDER BY rowid")
        return out
