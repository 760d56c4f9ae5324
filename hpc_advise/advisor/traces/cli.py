"""``hpc-advise trace``: ``summarize`` a traffic trace (table or JSON, stored in the knowledge base),
``convert`` it to canonical JSONL (or another writable format), list the ``formats``."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click

from hpc_advise.advisor.traces.formats import FORMATS
from hpc_advise.advisor.traces.source import TraceError
from hpc_advise.advisor.traces.writers import DROPS_FAILED, WRITERS
from hpc_advise.clitypes import Aliased, FiniteFloat, positive_float

_BAR = "█▏▎▍▌▋▊▉"
# the context-spread simulation draws SPREAD_BATCHES x this many requests: a cap on its memory
MAX_DECODE_BATCH = 4096


def _fmt(x: float | int | None, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, int) or abs(x) >= 100:
        return f"{round(x):,}"
    return f"{x:.{digits}g}"


def _tokens(n: int) -> str:
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def _bar(fraction: float, width: int = 30) -> str:
    eighths = int(round(fraction * width * 8))
    full, rest = divmod(eighths, 8)
    return "█" * full + (_BAR[rest] if rest else "")


def histogram_lines(title: str, bins: list[list[int]], width: int = 30) -> list[str]:
    """A compact power-of-two histogram: one line per non-empty range."""
    if not bins:
        return [f"{title}: (none)"]
    total = sum(c for _, _, c in bins)
    peak = max(c for _, _, c in bins)
    lines = [title]
    for lo, hi, count in bins:
        label = f"{_tokens(lo):>5}–{_tokens(hi):<5}"
        lines.append(
            f"  {label} {_bar(count / peak, width):<{width}} {count:>9,} {100 * count / total:5.1f}%"
        )
    return lines


def summary_table(summary, latency: float | None = None) -> str:
    from tabulate import tabulate

    s = summary
    rows: list[tuple[str, str]] = [
        ("source", f"{s.source} ({s.format})"),
        ("requests", f"{s.n_requests:,} ({s.n_failed:,} failed, {s.n_bad:,} bad lines skipped)"),
        ("duration", "–" if s.duration_s is None else f"{s.duration_s:,.1f} s"),
        ("arrival rate", "–" if s.rate_rps is None else f"{s.rate_rps:.3g} req/s"),
        ("peak rate (60 s)", "–" if s.peak_rps_1min is None else f"{s.peak_rps_1min:.3g} req/s"),
        ("burstiness (CV of gaps)", _fmt(s.burstiness_cv)),
    ]
    for name, d in (("input tokens", s.isl), ("output tokens", s.osl)):
        rows.append(
            (
                name,
                f"p50 {_fmt(d['p50'])}  p90 {_fmt(d['p90'])}  p99 {_fmt(d['p99'])}  "
                f"max {_fmt(d['max'])}  mean {_fmt(d['mean'], 4)}",
            )
        )
    rows.append(
        (
            f"decode-batch context spread @{s.ctx_concurrency}",
            f"CV {_fmt(s.ctx_cv)}  max/median {_fmt(s.ctx_max_over_median)}",
        )
    )
    if s.prefix_reuse is not None:
        rows.append(
            (
                "prefix reuse",
                f"{100 * s.prefix_reuse:.1f}% of {s.prefix_blocks:,} blocks of {s.prefix_block_size} tokens",
            )
        )
    if s.cached_fraction is not None:
        rows.append(("cached prompt tokens", f"{100 * s.cached_fraction:.1f}%"))
    if s.rate_rps is not None:
        if latency is not None:
            rows.append(
                (
                    f"concurrency at {latency:g} s latency",
                    f"{s.implied_concurrency(latency):.3g} (Little's law)",
                )
            )
        else:
            rows.append(("concurrency (Little's law)", f"{s.rate_rps:.3g} × latency in s (give --latency)"))
    if s.observed:
        for key, label in (("ttft_ms", "observed TTFT"), ("tpot_ms", "observed TPOT")):
            d = s.observed.get(key)
            if d:
                rows.append((label, f"p50 {d['p50']:.4g} ms  p90 {d['p90']:.4g} ms  p99 {d['p99']:.4g} ms"))
    sel = s.selection
    if "window_minutes" in sel:
        rows.append(
            (
                "window",
                f"busiest {sel['window_minutes']:g} min: t = {sel['window_start_s']:.1f}–{sel['window_end_s']:.1f} s "
                f"(whole trace: {sel['whole_trace_requests']:,} requests)",
            )
        )
    if "sample" in sel:
        rows.append(("sample", f"{sel['sample']:g} of {sel['n_read']:,} requests read"))
    for note in s.notes:
        rows.append(("note", note))
    return tabulate(rows, tablefmt="plain")


@click.group("trace")
def trace() -> None:
    """Read traffic traces: summarize the workload, convert formats."""


_format_option = click.option(
    "--trace-format",
    "--format",
    "fmt",
    cls=Aliased,
    aliases=("--format",),
    type=click.Choice(sorted(FORMATS)),
    default=None,
    help="Force a format (default: detect).",
)
_skip_option = click.option(
    "--skip-bad", is_flag=True, help="Skip malformed lines and count them (default: stop)."
)
_tokenizer_option = click.option(
    "--tokenizer", default=None, help="Tokenizer for text formats (ShareGPT); default: utf-8 bytes / 4."
)


def _store(summary, source: str, db: str | None) -> None:
    from hpc_advise.knowledge_base.store import KnowledgeBase

    try:
        kb = KnowledgeBase(db)
        trace_id = kb.add_trace(summary.to_dict(), source)
    except Exception as exc:  # the summary is printed already; say why it was not kept
        raise click.ClickException(
            f"summary not stored in the knowledge base: {exc} (--no-store skips it)"
        ) from None
    where = getattr(kb, "path", db)
    click.echo(f"stored as trace #{trace_id} in {where}", err=True)


@trace.command("summarize")
@click.argument("path")
@_format_option
@click.option(
    "--decode-batch",
    "--concurrency",
    "concurrency",
    cls=Aliased,
    aliases=("--concurrency",),
    type=click.IntRange(1, MAX_DECODE_BATCH),
    default=None,
    help=f"Requests in one decode batch for the context spread (default 64, at most {MAX_DECODE_BATCH}; "
    "not recommend's --concurrency).",
)
@click.option(
    "--latency",
    type=positive_float(86_400.0),
    default=None,
    help="Per-request latency in s for Little's law (at most a day).",
)
@click.option(
    "--window",
    type=positive_float(525_600.0),
    default=None,
    help="Summarize the busiest N minutes only (at most a year).",
)
@click.option(
    "--sample",
    type=FiniteFloat(0.0, 1.0, min_open=True),
    default=None,
    help="Keep this fraction of requests.",
)
@_skip_option
@_tokenizer_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--db", type=click.Path(dir_okay=False), default=None, help="Knowledge-base file (default: the user's)."
)
@click.option("--no-store", is_flag=True, help="Do not store the summary in the knowledge base.")
def summarize_cmd(
    path, fmt, concurrency, latency, window, sample, skip_bad, tokenizer, as_json, db, no_store
) -> None:
    """Summarize the trace PATH (any supported format, gzip/zstd ok, '-' = stdin)."""
    from hpc_advise.advisor.traces import summarize

    try:
        summary = summarize(
            path,
            fmt=fmt,
            concurrency=concurrency,
            window_minutes=window,
            sample=sample,
            skip_bad=skip_bad,
            tokenizer=tokenizer,
        )
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        data = summary.to_dict()
        if latency is not None:
            data["implied_concurrency"] = {
                "latency_s": latency,
                "concurrency": summary.implied_concurrency(latency),
            }
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(summary_table(summary, latency))
        click.echo("")
        click.echo("\n".join(histogram_lines("input tokens (completed requests)", summary.histograms["isl"])))
        click.echo(
            "\n".join(histogram_lines("output tokens (completed requests)", summary.histograms["osl"]))
        )
    if not no_store:
        source = "<stdin>" if path == "-" else str(Path(path).resolve())
        _store(summary, source, db)


def _open_output(path: str):
    """A text file for ``path`` written atomically (temp file + rename); gzip/zstd by extension."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=str(target.parent or "."))
    raw = os.fdopen(fd, "wb")
    if target.suffix == ".gz":
        import gzip

        stream = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0)
    elif target.suffix in (".zst", ".zstd"):
        import zstandard

        stream = zstandard.ZstdCompressor().stream_writer(raw, closefd=False)
    else:
        stream = None
    return raw, stream, tmp


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.abspath(a) == os.path.abspath(b)


