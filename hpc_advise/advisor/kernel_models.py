"""Per-operator kernel models fitted on kernel benchmark rows: how far each attention backend sits
from the KV-read roofline on a given decode batch, so backends can be compared on a trace's length mix.

Rows come from three places (all knowledge-base ``runs`` rows, kind 'kernel'): the seed file
``data/kernel_seed.jsonl`` (the team's reference H200 run, shared DESIGN §7), the kernel tables
shipped in ``data/kernel_results/``, and the knowledge base: package data only, never a checkout's
``benchmarks/results/``. For decode attention,
each provider gets a non-negative least-squares model

    t_us = a + b * floor_us + c * tail_us

where ``floor_us`` = the batch's KV bytes / copy bandwidth (the roofline) and ``tail_us`` = the
longest request's bytes of one KV head / copy bandwidth: a kernel that cannot split a long request
over many SMs pays ``c`` (static split-k schedules have a large ``c``, dynamic schedules a small
one). ``a`` is the fixed cost (launch, planning, merge). Bandwidths come from the row's GPU profile,
so the fit transfers to another GPU by its bandwidth.

Layer-step rows (kind 'layer_step', benchmarks/bench_layer.py: SGLang's own decoder layers, one decode
step replayed from its CUDA graph, per attention backend x MoE runner; parsed by ``hpc_advise.measured``)
are used as measured, not fitted:

- attention (:class:`LayerAttention`): per layer, the step-time difference of two backends in cells of one
  run that differ only in the attention backend, interpolated piecewise-linearly over the mean context
  (the context mix) at each measured batch and linearly over log(batch) between batches: a measured
  cell is reproduced exactly, so the predicted order of the backends is the measured one in every cell;
  outside the measured batches or contexts the nearest value is kept, at another rank shape it is scaled
  by the KV bytes per token, and the prediction says so;
- MoE runners (:class:`LayerMoe`): per MoE layer, a runner's step time minus SGLang's default runner's
  (``measured.moe_points``: layer-step pairs, kernel pairs where no layer step was measured), interpolated
  over log(tokens); at another rank shape of the same FP8 scheme and top-k, scaled by the expert bytes the
  tokens touch, and said so. Our runner hands the buckets where SGLang's measured faster to SGLang's
  kernel (``runtime/sglang/moe.py``), so its difference there is taken as zero.

The fit of the package's rows alone ships as ``data/attention_model.json`` (the rows' hash beside
it), so an advisor run without the user's kernel rows neither fits nor imports scipy; with kernel rows
in the knowledge base it fits. ``tests/advisor/test_shipped_data.py`` fails when a fresh fit differs
from the shipped one; ``HPC_ADVISE_WRITE_GOLDENS=1`` rewrites it there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

SEED = "kernel_seed.jsonl"

# SGLang attention backend -> benchmark providers that stand for it, best first.
BACKEND_PROVIDERS: dict[str, tuple[str, ...]] = {
    "hpc_advise": ("hpc_advise_dynamic", "hpc_advise"),
    "hpc_ops": ("hpc_ops", "hpc_ops_dynamic"),
    "flashinfer": ("fi_decode_tc", "flashinfer", "flashinfer_decode"),
    "fa3": ("fa3", "flash_attn_3"),
    "triton": ("sglang_triton", "triton"),
}

# (eager-timed provider, the same kernel timed as CUDA-graph replays)
SAME_KERNEL = (("flashinfer", "fi_decode_tc"),)

_GROUP = re.compile(r"(\d+)\s*x\s*(\d+)\s*(K?)", re.I)
_LOGU = re.compile(r"(\d+)\s*x\s*(?:log-uniform|U\()\s*(?:\s*(\d+)(K?)\s*[-–]\s*(\d+)(K?))?", re.I)


def lengths_of(config: dict) -> list[int] | None:
    """Sequence lengths of a decode-attention benchmark case: explicit ``seq_lens``, ``groups``
    [[count, len], ...], ``loguniform`` [n, lo, hi] (expected quantiles), or a case name such as
    '1 x 128K + 31 x 4K' / '64 x log-uniform 1K-32K'."""
    if config.get("seq_lens"):
        return [int(x) for x in config["seq_lens"]]
    if config.get("groups"):
        return [int(n) for c, n in config["groups"] for _ in range(int(c))]
    spec = config.get("loguniform")
    name = str(config.get("case") or config.get("mix") or "")
    if spec is None:
        m = _LOGU.search(name)
        if m:
            lo = int(m.group(2)) * (1024 if m.group(3) else 1) if m.group(2) else 1024
            hi = int(m.group(4)) * (1024 if m.group(5) else 1) if m.group(4) else 32768
            spec = [int(m.group(1)), lo, hi]
    if spec is not None:
        n, lo, hi = int(spec[0]), float(spec[1]), float(spec[2])
        qs = (np.arange(n) + 0.5) / n
        return [int(round(math.exp(math.log(lo) + q * (math.log(hi) - math.log(lo))))) for q in qs]
    groups = _GROUP.findall(name)
    if groups:
        return [int(n) * (1024 if k else 1) for c, n, k in groups for _ in range(int(c))]
    return None


def attention_terms(
    lens, num_kv_heads: int, head_dim: int, kv_elem_bytes: float, bw_bytes_per_us: float
) -> tuple[float, float]:
    """(floor_us, tail_us) of one decode-attention call over ``lens`` on one rank."""
    per_token_head = 2.0 * head_dim * kv_elem_bytes
    total = float(np.sum(lens)) * per_token_head * num_kv_heads
    return total / bw_bytes_per_us, float(np.max(lens)) * per_token_head / bw_bytes_per_us


def batch_attention_terms(
    ctx: np.ndarray, num_kv_heads: int, head_dim: int, kv_elem_bytes: float, bw_bytes_per_us: float
) -> tuple[np.ndarray, np.ndarray]:
    """``attention_terms`` of every row of ``ctx`` [batches, requests] at once: (floor_us, tail_us)
    arrays, each element the number ``attention_terms`` gives for that row."""
    per_token_head = 2.0 * head_dim * kv_elem_bytes
    total = ctx.sum(axis=1) * per_token_head * num_kv_heads
    return total / bw_bytes_per_us, ctx.max(axis=1) * per_token_head / bw_bytes_per_us


@dataclass
class AttentionModel:
    """Fitted (a, b, c) per provider, with the rows each fit used."""

    coef: dict[str, tuple[float, float, float]]
    n_rows: dict[str, int]
    sources: dict[str, list[str]]
    plan_us: dict[str, float] = field(default_factory=dict)  # per decode step
    eager_shift_us: dict[str, float] = field(default_factory=dict)  # taken off eager-only intercepts
    layer: LayerAttention | None = None  # layer-step attention differences (``load_attention_model``)
    moe: LayerMoe | None = None  # MoE runners against SGLang's default

    def plan_for(self, backend: str) -> float:
        """Per-step planning µs of the backend's measured provider (0 when none was measured)."""
        p = self.provider_for(backend)
        return self.plan_us.get(p, 0.0) if p else 0.0

    def provider_for(self, backend: str) -> str | None:
        for p in BACKEND_PROVIDERS.get(backend, (backend,)):
            if p in self.coef:
                return p
        return None

    def predict_us(self, backend: str, floor_us: np.ndarray, tail_us: np.ndarray) -> np.ndarray | None:
        """Per-call µs for ``backend`` (None when no provider of it was measured)."""
        p = self.provider_for(backend)
        if p is None:
            return None
        a, b, c = self.coef[p]
        return a + b * np.asarray(floor_us) + c * np.asarray(tail_us)


