"""Rendering of the advisor's answers: the ``recommend`` table, reasons, flags, launch line and
excluded list, its JSON, and ``predict``'s text. Functions return text; ``advisor/cli.py`` prints it."""

from __future__ import annotations

import json
import math

RECOMMEND_HEADERS = [
    "#",
    "config",
    "TPOT p50",
    "TPOT p99",
    "TTFT p50",
    "TTFT p99",
    "max tok/s/GPU",
    "load x",
    "headroom GiB",
    "confidence",
    "SLO",
    "from",
]


# the flag recommend's twin folding adds to the survivor: it names OTHER backends, folded into this
# row because nothing measured tells them apart, and says nothing about this row's own prediction
OTHER_BACKENDS_FLAG = "unmeasured alternatives predicted the same: "
EXCLUDED_EXAMPLES = 3  # configurations named per reason in the text's excluded list


def confidence(r) -> str:
    """'low' when a flag concerns this row's own backends or inputs, else 'ok'."""
    return "low" if any(not f.startswith(OTHER_BACKENDS_FLAG) for f in r.flags) else "ok"


def slo_cell(r, slo_tpot_ms, slo_ttft_ms) -> str:
    """The SLO column: '-' when no SLO was given, else whether the row meets it."""
    if slo_tpot_ms is None and slo_ttft_ms is None:
        return "-"
    return "yes" if r.meets_slo else "no"


def excluded_groups(excluded: list) -> list[tuple[str, list[str]]]:
    """(reason, configuration labels) per distinct reason, the most common first."""
    groups: dict[str, list[str]] = {}
    for e in excluded:
        groups.setdefault(e.reason, []).append(e.candidate.label())
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def excluded_lines(excluded: list) -> list[str]:
    """The text's excluded list: one line per reason with its count and a few configurations."""
    groups = excluded_groups(excluded)
    lines = [f"\nexcluded: {len(excluded)} configuration(s), {len(groups)} reason(s)"]
    for reason, labels in groups:
        shown = ", ".join(labels[:EXCLUDED_EXAMPLES])
        more = f" (+{len(labels) - EXCLUDED_EXAMPLES} more)" if len(labels) > EXCLUDED_EXAMPLES else ""
        lines.append(f"  {len(labels):>4} x {reason}")
        lines.append(f"         e.g. {shown}{more}")
    return lines


def _ranked_dict(r) -> dict:
    return dict(r.to_dict(), confidence=confidence(r))


def fmt_ms(x: float) -> str:
    return "inf" if x == math.inf else f"{x:.1f}"


def source_cell(r) -> str:
    """The 'from' column: 'sim' when the row's figures come out of the simulation, else 'screen'."""
    return "sim" if getattr(r, "simulated", None) else "screen"


def _pcts(d: dict, keys=("p50", "p90", "p99")) -> str:
    return "/".join("inf" if d.get(k) is None else f"{d[k]:.0f}" for k in keys)


def simulated_lines(sim: dict) -> list[str]:
    """A simulated row's distributions: the busiest window at the trace's load, then the sampled one."""
    out = []
    for label, st in [("busiest window", sim["busiest"])] + [("sampled window", x) for x in sim["sampled"]]:
        out.append(
            f"  ~ {label}: TTFT p50/p90/p99 {_pcts(st['ttft_ms'])} ms, TPOT {_pcts(st['tpot_ms'])} ms, "
            f"ITL {_pcts(st['itl_ms'])} ms, queue {_pcts(st['queue_ms'])} ms"
        )
        out.append(
            f"    {st['request_throughput']:.2f} req/s, {st['output_throughput']:.0f} out tok/s, goodput "
            f"{st['goodput_req_s']:.2f} req/s ({100 * st['good_fraction']:.0f} % within the SLOs), KV "
            f"{100 * st['kv_used_mean']:.0f} % mean / {100 * st['kv_used_peak']:.0f} % peak of "
            f"{sim['pool_tokens']:,} tokens per scheduler, prefix cache hit {100 * st['cache_hit_rate']:.0f} %"
            + (f", {st['retractions']} retractions" if st["retractions"] else "")
        )
    return out


