"""Shared GPU timing harness for ``benchmarks/bench_<name>.py`` and ``hpc-advise profile --bench``.

- ``time_cuda(fn)``: p20/p50/p80 in microseconds of ``fn()`` on the current CUDA device, either as
  CUDA-graph replays (default: one graph holding ``inner`` back-to-back calls, so launch gaps vanish)
  or as event-timed eager launches. Inputs are the caller's business: rotate buffers larger than L2
  when the working set would otherwise stay cached.
- ``capture_graph(fn, inner)``: the CUDA graph ``time_cuda`` replays (``fn`` warmed up on a side stream first).
- ``rotating(inputs, body)``: a call that runs ``body`` on the next of several input sets each time, so
  timed repetitions (and the calls captured in one CUDA graph) cycle through data larger than L2.
- ``run_row(...)``: one measurement as a knowledge-base ``runs`` row (the schema of
  ``hpc_advise.knowledge_base``: kind, subject, provider, config, metric, unit, p20/p50/p80, gpu,
  versions, git_sha, command, created_at).
- ``environment()``: versions of the GPU stack, recorded with every row.
- ``write_results(rows, stem, title, columns)``: a Markdown table plus a JSONL file of the raw rows
  under ``benchmarks/results/`` (or ``$OUT``), stamped with date, GPU, versions and command.

torch is imported lazily so the module can be imported (and its pure helpers tested) without a GPU.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

# shared/DESIGN.md section 7: device copy on one H200, TB/s of bytes read + written. The fixed
# figure the issues' bandwidth targets are stated against (issue 5: 90 % of copy = 3.7 TB/s).
DESIGN_COPY_TBPS = 4.12


@dataclass(frozen=True)
class Timing:
    """Microseconds per call: 20th, 50th and 80th percentile over the timed repetitions."""

    p20: float
    p50: float
    p80: float
    reps: int


def _percentiles(samples: list[float]) -> tuple[float, float, float]:
    xs = sorted(samples)
    if not xs:
        raise ValueError("no samples")

    def q(p: float) -> float:
        idx = p * (len(xs) - 1)
        lo = int(idx)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (idx - lo)

    return q(0.2), q(0.5), q(0.8)


def capture_graph(fn: Callable[[], object], inner: int = 1, same_stream: bool = False):
    """A CUDA graph of ``inner`` back-to-back calls of ``fn``, which first runs once on a side stream (allocator,
    lazy initialisation) so that the capture records only the calls' kernels. ``same_stream``: capture on that
    side stream too (torch's own capture stream otherwise), for calls that cache per-stream state in the warm-up
    (the fused MoE's launch plans). Returns the graph, synchronized."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream if same_stream else None):
        for _ in range(inner):
            fn()
    torch.cuda.synchronize()
    return g


def time_cuda(
    fn: Callable[[], object],
    *,
    graph: bool = True,
    inner: int = 10,
    reps: int = 30,
    warmup: int = 3,
    settle_s: float = 0.0,
) -> Timing:
    """Time ``fn`` on the GPU; returns microseconds per call.

    graph=True: capture ``inner`` calls of ``fn`` in one CUDA graph, replay it ``reps`` times, each
    replay timed with CUDA events and divided by ``inner``. graph=False: ``inner`` back-to-back eager
    launches per event pair. ``fn`` must be capturable when graph=True (no host syncs, no allocation
    that changes between calls). settle_s > 0: run the timed body back to back, untimed, for that many
    seconds first, so the GPU's clocks settle at the state this load holds them in. A compute-bound load
    on an H200 holds its power cap (700 W) after ~1 s: the SM clock falls from the 1980 MHz boost to
    ~1630 MHz, and a call timed inside the first ~50 ms reads up to 13 % faster than it runs sustained
    (benchmarks/results/spread_fused_moe.md).
    """
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if graph:
        g = capture_graph(fn, inner)
        g.replay()
        torch.cuda.synchronize()
        body = g.replay
    else:

        def body() -> None:
            for _ in range(inner):
                fn()

    settle_end = time.perf_counter() + settle_s
    while time.perf_counter() < settle_end:
        body()
        torch.cuda.synchronize()
    samples: list[float] = []
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        body()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / inner)
    p20, p50, p80 = _percentiles(samples)
    return Timing(p20, p50, p80, reps)


def rotating(inputs: list, body: Callable[[object], object]) -> Callable[[], object]:
    """A no-argument call that applies ``body`` to ``inputs[0]``, ``inputs[1]``, … in turn, cyclically."""
    state = {"i": 0}

    def call() -> object:
        i = state["i"]
        state["i"] = (i + 1) % len(inputs)
        return body(inputs[i])

    return call


def git_sha() -> str | None:
    """Commit of the working tree, or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        return out.stdout.strip() or None
    except Exception:
        return None


def environment() -> dict[str, str]:
    """Versions of the stack a measurement ran on (missing packages are left out); read once."""
    return dict(_environment())


@functools.lru_cache(maxsize=1)
def _environment() -> dict[str, str]:
    env: dict[str, str] = {"python": sys.version.split()[0]}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = str(torch.version.cuda)
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
            env["sm_count"] = str(torch.cuda.get_device_properties(0).multi_processor_count)
    except Exception:
        pass
    for name in ("triton", "flashinfer", "fbgemm_gpu", "sglang"):
        try:
            module = __import__(name)
            env[name] = str(getattr(module, "__version__", "unknown"))
        except Exception:
            continue
    try:
        from hpc_advise.advisor.gpu_probe import probe  # the one NVML user

        env["driver"] = probe().driver_version
    except Exception:
        pass
    return env


def command_line() -> str:
    """The command that produced this process, shell-quoted (``python -m pkg`` shown as such)."""
    argv = list(sys.argv)
    main = Path(argv[0]) if argv else None
    if main is not None and main.name == "__main__.py":
        argv = ["-m", main.parent.name, *argv[1:]]
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *argv])


def run_row(
    *,
    kind: str,
    subject: str,
    provider: str,
    config: dict,
    metric: str,
    unit: str,
    timing: Timing | None = None,
    value: float | None = None,
    env: dict[str, str] | None = None,
    extra: dict | None = None,
) -> dict:
    """One ``runs`` row. Give a ``timing`` (metric 'latency', unit 'us') or a single ``value``."""
    env = env or environment()
    if timing is not None:
        p20, p50, p80 = timing.p20, timing.p50, timing.p80
    elif value is not None:
        p20 = p50 = p80 = float(value)
    else:
        raise ValueError("run_row needs a timing or a value")
    row = {
        "kind": kind,
        "subject": subject,
        "provider": provider,
        "config": dict(config),
        "metric": metric,
        "unit": unit,
        "p20": p20,
        "p50": p50,
        "p80": p80,
        "gpu": env.get("gpu"),
        "versions": env,
        "git_sha": git_sha(),
        "command": command_line(),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if extra:
        row["config"].update(extra)
    return row


def results_dir() -> Path:
    """Where tables go: ``$HPC_ADVISE_RESULTS`` if set, else ``$OUT`` on the device machine, else
    ``benchmarks/results`` of this checkout."""
    for var in ("HPC_ADVISE_RESULTS", "OUT"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path(__file__).resolve().parents[3] / "benchmarks" / "results"


def write_results(
    rows: Iterable[dict],
    table: list[list[object]],
    headers: list[str],
    *,
    stem: str,
    title: str,
    notes: str = "",
    env: dict[str, str] | None = None,
) -> tuple[Path, Path]:
    """Write ``<stem>.md`` (title, date, GPU, versions, command, table, notes) and ``<stem>.jsonl``."""
    from tabulate import tabulate

    env = env or environment()
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    md = out / f"{stem}.md"
    jl = out / f"{stem}.jsonl"
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M %Z")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(env.items()) if k not in ("gpu",))
    body = [
        f"# {title}",
        "",
        f"- date: {stamp}",
        f"- GPU: {env.get('gpu', 'none')}",
        f"- versions: {versions}",
        f"- git: {git_sha() or 'unknown'}",
        f"- command: `{command_line()}`",
        "",
        tabulate(table, headers=headers, tablefmt="github", floatfmt=".3g"),
        "",
    ]
    if notes:
        body += [notes.strip(), ""]
    md.write_text("\n".join(body))
    with jl.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
    return md, jl
