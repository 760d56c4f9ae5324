"""Goldens of the advisor's user-facing output: ``recommend --json`` for the three example traces x
three models x {no SLO, one SLO pair} and ``trace summarize --json`` for each example trace, plus the
text renderings (recommend with ``--show-excluded``, trace summarize, predict) so moving the rendering
code is checked too. Stored under ``tests/advisor/goldens/`` and compared byte for byte, with one
field normalised: ``predict --json``'s ``model_key``, the serving model's id (a hash of its fitted
numbers, which the shipped model's own test checks).

Each command runs in-process through click's CliRunner (its stdout is byte-identical to the console
script's) with ``HPC_ADVISE_HOME`` at a temp dir, the GPU given explicitly (no NVML probe), a fresh
knowledge-base file per case (so the recommendation id is always 1) and the trace named by a path
relative to the repository root (``trace summarize`` prints it as ``source``). The one thing set
rather than taken from the machine: ``sys.executable`` is ``python`` (the text launch line starts
with the interpreter that runs hpc-advise, a path of the install, not a result).

Record them again after a deliberate change of output with
``HPC_ADVISE_WRITE_GOLDENS=1 python -m pytest tests/advisor/test_goldens.py`` and say why in the commit
(it first rewrites the shipped fits, ``hpc_advise/advisor/data/serving_model.npz`` and
``attention_model.json``, from fresh fits).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpc_advise.cli import main

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = Path(__file__).resolve().parent / "goldens"
TRACES = ("agentic_coding.jsonl", "bursty.csv", "chat_uniform.csv")
MODELS = ("hy3", "qwen3-235b-a22b", "deepseek-v3")
SLOS = {"noslo": (), "slo": ("--slo-tpot-ms", "50", "--slo-ttft-ms", "2000")}
MODEL_KEY = re.compile(r'^(  "model_key": )"[0-9a-f]{16}"', re.M)
WRITE = os.environ.get("HPC_ADVISE_WRITE_GOLDENS") == "1"


def _cases() -> list[tuple[str, list[str]]]:
    """(golden file name, CLI arguments) for every golden."""
    cases = []
    predict = ["predict", "--model", "hy3", "--gpu", "h200", "--gpus", "8", "--tp", "8"]
    predict += ["--isl", "2000", "--osl", "500", "--concurrency", "64"]
    cases += [("predict__hy3.json", [*predict, "--json"]), ("predict__hy3.txt", predict)]
    for trace in TRACES:
        stem = trace.split(".")[0]
        rel = f"examples/traces/{trace}"
        cases.append((f"summarize__{stem}.json", ["trace", "summarize", rel, "--json"]))
        cases.append((f"summarize__{stem}.txt", ["trace", "summarize", rel]))
        for model in MODELS:
            args = ["recommend", "--trace", rel, "--model", model, "--gpu", "h200", "--gpus", "8"]
            for slo, extra in SLOS.items():
                cases.append((f"recommend__{stem}__{model}__{slo}.json", [*args, *extra, "--json"]))
            if stem == "chat_uniform" or model == "hy3":
                cases.append(
                    (f"recommend__{stem}__{model}__slo.txt", [*args, *SLOS["slo"], "--show-excluded"])
                )
    return cases


@pytest.fixture(scope="module")
def golden_home(tmp_path_factory):
    if WRITE:  # the goldens come from the shipped fits: never record them from stale ones
        from tests.advisor.test_shipped_data import refresh_shipped_fits

        refresh_shipped_fits()
    home = tmp_path_factory.mktemp("goldens-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("HPC_ADVISE_HOME", str(home))
    mp.chdir(ROOT)
    mp.setattr(sys, "executable", "python")
    yield home
    mp.undo()


@pytest.mark.parametrize("name,args", _cases(), ids=[c[0] for c in _cases()])
def test_output_equals_the_golden(golden_home, name, args):
    db = golden_home / f"{name}.db"
    res = CliRunner().invoke(main, [*args, "--db", str(db)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = MODEL_KEY.sub(r'\1"<model key>"', res.stdout)
    path = GOLDENS / name
    if WRITE:
        path.write_text(out, encoding="utf-8")
    assert path.is_file(), f"no golden {path.name}: record it with HPC_ADVISE_WRITE_GOLDENS=1"
    assert out == path.read_text(encoding="utf-8"), f"{name} differs from its golden"
