"""Helpers shared by the trace tests: comparing two summaries field by field."""

from __future__ import annotations

import math


def assert_same(a, b, path="summary", rel=1e-9):
    """Equal structures; floats equal to ``rel`` (times pass through ms/us roundings)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}", rel)
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]", rel)
    elif isinstance(a, float) and isinstance(b, (int, float)):
        assert math.isclose(a, b, rel_tol=rel, abs_tol=1e-9), f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def comparable(summary) -> dict:
    """``to_dict()`` without the fields that name the file and its format."""
    d = summary.to_dict()
    d.pop("source")
    d.pop("format")
    return d
