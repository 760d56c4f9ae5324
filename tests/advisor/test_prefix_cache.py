"""Per-candidate prefix reuse (advisor/prefix_cache.py): hand-computed radix replays, the router's
split, OpenAI logs' cached_tokens, and recommend on the agentic example."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from hpc_advise.advisor.cli import recommend
from hpc_advise.advisor.prefix_cache import PrefixReuse, replay_hits
from hpc_advise.advisor.recommend import TraceLoad, reuse_note
from hpc_advise.advisor.traces import summarize
from hpc_advise.advisor.traces.stats import PrefixWindow
from tests.advisor.advisor_helpers import advisor_home  # noqa: F401

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
A, B = [1, 2, 3], [4, 5, 6]


def _args(path: Path, tmp_path: Path) -> list[str]:
    return [
        "--trace",
        str(path),
        "--model",
        "hy3",
        "--gpu",
        "h200",
        "--gpus",
        "8",
        "--db",
        str(tmp_path / "kb.db"),
    ]


def _window(chains: list[list[int]], max_blocks: int = 1 << 16) -> PrefixWindow:
    w = PrefixWindow(max_blocks)
    n = len(chains)
    w.add(
        np.arange(n, dtype=np.float64),
        np.array([512 * len(h) for h in chains]),
        np.full(n, 10),
        np.array([len(h) for h in chains]),
        np.array([x for h in chains for x in h], dtype=np.uint64),
    )
    return w


def test_replay_hand_computed():
    # unlimited: the second A matches all 3 blocks: 3 of 9
    assert replay_hits([A, B, A], math.inf) == (3, 9)
    # a pool of 3 blocks holds one prompt: B evicts A, and the second A misses
    assert replay_hits([A, B, A], 3) == (0, 9)
    # a pool of 5: B evicts A's leaf (the least recently used), the second A misses again
    assert replay_hits([A, B, A], 5) == (0, 9)
    # a shared head is stored once: [1,2,3] and [1,2,7] fit 4 blocks, the third prompt hits all 3
    assert replay_hits([A, [1, 2, 7], A], 4) == (2 + 3, 9)


def test_window_keeps_the_first_requests_up_to_its_bound():
    w = _window([A, B, A, B], max_blocks=7)
    t, n_in, n_out, counts, hashes = w.arrays()
    assert counts.tolist() == [3, 3] and hashes.tolist() == A + B and w.full
    w.add(
        np.zeros(1),
        np.ones(1, dtype=np.int64),
        np.ones(1, dtype=np.int64),
        np.ones(1, dtype=np.int64),
        np.ones(1, dtype=np.uint64),
    )
    assert w.n_blocks == 6  # nothing is added once the bound was reached


def test_small_pool_holds_less_than_unlimited():
    chains = [A, B, A, B, A, B]  # unlimited: 4 of 6 prompts hit, 12 of 18 blocks
    p = PrefixReuse(_window(chains), 512, unlimited=0.75)
    assert p.hit_rate(math.inf, 1) == pytest.approx(12 / 18)
    assert p.reuse(math.inf, 1) == pytest.approx(0.75)  # a pool holding the working set: the trace's figure
    assert p.hit_rate(3 * 512, 1) == 0.0  # one prompt's pool: A and B evict each other
    assert p.reuse(3 * 512, 1) == 0.0
    assert p.reuse(6 * 512, 1) == pytest.approx(0.75)


def test_round_robin_split_lowers_reuse_cache_aware_keeps_it():
    chains = [A, A, B, B, A, A, B, B]
    p = PrefixReuse(_window(chains), 512, unlimited=0.75)
    one = p.hit_rate(math.inf, 1)
    assert one == pytest.approx(18 / 24)  # A, B miss once each
    # the router's cache-aware split sends every A to one replica and every B to the other
    assert p.hit_rate(math.inf, 2) == pytest.approx(one)
    # round robin over two attention-DP groups: each group sees A, B, A, B and misses both once
    assert p.hit_rate(math.inf, 1, 2) == pytest.approx(12 / 24)
    assert p.reuse(math.inf, 1, 2) == pytest.approx(0.75 * 12 / 18)


def test_no_window_means_the_unlimited_figure():
    p = PrefixReuse(None, 512, unlimited=0.6)
    assert not p.replayed and p.reuse(1.0, 4, 2) == 0.6


def _openai_log(path: Path) -> Path:
    lines = []
    for i in range(40):
        usage = {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
        usage["prompt_tokens_details"] = {"cached_tokens": 500 if i % 2 else 270}
        lines.append({"id": f"c{i}", "object": "chat.completion", "created": 1700000000 + i, "usage": usage})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_openai_cached_tokens_are_the_reuse(advisor_home, tmp_path):  # noqa: F811
    path = _openai_log(tmp_path / "log.jsonl")
    s = summarize(path)
    assert s.prefix_reuse is None and s.cached_fraction == pytest.approx(0.385)
    w = TraceLoad.from_summary(s)
    assert w.prefix_reuse == pytest.approx(0.385) and w.prefix_window is None
    assert "cached_tokens" in reuse_note(w)
    args = _args(path, tmp_path)
    res = CliRunner().invoke(recommend, [*args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert "38.5 % of prompt tokens: the trace's cached_tokens" in out["note"]
    assert {round(r["prefix_reuse"], 3) for r in out["ranked"]} == {0.385}


def test_agentic_example_reuse_per_candidate(advisor_home, tmp_path):  # noqa: F811
    path = TRACES / "agentic_coding.jsonl"
    unlimited = summarize(path).prefix_reuse
    args = _args(path, tmp_path)
    res = CliRunner().invoke(recommend, [*args, "--json", "--top", "500"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["ranked"] and out["top"]["config"] == out["ranked"][0]["config"]
    assert "radix caches replayed over the first 615 requests" in out["note"]
    reuse = {r["config"]: r["prefix_reuse"] for r in out["ranked"]}
    assert all(0 < x <= unlimited + 1e-12 for x in reuse.values())
    # attention-DP8 splits a replica's requests round robin over 8 smaller caches: less reuse
    dp = [r for r in out["ranked"] if r["candidate"]["attn_dp"] > 1]
    assert dp and all(r["prefix_reuse"] < unlimited - 0.05 for r in dp)
    for r in out["ranked"]:
        lines = [x for x in r["reasons"] if x.startswith("prefix cache holds")]
        if lines:
            assert f"(unlimited: {100 * unlimited:.0f} %)" in lines[0]
            assert f"holds {100 * r['prefix_reuse']:.0f} %" in lines[0]


def test_small_pools_move_the_reuse_and_say_so(advisor_home, tmp_path, monkeypatch):  # noqa: F811
    """Pools of 100K tokens hold a few of the example's 31K-token prompts: every candidate's reuse
    drops below the unlimited figure, the top rows' reasons say by how much, and it still ranks."""
    from hpc_advise.advisor import recommend as rec

    monkeypatch.setattr(rec.Ranker, "kv_pool_tokens", lambda self, c: 100_000.0)
    path = TRACES / "agentic_coding.jsonl"
    unlimited = summarize(path).prefix_reuse
    args = _args(path, tmp_path)
    res = CliRunner().invoke(recommend, [*args, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    top = out["ranked"][0]
    assert top["prefix_reuse"] < unlimited - 0.1
    where = (
        f"{top['candidate']['replicas']}x TP{top['candidate']['tp']}"
        if top["candidate"]["replicas"] > 1
        else f"TP{top['candidate']['tp']}"
    )
    line = f"prefix cache holds {100 * top['prefix_reuse']:.0f} % of prompt tokens at {where}"
    assert any(x.startswith(line) and f"(unlimited: {100 * unlimited:.0f} %)" in x for x in top["reasons"]), (
        top["reasons"]
    )
