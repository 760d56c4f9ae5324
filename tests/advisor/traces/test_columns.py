"""The read path (traces.columns): blocks of lines give the same summary and the same first error
as one request at a time through the Summarizer, across block boundaries; the whole-block fast paths
give the same requests as the per-line readers."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc_advise.advisor.traces import REORDER_S, TraceError, read_trace, summarize
from hpc_advise.advisor.traces import columns as trace_blocks
from hpc_advise.advisor.traces.fastpath import _datetimes, fast_columns, fast_csv_columns
from hpc_advise.advisor.traces.formats import ReadOptions
from hpc_advise.advisor.traces.parse import BadField, datetime_seconds
from hpc_advise.advisor.traces.summary import Summarizer
from tests.advisor.traces.helpers import assert_same, comparable


def sequential(path, **kw):
    """The summary of read_trace's records added one at a time (the Summarizer's own chunking), not
    the read path's blocks."""
    reader = read_trace(path, **kw)
    s = Summarizer(reorder_s=REORDER_S)
    for request in reader:
        s.add(request)
    summary = s.result(source=reader.name, fmt=reader.format, n_bad=reader.n_bad, concurrency=None)
    if reader.bad_examples:
        summary.notes.append("skipped: " + "; ".join(reader.bad_examples))
    return summary


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(trace_blocks, "BLOCK_BYTES", 2000)


def _mooncake_lines(n, rng, bad_every=None, jitter=0.0):
    lines = []
    t = 0.0
    for i in range(n):
        t += rng.exponential(0.5)
        stamp = max(0.0, t - rng.uniform(0, jitter))
        ids = [i % 5, 1000 + i]
        lines.append(
            json.dumps(
                {
                    "timestamp": int(stamp * 1000),
                    "input_length": int(rng.integers(1, 5000)),
                    "output_length": int(rng.integers(1, 900)),
                    "hash_ids": ids,
                }
            )
        )
        if bad_every and i % bad_every == bad_every - 1:
            lines.append('{"timestamp": 5, "input_length": -1, "output_length": 1}')
    return "\n".join(lines) + "\n"


def test_blocks_match_sequential(tmp_path, small_blocks):
    rng = np.random.default_rng()
    path = tmp_path / "t.jsonl"
    path.write_text(_mooncake_lines(400, rng, bad_every=37, jitter=5.0))
    assert path.stat().st_size > 10 * trace_blocks.BLOCK_BYTES
    a = summarize(path, skip_bad=True)
    b = sequential(path, skip_bad=True)
    assert a.n_bad == b.n_bad == 400 // 37
    a_d, b_d = comparable(a), comparable(b)
    assert_same(a_d, b_d)


def test_csv_blocks_keep_header_and_line_numbers(tmp_path, small_blocks):
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    rows += [f"{i * 0.5},ChatGPT,{100 + i},{i % 50},{100 + i + i % 50},Conversation log" for i in range(600)]
    rows.insert(450, "17.5,ChatGPT,abc,3,3,Conversation log")  # line 451
    path = tmp_path / "b.csv"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(TraceError, match=r"b\.csv:451: Request tokens is not a number: 'abc'"):
        summarize(path)
    with pytest.raises(TraceError, match=r"b\.csv:451: "):
        sequential(path)
    a, b = summarize(path, skip_bad=True), sequential(path, skip_bad=True)
    assert a.n_failed == 12 and a.n_bad == 1
    assert_same(comparable(a), comparable(b))


def test_first_error_in_file_order_across_blocks(tmp_path, small_blocks):
    lines = [json.dumps({"t": i * 1.0, "in": 10, "out": 2}) for i in range(300)]
    lines[200] = json.dumps({"t": 150.0, "in": 10, "out": 2})  # 49 s late: line 201
    lines[250] = "not json"  # line 251
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as seq:
        list(read_trace(path))
    with pytest.raises(TraceError) as blk:
        summarize(path)
    assert str(blk.value) == str(seq.value)
    assert str(blk.value).startswith(
        f"{path}:201: timestamp 150.000 s is 49.000 s before the one on line 200"
    )
    s = summarize(path, skip_bad=True)
    assert s.n_bad == 2 and s.n_requests == 298
    note = s.notes[-1]
    assert 0 < note.index(f"{path}:201: timestamp") < note.index(f"{path}:251: invalid JSON")


# --- the whole-block fast path accepts a block only when the per-line reader reads it the same ---
ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.integers(-3, -1),
    st.integers(2**63, 2**66),
    st.just(20_000_000),
    st.just(2.0),
)
FIELDS = {
    "mooncake": ("timestamp", "input_length", "output_length"),
    "bailian": ("timestamp", "input_length", "output_length"),
    "canonical": ("t", "in", "out"),
}


