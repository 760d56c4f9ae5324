"""Click groups ``kb``, ``notes`` and ``runs`` (mounted lazily by ``hpc_advise.cli``).

Every command that opens the file takes ``--db PATH`` (default ``$HPC_ADVISE_HOME/kb.db``); every
read command takes ``--json``. Errors (unknown id, bad input, foreign or newer schema) print one
clear line and exit 1; imports print every ``FILE:LINE: reason`` and write nothing.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import click
from tabulate import tabulate

from hpc_advise import paths
from hpc_advise.knowledge_base.compare import compare, flatten
from hpc_advise.knowledge_base.store import (
    KnowledgeBase,
    KnowledgeBaseError,
    damaged_message,
    locked_message,
    read_only_message,
)

db_option = click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Knowledge-base file (default: $HPC_ADVISE_HOME/kb.db).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
since_option = click.option(
    "--since", help="Created at or after: YYYY-MM-DD, ISO time, or 7d / 12h / 2w ago."
)
until_option = click.option("--until", help="Created at or before (a date includes that whole day).")
tag_option = click.option(
    "--tag", "tags", multiple=True, help="Only notes with this tag (repeatable: all of them)."
)


@contextlib.contextmanager
def open_kb(db_path: Path | None) -> Iterator[KnowledgeBase]:
    """Open the knowledge base, turning expected failures into one-line click errors."""
    try:
        kb = KnowledgeBase(db_path)
    except KnowledgeBaseError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        yield kb
    except KnowledgeBaseError as exc:
        raise click.ClickException(str(exc)) from None
    except (KeyError, ValueError) as exc:
        raise click.ClickException(str(exc.args[0]) if exc.args else repr(exc)) from None
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise click.ClickException(locked_message(kb.path)) from None
        if "readonly" in str(exc) or "read-only" in str(exc):
            raise click.ClickException(read_only_message(kb.path)) from None
        raise click.ClickException(damaged_message(kb.path, exc)) from None
    except sqlite3.DatabaseError as exc:
        raise click.ClickException(damaged_message(kb.path, exc)) from None
    finally:
        kb.close()


def _existing(db_path: Path | None) -> None:
    """Commands that only read: a --db that does not exist is a typo, not a new knowledge base."""
    if db_path is not None and not db_path.expanduser().exists():
        raise click.ClickException(f"{db_path}: no knowledge base there (check --db)")


def _echo_json(obj: object) -> None:
    click.echo(json.dumps(obj, indent=2, ensure_ascii=False, default=str))


def _fmt(value: object, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _table(rows: list[list], headers: list[str]) -> str:
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def _when(iso: str | None) -> str:
    return (iso or "")[:16].replace("T", " ")


# --------------------------------------------------------------------------------------------- kb
@click.group(help="Knowledge base: where it is, statistics, export.")
def kb() -> None:
    pass


@kb.command("path")
@db_option
@json_option
def kb_path_cmd(db_path: Path | None, as_json: bool) -> None:
    """Print the knowledge-base file location (does not create it)."""
    path = (db_path or paths.kb_path()).expanduser()
    if as_json:
        _echo_json({"path": str(path), "exists": path.exists()})
    else:
        click.echo(str(path))


@kb.command("stats")
@db_option
@json_option
def kb_stats(db_path: Path | None, as_json: bool) -> None:
    """Row counts, file size and schema version."""
    _existing(db_path)
    with open_kb(db_path) as store:
        stats = store.stats()
    if as_json:
        _echo_json(stats)
        return
    click.echo(f"{stats['path']}  ({stats['bytes'] / 1024:.1f} KiB, {stats['journal_mode']}, "
               f"schema {len(stats['schema'])}/{stats['schema_version']})")  # fmt: skip
    click.echo(_table([[t, n] for t, n in stats["counts"].items()], ["table", "rows"]))
    if stats["runs_by_kind"]:
        click.echo()
        click.echo(_table([[k, n] for k, n in stats["runs_by_kind"].items()], ["run kind", "rows"]))


@kb.command("export")
@db_option
@click.option("--format", "fmt", type=click.Choice(["json", "csv"]), default="json", show_default=True)
@click.option("--table", "tables", multiple=True, help="Table(s) to export (CSV: exactly one; default runs).")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here, not stdout."
)
def kb_export(db_path: Path | None, fmt: str, tables: tuple[str, ...], output: Path | None) -> None:
    """Export tables as JSON (default: all) or CSV (one table)."""
    from hpc_advise.knowledge_base import export

    _existing(db_path)
    with open_kb(db_path) as store:
        if fmt == "json":
            text = export.to_json(store, tables or None)
        else:
            if len(tables) > 1:
                raise click.UsageError("CSV export takes one --table")
            table = tables[0] if tables else "runs"
            store.dump([table])  # validates the name
            text = export.to_csv(store, table)
    if output:
        output.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=not text.endswith("\n"))


# ------------------------------------------------------------------------------------------ notes
@click.group(help="Notes: add, full-text search, list, show, remove.")
def notes() -> None:
    pass


def _file_option(help_text: str):
    """The notes commands' ``--file PATH`` option ('-' reads stdin)."""
    return click.option("--file", "file", type=click.Path(dir_okay=False, allow_dash=True), help=help_text)


