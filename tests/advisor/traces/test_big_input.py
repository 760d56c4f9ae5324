"""Big and binary inputs (issue 30): a long line costs time linear in its length, a line over
``columns.MAX_LINE_BYTES`` is one ``FILE:LINE:`` error, and binary or all-zero data is refused after
its first block.

Work is counted, not timed: reads return a ``bytes`` subclass that adds up the bytes every
concatenation copies and every search scans, and the JSON decoder adds up the text each attempt
starts on. Sizes stay at a few MB with the block sizes and the limit patched down to match.
"""

from __future__ import annotations

import builtins
import gzip
import json

import pytest
from click.testing import CliRunner

from hpc_advise.advisor.traces import TraceError, read_trace, summarize
from hpc_advise.advisor.traces import columns as trace_columns
from hpc_advise.advisor.traces import parse as trace_parse
from hpc_advise.advisor.traces import source as trace_source
from hpc_advise.advisor.traces.source import TraceSource
from hpc_advise.cli import main

BLOCK = 64 << 10
LIMIT = 1 << 20


class Work:
    bytes = 0


class Counted(bytes):
    """Bytes whose concatenations and searches add to ``Work.bytes`` (results stay ``Counted``)."""

    def __add__(self, other):
        out = Counted(bytes.__add__(self, other))
        Work.bytes += len(out)
        return out

    def __radd__(self, other):
        out = Counted(bytes(other) + bytes(self))
        Work.bytes += len(out)
        return out

    def _scan(self, name, *args):
        Work.bytes += len(self)
        return getattr(bytes, name)(self, *args)

    def find(self, *args):
        return self._scan("find", *args)

    def rfind(self, *args):
        return self._scan("rfind", *args)

    def count(self, *args):
        return self._scan("count", *args)


class CountingReader:
    """Wraps ``TraceSource.binary``: counts bytes read, returns ``Counted``."""

    def __init__(self, binary):
        self._binary = binary
        self.read_bytes = 0

    def read(self, n=-1):
        data = self._binary.read(n)
        self.read_bytes += len(data)
        return Counted(data)


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(trace_columns, "BLOCK_BYTES", BLOCK)
    monkeypatch.setattr(trace_columns, "MAX_LINE_BYTES", LIMIT)
    Work.bytes = 0


def _blocks(path):
    with TraceSource(path) as src:
        reader = CountingReader(src.binary)
        src.binary = reader
        blocks = list(trace_columns.iter_blocks(src))
    return blocks, reader


def _long_line(n_ids: int) -> bytes:
    ids = ",".join(["12345678"] * n_ids)
    return (
        b'{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [' + ids.encode() + b"]}\n"
    )


def test_a_long_line_costs_linear_work(tmp_path, monkeypatch, small):
    monkeypatch.setattr(trace_columns, "MAX_LINE_BYTES", 64 << 20)
    path = tmp_path / "long.jsonl"
    data = _long_line(450_000)  # ~4 MB, 63 reads of one block
    path.write_bytes(data + b'{"timestamp": 5, "input_length": 1, "output_length": 1}\n')
    blocks, reader = _blocks(path)
    assert b"".join(b for _, b in blocks) == path.read_bytes()
    assert [line for line, _ in blocks] == [1, 2][: len(blocks)]
    # Each byte searched about once; copying the line so far on every read (the old code) was
    # ~60x its length here, and that grows with the line.
    assert Work.bytes <= 3 * len(data), Work.bytes
    summary = summarize(path, fmt="mooncake")
    assert summary.n_requests == 2


