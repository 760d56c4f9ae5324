"""CPU tests of benchmarks/tune_fused_moe.py: its candidates are valid configs and its output is what
the op reads back."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import op  # noqa: E402
from tests.benchmarks.helpers import load_script, unload_script  # noqa: E402


@pytest.fixture(scope="module")
def tuner():
    yield load_script("tune_fused_moe")
    unload_script("tune_fused_moe")


def test_tune_output_round_trips_through_config_lookup(tuner, tmp_path, monkeypatch):
    fb = tuner

    for t in fb.TUNE_TS:
        for a2_group in (False, True):
            for c in fb.candidates(t, 8, a2_group):
                op.check_config(dict(c), a2_group)
    best = fb.candidates(16, 8, False)[2]
    path = tmp_path / "configs.json"
    entry = dict(E=192, H=4096, I=192, top_k=8, mode="tensor-static", T=16, config=best, p50_us=1.0)
    fb.write_configs([entry], path, "test-gpu")
    fb.write_configs([dict(entry, T=1)], path, "test-gpu")  # merges, keeps T=16
    assert len(json.loads(path.read_text())["entries"]) == 2
    monkeypatch.setattr(op, "CONFIG_PATH", path)
    op._config_table.cache_clear()
    try:
        assert op.get_config(16, 8, 192, 4096, 192, "tensor-static", False) == best
    finally:
        op._config_table.cache_clear()
