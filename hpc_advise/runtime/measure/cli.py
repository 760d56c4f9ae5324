"""``hpc-advise profile``: read the local GPUs through NVML, optionally benchmark them, store the facts.

1. ``advisor.gpu_probe.probe()`` reads every GPU (no NVML / driver / GPU: one line, a hint, exit 2,
   nothing written);
2. with ``--bench``, microbenchmarks, kernel benchmarks and/or the communication benchmark run under a
   progress bar; every measurement is one knowledge-base ``runs`` row;
3. one ``gpus`` row per GPU model on the host goes to the knowledge base: the NVML facts, the matched
   profile and, after ``--bench``, the measured figures (``measured``, ``measured_source``) that
   ``hpc_advise.profiles.get_local_gpu`` overlays on the shipped profile;
4. a table (or ``--json``).

``--gpu NAME`` reads no NVML and writes nothing: it prints the shipped profile of NAME with the
measurements this machine's knowledge base holds for it. torch is imported only for ``--bench``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import sys
from pathlib import Path

import click

from hpc_advise.advisor.gpu_probe import HostFacts, NvmlUnavailable, probe
from hpc_advise.profiles import ProfileNotFound, get_gpu, with_local_measurements

EXIT_NO_GPU = 2
GiB = 2**30


def _fail(reason: str, hint: str | None = None) -> None:
    click.echo(f"hpc-advise profile: {reason}", err=True)
    if hint:
        click.echo(f"hint: {hint}", err=True)
    sys.exit(EXIT_NO_GPU)


def _open_kb(db: Path | None):
    from hpc_advise.knowledge_base.store import KnowledgeBase

    try:
        return KnowledgeBase(db)
    except Exception as exc:  # unusable file, newer schema, locked: say which and stop
        raise click.ClickException(f"knowledge base: {exc}") from None


def _gpu_rows(host: HostFacts, measured: dict[str, float], source: str, run_ids: list[int]) -> list[dict]:
    rows = []
    for i, (name, gpus) in enumerate(host.groups().items()):
        facts = {
            "name": name,
            "count": len(gpus),
            "profile": gpus[0].profile,
            "hostname": host.hostname,
            "driver_version": host.driver_version,
            "cuda_driver_version": host.cuda_driver_version,
            "nvml_version": host.nvml_version,
            "devices": [dataclasses.asdict(g) for g in gpus],
            "topology": host.topology,
        }
        # microbenchmarks run on GPU 0: their figures belong to GPU 0's model only
        if measured and i == 0:
            facts.update(measured=measured, measured_source=source, run_ids=run_ids)
        rows.append(facts)
    return rows


def _measured_source(host: HostFacts, rows: list[dict]) -> str:
    versions = rows[0].get("versions", {}) if rows else {}
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    parts = [f"hpc-advise profile --bench on {host.hostname}", date]
    parts += [f"{k} {versions[k]}" for k in ("torch", "cuda") if k in versions]
    if host.driver_version:
        parts.append(f"driver {host.driver_version}")
    return ", ".join(parts)


def _print_host(host: HostFacts) -> None:
    from tabulate import tabulate

    click.echo(
        f"host {host.hostname}: driver {host.driver_version or '?'}, CUDA driver {host.cuda_driver_version or '?'}, "
        f"{len(host.gpus)} GPU(s)"
    )

    def yn(v: bool | None) -> str:
        return "-" if v is None else ("on" if v else "off")

    rows = [
        [
            g.index,
            g.name,
            g.profile or "(no profile)",
            ".".join(map(str, g.compute_capability)) if g.compute_capability else "-",
            f"{g.memory_total_bytes / GiB:.1f}",
            f"{g.memory_free_bytes / GiB:.1f}",
            f"{g.sm_clock_mhz or '-'}/{g.sm_clock_max_mhz or '-'}",
            g.mem_clock_max_mhz or "-",
            f"{g.power_limit_w:g}" if g.power_limit_w else "-",
            yn(g.ecc_enabled),
            yn(g.mig_enabled),
            "-" if g.nvlink_active_links is None else g.nvlink_active_links,
            len(g.processes),
        ]  # fmt: skip
        for g in host.gpus
    ]
    headers = ["#", "name", "profile", "CC", "mem GiB", "free GiB", "SM MHz", "mem MHz max", "power W",
               "ECC", "MIG", "NVLinks", "procs"]  # fmt: skip
    click.echo(tabulate(rows, headers=headers, disable_numparse=True))
    if len(host.gpus) > 1:
        click.echo("\ntopology (NV<links> = NVLink peer-to-peer; else PCIe level as in nvidia-smi topo -m):")
        hdr = [""] + [f"GPU{i}" for i in range(len(host.gpus))]
        click.echo(tabulate([[f"GPU{i}", *r] for i, r in enumerate(host.topology)], headers=hdr))


def _print_bench(report, measured: dict[str, float], profile_key: str | None) -> None:
    from tabulate import tabulate

    click.echo(f"\nbenchmarks: {len(report.rows)} runs rows stored ({len(report.done)} steps done)")
    for name, why in report.skipped:
        click.echo(f"  skipped {name}: {why}")
    for name, why in report.failed:
        click.echo(f"  FAILED {name}: {why}")
    _print_rows(report.rows)
    if not measured:
        return
    # the shipped profile without its measured table: rate() then gives the vendor figure
    vendor_prof = dataclasses.replace(get_gpu(profile_key), measured={}) if profile_key else None
    rows = []
    for key, value in sorted(measured.items()):
        try:
            vendor = vendor_prof.rate(key) if vendor_prof is not None else None
        except KeyError:  # a figure with no vendor counterpart (e.g. comm_world_size)
            vendor = None
        ratio = f"{value / vendor:.0%}" if vendor else "-"
        rows.append([key, f"{value:.4g}", "-" if vendor is None else f"{vendor:g}", ratio])
    click.echo(
        tabulate(rows, headers=["figure", "measured", "vendor", "measured/vendor"], disable_numparse=True)
    )


def _print_rows(rows: list[dict]) -> None:
    """The bench rows, one table per (kind, subject) under its own title and header line (a kernel's
    rows, e.g. fused_moe's, never follow another table's header)."""
    from tabulate import tabulate

    from hpc_advise.runtime.measure.profile import RESULT_HEADERS, results_table

    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((str(r.get("kind", "")), str(r.get("subject", ""))), []).append(r)
    for (kind, subject), group in groups.items():
        click.echo(f"\n{kind} {subject}: {len(group)} row(s)")
        click.echo(tabulate(results_table(group), headers=RESULT_HEADERS, disable_numparse=True))


@click.command("profile")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Knowledge-base file (default: $HPC_ADVISE_HOME/kb.db).")  # fmt: skip
@click.option("--bench", "bench", is_flag=False, flag_value="default", default=None, metavar="[STAGES]",
              help="Benchmark this machine: alone = micro,kernels; or a comma list of micro, kernels, comm; or all. "
                   "Needs torch and a CUDA GPU.")  # fmt: skip
@click.option("--grid", type=click.Choice(["small", "full"]), default="small", show_default=True,
              help="Microbenchmark grid (kernel benchmarks always run their small grid).")  # fmt: skip
@click.option(
    "--model", default=None, help="Model (name or config.json) for kernel benchmarks that take one."
)
@click.option("--write-results", "results_stem", default=None, metavar="STEM",
              help="Also write the bench rows as STEM.md + STEM.jsonl (benchmarks/results, or $OUT / $HPC_ADVISE_RESULTS).")  # fmt: skip
@click.option("--gpu", "offline_gpu", default=None,
              help="Read no NVML, write nothing: show this GPU profile with this machine's stored measurements.")  # fmt: skip
def profile(
    as_json: bool,
    db: Path | None,
    bench: str | None,
    grid: str,
    model: str | None,
    results_stem: str | None,
    offline_gpu: str | None,
) -> None:
    """Measure THIS machine: read its GPUs (NVML), optionally benchmark them, store the facts in the
    knowledge base. (`hpc-advise profiles` browses the shipped GPU and model profiles instead.)"""
    if offline_gpu is not None:
        _offline(offline_gpu, db, as_json)
        return
    from hpc_advise.runtime.measure.profile import parse_stages

    stages = parse_stages(bench) if bench is not None else ()
    try:
        host = probe()
    except NvmlUnavailable as exc:
        _fail(exc.reason, exc.hint)
    model_profile = None
    if model is not None:
        from hpc_advise.profiles import ModelConfigError, get_model

        try:
            model_profile = get_model(model)
        except (ProfileNotFound, ModelConfigError) as exc:
            raise click.BadParameter(str(exc), param_hint="--model") from None
    report, measured, source = None, {}, ""
    if stages:
        from hpc_advise.runtime.measure import profile as bench

        problem = bench.torch_cuda_problem()
        if problem:
            _fail(problem, "run `hpc-advise profile` without --bench to store the NVML facts only")
        kb = _open_kb(db)
        try:
            report = bench.BenchReport()
            steps = bench.build_steps(stages, grid=grid, model=model_profile, report=report)
            bench.run_steps(steps, report, kb.add_runs)
        except BaseException:
            kb.close()
            raise
        measured = bench.measured_figures(report.rows)
        source = _measured_source(host, report.rows)
        if results_stem and report.rows:
            _write_results(results_stem, report, measured, source)
    else:
        kb = _open_kb(db)
    try:
        gpu_ids = [
            kb.add_gpu(facts) for facts in _gpu_rows(host, measured, source, report.run_ids if report else [])
        ]
        kb_path = str(kb.path)
    finally:
        kb.close()
    if as_json:
        out = {"host": host.to_dict(), "kb": kb_path, "gpu_row_ids": gpu_ids}
        if report is not None:
            out["bench"] = {
                "stages": list(stages), "run_ids": report.run_ids, "done": report.done,
                "skipped": [list(s) for s in report.skipped], "failed": [list(f) for f in report.failed],
                "measured": measured, "measured_source": source,
            }  # fmt: skip
        click.echo(json.dumps(out, indent=2))
    else:
        _print_host(host)
        if report is not None:
            _print_bench(report, measured, host.gpus[0].profile)
        click.echo(f"\nstored {len(gpu_ids)} gpus row(s) in {kb_path}")
    if report is not None and report.failed:
        sys.exit(1)


def _write_results(stem: str, report, measured: dict[str, float], source: str) -> None:
    from hpc_advise.runtime.measure.harness import write_results
    from hpc_advise.runtime.measure.profile import RESULT_HEADERS, results_table

    notes = [
        f"Measured figures ({source}): " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(measured.items()))
    ]
    notes += [f"Skipped {name}: {why}." for name, why in report.skipped]
    notes += [f"FAILED {name}: {why}." for name, why in report.failed]
    md, jl = write_results(
        report.rows, results_table(report.rows), RESULT_HEADERS, stem=stem,
        title="hpc-advise profile --bench", notes="\n\n".join(notes),
    )  # fmt: skip
    click.echo(f"results: {md}, {jl}", err=True)


def _offline(name: str, db: Path | None, as_json: bool) -> None:
    try:
        prof = get_gpu(name)
    except ProfileNotFound as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu") from None
    from hpc_advise import paths

    path = db or paths.kb_path()
    if path.exists():  # never create a knowledge base here: this mode writes nothing
        kb = _open_kb(path)
        try:
            prof = with_local_measurements(prof, kb.gpus())
        finally:
            kb.close()
    if as_json:
        click.echo(json.dumps(prof.to_dict(), indent=2))
        return
    click.echo(f"{prof.name} ({prof.key}), offline: no NVML read, nothing written")
    for fig in (
        "copy_bw_tbps",
        "bf16_tflops",
        "fp8_tflops",
        "tf32_tflops",
        "fp32_tflops",
        "allreduce_busbw_gbps",
    ):
        src = "measured" if fig in prof.measured else "vendor"
        value = prof.rate(fig)
        click.echo(f"  {fig:<22} {'-' if value is None else f'{value:g}'}  ({src})")
    if prof.measured:
        click.echo(f"  measured: {prof.measured_source}")
