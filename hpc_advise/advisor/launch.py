"""Turn a candidate configuration into the exact ``python -m sglang.launch_server`` command, check it
with SGLang's own argument parser, and replace this process with it.

Flag names are SGLang 0.5.23's (``sglang/srt/arg_groups/fields``): ``--tp-size`` counts every GPU of a
replica, ``--attn-dp-size`` is attention data parallelism inside it (the old ``--enable-dp-attention
--dp-size`` spelling is deprecated there), ``--dp-size`` is the number of replicas behind SGLang's
router, ``--ep-size`` expert parallelism. Our decode attention is selected with
``--decode-attention-backend hpc_advise --page-size 64`` (prefill stays on fa3) and our plugin is
whitelisted with ``SGLANG_PLUGINS=hpc_advise``.

Validation runs SGLang's parser in a child Python (``ServerArgs.add_cli_args`` + ``parse_args`` after
loading SGLang's plugins, so our backend names are known), which keeps torch out of this process; the
launch itself is ``os.execvpe`` so signals and the exit code belong to SGLang.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass

from hpc_advise.advisor.candidates import Candidate

PLUGIN_NAME = "hpc_advise"
PREFILL_BACKEND_FOR_OURS = "fa3"


@dataclass
class LaunchCommand:
    argv: list[str]
    env: dict[str, str]  # variables to add to the environment

    def shell(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        return f"{prefix} {cmd}".strip()


def build_command(
    c: Candidate,
    model_path: str,
    *,
    python: str | None = None,
    nnodes: int | None = None,
    node_rank: int | None = None,
    dist_init_addr: str | None = None,
    extra: tuple[str, ...] = (),
) -> LaunchCommand:
    """The SGLang command for candidate ``c`` serving ``model_path``."""
    argv = [python or sys.executable, "-m", "sglang.launch_server", "--model-path", model_path]
    argv += ["--tp-size", str(c.tp)]
    if c.replicas > 1:
        argv += ["--dp-size", str(c.replicas)]
    if c.attn_dp > 1:
        argv += ["--attn-dp-size", str(c.attn_dp)]
    if c.ep > 1:
        argv += ["--ep-size", str(c.ep)]
    env: dict[str, str] = {}
    ours = False
    if c.attention_backend == "hpc_advise":
        argv += ["--attention-backend", PREFILL_BACKEND_FOR_OURS, "--decode-attention-backend", "hpc_advise"]
        ours = True
    else:
        argv += ["--attention-backend", c.attention_backend]
    if c.page_size != 1:
        argv += ["--page-size", str(c.page_size)]
    if c.moe_runner and c.moe_runner != "auto":
        argv += ["--moe-runner-backend", c.moe_runner]
        ours = ours or c.moe_runner == "hpc_advise"
    if c.kv_dtype != "auto":
        argv += ["--kv-cache-dtype", c.kv_dtype]
    if nnodes is not None and nnodes > 1:
        argv += ["--nnodes", str(nnodes)]
    if node_rank is not None and (nnodes or 1) > 1:
        argv += ["--node-rank", str(node_rank)]
    if dist_init_addr:
        argv += ["--dist-init-addr", dist_init_addr]
    argv += list(extra)
    if ours:
        env["SGLANG_PLUGINS"] = PLUGIN_NAME
    return LaunchCommand(argv, env)


_NOT_IMPORTABLE = 3
_VALIDATOR = r"""
import argparse, sys
try:
    from sglang.srt.server_args import ServerArgs
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(3)
try:
    from sglang.srt.plugins import load_plugins
    load_plugins()
except Exception as exc:  # plugin errors: the parser below says what is unknown
    print(f"note: loading SGLang plugins failed: {exc}", file=sys.stderr)
parser = argparse.ArgumentParser(prog="sglang.launch_server")
ServerArgs.add_cli_args(parser)
parser.parse_args(sys.argv[1:])
print("ok")
"""


def validate(cmd: LaunchCommand, timeout: float = 180.0) -> tuple[bool | None, str]:
    """Parse the command's arguments with SGLang's parser in a child process.

    Returns (True, '') when SGLang accepts them, (False, its error) when it rejects them, and
    (None, why) when SGLang cannot be imported with the command's Python (validation skipped).
    """
    python = cmd.argv[0]
    args = cmd.argv[3:]  # after "python -m sglang.launch_server"
    env = dict(os.environ, **cmd.env)
    try:
        res = subprocess.run(
            [python, "-c", _VALIDATOR, *args], capture_output=True, text=True, env=env, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot run {python}: {exc}"
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit code {res.returncode}"
    if res.returncode == 0:
        return True, ""
    if res.returncode == _NOT_IMPORTABLE:
        return None, f"SGLang is not importable with {python}: {last}"
    return False, last


def exec_command(cmd: LaunchCommand) -> None:  # pragma: no cover - replaces the process
    env = dict(os.environ, **cmd.env)
    os.execvpe(cmd.argv[0], cmd.argv, env)