def seed_rows() -> list[dict]:
    text = resources.files("hpc_advise.advisor.data").joinpath(SEED).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def shipped_rows() -> list[dict]:
    """The kernel benchmark tables shipped in ``data/kernel_results/`` (``measured.read_rows``; a bench
    writes them with an explicit ship step; the advisor never reads ``benchmarks/results/``)."""
    from hpc_advise.measured import read_rows

    return read_rows()


def kb_rows(kb_path: str | Path | None) -> list[dict]:
    from hpc_advise.paths import kb_path as default_kb

    path = Path(kb_path) if kb_path else default_kb()
    if not path.exists():
        return []
    from hpc_advise.knowledge_base.store import KnowledgeBase

    kb = KnowledgeBase(path)
    return (
        kb.runs(kind="kernel", subject="decode_attention")
        + kb.runs(kind="kernel", subject="fused_moe")
        + kb.runs(kind="layer_step")
    )


def fit_attention(rows: list[dict]) -> AttentionModel:
    """Fit (a, b, c) per provider on decode-attention latency rows it can interpret; rows timed
    with CUDA graphs are preferred over eager rows of the same provider (launch gaps differ)."""
    from scipy.optimize import nnls

    from hpc_advise.advisor.serving_data import RowError
    from hpc_advise.advisor.serving_model import resolve_gpu

    by_provider: dict[str, list[tuple[float, float, float, str]]] = {}
    for r in _newest_per_case(rows):
        if r.get("kind") != "kernel" or r.get("subject") != "decode_attention" or r.get("unit") != "us":
            continue
        cfg = r.get("config") or {}
        lens = lengths_of(cfg)
        if not lens or not r.get("p50"):
            continue
        try:
            bw = float(resolve_gpu(str(r.get("gpu") or "h200")).rate("copy_bw_tbps")) * 1e6
        except RowError:
            continue
        elem = 1.0 if "fp8" in str(cfg.get("kv_dtype", "")) else 2.0
        heads, dim = int(cfg.get("num_kv_heads", 1)), int(cfg.get("head_dim", 128))
        floor, tail = attention_terms(lens, heads, dim, elem, bw)
        if cfg.get("kv_bytes"):  # the benchmark's exact bytes (its random lengths), not our expected ones
            floor = float(cfg["kv_bytes"]) / bw
        graph = str(cfg.get("timing", "")).strip().lower() in ("graph", "cuda graph", "cuda-graph")
        key = str(r.get("provider"))
        by_provider.setdefault(key, []).append((floor, tail, float(r["p50"]), "graph" if graph else "eager"))
    coef, counts, sources = {}, {}, {}
    modes_of: dict[str, set] = {}
    for prov, items in by_provider.items():
        modes = {m for *_, m in items}
        keep = [it for it in items if it[3] == "graph"] if "graph" in modes else items
        if len(keep) < 3:
            continue
        A = np.array([[1.0, f, t] for f, t, _, _ in keep])
        y = np.array([v for _, _, v, _ in keep])
        sol, _ = nnls(A / y[:, None], np.ones(len(y)))
        coef[prov] = (float(sol[0]), float(sol[1]), float(sol[2]))
        counts[prov] = len(keep)
        modes_of[prov] = {m for *_, m in keep}
        sources[prov] = sorted(modes_of[prov])
    # Eager timings carry launch gaps that CUDA-graph replays (how SGLang decodes) do not: move an
    # eager-only provider onto the graph scale by the intercept difference of a kernel timed both ways.
    offset = None
    for eager_name, graph_name in SAME_KERNEL:
        if modes_of.get(eager_name) == {"eager"} and modes_of.get(graph_name) == {"graph"}:
            offset = coef[eager_name][0] - coef[graph_name][0]
            break
    shift: dict[str, float] = {}
    if offset is not None:
        for prov, modes in modes_of.items():
            if modes == {"eager"}:
                a, b, c = coef[prov]
                coef[prov] = (max(a - offset, 0.0), b, c)
                shift[prov] = a - coef[prov][0]
                sources[prov] = [f"eager, intercept moved by {-shift[prov]:+.1f} us to the graph scale"]
    return AttentionModel(coef, counts, sources, _plan_costs(rows), shift)


