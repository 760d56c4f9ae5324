"""The one read path of every trace: the decoded input becomes checked ``Columns`` chunks.

Line-based formats (``LINE_FORMATS``) are cut into blocks of whole lines (1 MiB), each parsed by the
whole-block fast path when it applies (``fastpath``), else line by line through the format's reader;
whole-document formats (ShareGPT, benchmark outputs) go through their reader in chunks of ``CHUNK``
requests. Either way every request passes the same per-request checks (``checks.request_problem``)
and every chunk the same timestamp-order check (``OrderCheck``, across chunks), in file order, in
this process: worker processes were measured no faster on 2 CPUs (``benchmarks/bench_traces.py``),
so there are none. ``summarize`` feeds the chunks to the summary; ``read_trace`` turns them back into
``Request`` records. CSV blocks after the first get the header line prepended.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from hpc_advise.advisor.traces.checks import (
    BAD_EXAMPLES,
    MAX_TOKENS,
    REORDER_S,
    order_problem,
    request_problem,
)
from hpc_advise.advisor.traces.fastpath import fast_columns, fast_csv_columns
from hpc_advise.advisor.traces.formats import FORMATS, ReadOptions
from hpc_advise.advisor.traces.source import TraceError, TraceSource
from hpc_advise.advisor.traces.summary import Columns, to_columns

BLOCK_BYTES = 1 << 20  # 1 MiB: ~4x less peak memory than 4 MiB blocks, no slower
CHUNK = 1 << 16  # requests per chunk of a whole-document format
# 64 MiB: the longest line one request can need with lengths capped at MAX_TOKENS (10 M) is an
# OpenAI response carrying a 10 M-token completion (~4 bytes a token: ~40 MB) or a 10 M-token prompt's
# 16-token hash blocks (625,000 ids of up to 20 digits: ~13 MB); parsing a line takes about 12x its
# size in memory, so this also bounds one line's parse to under 1 GB.
MAX_LINE_BYTES = 64 << 20
LINE_FORMATS = {"canonical", "mooncake", "bailian", "azure", "burstgpt", "openai"}
CSV_FORMATS = {"azure", "burstgpt"}
USE_FAST_PATH = True  # tests switch it off to compare with the per-line reader


@dataclass
class Parsed:
    """One parsed block: its valid requests, and its bad lines (all counted, the first few kept)."""

    columns: Columns
    n_bad: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)


def parse_block(
    fmt: str,
    options: ReadOptions,
    name: str,
    data: bytes,
    first_line: int,
    header: str | None,
    skip_bad: bool,
) -> Parsed:
    """Parse and check one block of lines: the whole-block fast path when it
    applies (``traces.fastpath``), else line by line. Without ``skip_bad`` it stops at the first bad
    line."""
    text = data.decode("utf-8", errors="replace")
    if first_line == 1:
        text = text.lstrip("\ufeff")
    if header is not None:
        text = header + text
        first_line -= 1
    if USE_FAST_PATH:
        if fmt in CSV_FORMATS:
            cols = fast_csv_columns(fmt, text, first_line)
        else:
            cols = fast_columns(fmt, text, first_line, options.block_size)
        if cols is not None:
            return Parsed(cols)
    source = TraceSource.from_text(text, name, first_line)
    return check_items(FORMATS[fmt].reader(source, options, {}), skip_bad)


def check_items(items: Iterable, skip_bad: bool) -> Parsed:
    """``Parsed`` of a format reader's ``(line, Request | reason)`` items: each request checked with
    ``request_problem``. Without ``skip_bad`` it stops at the first bad line."""
    rows: list = []
    lines: list[int] = []
    bad: list[tuple[int, str]] = []
    n_bad = 0
    limit = MAX_TOKENS
    for line, item in items:
        if type(item) is not str:
            t, n_in, n_out, cached = item[0], item[1], item[2], item[3]
            # Fast path for the usual record; request_problem() words the reason.
            if (
                not (0 <= n_in <= limit and 0 <= n_out <= limit)
                or cached is not None
                or (t is not None and t < 0)
            ):
                problem = request_problem(t, n_in, n_out, cached)
                if problem:
                    item = problem
        if type(item) is str:
            n_bad += 1
            if len(bad) < BAD_EXAMPLES:
                bad.append((line, item))
            if not skip_bad:
                break
            continue
        rows.append(item)
        lines.append(line)
    return Parsed(to_columns(rows, lines), n_bad, bad)


def iter_blocks(source: TraceSource) -> Iterator[tuple[int, bytes]]:
    """``(first_line, bytes)`` blocks of whole lines of the decoded input; a line longer than
    ``MAX_LINE_BYTES`` raises ``TraceError`` naming it.

    Linear in the input: each read is searched for newlines once, and the pieces of a line that
    spans reads are kept in a list and joined once (growing one bytes object read by read, and
    searching all of it again each time, made a 200 MB line take a minute)."""
    read = source.binary.read
    line = 1
    pending: list[bytes] = []  # the start of a line that no read so far has ended
    pending_len = 0
    while True:
        data = read(BLOCK_BYTES)
        if not data:
            if pending_len > MAX_LINE_BYTES:
                raise TraceError(_too_long(), source.name, line)
            if pending:
                yield line, b"".join(pending)
            return
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            pending.append(data)
            pending_len += len(data)
            if pending_len > MAX_LINE_BYTES:
                raise TraceError(_too_long(), source.name, line)
            continue
        if pending:
            if pending_len + data.find(b"\n") > MAX_LINE_BYTES:
                raise TraceError(_too_long(), source.name, line)
            pending.append(data[:cut])
            block = b"".join(pending)
        else:
            block = data[:cut] if cut < len(data) else data
        rest = data[cut:]
        pending = [rest] if rest else []
        pending_len = len(rest)
        yield line, block
        line += block.count(b"\n")


def _too_long() -> str:
    return f"line longer than {MAX_LINE_BYTES} bytes ({MAX_LINE_BYTES >> 20} MiB)"


def parsed_chunks(
    source: TraceSource, fmt: str, options: ReadOptions, skip_bad: bool, meta: dict
) -> Iterator[Parsed]:
    """Parsed chunks of ``source`` in file order: blocks of lines for a line-based format, else
    ``CHUNK`` requests at a time from the format's reader (which may fill ``meta``)."""
    if fmt not in LINE_FORMATS:
        items = FORMATS[fmt].reader(source, options, meta)
        while True:
            part = list(islice(items, CHUNK))
            if not part:
                return
            parsed = check_items(part, skip_bad)
            yield parsed
            if parsed.n_bad and not skip_bad:
                return
    blocks = iter_blocks(source)
    first = next(blocks, None)
    if first is None:
        return
    header = None
    if fmt in CSV_FORMATS:
        header = first[1].split(b"\n", 1)[0].decode("utf-8", errors="replace").lstrip("\ufeff") + "\n"
    args = (fmt, options, source.name)
    yield parse_block(*args, first[1], first[0], None, skip_bad)
    for line, data in blocks:
        yield parse_block(*args, data, line, header, skip_bad)