def _body(text: str | None, file: str | None) -> str | None:
    if text is not None and file is not None:
        raise click.UsageError("give the note as TEXT or --file, not both")
    if file is not None:
        return sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    if text == "-":
        return sys.stdin.read()
    return text


@notes.command("add")
@click.argument("text", required=False)
@click.option("--title", help="Short title (searched, and weighted above the body).")
@click.option("--tag", "tags", multiple=True, help="Tag the note (repeatable).")
@click.option(
    "--run", "run_ids", type=click.IntRange(min=1), multiple=True, help="Link to a run id (repeatable)."
)
@_file_option("Read the body from a file ('-': stdin).")
@db_option
def notes_add(text, title, tags, run_ids, file, db_path) -> None:
    """Add a note. TEXT '-' reads the body from stdin."""
    body = _body(text, file)
    if body is None:
        raise click.UsageError("give the note as TEXT, '-' (stdin) or --file PATH")
    with open_kb(db_path) as store:
        note_id = store.add_note(body, title=title, tags=tags, run_ids=run_ids)
    click.echo(f"added note {note_id}")


@notes.command("edit")
@click.argument("note_id", type=int)
@click.argument("text", required=False)
@click.option("--title", help="New title.")
@click.option("--tag", "tags", multiple=True, help="Replace the tags with these (repeatable).")
@click.option(
    "--run", "run_ids", type=click.IntRange(min=1), multiple=True, help="Link one more run id (repeatable)."
)
@_file_option("New body from a file ('-': stdin).")
@db_option
def notes_edit(note_id, text, title, tags, run_ids, file, db_path) -> None:
    """Change a note's body, title or tags; link more runs."""
    body = _body(text, file)
    with open_kb(db_path) as store:
        store.update_note(note_id, body=body, title=title, tags=tags or None, run_ids=run_ids)
    click.echo(f"updated note {note_id}")


@notes.command("search")
@click.argument("query")
@tag_option
@since_option
@until_option
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=20, show_default=True)
@db_option
@json_option
def notes_search(query, tags, since, until, limit, db_path, as_json) -> None:
    """Full-text search, best match first (words ANDed, "phrases", OR, NOT, prefix*)."""
    tty = sys.stdout.isatty() and not as_json
    marks = ("\x1b[1m", "\x1b[0m") if tty else ("**", "**")
    with open_kb(db_path) as store:
        hits = store.search_notes(query, tags=tags, since=since, until=until, limit=limit, highlight=marks)
    if as_json:
        _echo_json(hits)
        return
    if not hits:
        click.echo("no matching notes", err=True)
        return
    for hit in hits:
        tags_txt = f"  [{', '.join(hit['tags'])}]" if hit["tags"] else ""
        click.echo(f"#{hit['id']}  {hit['title'] or '(untitled)'}{tags_txt}  {_when(hit['created_at'])}")
        click.echo("    " + " ".join(hit["snippet"].split()))


@notes.command("list")
@tag_option
@since_option
@until_option
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=50, show_default=True)
@db_option
@json_option
def notes_list(tags, since, until, limit, db_path, as_json) -> None:
    """Notes, newest first."""
    with open_kb(db_path) as store:
        items = store.notes(tags=tags, since=since, until=until, limit=limit)
    if as_json:
        _echo_json(items)
        return
    rows = []
    for n in items:
        first = " ".join(n["body"].split())
        rows.append([n["id"], _when(n["created_at"]), n["title"] or "", ", ".join(n["tags"]),
                     first[:60] + ("…" if len(first) > 60 else "")])  # fmt: skip
    click.echo(_table(rows, ["id", "created", "title", "tags", "body"]) if rows else "no notes")


