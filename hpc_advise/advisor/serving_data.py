"""Measured serving results as ``ServingPoint``s: the seed CSV, CSV files in its format, and the
knowledge base's ``serving`` runs; each row either parses or says why not (FILE:LINE: reason).

The CSV format is shared/data/serving_measurements_train.csv (NVIDIA AIConfigurator's
``silicon_sample.csv`` columns). Only aggregated-mode rows are modelled. In that format ``tp_size`` is
the attention-TP width and ``batch_size`` the concurrency per attention-DP group, so a replica has
``tp_size * attention_dp_size`` GPUs and ``batch_size * attention_dp_size`` requests in flight. Rows
that write the replica multiplied by its EP width (16 or 64 GPUs with ``moe_tp_size == moe_ep_size``)
are read as the deployment they ran (``_fold_moe_group_quirk``).
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from hpc_advise.advisor.roofline import normalize_quant

SEED_CSV = "serving_measurements_train.csv.gz"
SEED_CITATION = (
    "NVIDIA AIConfigurator silicon_sample.csv (aiconfigurator-core 0.12.0, Apache-2.0, copyright NVIDIA); "
    "SGLang-on-H100/H200 rows held out by the data owner"
)

CSV_COLUMNS = (
    "id",
    "backend",
    "backend_version",
    "model_path",
    "system",
    "precision",
    "mode",
    "isl",
    "osl",
    "gemm_quant_mode",
    "moe_quant_mode",
    "batch_size",
    "tp_size",
    "pp_size",
    "attention_dp_size",
    "moe_tp_size",
    "moe_ep_size",
    "silicon_ttft_ms",
    "silicon_tpot_ms",
)


class RowError(ValueError):
    """A row that cannot be turned into a ServingPoint; the message is the reason."""


@dataclass(frozen=True)
class ServingPoint:
    """One measured (or to-be-predicted) aggregated serving configuration."""

    where: str  # FILE:LINE or kb:runs:ID
    row_id: str
    engine: str  # sglang | vllm | trtllm | ...
    model: str  # HF id or profile key
    gpu: str  # GPU name as a profile alias
    dense_quant: str
    moe_quant: str
    kv_bytes: float
    isl: float
    osl: float
    concurrency: float  # requests in flight on the replica
    n_gpus: int
    attn_dp: int
    moe_ep: int
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    # False where ``kv_bytes`` is a guess (the CSV format has no KV-dtype column: ``default_kv_bytes``)
    kv_stated: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


_SYSTEM_RE = re.compile(r"^(gb\d+|[a-z]\d+)(?:_(?:sxm|pcie|nvl))?$")


def gpu_name(system: str) -> str:
    """CSV system label ('h200_sxm', 'gb200') -> GPU profile alias ('h200', 'gb200')."""
    m = _SYSTEM_RE.match(system.strip().lower())
    if not m:
        raise RowError(f"unknown system {system!r}")
    return m.group(1)


def _int(d: dict, key: str, default: int | None = None) -> int:
    raw = (d.get(key) or "").strip()
    if not raw:
        if default is None:
            raise RowError(f"missing {key}")
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise RowError(f"{key}={raw!r} is not a number") from exc
    if value != int(value):
        raise RowError(f"{key}={raw!r} is not an integer")
    return int(value)


def _float(d: dict, key: str) -> float | None:
    raw = (d.get(key) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise RowError(f"{key}={raw!r} is not a number") from exc
    if not value > 0:
        raise RowError(f"{key}={raw!r} must be > 0")
    return value


_SILICON_CONCURRENCY = re.compile(r"(?:^|[;\s])silicon_concurrency=(\d+)")


def _silicon_concurrency(d: dict) -> int | None:
    """The client concurrency recorded in ``silicon_data_source`` ('...; silicon_concurrency=128; ...')."""
    m = _SILICON_CONCURRENCY.search(d.get("silicon_data_source") or "")
    return int(m.group(1)) if m else None


def default_kv_bytes(engine: str, quant: str) -> float:
    """KV-cache bytes per element the CSV rows most likely ran with (the CSV does not say): TensorRT-LLM
    quantized recipes use an FP8 KV cache; SGLang and vLLM default to the model dtype (bf16)."""
    if engine == "trtllm" and quant != "bf16":
        return 1.0
    return 2.0


NODE_GPUS = 8  # GPUs of one HGX H100/H200/B200/B300 node (the *_sxm systems of the seed file)


def _fold_moe_group_quirk(tp: int, dp: int, ep: int, moe_tp: int) -> tuple[int, int, int]:
    """(attention TP, attention DP, EP) of a row whose columns multiply the replica by its EP width.

    Some rows of the seed file (DeepSeek and Qwen3.5 on B200/B300/H200, SGLang and TensorRT-LLM) state
    ``moe_tp_size == moe_ep_size = E`` and ``tp_size x attention_dp_size = E x E`` (16 or 64 GPUs):
    the same measurements (identical TTFT and TPOT to the last digit) appear again in the file as
    ``E`` GPUs with ``moe_tp 1, moe_ep E`` and ``tp_size`` / ``attention_dp_size`` divided by ``E``
    (e.g. tp 64, moe 8 x 8 next to tp 8, moe 1 x 8), and 64 GPUs is more than the 8-GPU node these
    single-node benchmarks ran on. Such rows are read as the ``E``-GPU deployment."""
    if ep > 1 and moe_tp == ep and tp * dp == ep * ep and tp * dp > NODE_GPUS:
        if tp % ep == 0:
            return tp // ep, dp, ep
        if dp % ep == 0:
            return tp, dp // ep, ep
    return tp, dp, ep


def point_from_csv_row(d: dict[str, str], where: str) -> ServingPoint:
    """Parse one CSV row (DictReader dict). Raises RowError with the reason it cannot be modelled."""
    mode = (d.get("mode") or "agg").strip()
    if mode != "agg":
        raise RowError(
            f"mode {mode!r}: only aggregated serving is modelled (disaggregated rows split prefill/decode)"
        )
    pp = _int(d, "pp_size", 1)
    if pp != 1:
        raise RowError(f"pp_size {pp}: pipeline parallelism is not modelled")
    tp = _int(d, "tp_size")
    dp = _int(d, "attention_dp_size", 0)
    ep = _int(d, "moe_ep_size", 1) or 1
    if tp < 1:
        raise RowError(f"tp_size {tp} must be >= 1")
    moe_group = (_int(d, "moe_tp_size", 0) or 0) * ep
    if dp < 1:
        # attention_dp_size not stated: the MoE group (moe_tp x moe_ep) spans every GPU of the replica
        # (AIConfigurator's rows satisfy tp x attention_dp = moe_tp x moe_ep; vLLM's expert layers form
        # a DP x TP group, docs.vllm.ai serving/data_parallel_deployment), so a larger MoE group
        # than tp_size means attention data parallelism over moe_group / tp_size groups
        dp = moe_group // tp if moe_group > tp and moe_group % tp == 0 else 1
    batch = _int(d, "batch_size")
    if batch < 1:
        raise RowError(f"batch_size {batch} must be >= 1")
    concurrency = batch * dp
    tp, dp, ep = _fold_moe_group_quirk(tp, dp, ep, moe_group // ep if ep else 0)
    n = tp * dp
    if n % ep:
        # dense models carry meaningless MoE columns; the MoE split is checked against the model later
        ep = 1
    measured = _silicon_concurrency(d)
    if measured is not None:
        # the benchmark client's concurrency, when the source records it, is what was measured; rows
        # where it matches neither reading of batch_size (per attention-DP group or per replica) were
        # run with a deployment the row's columns do not describe
        if measured not in (batch, concurrency):
            raise RowError(
                f"silicon_concurrency {measured} matches neither batch_size {batch} nor batch_size x "
                f"attention_dp_size {concurrency}: the row's parallel columns do not describe its run"
            )
        concurrency = measured
    isl, osl = _int(d, "isl"), _int(d, "osl")
    if isl < 1 or osl < 1:
        raise RowError("isl and osl must be >= 1")
    precision = (d.get("precision") or "").strip()
    try:
        dense_q = normalize_quant(d.get("gemm_quant_mode") or precision)
        moe_q = normalize_quant(d.get("moe_quant_mode") or d.get("gemm_quant_mode") or precision)
    except ValueError as exc:
        raise RowError(str(exc)) from exc
    engine = (d.get("backend") or "").strip().lower()
    if not engine:
        raise RowError("missing backend")
    model = (d.get("model_path") or "").strip()
    if not model:
        raise RowError("missing model_path")
    return ServingPoint(
        where=where,
        row_id=(d.get("id") or "").strip(),
        engine=engine,
        model=model,
        gpu=gpu_name(d.get("system") or ""),
        dense_quant=dense_q,
        moe_quant=moe_q,
        kv_bytes=default_kv_bytes(engine, moe_q),
        kv_stated=False,
        isl=float(isl),
        osl=float(osl),
        concurrency=float(concurrency),
        n_gpus=n,
        attn_dp=dp,
        moe_ep=ep,
        ttft_ms=_float(d, "silicon_ttft_ms"),
        tpot_ms=_float(d, "silicon_tpot_ms"),
    )


def read_csv_rows(path: str | Path | None = None) -> Iterator[tuple[str, dict[str, str]]]:
    """(FILE:LINE, row dict) of a CSV in the serving format; ``None`` = the shipped seed file."""
    if path is None:
        raw = resources.files("hpc_advise.advisor.data").joinpath(SEED_CSV).read_bytes()
        text = io.StringIO(gzip.decompress(raw).decode("utf-8"))
        label = f"<seed>/{SEED_CSV}"
        yield from _rows(text, label)
        return
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", newline="", encoding="utf-8") as fh:
        yield from _rows(fh, str(p))


def _rows(fh: Iterable[str], label: str) -> Iterator[tuple[str, dict[str, str]]]:
    reader = csv.DictReader(fh)
    missing = [
        c
        for c in ("model_path", "system", "isl", "osl", "batch_size", "tp_size")
        if c not in (reader.fieldnames or ())
    ]
    if missing:
        raise RowError(
            f"{label}:1: missing columns {missing} (expected the columns of serving_measurements_train.csv)"
        )
    for row in reader:
        yield f"{label}:{reader.line_num}", row


def seed_points() -> tuple[list[ServingPoint], list[tuple[str, str]]]:
    """The shipped CSV's measured points with both TTFT and TPOT, and (where, reason) for the rest."""
    return points_from_csv(None, require_targets=True)


