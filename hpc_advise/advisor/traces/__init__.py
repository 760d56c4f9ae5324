"""Traffic traces: ``read_trace`` (stream ``Request`` records from any supported format) and
``summarize`` (a ``TraceSummary`` in constant memory), both over the one read path of
``traces.columns``.

Every record is checked (``traces.checks``); a failing record is ``FILE:LINE: reason``: it stops
the read, or is counted in ``n_bad`` and skipped with ``skip_bad=True``.

Modules: ``source`` (the ``Request`` record, ``TraceError``, opening files: gzip / zstd / bz2 / xz,
``-`` = stdin), ``formats`` (one reader per format, ``detect``), ``parse`` (field parsing shared by
the readers), ``fastpath`` (whole-block parsing), ``columns`` (the read path), ``checks``, ``stats``
(streaming sketches), ``summary`` (``TraceSummary``), ``tokens`` (text to token counts), ``writers``
and ``cli`` (``hpc-advise trace``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hpc_advise.advisor.traces.checks import BAD_EXAMPLES, MAX_TOKENS, REORDER_S
from hpc_advise.advisor.traces.columns import checked_columns
from hpc_advise.advisor.traces.formats import FORMATS, ReadOptions, detect
from hpc_advise.advisor.traces.source import Request, TraceError, TraceSource
from hpc_advise.advisor.traces.summary import Columns, Summarizer, TraceSummary

__all__ = [
    "FORMATS",
    "MAX_TOKENS",
    "REORDER_S",
    "Request",
    "TraceError",
    "TraceReader",
    "TraceSummary",
    "read_trace",
    "summarize",
]


class TraceReader:
    """Iterator over the ``Request`` records of one trace (once). The format is detected when the reader is
    made (so an unknown format fails at once); ``n_bad`` / ``bad_examples`` fill up while iterating;
    ``meta`` holds run-level facts some formats carry (benchmark duration, observed latencies)."""

    def __init__(
        self,
        path: str | Path,
        fmt: str | None = None,
        skip_bad: bool = False,
        *,
        options: ReadOptions | None = None,
        name: str | None = None,
    ) -> None:
        self.path = str(path)
        self.skip_bad = skip_bad
        self.options = options or ReadOptions()
        self.n_bad = 0
        self.bad_examples: list[str] = []
        self.meta: dict = {}
        self._source: TraceSource | None = TraceSource(self.path, name)
        self._records: Iterator[Request] | None = None
        self.name = self._source.name
        try:
            if fmt is None:
                self.format = detect(self._source)
            elif fmt in FORMATS:
                self.format = fmt
            else:
                raise TraceError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}", self.name)
        except BaseException:
            self._source.close()
            raise

    def _on_bad(self, count: int, problems: list[tuple[int, str]]) -> None:
        self.n_bad += count
        for line, reason in problems[: max(0, BAD_EXAMPLES - len(self.bad_examples))]:
            self.bad_examples.append(f"{self.name}:{line}: {reason}")

    def columns(self) -> Iterator[Columns]:
        """The checked requests as ``Columns`` chunks (once; ``summarize`` reads them this way)."""
        source, self._source = self._source, None
        if source is None:
            raise TraceError("this trace reader was consumed; call read_trace again", self.name)
        try:
            yield from checked_columns(
                source, self.format, self.options, self.skip_bad, self.meta, self._on_bad
            )
        finally:
            source.close()

    def __iter__(self) -> TraceReader:
        return self

    def __next__(self) -> Request:
        if self._records is None:
            self._records = (r for cols in self.columns() for r in cols.requests())
        return next(self._records)

    def close(self) -> None:
        """Close the file (also done when the records run out)."""
        if self._records is not None:
            self._records.close()
        if self._source is not None:
            self._source.close()
            self._source = None


def read_trace(
    path: str | Path,
    fmt: str | None = None,
    skip_bad: bool = False,
    *,
    tokenizer: str | None = None,
    name: str | None = None,
) -> TraceReader:
    """Stream the requests of a trace file (``-`` = stdin). ``fmt`` forces a format (see
    ``FORMATS``); ``tokenizer`` names a tokenizer for text formats (ShareGPT); ``name`` is what
    messages call the file (default: the path)."""
    options = ReadOptions()
    if tokenizer:
        from hpc_advise.advisor.traces.tokens import load_tokenizer

        options.count_tokens = load_tokenizer(tokenizer)
    return TraceReader(path, fmt, skip_bad, options=options, name=name)


def _summarize_once(
    reader: TraceReader, concurrency, sample, time_range, keep=None
) -> tuple[TraceSummary, Summarizer]:
    summarizer = Summarizer(reorder_s=REORDER_S, sample=sample, time_range=time_range)
    for cols in reader.columns():
        summarizer.add_columns(cols)
        if keep is not None:
            keep(cols)
    summary = summarizer.result(
        source=reader.name, fmt=reader.format, n_bad=reader.n_bad, concurrency=concurrency, meta=reader.meta
    )
    if summarizer.n_read == 0:
        detail = f"; {reader.n_bad} bad lines, first: {reader.bad_examples[0]}" if reader.n_bad else ""
        raise TraceError(f"no requests in the trace{detail}", reader.name)
    if reader.bad_examples:
        summary.notes.append("skipped: " + "; ".join(reader.bad_examples))
    if sample is not None:
        summary.selection["sample"] = sample
    return summary, summarizer


def summarize(
    path: str | Path,
    fmt: str | None = None,
    concurrency: int | None = None,
    window_minutes: float | None = None,
    sample: float | None = None,
    skip_bad: bool = False,
    *,
    tokenizer: str | None = None,
    keep=None,
) -> TraceSummary:
    """Summarize a trace (see ``traces.summary`` for every field's definition).

    ``concurrency``: decode batch size for the context-spread figures (default 64).
    ``window_minutes``: summarize only the busiest window of that length (two passes over the file;
    stdin is spooled to a temporary file first). ``sample``: keep each request with this probability
    (chosen by a hash of its position in the file, so the same requests every time). ``keep``: called
    with every checked ``Columns`` chunk as it is read (``recommend`` keeps what it simulates from the
    same pass; not with ``window_minutes``).
    """
    if sample is not None and not 0.0 < sample <= 1.0:
        raise TraceError(f"sample must be a fraction in (0, 1], got {sample}")
    if concurrency is not None and concurrency < 1:
        raise TraceError(f"concurrency must be >= 1, got {concurrency}")
    if window_minutes is None:
        reader = read_trace(path, fmt, skip_bad, tokenizer=tokenizer)
        return _summarize_once(reader, concurrency, sample, None, keep)[0]
    if keep is not None:
        raise TraceError("keep= reads one pass; it does not combine with a window")
    if window_minutes <= 0:
        raise TraceError(f"window must be > 0 minutes, got {window_minutes}")
    spool = None
    try:
        if str(path) == "-":
            fd, spool = tempfile.mkstemp(prefix="hpc-advise-trace-")
            with os.fdopen(fd, "wb") as fh:
                shutil.copyfileobj(sys.stdin.buffer, fh, 1 << 20)
            path = spool
        name = "<stdin>" if spool else None
        reader = read_trace(path, fmt, skip_bad, tokenizer=tokenizer, name=name)
        whole, first_pass = _summarize_once(reader, concurrency, sample, None)
        if first_pass.arrivals.n == 0:
            raise TraceError("--window needs arrival timestamps; this trace has none", reader.name)
        start, end, _ = first_pass.arrivals.busiest(window_minutes * 60.0)
        reader = read_trace(path, fmt, skip_bad, tokenizer=tokenizer, name=name)
        part, _ = _summarize_once(reader, concurrency, sample, (start, end))
        part.selection.update(
            {
                "window_minutes": window_minutes,
                "window_start_s": start,
                "window_end_s": end,
                "whole_trace_requests": whole.n_requests,
                "whole_trace_rate_rps": whole.rate_rps,
            }
        )
        return part
    finally:
        if spool:
            os.unlink(spool)
