"""capacity.search on hand-made pass/fail edges: it needs only an evaluation function of
{candidate: multiple}, no ranker or model."""

from __future__ import annotations

import pytest

from hpc_advise.advisor.capacity import BOUND, RESOLUTION, search


def _edges(edges: dict, calls: list):
    """An evaluation where candidate c passes below ``edges[c]`` = (multiple, condition)."""

    def evaluate(load: dict) -> dict:
        calls.append(dict(load))
        return {c: None if x < edges[c][0] else edges[c][1] for c, x in load.items()}

    return evaluate


def test_search_brackets_each_edge_within_the_resolution():
    edges = {"a": (3.7, "TPOT SLO"), "b": (0.3, "KV memory"), "c": (1e9, "-"), "d": (1e-9, "TTFT SLO")}
    at_one = {"a": None, "b": "KV memory", "c": None, "d": "TTFT SLO"}
    calls: list = []
    found = search(_edges(edges, calls), at_one)
    x, limit, fail_at = found["a"]
    assert x < 3.7 <= fail_at and fail_at / x <= 1 + RESOLUTION and limit == "TPOT SLO"
    x, limit, fail_at = found["b"]  # fails at the trace's load: searched below 1
    assert x < 0.3 <= fail_at <= x * (1 + RESOLUTION) and limit == "KV memory"
    assert found["c"] == (BOUND, "bound", None)  # passes at the bound
    assert found["d"] == (0.0, "TTFT SLO", 1 / BOUND)  # fails even at 1/BOUND
    # every step evaluates the still-open candidates together, once each
    assert all(len(step) == len(set(step)) for step in calls) and set(calls[0]) == set(edges)
    assert len(calls) <= 2 + 12


def test_the_limit_is_the_condition_failing_at_the_first_failing_multiple():
    def evaluate(load):
        return {
            c: (None if x < 2 else "KV memory" if x < 5 else "prefill saturated") for c, x in load.items()
        }

    ((x, limit, fail_at),) = search(evaluate, {"a": None}).values()
    assert limit == "KV memory" and x == pytest.approx(2, rel=RESOLUTION) and fail_at >= 2