def load_x(cap) -> str:
    """Capacity multiple for the table: '>=64' at the search bound, '<0.02' below it."""
    from hpc_advise.advisor.capacity import BOUND

    if cap is None:
        return "-"
    if cap.fail_at is None:
        return f">={BOUND:g}"
    if cap.x == 0:
        return f"<{1 / BOUND:.2f}"
    return f"{cap.x:.2f}" if cap.x < 10 else f"{cap.x:.1f}"


def recommend_record(
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
    more=None,
) -> tuple[dict, dict]:
    """(inputs, outputs) of a recommendation, as the knowledge base logs them and ``--json`` prints
    the outputs. ``more`` (``recommend.MoreGpus``, when nothing meets the SLOs) adds ``more_gpus``."""
    inputs = {
        "trace": str(trace),
        "model": model_name,
        "gpu": prof_gpu.key,
        "gpus": n,
        "slo_tpot_ms": slo_tpot_ms,
        "slo_ttft_ms": slo_ttft_ms,
        "concurrency": concurrency,
        "trace_summary": {k: v for k, v in summary.to_dict().items() if k not in ("sample", "histograms")},
    }
    outputs = {
        "ranked": [_ranked_dict(r) for r in ranked[:top]],
        "top": _ranked_dict(ranked[0]) if ranked else None,
        "launch": ({"argv": cmd.argv[1:], "env": cmd.env} | ({"notes": cmd.notes} if cmd.notes else {}))
        if cmd
        else None,
        "n_feasible": len(ranked),
        "n_excluded": len(excluded),
    }
    if more is not None:
        outputs["more_gpus"] = more.to_dict(prof_gpu.node_gpus)
    sim = next((r.simulated for r in ranked if getattr(r, "simulated", None)), None)
    outputs["simulation"] = (
        {"window": sim["window"], "windows": sim["windows"], "rows": sum(1 for r in ranked if getattr(r, "simulated", None))}
        if sim
        else None
    )
    return inputs, outputs


def recommend_json(outputs: dict, rec_id: int, note: str, excluded: list, show_excluded: bool) -> str:
    """``recommend --json``: the logged outputs plus the recommendation id, the note and (with
    ``--show-excluded``) every excluded candidate with its reason, and the reasons with counts."""
    out = dict(
        outputs,
        recommendation_id=rec_id,
        note=note,
        excluded=[{"config": e.candidate.label(), "reason": e.reason} for e in excluded]
        if show_excluded
        else None,
    )
    if show_excluded:
        out["excluded_by_reason"] = [
            {"reason": why, "count": len(labels), "configs": labels}
            for why, labels in excluded_groups(excluded)
        ]
    return json.dumps(out, indent=2)


def recommend_warnings(ranked: list, slo_tpot_ms, slo_ttft_ms) -> list[str]:
    """Lines for stderr when nothing fits or nothing meets the SLOs."""
    if not ranked:
        return ["no candidate fits; see --show-excluded"]
    if (slo_tpot_ms or slo_ttft_ms) and not ranked[0].meets_slo:
        return ["no configuration meets the SLOs (p99 against them); listed closest first"]
    return []


