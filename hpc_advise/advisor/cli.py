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

DEFAULT_GPU, DEFAULT_GPUS = "h200", 8

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

    model, info = pm.load_or_fit(db, refit=refit)
    return model, info


def _resolve_target(gpu: str | None, gpus: int | None) -> tuple[object, int, str]:
    """(GpuProfile, N, note) from the flags, the NVML probe, or the announced default."""
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
                gpus = gpus or len(keys)
                note = f"detected {len(keys)} x {gpu} (NVML)"
            else:
                raise NvmlUnavailable("no GPU with a shipped profile")
        except Exception as exc:  # NvmlUnavailable and anything else NVML throws
            gpu, gpus = DEFAULT_GPU, gpus or DEFAULT_GPUS
            note = f"no GPU detected ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); assuming {gpus} x H200 (use --gpu NAME --gpus N)"
    try:
        prof = resolve_gpu(gpu)
    except RowError as exc:
        _fail(str(exc))
    return prof, int(gpus or DEFAULT_GPUS), note


def _resolve_model(name: str):
    from hpc_advise.advisor.serving_data import RowError
    from hpc_advise.advisor.serving_model import resolve_model

    try:
        return resolve_model(name)
    except (RowError, ValueError) as exc:
        _fail(str(exc))


# ----- model ----------------------------------------------------------------------------------


@click.group("model")
def model() -> None:
    """Fit, evaluate and show the serving performance model."""


@model.command("fit")
@db_option
@click.option("--refit", is_flag=True, help="Fit even when a cached model matches the training data.")
def model_fit(db, refit) -> None:
    """Fit on the shipped measurements + the KB's serving runs; cache under the data hash."""
    m, info = _load_model(db, refit=refit)
    state = "cached" if info["cached"] else "fitted"
    click.echo(f"{state}: model {m.key} on {m.n_rows} rows {m.rows_by_engine} -> {info['path']}")
    if info["left_out"]:
        click.echo(
            f"{len(info['left_out'])} rows left out (first: {info['left_out'][0][0]}: {info['left_out'][0][1]})"
        )


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
@click.option("--json", "as_json", is_flag=True)
def model_eval(db, by, as_json) -> None:
    """Grouped cross-validation: hold out each model, each GPU, each engine x GPU family (e.g. every
    vLLM row on Hopper); median/p90 APE of TPOT, TTFT."""
    from tabulate import tabulate

    from hpc_advise.advisor import serving_model as pm

    points, _ = pm.training_points(db)
    preps, _ = pm.prepare_all(points)
    groups = {"all": pm.GROUPINGS, "both": ("model", "gpu")}.get(by, (by,))
    rows = pm.evaluate(preps, by=groups)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(tabulate([pm.describe_row(r) for r in rows], headers=pm.EVAL_HEADERS, tablefmt="github"))
    click.echo("target: TPOT median <= 10 %, p90 <= 25 % on held-out models; 'all' pools every held-out row")


@model.command("show")
@db_option
@click.option("--json", "as_json", is_flag=True)
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


def _recommend_core(trace, model_name, gpu, gpus, slo_tpot, slo_ttft, concurrency, db, skip_bad, fmt=None):
    from hpc_advise.advisor.kernel_models import load_attention_model
    from hpc_advise.advisor.recommend import Ranker, TraceLoad, rank_candidates
    from hpc_advise.advisor.traces import TraceError, summarize

    prof_gpu, n, note = _resolve_target(gpu, gpus)
    mdl = _resolve_model(model_name)
    try:
        summary = summarize(trace, fmt=fmt, skip_bad=skip_bad)
    except TraceError as exc:
        _fail(str(exc))
    serving, _ = _load_model(db)
    ranker = Ranker(
        model_name, mdl, prof_gpu, TraceLoad.from_summary(summary), serving, load_attention_model(db)
    )
    ranked, excluded = rank_candidates(ranker, n, slo_tpot, slo_ttft, concurrency)
    return prof_gpu, n, note, mdl, summary, serving, ranked, excluded