@trace.command("convert")
@click.argument("path")
@click.option("-o", "--output", default="-", help="Output file ('-' = stdout; .gz/.zst compress).")
@click.option(
    "--to", "to_fmt", type=click.Choice(sorted(WRITERS)), default="canonical", help="Output format."
)
@_format_option
@_skip_option
@_tokenizer_option
def convert_cmd(path, output, to_fmt, fmt, skip_bad, tokenizer) -> None:
    """Convert the trace PATH to canonical JSONL (or --to another format)."""
    from hpc_advise.advisor.traces import read_trace

    if output != "-" and path != "-" and _same_file(path, output):
        raise click.BadParameter(
            f"{output!r} is the input trace; write to another file", param_hint="-o/--output"
        )
    written = 0
    failed = 0

    def counted(reader):
        nonlocal written, failed
        for r in reader:
            written += 1
            failed += r.failed
            yield r

    try:
        reader = read_trace(path, fmt, skip_bad, tokenizer=tokenizer)

        def lines():
            yield from WRITERS[to_fmt](counted(reader))
            if written == 0:
                raise TraceError("no requests in the trace", reader.name)

        if output == "-":
            out = sys.stdout
            for line in lines():
                out.write(line)
            out.flush()
        else:
            raw, stream, tmp = _open_output(output)
            try:
                sink = stream or raw
                for line in lines():
                    sink.write(line.encode("utf-8"))
                if stream is not None:
                    stream.close()
                raw.close()
                os.replace(tmp, output)
            except BaseException:
                raw.close()
                os.unlink(tmp)
                raise
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    bad = f", {reader.n_bad} bad lines skipped" if reader.n_bad else ""
    if failed and to_fmt in DROPS_FAILED:
        bad += f", {failed} failed requests left out ({to_fmt} cannot mark failures)"
    click.echo(
        f"{written:,} requests from {reader.name} ({reader.format}) -> {output} ({to_fmt}){bad}", err=True
    )


@trace.command("formats")
def formats_cmd() -> None:
    """List the trace formats that are read (and which can be written)."""
    from tabulate import tabulate

    rows = [(f.name, f.description, "yes" if f.name in WRITERS else "") for f in FORMATS.values()]
    click.echo(tabulate(rows, headers=["format", "fields", "convert --to"], tablefmt="plain"))
