"""``hpc-advise runtime``: the dispatch table for a model on a GPU, and the environment report.

``hpc-advise runtime check [--model NAME|config.json] [--gpu NAME] [--tp N] [--ep N] [--kv-dtype D] [--page-size P]
[--json]`` prints, per op, whether our kernel or SGLang's runs and why (``dispatch.py``), the MoE token
buckets handed to SGLang's triton because it measured faster there (with the figure), then the
versions of the GPU stack (``env_report.py``). Without ``--gpu`` the local GPU (NVML) is used; without
a GPU the table says so. torch is not imported unless it is installed and the report asks it for CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from tabulate import tabulate

from hpc_advise import rules
from hpc_advise.clitypes import Aliased
from hpc_advise.runtime import dispatch, env_report


def _resolve_gpu(name: str | None, rep: dict[str, str]):
    from hpc_advise.profiles import find_gpu, get_gpu

    if name:
        return get_gpu(name)
    local = env_report.local_gpu_name(rep)
    if local is None:
        return None
    prof = find_gpu(local)
    if prof is None:
        raise click.ClickException(
            f"local GPU {local!r} has no profile; pass --gpu NAME (see `hpc-advise profiles list`)"
        )
    return prof


def _architecture(model_name: str) -> str | None:
    """``architectures[0]`` of a config.json given by path (shipped profiles are matched by key)."""
    path = Path(model_name).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        return None
    try:
        archs = json.loads(path.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None  # get_model already reported a malformed file
    return str(archs[0]) if archs else None


@click.group("runtime")
def runtime() -> None:
    """Runtime: dispatch table (our kernel or SGLang's, and why) and environment report."""


@runtime.command("check")
@click.option(
    "--model", "model_name", default=None, help="Model profile name, HF id, or path to a config.json."
)
@click.option("--gpu", "gpu_name", default=None, help="GPU profile name (default: the local GPU via NVML).")
@click.option("--tp-size", "--tp", "tp", cls=Aliased, aliases=("--tp",), type=click.IntRange(1, 64), default=1,
              show_default=True, help="Tensor parallelism (SGLang's --tp-size).")  # fmt: skip
@click.option("--ep-size", "--ep", "ep", cls=Aliased, aliases=("--ep",), type=click.IntRange(1, 64), default=1,
              show_default=True, help="Expert parallelism (divides --tp-size).")  # fmt: skip
@click.option("--kv-cache-dtype", "--kv-dtype", "kv_dtype", cls=Aliased, aliases=("--kv-dtype",),
              type=click.Choice(["bf16", "fp8_e4m3"]), default="bf16", show_default=True)  # fmt: skip
@click.option(
    "--page-size", type=click.IntRange(1, 1024), default=rules.REQUIRED_PAGE_SIZE, show_default=True
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def check(model_name, gpu_name, tp, ep, kv_dtype, page_size, as_json) -> None:
    """Print the dispatch table for MODEL on GPU, and the environment report."""
    from hpc_advise.profiles import ModelConfigError, ProfileNotFound, get_model

    rep = env_report.report()
    try:
        gpu = _resolve_gpu(gpu_name, rep)
        model = get_model(model_name) if model_name else None
    except (ProfileNotFound, ModelConfigError) as exc:
        raise click.ClickException(str(exc)) from None
    if tp % ep:
        raise click.ClickException(f"--ep {ep} does not divide --tp {tp}")
    rows, handoffs = [], []
    if model is not None:
        cond = rules.conditions(
            model,
            gpu,
            tp=tp,
            ep=ep,
            kv_dtype=kv_dtype,
            page_size=page_size,
            architecture=_architecture(model_name),
        )
        rows = dispatch.table(cond, ep=ep)
        handoffs = dispatch.moe_handoffs(cond, ep=ep)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "model": model.key if model else None,
                    "gpu": gpu.key if gpu else None,
                    "tp": tp,
                    "ep": ep,
                    "kv_dtype": kv_dtype,
                    "page_size": page_size,
                    "dispatch": [d.to_dict() for d in rows],
                    "moe_handoff": [d.to_dict() for d in handoffs],
                    "environment": rep,
                },
                indent=2,
            )
        )
        return
    if model is not None:
        where = gpu.name if gpu is not None else "no GPU"
        click.echo(f"Dispatch for {model.key} on {where} (TP {tp}, {kv_dtype} KV, page {page_size}):")
        click.echo(
            tabulate(
                [[d.op, d.outcome, d.provider, d.reason] for d in rows],
                headers=["op", "runs", "provider", "reason"],
            )
        )
        if handoffs:
            click.echo("\nMoE token buckets handed to SGLang's triton (measured faster than ours):")
            for d in handoffs:
                click.echo(f"  {d.reason}")
        click.echo("")
    else:
        click.echo("(no --model: dispatch table skipped)\n")
    click.echo("Environment:")
    click.echo(tabulate([[k, v] for k, v in rep.items()], headers=["component", "version"]))
