"""Parsing helpers shared by the trace readers: field coercion, timestamps, JSON Lines, streamed JSON
arrays, whole JSON documents and CSV rows.

Every iterator here yields ``(line_number, value)`` where a ``str`` value is the reason a line is bad
(the caller decides whether that stops the read or is counted and skipped).
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
from collections.abc import Iterator

from hpc_advise.advisor.traces.source import TraceError, TraceSource


class BadField(ValueError):
    """A field of one record is unusable; the message is the reason shown to the user."""


def tokens(value: object, name: str) -> int:
    """A token count: an int, an integral float, or a decimal string."""
    if type(value) is int:
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise BadField(f"{name} is not a whole number: {value!r}")
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            try:
                f = float(value)
            except ValueError:
                raise BadField(f"{name} is not a number: {value!r}") from None
            return tokens(f, name)
    if value is None:
        raise BadField(f"{name} is missing (null)")
    raise BadField(f"{name} is not a number: {value!r}")


def number(value: object, name: str) -> float:
    """A finite float from an int, float or decimal string."""
    if type(value) is int or type(value) is float:
        x = float(value)
    elif isinstance(value, str):
        try:
            x = float(value.strip())
        except ValueError:
            raise BadField(f"{name} is not a number: {value!r}") from None
    elif value is None:
        raise BadField(f"{name} is missing (null)")
    else:
        raise BadField(f"{name} is not a number: {value!r}")
    if not math.isfinite(x):
        raise BadField(f"{name} is not finite: {value!r}")
    return x


def int_list(value: object, name: str) -> list[int]:
    """A list of integers (checked at C speed: ``sum`` of ints is an int, anything else is not)."""
    if type(value) is not list:
        raise BadField(f"{name} is not a list")
    try:
        total = sum(value)
    except TypeError:
        total = None
    if type(total) is not int:  # (JSON true/false would pass as 1/0: not worth a per-item check)
        bad = next((v for v in value if type(v) is not int), None)
        raise BadField(f"{name} holds a non-integer: {bad!r}")
    return value


_day_cache: dict[str, int] = {}


def datetime_seconds(value: str, name: str = "timestamp") -> float:
    """Seconds since the epoch of ``YYYY-MM-DD[ T]HH:MM:SS[.fraction][Z|±HH:MM]`` (naive = offset +00:00).

    Any number of fractional digits is accepted (Azure's traces carry 7) and cut to nanoseconds;
    Python 3.10's ``fromisoformat`` does not accept that, hence this parser. The result is integer
    nanoseconds / 1e9, the same float numpy's ``datetime64[ns]`` gives (the CSV fast path uses it).
    """
    s = value.strip()
    if len(s) < 19 or s[4] != "-" or s[7] != "-" or s[10] not in " T" or s[13] != ":" or s[16] != ":":
        raise BadField(f"{name} is not a date-time (YYYY-MM-DD HH:MM:SS[.f]): {value!r}")
    day = s[:10]
    base = _day_cache.get(day)
    try:
        if base is None:
            base = (_dt.date(int(s[0:4]), int(s[5:7]), int(s[8:10])) - _dt.date(1970, 1, 1)).days * 86400
            if len(_day_cache) > 4096:
                _day_cache.clear()
            _day_cache[day] = base
        hh, mm, ss = int(s[11:13]), int(s[14:16]), int(s[17:19])
        rest = s[19:]
        frac_ns = 0
        if rest.startswith("."):
            end = 1
            while end < len(rest) and rest[end].isdigit():
                end += 1
            frac_ns = int((rest[1:end] + "000000000")[:9])
            rest = rest[end:]
        offset = 0
        if rest in ("", "Z", "z"):
            pass
        elif rest[0] in "+-" and len(rest) in (3, 5, 6):
            oh, om = int(rest[1:3]), int(rest[-2:]) if len(rest) > 3 else 0
            offset = (oh * 3600 + om * 60) * (1 if rest[0] == "+" else -1)
        else:
            raise ValueError(rest)
    except ValueError:
        raise BadField(f"{name} is not a date-time (YYYY-MM-DD HH:MM:SS[.f]): {value!r}") from None
    if hh > 23 or mm > 59 or ss > 59:
        raise BadField(f"{name} has an invalid time of day: {value!r}")
    return ((base + hh * 3600 + mm * 60 + ss - offset) * 1_000_000_000 + frac_ns) / 1e9


try:  # orjson parses JSON Lines about 5x faster; the standard library gives the same results
    from orjson import loads as fast_loads
except ImportError:  # pragma: no cover - orjson is a declared dependency
    fast_loads = json.loads


def parse_json_line(line: str) -> object:
    """The JSON value of one line; ``BadField`` with the reason when it is not valid JSON. Values
    orjson refuses (integers beyond 64 bits) are retried with the standard library."""
    try:
        return fast_loads(line)
    except ValueError:
        try:
            return json.loads(line)
        except ValueError as exc:
            msg = getattr(exc, "msg", str(exc))
            col = getattr(exc, "colno", None)
            raise BadField(f"invalid JSON ({msg}{f' at column {col}' if col else ''})") from None


def json_lines(source: TraceSource) -> Iterator[tuple[int, object]]:
    """Objects of a JSON Lines file; blank lines are skipped; a bad line yields its reason."""
    parse = parse_json_line
    for number_, line in source.lines():
        if line.isspace() or not line:
            continue
        try:
            obj = parse(line)
        except BadField as exc:
            yield number_, str(exc)
            continue
        if type(obj) is not dict:
            obj = f"expected a JSON object, got {type(obj).__name__}"
        yield number_, obj


_CHUNK = 1 << 20
_MAX_ELEMENT = 256 << 20


def json_array(source: TraceSource) -> Iterator[tuple[int, object]]:
    """Elements of a top-level JSON array, streamed (constant memory per element).

    Yields ``(line, element)``; a syntax error inside the array cannot be resynchronised, so it
    raises ``TraceError`` even when bad lines are being skipped.
    """
    decoder = json.JSONDecoder()
    read = source.text.read
    buf = read(_CHUNK)
    pos = 0
    line = 1
    eof = not buf

    def fill() -> None:
        nonlocal buf, pos, eof
        # At least double what is unparsed: an element is re-decoded from its start after each
        # fill, so fixed-size reads would make a big element cost quadratic time.
        chunk = read(max(_CHUNK, len(buf) - pos))
        if not chunk:
            eof = True
            return
        buf = buf[pos:] + chunk
        pos = 0
        if len(buf) > _MAX_ELEMENT:
            raise TraceError(
                f"a JSON array element is larger than {_MAX_ELEMENT >> 20} MiB", source.name, line
            )

    def skip_ws() -> None:
        nonlocal pos, line
        while True:
            n = len(buf)
            while pos < n and buf[pos] in " \t\r\n\ufeff":
                if buf[pos] == "\n":
                    line += 1
                pos += 1
            if pos < n or eof:
                return
            fill()

    skip_ws()
    if pos >= len(buf) or buf[pos] != "[":
        raise TraceError("expected a JSON array ('[')", source.name, line)
    pos += 1
    first = True
    while True:
        skip_ws()
        if pos >= len(buf):
            raise TraceError("unexpected end of file inside the JSON array", source.name, line)
        if buf[pos] == "]":
            pos += 1
            skip_ws()
            if pos < len(buf):
                raise TraceError("unexpected data after the JSON array", source.name, line)
            return
        if not first:
            if buf[pos] != ",":
                raise TraceError(
                    f"expected ',' or ']' in the JSON array, got {buf[pos]!r}", source.name, line
                )
            pos += 1
            skip_ws()
        first = False
        while True:
            try:
                element, end = decoder.raw_decode(buf, pos)
                break
            except json.JSONDecodeError as exc:
                if eof:
                    raise TraceError(
                        f"invalid JSON ({exc.msg})", source.name, line + buf.count("\n", pos, exc.pos)
                    ) from None
                fill()
        start_line = line
        line += buf.count("\n", pos, end)
        pos = end
        yield start_line, element


def json_documents(source: TraceSource) -> Iterator[tuple[int, object]]:
    """One or more whole JSON documents one after the other (a JSON file or JSON Lines of big
    objects, such as benchmark outputs). Reads the whole text: these files are small."""
    text = source.text.read()
    decoder = json.JSONDecoder()
    pos = 0
    line = 1
    n = len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n":
            if text[pos] == "\n":
                line += 1
            pos += 1
        if pos >= n:
            return
        try:
            doc, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            yield line + text.count("\n", pos, exc.pos), f"invalid JSON ({exc.msg})"
            return
        yield line, doc
        line += text.count("\n", pos, end)
        pos = end


def csv_rows(source: TraceSource, required: dict[str, tuple[str, ...]]) -> Iterator[tuple[int, object]]:
    """Rows of a CSV file with a header, as dicts keyed by our names.

    ``required`` maps our name to the accepted header spellings (compared case-insensitively, spaces
    and underscores ignored). The header row must contain every one of them.
    """
    reader = csv.reader(source.text)
    try:
        header = next(reader)
    except StopIteration:
        return
    norm = [h.strip().lower().replace(" ", "").replace("_", "") for h in header]
    index: dict[str, int] = {}
    for ours, spellings in required.items():
        for spelling in spellings:
            key = spelling.lower().replace(" ", "").replace("_", "")
            if key in norm:
                index[ours] = norm.index(key)
                break
        else:
            raise TraceError(
                f"CSV header lacks a column {spellings[0]!r} (header: {', '.join(header)})",
                source.name,
                source.first_line,
            )
    width = len(header)
    items = list(index.items())
    offset = source.first_line - 1
    for row in reader:
        number_ = reader.line_num + offset
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != width:
            yield number_, f"expected {width} CSV fields, got {len(row)}"
            continue
        yield number_, {ours: row[i] for ours, i in items}
