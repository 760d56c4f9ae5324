"""Public API for traffic traces: ``read_trace`` (stream ``Request`` records from any supported
format) and ``summarize`` (a ``TraceSummary`` in constant memory).

Checks applied to every record, whatever the format (a failing record is ``FILE:LINE: reason``: it
stops the read, or is counted in ``n_bad`` and skipped with ``skip_bad=True``):

- lengths are whole numbers in ``[0, MAX_TOKENS]`` (10 M tokens: anything longer is a unit or
  parsing mistake, not a request); ``cached`` in ``[0, input_len]``;
- timestamps are finite and not negative;
- timestamps may be out of order by at most ``REORDER_S`` (10 s) -- logs written by several workers
  interleave a little, and those requests are re-sorted in a bounded buffer; a request more than 10 s
  earlier than one already read is an error (sort the file first, e.g. ``sort -n`` on the time field).

Formats and detection: ``trace_formats``; files: ``trace_io`` (gzip / zstd / bz2 / xz, ``-`` = stdin).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hpc_advise.advisor.trace_formats import FORMATS, ReadOptions, detect
from hpc_advise.advisor.trace_io import Request, TraceError, TraceSource
from hpc_advise.advisor.trace_summary import Summarizer, TraceSummary

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

MAX_TOKENS = 10_000_000
REORDER_S = 10.0
BAD_EXAMPLES = 5


class TraceReader:
    """Iterable of the ``Request`` records of one trace. The format is detected when the reader is
    made (so an unknown format fails at once); ``n_bad`` / ``bad_examples`` fill up while iterating;
    ``meta`` holds run-level facts some formats carry (benchmark duration, observed latencies)."""

    def __init__(
        self,
        path: str | Path,
        fmt: str | None = None,
        skip_bad: bool = False,
        *,
        options: ReadOptions | None = None,
    ) -> None:
        self.path = str(path)
        self.skip_bad = skip_bad
        self.options = options or ReadOptions()
        self.n_bad = 0
        self.bad_examples: list[str] = []
        self.meta: dict = {}
        self._source: TraceSource | None = TraceSource(self.path)
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

    def __iter__(self) -> Iterator[Request]:
        source, self._source = self._source, None
        if source is None:
            raise TraceError("a trace reader can be iterated only once; call read_trace again", self.name)
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
                if n_in < 0 or n_out < 0:
                    bad(line, f"negative length (input {n_in}, output {n_out})")
                    continue
                if n_in > limit or n_out > limit:
                    bad(line, f"absurd length (input {n_in}, output {n_out}; limit {limit:,} tokens)")
                    continue
                if cached is not None and not 0 <= cached <= n_in:
                    bad(line, f"cached tokens {cached} outside [0, input {n_in}]")
                    continue
                if t is not None:
                    if t < 0:
                        bad(line, f"negative timestamp {t}")
                        continue
                    if t < max_t - REORDER_S:
                        bad(
                            line,
                            f"timestamp {t:.3f} s is {max_t - t:.3f} s before the one on line {max_line} "
                            f"(requests may be out of order by at most {REORDER_S:g} s; sort the trace first)",
                        )
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
) -> TraceReader:
    """Stream the requests of a trace file (``-`` = stdin). ``fmt`` forces a format (see
    ``FORMATS``); ``tokenizer`` names a tokenizer for text formats (ShareGPT)."""
    options = ReadOptions()
    if tokenizer:
        from hpc_advise.advisor.trace_tokens import load_tokenizer

        options.count_tokens = load_tokenizer(tokenizer)
    return TraceReader(path, fmt, skip_bad, options=options)


def _summarize_once(reader: TraceReader, concurrency, sample, time_range) -> tuple[TraceSummary, Summarizer]:
    summarizer = Summarizer(reorder_s=REORDER_S, sample=sample, time_range=time_range)
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
    """Summarize a trace (see ``trace_summary`` for every field's definition).

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
        reader = read_trace(path, fmt, skip_bad, tokenizer=tokenizer)
        whole, first_pass = _summarize_once(reader, concurrency, sample, None)
        if first_pass.arrivals.n == 0:
            raise TraceError("--window needs arrival timestamps; this trace has none", reader.name)
        start, end, _ = first_pass.arrivals.busiest(window_minutes * 60.0)
        reader = read_trace(path, fmt, skip_bad, tokenizer=tokenizer)
        part, _ = _summarize_once(reader, concurrency, sample, (start, end))
        part.source = whole.source if spool is None else "<stdin>"
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