def test_a_line_at_the_limit_is_read_and_one_over_it_is_refused(tmp_path, small):
    ok = tmp_path / "ok.jsonl"
    ok.write_bytes(b"x" * LIMIT + b"\nshort\n")
    blocks, _ = _blocks(ok)
    assert b"".join(b for _, b in blocks) == ok.read_bytes()

    # Line 2 ends half a block after the limit, inside a read: refused at its end.
    over = tmp_path / "over.jsonl"
    over.write_bytes(b"first\n" + b"x" * (LIMIT + BLOCK // 2) + b"\nlast\n")
    with pytest.raises(TraceError) as exc:
        _blocks(over)
    assert str(exc.value) == f"{over}:2: line longer than {LIMIT} bytes (1 MiB)"


def test_an_endless_line_is_refused_after_the_limit_is_read(tmp_path, small):
    path = tmp_path / "endless.csv"
    path.write_bytes(b"a,b\n" + b"7" * (8 * LIMIT))
    with TraceSource(path) as src:
        reader = CountingReader(src.binary)
        src.binary = reader
        with pytest.raises(TraceError, match=rf"endless.csv:2: line longer than {LIMIT} bytes"):
            list(trace_columns.iter_blocks(src))
    assert reader.read_bytes <= LIMIT + 2 * BLOCK


@pytest.fixture
def opened_bytes(monkeypatch):
    """Bytes read from files the trace source opens."""
    got = {"n": 0}
    real_open = builtins.open

    class Counting:
        def __init__(self, fh):
            self._fh = fh

        def read(self, n=-1):
            data = self._fh.read(n)
            got["n"] += len(data)
            return data

        def readinto(self, buf):
            n = self._fh.readinto(buf)
            got["n"] += n or 0
            return n

        def close(self):
            self._fh.close()

    monkeypatch.setattr(trace_source, "open", lambda *a, **k: Counting(real_open(*a, **k)), raising=False)
    return got


@pytest.mark.parametrize("fmt", [None, "mooncake", "azure", "sharegpt", "sglang-bench"])
def test_an_all_zero_file_is_refused_after_its_first_block(tmp_path, opened_bytes, fmt):
    path = tmp_path / "zeros.bin"
    path.write_bytes(bytes(8 << 20))
    with pytest.raises(TraceError) as exc:
        list(read_trace(path, fmt))
    assert str(exc.value).startswith(
        f"{path}: binary data, not a text trace (a NUL byte at offset 0 of the file"
    )
    assert opened_bytes["n"] <= (1 << 20) + 8  # one read buffer: the first block


def test_binary_inside_compression_is_refused(tmp_path):
    path = tmp_path / "zeros.jsonl.gz"
    path.write_bytes(gzip.compress(bytes(4 << 20)))
    with pytest.raises(TraceError, match="NUL byte at offset 0 of the decompressed gzip data"):
        summarize(path, fmt="canonical")
    text = tmp_path / "late.jsonl"  # a NUL past the first block is left to the readers
    text.write_bytes(b'{"t": 0, "in": 1, "out": 1}\n' * 4000 + b"\0\n")
    with pytest.raises(TraceError, match=r"late.jsonl:4001: invalid JSON"):
        summarize(text)


def test_binary_trace_on_the_command_line_is_one_line(tmp_path):
    path = tmp_path / "image.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(range(256)) * 256)
    res = CliRunner().invoke(
        main,
        ["trace", "summarize", "--trace-format", "canonical", str(path)],
        env={"HPC_ADVISE_HOME": str(tmp_path)},
    )
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "binary data" in lines[0], res.stderr
    assert "Traceback" not in res.output


def test_a_big_json_array_element_costs_linear_work(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_parse, "_CHUNK", BLOCK)
    decoded = {"chars": 0}

    class CountingDecoder(json.JSONDecoder):
        def raw_decode(self, s, idx=0):
            decoded["chars"] += len(s) - idx
            return super().raw_decode(s, idx)

    monkeypatch.setattr(trace_parse.json, "JSONDecoder", CountingDecoder)
    text = "word " * 800_000  # 4 MB of text in one conversation
    conv = {"id": "a", "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "ok"}]}
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([conv, conv]))
    summary = summarize(path)
    assert summary.n_requests == 2
    # Re-decoding the element after every fixed-size read (the old code) was ~30x its size here.
    assert decoded["chars"] <= 4 * path.stat().st_size, decoded
