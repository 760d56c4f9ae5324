"""Click commands of the advisor's model: ``model fit|eval|show``, ``recommend``, ``predict``, ``launch``.

Click only: parse the options, resolve the GPU (``--gpu``/``--gpus`` or the NVML probe, else an
announced H200 x 8 default), call the work (``serving_model``, ``candidates``, ``recommend``,
``launch``) and hand the result to ``report``, which renders it.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import click

from hpc_advise.advisor.candidates import ATTENTION_BACKENDS, MOE_RUNNERS
from hpc_advise.clitypes import (
    IMAGE_SUFFIXES,
    MAX_CONCURRENCY,
    MAX_GPUS,
    MAX_NIC_GBPS,
    MAX_SLO_MS,
    MAX_TOKENS,
    MAX_TOP,
    Aliased,
    FiniteFloat,
    Timer,
    check_output_file,
    positive_float,
    positive_int,
)

DEFAULT_GPU, DEFAULT_GPUS = "h200", 8

# parse-time types of the scenario's numbers (hpc_advise.clitypes says why the limits are what they are)
GPUS = positive_int(MAX_GPUS)
SLO_MS = positive_float(MAX_SLO_MS)
IN_FLIGHT = FiniteFloat(min=1.0, max=float(MAX_CONCURRENCY))
TOKENS = FiniteFloat(min=1.0, max=float(MAX_TOKENS))
NIC_GBPS = positive_float(MAX_NIC_GBPS)

db_option = click.option(
    "--db",
    "db",
    type=click.Path(dir_okay=False),
    default=None,
    help="Knowledge-base file (default: hpc-advise kb path).",
)


def _fail(msg: str) -> None:
    raise click.ClickException(msg)


def _load_model(db, refit=False):
    from hpc_advise.advisor import serving_model as pm

    with Timer("loading the serving model (a refit takes a few seconds)"):
        model, info = pm.load_or_fit(db, refit=refit)
    return model, info


def _resolve_target(
    gpu: str | None, gpus: int | None, nic_gbps: float | None = None
) -> tuple[object, int, str]:
    """(GpuProfile, N, note) from the flags, the NVML probe, or the announced default; ``nic_gbps``
    replaces the profile's inter-node link."""
    from hpc_advise.advisor.serving_data import RowError
    from hpc_advise.advisor.serving_model import resolve_gpu

    note = ""
    if gpu is None:
        try:
            from hpc_advise.advisor.gpu_probe import NvmlUnavailable, probe

            host = probe()
            keys = [g.profile for g in host.gpus if g.profile]
            if keys:
                gpu = keys[0]
                gpus = gpus if gpus is not None else len(keys)
                note = f"detected {len(keys)} x {gpu} (NVML)"
            else:
                raise NvmlUnavailable("no GPU with a shipped profile")
        except Exception as exc:  # NvmlUnavailable and anything else NVML throws
            gpu, gpus = DEFAULT_GPU, gpus if gpus is not None else DEFAULT_GPUS
            note = f"no GPU detected ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); assuming {gpus} x H200 (use --gpu NAME --gpus N)"
    try:
        prof = resolve_gpu(gpu)
    except RowError as exc:
        _fail(str(exc))
    if nic_gbps is not None:
        import dataclasses

        prof = dataclasses.replace(prof, nic_gbps=float(nic_gbps))
    n = int(gpus if gpus is not None else DEFAULT_GPUS)
    if not 1 <= n <= MAX_GPUS:  # NVML reported more than one deployment covers
        _fail(f"{n} GPUs: the advisor covers 1 to {MAX_GPUS} (give --gpus N)")
    return prof, n, note


def _resolve_model(name: str):
    from hpc_advise.advisor.serving_data import RowError
    from hpc_advise.advisor.serving_model import resolve_model

    try:
        return resolve_model(name)
    except (RowError, ValueError) as exc:
        _fail(str(exc))


def _gpus_option(help_text: str):
    return click.option("--gpus", type=GPUS, default=None, help=f"{help_text} (1-{MAX_GPUS}).")


_nic_option = click.option(
    "--nic-gbps",
    type=NIC_GBPS,
    default=None,
    help="Inter-node GB/s per GPU per direction, for deployments beyond one node (default: the GPU profile's).",
)


