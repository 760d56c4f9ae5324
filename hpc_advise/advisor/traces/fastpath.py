"""Whole-block fast paths: for the JSON Lines formats with numeric fields (Mooncake, Bailian,
canonical) one ``orjson`` call parses a whole block as a JSON array, the fields come out by list
comprehension and are checked with numpy -- about twice as fast as the per-line reader; for the CSV
formats (Azure, BurstGPT) rows are split on commas and numpy converts the columns (date-times as
``datetime64[ns]``).

All or nothing: ``fast_columns`` returns ``None`` as soon as anything is unusual (a blank line, a
syntax error, a missing field, a value of another type -- even one the per-line reader would accept,
such as a numeric string -- or a value the checks refuse); the caller then parses the block line by
line, which gives the exact ``FILE:LINE: reason`` and the lenient conversions. So both paths yield
the same requests (tests compare them).
"""

from __future__ import annotations

import warnings
from itertools import chain

import numpy as np

from hpc_advise.advisor.traces.checks import MAX_TOKENS
from hpc_advise.advisor.traces.parse import fast_loads
from hpc_advise.advisor.traces.summary import Columns

_NUMBER = {int, float}
_NONE = type(None)

# format -> (time field, time scale, input field, output field, default block size)
_LAYOUT = {
    "mooncake": ("timestamp", 1e-3, "input_length", "output_length", 512),
    "bailian": ("timestamp", 1.0, "input_length", "output_length", 16),
    "canonical": ("t", 1.0, "in", "out", 512),
}


def _ints(values: list) -> np.ndarray | None:
    if values and set(map(type, values)) != {int}:
        return None
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return None


def fast_columns(fmt: str, text: str, first_line: int, block_size: int | None = None) -> Columns | None:
    """``Columns`` of a block of lines, or None when the per-line reader must handle it."""
    layout = _LAYOUT.get(fmt)
    if layout is None or not text or "\n\n" in text or text[0] in " \t\r\n":
        return None
    t_key, scale, in_key, out_key, default_block = layout
    body = text[:-1] if text.endswith("\n") else text
    n_lines = body.count("\n") + 1
    try:
        objs = fast_loads("[" + body.replace("\n", ",") + "]")
        if len(objs) != n_lines:  # a line held more (or less) than one value
            return None
        ts = [d.get(t_key) for d in objs] if fmt == "canonical" else [d[t_key] for d in objs]
        ins = [d[in_key] for d in objs]
        outs = [d[out_key] for d in objs]
        hash_lists = [d.get("hash_ids") for d in objs]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None

    t_types = set(map(type, ts))
    if not t_types <= (_NUMBER | {_NONE} if fmt == "canonical" else _NUMBER):
        return None
    t = np.array(ts, dtype=np.float64)  # None -> NaN
    if not np.isfinite(t[~np.isnan(t)] if _NONE in t_types else t).all():
        return None
    if scale != 1.0:
        t = t * scale
    n_in, n_out = _ints(ins), _ints(outs)
    if n_in is None or n_out is None:
        return None
    if (n_in < 0).any() or (n_out < 0).any() or (n_in > MAX_TOKENS).any() or (n_out > MAX_TOKENS).any():
        return None
    if (t < 0).any():  # NaN compares False
        return None

    cached = np.full(n_lines, np.nan)
    failed = np.zeros(n_lines, dtype=bool)
    block = block_size or default_block
    if fmt == "canonical":
        cached_list = [d.get("cached") for d in objs]
        types = set(map(type, cached_list))
        if types != {_NONE}:
            if not types <= {int, _NONE}:
                return None
            cached = np.array(cached_list, dtype=np.float64)
            known = ~np.isnan(cached)
            if (cached[known] < 0).any() or (cached[known] > n_in[known]).any():
                return None
        failed_list = [d.get("failed", False) for d in objs]
        if set(map(type, failed_list)) != {bool}:
            return None
        failed = np.array(failed_list, dtype=bool)

    block_sizes: set = set()
    each = None
    h_types = set(map(type, hash_lists))
    if h_types == {_NONE}:
        hash_counts = np.zeros(n_lines, dtype=np.int64)
        hashes = np.empty(0, dtype=np.uint64)
    else:
        if not h_types <= {list, _NONE}:
            return None
        if fmt == "canonical":
            sizes = [d.get("block_size", 512) for d, h in zip(objs, hash_lists, strict=True) if h is not None]
            if set(map(type, sizes)) != {int}:
                return None
            block_sizes = set(sizes)
            if len(block_sizes) > 1:
                each = np.array(
                    [
                        0 if h is None else d.get("block_size", 512)
                        for d, h in zip(objs, hash_lists, strict=True)
                    ],
                    dtype=np.int64,
                )
        else:
            block_sizes = {block}
        if _NONE in h_types:
            hash_lists = [h or () for h in hash_lists]
        hash_counts = np.fromiter(map(len, hash_lists), dtype=np.int64, count=n_lines)
        flat = list(chain.from_iterable(hash_lists))
        ids = _ints(flat)
        if ids is None:
            return None
        hashes = ids.astype(np.uint64)
    lines = np.arange(first_line, first_line + n_lines, dtype=np.int64)
    return Columns(t, n_in, n_out, cached, failed, hash_counts, hashes, block_sizes, lines, each)


