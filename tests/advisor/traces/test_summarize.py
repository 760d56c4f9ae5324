"""Traces: reading Mooncake / canonical, summary statistics against exact numpy figures, bad input,
compression and stdin, the CLI."""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from hpc_advise.advisor.traces import Request, TraceError, TraceSummary, read_trace, summarize
from hpc_advise.advisor.traces.cli import trace
from tests.advisor.traces.helpers import assert_same, comparable

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "traces"


def write_lines(path: Path, objs) -> Path:
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


def nearest_rank(values, q):
    xs = np.sort(np.asarray(values))
    return int(xs[max(1, math.ceil(q * len(xs))) - 1])


@pytest.fixture
def mooncake(tmp_path):
    rng = np.random.default_rng()
    n = 500
    ts = np.sort(rng.integers(0, 600_000, n))
    ins = rng.integers(1, 900, n)  # below 1024: quantiles are exact
    outs = rng.integers(1, 700, n)
    lines = [
        {"timestamp": int(t), "input_length": int(i), "output_length": int(o), "hash_ids": [k % 7, 100 + k]}
        for k, (t, i, o) in enumerate(zip(ts, ins, outs, strict=True))
    ]
    return write_lines(tmp_path / "trace.jsonl", lines), ts / 1000.0, ins, outs


def test_mooncake_summary_matches_exact_numpy(mooncake):
    path, ts, ins, outs = mooncake
    s = summarize(path)
    assert s.format == "mooncake"
    assert (s.n_requests, s.n_failed, s.n_bad) == (len(ts), 0, 0)
    assert s.duration_s == pytest.approx(ts[-1] - ts[0])
    assert s.rate_rps == pytest.approx((len(ts) - 1) / (ts[-1] - ts[0]))
    gaps = np.diff(ts)
    assert s.burstiness_cv == pytest.approx(gaps.std() / gaps.mean(), rel=1e-9)
    for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        assert s.isl[key] == nearest_rank(ins, q)
        assert s.osl[key] == nearest_rank(outs, q)
    assert s.isl["max"] == ins.max() and s.osl["mean"] == pytest.approx(outs.mean())
    assert s.total_input_tokens == ins.sum()
    # hash_ids: k % 7 repeats after the first 7 requests, 100 + k never repeats.
    assert s.prefix_blocks == 2 * len(ts)
    assert s.prefix_reuse == pytest.approx((len(ts) - 7) / (2 * len(ts)))
    assert s.prefix_block_size == 512
    assert len(s.sample) == len(ts)  # fewer requests than the reservoir holds: all kept
    assert sorted(map(tuple, s.sample)) == sorted(zip(ins.tolist(), outs.tolist(), strict=True))
    assert sum(c for _, _, c in s.histograms["isl"]) == len(ts)


def test_large_lengths_quantile_error_bound(tmp_path):
    rng = np.random.default_rng()
    ins = rng.integers(1024, 2_000_000, 3000)
    path = write_lines(
        tmp_path / "c.jsonl", [{"t": i * 0.1, "in": int(v), "out": 5} for i, v in enumerate(ins)]
    )
    s = summarize(path)
    for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        exact = nearest_rank(ins, q)
        assert abs(s.isl[key] - exact) <= s.quantile_rel_error * exact + 1
    assert s.isl["max"] == ins.max()


def test_canonical_fields_and_failed(tmp_path):
    path = write_lines(
        tmp_path / "c.jsonl",
        [
            {"t": 0.0, "in": 100, "out": 10, "cached": 50},
            {"t": 1.0, "in": 300, "out": 0, "failed": True},
            {"t": 3.0, "in": 200, "out": 30, "cached": 0},
            {"t": None, "in": 400, "out": 40},
        ],
    )
    reqs = list(read_trace(path))
    assert reqs[0] == Request(0.0, 100, 10, 50, False, None, None)
    assert reqs[1].failed and reqs[3].t is None
    s = summarize(path)
    assert (s.n_requests, s.n_failed) == (4, 1)
    assert s.isl["max"] == 400 and s.total_input_tokens == 700  # the failed request is left out
    assert s.cached_fraction == pytest.approx(50 / 300)
    assert s.duration_s == 3.0 and s.rate_rps == pytest.approx(2 / 3)
    assert any("without a timestamp" in n for n in s.notes)


