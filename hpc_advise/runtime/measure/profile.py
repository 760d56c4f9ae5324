"""What ``hpc-advise profile --bench`` runs, and how: the steps (microbenchmarks, every kernel benchmark
that exists, the communication benchmark), a progress bar over them, and what each step produced.

Stages: ``micro`` (copy + GEMMs, ``microbench.py``), ``kernels`` (``hpc_advise.runtime.measure.cases.<name>.
bench(grid='small')`` for each name in ``KERNEL_BENCHES``; a missing or broken module is skipped with
its reason), ``comm`` (``comm.measure`` at every GPU count the host allows). ``--bench`` alone means
micro + kernels; ``--bench comm`` only the communication benchmark; ``--bench all`` everything. A step
that raises is recorded as failed and the others still run. torch is imported only when steps are built.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import click

KERNEL_BENCHES = ("decode_attention", "router_gemm", "fused_moe")
CASES = "hpc_advise.runtime.measure.cases"
STAGES = ("micro", "kernels", "comm")
DEFAULT_STAGES = ("micro", "kernels")


def parse_stages(value: str) -> tuple[str, ...]:
    """``default`` | ``all`` | a comma list of ``micro``, ``kernels``, ``comm``."""
    if value == "default":
        return DEFAULT_STAGES
    if value == "all":
        return STAGES
    parts = tuple(p.strip() for p in value.split(",") if p.strip())
    bad = [p for p in parts if p not in STAGES]
    if bad or not parts:
        raise click.BadParameter(f"unknown stage(s) {bad or value!r}; use micro, kernels, comm or all")
    return tuple(s for s in STAGES if s in parts)


def torch_cuda_problem() -> str | None:
    """Why benchmarks cannot run here (None when torch sees a CUDA GPU)."""
    try:
        import torch
    except ImportError:
        return "--bench needs PyTorch (pip install 'hpc-advise[gpu]')"
    if not torch.cuda.is_available():
        return f"--bench needs a CUDA GPU, and torch {torch.__version__} sees none"
    return None


@dataclass
class Step:
    stage: str
    label: str
    run: Callable[[], list[dict]]


@dataclass
class BenchReport:
    rows: list[dict] = field(default_factory=list)
    run_ids: list[int] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def _kernel_steps(model, report: BenchReport) -> list[Step]:
    steps = []
    for name in KERNEL_BENCHES:
        module_name = f"{CASES}.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                report.skipped.append((name, f"no benchmark module {module_name} yet"))
            else:
                report.skipped.append((name, f"import failed: {exc}"))
            continue
        except Exception as exc:  # a broken module must not stop the others
            report.skipped.append((name, f"import failed: {type(exc).__name__}: {exc}"))
            continue
        bench = getattr(module, "bench", None)
        if not callable(bench):
            report.skipped.append((name, f"{module_name} has no bench() function"))
            continue
        kwargs: dict = {"grid": "small"}
        if model is not None and "model" in inspect.signature(bench).parameters:
            kwargs["model"] = model

        def run(bench=bench, kwargs=kwargs) -> list[dict]:
            rows, _table, _headers = bench(**kwargs)
            return list(rows)

        steps.append(Step("kernels", f"kernel {name}", run))
    return steps


def build_steps(
    stages: tuple[str, ...], *, grid: str = "small", model=None, report: BenchReport
) -> list[Step]:
    """The steps for ``stages`` (kernel benchmarks that cannot be imported go to ``report.skipped``)."""
    from hpc_advise.runtime.measure import comm, microbench
    from hpc_advise.runtime.measure.harness import environment

    env = environment()
    steps: list[Step] = []
    if "micro" in stages:
        for case in microbench.cases(grid):
            steps.append(Step("micro", case.label, lambda case=case: [microbench.run_case(case, env)]))
    if "kernels" in stages:
        steps += _kernel_steps(model, report)
    if "comm" in stages:
        import torch

        for ws in comm.world_sizes(torch.cuda.device_count()):
            steps.append(
                Step("comm", f"comm {ws} GPU(s)", lambda ws=ws: comm.measure(ws, device="cuda", env=env))
            )
    return steps


def run_steps(
    steps: list[Step], report: BenchReport, store: Callable[[list[dict]], list[int]]
) -> BenchReport:
    """Run every step under a progress bar (on stderr); store each step's rows as soon as it ends."""

    def show(step: Step | None) -> str:
        return step.label if step is not None else ""

    with click.progressbar(steps, label="benchmarking", file=sys.stderr, item_show_func=show) as bar:
        for step in bar:
            try:
                # benchmarks may print progress: keep stdout for the command's own output (--json)
                with contextlib.redirect_stdout(sys.stderr):
                    rows = step.run()
            except Exception as exc:
                report.failed.append((step.label, f"{type(exc).__name__}: {exc}"))
                continue
            if rows:
                try:
                    report.run_ids += store(rows)
                except Exception as exc:  # e.g. the knowledge base rejects a malformed row: keep going
                    report.failed.append(
                        (step.label, f"storing its rows failed: {type(exc).__name__}: {exc}")
                    )
                    continue
                report.rows += rows
            report.done.append(step.label)
    return report


def measured_figures(rows: list[dict]) -> dict[str, float]:
    """Figures for the GPU profile's measured table from the rows of a bench run."""
    from hpc_advise.runtime.measure import comm, microbench

    return {**microbench.measured_figures(rows), **comm.measured_figures(rows)}


RESULT_HEADERS = ["kind", "subject", "provider", "config", "metric", "p20", "p50", "p80", "unit"]
_SKIP_CONFIG = {"env", "latency_us_p50", "flops", "bytes_moved", "busbw_factor", "NCCL_NVLS_ENABLE",
                "TORCH_SYMM_MEM_DISABLE_MULTICAST", "iters"}  # fmt: skip


def results_table(rows: list[dict]) -> list[list]:
    """One line per row for ``write_results``: the config's defining keys, the three percentiles."""

    def short(cfg: dict) -> str:
        return " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in cfg.items()
            if k not in _SKIP_CONFIG
        )

    return [[r["kind"], r["subject"], r["provider"], short(r.get("config", {})), r["metric"], r["p20"], r["p50"],
             r["p80"], r["unit"]] for r in rows]  # fmt: skip
