"""README.md's sample output is what the command it shows prints today (``HPC_ADVISE_WRITE_README=1`` rewrites it)."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

from click.testing import CliRunner

from hpc_advise.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"(<!-- readme-sample -->\n```\n)(.*?)(```\n<!-- /readme-sample -->)", re.S)


def _run(command: str, tmp_path: Path, monkeypatch) -> str:
    args = shlex.split(command)
    assert args[0] == "hpc-advise", command
    monkeypatch.chdir(README.parent)
    monkeypatch.setattr(sys, "executable", "python3")  # the launch line starts with the interpreter
    result = CliRunner().invoke(main, [*args[1:], "--db", str(tmp_path / "kb.db")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_readme_sample_is_real_output(tmp_path, monkeypatch):
    text = README.read_text(encoding="utf-8")
    match = BLOCK.search(text)
    assert match, "README.md lost its <!-- readme-sample --> block"
    lines = match.group(2).splitlines()
    assert lines and lines[0].startswith("$ "), "the sample block starts with '$ COMMAND'"
    command = lines[0][2:]
    out = _run(command, tmp_path, monkeypatch)
    block = f"$ {command}\n{out}"
    if os.environ.get("HPC_ADVISE_WRITE_README"):
        README.write_text(text[: match.start(2)] + block + text[match.end(2) :], encoding="utf-8")
        return
    assert match.group(2) == block, "README sample differs from the output: HPC_ADVISE_WRITE_README=1 rewrites it"


WORKFLOW = re.compile(r"<!-- readme-workflow -->\n```bash\n(.*?)```\n<!-- /readme-workflow -->", re.S)


def test_readme_workflow_lines_parse():
    """The tour's recommend -> launch -> bench -> validate lines are commands and options the CLI accepts
    (parsed by click, not run)."""
    match = WORKFLOW.search(README.read_text(encoding="utf-8"))
    assert match, "README.md lost its <!-- readme-workflow --> block"
    seen = []
    for line in match.group(1).splitlines():
        args = shlex.split(line.split("  #")[0].rstrip(" &"))
        assert args[0] == "hpc-advise", line
        cmd = main.get_command(None, args[1])
        assert cmd is not None, f"no command {args[1]!r}"
        cmd.make_context(args[1], args[2:])  # raises click.UsageError on an unknown or malformed option
        seen.append(args[1])
    assert seen == ["recommend", "launch", "bench", "validate"]
