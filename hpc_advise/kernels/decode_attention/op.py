"""Launcher of paged decode attention: input checks, the plan (GPU buffers, schedule), run, convenience.

``plan(seq_lens, page_table, ...)`` returns a :class:`DecodePlan` that owns fixed-size GPU buffers (sized
from ``max_batch`` and the page-table width) and fills them with one Triton launch plus one copy of the page
table; ``plan.update(seq_lens, page_table)`` refills them in place without a host sync, so a decode step's
``update`` + ``run`` calls can be captured in one CUDA graph and replayed with new lengths.
``run(plan, q, k_cache, v_cache, ...)`` launches the persistent attention pass, then the log-sum-exp merge
launch, whose programs without merge duty exit after their planner loads (the merge always launches, so a
captured graph stays valid whatever the lengths are).

The launch configuration is ``config.tuned_config`` for the KV dtype, KV heads, head_dim and page size, or
the ``config`` given to ``plan``.

Supported: q bf16 or fp16 ``[B, Hq, D]``; KV cache ``[num_pages, page_size, Hkv, D]`` of q's dtype or
float8_e4m3fn with per-tensor scales (python floats or 1-element fp32 tensors on the device); head_dim
64/128/256; GQA group Hq/Hkv 1-16; page size 1/16/64; batch 1-1024; lengths 1-262144. Anything else raises
``ValueError``/``TypeError`` with the reason.

The MLA form (``plan_mla`` / ``run_mla``, kernel_mla.py): DeepSeek-V2/V3's absorbed attention, q ``[B, H, 576]``
against one latent row ``[512 latent, 64 rope]`` per token shared by all heads (SGLang's MLA pool), output the
heads' weighted latent ``[B, H, 512]``; bf16/fp16 only; H 1-16 or a multiple of 16 up to 128.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from . import kernel as _k
from . import kernel_mla as _km
from . import kernel_transposed as _kt
from .config import MANY_KV_HEADS, Config, tuned_config, tuned_mla_config

__all__ = [
    "MANY_KV_HEADS",
    "Config",
    "batch_bucket",
    "DecodePlan",
    "decode_attention",
    "plan",
    "plan_mla",
    "run",
    "run_mla",
    "tuned_config",
    "tuned_mla_config",
]

HEAD_DIMS = (64, 128, 256)
PAGE_SIZES = (1, 16, 64)
MAX_GROUP = 16
MAX_BATCH = 1024
MAX_SEQ_LEN = 256 * 1024
SCHEDULES = ("dynamic", "static")
MAX_STATIC_SPLITS = 64
# Software-pipelining depth of the tile loops.
NUM_STAGES = 3
# Page ids of this many tiles come from one vector load before an inner tile loop (pages >= tile or = tile / 2),
# so no load feeds the K/V addresses inside it and the pipeliner double-buffers K/V.
PT_CHUNK = 32
# Partials a narrow merge program combines per step (per query row and 64 columns); narrow programs take the
# segments split over at most MERGE_BLOCK programs, in one step. Segments split over more programs are listed
# by the planner (wide_list) and merged by the same launch's wide programs, WIDE_MERGE_BLOCK partials per step
# over WIDE_MERGE_COLS columns each.
MERGE_BLOCK = 16
WIDE_MERGE_BLOCK = 128
# [WIDE_MERGE_BLOCK, 8] fp32 tiles keep the wide programs within the narrow ones' register cap at 2 warps
# (16 columns spill). Each column's arithmetic is its own, so the width does not change a result.
WIDE_MERGE_COLS = 8
# Register cap of the merge launch: 16 programs per SM without spilling (ptxas would take 96).
MERGE_MAXNREG = 64
# whole_below: the planner keeps the whole-segment plan only if no program's cost exceeds the even share by
# more than WHOLE_GATE %, else it runs the even split (decided on the GPU in the same launch).
WHOLE_GATE = 8
# The MLA form: DeepSeek-V2/V3's latent rank and rope width, the most query heads per plan, and the shared
# memory the tile loop's stages may take per SM (mla_num_stages; an H200 SM has 228 KB, 1 KB per program reserved).
MLA_LORA = 512
MLA_ROPE = 64
MLA_MAX_HEADS = 128
MLA_SMEM_BYTES = 224 * 1024
# Programs of the grid when there is no GPU (Triton interpreter on CPU).
CPU_NUM_SMS = 4


def _fail(msg: str) -> None:
    raise ValueError(f"decode_attention: {msg}")


def _check_tensor(name: str, t: object, ndim: int, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"decode_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        _fail(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(
            f"decode_attention: {name} dtype {t.dtype} not supported (expected one of {[str(d) for d in dtypes]})"
        )
    if t.numel() > 0 and t.stride(-1) != 1:
        _fail(f"{name} must be contiguous in its last dimension, got strides {tuple(t.stride())}")
    return t


def _same_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        _fail(f"{name} is on {t.device}, expected {device}")


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_NUM_SMS


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass
class DecodePlan:
    """Schedule of one decode step: fixed-size GPU buffers and the launch configuration.

    Buffers (int32 unless noted): ``seq_lens[max_batch]``, ``page_table[max_batch, max_pages]``,
    ``req_start[max_batch + 1]`` (first work unit of each request), ``prog_start[G + 1]`` (first unit of
    each program), ``prog_b[G]`` (request of each program's first unit), ``ws_o[2G, group, D]`` and
    ``ws_lse[2G, group]`` fp32 (partial results of split segments), ``prog_desc`` (each program's range and
    first segment, ``[G, 8]``, then the in-pass merge's counters), ``req_cost[max_batch + 1]`` (cost position
    where each request starts: tiles + ``seg_cost`` per segment), ``wide_list[G // MERGE_BLOCK + 1]``
    (programs whose merge goes to the wide merge programs, then -1s), ``bounds[4, G + 1]`` (with
    ``whole_below``: the whole-segment plan's boundaries as cost position, first unit and its request;
    ``bounds[3, 0]`` is 1 if the gate kept that plan, else the even split runs), ``region[max_batch, 2]``
    (with ``whole_below``: the cost span of each request's region).
    """

    page_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    schedule: str
    max_batch: int
    max_pages: int
    config: Config
    rope_dim: int  # 0: the GQA form; > 0: the MLA form (head_dim is then the latent rank, plan_mla)
    num_programs: int  # G of the dynamic grid, or of the static grid at max_batch
    static_splits: int  # 0 for the dynamic schedule
    device: torch.device
    batch: int = 0
    seq_lens: torch.Tensor = field(repr=False, default=None)
    page_table: torch.Tensor = field(repr=False, default=None)
    req_start: torch.Tensor = field(repr=False, default=None)
    prog_start: torch.Tensor = field(repr=False, default=None)
    prog_b: torch.Tensor = field(repr=False, default=None)
    ws_o: torch.Tensor = field(repr=False, default=None)
    ws_lse: torch.Tensor = field(repr=False, default=None)
    merge_first: torch.Tensor = field(repr=False, default=None)
    merge_bh: torch.Tensor = field(repr=False, default=None)
    merge_seg: torch.Tensor = field(repr=False, default=None)
    prog_desc: torch.Tensor = field(repr=False, default=None)
    req_cost: torch.Tensor = field(repr=False, default=None)
    wide_list: torch.Tensor = field(repr=False, default=None)
    bounds: torch.Tensor = field(repr=False, default=None)
    region: torch.Tensor = field(repr=False, default=None)

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def tile(self) -> int:
        return self.config.tile

    @property
    def num_warps(self) -> int:
        return self.config.num_warps

    def grid_size(self) -> int:
        """Programs of the attention pass for the current batch."""
        if self.static_splits:
            return self.batch * self.num_kv_heads * self.static_splits
        return self.num_programs

    def update(
        self, seq_lens: torch.Tensor, page_table: torch.Tensor, *, validate: bool = True
    ) -> DecodePlan:
        """Re-plan in place for new lengths / page table (no host sync unless ``validate`` and not
        capturing a CUDA graph). The batch may change up to ``max_batch``; a captured graph keeps the
        batch it was captured with."""
        seq_lens = _check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
        page_table = _check_tensor("page_table", page_table, 2, (torch.int32,))
        _same_device("seq_lens", seq_lens, self.device)
        _same_device("page_table", page_table, self.device)
        batch = seq_lens.shape[0]
        if not 1 <= batch <= self.max_batch:
            _fail(f"batch {batch} outside 1..{self.max_batch} (max_batch of this plan)")
        if page_table.shape[0] != batch:
            _fail(f"page_table has {page_table.shape[0]} rows, seq_lens has {batch}")
        if page_table.shape[1] > self.max_pages:
            _fail(f"page_table has {page_table.shape[1]} columns, the plan was sized for {self.max_pages}")
        if validate and not _capturing():
            lo, hi = int(seq_lens.min()), int(seq_lens.max())
            if lo < 1 or hi > MAX_SEQ_LEN:
                _fail(f"sequence lengths must lie in 1..{MAX_SEQ_LEN}, got min {lo} max {hi}")
            if hi > page_table.shape[1] * self.page_size:
                _fail(
                    f"a sequence of {hi} tokens needs {math.ceil(hi / self.page_size)} pages, "
                    f"page_table has {page_table.shape[1]} columns"
                )
        self.batch = batch
        self.page_table[:batch, : page_table.shape[1]].copy_(page_table)
        g = self.grid_size()
        block_b = batch_bucket(self.max_batch)
        # all G + 1 boundaries in one step of the planner's loops where G < 1024: each step is a chain of
        # dependent loads (binary searches), so fewer steps make a shorter plan
        block_g = min(1024, max(16, _next_pow2(g + 1)))
        cfg = self.config
        _k.plan_kernel[(1,)](
            seq_lens,
            self.seq_lens,
            self.req_start,
            self.prog_start,
            self.prog_b,
            self.merge_first,
            self.merge_bh,
            self.merge_seg,
            self.prog_desc,
            self.req_cost,
            self.wide_list,
            self.bounds,
            self.region,
            batch,
            g,
            max(1, self.static_splits),
            cfg.seg_cost,
            cfg.whole_below,
            WHOLE_GATE,
            self.wide_list.shape[0],
            NUM_KV_HEADS=self.num_kv_heads,
            TILE=cfg.tile,
            STATIC=self.static_splits > 0,
            BLOCK_B=block_b,
            BLOCK_G=block_g,
            G_STEPS=-(-(g + 1) // block_g),
            SEARCH_STEPS=int(math.log2(block_b)) + 1,
            BLOCK_P=MERGE_BLOCK,
            MERGE_IN_PASS=cfg.merge_in_pass,
            num_warps=4,
        )
        return self


def batch_bucket(max_batch: int) -> int:
    """The planner's batch width (its BLOCK_B) for a plan of ``max_batch`` requests: plans in one bucket
    share one compiled planner, so callers that size plans by bucket compile it once per bucket."""
    return max(16, _next_pow2(max_batch))


def _check_page_size(page_size: int) -> None:
    if page_size not in PAGE_SIZES:
        _fail(f"page_size {page_size} not supported (supported: {PAGE_SIZES})")


def _check_geometry(page_size: int, head_dim: int, num_q_heads: int, num_kv_heads: int) -> int:
    """The GQA group of a supported (page size, head_dim, heads) geometry; ValueError otherwise."""
    _check_page_size(page_size)
    if head_dim not in HEAD_DIMS:
        _fail(f"head_dim {head_dim} not supported (supported: {HEAD_DIMS})")
    if num_kv_heads < 1 or num_q_heads < 1 or num_q_heads % num_kv_heads:
        _fail(f"num_q_heads {num_q_heads} must be a positive multiple of num_kv_heads {num_kv_heads}")
    group = num_q_heads // num_kv_heads
    if group > MAX_GROUP:
        _fail(f"GQA group {group} (= {num_q_heads}/{num_kv_heads}) exceeds {MAX_GROUP}")
    return group


def plan(
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    *,
    page_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    schedule: str = "dynamic",
    max_batch: int | None = None,
    max_pages: int | None = None,
    kv_dtype: torch.dtype | None = None,
    config: Config | None = None,
    validate: bool = True,
) -> DecodePlan:
    """Build the schedule of a decode step on the GPU (see module docstring).

    ``config`` (None: ``tuned_config(kv_dtype, num_kv_heads, head_dim, page_size)``, a ``kv_dtype`` of None
    taking the bf16 rows) is the launch configuration. The persistent grid has SMs x ``ctas_per_sm``
    programs; ``schedule='static'`` splits every (request, KV head) into as many chunks as give the grid as
    many programs at ``max_batch`` (at most MAX_STATIC_SPLITS)."""
    if schedule not in SCHEDULES:
        _fail(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    _check_geometry(page_size, head_dim, num_q_heads, num_kv_heads)
    if config is None:
        config = tuned_config(kv_dtype, num_kv_heads, head_dim, page_size)
    return _build_plan(
        seq_lens,
        page_table,
        page_size=page_size,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rope_dim=0,
        schedule=schedule,
        max_batch=max_batch,
        max_pages=max_pages,
        config=config,
        validate=validate,
    )


def _build_plan(
    seq_lens, page_table, *, page_size, num_q_heads, num_kv_heads, head_dim, rope_dim, schedule, max_batch,
    max_pages, config, validate,
) -> DecodePlan:  # fmt: skip
    """The plan of a checked geometry (both forms): buffers sized, then filled by ``update``."""
    group = num_q_heads // num_kv_heads
    if not isinstance(config, Config):
        raise TypeError(
            f"decode_attention: config must be a decode_attention Config, got {type(config).__name__}"
        )
    why_not = config.problem(page_size)
    if why_not:
        _fail(f"config: {why_not}")
    seq_lens = _check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    page_table = _check_tensor("page_table", page_table, 2, (torch.int32,))
    device = seq_lens.device
    batch = seq_lens.shape[0]
    max_batch = batch if max_batch is None else int(max_batch)
    if not 1 <= max_batch <= MAX_BATCH:
        _fail(f"max_batch {max_batch} outside 1..{MAX_BATCH}")
    max_pages = page_table.shape[1] if max_pages is None else int(max_pages)
    if max_pages < 1:
        _fail(f"page_table needs at least one column, got {max_pages}")
    g = _num_sms(device) * config.ctas_per_sm
    splits = 0
    if schedule == "static":
        splits = min(max(1, -(-g // (max_batch * num_kv_heads))), MAX_STATIC_SPLITS)
        g = max_batch * num_kv_heads * splits
    i32 = dict(dtype=torch.int32, device=device)
    p = DecodePlan(
        page_size=page_size,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        schedule=schedule,
        max_batch=max_batch,
        max_pages=max_pages,
        config=config,
        rope_dim=rope_dim,
        num_programs=g,
        static_splits=splits,
        device=device,
        seq_lens=torch.ones(max_batch, **i32),
        page_table=torch.zeros(max_batch, max_pages, **i32),
        req_start=torch.zeros(max_batch + 1, **i32),
        prog_start=torch.zeros(g + 1, **i32),
        prog_b=torch.zeros(g, **i32),
        ws_o=torch.empty(2 * g, group, head_dim, dtype=torch.float32, device=device),
        ws_lse=torch.empty(2 * g, group, dtype=torch.float32, device=device),
        merge_first=torch.full((g,), -1, **i32),
        merge_bh=torch.zeros(g, **i32),
        merge_seg=torch.zeros(g, **i32),
        # the G descriptors, then the in-pass merge's 4 rows of G (kernel._plan_merge_in_pass)
        prog_desc=torch.zeros(12 * g, **i32)[: 8 * g].view(g, 8),
        req_cost=torch.zeros(max_batch + 1, **i32),
        wide_list=torch.full((g // MERGE_BLOCK + 1,), -1, **i32),
        bounds=torch.zeros(4, g + 1, **i32),
        region=torch.zeros(max_batch, 2, **i32),
    )
    return p.update(seq_lens, page_table, validate=validate)


def _scale_arg(name: str, s: object, device: torch.device) -> float | torch.Tensor:
    if isinstance(s, torch.Tensor):
        if s.numel() != 1:
            _fail(f"{name} must be a float or a 1-element tensor, got shape {tuple(s.shape)}")
        _same_device(name, s, device)
        return s.reshape(1).to(torch.float32)
    try:
        v = float(s)
    except (TypeError, ValueError):
        raise TypeError(f"decode_attention: {name} must be a float or a 1-element tensor") from None
    if not math.isfinite(v) or v <= 0:
        _fail(f"{name} must be positive and finite, got {v}")
    return v


def _out_arg(plan: DecodePlan, out, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``out`` checked (dtype, device, shape), or allocated when None."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=plan.device)
    _check_tensor("out", out, 3, (dtype,))
    _same_device("out", out, plan.device)
    if tuple(out.shape) != shape:
        _fail(f"out has shape {tuple(out.shape)}, expected {shape}")
    return out


def _sm_scale_arg(sm_scale: float) -> float:
    sm = float(sm_scale)
    if not math.isfinite(sm) or sm <= 0:
        _fail(f"sm_scale must be positive and finite, got {sm}")
    return sm


def _check_run_inputs(plan: DecodePlan, q, k_cache, v_cache, out):
    """run()'s tensors checked against the plan (dtypes, devices, shapes; clear errors), ``out`` allocated
    when None: (q, k_cache, v_cache, out)."""
    if not isinstance(plan, DecodePlan):
        raise TypeError("decode_attention: run() needs the DecodePlan returned by plan()")
    if plan.rope_dim:
        _fail("this plan is of the MLA form (plan_mla): call run_mla")
    q = _check_tensor("q", q, 3, (torch.bfloat16, torch.float16))
    kv_dtypes = (q.dtype, torch.float8_e4m3fn)
    k_cache = _check_tensor("k_cache", k_cache, 4, kv_dtypes)
    v_cache = _check_tensor("v_cache", v_cache, 4, kv_dtypes)
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"decode_attention: k_cache is {k_cache.dtype} but v_cache is {v_cache.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _same_device(name, t, plan.device)
    want_q = (plan.batch, plan.num_q_heads, plan.head_dim)
    if tuple(q.shape) != want_q:
        _fail(f"q has shape {tuple(q.shape)}, the plan expects {want_q}")
    want_kv = (plan.page_size, plan.num_kv_heads, plan.head_dim)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if tuple(t.shape[1:]) != want_kv:
            _fail(f"{name} has shape {tuple(t.shape)}, expected [num_pages, {', '.join(map(str, want_kv))}]")
    if k_cache.shape[0] != v_cache.shape[0]:
        _fail(f"k_cache has {k_cache.shape[0]} pages, v_cache {v_cache.shape[0]}")
    return q, k_cache, v_cache, _out_arg(plan, out, tuple(q.shape), q.dtype)


def run(
    plan: DecodePlan,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    sm_scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of every query against its request's paged KV; returns ``out`` ``[B, Hq, D]``."""
    q, k_cache, v_cache, out = _check_run_inputs(plan, q, k_cache, v_cache, out)
    sm = _sm_scale_arg(1.0 / math.sqrt(q.shape[2]) if sm_scale is None else sm_scale)
    ks = _scale_arg("k_scale", k_scale, plan.device)
    vs = _scale_arg("v_scale", v_scale, plan.device)
    from_ptr = isinstance(ks, torch.Tensor) or isinstance(vs, torch.Tensor)
    if from_ptr:
        scales = torch.cat(
            [
                ks if isinstance(ks, torch.Tensor) else torch.full((1,), ks, device=plan.device),
                vs if isinstance(vs, torch.Tensor) else torch.full((1,), vs, device=plan.device),
            ]
        )
        qk_scale, v_arg = sm * math.log2(math.e), 1.0
    else:
        scales = plan.ws_lse  # unused pointer
        qk_scale, v_arg = sm * ks * math.log2(math.e), vs

    cfg = plan.config
    # fp16 products read V as int16 pairs of e4m3: only for even strides and base (else the plain path)
    f16_dot = (
        cfg.f16_dot
        and v_cache.dtype == torch.float8_e4m3fn
        and v_cache.data_ptr() % 2 == 0
        and all(st % 2 == 0 for st in v_cache.stride()[:3])
    )
    # programmatic dependent launch of the merge: a GPU feature (SM90+), nothing to emulate on CPU
    pdl = not _interpreting() and plan.device.type == "cuda"
    g = plan.grid_size()
    group = plan.group
    warp_split = _warp_split(plan)
    common = dict(
        GROUP=group,
        GROUP_PAD=max(16, _next_pow2(group)),
        HEAD_DIM=q.shape[2],
        PAGE=plan.page_size,
        TILE=cfg.tile,
        NUM_STAGES=NUM_STAGES,
        SCALES_FROM_PTR=from_ptr,
        num_warps=cfg.num_warps,
    )
    strides = (
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        plan.page_table.stride(0),
    )
    if cfg.transposed:
        # K read as int32 (4 e4m3 each): its strides and base must be multiples of 4 for fp16 products
        k4 = k_cache.data_ptr() % 4 == 0 and all(st % 4 == 0 for st in k_cache.stride()[:3])
        _kt.decode_transposed_kernel[(g,)](
            q,
            k_cache,
            v_cache,
            out,
            plan.page_table,
            plan.seq_lens,
            plan.prog_desc,
            plan.ws_o,
            plan.ws_lse,
            scales,
            qk_scale,
            v_arg,
            *strides,
            plan.num_kv_heads,
            PT_CHUNK=PT_CHUNK,
            F16_DOT=f16_dot and k4,
            ASM_CVT=f16_dot and k4 and not _interpreting(),
            PDL=pdl,
            HALVES=_halves(plan),
            MERGE_IN_PASS=cfg.merge_in_pass > 0,
            **common,
            **_register_cap(plan),
        )
    else:
        _k.decode_kernel[(g,)](
            q,
            k_cache,
            v_cache,
            out,
            plan.page_table,
            plan.seq_lens,
            plan.prog_desc,
            plan.ws_o,
            plan.ws_lse,
            scales,
            qk_scale,
            v_arg,
            *strides,
            plan.num_kv_heads,
            PT_CHUNK=PT_CHUNK,
            F16_DOT=f16_dot,
            ASM_CVT=f16_dot and not _interpreting(),
            PDL=pdl,
            WARP_SPLIT=warp_split,
            MERGE_IN_PASS=cfg.merge_in_pass > 0,
            **common,
        )
    _merge(plan, out, pdl)
    return out


def plan_mla(
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    *,
    page_size: int,
    num_heads: int,
    kv_lora_rank: int = MLA_LORA,
    rope_dim: int = MLA_ROPE,
    max_batch: int | None = None,
    max_pages: int | None = None,
    kv_dtype: torch.dtype | None = None,
    config: Config | None = None,
    validate: bool = True,
) -> DecodePlan:
    """The schedule of an MLA decode step (``run_mla``): as ``plan``, with the ``num_heads`` query heads cut
    into blocks of min(num_heads, 16) that each form a segment per request (all of them read the one latent
    row per token). ``config`` None: ``tuned_mla_config(kv_dtype)``."""
    _check_page_size(page_size)
    if (kv_lora_rank, rope_dim) != (MLA_LORA, MLA_ROPE):
        _fail(
            f"MLA latent {kv_lora_rank} + rope {rope_dim} not supported (supported: {MLA_LORA} + {MLA_ROPE})"
        )
    group = min(int(num_heads), MAX_GROUP)
    if num_heads < 1 or num_heads % group or num_heads > MLA_MAX_HEADS:
        _fail(
            f"MLA num_heads {num_heads} must be 1-{MAX_GROUP} or a multiple of {MAX_GROUP} up to {MLA_MAX_HEADS}"
        )
    if kv_dtype is not None and kv_dtype not in (torch.bfloat16, torch.float16):
        _fail(f"the MLA form reads bf16/fp16 KV, got {kv_dtype}")
    if config is None:
        config = tuned_mla_config(kv_dtype)
    elif isinstance(config, Config) and config.merge_in_pass:
        _fail("config: the MLA form merges in its own launch (merge_in_pass must be 0)")
    return _build_plan(
        seq_lens,
        page_table,
        page_size=page_size,
        num_q_heads=num_heads,
        num_kv_heads=num_heads // group,
        head_dim=kv_lora_rank,
        rope_dim=rope_dim,
        schedule="dynamic",
        max_batch=max_batch,
        max_pages=max_pages,
        config=config,
        validate=validate,
    )


def _check_mla_inputs(plan: DecodePlan, q, kv_cache, out):
    """run_mla()'s tensors checked against the plan: (q, kv_cache, out), ``out`` allocated when None."""
    if not isinstance(plan, DecodePlan) or not plan.rope_dim:
        raise TypeError("decode_attention: run_mla() needs the DecodePlan returned by plan_mla()")
    q = _check_tensor("q", q, 3, (torch.bfloat16, torch.float16))
    kv_cache = _check_tensor("kv_cache", kv_cache, 4, (q.dtype,))
    for name, t in (("q", q), ("kv_cache", kv_cache)):
        _same_device(name, t, plan.device)
    width = plan.head_dim + plan.rope_dim
    if tuple(q.shape) != (plan.batch, plan.num_q_heads, width):
        _fail(f"q has shape {tuple(q.shape)}, the plan expects {(plan.batch, plan.num_q_heads, width)}")
    if tuple(kv_cache.shape[1:]) != (plan.page_size, 1, width):
        _fail(
            f"kv_cache has shape {tuple(kv_cache.shape)}, expected [num_pages, {plan.page_size}, 1, {width}]"
        )
    return q, kv_cache, _out_arg(plan, out, (plan.batch, plan.num_q_heads, plan.head_dim), q.dtype)


def run_mla(
    plan: DecodePlan,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    *,
    sm_scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """MLA decode: ``out[b, j] = softmax_i(sm_scale q[b, j] . kv_i) kv_i[:kv_lora_rank]`` over request b's
    tokens i. q ``[B, H, kv_lora_rank + rope_dim]`` (latent part first), kv_cache ``[num_pages, page, 1,
    kv_lora_rank + rope_dim]`` of q's dtype; returns ``out`` ``[B, H, kv_lora_rank]``."""
    q, kv_cache, out = _check_mla_inputs(plan, q, kv_cache, out)
    sm = _sm_scale_arg(sm_scale)
    pdl = not _interpreting() and plan.device.type == "cuda"
    cfg = plan.config
    _km.decode_mla_kernel[(plan.grid_size(),)](
        q,
        kv_cache,
        out,
        plan.page_table,
        plan.seq_lens,
        plan.prog_desc,
        plan.ws_o,
        plan.ws_lse,
        sm * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        out.stride(0),
        out.stride(1),
        plan.page_table.stride(0),
        plan.num_kv_heads,
        GROUP=plan.group,
        GROUP_PAD=max(16, _next_pow2(plan.group)),
        LORA=plan.head_dim,
        ROPE=plan.rope_dim,
        PAGE=plan.page_size,
        TILE=cfg.tile,
        NUM_STAGES=mla_num_stages(cfg),
        PT_CHUNK=PT_CHUNK,
        PDL=pdl,
        num_warps=cfg.num_warps,
    )
    _merge(plan, out, pdl)
    return out


def mla_num_stages(cfg: Config) -> int:
    """Pipeline depth of the MLA tile loop: as many stages of the tile's latent rows (tile x 1152 bytes) as
    keep ``ctas_per_sm`` programs within an SM's shared memory, at most NUM_STAGES."""
    per_stage = cfg.tile * (MLA_LORA + MLA_ROPE) * 2
    return max(1, min(NUM_STAGES, MLA_SMEM_BYTES // (per_stage * cfg.ctas_per_sm)))


def _halves(plan: DecodePlan) -> int:
    """Products per tile of the transposed kernel: 2 (two of tile / 2 token rows, one cross-warp max) where
    the tile holds 32 or more rows per warp (4 warps x 128 tokens: each warpgroup MMA stays m64), else 1."""
    return 2 if plan.tile >= 32 * plan.num_warps else 1


def _register_cap(plan: DecodePlan) -> dict:
    """``maxnreg`` for the transposed kernel: registers per thread capped so that the dynamic grid's
    programs per SM fit (ptxas otherwise takes up to 255, and 2 programs of 4 warps fill an SM). Empty on
    CPU, for the static grid and where no cap is needed."""
    if plan.device.type != "cuda" or plan.static_splits or _interpreting():
        return {}
    ctas = max(1, plan.num_programs // _num_sms(plan.device))
    regs = 65536 // (ctas * 32 * plan.num_warps) // 8 * 8
    return {"maxnreg": regs} if regs < 255 else {}


def _warp_split(plan: DecodePlan) -> int:
    """Warps a tile's tokens are split over (0: the plain tile loop): with ``warp_split``, pages of at least a
    tile and at least 16 tokens per warp (the MMA's K), else the plain loop runs."""
    ok = plan.config.warp_split and plan.page_size >= plan.tile and plan.tile // plan.num_warps >= 16
    return plan.num_warps if ok else 0


def merge_grid(plan: DecodePlan) -> tuple[int, int, int]:
    """The merge launch's grid (kernel.merge_duty): G narrow programs + D_CHUNK // WIDE_MERGE_COLS wide ones per
    wide_list entry, times the group's query rows, times D in chunks of D_CHUNK (``_merge_cols``)."""
    d_chunk = _merge_cols(plan)
    wide = plan.wide_list.shape[0]
    return plan.grid_size() + wide * (d_chunk // WIDE_MERGE_COLS), plan.group, plan.head_dim // d_chunk


def _merge_cols(plan: DecodePlan) -> int:
    """Columns of D per narrow merge program: the config's ``merge_cols``, at most D."""
    return min(plan.config.merge_cols, plan.head_dim)


def _merge(plan: DecodePlan, out: torch.Tensor, pdl: bool) -> None:
    """The log-sum-exp merge: one launch of narrow and wide programs (see ``MERGE_BLOCK``)."""
    d_chunk = _merge_cols(plan)
    g = plan.grid_size()
    wide = plan.wide_list.shape[0]
    launch = {"launch_pdl": True} if pdl else {}  # only where used: the interpreter knows no such option
    if plan.device.type == "cuda" and not _interpreting():
        launch["maxnreg"] = MERGE_MAXNREG
    _k.merge_kernel[merge_grid(plan)](
        out,
        plan.prog_start,
        plan.merge_first,
        plan.merge_bh,
        plan.merge_seg,
        plan.ws_o,
        plan.ws_lse,
        plan.wide_list,
        g,
        wide,
        out.stride(0),
        out.stride(1),
        NUM_KV_HEADS=plan.num_kv_heads,
        GROUP=plan.group,
        HEAD_DIM=plan.head_dim,
        D_CHUNK=d_chunk,
        BLOCK_P=MERGE_BLOCK,
        WIDE_COLS=WIDE_MERGE_COLS,
        WIDE_BLOCK_P=WIDE_MERGE_BLOCK,
        PDL=pdl,
        num_warps=max(2, d_chunk // 32),  # the same columns per thread for every merge_cols
        **launch,
    )


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    page_size: int,
    sm_scale: float | None = None,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    schedule: str = "dynamic",
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """plan + run in one call. With ``validate`` (default) it also checks, with a host sync, that every
    page id the lengths reach lies in ``[0, num_pages)``."""
    _check_tensor("q", q, 3, (torch.bfloat16, torch.float16))
    _check_tensor("k_cache", k_cache, 4, (q.dtype, torch.float8_e4m3fn))
    if k_cache.shape[1] != page_size:
        _fail(f"k_cache has page size {k_cache.shape[1]}, page_size argument is {page_size}")
    _check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    if q.shape[0] != seq_lens.shape[0]:
        _fail(f"q has batch {q.shape[0]}, seq_lens has {seq_lens.shape[0]}")
    p = plan(
        seq_lens,
        page_table,
        page_size=page_size,
        num_q_heads=q.shape[1],
        num_kv_heads=k_cache.shape[2],
        head_dim=q.shape[2],
        schedule=schedule,
        kv_dtype=k_cache.dtype,
        validate=validate,
    )
    if validate and not _capturing():
        cols = torch.arange(page_table.shape[1], device=page_table.device)
        used = cols[None, :] < ((seq_lens + page_size - 1) // page_size)[:, None]
        ids = page_table[used]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= k_cache.shape[0]):
            _fail(f"page_table holds page ids outside [0, {k_cache.shape[0]}) within the sequence lengths")
    return run(p, q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale, sm_scale=sm_scale, out=out)