def _newest_per_case(rows: list[dict]) -> list[dict]:
    """One row per (provider, case, heads, KV dtype, timing): the newest, so a re-run of a kernel
    replaces its older numbers instead of being averaged with them."""
    newest: dict[tuple, dict] = {}
    for r in rows:
        cfg = r.get("config") or {}
        key = (
            r.get("subject"),
            r.get("provider"),
            str(cfg.get("case") or cfg.get("mix") or cfg.get("seq_lens") or cfg.get("groups")),
            cfg.get("num_q_heads"),
            cfg.get("num_kv_heads"),
            cfg.get("kv_dtype"),
            cfg.get("timing"),
        )
        if key not in newest or str(r.get("created_at", "")) >= str(newest[key].get("created_at", "")):
            newest[key] = r
    return list(newest.values())


def _plan_costs(rows: list[dict]) -> dict[str, float]:
    """Median µs per decode step of each provider's planning call (once per step, not per layer)."""
    out: dict[str, list[float]] = {}
    for r in _newest_per_case(rows):
        if r.get("subject") == "decode_attention.plan" and r.get("p50"):
            out.setdefault(str(r.get("provider")), []).append(float(r["p50"]))
    return {k: float(np.median(v)) for k, v in out.items()}


SHIPPED_FIT = "attention_model.json"  # in hpc_advise.advisor.data: fit_attention(seed + shipped rows)


