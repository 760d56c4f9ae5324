"""benchmarks/ship.py: a bench's table reaches the package only through --ship."""

from __future__ import annotations

import pytest

from tests.benchmarks.helpers import load_script


def _ship_module():
    return load_script("ship")


def test_ship_copies_the_jsonl_under_its_own_name(tmp_path):
    mod = _ship_module()
    table = tmp_path / "results" / "router_gemm.jsonl"
    table.parent.mkdir()
    table.write_bytes(b'{"kind": "kernel"}\n')
    got = mod.ship(table, tmp_path / "kernel_results")
    assert got == tmp_path / "kernel_results" / "router_gemm.jsonl"
    assert got.read_bytes() == table.read_bytes()


def test_ship_refuses_what_is_no_jsonl_table(tmp_path):
    mod = _ship_module()
    with pytest.raises(SystemExit, match="no jsonl table"):
        mod.ship(tmp_path / "missing.jsonl", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_package_default_is_the_advisor_data_folder():
    mod = _ship_module()
    assert mod.SHIPPED.parts[-4:] == ("hpc_advise", "advisor", "data", "kernel_results")