def checked_columns(
    source: TraceSource,
    fmt: str,
    options: ReadOptions,
    skip_bad: bool,
    meta: dict,
    on_bad: Callable[[int, list[tuple[int, str]]], None],
) -> Iterator[Columns]:
    """The checked requests of ``source``, chunk by chunk. A bad line (malformed, refused by the
    checks, or too far out of time order) raises ``TraceError`` at the first one in file order, or
    with ``skip_bad`` is dropped and reported to ``on_bad(count, first few (line, reason))``."""
    order = OrderCheck()
    for parsed in parsed_chunks(source, fmt, options, skip_bad, meta):
        cols = parsed.columns
        keep, n_late, late = order.apply(cols)
        problems = sorted(parsed.bad + late)
        if problems and not skip_bad:
            line, reason = problems[0]
            raise TraceError(reason, source.name, line)
        if parsed.n_bad or n_late:
            on_bad(parsed.n_bad + n_late, problems)
        yield cols if keep is None else cols.select(keep)


class OrderCheck:
    """Timestamp order across chunks, vectorised: a request more than ``REORDER_S`` before the latest
    one so far is refused (``checks.order_problem`` words it); late ones do not move the latest."""

    def __init__(self) -> None:
        self.max_t = -1.0
        self.max_line = 0

    def apply(self, cols: Columns) -> tuple[np.ndarray | None, int, list[tuple[int, str]]]:
        """``(keep mask, or None when every request passes; number rejected; the first few
        (line, reason))``."""
        t = cols.t
        timed = np.flatnonzero(~np.isnan(t))
        if timed.size == 0:
            return None, 0, []
        tt = t[timed]
        before = np.maximum.accumulate(np.concatenate([[self.max_t], tt]))[:-1]
        late = tt < before - REORDER_S
        keep = None
        examples: list[tuple[int, str]] = []
        n_late = int(late.sum())
        if n_late:
            keep = np.ones(t.size, dtype=bool)
            keep[timed[late]] = False
            for j in np.flatnonzero(late)[:BAD_EXAMPLES]:
                examples.append(
                    (
                        int(cols.lines[timed[j]]),
                        order_problem(
                            float(tt[j]),
                            float(before[j]),
                            self._line_of(before[j], tt[:j], cols.lines[timed[:j]]),
                        ),
                    )
                )
        ok = np.where(late, -np.inf, tt)
        k = int(np.argmax(ok))
        if ok[k] > self.max_t:
            self.max_t = float(tt[k])
            self.max_line = int(cols.lines[timed[k]])
        return keep, n_late, examples

    def _line_of(self, value: float, earlier: np.ndarray, lines: np.ndarray) -> int:
        """Line of the first request with timestamp ``value`` (the running maximum)."""
        hits = np.flatnonzero(earlier == value)
        return int(lines[hits[0]]) if hits.size and value > self.max_t else self.max_line