def rows_hash(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def fit_to_json(model: AttentionModel, rows: list[dict]) -> str:
    """The shipped file's text: the fit's fields and the hash of the rows it was fitted on."""
    fit = {
        k: v for k, v in dataclasses.asdict(model).items() if k not in ("layer", "moe")
    }  # attached on load
    text = json.dumps({"rows": rows_hash(rows), **fit}, indent=1)  # fit order kept
    return text + "\n"


def shipped_fit(rows: list[dict]) -> AttentionModel | None:
    """The shipped fit when it was fitted on exactly ``rows``, else None."""
    try:
        text = resources.files("hpc_advise.advisor.data").joinpath(SHIPPED_FIT).read_text(encoding="utf-8")
        d = json.loads(text)
        if d.pop("rows") != rows_hash(rows):
            return None
        d["coef"] = {k: tuple(v) for k, v in d["coef"].items()}
        return AttentionModel(**d)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_attention_model(kb_path: str | Path | None = None) -> AttentionModel:
    """The attention kernel fit on the package's rows plus the knowledge base's kernel rows (the shipped
    fit when the knowledge base adds none and the package's rows are the ones it was fitted on), with the
    layer-step attention and MoE comparisons attached."""
    base, kb = seed_rows() + shipped_rows(), kb_rows(kb_path)
    model = (None if kb else shipped_fit(base)) or fit_attention(base + kb)
    from hpc_advise.measured import layer_cells, moe_points

    rows = base + kb
    cells = layer_cells(rows)  # parsed once for both comparisons
    model.layer = LayerAttention(cells)
    model.moe = LayerMoe(moe_points(rows, cells))
    return model


# ------------------------------------------------------------------------------------- layer steps
def _interp_log(xq: float, xs: list[float], ys: list[np.ndarray]) -> np.ndarray:
    """Linear in log(x) between the two measured xs around ``xq`` (clamped to the ends)."""
    if xq <= xs[0]:
        return ys[0]
    if xq >= xs[-1]:
        return ys[-1]
    j = int(np.searchsorted(xs, xq))
    lo, hi = math.log(xs[j - 1]), math.log(xs[j])
    f = (math.log(xq) - lo) / (hi - lo)
    return (1 - f) * ys[j - 1] + f * ys[j]


def _same_attention_shape(c, q_heads: int, kv_heads: int, head_dim: int, kv_dtype: str, mla: bool) -> bool:
    return (c.attention == "mla") == mla and (c.q_heads, c.kv_heads, c.head_dim, c.kv_dtype) == (
        q_heads, kv_heads, head_dim, kv_dtype)  # fmt: skip


@dataclass
class LayerAttention:
    """Per-layer step-time differences between decode attention backends, from layer-step cells."""

    cells: list = field(default_factory=list)  # measured.LayerCell
    # built on first use from ``cells``, which do not change
    _pairs: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _backends: frozenset | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_rows(cls, rows: list[dict]) -> LayerAttention:
        from hpc_advise.measured import layer_cells

        return cls(layer_cells(rows))

    def backends(self) -> frozenset[str]:
        if self._backends is None:
            self._backends = frozenset(c.attention for c in self.cells)
        return self._backends

    def pairs(self, a: str, b: str) -> dict[str, dict[int, list[tuple[float, float]]]]:
        """{subject: {batch: [(mean context tokens, (a - b) µs per layer)]}} over the cells of one
        run that differ only in the backend (the MoE runners' differences averaged); computed once
        per (a, b): the cells do not change, and the screen asks for every sampled batch size."""
        if (a, b) not in self._pairs:
            self._pairs[(a, b)] = self._pairs_uncached(a, b)
        return self._pairs[(a, b)]

    def _pairs_uncached(self, a: str, b: str) -> dict[str, dict[int, list[tuple[float, float]]]]:
        by: dict[tuple, dict[str, object]] = {}
        for c in self.cells:
            by.setdefault((c.subject, c.run, c.moe, c.handoff_off, c.mix, c.batch), {})[c.attention] = c
        acc: dict[tuple, list] = {}
        for (subject, run, _moe, _off, mix, batch), got in by.items():
            if a in got and b in got:
                ca, cb = got[a], got[b]
                acc.setdefault((subject, run, mix, batch), []).append(
                    (ca.context_mean, (ca.p50 - cb.p50) / ca.layers)
                )
        out: dict[str, dict[int, list[tuple[float, float]]]] = {}
        for (subject, _run, _mix, batch), vals in sorted(acc.items()):
            x = float(np.mean([v[0] for v in vals]))
            d = float(np.mean([v[1] for v in vals]))
            out.setdefault(subject, {}).setdefault(batch, []).append((x, d))
        return out

    def subject_shape(self, subject: str):
        return next(c.conditions for c in self.cells if c.subject == subject)

    def delta_us(
        self, a: str, b: str, *, q_heads: int, kv_heads: int, head_dim: int, kv_dtype: str, mla: bool,
        batch: int, context: np.ndarray, kv_bytes_per_token: float,
    ) -> tuple[np.ndarray, list[str]] | None:  # fmt: skip
        """(a - b) µs per layer for batches of ``batch`` requests of mean context ``context`` tokens (one
        value per sampled batch) at ``kv_bytes_per_token`` (one layer's KV on one rank), and notes on any
        extrapolation; None when no run measured both backends at an attention of this kind. At another
        rank shape the difference is scaled by the KV bytes per token (said so)."""
        pairs = self.pairs(a, b)
        if not pairs:
            return None
        exact = [
            s
            for s in pairs
            if _same_attention_shape(self.subject_shape(s), q_heads, kv_heads, head_dim, kv_dtype, mla)
        ]
        near = [s for s in pairs if (self.subject_shape(s).attention == "mla") == mla]
        if not exact and not near:
            return None
        subject = (exact or near)[0]
        if exact:
            table = _pooled([pairs[s] for s in exact])
        if not exact:  # nearest by GQA group, then by KV bytes per token of one rank

            def dist(s):
                c = self.subject_shape(s)
                return (abs(math.log((c.q_heads / c.kv_heads) / max(q_heads / kv_heads, 1e-9))),
                        abs(math.log((c.kv_heads * c.head_dim) / max(kv_heads * head_dim, 1))))  # fmt: skip

            subject = min(near, key=dist)
        notes = []
        c = self.subject_shape(subject)
        if not exact:
            notes.append(
                f"measured at {subject} ({c.q_heads}/{c.kv_heads} heads x {c.head_dim}, {c.kv_dtype} KV), "
                f"not this rank's {q_heads:g}/{kv_heads:g} x {head_dim}, {kv_dtype} (scaled by KV bytes per token)"
            )
        xq = np.asarray(context, dtype=float)
        ref = next(x for x in self.cells if x.subject == subject)
        scale = kv_bytes_per_token / (ref.kv_bytes / ref.layers / ref.batch / max(ref.context_mean, 1.0))
        scale = 1.0 if exact else scale
        if not exact:
            table = pairs[subject]
        batches = sorted(table)
        j = int(np.searchsorted(batches, batch))
        used = {batches[min(j, len(batches) - 1)]} | (
            {batches[j - 1]} if 0 < j and batches[min(j, len(batches) - 1)] != batch else set()
        )
        vals, outside = [], False
        for bs in batches:
            pts = sorted(table[bs])
            xs, ds = [p[0] for p in pts], [p[1] for p in pts]
            vals.append(np.interp(xq, xs, ds))
            if bs in used:  # the measured batches this prediction is read from
                outside |= bool(np.any(xq < xs[0] * (1 - 1e-6)) or np.any(xq > xs[-1] * (1 + 1e-6)))
        if batch < batches[0] or batch > batches[-1]:
            notes.append(f"batch {batch} outside the measured {batches[0]}-{batches[-1]}")
        if outside:
            notes.append("contexts outside the measured mixes")
        return _interp_log(float(batch), [float(x) for x in batches], vals) * scale, notes


def _pooled(tables: list[dict[int, list[tuple[float, float]]]]) -> dict[int, list[tuple[float, float]]]:
    """One {batch: [(context, delta)]} table from several (subjects or runs of one attention shape): points
    at the same context (the bench draws the same lengths for every model) are averaged, so the
    interpolation sees distinct, sorted contexts."""
    got: dict[int, dict[float, list[float]]] = {}
    for table in tables:
        for bs, pts in table.items():
            for x, d in pts:
                got.setdefault(bs, {}).setdefault(round(x, 6), []).append(d)
    return {bs: [(x, float(np.mean(ds))) for x, ds in sorted(v.items())] for bs, v in got.items()}


@dataclass
class LayerMoe:
    """Per-MoE-layer step-time differences of MoE runners against SGLang's default, from measured pairs."""

    points: list = field(default_factory=list)  # measured.MoePoint

    @classmethod
    def from_rows(cls, rows: list[dict]) -> LayerMoe:
        from hpc_advise.measured import moe_points

        return cls(moe_points(rows))

    def delta_us(self, runner: str, shape, tokens: int) -> tuple[float, list[str]] | None:
        """(runner - SGLang's default) µs per MoE layer at ``tokens`` tokens of rank shape ``shape``
        (``measured.MoeShape``), and notes on any extrapolation; None when nothing comparable was
        measured. Our runner's buckets where SGLang's measured faster count as zero: it hands them over."""
        from hpc_advise.measured import moe_buckets

        buckets = moe_buckets(self.points, shape, runner)
        notes: list[str] = []
        scale = 1.0
        if not buckets:  # another rank shape of the same scheme (and top-k where one was measured), scaled by
            # expert bytes, which count the experts a batch touches at each top-k
            same = [p.shape for p in self.points if p.runner == runner and p.shape.quant == shape.quant]
            others = {s for s in same if s.top_k == shape.top_k} or set(same)
            if not others:
                return None
            size = shape.experts * shape.hidden * shape.inter
            near = min(
                others, key=lambda s: (abs(math.log(s.experts * s.hidden * s.inter / size)), s.label())
            )
            buckets = moe_buckets(self.points, near, runner)
            scale = shape.expert_bytes(tokens) / max(near.expert_bytes(tokens), 1.0)
            notes.append(f"MoE measured at {near.label()}, scaled by expert bytes to {shape.label()}")
        handoff = runner == "hpc_advise" and scale == 1.0
        ts = [float(b.tokens) for b in buckets]
        ds = [np.array(min(b.per_layer_delta_us, 0.0) if handoff else b.per_layer_delta_us) for b in buckets]
        if tokens < ts[0] or tokens > ts[-1]:
            notes.append(f"MoE tokens {tokens} outside the measured {int(ts[0])}-{int(ts[-1])}")
        return float(_interp_log(float(tokens), ts, ds)) * scale, notes
