"""The runtime's own import rule (DESIGN §1): ``sglang`` is imported only inside ``hpc_advise/runtime/sglang/``.
The backend modules there import it at module level (they subclass SGLang's classes), so the plugin loads
them only when SGLang asks for a backend: importing the plugin, or any other runtime module, loads no SGLang."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "hpc_advise" / "runtime"
BRIDGE = RUNTIME / "sglang"


def _imports_sglang(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        if any(n == "sglang" or n.startswith("sglang.") for n in names):
            return True
    return False


def test_sglang_is_imported_only_by_the_bridge():
    users = {str(f.relative_to(RUNTIME)) for f in RUNTIME.rglob("*.py") if _imports_sglang(f)}
    assert {"sglang/plugin.py", "sglang/attention.py", "sglang/moe.py"} <= users  # the checker sees them
    assert sorted(u for u in users if not u.startswith("sglang/")) == []


def test_importing_the_runtime_loads_no_sglang():
    mods = ["hpc_advise.runtime.sglang.plugin", "hpc_advise.runtime.dispatch", "hpc_advise.runtime.cli",
            "hpc_advise.runtime.env_report", "hpc_advise.runtime.measure.cli"]  # fmt: skip
    code = "import sys\n" + "".join(f"import {m}\n" for m in mods) + "print('sglang' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