def test_out_of_order_within_window_is_sorted(tmp_path):
    ts = [0.0, 5.0, 2.0, 9.0, 7.5, 20.0, 12.0]
    path = write_lines(tmp_path / "c.jsonl", [{"t": t, "in": 1, "out": 1} for t in ts])
    s = summarize(path)
    gaps = np.diff(np.sort(ts))
    assert s.burstiness_cv == pytest.approx(gaps.std() / gaps.mean())
    assert s.duration_s == 20.0


def test_out_of_order_beyond_window_is_an_error(tmp_path):
    path = write_lines(
        tmp_path / "c.jsonl", [{"t": 100.0, "in": 1, "out": 1}, {"t": 50.0, "in": 1, "out": 1}]
    )
    with pytest.raises(
        TraceError, match=r"c\.jsonl:2: timestamp 50\.000 s is 50\.000 s before the one on line 1"
    ):
        summarize(path)
    assert summarize(path, skip_bad=True).n_bad == 1


@pytest.mark.parametrize(
    "line, reason",
    [
        ("{not json", "invalid JSON"),
        ('{"t": 1, "in": -5, "out": 3}', "negative length"),
        ('{"t": 1, "in": 50000000, "out": 3}', "absurd length"),
        ('{"t": 1, "in": 5, "out": 3, "cached": 9}', "cached tokens 9 outside"),
        ('{"t": -1, "in": 5, "out": 3}', "negative timestamp"),
        ('{"t": "soon", "in": 5, "out": 3}', "t is not a number"),
        ('{"t": 1, "in": 5.5, "out": 3}', "in is not a whole number"),
        ('{"t": 1, "out": 3}', "missing field 'in'"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_line_reports_file_and_line(tmp_path, line, reason):
    path = write_lines(
        tmp_path / "bad.jsonl", ['{"t": 0, "in": 5, "out": 3}', "", line, '{"t": 2, "in": 5, "out": 3}']
    )
    with pytest.raises(TraceError) as err:
        summarize(path, fmt="canonical")
    assert str(err.value).startswith(f"{path}:3: ")
    assert reason in str(err.value)
    s = summarize(path, fmt="canonical", skip_bad=True)
    assert (s.n_requests, s.n_bad) == (2, 1)
    assert any(f"{path}:3:" in n for n in s.notes)


def test_empty_and_unknown(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(TraceError, match="empty trace"):
        summarize(empty)
    unknown = write_lines(tmp_path / "u.jsonl", [{"foo": 1, "bar": 2}])
    with pytest.raises(TraceError, match=r"u\.jsonl:1: unknown JSON trace format.*--trace-format"):
        summarize(unknown)
    text = tmp_path / "t.txt"
    text.write_text("hello world\n")
    with pytest.raises(TraceError, match="unknown trace format"):
        summarize(text)
    only_bad = write_lines(tmp_path / "b.jsonl", ['{"t": 0, "in": -1, "out": 1}'])
    with pytest.raises(TraceError, match="no requests in the trace; 1 bad lines"):
        summarize(only_bad, skip_bad=True)
    with pytest.raises(TraceError, match="unknown format 'nope'"):
        summarize(unknown, fmt="nope")
    with pytest.raises(TraceError, match="cannot open"):
        summarize(tmp_path / "missing.jsonl")


def test_compressed_and_stdin(tmp_path, monkeypatch, mooncake):
    import zstandard

    path, ts, ins, _ = mooncake
    raw = path.read_bytes()
    base = summarize(path).to_dict()
    gz = tmp_path / "t.gz"  # no .jsonl extension: detection is by content
    gz.write_bytes(gzip.compress(raw))
    zst = tmp_path / "t.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(raw))
    for p in (gz, zst):
        d = summarize(p).to_dict()
        d["source"] = base["source"]
        assert d == base
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(raw))))
    d = summarize("-").to_dict()
    assert d["source"] == "<stdin>" and d["n_requests"] == len(ts)


def test_corrupt_gzip_is_a_trace_error(tmp_path, mooncake):
    path = mooncake[0]
    data = gzip.compress(path.read_bytes())
    bad = tmp_path / "cut.gz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=r"cut\.gz: cannot (read|decompress) \(gzip\)"):
        summarize(bad)


def test_window_and_sample(tmp_path):
    # 10 min at 1 req/s, then a 2-minute burst at 10 req/s, then 10 min at 1 req/s.
    ts = (
        list(np.arange(0, 600, 1.0)) + list(600 + np.arange(0, 120, 0.1)) + list(720 + np.arange(0, 600, 1.0))
    )
    path = write_lines(tmp_path / "w.jsonl", [{"t": round(t, 3), "in": 10, "out": 2} for t in ts])
    s = summarize(path, window_minutes=2)
    assert 600 - 1 <= s.selection["window_start_s"] <= 600 + 1
    assert s.n_requests == pytest.approx(1200, abs=12)
    assert s.rate_rps == pytest.approx(10, rel=0.05)
    assert s.selection["whole_trace_requests"] == len(ts)
    half = summarize(path, sample=0.5)
    assert half.n_requests == pytest.approx(len(ts) / 2, rel=0.1)
    assert summarize(path, sample=0.5).to_dict() == half.to_dict()  # repeatable
    with pytest.raises(TraceError, match="sample must be"):
        summarize(path, sample=1.5)


def test_context_spread_is_seeded_and_behaves(tmp_path):
    uniform = write_lines(tmp_path / "u.jsonl", [{"t": i, "in": 1000, "out": 1} for i in range(200)])
    s = summarize(uniform, concurrency=32)
    assert s.ctx_cv == pytest.approx(0.0) and s.ctx_max_over_median == pytest.approx(1.0)
    mixed = write_lines(
        tmp_path / "m.jsonl", [{"t": i, "in": 100 if i % 2 else 100_000, "out": 1} for i in range(200)]
    )
    m = summarize(mixed, concurrency=32)
    assert m.ctx_cv > 0.8 and m.ctx_max_over_median >= 1.0
    assert m.context_spread(32) == (m.ctx_cv, m.ctx_max_over_median)
    again = TraceSummary.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again.context_spread(8) == m.context_spread(8)


def test_implied_concurrency(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [{"t": i * 0.5, "in": 1, "out": 1} for i in range(101)])
    s = summarize(path)
    assert s.rate_rps == pytest.approx(2.0)
    assert s.implied_concurrency(3.0) == pytest.approx(6.0)


def test_example_agentic_trace_is_long_context_and_growing():
    s = summarize(EXAMPLES / "agentic_coding.jsonl")
    assert s.format == "mooncake" and s.n_requests > 300
    assert 32768 <= s.isl["p99"] <= 131072 * 1.01
    assert s.isl["p50"] < 0.5 * s.isl["p99"]
    assert s.prefix_reuse > 0.5
    assert (EXAMPLES / "agentic_coding.jsonl").stat().st_size < 400 * 1024


def test_cli_summarize_json_and_table(tmp_path, mooncake):
    path = mooncake[0]
    runner = CliRunner()
    res = runner.invoke(trace, ["summarize", str(path), "--json", "--no-store", "--latency", "2"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["n_requests"] == len(mooncake[1])
    assert data["implied_concurrency"]["concurrency"] == pytest.approx(2 * data["rate_rps"])
    res = runner.invoke(trace, ["summarize", str(path), "--no-store", "--window", "1"])
    assert res.exit_code == 0, res.output
    assert "burstiness" in res.output and "busiest 1 min" in res.output and "█" in res.output


def test_cli_bad_input_exit_code(tmp_path):
    path = write_lines(
        tmp_path / "bad.jsonl", ['{"t": 0, "in": 5, "out": 3}', '{"t": 1, "in": -5, "out": 3}']
    )
    res = CliRunner().invoke(trace, ["summarize", str(path), "--no-store"])
    assert res.exit_code != 0
    assert f"{path}:2: negative length" in res.output
    res = CliRunner().invoke(trace, ["summarize", str(path), "--no-store", "--skip-bad", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["n_bad"] == 1


def test_cli_convert_to_canonical(tmp_path, mooncake):
    path = mooncake[0]
    out = tmp_path / "out.jsonl.gz"
    res = CliRunner().invoke(trace, ["convert", str(path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert summarize(out).format == "canonical"
    assert_same(comparable(summarize(path)), comparable(summarize(out)))


def test_cli_convert_failure_leaves_no_file(tmp_path):
    path = write_lines(
        tmp_path / "bad.jsonl", ['{"t": 0, "in": 5, "out": 3}', '{"t": 1, "in": -5, "out": 3}']
    )
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(trace, ["convert", str(path), "-o", str(out)])
    assert res.exit_code != 0 and "bad.jsonl:2" in res.output
    assert not out.exists() and list(tmp_path.iterdir()) == [path]


def test_cli_stores_summary_in_a_real_knowledge_base(tmp_path, mooncake):
    from hpc_advise.knowledge_base.store import KnowledgeBase

    path = mooncake[0]
    db = tmp_path / "kb.db"
    for _ in range(2):
        res = CliRunner().invoke(trace, ["summarize", str(path), "--db", str(db), "--json"])
        assert res.exit_code == 0, res.output
        assert f"in {db}" in res.stderr
    rows = KnowledgeBase(db).traces()
    assert [r["source"] for r in rows] == [str(path.resolve())]  # the same summary is stored once
    assert rows[0]["summary"] == json.loads(res.stdout)
    assert TraceSummary.from_dict(rows[0]["summary"]).n_requests == len(mooncake[1])
    res = CliRunner().invoke(trace, ["summarize", str(path), "--db", str(db), "--no-store", "--window", "1"])
    assert res.exit_code == 0 and len(KnowledgeBase(db).traces()) == 1


def test_cli_stdin_window_and_formats(tmp_path):
    ts = list(range(300)) + [300 + k * 0.1 for k in range(600)] + [360 + k for k in range(300)]
    lines = "".join(json.dumps({"t": round(t, 3), "in": 5, "out": 1}) + "\n" for t in ts)
    res = CliRunner().invoke(
        trace, ["summarize", "-", "--window", "0.5", "--json", "--no-store"], input=lines
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["source"] == "<stdin>" and data["selection"]["window_minutes"] == 0.5
    assert data["rate_rps"] == pytest.approx(10, rel=0.05)
    res = CliRunner().invoke(trace, ["formats"])
    assert res.exit_code == 0 and "mooncake" in res.output and "sglang-bench" in res.output


def test_example_generator_reproduces_the_shipped_traces(tmp_path):
    import subprocess

    out = tmp_path / "gen"
    # this tree's package, not whichever hpc_advise the interpreter has installed
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parents[1])}
    subprocess.run(
        [sys.executable, str(EXAMPLES / "generate.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        env=env,
    )
    for name in ("agentic_coding.jsonl", "chat_uniform.csv", "bursty.csv"):
        fresh, shipped = summarize(out / name), summarize(EXAMPLES / name)
        assert fresh.format == shipped.format
        # Same seeds; tolerances only absorb a numpy release changing its random streams.
        assert fresh.n_requests == pytest.approx(shipped.n_requests, rel=0.15)
        assert fresh.isl["p50"] == pytest.approx(shipped.isl["p50"], rel=0.25)
        assert fresh.osl["p50"] == pytest.approx(shipped.osl["p50"], rel=0.25)
        assert (EXAMPLES / name).stat().st_size < 300 * 1024
    bursty, chat = summarize(EXAMPLES / "bursty.csv"), summarize(EXAMPLES / "chat_uniform.csv")
    assert bursty.burstiness_cv > 1.5 > 1.2 > chat.burstiness_cv > 0.8
    assert bursty.n_failed > 0 and chat.n_failed == 0


def test_read_trace_is_an_iterator(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [{"t": i, "in": i + 1, "out": 1} for i in range(3)])
    reader = read_trace(path)
    assert next(reader).input_len == 1
    assert [r.input_len for r in reader] == [2, 3]
    assert list(reader) == []
    reader = read_trace(path)
    reader.close()
    with pytest.raises(TraceError, match="consumed"):
        next(reader)


def test_trace_error_survives_pickling():
    import pickle

    err = pickle.loads(pickle.dumps(TraceError("bad thing", "f.jsonl", 7)))
    assert str(err) == "f.jsonl:7: bad thing" and (err.reason, err.path, err.line) == (
        "bad thing",
        "f.jsonl",
        7,
    )


def test_cli_convert_to_mooncake_says_what_it_drops(tmp_path):
    path = write_lines(
        tmp_path / "c.jsonl", [{"t": 0, "in": 5, "out": 1}, {"t": 1, "in": 9, "out": 0, "failed": True}]
    )
    out = tmp_path / "m.jsonl"
    res = CliRunner().invoke(trace, ["convert", str(path), "--to", "mooncake", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "1 failed requests left out (mooncake cannot mark failures)" in res.stderr
    assert summarize(out).n_requests == 1