@st.composite
def record_line(draw, fmt):
    if draw(st.integers(0, 40)) == 0:
        return draw(st.sampled_from(["", "   ", "[1]", "{bad", '"x"', '{"t": 1}, {"t": 2}']))
    obj = {}
    for key in FIELDS[fmt]:
        if draw(st.integers(0, 30)) == 0:
            continue  # missing field
        obj[key] = draw(ODD) if draw(st.integers(0, 15)) == 0 else draw(st.integers(0, 200_000))
    if draw(st.booleans()):
        ids = draw(st.lists(st.integers(-5, 10**6), max_size=5))
        obj["hash_ids"] = draw(ODD) if draw(st.integers(0, 15)) == 0 else ids
        if fmt == "canonical" and draw(st.booleans()):
            obj["block_size"] = draw(st.sampled_from([16, 512, "16", None]))
    if fmt == "canonical":
        if draw(st.booleans()):
            obj["cached"] = draw(st.one_of(st.integers(0, 100), ODD))
        if draw(st.booleans()):
            obj["failed"] = draw(st.one_of(st.booleans(), ODD))
    return json.dumps(obj)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(FIELDS)).flatmap(
        lambda f: st.tuples(st.just(f), st.lists(record_line(f), min_size=1, max_size=12))
    )
)
def test_fast_path_equals_line_reader(case):
    fmt, lines = case
    text = "\n".join(lines) + "\n"
    fast = fast_columns(fmt, text, 7)
    trace_blocks.USE_FAST_PATH = False
    try:
        slow = trace_blocks.parse_block(fmt, ReadOptions(), "x", text.encode(), 7, None, True)
    finally:
        trace_blocks.USE_FAST_PATH = True
    if fast is None:
        return
    assert slow.n_bad == 0, slow.bad
    cols = slow.columns
    for name in ("t", "cached"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(cols, name))  # NaN == NaN here
    for name in ("n_in", "n_out", "failed", "hash_counts", "hashes", "lines"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(cols, name), err_msg=name)
    assert fast.block_sizes == cols.block_sizes


def test_fast_path_is_taken_for_plain_blocks():
    text = "".join(
        json.dumps({"timestamp": i, "input_length": 5, "output_length": 1, "hash_ids": [i]}) + "\n"
        for i in range(50)
    )
    cols = fast_columns("mooncake", text, 1)
    assert cols is not None and len(cols) == 50 and cols.lines[-1] == 50
    assert fast_columns("mooncake", text.replace("\n", "\n\n", 1), 1) is None


@st.composite
def stamp(draw):
    when = draw(st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2100, 1, 1)))
    digits = draw(st.integers(0, 11))
    frac = (
        ""
        if digits == 0
        else "." + "".join(draw(st.lists(st.sampled_from("0123456789"), min_size=digits, max_size=digits)))
    )
    sep = draw(st.sampled_from([" ", "T"]))
    suffix = draw(st.sampled_from(["", "", "+00:00", "Z", "+0000", "-00:00", "+01:00", "-05:30"]))
    text = when.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + frac + suffix
    if draw(st.integers(0, 12)) == 0:  # damage it
        i = draw(st.integers(0, len(text) - 1))
        text = text[:i] + draw(st.sampled_from(["x", "", "9", ":", "."])) + text[i + 1 :]
    return text


@settings(max_examples=200, deadline=None)
@given(st.lists(stamp(), min_size=1, max_size=6))
def test_datetime_fast_path_equals_parser(stamps):
    fast = _datetimes(tuple(stamps))
    try:
        slow = [datetime_seconds(s) for s in stamps]
    except BadField:
        assert fast is None
        return
    if fast is not None:
        assert fast.tolist() == slow  # bit for bit


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(stamp(), st.integers(-2, 3000), st.integers(-1, 500)), min_size=1, max_size=8),
    st.booleans(),
)
def test_csv_fast_path_equals_line_reader(rows, burst):
    fmt = "burstgpt" if burst else "azure"
    if burst:
        header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        body = "".join(
            f"{abs(hash(s)) % 10**6 / 7:.3f},M,{a},{b},{a + b},Conversation log\n" for s, a, b in rows
        )
    else:
        header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        body = "".join(f"{s},{a},{b}\n" for s, a, b in rows)
    fast = fast_csv_columns(fmt, header + body, 1)
    trace_blocks.USE_FAST_PATH = False
    try:
        slow = trace_blocks.parse_block(fmt, ReadOptions(), "x", (header + body).encode(), 1, None, True)
    finally:
        trace_blocks.USE_FAST_PATH = True
    if fast is None:
        return
    assert slow.n_bad == 0, slow.bad
    for name in ("t", "n_in", "n_out", "failed", "lines"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow.columns, name), err_msg=name)
