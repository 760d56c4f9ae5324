"""The kernel tables shipped inside the package (for installs without a checkout) must be the committed
benchmark results, byte for byte, so an installed advisor and one run from the checkout agree."""

from importlib import resources
from pathlib import Path

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
