"""What the CLI imports (issue 30: ``recommend`` on a small trace in <= 2 s cold on 2 cores).

scikit-learn and scipy take about 1 s to import on 2 cores; only fitting needs them (the serving
model and the attention model ship fitted, as arrays numpy evaluates), so loading the CLI, reading a
trace and a whole ``recommend`` or ``predict`` must not import them. Run in a fresh interpreter: the
test process has usually imported both already.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("sklearn", "scipy", "matplotlib", "pandas")

PROBE = f"""
import sys
HEAVY = {HEAVY!r}
from hpc_advise.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
heavy = [name for name in HEAVY if name in sys.modules]
print("HEAVY:" + ",".join(heavy))
"""


def _heavy_after(tmp_path, *args: str) -> str:
    env = dict(os.environ, HPC_ADVISE_HOME=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return out.rsplit("HEAVY:", 1)[1].strip()


def test_reading_a_trace_imports_no_sklearn_or_scipy(tmp_path):
    trace = REPO / "examples" / "traces" / "chat_uniform.csv"
    assert _heavy_after(tmp_path, "trace", "summarize", str(trace), "--json") == ""


def test_help_imports_no_sklearn_or_scipy(tmp_path):
    assert _heavy_after(tmp_path, "recommend", "--help") == ""


def test_recommend_and_predict_import_no_sklearn_or_scipy(tmp_path):
    trace = REPO / "examples" / "traces" / "chat_uniform.csv"
    db = str(tmp_path / "kb.db")
    args = ["recommend", "--trace", str(trace), "--model", "qwen3-32b", "--gpu", "h200", "--gpus", "2"]
    assert _heavy_after(tmp_path, *args, "--top", "1", "--db", db) == ""
    args = ["predict", "--model", "hy3", "--gpu", "h200", "--gpus", "8", "--tp-size", "8", "--isl", "2000"]
    assert _heavy_after(tmp_path, *args, "--osl", "500", "--concurrency", "64", "--db", db) == ""
    assert (tmp_path / "kb.db").exists()  # the commands ran to the end: they log what they answered
