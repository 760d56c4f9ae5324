"""bench without a server: prompt lengths and shared prefixes, bootstrap intervals, A/B verdicts on
synthetic results, consistency arithmetic, validate's rows, NVML sampling through the fake NVML."""

from __future__ import annotations

import math
from array import array

import numpy as np
import pytest

from hpc_advise.advisor.bench import consistency, stats
from hpc_advise.advisor.bench import validate as V
from hpc_advise.advisor.bench.client import Result
from hpc_advise.advisor.bench.gpu import GpuSampler, is_local
from hpc_advise.advisor.bench.prompts import PromptBuilder, TokenizerUnavailable, load_tokenizer
from tests.advisor.nvml_fake import FakeGpu, FakeNvml


def tiny_tokenizer(tmp_path) -> str:
    """A 60-word WordLevel tokenizer.json with one special token, made offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0} | {f"w{i}": i + 1 for i in range(59)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["[UNK]"])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_exact_prompts_have_the_length_and_share_prefix_blocks(tmp_path):
    ids, desc = load_tokenizer(tiny_tokenizer(tmp_path))
    assert 0 not in ids and len(ids) == 59 and desc.startswith("tokenizers:")
    b = PromptBuilder(ids, seed=3)
    p1 = b.prompt(0, 40, hash_ids=[7, 8], block_size=16)
    p2 = b.prompt(1, 37, hash_ids=[7, 8, 9], block_size=16)
    p3 = b.prompt(2, 40, hash_ids=[5], block_size=16)
    assert len(p1) == 40 and len(p2) == 37 and all(isinstance(x, int) for x in p1)
    assert p1[:32] == p2[:32]  # blocks 7 and 8 are the same tokens in both requests
    assert p1[32:] != p2[32:37]  # the rest is the request's own
    assert p3[:16] != p1[:16]
    assert PromptBuilder(ids, seed=3).prompt(0, 40, [7, 8], 16) == p1  # seeded: same run, same prompts


def test_approximate_prompts_count_words():
    b = PromptBuilder(None)
    assert not b.exact
    assert len(b.prompt(0, 123).split()) == 123


def test_unloadable_tokenizer_says_what_was_tried():
    with pytest.raises(TokenizerUnavailable, match="not a local path and not in the Hugging Face cache"):
        load_tokenizer("nobody/nothing-here")


def _results(values_s, n_out=9, itl_s=0.02, start=0):
    out = []
    for i, v in enumerate(values_s):
        r = Result(start + i, 0, 0.0)
        r.ttft, r.n_out, r.n_in = v, n_out, 10
        r.itl = array("d", [itl_s] * (n_out - 1))
        r.e2e = v + itl_s * (n_out - 1)
        out.append(r)
    return out


def test_bootstrap_interval_covers_the_percentile_and_is_seeded():
    rng = np.random.default_rng(1)
    v = rng.exponential(1.0, 2000)
    lo, hi = stats.bootstrap(v, stats.pct_stat(50), seed=5)
    assert lo < math.log(2) < hi and hi - lo < 0.15
    assert stats.bootstrap(v, stats.pct_stat(50), seed=5) == (lo, hi)


def test_summary_counts_failures_goodput_and_throughput():
    res = _results([0.1] * 8 + [0.5] * 2)
    bad = Result(99, 0, 0.0)
    bad.error = "http_500"
    skipped = Result(100, 0, 0.0)
    skipped.error = "too_long"
    s = stats.summarize(res + [bad, skipped], duration_s=2.0, slo_ttft_ms=200)
    assert s["completed"] == 10 and s["failed"] == 1 and s["skipped_too_long"] == 1
    assert s["failures"] == {"http_500": 1, "too_long": 1}
    assert s["good_requests"] == 8 and s["request_goodput"] == 4.0
    assert s["output_throughput"] == 45.0
    assert s["tpot_ms"]["median"] == pytest.approx(20.0)


def test_ab_finds_a_10_percent_difference_and_none_between_equal_samples():
    rng = np.random.default_rng(0)
    base = 0.2 + 0.01 * rng.standard_normal(300)
    same = 0.2 + 0.01 * rng.standard_normal(300)
    a, b, c = _results(base * 1.1), _results(base), _results(same)
    rows = {r["metric"]: r for r in stats.compare(a, b, 1.0, 1.0)}
    assert rows["median_ttft_ms"]["verdict"] == "a_higher"
    assert rows["median_ttft_ms"]["relative"] == pytest.approx(0.10, abs=0.01)
    lo, hi = rows["median_ttft_ms"]["ci"]
    assert lo > 0
    rows = {r["metric"]: r for r in stats.compare(c, b, 1.0, 1.0)}
    assert all(r["verdict"] in ("same", "info") for r in rows.values())


def test_agreement_and_kl():
    assert consistency.agreement([1, 2, 3, 4], [1, 2, 9, 4]) == (0.75, 2)
    assert consistency.agreement([1, 2], [1, 2]) == (1.0, None)
    assert consistency.agreement([1, 2], [1, 2, 3]) == (1.0, 2)
    p = {1: math.log(0.6), 2: math.log(0.3)}
    assert consistency.kl_top(p, p) == pytest.approx(0.0, abs=1e-12)
    q = {1: math.log(0.3), 2: math.log(0.6)}
    expect = 0.6 * math.log(2) + 0.3 * math.log(0.5)  # the rest buckets are equal (0.1 each)
    assert consistency.kl_top(p, q) == pytest.approx(expect)


def _rec(ttft50=100.0, tpot50=20.0):
    return {"id": 4, "inputs": {"gpus": 1, "trace": "t.jsonl"},
            "outputs": {"top": {"config": "TP1", "candidate": {"tp": 1, "replicas": 1},
                                "ttft_ms": {"p50": ttft50, "p99": 300.0}, "tpot_ms": {"p50": tpot50, "p99": 25.0},
                                "output_tok_s_per_gpu": 500.0, "request_latency_ms": 300.0}}}  # fmt: skip


def test_validate_rows_errors_and_terms():
    run = {"id": 9, "config": {"trace": "t.jsonl"},
           "metrics": {"median_ttft_ms": 100.0, "p99_ttft_ms": 200.0, "median_tpot_ms": 10.0, "p99_tpot_ms": 12.0,
                       "output_throughput": 500.0, "mean_e2e_latency_ms": 300.0}}  # fmt: skip
    out = V.compare(_rec(), run)
    rows = {r["metric"]: r for r in out["rows"]}
    assert rows["ttft_p50"]["error"] == 0.0 and rows["ttft_p50"]["points_at"] is None
    assert rows["ttft_p99"]["error"] == pytest.approx(0.5)
    assert rows["ttft_p99"]["points_at"].startswith("queueing")  # p50 right, tail wrong
    assert rows["tpot_p50"]["error"] == pytest.approx(1.0) and rows["tpot_p50"]["points_at"].startswith(
        "decode"
    )
    assert rows["tpot_p99"]["points_at"].startswith("the p50 miss")
    assert rows["output_tok_s_per_gpu"]["error"] == 0.0
    with pytest.raises(V.ValidateError, match="no ranked configuration"):
        V.compare({"id": 1, "outputs": {}}, run)


class _UtilNvml(FakeNvml):
    def nvmlDeviceGetUtilizationRates(self, h):
        from types import SimpleNamespace

        return SimpleNamespace(gpu=40 + 20 * h, memory=10)


def test_gpu_sampler_through_the_fake_nvml():
    g = GpuSampler(_UtilNvml([FakeGpu(), FakeGpu()]))
    assert g.open()
    g.sample()
    g.sample()
    r = g.result()
    assert r["gpus"] == 2 and r["samples"] == 2 and r["gpu"] == "NVIDIA H200"
    assert r["mean_gpu_utilization_pct"] == 50.0
    assert r["max_gpu_memory_used_gib"] == pytest.approx(2 * 771 / 1024)
    none = GpuSampler(_UtilNvml([]))
    assert not none.open() and "no GPU" in none.result()["reason"]
    assert is_local("http://127.0.0.1:30000") and is_local("http://localhost:1")
