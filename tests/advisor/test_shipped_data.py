"""Data shipped inside the package (for installs without a checkout): the kernel tables must be the
committed benchmark results, byte for byte, so an installed advisor and one run from the checkout
agree; the shipped fits (serving model, attention model) must be what a fresh fit of the shipped data
gives today, so they cannot go stale (``HPC_ADVISE_WRITE_GOLDENS=1`` rewrites them)."""

import json
import math
import os
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_shipped_kernel_tables_equal_the_committed_results():
    shipped = resources.files("hpc_advise.advisor.data").joinpath("kernel_results")
    tables = [e for e in shipped.iterdir() if e.name.endswith(".jsonl")]
    if not RESULTS.is_dir():
        pytest.skip("no benchmarks/results in this tree (installed package)")
    assert tables, "no shipped kernel tables"
    for entry in tables:
        committed = RESULTS / entry.name
        assert committed.is_file(), f"{entry.name} is shipped but not under benchmarks/results"
        assert entry.read_bytes() == committed.read_bytes(), (
            f"hpc_advise/advisor/data/kernel_results/{entry.name} differs from benchmarks/results/{entry.name}: "
            "copy the new table into the package"
        )


# ----- fits shipped as package data: each must be what a fresh fit of the shipped data gives ---------

DATA = Path(__file__).resolve().parents[2] / "hpc_advise" / "advisor" / "data"
WRITE = os.environ.get("HPC_ADVISE_WRITE_GOLDENS") == "1"
REWRITE = "HPC_ADVISE_WRITE_GOLDENS=1 python -m pytest tests/advisor/test_shipped_data.py rewrites it"
# Floats of a shipped fit against a fresh one: the last bits of a least-squares solve may depend on the
# BLAS kernels of the CPU; a change of data, settings or code moves them by far more than this.
FIT_RTOL = 1e-9


def _differences(a, b, where: str = "") -> list[str]:
    """Where two nested structures (dicts, lists, arrays, numbers, strings) differ; floats within
    FIT_RTOL, everything else exactly."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(set(a) ^ set(b))} on one side only"]
        return [d for k in a for d in _differences(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind == "U":
            return _differences(json.loads(str(a[()])), json.loads(str(b[()])), where)
        if a.shape != b.shape or a.dtype != b.dtype:
            return [f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"]
        if a.dtype.kind == "f":
            ok = np.allclose(a, b, rtol=FIT_RTOL, atol=0.0, equal_nan=True)
        else:
            ok = np.array_equal(a, b)
        return [] if ok else [f"{where}: {int((a != b).sum())} of {a.size} values differ"]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{where}: {len(a)} vs {len(b)} items"]
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{where}[{i}]")
        ]
    if isinstance(a, float) or isinstance(b, float):
        ok = (
            isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b, rel_tol=FIT_RTOL)
        )
        return [] if ok else [f"{where}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def refresh_shipped_fits() -> None:
    """Rewrite both shipped fits from fresh fits (what ``HPC_ADVISE_WRITE_GOLDENS=1`` does, here and
    before the advisor goldens are recorded, so those are never recorded from a stale fit)."""
    from hpc_advise.advisor import kernel_models as km
    from hpc_advise.advisor import serving_model as pm

    pm.write_shipped(pm.fit_shipped_data(), DATA / pm.SHIPPED_MODEL)
    rows = km.seed_rows() + km.shipped_rows()
    text = km.fit_to_json(km.fit_attention(rows), rows)
    if (DATA / km.SHIPPED_FIT).read_text(encoding="utf-8") != text:
        (DATA / km.SHIPPED_FIT).write_text(text, encoding="utf-8")


def test_shipped_serving_model_is_a_fresh_fit_of_the_shipped_data():
    from hpc_advise.advisor import serving_model as pm

    fresh = pm.fit_shipped_data()
    if WRITE:
        pm.write_shipped(fresh, DATA / pm.SHIPPED_MODEL)
    shipped, where = pm.load_shipped()
    assert shipped is not None, f"{where} is unreadable or was fitted on other data or settings: {REWRITE}"
    diff = _differences(shipped.to_arrays(), fresh.to_arrays())
    assert not diff, f"{where} is not today's fit ({'; '.join(diff[:5])}): {REWRITE}"


def test_shipped_attention_model_is_a_fresh_fit_of_the_shipped_rows():
    import dataclasses

    from hpc_advise.advisor import kernel_models as km

    rows = km.seed_rows() + km.shipped_rows()
    fresh = km.fit_attention(rows)
    where = DATA / km.SHIPPED_FIT
    if WRITE and where.read_text(encoding="utf-8") != km.fit_to_json(fresh, rows):
        where.write_text(km.fit_to_json(fresh, rows), encoding="utf-8")
    shipped = km.shipped_fit(rows)
    assert shipped is not None, f"{where} is unreadable or was fitted on other rows: {REWRITE}"
    diff = _differences(dataclasses.asdict(shipped), dataclasses.asdict(fresh))
    assert not diff, f"{where} is not today's fit ({'; '.join(diff[:5])}): {REWRITE}"
    served = km.load_attention_model(None)  # no KB file: the shipped fit serves, layer steps attached
    assert dataclasses.replace(served, layer=None, moe=None) == shipped
    assert served.layer is not None and served.moe is not None


def test_differences_sees_what_a_stale_fit_would_change():
    a = {"x": np.array([1.0, 2.0]), "n": np.array([1, 2]), "m": np.array('{"t": [0.5, 1]}'), "s": "k"}
    assert _differences(a, dict(a)) == []
    assert _differences(a, dict(a, x=np.array([1.0, 2.0 * (1 + 1e-12)]))) == []
    assert _differences(a, dict(a, x=np.array([1.0, 2.0001])))
    assert _differences(a, dict(a, n=np.array([1, 3])))
    assert _differences(a, dict(a, m=np.array('{"t": [0.5, 1.01]}')))
    assert _differences(a, dict(a, s="j")) and _differences(a, {"x": a["x"]})
