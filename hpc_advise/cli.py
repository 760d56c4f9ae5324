"""Root click group of ``hpc-advise``.

Only the root lives here: each part owns its commands and is imported lazily, when its command runs
(or when ``--help`` of that command is asked), so ``hpc-advise --help`` imports neither torch nor the
parts' dependencies.
"""

from __future__ import annotations

import importlib

import click

from hpc_advise import __version__

# command name -> "module:attribute" of a click command or group
COMMANDS: dict[str, str] = {
    "kb": "hpc_advise.knowledge_base.cli:kb",
    "notes": "hpc_advise.knowledge_base.cli:notes",
    "runs": "hpc_advise.knowledge_base.cli:runs",
    "profiles": "hpc_advise.profiles.cli:profiles",
    "profile": "hpc_advise.runtime.measure.cli:profile",
    "trace": "hpc_advise.advisor.trace_cli:trace",
    "model": "hpc_advise.advisor.cli:model",
    "recommend": "hpc_advise.advisor.cli:recommend",
    "predict": "hpc_advise.advisor.cli:predict",
    "launch": "hpc_advise.advisor.cli:launch",
    "runtime": "hpc_advise.runtime.cli:runtime",
}

HELP = {
    "kb": "Knowledge base: where it is, statistics, export.",
    "notes": "Notes: add, full-text search, list, show, remove.",
    "runs": "Benchmark runs: list, show, compare, import SGLang/vLLM results.",
    "profiles": "GPU and model profiles shipped with hpc-advise.",
    "profile": "Read the local GPUs (NVML), optionally microbenchmark them, store the facts.",
    "trace": "Read traffic traces, summarize the workload, convert formats.",
    "model": "Fit, evaluate and show the performance model.",
    "recommend": "Rank SGLang configurations for a trace, model and GPUs.",
    "predict": "Predict TTFT/TPOT/throughput for one configuration.",
    "launch": "Start SGLang with a recommended configuration.",
    "runtime": "Runtime: dispatch table and environment report.",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        module = importlib.import_module(module_name)
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help from the table above, so the root --help imports no part.
        rows = [(name, HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hpc-advise")
def main() -> None:
    """hpc-advise: deployment advisor for SGLang on NVIDIA GPUs, with its own kernels."""
