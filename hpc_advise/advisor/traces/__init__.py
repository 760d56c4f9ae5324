"""Public API for traffic traces: ``read_trace`` (stream ``Request`` records from any supported
format) and ``summarize`` (a ``TraceSummary`` in constant memory).

Every record is checked (``traces.checks``); a failing record is ``FILE:LINE: reason``: it stops
the read, or is counted in ``n_bad`` and skipped with ``skip_bad=True``.

Formats and detection: ``traces.formats``; files: ``traces.source`` (gzip / zstd / bz2 / xz, ``-`` = stdin).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hpc_advise.advisor.traces.checks import (
    BAD_EXAMPLES,
    MAX_TOKENS,
    REORDER_S,
    order_problem,
    request_problem,
)
from hpc_advise.advisor.traces.columns import LINE_FORMATS, OrderCheck, parsed_blocks
from hpc_advise.advisor.traces.formats import FORMATS, ReadOptions, detect
from hpc_advise.advisor.traces.source import Request, TraceError, TraceSource
from hpc_advise.advisor.traces.summary import Summarizer, TraceSummary

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

    def _bad(self, line: int, reason: str) -> None:
        if not self.skip_bad:
            raise TraceError(reason, self.name, line)
        self.n_bad += 1
        if len(self.bad_examples) < BAD_EXAMPLES:
            self.bad_examples.append(f"{self.name}:{line}: {reason}")

    def __iter__(self) -> TraceReader:
        return self

    def __next__(self) -> Request:
        if self._records is None:
            source, self._source = self._source, None
            if source is None:
                raise TraceError("this trace reader was consumed; call read_trace again", self.name)
            self._records = self._generate(source)
        return next(self._records)

    def close(self) -> None:
        """Close the file (also done when the records run out)."""
        if self._records is not None:
            self._records.close()
        if self._source is not None:
            self._source.close()
            self._source = None

    def _generate(self, source: TraceSource) -> Iterator[Request]:
        max_t = -1.0
        max_line = 0
        bad = self._bad
        limit = MAX_TOKENS
        try:
            for line, item in FORMATS[self.format].reader(source, self.options, self.meta):
                if type(item) is str:
                    bad(line, item)
                    continue
                t, n_in, n_out, cached = item[0], item[1], item[2], item[3]
                # Fast path for the usual record; request_problem() words the reason.
                if (
                    not (0 <= n_in <= limit and 0 <= n_out <= limit)
                    or cached is not None
                    or (t is not None and t < 0)
                ):
                    problem = request_problem(t, n_in, n_out, cached)
                    if problem:
                        bad(line, problem)
                        continue
                if t is not None:
                    if t < max_t - REORDER_S:
                        bad(line, order_problem(t, max_t, max_line))
                        continue
                    if t > max_t:
                        max_t, max_line = t, line
                yield item
        finally:
            source.close()


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


def _consume_blocks(reader: TraceReader, summarizer: Summarizer) -> None:
    """Feed a line-based trace to ``summarizer`` through the block-parallel parser."""
    source, reader._source = reader._source, None
    if source is None:
        raise TraceError("this trace reader was consumed; call read_trace again", reader.name)
    try:
        order = OrderCheck()
        for parsed in parsed_blocks(source, reader.format, reader.options, reader.skip_bad):
            cols = parsed.columns
            keep, n_late, late = order.apply(cols)
            problems = sorted(parsed.bad + late)
            if problems and not reader.skip_bad:
                line, reason = problems[0]
                raise TraceError(reason, reader.name, line)
            reader.n_bad += parsed.n_bad + n_late
            for line, reason in problems[: max(0, BAD_EXAMPLES - len(reader.bad_examples))]:
                reader.bad_examples.append(f"{reader.name}:{line}: {reason}")
            summarizer.add_columns(cols if keep is None else cols.select(keep))
    finally:
        source.close()


def _summarize_once(reader: TraceReader, concurrency, sample, time_range) -> tuple[TraceSummary, Summarizer]:
    summarizer = Summarizer(reorder_s=REORDER_S, sample=sample, time_range=time_range)
    if reader.format in LINE_FORMATS:
        _consume_blocks(reader, summarizer)
    else:
        summarizer.consume(reader)
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
) -> TraceSummary:
    """Summarize a trace (see ``traces.summary`` for every field's definition).

    ``concurrency``: decode batch size for the context-spread figures (default 64).
    ``window_minutes``: summarize only the busiest window of that length (two passes over the file;
    stdin is spooled to a temporary file first). ``sample``: keep each request with this probability
    (chosen by a hash of its position in the file, so the same requests every time).
    """
    if sample is not None and not 0.0 < sample <= 1.0:
        raise TraceError(f"sample must be a fraction in (0, 1], got {sample}")
    if concurrency is not None and concurrency < 1:
        raise TraceError(f"concurrency must be >= 1, got {concurrency}")
    if window_minutes is None:
        reader = read_trace(path, fmt, skip_bad, tokenizer=tokenizer)
        return _summarize_once(reader, concurrency, sample, None)[0]
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