def _slo_options(f):
    f = click.option(
        "--slo-ttft-ms",
        type=SLO_MS,
        default=None,
        help="TTFT service-level objective, checked at p99 (ms > 0).",
    )(f)
    return click.option(
        "--slo-tpot-ms",
        type=SLO_MS,
        default=None,
        help="TPOT service-level objective, checked at p99 (ms > 0).",
    )(f)


_IN_FLIGHT_HELP = (
    "Closed loop: requests in flight over all GPUs (1-65536), instead of the trace's arrival rate "
    "(not `trace summarize --decode-batch`)."
)


# ----- model ----------------------------------------------------------------------------------


@click.group("model")
def model() -> None:
    """Fit, evaluate and show the serving performance model."""


def _load_calibration(db, serving):
    """Per-deployment corrections from the KB's measured runs (``calibration``)."""
    from hpc_advise.advisor import calibration
    from hpc_advise.knowledge_base.migrations import KnowledgeBaseError

    try:
        return calibration.from_kb(db, serving)
    except KnowledgeBaseError as exc:
        _fail(str(exc))


@model.command("fit")
@db_option
@click.option(
    "--refit", is_flag=True, help="Fit even when the shipped or a cached model matches the training data."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def model_fit(db, refit, as_json) -> None:
    """Fit on the shipped measurements + the KB's serving runs; cache under the data hash (without
    serving runs in the KB: the fit shipped with hpc-advise). Then calibrate each measured deployment
    on its runs and list every run left out with its reason."""
    m, info = _load_model(db, refit=refit)
    cal = _load_calibration(db, m)
    if as_json:
        click.echo(json.dumps({
            "key": m.key, "cached": info["cached"], "shipped": info.get("shipped", False),
            "path": info["path"], "n_rows": m.n_rows,
            "left_out": [list(x) for x in info["left_out"]],
            "calibration": [c.to_dict() for c in cal.corrections.values()],
            "calibration_dropped": [{"run": w, "reason": r} for w, r in cal.dropped],
        }, indent=2))  # fmt: skip
        return
    state = "shipped" if info.get("shipped") else "cached" if info["cached"] else "fitted"
    click.echo(
        f"{state}: model {m.key} on {m.n_rows} rows {m.rows_by_engine} -> {info['path'] or 'not cached (data folder not writable)'}"
    )
    if info["left_out"]:
        click.echo(
            f"{len(info['left_out'])} rows left out (first: {info['left_out'][0][0]}: {info['left_out'][0][1]})"
        )
    n_runs = sum(c.n for c in cal.corrections.values())
    if cal.corrections or cal.dropped:
        click.echo(f"calibration: {len(cal.corrections)} deployment(s) from {n_runs} measured run(s)")
    for c in cal.corrections.values():
        click.echo(f"  {c.deployment.label()}: {c.note()} (runs {', '.join(map(str, c.run_ids))})")
    for where, why in cal.dropped:
        click.echo(f"  left out {where}: {why}")


@model.command("eval")
@db_option
@click.option(
    "--by",
    "by",
    type=click.Choice(["model", "gpu", "engine_family", "both", "all"]),
    default="all",
    show_default=True,
    help="Grouping to hold out: 'both' = model and gpu, 'all' = model, gpu and engine x GPU family.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def model_eval(db, by, as_json) -> None:
    """Grouped cross-validation: hold out each model, each GPU, each engine x GPU family (e.g. every
    vLLM row on Hopper); median/p90 APE of TPOT, TTFT."""
    from tabulate import tabulate

    from hpc_advise.advisor import serving_model as pm

    points, _ = pm.training_points(db)
    preps, _ = pm.prepare_all(points)
    groups = {"all": pm.GROUPINGS, "both": ("model", "gpu")}.get(by, (by,))
    with Timer(
        f"cross-validating on {len(preps)} rows, holding out each {', '.join(groups)} (minutes on 2 cores)"
    ):
        rows = pm.evaluate(preps, by=groups)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(tabulate([pm.describe_row(r) for r in rows], headers=pm.EVAL_HEADERS, tablefmt="github"))
    click.echo("target: TPOT median <= 10 %, p90 <= 25 % on held-out models; 'all' pools every held-out row")


@model.command("show")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def model_show(db, as_json) -> None:
    """Training data, coefficients and ranges of the fitted model."""
    m, info = _load_model(db)
    s = m.summary()
    s["cache"] = info["path"]
    if as_json:
        click.echo(json.dumps(s, indent=2, default=str))
        return
    click.echo(f"model {s['key']}: {s['n_rows']} rows by engine {s['rows_by_engine']} (cache {info['path']})")
    for which, th in s["theta"].items():
        for eng, t in th.items():
            click.echo(f"  {which} stage-1 [{eng}]: " + ", ".join(f"{k}={v:.3g}" for k, v in t.items()))
    for k, v in s["ranges"].items():
        click.echo(f"  range {k}: {v}")


# ----- recommend ------------------------------------------------------------------------------


def _recommend_core(
    trace,
    model_name,
    gpu,
    gpus,
    slo_tpot,
    slo_ttft,
    concurrency,
    db,
    skip_bad,
    fmt=None,
    advise=False,
    nic=None,
):
    """Read, rank; with ``advise``, when nothing meets the SLOs, also rank on more GPUs (``more``,
    the last item returned; None otherwise)."""
    from hpc_advise.advisor.kernel_models import load_attention_model
    from hpc_advise.advisor.recommend import Ranker, TraceLoad, more_gpus, rank_candidates
    from hpc_advise.advisor.traces import TraceError, summarize

    prof_gpu, n, note = _resolve_target(gpu, gpus, nic)
    mdl = _resolve_model(model_name)
    from hpc_advise.advisor.simulated import TraceRequests

    requests = TraceRequests()  # what the simulated stage replays, kept from the same pass
    try:
        with Timer(f"reading the trace {trace}"):
            summary = summarize(trace, fmt=fmt, skip_bad=skip_bad, keep=requests.add)
    except TraceError as exc:
        _fail(str(exc))
    summary.requests = requests
    serving, _ = _load_model(db)
    ranker = Ranker(
        model_name,
        mdl,
        prof_gpu,
        TraceLoad.from_summary(summary),
        serving,
        load_attention_model(db),
        _load_calibration(db, serving),
    )
    with Timer(f"ranking the configurations of {mdl.key} on {n} GPU(s)"):
        ranked, excluded = rank_candidates(ranker, n, slo_tpot, slo_ttft, concurrency)
    more = None
    if advise and ranked and (slo_tpot or slo_ttft) and not ranked[0].meets_slo:
        node = prof_gpu.node_gpus
        with Timer(
            f"nothing meets the SLOs: ranking on {', '.join(str(k * node) for k in (1, 2, 4) if k * node > n)} GPUs"
        ):
            more = more_gpus(ranker, n, slo_tpot, slo_ttft, concurrency)
    return prof_gpu, n, note, mdl, summary, serving, ranked, excluded, more


def ranker_concurrency(summary) -> int:
    from hpc_advise.advisor.recommend import TraceLoad

    return TraceLoad.from_summary(summary).default_concurrency


@click.command("recommend")
@click.option("--trace", "trace", required=True, help="Trace file (any supported format; '-' = stdin).")
@click.option("--model", "model_name", required=True, help="Model profile name, HF id or config.json path.")
@click.option("--gpu", default=None, help="GPU profile (default: detected, else H200).")
@_gpus_option("GPUs to use (default: all detected, else 8)")
@_slo_options
@click.option("--concurrency", type=IN_FLIGHT, default=None, help=_IN_FLIGHT_HELP)
@click.option(
    "--top", type=positive_int(MAX_TOP), default=5, show_default=True, help="Rows of the ranked table."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
@click.option(
    "--plot",
    "plot",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a Pareto chart (.png, .svg or .pdf; needs the 'plot' extra).",
)
@click.option("--show-excluded", is_flag=True, help="List excluded candidates, grouped by reason.")
@click.option("--skip-bad", is_flag=True, help="Skip malformed trace lines instead of stopping.")
@click.option(
    "--trace-format", "fmt", default=None, help="Trace format when detection fails (see `trace summarize`)."
)
@_nic_option
@db_option
def recommend(
    trace,
    model_name,
    gpu,
    gpus,
    slo_tpot_ms,
    slo_ttft_ms,
    concurrency,
    top,
    as_json,
    plot,
    show_excluded,
    skip_bad,
    fmt,
    nic_gbps,
    db,
) -> None:
    """Rank SGLang configurations for a trace, a model and GPUs; print the launch command."""
    from hpc_advise.advisor.launch import build_command

    if plot:
        check_output_file(plot, "--plot", IMAGE_SUFFIXES)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            _fail("--plot needs matplotlib: pip install 'hpc-advise[plot]'")
    prof_gpu, n, note, mdl, summary, serving, ranked, excluded, more = _recommend_core(
        trace,
        model_name,
        gpu,
        gpus,
        slo_tpot_ms,
        slo_ttft_ms,
        concurrency,
        db,
        skip_bad,
        fmt,
        advise=True,
        nic=nic_gbps,
    )
    from hpc_advise.advisor.recommend import TraceLoad, reuse_note

    notes = [note]
    if not summary.rate_rps and concurrency is None:
        notes.append(
            f"the trace has no arrival times: {ranker_concurrency(summary)} requests in flight assumed (--concurrency N)"
        )
    notes.append(reuse_note(TraceLoad.from_summary(summary)))
    if not mdl.hf_id and not model_name.endswith(".json"):
        notes.append(
            f"{model_name} names no checkpoint of its {mdl.quantization} weights: replace --model-path in the "
            "launch line (or `hpc-advise launch --model-path`)"
        )
    note = "; ".join(n for n in notes if n)
    if note and not as_json:
        click.echo(note, err=True)
    cmd = (
        build_command(ranked[0].candidate, mdl.hf_id or model_name, model=mdl, node_gpus=prof_gpu.node_gpus)
        if ranked
        else None
    )
    from hpc_advise.advisor import report

    inputs, outputs = report.recommend_record(
        trace,
        model_name,
        prof_gpu,
        n,
        slo_tpot_ms,
        slo_ttft_ms,
        concurrency,
        summary,
        ranked,
        excluded,
        top,
        cmd,
        more,
    )
    if plot and ranked:  # before the log: a chart that fails leaves no recommendation behind
        from hpc_advise.advisor.plot import pareto_png

        try:
            pareto_png(ranked, plot, slo_tpot_ms, slo_ttft_ms, title=f"{mdl.key} on {n} x {prof_gpu.key}")
        except OSError as exc:
            _fail(f"--plot {plot}: {exc.strerror or exc}; nothing logged")
    from hpc_advise.knowledge_base.cli import open_kb

    with open_kb(Path(db) if db else None) as kb:
        rec_id = kb.add_recommendation(inputs, outputs, serving.key)
    if as_json:
        click.echo(report.recommend_json(outputs, rec_id, note, excluded, show_excluded))
        return
    for line in report.recommend_warnings(ranked, slo_tpot_ms, slo_ttft_ms):
        click.echo(line, err=True)
    click.echo(
        report.recommend_text(
            ranked,
            excluded,
            summary,
            mdl,
            prof_gpu,
            n,
            slo_tpot_ms,
            slo_ttft_ms,
            top,
            cmd,
            rec_id,
            show_excluded,
            more,
        )
    )


# ----- predict --------------------------------------------------------------------------------


def _predict_batch(path: str, db, as_json: bool) -> None:
    from hpc_advise.advisor import serving_model as pm
    from hpc_advise.advisor.serving_data import RowError, point_from_csv_row, read_csv_rows

    serving, _ = _load_model(db)
    results = []
    try:
        rows = list(read_csv_rows(path))
    except (RowError, OSError) as exc:
        _fail(str(exc))
    preps, slots = [], []
    for where, row in rows:
        res = {"line": where, "id": row.get("id"), "ttft_ms": None, "tpot_ms": None, "reason": None}
        try:
            prep = pm.prepare(point_from_csv_row(row, where))
            preps.append(prep)
            slots.append(len(results))
        except RowError as exc:
            res["reason"] = str(exc)
        for k in ("silicon_ttft_ms", "silicon_tpot_ms"):
            try:
                res[k.replace("silicon", "measured")] = float(row[k]) if row.get(k) else None
            except ValueError:
                res[k.replace("silicon", "measured")] = None
        results.append(res)
    if preps:
        pred = serving.predict(preps)
        for i, slot in enumerate(slots):
            results[slot]["ttft_ms"] = float(pred["ttft_ms"][i])
            results[slot]["tpot_ms"] = float(pred["tpot_ms"][i])
            results[slot]["out_of_range"] = serving.out_of_range(preps[i])
    out_path = Path(path).with_name(Path(path).name.split(".")[0] + ".predictions.csv")
    cols = ["line", "id", "ttft_ms", "tpot_ms", "measured_ttft_ms", "measured_tpot_ms", "reason"]
    with out_path.open("w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(cols)
        for r in results:
            wr.writerow(["" if r.get(c) is None else r.get(c) for c in cols])
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        n_ok = sum(r["tpot_ms"] is not None for r in results)
        click.echo(f"predicted {n_ok}/{len(results)} rows -> {out_path}")
        reasons: dict[str, int] = {}
        for r in results:
            if r["reason"]:
                reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
        for why, cnt in sorted(reasons.items(), key=lambda x: -x[1]):
            click.echo(f"  not predicted ({cnt}): {why}")


@click.command("predict")
@click.option("--model", "model_name", default=None, help="Model profile name, HF id or config.json path.")
@click.option("--gpu", default=None, help="GPU profile (default: detected, else H200).")
@_gpus_option("Total GPUs; replicas = gpus / tp-size")
@click.option("--tp-size", "--tp", "tp", cls=Aliased, aliases=("--tp",), type=GPUS, default=None,
              help="SGLang --tp-size: GPUs per replica (default: --gpus).")  # fmt: skip
@click.option("--ep-size", "--ep", "ep", cls=Aliased, aliases=("--ep",), type=GPUS, default=1,
              show_default=True, help="SGLang --ep-size (MoE models only).")  # fmt: skip
@click.option("--attn-dp-size", "--dp-size", "attn_dp_size", cls=Aliased, aliases=("--dp-size",), type=GPUS,
              default=1, show_default=True, help="Attention data parallelism (SGLang --dp-size with --enable-dp-attention).")  # fmt: skip
@click.option("--attention-backend", type=click.Choice(ATTENTION_BACKENDS), default="flashinfer",
              show_default=True, help="SGLang --attention-backend (hpc_advise: our decode attention).")  # fmt: skip
@click.option("--moe-runner-backend", type=click.Choice(MOE_RUNNERS), default=None,
              help="SGLang --moe-runner-backend (MoE models only; default auto).")  # fmt: skip
@click.option("--kv-cache-dtype", "--kv-dtype", "kv_cache_dtype", cls=Aliased, aliases=("--kv-dtype",),
              type=click.Choice(["auto", "fp8_e4m3"]), default="auto", show_default=True,
              help="SGLang --kv-cache-dtype.")  # fmt: skip
@click.option("--isl", type=TOKENS, default=None, help="Mean input tokens per request.")
@click.option("--osl", type=TOKENS, default=None, help="Mean output tokens per request.")
@click.option(
    "--concurrency", type=IN_FLIGHT, default=None, help="Requests in flight over all GPUs (1-65536)."
)
@click.option(
    "--batch",
    "batch",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="CSV with the columns of serving_measurements_train.csv.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@_nic_option
@db_option
def predict(
    model_name,
    gpu,
    gpus,
    tp,
    ep,
    attn_dp_size,
    attention_backend,
    moe_runner_backend,
    kv_cache_dtype,
    isl,
    osl,
    concurrency,
    batch,
    as_json,
    nic_gbps,
    db,
) -> None:
    """Predict TTFT/TPOT/throughput for one configuration (or every row of --batch FILE)."""
    if batch:
        _predict_batch(batch, db, as_json)
        return
    missing = [
        n
        for n, v in (("--model", model_name), ("--isl", isl), ("--osl", osl), ("--concurrency", concurrency))
        if v is None
    ]
    if missing:
        _fail(f"missing {', '.join(missing)} (or use --batch FILE)")
    import numpy as np

    from hpc_advise.advisor.candidates import Candidate, memory_check, support_reason
    from hpc_advise.advisor.kernel_models import load_attention_model
    from hpc_advise.advisor.recommend import Ranker, TraceLoad
    from hpc_advise.advisor.serving_data import RowError

    prof_gpu, n, note = _resolve_target(gpu, gpus, nic_gbps)
    mdl = _resolve_model(model_name)
    tp = tp or n
    if n % tp:
        _fail(f"--tp-size {tp} does not divide --gpus {n}")
    if not mdl.is_moe:
        if moe_runner_backend not in (None, "auto"):
            _fail(f"--moe-runner-backend {moe_runner_backend}: {mdl.key} is a dense model (no MoE layers)")
        if ep != 1:
            _fail(f"--ep-size {ep}: {mdl.key} is a dense model (no experts to split)")
    moe_runner_backend = moe_runner_backend or "auto"
    c = Candidate(
        tp,
        n // tp,
        ep,
        attn_dp_size,
        attention_backend,
        moe_runner_backend if mdl.is_moe else None,
        kv_cache_dtype,
    )
    if tp % attn_dp_size or tp % ep:
        _fail(f"--attn-dp-size {attn_dp_size} and --ep-size {ep} must divide --tp-size {tp}")
    why = support_reason(c, mdl, prof_gpu)
    w = TraceLoad(isl, osl, np.array([[isl, osl]]), None, 0.0, isl + osl / 2, isl + osl, int(concurrency))
    serving, _ = _load_model(db)
    ranker = Ranker(
        model_name, mdl, prof_gpu, w, serving, load_attention_model(db), _load_calibration(db, serving)
    )
    conc = max(concurrency / c.replicas, 1.0)
    ok, mem_why, mem = memory_check(c, mdl, prof_gpu, conc, w.ctx_mean, w.ctx_p99)
    try:
        preds = ranker.serving_predictions([c], {c: conc})
        from hpc_advise.advisor.candidates import Checked

        r = ranker.rank_one(Checked(c, ok, mem_why, mem), conc, next(iter(preds.values())), None, None)
    except RowError as exc:
        _fail(str(exc))
    flags = list(r.flags) + ([why] if why else []) + ([mem_why] if not ok else [])
    prep = next(iter(preds.values()))[2]
    if prep.admitted is not None:
        wait = float(serving.predict([prep])["admission_ms"][0])
        flags.append(
            f"KV admits {prep.admitted.point.concurrency:.0f} of the {conc:.0f} requests at once: TTFT includes "
            f"{wait:.0f} ms waiting for admission"
        )
    out = {
        "config": c.label(),
        "gpu": prof_gpu.key,
        "gpus": n,
        "ttft_ms": {"p50": r.ttft_p50, "p99": r.ttft_p99},
        "tpot_ms": {"p50": r.tpot_p50, "p99": r.tpot_p99},
        "output_tok_s": r.tok_s_per_gpu * n,
        "output_tok_s_per_gpu": r.tok_s_per_gpu,
        "memory": mem,
        "flags": flags,
        "model_key": serving.key,
        "note": note,
    }
    if r.calibration:
        out["calibration"] = r.calibration
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    if note:
        click.echo(note, err=True)
    from hpc_advise.advisor import report

    click.echo(report.predict_text(c, r, out, n, prof_gpu, isl, osl, concurrency, flags))


# ----- launch ---------------------------------------------------------------------------------


@click.command("launch", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--recommendation",
    "rec_id",
    type=positive_int(),
    default=None,
    help="Launch a logged recommendation's top pick.",
)
@click.option(
    "--trace", default=None, help="Trace to recommend for (with --model; instead of --recommendation)."
)
@click.option("--model", "model_name", default=None, help="Model profile name, HF id or config.json path.")
@click.option("--model-path", default=None, help="Path or HF id SGLang loads (default: the profile's HF id).")
@click.option("--gpu", default=None, help="GPU profile (default: detected, else H200).")
@_gpus_option("GPUs to use (default: all detected, else 8)")
@_slo_options
@click.option("--concurrency", type=IN_FLIGHT, default=None, help=_IN_FLIGHT_HELP)
@click.option("--nnodes", type=positive_int(MAX_GPUS), default=None, help="SGLang --nnodes.")
@click.option("--node-rank", type=click.IntRange(0, MAX_GPUS - 1), default=None, help="SGLang --node-rank.")
@click.option("--dist-init-addr", default=None, help="SGLang --dist-init-addr (HOST:PORT).")
@click.option("--python", "python", default=None, help="Python that runs SGLang (default: this one).")
@click.option("--dry-run", is_flag=True, help="Print the command and environment; do not start SGLang.")
@click.option("--no-validate", is_flag=True, help="Skip SGLang's argument parser check.")
@_nic_option
@db_option
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def launch(
    rec_id,
    trace,
    model_name,
    model_path,
    gpu,
    gpus,
    slo_tpot_ms,
    slo_ttft_ms,
    concurrency,
    nnodes,
    node_rank,
    dist_init_addr,
    python,
    dry_run,
    no_validate,
    nic_gbps,
    db,
    extra,
) -> None:
    """Start SGLang with a recommended configuration (extra SGLang args after --)."""
    from hpc_advise.advisor import launch as L
    from hpc_advise.advisor.candidates import Candidate

    if (node_rank is not None and nnodes is not None) and node_rank >= nnodes:
        _fail(f"--node-rank {node_rank} must be below --nnodes {nnodes}")
    if rec_id is not None:
        from hpc_advise.knowledge_base.cli import open_kb

        with open_kb(Path(db) if db else None) as kb:
            rec = kb.recommendation(rec_id)
        outputs = rec["outputs"] if isinstance(rec["outputs"], dict) else json.loads(rec["outputs"])
        inputs = rec["inputs"] if isinstance(rec["inputs"], dict) else json.loads(rec["inputs"])
        if not outputs.get("top"):
            _fail(f"recommendation {rec_id} has no feasible configuration")
        cand = Candidate.from_dict(outputs["top"]["candidate"])
        model_name = model_name or inputs["model"]
        node_gpus = _resolve_target(gpu or inputs.get("gpu") or DEFAULT_GPU, cand.n_gpus)[0].node_gpus
    else:
        if not (trace and model_name):
            _fail("give --recommendation ID, or --trace FILE --model NAME")
        prof_gpu, _, note, _, _, _, ranked, _, _ = _recommend_core(
            trace, model_name, gpu, gpus, slo_tpot_ms, slo_ttft_ms, concurrency, db, False, nic=nic_gbps
        )
        node_gpus = prof_gpu.node_gpus
        if note:
            click.echo(note, err=True)
        if not ranked:
            _fail("no candidate fits; run `hpc-advise recommend --show-excluded`")
        cand = ranked[0].candidate
    mdl = _resolve_model(model_name)
    if not (model_path or mdl.hf_id or model_name.endswith(".json")):
        _fail(
            f"{model_name} plans {mdl.quantization} weights but names no checkpoint: give --model-path "
            "(its Hugging Face id, org/name, or its folder)"
        )
    path = model_path or (
        str(Path(model_name).parent) if model_name.endswith(".json") else (mdl.hf_id or model_name)
    )
    cmd = L.build_command(
        cand,
        path,
        python=python,
        nnodes=nnodes,
        node_rank=node_rank,
        dist_init_addr=dist_init_addr,
        extra=tuple(extra),
        model=mdl,
        node_gpus=node_gpus,
    )
    if not no_validate:
        with Timer("checking the command with SGLang's argument parser (--no-validate skips it)"):
            ok, why = L.validate(cmd)
        if ok is False:
            _fail(f"SGLang rejects the command: {why}\n  {cmd.shell()}")
        if ok is None:
            click.echo(f"validation skipped: {why}", err=True)
    if dry_run:
        for line in cmd.notes:
            click.echo(f"# {line}")
        for k, v in sorted(cmd.env.items()):
            click.echo(f"export {k}={v}")
        click.echo(cmd.shell())
        return
    for line in cmd.notes:
        click.echo(f"note: {line}", err=True)
    sys.stdout.flush()
    L.exec_command(cmd)