def ranker_concurrency(summary) -> int:
    from hpc_advise.advisor.recommend import TraceLoad

    return TraceLoad.from_summary(summary).default_concurrency


@click.command("recommend")
@click.option("--trace", "trace", required=True, help="Trace file (any supported format; '-' = stdin).")
@click.option("--model", "model_name", required=True, help="Model profile name, HF id or config.json path.")
@click.option("--gpu", default=None, help="GPU profile (default: detected, else H200).")
@click.option("--gpus", type=int, default=None, help="GPUs to use (default: all detected, else 8).")
@click.option("--slo-tpot-ms", type=float, default=None)
@click.option("--slo-ttft-ms", type=float, default=None)
@click.option(
    "--concurrency",
    type=float,
    default=None,
    help="Requests in flight (default: from the trace's arrival rate).",
)
@click.option("--top", type=int, default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--plot",
    "plot",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a Pareto chart PNG (needs the 'plot' extra).",
)
@click.option("--show-excluded", is_flag=True, help="List excluded candidates with their reasons.")
@click.option("--skip-bad", is_flag=True, help="Skip malformed trace lines instead of stopping.")
@click.option(
    "--trace-format", "fmt", default=None, help="Trace format when detection fails (see `trace summarize`)."
)
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
    db,
) -> None:
    """Rank SGLang configurations for a trace, a model and GPUs; print the launch command."""
    from hpc_advise.advisor.launch import build_command

    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            _fail("--plot needs matplotlib: pip install 'hpc-advise[plot]'")
    prof_gpu, n, note, mdl, summary, serving, ranked, excluded = _recommend_core(
        trace, model_name, gpu, gpus, slo_tpot_ms, slo_ttft_ms, concurrency, db, skip_bad, fmt
    )
    if not summary.rate_rps and concurrency is None:
        extra_note = f"the trace has no arrival times: {ranker_concurrency(summary)} requests in flight assumed (--concurrency N)"
        note = f"{note}; {extra_note}" if note else extra_note
    if note and not as_json:
        click.echo(note, err=True)
    cmd = build_command(ranked[0].candidate, mdl.hf_id or model_name) if ranked else None
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
    )
    from hpc_advise.knowledge_base.store import KnowledgeBase

    rec_id = KnowledgeBase(db).add_recommendation(inputs, outputs, serving.key)
    if plot and ranked:
        from hpc_advise.advisor.plot import pareto_png

        pareto_png(ranked, plot, slo_tpot_ms, title=f"{mdl.key} on {n} x {prof_gpu.key}")
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
@click.option("--model", "model_name", default=None)
@click.option("--gpu", default=None)
@click.option("--gpus", type=int, default=None, help="Total GPUs (replicas = gpus / tp).")
@click.option("--tp", type=int, default=None, help="SGLang --tp-size (GPUs per replica; default: --gpus).")
@click.option("--ep", type=int, default=1, show_default=True)
@click.option("--attn-dp-size", type=int, default=1, show_default=True)
@click.option("--attention-backend", default="flashinfer", show_default=True)
@click.option("--moe-runner-backend", default="auto", show_default=True)
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8_e4m3"]), default="auto", show_default=True)
@click.option("--isl", type=float, default=None)
@click.option("--osl", type=float, default=None)
@click.option("--concurrency", type=float, default=None, help="Requests in flight over all GPUs.")
@click.option(
    "--batch",
    "batch",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="CSV with the columns of serving_measurements_train.csv.",
)
@click.option("--json", "as_json", is_flag=True)
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

    prof_gpu, n, note = _resolve_target(gpu, gpus)
    mdl = _resolve_model(model_name)
    tp = tp or n
    if n % tp:
        _fail(f"--tp {tp} does not divide --gpus {n}")
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
        _fail("--attn-dp-size and --ep must divide --tp")
    why = support_reason(c, mdl, prof_gpu)
    w = TraceLoad(isl, osl, np.array([[isl, osl]]), None, 0.0, isl + osl / 2, isl + osl, int(concurrency))
    serving, _ = _load_model(db)
    ranker = Ranker(model_name, mdl, prof_gpu, w, serving, load_attention_model(db))
    conc = max(concurrency / c.replicas, 1.0)
    ok, mem_why, mem = memory_check(c, mdl, prof_gpu, conc, w.ctx_mean, w.ctx_p99)
    try:
        preds = ranker.serving_predictions([c], {c: conc})
        from hpc_advise.advisor.candidates import Checked

        r = ranker.rank_one(Checked(c, ok, mem_why, mem), conc, next(iter(preds.values())), None, None)
    except RowError as exc:
        _fail(str(exc))
    flags = list(r.flags) + ([why] if why else []) + ([mem_why] if not ok else [])
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
    "--recommendation", "rec_id", type=int, default=None, help="Launch a logged recommendation's top pick."
)
@click.option("--trace", default=None)
@click.option("--model", "model_name", default=None)
@click.option("--model-path", default=None, help="Path or HF id SGLang loads (default: the profile's HF id).")
@click.option("--gpu", default=None)
@click.option("--gpus", type=int, default=None)
@click.option("--slo-tpot-ms", type=float, default=None)
@click.option("--slo-ttft-ms", type=float, default=None)
@click.option("--concurrency", type=float, default=None)
@click.option("--nnodes", type=int, default=None)
@click.option("--node-rank", type=int, default=None)
@click.option("--dist-init-addr", default=None)
@click.option("--python", "python", default=None, help="Python that runs SGLang (default: this one).")
@click.option("--dry-run", is_flag=True, help="Print the command and environment; do not start SGLang.")
@click.option("--no-validate", is_flag=True, help="Skip SGLang's argument parser check.")
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
    db,
    extra,
) -> None:
    """Start SGLang with a recommended configuration (extra SGLang args after --)."""
    from hpc_advise.advisor import launch as L
    from hpc_advise.advisor.candidates import Candidate

    if rec_id is not None:
        from hpc_advise.knowledge_base.store import KnowledgeBase

        try:
            rec = KnowledgeBase(db).recommendation(rec_id)
        except KeyError as exc:
            _fail(str(exc.args[0]))
        outputs = rec["outputs"] if isinstance(rec["outputs"], dict) else json.loads(rec["outputs"])
        inputs = rec["inputs"] if isinstance(rec["inputs"], dict) else json.loads(rec["inputs"])
        if not outputs.get("top"):
            _fail(f"recommendation {rec_id} has no feasible configuration")
        cand = Candidate.from_dict(outputs["top"]["candidate"])
        model_name = model_name or inputs["model"]
    else:
        if not (trace and model_name):
            _fail("give --recommendation ID, or --trace FILE --model NAME")
        _, _, note, _, _, _, ranked, _ = _recommend_core(
            trace, model_name, gpu, gpus, slo_tpot_ms, slo_ttft_ms, concurrency, db, False
        )
        if note:
            click.echo(note, err=True)
        if not ranked:
            _fail("no candidate fits; run `hpc-advise recommend --show-excluded`")
        cand = ranked[0].candidate
    mdl = _resolve_model(model_name)
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
    )
    if not no_validate:
        ok, why = L.validate(cmd)
        if ok is False:
            _fail(f"SGLang rejects the command: {why}\n  {cmd.shell()}")
        if ok is None:
            click.echo(f"validation skipped: {why}", err=True)
    if dry_run:
        for k, v in sorted(cmd.env.items()):
            click.echo(f"export {k}={v}")
        click.echo(cmd.shell())
        return
    sys.stdout.flush()
    L.exec_command(cmd)
