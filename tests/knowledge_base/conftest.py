"""Fixtures for the knowledge-base tests: a fresh real SQLite file per test, fixture paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_advise.knowledge_base.store import KnowledgeBase

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "knowledge_base"
SGLANG_JSONL = FIXTURES / "sglang_bench_serving.jsonl"
SGLANG_BROKEN = FIXTURES / "sglang_bench_serving_broken.jsonl"
VLLM_JSON = FIXTURES / "vllm_bench_serve.json"


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "kb.db"


@pytest.fixture
def kb(db_path):
    store = KnowledgeBase(db_path)
    yield store
    store.close()


def kernel_row(**over) -> dict:
    """A row shaped like ``hpc_advise.runtime.measure.harness.run_row()`` output."""
    row = {
        "kind": "kernel",
        "subject": "decode_attention",
        "provider": "hpc_advise",
        "config": {"batch": 64, "hq": 8, "hkv": 1, "head_dim": 128, "page_size": 64},
        "metric": "latency",
        "unit": "us",
        "p20": 110.0,
        "p50": 113.0,
        "p80": 117.0,
        "gpu": "NVIDIA H200",
        "versions": {"python": "3.12.3", "torch": "2.13.0", "triton": "3.6.0"},
        "git_sha": "abc123def456",
        "command": "python benchmarks/bench_decode_attention.py --grid small",
        "created_at": "2026-11-29T07:00:00+00:00",
    }
    row.update(over)
    return row