_CSV_FIELDS = {
    "azure": ("timestamp", "contexttokens", "generatedtokens"),
    "burstgpt": ("timestamp", "requesttokens", "responsetokens"),
}
_TZ_ZERO = ("+00:00", "-00:00", "+0000", "-0000", "+00", "-00", "Z", "z")


def _drop_zero_offset(s: str) -> str:
    for suffix in _TZ_ZERO:
        if s.endswith(suffix) and len(s) - len(suffix) >= 19:
            return s[: -len(suffix)]
    return s


def _datetimes(values: tuple) -> np.ndarray | None:
    """Seconds since the epoch of Azure-style date-times, or None (then the line reader decides)."""
    strs = [s.strip() for s in values]
    for s in strs:
        if len(s) < 19 or s[4] != "-" or s[7] != "-" or s[10] not in " T" or s[13] != ":" or s[16] != ":":
            return None
        if not "1970" <= s[:4] <= "2261":  # datetime64[ns] spans 1677-2262; earlier is negative anyway
            return None
    if any(s.endswith(_TZ_ZERO) for s in strs):  # zero offsets (the Azure traces write "+00:00")
        strs = [_drop_zero_offset(s) for s in strs]
    if any(not s[19:].replace(".", "", 1).isdigit() and s[19:] != "" for s in strs):
        return None  # another time zone offset or odd text: leave it to the line reader
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            ns = np.array(strs, dtype="datetime64[ns]").astype(np.int64)
        except (ValueError, TypeError, OverflowError, Warning):
            return None
    return ns.astype(np.float64) / 1e9


def fast_csv_columns(fmt: str, text: str, first_line: int) -> Columns | None:
    """``Columns`` of a CSV block whose first line is the header (line ``first_line``), or None."""
    fields = _CSV_FIELDS.get(fmt)
    if fields is None or '"' in text or "\r" in text:
        return None
    head, _, body = text.partition("\n")
    body = body[:-1] if body.endswith("\n") else body
    if not body or "\n\n" in body:
        return None
    names = [h.strip().lower().replace(" ", "").replace("_", "") for h in head.lstrip("\ufeff").split(",")]
    try:
        i_t, i_in, i_out = (names.index(f) for f in fields)
    except ValueError:
        return None
    rows = [r.split(",") for r in body.split("\n")]
    if set(map(len, rows)) != {len(names)}:
        return None
    cols = list(zip(*rows, strict=True))
    try:
        n_in = np.array(cols[i_in], dtype=np.int64)
        n_out = np.array(cols[i_out], dtype=np.int64)
        t = _datetimes(cols[i_t]) if fmt == "azure" else np.array(cols[i_t], dtype=np.float64)
    except (ValueError, OverflowError):
        return None
    if t is None or not np.isfinite(t).all() or (t < 0).any():
        return None
    if (n_in < 0).any() or (n_out < 0).any() or (n_in > MAX_TOKENS).any() or (n_out > MAX_TOKENS).any():
        return None
    n = len(rows)
    failed = (n_out == 0) if fmt == "burstgpt" else np.zeros(n, dtype=bool)
    lines = np.arange(first_line + 1, first_line + 1 + n, dtype=np.int64)
    empty = np.empty(0, dtype=np.uint64)
    return Columns(
        t, n_in, n_out, np.full(n, np.nan), failed, np.zeros(n, dtype=np.int64), empty, set(), lines
    )
