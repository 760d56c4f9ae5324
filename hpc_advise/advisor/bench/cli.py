"""Click commands ``bench`` and ``validate``: parse, call ``run.run_bench`` / ``validate.compare``, print.

Expected failures (unreachable server, not an OpenAI URL, unreadable trace, unknown ids) are one line
on stderr and exit status 1, no traceback.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from hpc_advise.clitypes import Aliased


def _f(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}f}"


def _ci(pair) -> str:
    return f"[{_f(pair[0])}, {_f(pair[1])}]" if pair else ""


def _print_target(t: dict) -> None:
    from tabulate import tabulate

    s = t["summary"]
    head = f"{t['role'] + ': ' if t['role'] else ''}{t['url']}  model {t['model']}"
    if t.get("run_id"):
        head += f"  (run {t['run_id']})"
    click.echo(head)
    rows = []
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        d = s.get(key) or {}
        if not d:
            continue
        rows.append([name, _f(d.get("mean")), _f(d.get("median")), _ci(d.get("median_ci")), _f(d.get("p90")),
                     _ci(d.get("p90_ci")), _f(d.get("p99")), _ci(d.get("p99_ci"))])  # fmt: skip
    click.echo(
        tabulate(
            rows, headers=["[ms]", "mean", "p50", "p50 95% CI", "p90", "p90 95% CI", "p99", "p99 95% CI"]
        )
    )
    line = (f"completed {s['completed']}/{s['requests']} in {s['duration_s']:.1f} s: "
            f"{s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} output tok/s, "
            f"{s['total_throughput']:.1f} total tok/s, mean concurrency {s['concurrency']:.1f}")  # fmt: skip
    click.echo(line)
    if "request_goodput" in s:
        click.echo(
            f"goodput {s['request_goodput']:.2f} req/s ({100 * s['goodput_fraction']:.1f} % of requests meet the SLOs)"
        )
    if s["failures"]:
        click.echo("failures: " + ", ".join(f"{k} {v}" for k, v in s["failures"].items()))
    if t["partial"]:
        click.echo("PARTIAL: " + "; ".join(t["partial_reasons"]))
    g = t.get("gpu_samples") or {}
    if "max_gpu_memory_used_gib" in g:
        click.echo(f"GPU ({g['gpus']} x {g['gpu']}): max memory {g['max_gpu_memory_used_gib']:.1f} GiB, "
                   f"utilization mean {g['mean_gpu_utilization_pct']:.0f} % max {g['max_gpu_utilization_pct']:.0f} %")  # fmt: skip


def _print_report(rep) -> None:
    from tabulate import tabulate

    for t in rep.targets:
        _print_target(t)
        click.echo()
    if rep.ab:
        rows = [[r["metric"], _f(r["candidate"], 2), _f(r["baseline"], 2), _f(r["diff"], 2),
                 _ci(r["ci"]) if r["ci"] else "", _f(100 * r["relative"]), r["verdict"]] for r in rep.ab]  # fmt: skip
        click.echo("A/B (candidate = --url, baseline = --baseline-url; difference = candidate - baseline):")
        click.echo(
            tabulate(rows, headers=["metric", "candidate", "baseline", "diff", "95% CI", "diff %", "verdict"])
        )
        click.echo()
    c = rep.consistency
    if c:
        click.echo(f"output consistency on {c['prompts']} prompts x {c['max_new_tokens']} greedy tokens: "
                   f"token agreement {100 * c['token_agreement']:.1f} %, identical outputs {c['identical_outputs']}, "
                   f"first divergence at {c['first_divergence_min'] if c['first_divergence_min'] is not None else 'none'}; "
                   f"teacher-forced: mean KL {_f(c['mean_kl'], 4)}, top-1 agreement "
                   f"{_f(100 * c['top1_agreement'] if c['top1_agreement'] is not None else None)} %")  # fmt: skip
    click.echo(f"prompt lengths: {rep.prompt_lengths} ({rep.tokenizer})")
    if rep.output:
        click.echo(f"bench_serving records appended to {rep.output}")
    for note in rep.notes:
        click.echo(f"note: {note}", err=True)


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


def _clean(o):
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


@click.command("bench")
@click.option("--url", required=True, help="OpenAI-compatible server (e.g. http://127.0.0.1:30000).")
@click.option("--trace", required=True, help="Trace file (any format `hpc-advise trace` reads).")
@click.option(
    "--baseline-url", default=None, help="A/B: a second server; both get the same requests, interleaved."
)
@click.option(
    "--rate-scale", type=float, default=1.0, show_default=True, help="Multiply the trace's arrival rate."
)
@click.option("--concurrency", type=int, default=None, help="Closed loop of N clients (timestamps ignored).")
@click.option("--duration", "duration_s", type=float, default=None, help="Stop sending after S seconds.")
@click.option("--requests", type=int, default=None, help="Send only the first N requests of the trace.")
@click.option("--slo-ttft-ms", type=float, default=None)
@click.option("--slo-tpot-ms", type=float, default=None)
@click.option(
    "--model", default=None, help="Model name to send and store (default: the server's /v1/models id)."
)
@click.option(
    "--tokenizer", default=None, help="Tokenizer (local path or cached HF id) for exact prompt lengths."
)
@click.option(
    "--recommendation",
    "recommendation_id",
    type=int,
    default=None,
    help="Recommendation id this run measures.",
)
@click.option(
    "--gpu",
    default=None,
    help="GPU the server runs on (default: NVML when local, else the recommendation's).",
)
@click.option(
    "--label", default=None, help="Configuration label stored as the run's provider / bench_serving tag."
)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="bench_serving JSONL to append to (default: $HPC_ADVISE_HOME/bench/bench_serving.jsonl).")  # fmt: skip
@click.option("--details", is_flag=True, help="Also write per-request ITLs and errors to the JSONL.")
@click.option("--no-store", is_flag=True, help="Do not write the knowledge base (nor the default JSONL).")
@click.option(
    "--consistency-prompts",
    type=int,
    default=8,
    show_default=True,
    help="A/B: fixed prompts for output consistency (0 = off).",
)
@click.option("--consistency-tokens", type=int, default=32, show_default=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=600.0,
    show_default=True,
    help="Per-request limit in seconds.",
)
@click.option(
    "--retries", type=int, default=3, show_default=True, help="Tries to reach the server before giving up."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--trace-format", "--format", "fmt", cls=Aliased, aliases=("--format",), default=None,
              help="Trace format when detection fails (see `trace formats`).")  # fmt: skip
@click.option("--skip-bad", is_flag=True, help="Skip malformed trace lines instead of stopping.")
@click.option("--db", default=None, help="Knowledge-base file (default: hpc-advise kb path).")
@click.option("--json", "as_json", is_flag=True)
def bench(url, trace, baseline_url, rate_scale, concurrency, duration_s, requests, slo_ttft_ms, slo_tpot_ms, model,
          tokenizer, recommendation_id, gpu, label, output, details, no_store, consistency_prompts,
          consistency_tokens, timeout_s, retries, seed, fmt, skip_bad, db, as_json) -> None:  # fmt: skip
    """Replay a trace against a live server; measure TTFT/TPOT/ITL/E2E, throughput, goodput; store the run."""
    from hpc_advise.advisor.bench.client import ServerError
    from hpc_advise.advisor.bench.prompts import TokenizerUnavailable
    from hpc_advise.advisor.bench.run import BenchOptions, run_bench
    from hpc_advise.advisor.traces import TraceError
    from hpc_advise.knowledge_base.migrations import KnowledgeBaseError

    opts = BenchOptions(url=url, trace=trace, baseline_url=baseline_url, rate_scale=rate_scale, concurrency=concurrency,
                        duration_s=duration_s, requests=requests, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
                        model=model, tokenizer=tokenizer, recommendation_id=recommendation_id, gpu=gpu, label=label,
                        output=output, details=details, store=not no_store, db=db, seed=seed, timeout_s=timeout_s,
                        retries=retries, fmt=fmt, skip_bad=skip_bad, consistency_prompts=consistency_prompts,
                        consistency_tokens=consistency_tokens)  # fmt: skip
    try:
        rep = run_bench(opts)
    except (ServerError, TraceError, TokenizerUnavailable, KnowledgeBaseError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    if as_json:
        click.echo(json.dumps(_clean(rep.to_dict()), indent=2, default=_json_default))
    else:
        _print_report(rep)
    if rep.interrupted:
        raise SystemExit(130)


@click.command("validate")
@click.option("--recommendation", "recommendation_id", type=int, default=None, help="Recommendation id.")
@click.option("--run", "run_id", type=int, default=None, help="A bench run id (its recommendation is used).")
@click.option(
    "--threshold", type=float, default=0.15, show_default=True, help="Relative error counted as a miss."
)
@click.option("--db", default=None, help="Knowledge-base file (default: hpc-advise kb path).")
@click.option("--json", "as_json", is_flag=True)
def validate(recommendation_id, run_id, threshold, db, as_json) -> None:
    """Predicted vs measured per metric for a recommendation, the error, and the term a miss points at."""
    from tabulate import tabulate

    from hpc_advise.advisor.bench.validate import ValidateError, calibration_check, compare, find_run
    from hpc_advise.knowledge_base.migrations import KnowledgeBaseError
    from hpc_advise.knowledge_base.store import KnowledgeBase

    if (recommendation_id is None) == (run_id is None):
        raise click.ClickException("give one of --recommendation ID or --run ID")

    def load_serving(exclude):
        from hpc_advise.advisor import serving_model as pm
        from hpc_advise.clitypes import Timer

        with Timer(f"fitting the serving model without this deployment's {len(exclude)} run(s)"):
            return pm.load_or_fit(db, exclude_runs=exclude)[0]

    out = None
    try:
        with KnowledgeBase(db) as kb:
            run = find_run(kb, recommendation_id, run_id)
            rid = (
                recommendation_id
                if recommendation_id is not None
                else (run.get("config") or {}).get("recommendation_id")
            )
            if rid is not None:
                try:
                    rec = kb.recommendation(int(rid))
                except KeyError:
                    raise ValidateError(f"no recommendation with id {rid}") from None
                out = compare(rec, run, threshold)
            runs = kb.runs(kind="serving")
        calib = calibration_check(runs, run, load_serving)
    except (ValidateError, KnowledgeBaseError) as exc:
        raise click.ClickException(str(exc)) from None
    if out is None and calib["deployment"] is None:
        raise click.ClickException(
            f"run {run_id} was not benched for a recommendation (bench --recommendation ID) and cannot be "
            f"calibrated: {calib['reason']}"
        )
    if as_json:
        click.echo(json.dumps(_clean(dict(out or {"run_id": run.get("id")}, calibration=calib)), indent=2))
        return
    if out is not None:
        click.echo(
            f"recommendation {out['recommendation_id']} ({out['configuration']}) vs run {out['run_id']}"
        )
        rows = [[r["label"], _f(r["predicted"], 2), _f(r["measured"], 2), _ci(r["ci"]) if r["ci"] else "",
                 "-" if r["error"] is None else f"{100 * r['error']:+.1f} %", r["points_at"] or ""] for r in out["rows"]]  # fmt: skip
        click.echo(
            tabulate(
                rows,
                headers=["metric", "predicted", "measured", "measured 95% CI", "error", "miss points at"],
            )
        )
        for note in out["notes"]:
            click.echo(f"note: {note}", err=True)
    _print_calibration(calib, run.get("id"))


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def _print_calibration(calib: dict, run_id) -> None:
    from tabulate import tabulate

    if calib["deployment"] is None:
        click.echo(f"\ncalibration: not possible for run {run_id}: {calib['reason']}")
        return
    if not calib["metrics"]:
        click.echo(f"\ncalibration of {calib['deployment']}: no usable run ({calib['reason']})")
        return
    n = calib["n_runs"]
    click.echo(
        f"\ncalibration of {calib['deployment']}: {n} run(s), each predicted by the serving model refitted "
        f"without this deployment's {len(calib['held_out_of_base'])} run(s), then with the correction fitted "
        f"on the other {n - 1} (leave-one-out)"
    )
    rows = [[m["label"], _pct(m["median_abs_before"]).lstrip("+"), _pct(m["median_abs_after"]).lstrip("+"),
             _pct(m["run_before"]), _pct(m["run_after"])] for m in calib["metrics"]]  # fmt: skip
    click.echo(
        tabulate(
            rows,
            headers=["metric", "median |error| before", "after", f"run {run_id} before", "after"],
        )
    )
    for where, why in calib["dropped"]:
        click.echo(f"left out {where}: {why}")