def points_from_csv(
    path: str | Path | None, require_targets: bool = False
) -> tuple[list[ServingPoint], list[tuple[str, str]]]:
    good: list[ServingPoint] = []
    bad: list[tuple[str, str]] = []
    for where, row in read_csv_rows(path):
        try:
            p = point_from_csv_row(row, where)
            if require_targets and (p.ttft_ms is None or p.tpot_ms is None):
                raise RowError("no measured silicon_ttft_ms / silicon_tpot_ms")
            good.append(p)
        except RowError as exc:
            bad.append((where, str(exc)))
    return good, bad


def point_from_run(run: dict) -> ServingPoint:
    """A knowledge-base ``serving`` run (an imported SGLang ``bench_serving`` / vLLM ``bench serve``
    result, see ``knowledge_base.importers``) as a ServingPoint.

    Reads, from ``run['config']``: model (or model_path), isl/osl (measured means) or
    random_input_len/random_output_len, max_concurrency, tp_size, dp_size with enable_dp_attention
    (attention DP) or without (replicas), attn_dp_size, ep_size, quantization, kv_cache_dtype; from
    ``run['metrics']``: mean (else median) TTFT and TPOT in ms, and the measured mean concurrency when
    no max_concurrency was set; the GPU from ``run['gpu']``. Raises RowError naming what is missing.
    """
    cfg = dict(run.get("config") or {})
    metrics = dict(run.get("metrics") or cfg.get("metrics") or {})
    where = f"kb:runs:{run.get('id')}"

    def pick(source: dict, *names):
        for n in names:
            if source.get(n) not in (None, ""):
                return source[n]
        return None

    model = pick(cfg, "model", "model_path", "served_model_name")
    gpu = run.get("gpu") or pick(cfg, "gpu", "system")
    isl = pick(cfg, "isl", "random_input_len", "input_len")
    osl = pick(cfg, "osl", "random_output_len", "output_len")
    conc = pick(cfg, "max_concurrency", "concurrency") or pick(metrics, "concurrency")
    missing = [
        n
        for n, v in (("model", model), ("gpu", gpu), ("isl", isl), ("osl", osl), ("concurrency", conc))
        if v is None
    ]
    if missing:
        raise RowError(
            f"{where}: serving run lacks {', '.join(missing)} (import with --gpu; needs a fixed-length workload)"
        )
    tp = int(pick(cfg, "tp_size", "tp") or 1)
    dp = int(pick(cfg, "dp_size") or 1)
    attn_dp = int(pick(cfg, "attn_dp_size") or (dp if cfg.get("enable_dp_attention") else 1))
    replicas = 1 if cfg.get("enable_dp_attention") else dp
    ep = int(pick(cfg, "ep_size", "ep") or 1)
    engine = str(run.get("subject") or pick(cfg, "engine") or "sglang").lower()
    quant_label = pick(cfg, "quantization")
    quant = normalize_quant(str(quant_label)) if quant_label else None
    kv = str(pick(cfg, "kv_cache_dtype") or "auto")
    ttft = pick(metrics, "mean_ttft_ms", "median_ttft_ms", "ttft_ms")
    tpot = pick(metrics, "mean_tpot_ms", "median_tpot_ms", "tpot_ms")
    if ttft is None or tpot is None:
        raise RowError(f"{where}: serving run has no TTFT/TPOT metrics")
    return ServingPoint(
        where=where,
        row_id=str(run.get("id")),
        engine=engine,
        model=str(model),
        gpu=str(gpu),
        dense_quant=quant or "",  # '' = the model profile's checkpoint (filled in by serving_model.prepare)
        moe_quant=quant or "",
        kv_bytes=1.0 if "fp8" in kv else 2.0,
        isl=float(isl),
        osl=float(osl),
        concurrency=float(conc) / replicas,
        n_gpus=tp,  # SGLang's --tp-size counts every GPU of one replica
        attn_dp=attn_dp,
        moe_ep=ep,
        ttft_ms=float(ttft),
        tpot_ms=float(tpot),
    )
