"""One ``bench`` run from options to stored results: probe the server(s), read the plan, build
prompts, replay, summarize, compare (A/B), check output consistency, write the JSONL records and the
knowledge-base rows. ``run_bench(BenchOptions(...))`` returns a ``BenchReport``; the CLI only prints it.

Nothing is stored when the server cannot be reached or is not OpenAI-compatible (``ServerError``
before any request). A run that lost requests to HTTP errors or dropped streams, or that was
interrupted, is stored with ``config.partial = true`` and the reasons.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from hpc_advise.advisor.bench import records, stats
from hpc_advise.advisor.bench.client import ServerError, ServerFacts, probe
from hpc_advise.advisor.bench.gpu import GpuSampler, is_local
from hpc_advise.advisor.bench.prompts import PromptBuilder, TokenizerUnavailable, load_tokenizer
from hpc_advise.advisor.bench.replay import Replay, read_plan


@dataclass
class BenchOptions:
    url: str
    trace: str
    baseline_url: str | None = None
    rate_scale: float = 1.0
    concurrency: int | None = None
    duration_s: float | None = None
    requests: int | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    model: str | None = None
    tokenizer: str | None = None
    recommendation_id: int | None = None
    gpu: str | None = None
    label: str | None = None
    output: Path | None = None  # bench_serving JSONL (appended)
    details: bool = False
    store: bool = True
    db: str | None = None
    seed: int = 0
    timeout_s: float = 600.0
    retries: int = 3
    fmt: str | None = None
    skip_bad: bool = False
    progress: bool | None = None
    consistency_prompts: int = 8
    consistency_tokens: int = 32
    top_logprobs: int = 20
    min_effect: float = stats.MIN_EFFECT
    sample_gpus: bool = True


@dataclass
class BenchReport:
    targets: list[dict] = field(default_factory=list)  # per server: url, model, summary, run_id, partial
    ab: list[dict] | None = None
    consistency: dict | None = None
    prompt_lengths: str = "approximate"
    tokenizer: str = ""
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    output: str | None = None

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _builder(opts: BenchOptions, model: str, notes: list[str]) -> PromptBuilder:
    name = opts.tokenizer or model
    try:
        ids, desc = load_tokenizer(name)
        return PromptBuilder(ids, seed=opts.seed, description=desc)
    except TokenizerUnavailable as exc:
        if opts.tokenizer:
            raise
        notes.append(f"prompt lengths are approximate: {exc}; give --tokenizer PATH for exact lengths")
        return PromptBuilder(None, seed=opts.seed)


def _recommendation(opts: BenchOptions) -> dict | None:
    if opts.recommendation_id is None:
        return None
    from hpc_advise.knowledge_base.store import KnowledgeBase

    with KnowledgeBase(opts.db) as kb:
        try:
            return kb.recommendation(opts.recommendation_id)
        except KeyError:
            raise ServerError(f"no recommendation with id {opts.recommendation_id} in {kb.path}") from None


def _command(rec: dict | None) -> str | None:
    launch = ((rec or {}).get("outputs") or {}).get("launch") or {}
    argv = launch.get("argv")
    if not argv:
        return None
    env = " ".join(f"{k}={v}" for k, v in sorted((launch.get("env") or {}).items()))
    return (env + " " if env else "") + "python " + " ".join(str(a) for a in argv)


async def _probe_all(opts: BenchOptions) -> list[ServerFacts]:
    urls = [opts.url] + ([opts.baseline_url] if opts.baseline_url else [])
    facts = list(await asyncio.gather(*(probe(u, retries=opts.retries) for u in urls)))
    if opts.model:
        for f in facts:
            f.model = opts.model
    return facts


def _partial_reasons(summary: dict, interrupted: bool) -> list[str]:
    reasons = []
    if interrupted:
        reasons.append("interrupted (Ctrl-C): only finished requests kept")
    lost = {k: v for k, v in summary["failures"].items() if k != "too_long"}
    if lost:
        reasons.append("failed requests: " + ", ".join(f"{k} {v}" for k, v in lost.items()))
    return reasons


def run_bench(opts: BenchOptions) -> BenchReport:
    """Run the benchmark the options describe (see the module docstring)."""
    if opts.rate_scale <= 0:
        raise ValueError(f"--rate-scale must be > 0, got {opts.rate_scale}")
    if opts.concurrency is not None and opts.concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {opts.concurrency}")
    rec = _recommendation(opts)
    plan = read_plan(opts.trace, opts.fmt, opts.skip_bad, opts.requests, opts.duration_s, opts.rate_scale)
    facts = asyncio.run(_probe_all(opts))
    report = BenchReport()
    builder = _builder(opts, facts[0].model, report.notes)
    report.prompt_lengths = "exact" if builder.exact else "approximate"
    report.tokenizer = builder.description
    if plan.n_bad:
        report.notes.append(f"{plan.n_bad} bad trace lines skipped")
    replay = Replay(facts, plan, builder, concurrency=opts.concurrency, rate_scale=opts.rate_scale,
                    duration_s=opts.duration_s, timeout_s=opts.timeout_s, progress=opts.progress)  # fmt: skip
    sampler = None
    if opts.sample_gpus and all(is_local(f.url) for f in facts):
        sampler = GpuSampler()
        if not sampler.open():
            report.notes.append(sampler.reason)
            sampler = None
    elif opts.sample_gpus:
        report.notes.append("no GPU sampling: the server is not on this host")
    try:
        outcomes = asyncio.run(replay.run(sampler))
    finally:
        if sampler is not None:
            sampler.close()
    report.interrupted = replay.interrupted
    gpu_samples = sampler.result() if sampler is not None else None
    gpu = opts.gpu or (gpu_samples or {}).get("gpu") or ((rec or {}).get("inputs") or {}).get("gpu")
    if gpu is None:
        report.notes.append("no GPU known (give --gpu NAME): `model fit` leaves runs without a GPU out")
    summaries = [stats.summarize(o.results, o.duration_s, opts.slo_ttft_ms, opts.slo_tpot_ms, opts.seed)
                 for o in outcomes]  # fmt: skip
    if len(outcomes) == 2:
        report.ab = stats.compare(outcomes[0].results, outcomes[1].results, outcomes[0].duration_s,
                                  outcomes[1].duration_s, opts.min_effect, opts.seed)  # fmt: skip
        if opts.consistency_prompts > 0 and not replay.interrupted:
            from hpc_advise.advisor.bench.consistency import check

            prompts = [builder.prompt(10_000_000 + i, 32 + 16 * i) for i in range(opts.consistency_prompts)]
            try:
                report.consistency = asyncio.run(check(facts[0].url, facts[1].url, prompts,
                                                       opts.consistency_tokens, opts.top_logprobs, opts.timeout_s))  # fmt: skip
            except ServerError as exc:
                report.notes.append(f"no output consistency check: {exc}")
    output = opts.output
    if output is None and opts.store:
        from hpc_advise import paths

        output = paths.home() / "bench" / "bench_serving.jsonl"
    report.output = str(output) if output else None
    rows = []
    for k, (o, summary) in enumerate(zip(outcomes, summaries, strict=True)):
        role = "candidate" if len(outcomes) == 2 and k == 0 else ("baseline" if k == 1 else None)
        reasons = _partial_reasons(summary, replay.interrupted)
        label = opts.label or ("baseline" if role == "baseline" else None)
        bench_cfg = {
            "trace": plan.source,
            "rate_scale": opts.rate_scale,
            "recommendation_id": opts.recommendation_id if role != "baseline" else None,
            "url": o.facts.url,
            "prompt_lengths": report.prompt_lengths,
            "tokenizer": builder.description,
            "partial": bool(reasons),
            "partial_reasons": reasons or None,
            "ab_role": role,
            "slo_ttft_ms": opts.slo_ttft_ms,
            "slo_tpot_ms": opts.slo_tpot_ms,
            "requests_planned": len(plan),
        }
        record = records.bench_record(summary, o, label=label, plan=plan, concurrency=opts.concurrency,
                                      rate_scale=opts.rate_scale, details=opts.details,
                                      extras={k2: v for k2, v in bench_cfg.items() if v is not None})  # fmt: skip
        entry = {"url": o.facts.url, "model": o.facts.model, "engine": o.facts.engine, "role": role,
                 "summary": summary, "partial": bool(reasons), "partial_reasons": reasons,
                 "cancelled": o.cancelled, "gpu": gpu, "gpu_samples": gpu_samples, "run_id": None}  # fmt: skip
        if output is not None:
            lineno = records.append_jsonl(Path(output), record)
            if opts.store:
                rows.append(records.kb_row(record, summary, path=Path(output), lineno=lineno, gpu=gpu,
                                           command=_command(rec) if role != "baseline" else None,
                                           config=bench_cfg, gpu_samples=gpu_samples))  # fmt: skip
        report.targets.append(entry)
    if rows:
        from hpc_advise.knowledge_base.store import KnowledgeBase

        with KnowledgeBase(opts.db) as kb:
            ids = kb.add_runs(rows)
        for entry, run_id in zip(report.targets, ids, strict=True):
            entry["run_id"] = run_id
    return report