def recommend_text(
    ranked: list,
    excluded: list,
    summary,
    mdl,
    prof_gpu,
    n: int,
    slo_tpot_ms,
    slo_ttft_ms,
    top: int,
    cmd,
    rec_id: int,
    show_excluded: bool,
    more=None,
) -> str:
    """``recommend``'s text: the header line, the ranked table, what "load x" means, the top three's
    capacity, reasons and flags, the launch line, the logged id and (optionally) the excluded list."""
    from tabulate import tabulate

    rows = [
        [
            i + 1,
            r.candidate.label(),
            fmt_ms(r.tpot_p50),
            fmt_ms(r.tpot_p99),
            fmt_ms(r.ttft_p50),
            fmt_ms(r.ttft_p99),
            f"{r.max_tok_s_per_gpu:.0f}",
            load_x(r.capacity),
            f"{r.headroom_gib:.1f}",
            confidence(r),
            slo_cell(r, slo_tpot_ms, slo_ttft_ms),
            source_cell(r),
        ]
        for i, r in enumerate(ranked[:top])
    ]
    lines = [
        f"{mdl.key} on {n} x {prof_gpu.key}; trace: {summary.n_requests} requests, isl mean {summary.isl['mean']:.0f}, osl mean {summary.osl['mean']:.0f}"
        + (f", {summary.rate_rps:.2f} req/s" if summary.rate_rps else ""),
        tabulate(rows, headers=RECOMMEND_HEADERS, tablefmt="github"),
    ]
    if ranked:
        over = ranked[0].capacity.over if ranked[0].capacity else "arrival rate"
        conds = "prefill rho < 1, KV memory" if over == "arrival rate" else "KV memory"
        conds += "".join(
            f", {name} SLO p99" for name, v in (("TPOT", slo_tpot_ms), ("TTFT", slo_ttft_ms)) if v
        )
        lines.append(
            f"load x: capacity, the largest multiple of the trace's {over} that still meets {conds} "
            f"(2 % steps); max tok/s/GPU: output tokens/s per GPU at that load"
        )
        sim = next((r.simulated for r in ranked if getattr(r, "simulated", None)), None)
        if sim is not None:
            n_sim = sum(1 for r in ranked if getattr(r, "simulated", None))
            where = "busiest window" if sim["windows"] else "closed loop"
            slos = " and ".join(f"{name} p99" for name, v in (("TPOT", slo_tpot_ms), ("TTFT", slo_ttft_ms)) if v)
            lines[-1] = (
                f"from sim: {n_sim} row(s) simulated over {sim['window']}; their percentiles, throughput "
                f"and SLO verdict are the {where}'s at the trace's load; load x: the largest multiple "
                f"of the {over} at which the {where} keeps up"
                + (f" and meets {slos}" if slos else "")
                + f" ({100 * sim['resolution']:.0f} % steps); 'screen' rows: the analytic screen's figures"
            )
    for r in ranked[: min(top, 3)]:
        lines.append(f"\n{r.candidate.label()}:")
        cap = r.capacity
        if cap is not None:
            edge = f"; {cap.limit} fails at {cap.fail_at:.2f}x" if cap.fail_at else " (search bound)"
            lines.append(
                f"  capacity {load_x(cap)}x the {over}: {cap.max_tok_s_per_gpu:.0f} out tok/s/GPU{edge}"
            )
        lines += [f"  - {why}" for why in r.reasons]
        if getattr(r, "simulated", None):
            lines += simulated_lines(r.simulated)
        lines += [f"  x {r.breaks}"] if r.breaks else []
        lines += [f"  = {r.calibration}"] if r.calibration else []
        lines += [f"  ! {f}" for f in r.flags[:3]]
    if ranked and ranked[0].breaks:
        lines.append("\nno configuration meets the SLOs:")
        lines += [f"  x {r.candidate.label()}: {r.breaks}" for r in ranked[min(top, 3) : top] if r.breaks]
        if more is not None:
            lines.append(f"  + {more.line(prof_gpu.node_gpus, prof_gpu.key)}")
    if cmd:
        lines.append(f"\nlaunch:\n  {cmd.shell()}")
        lines += [f"  ({note})" for note in cmd.notes]
    lines.append(f"\nrecommendation #{rec_id} logged (hpc-advise launch --recommendation {rec_id})")
    if show_excluded:
        lines += excluded_lines(excluded)
    return "\n".join(lines)


def predict_text(c, r, out: dict, n: int, prof_gpu, isl, osl, concurrency, flags: list[str]) -> str:
    """``predict``'s text for one configuration."""
    mem = out["memory"]
    lines = [
        f"{c.label()} on {n} x {prof_gpu.key}, isl {isl:g} osl {osl:g} concurrency {concurrency:g}",
        f"  TTFT p50 {fmt_ms(r.ttft_p50)} ms  p99 {fmt_ms(r.ttft_p99)} ms",
        f"  TPOT p50 {fmt_ms(r.tpot_p50)} ms  p99 {fmt_ms(r.tpot_p99)} ms",
        f"  output {out['output_tok_s']:.0f} tok/s ({r.tok_s_per_gpu:.0f} per GPU); memory headroom {mem.get('headroom_gib', float('nan')):.1f} GiB",
    ]
    lines += [f"  = {r.calibration}"] if r.calibration else []
    lines += [f"  ! {f}" for f in flags]
    return "\n".join(lines)
