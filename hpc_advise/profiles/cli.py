"""``hpc-advise profiles``: list and show the shipped GPU and model profiles (``--json`` for machines)."""

from __future__ import annotations

import json

import click

from hpc_advise.profiles.model import ModelConfigError
from hpc_advise.profiles.registry import ProfileNotFound, get_gpu, get_model, list_gpus, list_models


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ".".join(str(v) for v in value)
    return str(value)


def _human(n: int | None, unit: str = "") -> str:
    if n is None:
        return "-"
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{suffix}{unit}"
    return f"{n}{unit}"


@click.group("profiles")
def profiles() -> None:
    """Browse the GPU and model profiles shipped with hpc-advise (no GPU needed; `hpc-advise profile`
    measures this machine instead)."""


@profiles.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--kind", type=click.Choice(["all", "gpus", "models"]), default="all", show_default=True)
def list_cmd(as_json: bool, kind: str) -> None:
    """List the shipped profiles."""
    from tabulate import tabulate

    gpus = list_gpus() if kind in ("all", "gpus") else []
    models = list_models() if kind in ("all", "models") else []
    if as_json:
        click.echo(
            json.dumps(
                {"gpus": [g.to_dict() for g in gpus], "models": [m.to_dict() for m in models]}, indent=2
            )
        )
        return
    if gpus:
        rows = [
            [
                g.key,
                g.name,
                _fmt(g.memory_gib),
                _fmt(g.rate("copy_bw_tbps")),
                _fmt(g.rate("bf16_tflops")),
                _fmt(g.rate("fp8_tflops")),
                _fmt(g.compute_capability),
                "yes" if g.measured else "no",
            ]
            for g in gpus
        ]
        hdr = ["gpu", "name", "GiB", "mem TB/s", "bf16 TFLOP/s", "fp8 TFLOP/s", "CC", "measured"]
        click.echo(tabulate(rows, headers=hdr, disable_numparse=True))
        click.echo("(rates: measured where present, else vendor)")
    if gpus and models:
        click.echo()
    if models:
        rows = [
            [
                m.key,
                m.hf_id,
                m.attention,
                m.num_layers,
                f"{m.num_experts}/{m.top_k}" if m.is_moe else "dense",
                m.quantization,
                _human(m.total_params()),
                _human(m.active_params_per_token()),
                _human(m.kv_bytes_per_token(), "B"),
            ]
            for m in models
        ]
        hdr = [
            "model",
            "hf id",
            "attn",
            "layers",
            "experts/top-k",
            "quant",
            "params",
            "active",
            "KV/token bf16",
        ]
        click.echo(tabulate(rows, headers=hdr, disable_numparse=True))


@profiles.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show_cmd(name: str, as_json: bool) -> None:
    """Show one GPU or model profile (a name, a Hugging Face id, or a path to a config.json)."""
    try:
        prof = get_gpu(name)
        body, derived = prof.to_dict(), {}
    except ProfileNotFound as gpu_err:
        try:
            prof = get_model(name)
        except ProfileNotFound as model_err:
            raise click.ClickException(f"{gpu_err}\n{model_err}") from None
        except ModelConfigError as exc:
            raise click.ClickException(str(exc)) from None
        body, derived = prof.to_dict(), prof.derived()
    if as_json:
        click.echo(json.dumps({**body, "derived": derived} if derived else body, indent=2))
        return
    width = max(len(k) for k in (*body, *derived))
    for k, v in body.items():
        if isinstance(v, dict):
            v = ", ".join(f"{a}={_fmt(b)}" for a, b in v.items()) or "-"
        elif k == "compute_capability":
            v = ".".join(str(x) for x in v)
        elif isinstance(v, list):
            v = ", ".join(str(x) for x in v) or "-"
        click.echo(f"{k:<{width}}  {_fmt(v)}")
    if derived:
        click.echo("derived:")
        for k, v in derived.items():
            human = (
                f"  ({_human(v, 'B' if 'bytes' in k else '')})" if isinstance(v, int) and v >= 1000 else ""
            )
            click.echo(f"  {k:<{width}}  {_fmt(v)}{human}")
