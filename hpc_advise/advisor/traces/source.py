"""Low-level trace I/O: the ``Request`` record, ``TraceError``, and opening a trace source.

``TraceSource(path)`` opens a file or ``-`` (stdin), recognises gzip / zstd / bz2 / xz compression
from the magic bytes (not the file name), keeps the first decoded bytes as ``head`` for format
detection (refusing binary data there), and then serves the whole decoded text again from the
start, line by line, without reading the input twice (so stdin works).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

HEAD_BYTES = 64 * 1024
_READ_BUFFER = 1 << 20


class TraceError(ValueError):
    """A trace cannot be read. ``str()`` is ``FILE:LINE: reason`` (or ``FILE: reason``)."""

    def __init__(self, reason: str, path: str | None = None, line: int | None = None):
        self.reason = reason
        self.path = path
        self.line = line
        where = path or "<trace>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):  # pickles intact (raised in a worker process, re-raised in the parent)
        return (type(self), (self.reason, self.path, self.line))


class Request(NamedTuple):
    """One request of a trace.

    ``t``: arrival time in seconds (``None`` when the format has no timestamps); ``input_len`` and
    ``output_len`` in tokens; ``cached``: prompt tokens served from a prefix cache when the trace says
    so; ``failed``: the request did not complete (its lengths are not used for length statistics).
    ``hash_ids``: prefix-block hashes (Mooncake / Bailian), ``block_size`` tokens each.
    """

    t: float | None
    input_len: int
    output_len: int
    cached: int | None = None
    failed: bool = False
    hash_ids: tuple[int, ...] | list[int] | None = None
    block_size: int | None = None


_MAGIC: list[tuple[bytes, str]] = [
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"BZh", "bz2"),
    (b"\xfd7zXZ\x00", "xz"),
]


def _decompressor(raw: BinaryIO, kind: str) -> BinaryIO:
    if kind == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if kind == "bz2":
        return bz2.BZ2File(raw, mode="rb")  # type: ignore[return-value]
    if kind == "xz":
        return lzma.LZMAFile(raw, mode="rb")  # type: ignore[return-value]
    return io.BufferedReader(_ZstdFrames(raw), _READ_BUFFER)  # type: ignore[return-value]


class _ZstdFrames(io.RawIOBase):
    """zstd frames, one after another, decoded from ``raw``. zstandard's ``stream_reader`` ends
    quietly when the input stops inside a frame, so a cut file would read as a shorter one (or end
    in a cut line); here the end of input inside a frame raises ``EOFError``, as gzip, bz2 and xz do."""

    def __init__(self, raw: BinaryIO):
        import zstandard

        self._raw = raw
        self._zstd = zstandard
        self._dobj = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False  # input given to the current frame that has not reached its end
        self._out = memoryview(b"")  # decoded, not yet served

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        """Decode more; False at a clean end of input (between frames)."""
        while not self._out:
            data = self._raw.read(_READ_BUFFER)
            if not data:
                if self._in_frame:
                    raise EOFError("truncated compressed file: the zstd stream ends inside a frame")
                return False
            decoded = []
            while data:
                decoded.append(self._dobj.decompress(data))
                self._in_frame = True
                if not self._dobj.eof:
                    break
                data = self._dobj.unused_data  # the next frame starts here
                self._dobj = self._zstd.ZstdDecompressor().decompressobj()
                self._in_frame = False
            self._out = memoryview(b"".join(decoded))
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if not self._out and not self._fill():
            return 0
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n


class _Prefixed(io.RawIOBase):
    """A raw stream that serves ``prefix`` and then the rest of ``stream``; read errors of ``stream``
    (truncated or corrupt compressed data, I/O errors) become ``TraceError`` naming ``where``."""

    def __init__(self, prefix: bytes, stream: BinaryIO, where: tuple[str, str] = ("<trace>", "plain")):
        self._prefix = memoryview(prefix)
        self._stream = stream
        self._where = where

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        try:
            data = self._stream.read(len(buffer))
        except Exception as exc:
            name, kind = self._where
            raise TraceError(f"cannot read ({kind}): {type(exc).__name__}: {exc}", name) from exc
        n = len(data)
        buffer[:n] = data
        return n


def _read_up_to(stream: BinaryIO, n: int) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class TraceSource:
    """An opened trace: ``name`` (for messages), ``compression``, ``head`` (decoded start of the text)
    and ``text`` (a text stream positioned at the very start). Use as a context manager."""

    def __init__(self, path: str | Path, name: str | None = None):
        self.name = str(path)
        self._owned: list[object] = []
        if self.name == "-":
            raw: BinaryIO = sys.stdin.buffer
            self.name = "<stdin>"
        else:
            try:
                raw = open(self.name, "rb")  # noqa: SIM115 - closed in close()
            except OSError as exc:
                raise TraceError(f"cannot open: {exc.strerror or exc}", self.name) from exc
            self._owned.append(raw)
        if name is not None:
            self.name = name
        magic = _read_up_to(raw, 8)
        self.compression = next((kind for sig, kind in _MAGIC if magic.startswith(sig)), None)
        stream: BinaryIO = io.BufferedReader(_Prefixed(magic, raw, (self.name, "plain")), _READ_BUFFER)
        if self.compression:
            stream = _decompressor(stream, self.compression)
            self._owned.append(stream)
        try:
            head = _read_up_to(stream, HEAD_BYTES)
        except TraceError:
            raise
        except Exception as exc:  # corrupt compressed data
            raise TraceError(
                f"cannot read ({self.compression}): {type(exc).__name__}: {exc}", self.name
            ) from exc
        nul = head.find(b"\0")
        if nul >= 0:
            # No text trace holds a NUL byte; binary data (and an all-zero file) has one in its
            # first block all but surely, so it is refused here instead of read to the end.
            what = f"the decompressed {self.compression} data" if self.compression else "the file"
            raise TraceError(
                f"binary data, not a text trace (a NUL byte at offset {nul} of {what}; "
                "UTF-16 text must be converted to UTF-8)",
                self.name,
            )
        self.head = head.decode("utf-8", errors="ignore").lstrip("\ufeff")
        self.first_line = 1
        # ``binary`` and ``text`` read the same bytes: use one or the other.
        self.binary = io.BufferedReader(
            _Prefixed(head, stream, (self.name, self.compression or "plain")), _READ_BUFFER
        )
        self.text = io.TextIOWrapper(self.binary, encoding="utf-8-sig", errors="replace", newline=None)

    @classmethod
    def from_text(cls, text: str, name: str, first_line: int = 1) -> TraceSource:
        """A source over text already in memory whose first line is line ``first_line`` of ``name``."""
        self = cls.__new__(cls)
        self.name = name
        self._owned = []
        self.compression = None
        self.head = text[:HEAD_BYTES]
        self.first_line = first_line
        self.binary = None
        self.text = io.StringIO(text, newline=None)
        return self

    def lines(self) -> Iterator[tuple[int, str]]:
        """``(line_number, line)``; lines keep their newline. Read errors raise ``TraceError``."""
        return enumerate(self.text, self.first_line)

    def close(self) -> None:
        for obj in reversed(self._owned):
            try:
                obj.close()  # type: ignore[attr-defined]
            except Exception:
                pass
        self._owned.clear()

    def __enter__(self) -> TraceSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
