"""Block-parallel parsing of line-based traces for ``summarize``.

The decoded input is cut into blocks of whole lines (1 MiB); each block is parsed and checked into
numpy ``Columns`` -- the first few in this process, the rest in worker processes when the input is
large (JSON parsing is what costs; the statistics are vectorised and stay in the parent) -- and
handed back in file order, at most ``2 x workers`` blocks in flight, so memory stays bounded. The parent applies the checks that
need the whole history (timestamp order) and reports the first bad line in file order, exactly as
the sequential reader does. CSV blocks after the first get the header line prepended.

Workers: ``HPC_ADVISE_TRACE_WORKERS=N`` (default 0 = parse in this process; see
``default_workers``); worker processes are started with ``spawn``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

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
START_POOL_AT = 12  # blocks: inputs up to 12 MiB never start worker processes
INPROCESS_BLOCKS = 24
MAX_LINE_BYTES = 256 << 20
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
    """Parse and check one block (runs in a worker process): the whole-block fast path when it
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
    rows: list = []
    lines: list[int] = []
    bad: list[tuple[int, str]] = []
    n_bad = 0
    limit = MAX_TOKENS
    for line, item in FORMATS[fmt].reader(source, options, {}):
        if type(item) is not str:
            t, n_in, n_out, cached = item[0], item[1], item[2], item[3]
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
    """``(first_line, bytes)`` blocks of whole lines of the decoded input."""
    binary = source.binary
    line = 1
    rest = b""
    while True:
        data = binary.read(BLOCK_BYTES)
        if not data:
            if rest:
                yield line, rest
            return
        data = rest + data if rest else data
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) > MAX_LINE_BYTES:
                raise TraceError(f"a line longer than {MAX_LINE_BYTES >> 20} MiB", source.name, line)
            rest = data
            continue
        block, rest = data[:cut], data[cut:]
        yield line, block
        line += block.count(b"\n")


def default_workers() -> int:
    """``HPC_ADVISE_TRACE_WORKERS`` if set, else 0 (one process): on the 2-CPU machine where
    ``benchmarks/bench_traces.py`` ran, worker processes made 1 M-request summaries no faster."""
    env = os.environ.get("HPC_ADVISE_TRACE_WORKERS")
    if env is None:
        return 0
    try:
        return max(0, int(env))
    except ValueError:
        raise TraceError(f"HPC_ADVISE_TRACE_WORKERS must be an integer, got {env!r}") from None


def _context():
    # spawn: safe whatever threads the caller runs, and the workers are our direct children (their
    # CPU time and memory show in RUSAGE_CHILDREN).
    return multiprocessing.get_context("spawn")


def parsed_blocks(
    source: TraceSource, fmt: str, options: ReadOptions, skip_bad: bool, workers: int | None = None
) -> Iterator[Parsed]:
    """Parsed blocks of ``source`` in file order.

    The first ``INPROCESS_BLOCKS`` blocks are parsed here; when the input has more than
    ``START_POOL_AT`` blocks, worker processes are started at that point (they boot while this
    process parses the rest of the first blocks) and parse everything after them.
    """
    workers = default_workers() if workers is None else workers
    blocks = iter_blocks(source)
    first = next(blocks, None)
    if first is None:
        return
    header = None
    if fmt in CSV_FORMATS:
        header = first[1].split(b"\n", 1)[0].decode("utf-8", errors="replace").lstrip("\ufeff") + "\n"
    args = (fmt, options, source.name)
    yield parse_block(*args, first[1], first[0], None, skip_bad)
    pool = None
    try:
        for index, (line, data) in enumerate(blocks, start=1):
            if pool is None and workers > 1 and index == START_POOL_AT:
                pool = ProcessPoolExecutor(max_workers=workers, mp_context=_context())
                for _ in range(workers):
                    pool.submit(os.getpid)  # start the workers now
            yield parse_block(*args, data, line, header, skip_bad)
            if pool is not None and index + 1 >= INPROCESS_BLOCKS:
                break
        if pool is None:
            return
        pending: deque = deque()
        for line, data in blocks:
            pending.append(pool.submit(parse_block, *args, data, line, header, skip_bad))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
        pool.shutdown(wait=True)
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class OrderCheck:
    """Cross-block timestamp order check, vectorised (same rule and message as ``TraceReader``)."""

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
