"""Property tests (hypothesis): a trace written in any writable format and read back gives the same
summary as the same requests in canonical JSONL; ``trace convert`` preserves the summary."""

from __future__ import annotations

import tempfile
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc_advise.advisor.traces import Request, summarize
from hpc_advise.advisor.traces.cli import trace
from hpc_advise.advisor.traces.writers import WRITERS
from tests.advisor.traces.helpers import assert_same, comparable

# What each format can carry: failures, cached tokens, prefix hashes (and their block size).
CARRIES = {
    "canonical": {"failed": True, "cached": True, "hash": 512},
    "mooncake": {"failed": False, "cached": False, "hash": 512},
    "bailian": {"failed": False, "cached": False, "hash": 16},
    "azure": {"failed": False, "cached": False, "hash": None},
    "burstgpt": {"failed": True, "cached": False, "hash": None},
    "openai": {"failed": True, "cached": True, "hash": None},
}


@st.composite
def traces(draw, fmt: str):
    can = CARRIES[fmt]
    n = draw(st.integers(1, 40))
    t = draw(st.integers(0, 10**8)) / 1000.0  # ms grid (Mooncake keeps whole ms)
    reqs = []
    for _ in range(n):
        t += draw(st.integers(0, 600_000)) / 1000.0
        n_in = draw(st.one_of(st.integers(0, 3000), st.integers(0, 2_000_000)))
        failed = can["failed"] and draw(st.booleans())
        # BurstGPT marks failures by 0 response tokens, so completed requests there produce >= 1.
        n_out = 0 if failed else draw(st.integers(1 if fmt == "burstgpt" else 0, 50_000))
        cached = draw(st.integers(0, n_in)) if can["cached"] and draw(st.booleans()) else None
        hash_ids = None
        if can["hash"]:
            hash_ids = draw(st.lists(st.integers(0, 50), min_size=1, max_size=8))
        reqs.append(Request(t, n_in, n_out, cached, failed, hash_ids, can["hash"] if hash_ids else None))
    return reqs


def _write(path: Path, fmt: str, reqs) -> Path:
    with path.open("w") as fh:
        fh.writelines(WRITERS[fmt](reqs))
    return path


def _check(fmt: str, reqs) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ref = summarize(_write(Path(tmp) / "ref.jsonl", "canonical", reqs))
        got = summarize(_write(Path(tmp) / f"trace.{fmt}", fmt, reqs))
        assert got.format == fmt
        assert_same(comparable(got), comparable(ref), rel=1e-6)


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(traces("mooncake"))
def test_mooncake_roundtrip(reqs):
    _check("mooncake", reqs)


@SETTINGS
@given(traces("bailian"))
def test_bailian_roundtrip(reqs):
    _check("bailian", reqs)


@SETTINGS
@given(traces("azure"))
def test_azure_roundtrip(reqs):
    _check("azure", reqs)


@SETTINGS
@given(traces("burstgpt"))
def test_burstgpt_roundtrip(reqs):
    _check("burstgpt", reqs)


@SETTINGS
@given(traces("openai"))
def test_openai_roundtrip(reqs):
    _check("openai", reqs)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(CARRIES)).flatmap(lambda f: st.tuples(st.just(f), traces(f))))
def test_convert_preserves_summary(case):
    fmt, reqs = case
    with tempfile.TemporaryDirectory() as tmp:
        src = _write(Path(tmp) / f"in.{fmt}", fmt, reqs)
        out = Path(tmp) / "out.jsonl"
        res = CliRunner().invoke(trace, ["convert", str(src), "-o", str(out)])
        assert res.exit_code == 0, res.output
        assert_same(comparable(summarize(out)), comparable(summarize(src)), rel=1e-6)