@notes.command("show")
@click.argument("note_id", type=int)
@db_option
@json_option
def notes_show(note_id, db_path, as_json) -> None:
    """One note in full."""
    with open_kb(db_path) as store:
        note = store.note(note_id)
    if as_json:
        _echo_json(note)
        return
    click.echo(f"#{note['id']}  {note['title'] or '(untitled)'}")
    click.echo(f"created {_when(note['created_at'])}, updated {_when(note['updated_at'])}")
    if note["tags"]:
        click.echo("tags: " + ", ".join(note["tags"]))
    if note["run_ids"]:
        click.echo("runs: " + ", ".join(str(r) for r in note["run_ids"]))
    click.echo()
    click.echo(note["body"].rstrip("\n"))


@notes.command("rm")
@click.argument("note_ids", type=int, nargs=-1, required=True)
@db_option
def notes_rm(note_ids, db_path) -> None:
    """Delete notes (all or none)."""
    with open_kb(db_path) as store:
        store.delete_notes(note_ids)
    click.echo(f"deleted {len(note_ids)} note(s)")


# ------------------------------------------------------------------------------------------- runs
@click.group(help="Benchmark runs: list, show, compare, import SGLang/vLLM results.")
def runs() -> None:
    pass


def _summary(config: dict, width: int = 48) -> str:
    """A short 'key=value' digest of a run's config for one table cell (workload keys first)."""
    short = {"model": "model", "isl": "isl", "random_input_len": "isl", "osl": "osl",
             "random_output_len": "osl", "max_concurrency": "conc", "request_rate": "rate"}  # fmt: skip
    skip = {"tool", "backend", "label", "dataset_name", "random_range_ratio"}
    keys = [k for k in short if k in config] + [k for k in config if k not in short and k not in skip]
    parts: dict[str, str] = {}
    for key in keys:
        value = config[key]
        label = short.get(key, key)
        if isinstance(value, (dict, list)) or value is None or label in parts:
            continue
        if key == "model":
            value = str(value).rsplit("/", 1)[-1]
        parts[label] = f"{label}={_fmt(value)}"
    text = " ".join(parts.values())
    return text if len(text) <= width else text[: width - 1] + "…"


@runs.command("list")
@click.option("--kind", help="kernel, microbench, serving, comm, …")
@click.option("--subject", help="Kernel name or serving engine.")
@click.option("--provider", help="Implementation, or the serving run's tag/label.")
@click.option("--gpu", help="GPU name substring, case-insensitive (h200).")
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=100, show_default=True, help="Newest N.")
@db_option
@json_option
def runs_list(kind, subject, provider, gpu, limit, db_path, as_json) -> None:
    """Stored measurements, oldest first."""
    with open_kb(db_path) as store:
        items = store.runs(kind=kind, subject=subject, provider=provider, gpu=gpu, limit=limit)
    if as_json:
        _echo_json(items)
        return
    rows = [[r["id"], r["kind"], r["subject"], r["provider"], r["metric"], _fmt(r["p50"]), r["unit"],
             r["gpu"] or "", _when(r["created_at"]), _summary(r["config"])] for r in items]  # fmt: skip
    headers = ["id", "kind", "subject", "provider", "metric", "p50", "unit", "gpu", "created", "config"]
    click.echo(_table(rows, headers) if rows else "no runs")


@runs.command("show")
@click.argument("run_id", type=int)
@db_option
@json_option
def runs_show(run_id, db_path, as_json) -> None:
    """One run: fields, config, metrics, versions, command."""
    with open_kb(db_path) as store:
        run = store.run(run_id)
    if as_json:
        _echo_json(run)
        return
    fields = ["id", "kind", "subject", "provider", "metric", "unit", "p20", "p50", "p80", "gpu",
              "created_at", "git_sha", "source"]  # fmt: skip
    click.echo(
        _table([[f, _fmt(run.get(f), 6)] for f in fields if run.get(f) is not None], ["field", "value"])
    )
    for title, data in (
        ("config", run["config"]),
        ("metrics", run.get("metrics")),
        ("versions", run.get("versions")),
    ):
        if data:
            click.echo()
            click.echo(_table([[k, _fmt(v, 6)] for k, v in flatten(data).items()], [title, "value"]))
    if run.get("command"):
        click.echo()
        click.echo("command: " + run["command"])


