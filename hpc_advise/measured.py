"""Measured comparisons of our kernels with SGLang's own, read from the shipped benchmark rows.

The rows are package data, ``hpc_advise/advisor/data/kernel_results/*.jsonl``, written by the benches'
``--ship`` (benchmarks/ship.py), never ``benchmarks/results/``:

- ``layer_step`` rows (benchmarks/bench_layer.py): SGLang's own decoder layers at one rank's shapes, one
  decode step replayed from SGLang's CUDA graph, per attention backend x MoE runner (provider
  ``attn=A,moe=M``), context mix and batch;
- ``kernel`` rows of subject ``fused_moe`` (benchmarks/bench_fused_moe.py), per provider and token count.

What lives here: the rows as :class:`LayerCell`\\ s, the rank shapes they were measured at (from the model
profile and the TP/EP of the row's subject, through ``rules.conditions``, the same function the dispatch
table and the advisor use), and the MoE comparison both the runtime and the advisor act on:
:func:`moe_points` pairs a runner with SGLang's default (``triton``) within one run, and
:func:`moe_handoff` says, per MoE rank shape and token count, whether SGLang's kernel measured faster
(the runtime then hands that bucket to it, ``runtime/sglang/moe.py``) and with what figure.

Standard library, ``hpc_advise.profiles`` and ``hpc_advise.rules`` only: the advisor (no torch) and the
runtime's dispatch table (no advisor) both import it, so the hand-off that runs and the one the advisor
predicts come from the same rows.
"""

from __future__ import annotations

import functools
import json
import math
import re
import statistics
from dataclasses import dataclass

# SGLang's own runner for FP8 MoE layers on SM90 with the standard dispatcher (what ``auto`` picks,
# sglang/srt/layers/quantization/fp8.py Fp8MoEMethod.create_moe_runner).
DEFAULT_MOE_RUNNER = "triton"
# benchmark provider of a fused_moe kernel row -> the MoE runner it stands for (--moe-runner-backend)
MOE_PROVIDER_RUNNER = {
    "ours": "hpc_advise",
    "hpc_advise": "hpc_advise",
    "sglang_triton": "triton",
    "sglang": "triton",
    "hpc_ops": "hpc_ops",
    "deep_gemm": "deep_gemm",
}
_MODE_QUANT = {"tensor-static": "fp8-per-tensor", "block-dynamic": "fp8-block128"}
_SUBJECT = re.compile(r"^(?P<model>.+?)(?:-tp(?P<tp>\d+))?(?:-ep(?P<ep>\d+))?-rank$")


def read_rows() -> list[dict]:
    """Every row of the shipped tables (``*.jsonl`` in name order): the same rows whether hpc-advise runs
    from a checkout or from a wheel."""
    from importlib import resources

    shipped = resources.files("hpc_advise.advisor.data").joinpath("kernel_results")
    rows: list[dict] = []
    for entry in sorted(shipped.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".jsonl"):
            continue
        for line in entry.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


@dataclass(frozen=True)
class MoeShape:
    """One rank's MoE layer as the kernel sees it: local experts, hidden size, expert width per rank,
    experts per token and the FP8 scheme (``rules.MOE_QUANTIZATIONS``)."""

    experts: int
    hidden: int
    inter: int
    top_k: int
    quant: str

    def label(self) -> str:
        return f"E{self.experts} H{self.hidden} I{self.inter} top-{self.top_k} {self.quant}"

    def expert_bytes(self, tokens: float) -> float:
        """FP8 bytes of the experts ``tokens`` tokens touch under uniform routing: E(1-(1-k/E)^T) x 3HI."""
        e, k = float(self.experts), float(min(self.top_k, self.experts))
        touched = e * (1.0 - (1.0 - k / e) ** max(tokens, 0.0)) if e else 0.0
        return touched * 3.0 * self.hidden * self.inter


