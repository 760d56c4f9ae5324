"""``--ship``: copy a bench's jsonl table into the package (hpc_advise/advisor/data/kernel_results/).

The advisor reads only package data, never benchmarks/results/; a bench's rows reach it only through
this explicit step. The shipped file must stay byte-equal to the committed table of the same name in
benchmarks/results/ (tests/advisor/test_shipped_data.py), so commit both together.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "hpc_advise" / "advisor" / "data" / "kernel_results"


def ship(jsonl: Path, dest: Path = SHIPPED) -> Path:
    """Copy ``jsonl`` to ``dest`` under its own name; returns the copy's path."""
    if jsonl.suffix != ".jsonl" or not jsonl.is_file():
        raise SystemExit(f"--ship: no jsonl table at {jsonl}")
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / jsonl.name
    shutil.copyfile(jsonl, target)
    return target
