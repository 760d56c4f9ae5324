"""What every part's click commands share: parameter types that refuse non-finite and out-of-range
numbers at parse time, the limits that cap a command's work by its input, and progress lines.

Progress goes to stderr only, and only when stderr is a terminal or ``HPC_ADVISE_PROGRESS=1`` (the
root ``--progress`` flag sets it), so ``--json`` and piped output stay clean.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

import click

# Limits of the advisor's scenario. The candidate search covers one deployment (TP x replicas behind
# one router) of at most 8 nodes of 8 GPUs; requests in flight are capped where even an 8B model's KV
# cache could not hold them on 64 GPUs, so no input makes the simulation grow without bound.
MAX_GPUS = 64
MAX_CONCURRENCY = 65536
MAX_TOKENS = 10_000_000  # one request's input or output length (predict --isl/--osl)
MAX_SLO_MS = 3_600_000.0  # an hour
MAX_TOP = 1000
MAX_NIC_GBPS = 1000.0  # inter-node GB/s per GPU per direction (an 800 Gb/s NIC is 100)

ENV_PROGRESS = "HPC_ADVISE_PROGRESS"

T = TypeVar("T")


class FiniteFloat(click.ParamType):
    """A float that is finite and within ``[min, max]`` (``min_open``: strictly above ``min``)."""

    name = "float"

    def __init__(self, min: float | None = None, max: float | None = None, min_open: bool = False):
        self.min, self.max, self.min_open = min, max, min_open

    def convert(self, value, param, ctx):
        if isinstance(value, float) and math.isfinite(value):
            x = value
        else:
            try:
                x = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.min is not None and (x <= self.min if self.min_open else x < self.min):
            self.fail(f"{value!r} must be {'>' if self.min_open else '>='} {self.min:g}", param, ctx)
        if self.max is not None and x > self.max:
            self.fail(f"{value!r} is above the limit {self.max:g}", param, ctx)
        return x

    def get_metavar(self, param, ctx=None) -> str:  # click 8.1 and 8.2 signatures
        return "FLOAT"


def positive_float(max: float | None = None) -> FiniteFloat:
    """A finite float > 0 (optionally <= ``max``)."""
    return FiniteFloat(min=0.0, max=max, min_open=True)


def positive_int(max: int | None = None) -> click.IntRange:
    """An int >= 1 (optionally <= ``max``)."""
    return click.IntRange(min=1, max=max)


def wants_progress() -> bool:
    if os.environ.get(ENV_PROGRESS, "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def progress(message: str) -> None:
    """One progress line on stderr (on a terminal or when asked for)."""
    if wants_progress():
        click.echo(f"… {message}", err=True)


def progress_bar(items: Iterable[T], label: str, length: int | None = None) -> Iterator[T]:
    """``items`` under a click progress bar on stderr (on a terminal or when asked for)."""
    if not wants_progress():
        yield from items
        return
    with click.progressbar(items, label=label, length=length, file=sys.stderr) as bar:
        yield from bar


class Timer:
    """Context manager: says on stderr what runs and how long it took (when progress is wanted)."""

    def __init__(self, message: str):
        self.message = message

    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        progress(self.message)
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None and wants_progress():
            click.echo(f"  done in {time.perf_counter() - self.t0:.1f} s", err=True)


class Aliased(click.Option):
    """An option whose old spellings (``aliases``) still parse but are left out of ``--help``:
    ``@click.option("--tp-size", "--tp", "tp", cls=Aliased, aliases=("--tp",))``."""

    def __init__(self, *args, aliases: tuple[str, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.aliases = tuple(aliases)

    def get_help_record(self, ctx):
        shown = self.opts
        self.opts = [o for o in shown if o not in self.aliases]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


def check_output_file(path: str, option: str, suffixes: tuple[str, ...] | None = None) -> None:
    """Refuse, before any work, an output file whose folder is missing or not writable, or whose
    suffix is not one of ``suffixes``."""
    import os.path

    folder = os.path.dirname(os.path.abspath(path))
    if suffixes is not None and os.path.splitext(path)[1].lower() not in suffixes:
        raise click.BadParameter(
            f"{path!r}: the file name must end in {', '.join(suffixes)}", param_hint=option
        )
    if not os.path.isdir(folder):
        raise click.BadParameter(f"{path!r}: folder {folder} does not exist", param_hint=option)
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(f"{path!r}: folder {folder} is not writable", param_hint=option)
    if os.path.isdir(path):
        raise click.BadParameter(f"{path!r} is a folder", param_hint=option)