@runs.command("compare")
@click.argument("run_ids", type=int, nargs=-1, required=True)
@db_option
@json_option
def runs_compare(run_ids, db_path, as_json) -> None:
    """Runs side by side; ratios are each run over the first."""
    if len(run_ids) < 2:
        raise click.UsageError("compare needs at least two run ids")
    with open_kb(db_path) as store:
        result = compare([store.run(i) for i in run_ids])
    if as_json:
        _echo_json(result.to_dict())
        return
    base = run_ids[0]
    headers = [""] + [f"#{base}"]
    for rid in run_ids[1:]:
        headers += [f"#{rid}", f"÷#{base}"]
    rows = []
    for row in result.rows:
        cells = [row["name"], _fmt(row["values"][0])]
        for i, value in enumerate(row["values"][1:]):
            ratio = row["ratios"][i] if row["ratios"] else None
            cells += [_fmt(value), f"{ratio:.3f}" if ratio is not None else ""]
        rows.append(cells)
    click.echo(_table(rows, headers))
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)


@runs.command("import")
@click.argument(
    "files", type=click.Path(exists=True, dir_okay=False, path_type=Path), nargs=-1, required=True
)
@click.option("--gpu", help="GPU the benchmark ran on (the result files do not say), e.g. 'NVIDIA H200'.")
@click.option("--subject", help="Engine name to store (default: from the file: sglang, vllm, …).")
@click.option(
    "--provider", help="Configuration label to store (default: the run's tag/label, else its backend)."
)
@click.option(
    "--model",
    "model",
    help="Model the runs served, stored for records that do not name one (no server_info / model_id).",
)
@db_option
@click.option("--json", "as_json", is_flag=True, help='Print {"ids": [...], "new": N} instead of a sentence.')
def runs_import(files, gpu, subject, provider, model, db_path, as_json) -> None:
    """Import SGLang bench_serving JSONL / vLLM bench serve JSON (all files or nothing)."""
    from hpc_advise.clitypes import Timer
    from hpc_advise.knowledge_base.importers import ImportFailed, parse_files

    size = sum(f.stat().st_size for f in files)
    try:
        with Timer(f"reading {len(files)} file(s), {size / 2**20:.1f} MiB"):
            rows = parse_files(files, gpu=gpu, subject=subject, provider=provider)
    except ImportFailed as exc:
        for line in exc.errors:
            click.echo(line, err=True)
        raise click.ClickException(
            f"{len(exc.errors)} bad record(s); nothing imported from {len(files)} file(s)"
        ) from None
    if model is not None and not model.strip():
        raise click.ClickException("--model must not be empty")
    named = 0
    for row in rows if model else ():
        if not row["config"].get("model"):  # a model the record names wins over --model
            row["config"]["model"] = model.strip()
            named += 1
    with open_kb(db_path) as store, Timer(f"storing {len(rows)} run(s)"):
        ids, new = store.import_runs(rows)
    if as_json:
        _echo_json({"ids": ids, "new": new})
        return
    dup = len(ids) - new
    click.echo(f"imported {new} run(s) from {len(files)} file(s)" + (f", {dup} already present" if dup else "")
               + (f": {_id_list(ids)}" if ids else ""))  # fmt: skip
    if model:
        click.echo(f"model {model.strip()} stored for {named} record(s) that name none")


def _id_list(ids: list[int], show: int = 10) -> str:
    """``ids 3, 4, 9`` for a few ids; ``ids 1-20000 (20000 rows)`` or the first ones and a count for many."""
    if len(ids) <= show:
        return "ids " + ", ".join(str(i) for i in ids)
    ordered = sorted(set(ids))
    if ordered[-1] - ordered[0] + 1 == len(ordered):
        return f"ids {ordered[0]}-{ordered[-1]} ({len(ordered)} rows)"
    return (
        "ids " + ", ".join(str(i) for i in ordered[:show]) + f", … ({len(ordered)} rows; --json lists them)"
    )