def moe_shape_of(c, ep: int = 1) -> MoeShape:
    """The rank MoE shape of ``rules.Conditions`` ``c`` served with ``ep`` expert-parallel ranks."""
    return MoeShape(c.num_experts // max(ep, 1), c.hidden_size, c.moe_inter, c.top_k, c.quantization)


@dataclass(frozen=True)
class LayerCell:
    """One measured layer-step cell: a decode step of ``layers`` decoder layers at one rank's shapes."""

    subject: str
    run: tuple  # (command, day): rows of one run are compared with each other only
    attention: str
    moe: str
    mix: str
    batch: int
    layers: int
    p50: float
    kv_bytes: float  # every layer's KV bytes of the batch
    context_mean: float
    copy_tbps: float
    kv_dtype: str
    tp: int
    ep: int
    conditions: object  # rules.Conditions of the rank the row was measured at
    moe_shape: MoeShape | None
    # our runner sent this batch's MoE calls to SGLang's triton (its hand-off): the cell times the
    # hand-off, not our kernel, so it never decides a hand-off itself
    handed_off: bool = False
    # our runner with its hand-off switched off for the run (the benchmark's ``hpc_advise-raw`` worker): every
    # bucket timed our kernel, so beside a hand-off cell of the same run it is the one that pairs
    handoff_off: bool = False
    created_at: str = ""

    @property
    def kv_floor_per_request_us(self) -> float:
        """One layer's KV bytes per request / the copy rate measured beside it (µs)."""
        return self.kv_bytes / self.layers / self.batch / (self.copy_tbps * 1e6)


def _quant_of(text: str, default: str) -> str:
    t = text.lower()
    if "per-tensor" in t:
        return "fp8-per-tensor"
    if "block" in t:
        return "fp8-block128"
    return default


def _rank_of(subject: str, cfg: dict):
    """(model profile, tp, ep) of a layer-step subject such as 'hy3-tp8-rank', or None."""
    from hpc_advise.profiles import ModelConfigError, ProfileNotFound, get_model

    m = _SUBJECT.match(subject or "")
    if not m:
        return None
    tp = int(cfg.get("tp_shard") or m.group("tp") or 0)
    ep = int(cfg.get("ep_shard") or m.group("ep") or 1)
    tp = tp or ep
    try:
        model = get_model(m.group("model"))
    except (ProfileNotFound, ModelConfigError):
        return None
    if tp < 1 or tp % ep:
        return None
    return model, tp, ep


def _run_of(row: dict) -> tuple:
    return (str(row.get("command") or ""), str(row.get("created_at") or "")[:10])


def layer_cells(rows: list[dict]) -> list[LayerCell]:
    """The ``layer_step`` latency rows as cells (newest per run, subject, combination, mix and batch:
    cells are only ever compared within one run, so a later run that measured other combinations
    leaves an earlier run's pairs in place); a row whose subject names no model profile, or that lacks
    a field, is left out, and so is a row run with our router GEMM in place of SGLang's gate: cells are
    compared by attention backend and MoE runner only, at SGLang's router. A row whose ``moe_paths``
    (the paths our MoE runner's layers took at that batch) are all ``triton`` is a handed-off cell."""
    from hpc_advise import rules

    newest: dict[tuple, dict] = {}
    for r in rows:
        if r.get("kind") != "layer_step" or r.get("unit") != "us" or not r.get("p50"):
            continue
        cfg = r.get("config") or {}
        if cfg.get("router", "sglang") != "sglang":
            continue
        key = (_run_of(r), r.get("subject"), r.get("provider"), cfg.get("mix"), cfg.get("batch"))
        if key not in newest or str(r.get("created_at", "")) >= str(newest[key].get("created_at", "")):
            newest[key] = r
    cells = []
    for r in newest.values():
        cfg = r["config"]
        rank = _rank_of(str(r.get("subject")), cfg)
        try:
            attention, moe = str(cfg["attention"]), str(cfg["moe_runner"])
            batch, layers = int(cfg["batch"]), int(cfg["layers"])
            kv_bytes, copy = float(cfg["kv_bytes"]), float(cfg["copy_tbps"])
        except (KeyError, TypeError, ValueError):
            continue
        if rank is None or batch < 1 or layers < 1 or copy <= 0:
            continue
        model, tp, ep = rank
        kv = "fp8_e4m3" if str(cfg.get("kv_cache_dtype", "")).startswith("fp8") else "bf16"
        c = rules.conditions(
            model, None, tp=tp, ep=ep, kv_dtype=kv, page_size=int(cfg.get("page_size") or 64)
        )
        shape = None
        if c.is_moe:
            shape = moe_shape_of(c, ep)
            shape = MoeShape(shape.experts, shape.hidden, shape.inter, shape.top_k,
                             _quant_of(str(cfg.get("quantization", "")), c.quantization))  # fmt: skip
        cells.append(
            LayerCell(
                subject=str(r["subject"]),
                run=_run_of(r),
                attention=attention,
                moe=moe,
                mix=str(cfg.get("mix")),
                batch=batch,
                layers=layers,
                p50=float(r["p50"]),
                kv_bytes=kv_bytes,
                context_mean=float(cfg.get("context_mean") or 0.0),
                copy_tbps=copy,
                kv_dtype=kv,
                tp=tp,
                ep=ep,
                conditions=c,
                moe_shape=shape,
                handed_off=moe == "hpc_advise" and set(cfg.get("moe_paths") or ()) == {DEFAULT_MOE_RUNNER},
                handoff_off=cfg.get("moe_handoff") == "off",
                created_at=str(r.get("created_at") or ""),
            )  # fmt: skip
        )
    return sorted(cells, key=lambda x: (x.subject, x.mix, x.batch, x.attention, x.moe))


@dataclass(frozen=True)
class MoePoint:
    """``runner`` and SGLang's default runner measured at the same shape and token count in one run."""

    shape: MoeShape
    tokens: int
    runner: str
    runner_us: float
    default_us: float
    per_layer_delta_us: float  # (runner - default) per MoE layer: > 0 means SGLang's default is faster
    source: str  # what was timed: 'layer step ...' or 'kernel ...'
    run: tuple = ()  # the run of a layer-step pair (``_run_of``)
    measured_at: str = ""  # the later created_at of the pair's two rows

    @property
    def ratio(self) -> float:
        """default time / runner time (> 1: the runner is faster)."""
        return self.default_us / self.runner_us


def moe_points(rows: list[dict], cells: list[LayerCell] | None = None) -> list[MoePoint]:
    """Every (runner, SGLang default) pair of one run at one MoE shape and token count: layer-step cells
    that differ only in the MoE runner (same subject, attention backend, mix and batch; the decode
    step's tokens are its batch), and fused_moe kernel rows of two providers at the same shape and T.
    A cell where our runner handed the batch to SGLang's triton pairs with nothing (it timed triton).
    ``cells``: ``layer_cells(rows)`` when the caller has it already."""
    out: list[MoePoint] = []
    groups: dict[tuple, dict[str, LayerCell]] = {}
    for cell in layer_cells(rows) if cells is None else cells:
        if cell.moe_shape is None or cell.handed_off:
            continue
        got = groups.setdefault((cell.subject, cell.run, cell.attention, cell.mix, cell.batch), {})
        # the hand-off-off cell times our kernel wherever both ran
        if cell.moe not in got or cell.handoff_off:
            got[cell.moe] = cell
    for (subject, _, _attention, _mix, batch), by_moe in sorted(
        groups.items(), key=lambda kv: kv[0][:1] + kv[0][2:]
    ):
        ref = by_moe.get(DEFAULT_MOE_RUNNER)
        if ref is None:
            continue
        for runner, cell in sorted(by_moe.items()):
            if runner == DEFAULT_MOE_RUNNER:
                continue
            out.append(
                MoePoint(
                    cell.moe_shape,
                    batch,
                    runner,
                    cell.p50,
                    ref.p50,
                    (cell.p50 - ref.p50) / cell.layers,
                    f"layer step {subject} ({cell.layers} layers)",
                    cell.run,
                    max(cell.created_at, ref.created_at),
                )  # fmt: skip
            )
    kernels: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        runner = MOE_PROVIDER_RUNNER.get(str(r.get("provider")))
        cfg = r.get("config") or {}
        if (
            r.get("kind") != "kernel"
            or r.get("subject") != "fused_moe"
            or r.get("unit") != "us"
            or not runner
        ):
            continue
        try:
            shape = MoeShape(int(cfg["E"]), int(cfg["H"]), int(cfg["I"]), int(cfg["top_k"]),
                             _MODE_QUANT.get(str(cfg.get("mode")), str(cfg.get("quant") or cfg.get("mode"))))  # fmt: skip
            tokens = int(cfg["T"])
        except (KeyError, TypeError, ValueError):
            continue
        got = kernels.setdefault((_run_of(r), shape, tokens), {})
        if runner not in got or str(r.get("created_at", "")) >= str(got[runner].get("created_at", "")):
            got[runner] = r
    for (_, shape, tokens), by_runner in kernels.items():
        ref = by_runner.get(DEFAULT_MOE_RUNNER)
        if ref is None:
            continue
        for runner, r in sorted(by_runner.items()):
            if runner != DEFAULT_MOE_RUNNER:
                d = float(r["p50"]) - float(ref["p50"])
                name = (r.get("config") or {}).get("shape") or shape.label()
                out.append(MoePoint(shape, tokens, runner, float(r["p50"]), float(ref["p50"]), d,
                                    f"kernel fused_moe {name} T {tokens}"))  # fmt: skip
    return out


@dataclass(frozen=True)
class MoeBucket:
    """A range of token counts around one measured T and what was measured there."""

    lo: int  # first token count of the bucket
    hi: int | None  # last one (None: no upper end measured, see ``bucket_edges``)
    tokens: int  # the measured T
    runner_us: float  # median over the bucket's pairs
    default_us: float
    per_layer_delta_us: float
    n: int
    source: str
    # median over the pairs of SGLang's default time / ours (< 1: SGLang's measured faster); the decision
    # and the printed figure both come from it, so a bucket whose pairs span several context mixes is never
    # called "ours faster" beside a figure below 1 (the medians of the two times alone can disagree with it)
    ratio: float
    ratio_lo: float  # the pairs' lowest and highest ratio
    ratio_hi: float

    @property
    def default_faster(self) -> bool:
        return self.ratio < 1.0

    def span(self) -> str:
        if self.hi is None:
            return f"T >= {self.lo}"
        return f"T = {self.lo}" if self.lo == self.hi else f"T = {self.lo}-{self.hi}"

    def figure(self) -> str:
        what = "MoE runner" if self.source.startswith("layer step") else "kernel"
        lo, hi = f"{self.ratio_lo:.2f}", f"{self.ratio_hi:.2f}"
        spread = f", {lo}-{hi}x" if lo != hi else ""
        return (
            f"{self.source} at T = {self.tokens}: ours {self.ratio:.2f}x SGLang's triton {what}, the median of "
            f"{self.n} measured pair(s){spread}"
        )


def bucket_edges(points: list[int]) -> list[tuple[int, int | None]]:
    """[lo, hi] token ranges, one per measured T (sorted, distinct): edges at the geometric midpoints
    between neighbours; the last bucket runs to twice its T (beyond that nothing was measured)."""
    ts = sorted(set(points))
    edges = []
    for i, t in enumerate(ts):
        lo = 1 if i == 0 else math.floor(math.sqrt(ts[i - 1] * t)) + 1
        hi = math.floor(math.sqrt(t * ts[i + 1])) if i + 1 < len(ts) else 2 * t
        edges.append((lo, hi))
    return edges


def moe_buckets(points: list[MoePoint], shape: MoeShape, runner: str = "hpc_advise") -> list[MoeBucket]:
    """The buckets of ``runner`` against SGLang's default at exactly ``shape``: layer-step pairs where
    there are any (the real layer), those of the newest run that paired cells at this shape (runs differ
    in weights and recipe: a later run's pairs supersede an earlier one's, a later run with no pair here
    leaves them), kernel pairs otherwise; medians over the pairs of each T."""
    mine = [p for p in points if p.shape == shape and p.runner == runner]
    layer = [p for p in mine if p.source.startswith("layer step")]
    if layer:
        when: dict[tuple, str] = {}
        for p in layer:
            when[p.run] = max(when.get(p.run, ""), p.measured_at)
        newest = max(when, key=lambda run: (when[run], run))
        layer = [p for p in layer if p.run == newest]
    mine = layer or mine
    by_t: dict[int, list[MoePoint]] = {}
    for p in mine:
        by_t.setdefault(p.tokens, []).append(p)
    out = []
    for (lo, hi), t in zip(bucket_edges(list(by_t)), sorted(by_t), strict=True):
        ps = by_t[t]
        out.append(
            MoeBucket(
                lo,
                hi,
                t,
                statistics.median(p.runner_us for p in ps),
                statistics.median(p.default_us for p in ps),
                statistics.median(p.per_layer_delta_us for p in ps),
                len(ps),
                ps[0].source,
                statistics.median(p.ratio for p in ps),
                min(p.ratio for p in ps),
                max(p.ratio for p in ps),
            )  # fmt: skip
        )
    return out


@dataclass(frozen=True)
class Handoff:
    """Which runner a MoE layer of ``shape`` gets at ``tokens`` tokens, and why."""

    runner: str  # 'hpc_advise' (ours) or DEFAULT_MOE_RUNNER
    measured: bool
    bucket: MoeBucket | None

    def reason(self) -> str:
        if self.bucket is None:
            return "no measured comparison with SGLang's triton at this shape and token count: ours runs"
        who = (
            "SGLang's triton measured faster" if self.runner == DEFAULT_MOE_RUNNER else "ours measured faster"
        )
        return f"{self.bucket.span()}: {who}; {self.bucket.figure()}"


@functools.lru_cache(maxsize=1)
def shipped_points() -> tuple[MoePoint, ...]:
    """``moe_points`` of the shipped rows, read once per process."""
    return tuple(moe_points(read_rows()))


def handoff_in(buckets: list[MoeBucket], tokens: int) -> Handoff:
    """The decision for ``tokens`` tokens among the buckets of one shape (``moe_buckets``)."""
    for b in buckets:
        if b.lo <= tokens and (b.hi is None or tokens <= b.hi):
            return Handoff(DEFAULT_MOE_RUNNER if b.default_faster else "hpc_advise", True, b)
    return Handoff("hpc_advise", False, None)


def moe_handoff(shape: MoeShape, tokens: int, points: list[MoePoint] | tuple | None = None) -> Handoff:
    """SGLang's default runner where it measured faster than ours in the bucket of ``tokens`` at exactly
    this shape; ours where ours measured faster or nothing was measured there."""
    return handoff_in(moe_buckets(list(shipped_points() if points is None else points), shape), tokens)


@dataclass(frozen=True)
class RouterComparison:
    """Decode steps with our router GEMM against the same steps at SGLang's gate, one gate shape: the
    layer-step pairs that differ only in the router (same run, subject, attention, MoE runner, mix, batch)."""

    experts: int
    hidden: int
    gate_dtype: str
    ratios: tuple[float, ...]  # SGLang's gate step / our router's step, per pair (> 1: ours faster)
    subjects: tuple[str, ...]

    def figure(self) -> str:
        r = sorted(self.ratios)
        return (
            f"decode steps with it {statistics.median(r):.2f}x those at SGLang's gate (median of {len(r)} "
            f"layer-step pairs, {r[0]:.2f}-{r[-1]:.2f}; {', '.join(self.subjects)})"
        )


def router_comparisons(rows: list[dict]) -> list[RouterComparison]:
    """One comparison per gate shape (experts, hidden, gate dtype) of the layer-step rows run with our
    router GEMM (``config.router`` hpc_advise) and their twins at SGLang's gate."""
    steps: dict[tuple, dict[str, float]] = {}
    for r in rows:
        cfg = r.get("config") or {}
        if r.get("kind") != "layer_step" or r.get("unit") != "us" or not r.get("p50"):
            continue
        provider = str(r.get("provider") or "").replace(",router=hpc_advise", "")
        key = (_run_of(r), str(r.get("subject")), provider, cfg.get("mix"), cfg.get("batch"))
        steps.setdefault(key, {})[str(cfg.get("router", "sglang"))] = float(r["p50"])
    by_shape: dict[tuple, tuple[list[float], set[str]]] = {}
    ranks = {subject: _rank_of(subject, {}) for _, subject, _, _, _ in steps}  # one profile lookup per subject
    for (_, subject, _, _, _), got in steps.items():
        if "hpc_advise" not in got or "sglang" not in got or ranks[subject] is None:
            continue
        model = ranks[subject][0]
        shape = (model.num_experts, model.hidden_size, model.router_dtype)
        ratios, subjects = by_shape.setdefault(shape, ([], set()))
        ratios.append(got["sglang"] / got["hpc_advise"])
        subjects.add(subject)
    return [
        RouterComparison(e, h, d, tuple(ratios), tuple(sorted(subjects)))
        for (e, h, d), (ratios, subjects) in sorted(by_shape.items())
    ]


@functools.lru_cache(maxsize=1)
def shipped_router_comparisons() -> tuple[RouterComparison, ...]:
    """``router_comparisons`` of the shipped rows, read once per process."""
    return tuple(router_comparisons(read_rows()))


def router_comparison(experts: int, hidden: int, gate_dtype: str) -> RouterComparison | None:
    """The shipped comparison at this gate shape, or None where no layer step measured one."""
    for cmp in shipped_router_comparisons():
        if (cmp.experts, cmp.hidden, cmp.gate_dtype) == (experts, hidden, gate_dtype):
            return cmp
    return None


def router_for_launch(c) -> RouterComparison | None:
    """The comparison by which a launch of our backends turns our router GEMM on
    (``HPC_ADVISE_ROUTER_GEMM=1``) for the gates of conditions ``c``, or None to leave SGLang's gate: only
    an fp32 gate (SGLang's own fp32 GEMM, which ours computes within 1e-5, so the model's numerics stay
    SGLang's; a bf16 gate's logits SGLang rounds to bf16 and ours would not) that the kernel's rules take,
    where the layer steps at its shape measured the decode step faster with it (median over the pairs)."""
    from dataclasses import replace

    from hpc_advise import rules

    if c.router_dtype != "fp32" or rules.first_rule("router_gemm", replace(c, router_opt_in=True)):
        return None
    cmp = router_comparison(c.num_experts, c.hidden_size, c.router_dtype)
    return cmp if cmp is not None and statistics.median(cmp.ratios) > 1.0 else None
