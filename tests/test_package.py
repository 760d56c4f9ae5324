"""Package-level checks: version, ``--help`` everywhere, no torch on ``--help``, wheel contents, import rules."""

from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import hpc_advise
from hpc_advise.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "hpc_advise"
HEAVY = ("torch", "triton", "sglang")
# commands that run on a CPU-only laptop: their --help must not pull in torch/triton/sglang either
CPU_COMMANDS = sorted(n for n, target in COMMANDS.items() if not target.startswith("hpc_advise.runtime."))


def _script() -> Path:
    script = Path(sys.executable).parent / "hpc-advise"
    assert script.exists(), f"{script} missing: install the package first (pip install -e '.[dev]')"
    return script


def test_version_console_script_and_module():
    out = subprocess.run([str(_script()), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"hpc-advise, version {hpc_advise.__version__}"
    mod = subprocess.run([sys.executable, "-m", "hpc_advise", "--version"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)  # fmt: skip
    assert mod.stdout == out.stdout


def _walk(cmd: click.Command, path: list[str]):
    yield path
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(click.Context(cmd)):
            yield from _walk(cmd.get_command(click.Context(cmd), name), [*path, name])


def test_root_help_lists_every_command():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.output


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_on_every_command(name):
    module, attr = COMMANDS[name].split(":")
    try:
        command = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"command {name!r} -> {COMMANDS[name]} cannot be loaded: {exc}")
    assert isinstance(command, click.Command)
    for path in _walk(command, [name]):
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, f"hpc-advise {' '.join(path)} --help failed:\n{result.output}"
        assert "Usage:" in result.output


def test_root_help_does_not_import_torch():
    """The real console script, with Python's import-time log: no torch/triton/sglang module."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    out = subprocess.run([str(_script()), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    imported = [
        line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")
    ]
    assert "hpc_advise.cli" in imported  # the log is real
    heavy = [m for m in imported if m.split(".")[0] in HEAVY]
    assert heavy == [], f"hpc-advise --help imported {heavy[:5]}"


def test_cpu_commands_help_does_not_import_torch():
    code = textwrap.dedent(
        f"""
        import json, sys
        from hpc_advise.cli import main
        first = {{}}
        for name in {CPU_COMMANDS!r}:
            try:
                main([name, "--help"], prog_name="hpc-advise")
            except SystemExit as exc:
                if exc.code:
                    first[name] = "exit " + str(exc.code)
            heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
            if heavy and "heavy" not in first:
                first["heavy"] = [name, heavy[:5]]
        print(json.dumps(first))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


def _copy_source(dest: Path) -> None:
    """Copy what a fresh clone has: the tracked files (or, outside git, the tree minus build junk)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60)
    if listed.returncode != 0:
        junk = {
            ".git",
            ".venv",
            "build",
            "dist",
            "__pycache__",
            ".pytest_cache",
            ".ruff_cache",
            ".hypothesis",
        }
        shutil.copytree(
            REPO, dest, ignore=lambda d, names: {n for n in names if n in junk or n.endswith(".egg-info")}
        )
        return
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = REPO / rel
        if src.is_file():  # tracked but deleted in the work tree: skip
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def test_wheel_contains_only_hpc_advise(tmp_path):
    src = tmp_path / "src"
    _copy_source(src)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(tmp_path / "dist")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    [wheel] = list((tmp_path / "dist").glob("hpc_advise-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    dist_info = f"hpc_advise-{hpc_advise.__version__}.dist-info"
    assert top == {"hpc_advise", dist_info}, f"unexpected top-level entries: {sorted(top)}"
    assert "hpc_advise/knowledge_base/store.py" in names
    for fitted in ("serving_model.npz", "attention_model.json"):  # recommend neither fits nor imports sklearn
        assert f"hpc_advise/advisor/data/{fitted}" in names, fitted
    lab_notes = [n for n in names if "TUNING_LOG" in n]
    assert lab_notes == [], f"the wheel ships tuning logs: {lab_notes}"
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "hpc-advise = hpc_advise.cli:main" in entry_points
    assert "[sglang.srt.plugins]" in entry_points


# ------------------------------------------------------------------------------------ import rules
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports, at any depth (lazy imports included)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "__import__",
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return found


def _files(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py"))


def _is(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize("part", ["advisor", "knowledge_base", "profiles"])
def test_cpu_parts_never_import_gpu_code(part):
    forbidden = ("torch", "triton", "sglang", "hpc_advise.kernels", "hpc_advise.runtime")
    assert _files(part), f"hpc_advise/{part} has no modules"
    bad = {
        str(f.relative_to(REPO)): sorted(m for m in imports_of(f) if any(_is(m, p) for p in forbidden))
        for f in _files(part)
    }
    assert {f: m for f, m in bad.items() if m} == {}


def test_kernels_import_only_torch_triton_and_stdlib():
    allowed_top = {"torch", "triton", "__future__"} | set(sys.stdlib_module_names)
    bad = {}
    for f in _files("kernels"):
        wrong = sorted(
            m
            for m in imports_of(f)
            if not _is(m, "hpc_advise.kernels") and m.split(".")[0] not in allowed_top
        )
        if wrong:
            bad[str(f.relative_to(REPO))] = wrong
    assert bad == {}


def test_sglang_is_imported_only_by_the_runtime():
    bad = {
        str(f.relative_to(REPO)): sorted(m for m in imports_of(f) if _is(m, "sglang"))
        for f in sorted(PKG.rglob("*.py"))
        if not _is(_module_name(f), "hpc_advise.runtime")
    }
    assert {f: m for f, m in bad.items() if m} == {}


def test_import_rule_checker_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    """The checker itself: a lazy import inside a function and a relative import are both found."""
    pkg = tmp_path / "hpc_advise" / "advisor"
    pkg.mkdir(parents=True)
    mod = pkg / "x.py"
    mod.write_text("def f():\n    import torch\n    from ..kernels import router_gemm\n    return torch\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert {"torch", "hpc_advise.kernels", "hpc_advise.kernels.router_gemm"} <= imports_of(mod)


def test_no_main_guard_in_package():
    offenders = [str(f.relative_to(REPO)) for f in PKG.rglob("*.py") if "__name__ == \"__main__\"" in f.read_text()
                 or "__name__ == '__main__'" in f.read_text()]  # fmt: skip
    assert offenders == []
