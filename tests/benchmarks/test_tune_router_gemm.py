"""CPU tests of benchmarks/tune_router_gemm.py: its candidates are valid configs, and the table it merges is
what the op reads back."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.router_gemm import configs  # noqa: E402
from hpc_advise.kernels.router_gemm.configs import GEMV_MAX_M, Config, pick_config  # noqa: E402
from tests.benchmarks.helpers import load_script, unload_script  # noqa: E402


@pytest.fixture(scope="module")
def tuner():
    yield load_script("tune_router_gemm")
    unload_script("tune_router_gemm")


def test_candidates_are_valid_configs(tuner):
    for n, k in ((192, 4096), (128, 4096), (256, 7168), (64, 1024)):
        for m in (1, 8, 32, 64, 128, 512, 2048, 8192):
            cands = tuner.candidates(m, n, k, 132)
            assert cands, (n, k, m)
            assert any(c.get("impl") == "gemv" for c in cands) == (m <= GEMV_MAX_M)
            for c in cands:
                Config(**c).validate(k)
                assert Config(**c).serves(m)
                assert tuner._smem_bytes(c, False) <= 200 * 1024


def test_merge_replaces_tuned_buckets_and_use_table_switches_the_op(tuner, tmp_path, monkeypatch):
    monkeypatch.setattr(configs, "CONFIG_FILE", configs.CONFIG_FILE)  # restored after the test
    before = json.loads(configs.CONFIG_FILE.read_text())["entries"]
    new = dict(n=192, k=4096, m_max=1, block_m=1, block_n=2, block_k=2048, split_k=1, num_warps=4)
    new.update(num_stages=1, impl="gemv", us=1.0)
    try:
        out = tuner.merge([new], tmp_path / "c.json")
        after = json.loads(out.read_text())["entries"]
        assert len(after) == len(before) and new in after  # bucket replaced, the others kept
        assert pick_config(1, 192, 4096, 132) != Config(1, 2, 2048, 1, 4, 1, "gemv")  # not switched yet
        tuner.use_table(out)
        assert pick_config(1, 192, 4096, 132) == Config(1, 2, 2048, 1, 4, 1, "gemv")
        assert pick_config(2, 192, 4096, 132).impl == "mma"  # the M <= 8 bucket is untouched
    finally:
        configs._table.cache_clear()


def test_use_table_refuses_a_missing_file(tuner, tmp_path):
    with pytest.raises(SystemExit, match="no file"):
        tuner.use_table(tmp_path / "none.json")
