"""Load a script of ``benchmarks/`` as a module (they are scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported under ``name`` (registered in ``sys.modules`` so its dataclasses and
    pickles resolve); ``unload_script`` takes it out again."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def unload_script(name: str) -> None:
    sys.modules.pop(name, None)
