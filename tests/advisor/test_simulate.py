"""The SGLang replica simulator against hand-computed schedules, and its properties."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_advise.advisor.simulate import (
    LinearStepCost,
    SchedulerConfig,
    Workload,
    WorkloadError,
    default_chunked_prefill_size,
    default_max_running_requests,
    percentile,
    select_windows,
    simulate,
)
from hpc_advise.advisor.simulate.radix import BlockRadixCache
from hpc_advise.advisor.simulate.replicas import simulate_replicas, split_replicas
from hpc_advise.advisor.simulate.search import capacity_search
from tests.advisor.sim_fixtures import agentic_workload, poisson_workload, req, workload

# 1 ms per prefill token, 10 ms per decode step: every time below is a sum of these.
COST = LinearStepCost(per_token_s=1e-3, decode_fixed_s=0.01)
BIG = SchedulerConfig(max_total_tokens=1_000_000)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "traces"


def test_one_request():
    r = simulate(workload([req(0.0, 100, 5)]), COST, BIG)
    assert r.ttft_s[0] == pytest.approx(0.100)  # 100 prompt tokens
    assert r.e2e_s[0] == pytest.approx(0.140)  # + 4 decode steps
    assert r.tpot_s[0] == pytest.approx(0.010)
    assert r.queue_s[0] == 0.0
    assert r.prefill_steps == 1 and r.decode_steps == 4
    assert np.allclose(r.itl_s, 0.010) and r.itl_weight.sum() == 4


def test_two_requests_in_one_prefill_batch():
    r = simulate(workload([req(0.0, 100, 3), req(0.0, 100, 3)]), COST, BIG)
    assert np.allclose(r.ttft_s, 0.200)  # one extend pass of 200 tokens
    assert np.allclose(r.e2e_s, 0.220)  # then two decode steps of both
    assert r.prefill_steps == 1 and r.decode_steps == 2


def test_prefill_runs_before_decode():
    # The second request arrives during the first one's prefill; its prefill runs next, and the
    # first request's decode waits for it (no mixed chunk by default).
    r = simulate(workload([req(0.0, 100, 3), req(0.05, 100, 3)]), COST, BIG)
    assert r.ttft_s.tolist() == pytest.approx([0.100, 0.150])
    assert r.e2e_s.tolist() == pytest.approx([0.220, 0.170])
    assert r.tpot_s[0] == pytest.approx((0.220 - 0.100) / 2)
    assert r.queue_s[1] == pytest.approx(0.05)


def test_mixed_chunk_decodes_during_prefill():
    cfg = SchedulerConfig(max_total_tokens=1_000_000, enable_mixed_chunk=True)
    r = simulate(workload([req(0.0, 100, 3), req(0.05, 100, 3)]), COST, cfg)
    # At 0.1 the second prefill (100 tokens) carries the first request's decode (1 token): 0.101 s.
    assert r.ttft_s.tolist() == pytest.approx([0.100, 0.201 - 0.05])
    assert r.e2e_s[0] == pytest.approx(0.211)  # its 2nd token at 0.201, 3rd in a decode step


def test_kv_budget_queues_the_second_request():
    # Each request reserves prompt + max_new = 150 tokens; a pool of 260 admits one at a time.
    cfg = SchedulerConfig(max_total_tokens=260)
    r = simulate(workload([req(0.0, 100, 50), req(0.0, 100, 50)]), COST, cfg)
    assert r.ttft_s[0] == pytest.approx(0.100)
    assert r.e2e_s[0] == pytest.approx(0.590)
    assert r.queue_s[1] == pytest.approx(0.590)  # waits for the first one to finish
    assert r.ttft_s[1] == pytest.approx(0.690)
    assert r.e2e_s[1] == pytest.approx(1.180)
    assert r.retractions == 0


def test_max_running_requests_queues():
    cfg = SchedulerConfig(max_total_tokens=1_000_000, max_running_requests=1)
    r = simulate(workload([req(0.0, 100, 3), req(0.0, 100, 3)]), COST, cfg)
    assert r.ttft_s.tolist() == pytest.approx([0.100, 0.120 + 0.100])


def test_cache_hit_means_less_prefill():
    # 16-token blocks; the second request shares 3 of its 4 blocks with the first, finished one.
    a = req(0.0, 64, 2, hashes=[1, 2, 3, 4], block=16)
    b = req(1.0, 64, 2, hashes=[1, 2, 3, 5], block=16)
    c = req(2.0, 64, 2, hashes=[1, 2, 3, 4], block=16)
    r = simulate(workload([a, b, c]), COST, BIG)
    assert r.ttft_s.tolist() == pytest.approx([0.064, 0.016, 0.001])  # all but 63 tokens cached
    assert r.cached_tokens.tolist() == [0, 48, 63]
    assert r.summary()["cache_hit_rate"] == pytest.approx((48 + 63) / 192)


def test_cached_tokens_without_hashes():
    r = simulate(workload([req(0.0, 100, 2, cached=60)]), COST, BIG)
    assert r.ttft_s[0] == pytest.approx(0.040)
    cfg = SchedulerConfig(max_total_tokens=1_000_000, radix_cache=False)
    assert simulate(workload([req(0.0, 100, 2, cached=60)]), COST, cfg).ttft_s[0] == pytest.approx(0.100)


def test_shared_prefix_stored_once_while_running():
    # Two concurrent requests with the same 4-block prompt: the second matches the first one's
    # blocks, inserted when its prefill ended, so the prompt's KV is held once.
    a = req(0.0, 64, 40, hashes=[1, 2, 3, 4], block=16)
    b = req(0.1, 64, 40, hashes=[1, 2, 3, 4], block=16)
    r = simulate(workload([a, b]), COST, BIG)
    assert r.cached_tokens.tolist() == [0, 63]
    # Peak: one prompt (64) + both requests' output KV (39 + 36 tokens at most).
    assert r.kv_used_peak <= 64 + 39 + 39


def test_retraction():
    # Pool 200; A (10 + 100) is admitted, B arrives at 0.045 and is admitted at 0.05 on the decayed
    # ratio (0.696 * 95 reserved for A); decode runs out of slots after 88 steps of both and B
    # (fewest outputs) is retracted; its re-prefill waits for A to finish.
    cfg = SchedulerConfig(max_total_tokens=200)
    r = simulate(workload([req(0.0, 10, 100), req(0.045, 10, 100)]), COST, cfg)
    assert r.retractions == 1
    assert r.e2e_s[0] == pytest.approx(1.010)
    assert r.ttft_s[1] == pytest.approx(0.060 - 0.045)
    # B re-prefills its prompt + 89 outputs when A is gone, then decodes its last 10 tokens.
    assert r.e2e_s[1] == pytest.approx(1.010 + 0.099 + 0.100 - 0.045)
    assert r.finished.all()
    assert percentile(r.itl_s, 100, r.itl_weight) == pytest.approx(1.010 + 0.099 - 0.94)


def test_chunked_prefill_stalls_decode():
    cfg = SchedulerConfig(max_total_tokens=1_000_000, chunked_prefill_size=8192)
    r = simulate(workload([req(0.0, 10, 20), req(0.05, 20000, 2)]), COST, cfg)
    assert r.ttft_s[1] == pytest.approx(20.0)  # chunks of 8.192 + 8.192 + 3.616 s
    assert r.prefill_steps == 1 + 3  # 8192 + 8192 + 3616
    # The short request's decode waits for all three chunks: one gap of 20 s.
    assert percentile(r.itl_s, 100, r.itl_weight) == pytest.approx(20.0, abs=0.02)


def test_rejects_a_request_larger_than_the_pool():
    r = simulate(workload([req(0.0, 500, 10), req(0.0, 10, 2)]), COST, SchedulerConfig(max_total_tokens=400))
    assert r.rejected.tolist() == [True, False]
    assert r.finished.tolist() == [False, True]
    assert not r.meets(slo_ttft_s=10.0)


def test_horizon_leaves_requests_unfinished():
    r = simulate(workload([req(0.0, 100, 1000)]), COST, BIG, horizon_s=1.0)
    assert not r.finished[0] and math.isinf(r.e2e_s[0])
    assert r.summary()["unfinished"] == 1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(2, 60), min_size=1, max_size=12), st.floats(1e-4, 1e-2))
def test_tpot_equals_the_step_model_without_prefill_or_kv_limit(outs, per_seq):
    # All requests arrive at once, prefill is free and the pool unlimited: request i's TPOT is the
    # mean over its decode steps k = 1..out_i - 1 of decode_s(batch at k).
    cost = LinearStepCost(decode_fixed_s=0.005, per_seq_s=per_seq)
    r = simulate(workload([req(0.0, 50, o) for o in outs]), cost, BIG)
    outs_a = np.asarray(outs)
    for i, o in enumerate(outs):
        steps = [0.005 + per_seq * int((outs_a - 1 >= k).sum()) for k in range(1, o)]
        assert r.tpot_s[i] == pytest.approx(sum(steps) / (o - 1))


def test_latency_monotone_in_load():
    w = poisson_workload(400, rate=4.0, seed=3)
    cost = LinearStepCost(prefill_fixed_s=0.005, per_token_s=2e-5, decode_fixed_s=0.012, per_seq_s=2e-4)
    cfg = SchedulerConfig(max_total_tokens=120_000)
    e2e = [simulate(w, cost, cfg, load=x).summary()["e2e_s"]["mean"] for x in (0.5, 1, 2, 4, 8)]
    assert all(b >= a for a, b in zip(e2e[:-1], e2e[1:], strict=True)), e2e


def test_closed_loop_keeps_n_in_flight():
    w = poisson_workload(200, rate=1.0, seed=5)
    r = simulate(w, COST, BIG, concurrency=8)
    last_send = float(np.max(r.send_s))
    for tau in np.linspace(0.001, last_send - 1e-6, 50):
        assert int(((r.send_s <= tau) & (r.finish_s > tau)).sum()) == 8


def test_measured_window_only():
    w = poisson_workload(100, rate=2.0, seed=1)
    r = simulate(w, COST, BIG, measure_from_s=10.0, measure_until_s=20.0)
    assert r.n_requests == int(((w.arrival_s >= 10) & (w.arrival_s < 20)).sum())


def test_radix_lru_evicts_oldest_unlocked_leaf():
    c = BlockRadixCache(block_size=4)
    a, _, _ = c.insert([1, 2], [0, 4, 8], 2, now=0.0)
    b, _, _ = c.insert([7], [0, 4], 1, now=1.0)
    c.match([1, 2], now=2.0)  # A's path is used again
    assert c.evict(4) == 4
    assert c.match([7], now=3.0) == (0, 0)  # B went first
    c.inc_lock(a)
    assert c.evictable == 0 and c.evict(100) == 0  # locked nodes stay
    c.dec_lock(a, now=4.0)
    assert c.evict(100) == 8 and c.total == 0


def test_radix_splits_where_prompts_diverge():
    c = BlockRadixCache(block_size=4)
    a, covered, added = c.insert([1, 2, 3], [0, 4, 8, 11], 3, now=0.0)
    assert (covered, added, c.total) == (11, 11, 11)
    b, covered, added = c.insert([1, 2, 9], [0, 4, 8, 12], 3, now=1.0)
    assert (covered, added, c.total) == (12, 4, 15)  # blocks 1, 2 stored once
    node, tokens = c.match([1, 2, 5], now=2.0)
    assert tokens == 8 and c.parent[a] == node == c.parent[b]
    c.inc_lock(a)
    assert c.evictable == 4  # only B's own block
    assert c.evict(100) == 4 and c.total == 11


def test_window_selection_finds_the_burst():
    t = np.concatenate([np.arange(0, 3600, 2.0), 1800 + np.arange(0, 300, 0.1)])
    w = workload([req(float(x), 100, 10) for x in np.sort(t)])
    wins = select_windows(
        w.arrival_s, w.input_len + w.output_len, window_s=300, n_samples=2, warmup_s=60, seed=0
    )
    assert wins[0].kind == "busiest" and 1790 <= wins[0].start_s <= 1810
    assert [x.kind for x in wins[1:]] == ["sample", "sample"]
    for s in wins[1:]:
        assert s.end_s <= wins[0].start_s - 60 or s.start_s - 60 >= wins[0].end_s
    idx, start = wins[0].indices(w.arrival_s)
    assert w.arrival_s[idx[0]] >= start - 60 and "busiest window" in wins[0].describe()


def test_replicas_round_robin_and_prefix_affinity():
    w = agentic_workload(300, seed=2, block=512)
    rr = split_replicas(w, 3, policy="round_robin")
    assert sorted(np.concatenate(rr).tolist()) == list(range(len(w)))
    aware = split_replicas(w, 3, policy="prefix")
    assert sorted(np.concatenate(aware).tolist()) == list(range(len(w)))
    cost = LinearStepCost(per_token_s=2e-5, decode_fixed_s=0.01)
    cfg = SchedulerConfig(max_total_tokens=400_000)
    hit_rr = simulate_replicas(w, cost, cfg, 3, policy="round_robin").summary()["cache_hit_rate"]
    hit_px = simulate_replicas(w, cost, cfg, 3, policy="prefix").summary()["cache_hit_rate"]
    assert hit_px > hit_rr


@pytest.mark.parametrize("pool,mixed,page", [(60_000, False, 1), (60_000, True, 1), (150_000, False, 64)])
def test_bookkeeping_under_pressure(pool, mixed, page):
    # Agentic prompts into a small pool: eviction, chunking and retraction all happen; the run
    # checks that the pool never over-commits and that everything is released at the end.
    w = agentic_workload(150, seed=4, block=512, rate=3.0, mean_out=3000)
    w = w.select(np.flatnonzero(w.input_len < pool // 3))
    cfg = SchedulerConfig(
        max_total_tokens=pool, enable_mixed_chunk=mixed, page_size=page, chunked_prefill_size=4096
    )
    cost = LinearStepCost(per_token_s=2e-5, decode_fixed_s=0.01, per_seq_s=1e-4)
    r = simulate(w, cost, cfg)
    assert r.finished.all() and r.retractions > 0
    assert 0 < r.summary()["cache_hit_rate"] < 1


@pytest.mark.parametrize("concurrency", [None, 16])
def test_decode_bursts_change_nothing(concurrency):
    from hpc_advise.advisor.simulate.engine import _Replica

    w = agentic_workload(200, seed=8, rate=2.0, mean_out=800)
    cost = LinearStepCost(per_token_s=2e-5, decode_fixed_s=0.01, per_seq_s=1e-4, per_kv_token_s=1e-9)
    cfg = SchedulerConfig(max_total_tokens=150_000, chunked_prefill_size=4096)
    args = (1.0, concurrency, None, None, None, None)
    fast = _Replica(w, cost, cfg, bursts=True).run(*args)
    slow = _Replica(w, cost, cfg, bursts=False).run(*args)
    assert fast.retractions == slow.retractions and fast.decode_steps == slow.decode_steps
    for name in ("ttft_s", "e2e_s", "itl_s", "itl_weight", "cached_tokens"):
        assert np.allclose(getattr(fast, name), getattr(slow, name), rtol=1e-9, atol=1e-12), name
    assert fast.kv_used_mean == pytest.approx(slow.kv_used_mean) and fast.kv_used_peak == slow.kv_used_peak


def test_replays_of_one_workload_match_fresh_copies():
    # The prompt chains a replay builds are kept on the workload for its next replays (the capacity
    # search replays one window at several loads): every field must come out as from a workload that
    # was never replayed, bit for bit, whatever ran before on it. A pool small enough to evict.
    w = agentic_workload(150, seed=4, block=512, rate=3.0, mean_out=3000)
    w = w.select(np.flatnonzero(w.input_len < 20_000))
    cfg = SchedulerConfig(max_total_tokens=60_000, chunked_prefill_size=4096)
    cost = LinearStepCost(per_token_s=2e-5, decode_fixed_s=0.01, per_seq_s=1e-4, per_kv_token_s=1e-9)
    assert w.prompt_chains() is not None
    for load in (1.0, 2.5, 0.6, 1.0):
        shared = simulate(w, cost, cfg, load=load)
        fresh = simulate(w.select(np.arange(len(w))), cost, cfg, load=load)
        assert shared.retractions == fresh.retractions > 0
        for name, value in vars(fresh).items():
            got = vars(shared)[name]
            if isinstance(value, np.ndarray):
                assert got.dtype == value.dtype and got.tobytes() == value.tobytes(), name
            else:
                assert got == value or (got != got and value != value), name
    assert w.prompt_chains()


def test_replicas_window():
    w = agentic_workload(400, seed=6)
    win = select_windows(w.arrival_s, w.input_len + w.output_len, window_s=20, n_samples=0, warmup_s=10)[0]
    cost = LinearStepCost(per_token_s=1e-5, decode_fixed_s=0.01)
    r = simulate_replicas(w, cost, SchedulerConfig(max_total_tokens=2_000_000), 2, window=win)
    assert r.n_requests == win.n_requests and r.finished.all()


def test_capacity_search_bisects():
    calls = []

    def ok(x):
        calls.append(x)
        return x <= 3.3

    res = capacity_search(ok, lo=0.25, hi=64.0, rel_tol=0.02)
    assert res.load <= 3.3 < res.fail_at and res.fail_at / res.load <= 1.02 + 1e-9
    assert capacity_search(lambda x: False, lo=0.25).load == 0.0
    assert capacity_search(lambda x: True, hi=8.0).fail_at is None


def test_capacity_search_uses_known_loads_and_does_not_repeat_them():
    """A warm start at 2.6 (step 1.5) fails, so does 1.73. A known pass at 1.2 lies within the next step
    down (1.73 / 1.5 = 1.16 .. 1.73): the search goes to it, without evaluating it. One at 1.0 lies below
    that range: the step goes to 1.16 as it would without it. A known point is never evaluated."""
    truth = lambda x: x <= 1.25  # noqa: E731
    for known, third in ((1.2, 1.2), (1.0, 2.6 / 1.5**2)):
        calls = []

        def ok(x, calls=calls):
            calls.append(x)
            return truth(x)

        res = capacity_search(ok, 1 / 64, 64.0, 0.1, 2.6, 1.5, known=((known, True),))
        assert res.load <= 1.25 < res.fail_at and res.fail_at / res.load <= 1.1 + 1e-9
        assert [x for x, _ in res.evaluations[:3]] == pytest.approx([2.6, 2.6 / 1.5, third])
        assert known not in calls


def test_mooncake_example_runs():
    from hpc_advise.advisor.traces import read_trace

    w = Workload.from_requests(read_trace(EXAMPLES / "agentic_coding.jsonl"))
    assert w.block_size == 512 and w.has_hashes
    cost = LinearStepCost(
        prefill_fixed_s=0.01,
        per_token_s=3e-5,
        per_pair_s=1e-10,
        decode_fixed_s=0.015,
        per_seq_s=5e-5,
        per_kv_token_s=2e-9,
    )
    s = simulate(w, cost, SchedulerConfig.for_gpu(141, max_total_tokens=600_000)).summary()
    assert s["finished"] == len(w) and s["cache_hit_rate"] > 0.3
    assert s["ttft_s"]["p99"] >= s["ttft_s"]["p50"] > 0


def test_defaults_from_server_args():
    assert default_chunked_prefill_size(80) == 8192 and default_chunked_prefill_size(141) == 8192
    assert default_chunked_prefill_size(180) == 16384 and default_chunked_prefill_size(40) == 4096
    assert default_max_running_requests(1_000_000, 131072) == 3906
    assert default_max_running_requests(100, 131072) == 50


def test_bad_input_is_one_clear_error():
    with pytest.raises(WorkloadError, match="load factor"):
        simulate(workload([req(0.0, 10, 2)]), COST, BIG, load=0)
    with pytest.raises(WorkloadError, match="at least one token"):
        z = np.zeros(1, dtype=np.int64)
        Workload(np.zeros(1), z + 10, z, z - 1, np.zeros(2, dtype=np.int64), z[:0])
    with pytest.raises(ValueError, match="schedule_policy"):
        SchedulerConfig(max_total_tokens=100, schedule_policy="random")
