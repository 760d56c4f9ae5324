"""Root click group of ``hpc-advise``.

Only the root lives here: each part owns its commands and is imported lazily, when its command runs
(or when ``--help`` of that command is asked), so ``hpc-advise --help`` imports neither torch nor the
parts' dependencies. The root also gives every command's help page its example (``EXAMPLES``) and
ends quietly, exit 0, when stdout is a pipe that closed early (``hpc-advise runs list | head``).
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from hpc_advise import __version__

# command name -> "module:attribute" of a click command or group
COMMANDS: dict[str, str] = {
    "kb": "hpc_advise.knowledge_base.cli:kb",
    "notes": "hpc_advise.knowledge_base.cli:notes",
    "runs": "hpc_advise.knowledge_base.cli:runs",
    "profiles": "hpc_advise.profiles.cli:profiles",
    "profile": "hpc_advise.runtime.measure.cli:profile",
    "trace": "hpc_advise.advisor.traces.cli:trace",
    "model": "hpc_advise.advisor.cli:model",
    "recommend": "hpc_advise.advisor.cli:recommend",
    "predict": "hpc_advise.advisor.cli:predict",
    "launch": "hpc_advise.advisor.cli:launch",
    "bench": "hpc_advise.advisor.bench.cli:bench",
    "validate": "hpc_advise.advisor.bench.cli:validate",
    "runtime": "hpc_advise.runtime.cli:runtime",
}

HELP = {
    "kb": "Knowledge base: where it is, statistics, export.",
    "notes": "Notes: add, full-text search, list, show, remove.",
    "runs": "Benchmark runs: list, show, compare, import SGLang/vLLM results.",
    "profiles": "Browse the GPU and model profiles shipped with hpc-advise (no GPU needed).",
    "profile": "Measure THIS machine: read its GPUs (NVML), optionally benchmark them, store the facts.",
    "trace": "Read traffic traces, summarize the workload, convert formats.",
    "model": "Fit, evaluate and show the performance model.",
    "recommend": "Rank SGLang configurations for a trace, model and GPUs.",
    "predict": "Predict TTFT/TPOT/throughput for one configuration.",
    "launch": "Start SGLang with a recommended configuration.",
    "bench": "Replay a trace against a live server (A/B, consistency); store the run.",
    "validate": "Predicted vs measured for a recommendation, and what a miss points at.",
    "runtime": "Runtime: dispatch table and environment report.",
}


# command path -> one example for its help page (``Example:`` epilog)
EXAMPLES: dict[str, str] = {
    "bench": "hpc-advise bench --url http://localhost:30000 --trace chat.csv --rate-scale 2",
    "kb": "hpc-advise kb stats",
    "kb export": "hpc-advise kb export --format csv --table runs -o runs.csv",
    "kb path": "hpc-advise kb path",
    "kb stats": "hpc-advise kb stats --json",
    "launch": "hpc-advise launch --recommendation 3 --dry-run",
    "model": "hpc-advise model fit",
    "model eval": "hpc-advise model eval --by model",
    "model fit": "hpc-advise model fit --refit",
    "model show": "hpc-advise model show --json",
    "notes": "hpc-advise notes search 'fp8 AND decode'",
    "notes add": "hpc-advise notes add 'fa3 beats flashinfer at TP8' --title 'attention at TP8' --tag h200",
    "notes edit": "hpc-advise notes edit 4 --tag h200 --tag attention",
    "notes list": "hpc-advise notes list --tag h200 --since 7d",
    "notes rm": "hpc-advise notes rm 4 5",
    "notes search": "hpc-advise notes search 'flashinfer NOT decode' --limit 5",
    "notes show": "hpc-advise notes show 4",
    "predict": (
        "hpc-advise predict --model llama-3.1-8b --gpu h200 --gpus 8 --tp-size 2 "
        "--isl 2000 --osl 200 --concurrency 64"
    ),
    "profile": "hpc-advise profile --bench micro",
    "profiles": "hpc-advise profiles show h200",
    "profiles list": "hpc-advise profiles list --kind gpus",
    "profiles show": "hpc-advise profiles show llama-3.1-8b --json",
    "recommend": (
        "hpc-advise recommend --trace chat.csv --model llama-3.1-8b --gpu h200 --gpus 8 --slo-tpot-ms 30"
    ),
    "runs": "hpc-advise runs list --kind serving --limit 20",
    "runs compare": "hpc-advise runs compare 12 15",
    "runs import": "hpc-advise runs import results.jsonl --gpu 'NVIDIA H200'",
    "runs list": "hpc-advise runs list --kind kernel --gpu h200",
    "runs show": "hpc-advise runs show 12",
    "runtime": "hpc-advise runtime check --model llama-3.1-8b --gpu h200",
    "runtime check": "hpc-advise runtime check --model llama-3.1-8b --gpu h200 --json",
    "trace": "hpc-advise trace summarize chat.csv",
    "trace convert": "hpc-advise trace convert burstgpt.csv -o trace.jsonl.zst",
    "trace formats": "hpc-advise trace formats",
    "trace summarize": "hpc-advise trace summarize mooncake.jsonl --window 10 --latency 2.5",
    "validate": "hpc-advise validate --recommendation 3 --run 41",
}


def _attach_examples(cmd: click.Command, path: str) -> None:
    """Give ``cmd`` and its subcommands the example of ``EXAMPLES`` (unless they carry an epilog)."""
    example = EXAMPLES.get(path)
    if example and not cmd.epilog:
        cmd.epilog = f"\b\nExample:\n  {example}"
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            _attach_examples(sub, f"{path} {name}")


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
        command = getattr(module, attr)
        _attach_examples(command, name)
        return command

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """click's standalone mode, except that a usage error is two lines (the error and where the
        help is) instead of four, and a closed stdout pipe ends quietly."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except BrokenPipeError:
            _closed_pipe()
        except click.UsageError as exc:
            click.echo(f"Error: {exc.format_message()}", err=True)
            if exc.ctx is not None:
                hint = f"{exc.ctx.command_path} {exc.ctx.help_option_names[0]}"
                click.echo(f"Try '{hint}' for help.", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except (click.Abort, KeyboardInterrupt):
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _closed_pipe()

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help from the table above, so the root --help imports no part.
        rows = [(name, HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _closed_pipe() -> None:
    """The reader of stdout went away (``| head``): stop quietly, exit 0, and keep Python's final
    flush of stdout from raising again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real stdout (CliRunner): nothing to redirect
        pass
    sys.exit(0)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="\b\nExample:\n  hpc-advise recommend --trace chat.csv --model llama-3.1-8b --gpu h200 --gpus 8",
)
@click.version_option(__version__, prog_name="hpc-advise")
@click.option(
    "--progress",
    is_flag=True,
    help="Progress lines on stderr even when it is not a terminal (always on a terminal).",
)
def main(progress: bool) -> None:
    """hpc-advise: deployment advisor for SGLang on NVIDIA GPUs, with its own kernels."""
    if progress:
        from hpc_advise.clitypes import ENV_PROGRESS

        os.environ[ENV_PROGRESS] = "1"
