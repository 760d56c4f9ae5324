"""SGLang attention backend ``hpc_advise``: paged decode on ``hpc_advise.kernels.decode_attention``.

Decode only. Select it with ``--decode-attention-backend hpc_advise --page-size 64``; SGLang then
builds its ``HybridAttnBackend`` with this backend for decode and its own prefill backend (fa3 on
SM90 by default, or ``--prefill-attention-backend``) for prefill/extend, so nothing of prefill runs
here. Loaded lazily by the factory the plugin registers (``plugin.py``); imports SGLang.

What it does per step:
- metadata (once per decode step, not per layer): the page table ``[bs, max_pages]`` is gathered from
  SGLang's ``req_to_token`` (the token slot of each page's first token, divided by the page size: the
  token pool ``[slots, Hkv, D]`` *is* ``[pages, page_size, Hkv, D]``, read with no copy), then the
  kernel's ``DecodePlan.update`` schedules the persistent grid on the GPU;
- per layer: SGLang's ``set_kv_buffer`` stores the new token's K/V (with the layer's fp8 scales), then
  ``decode_attention.run`` reads the pool pages.

MLA (DeepSeek-V2/V3: ``model_runner.use_mla_backend``, SGLang's plain ``MLATokenToKVPool``, bf16 KV): the
pool holds one row ``[kv_lora_rank latent | rope]`` per token for all heads (``[slots, 1, 576]``, read as
``[pages, page_size, 1, 576]``). SGLang's ``DeepseekV2AttentionMLA`` picks its forward method by the
backend's name (``dispatch_attn_forward_method``, ``models/deepseek_common/attention_backend_handler.py``);
a name it does not know, ours, gets the ``triton`` handler, so decode takes the absorbed ``MLA`` method,
and since ``hpc_advise`` is not in ``FORWARD_ABSORB_CORE_ATTENTION_BACKENDS`` the model concatenates as it
does for triton: q ``[T, H, latent + rope]`` (absorbed q_nope, then q_pe), k ``[T, 1, latent + rope]``,
v = the latent part, no ``q_rope``/``k_rope`` kwargs. Per layer we then do what SGLang's triton backend
does with an MLA pool: ``set_kv_buffer`` stores k's row at ``out_cache_loc``, then ``run_mla`` attends
over the pool rows (V = the row's first ``kv_lora_rank`` columns), output ``[T, H * kv_lora_rank]``. The
metadata step (page table, ``plan_mla`` / ``DecodePlan.update``) is the GQA one.

CUDA graphs: ``init_cuda_graph_state`` allocates one plan sized for the largest captured batch;
``init_forward_metadata_in_graph`` (recorded in the graph) refills the page table and re-plans from the
live ``seq_lens`` with no host sync; eager steps use their own plans, so replays and eager steps never
share buffers. An eager batch above the kernel's per-plan limit (1024 requests) is planned and run in
chunks; a CUDA-graph batch must fit one plan (``--cuda-graph-max-bs`` <= 1024, checked at capture). Start-up checks come from ``dispatch.py`` (the same table ``hpc-advise runtime check``
prints) and fail with its reason instead of running a wrong or unsupported configuration.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool, MLATokenToKVPool

from hpc_advise import rules
from hpc_advise.kernels.decode_attention import op as decode_op
from hpc_advise.runtime import dispatch

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

NAME = "hpc_advise"
_KV_DTYPES = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8_e4m3"}


class HpcAdviseBackendError(ValueError):
    """The hpc_advise attention backend cannot serve this configuration (the message says why)."""


def _fail(reason: str) -> None:
    raise HpcAdviseBackendError(
        f"attention backend {NAME!r}: {reason}. Use another --decode-attention-backend "
        f"(`hpc-advise runtime check --model ...` shows what runs where)."
    )


def _device_sm(device: str) -> tuple[tuple[int, int] | None, bool]:
    """(compute capability or None, whether the Triton interpreter runs the kernel on CPU)."""
    if str(device).startswith("cuda"):
        return tuple(torch.cuda.get_device_capability()), False
    return None, os.environ.get("TRITON_INTERPRET") == "1"


def heads_per_rank(model_runner) -> tuple[int, int]:
    """(query heads, KV heads) of one attention-TP rank, as SGLang's own backends compute them."""
    from sglang.srt.runtime_context import get_parallel

    tp = get_parallel().attn_tp_size
    cfg = model_runner.model_config
    return cfg.num_attention_heads // tp, cfg.get_num_kv_heads(tp)


def _dcp_size() -> int:
    from sglang.srt.runtime_context import get_parallel

    try:
        return int(get_parallel().attn_dcp_size)
    except RuntimeError:  # no published parallel config (unit tests set only attn_tp_size): no DCP
        return 1


def _is_dsa(cfg) -> bool:
    """Whether SGLang serves this model with DSA (sparse MLA with an indexer, DeepSeek-V3.2 / GLM-5)."""
    hf = getattr(cfg, "hf_config", None)
    if hf is None:
        return False
    from sglang.srt.configs.model_config import is_deepseek_dsa

    return bool(is_deepseek_dsa(hf))


def runtime_conditions(model_runner) -> rules.Conditions:
    """The dispatch conditions of a live SGLang model runner."""
    cfg = model_runner.model_config
    q_heads, kv_heads = heads_per_rank(model_runner)
    sm, interp = _device_sm(model_runner.device)
    mla = bool(getattr(model_runner, "use_mla_backend", False))
    return rules.Conditions(
        model=str(getattr(cfg, "model_path", "model")),
        gpu=None,
        sm=sm,
        attention="mla" if mla else "gqa",
        head_dim=int(cfg.head_dim),
        q_heads=q_heads,
        kv_heads=kv_heads,
        kv_dtype=_KV_DTYPES.get(model_runner.kv_cache_dtype, str(model_runner.kv_cache_dtype)),
        page_size=int(model_runner.page_size),
        sliding_window=False,  # checked per layer (RadixAttention.sliding_window_size)
        linear_attention=False,  # any other pool than MHATokenToKVPool is refused by the backend itself
        attention_sinks=False,  # checked per layer by the model: sinks are passed as kwargs
        is_moe=False,
        quantization="bf16",
        num_experts=0,
        hidden_size=0,
        moe_inter=0,
        router_dtype="bf16",
        router_family=None,
        router_opt_in=False,
        interpreter=interp,
        kv_lora_rank=int(getattr(cfg, "kv_lora_rank", 0) or 0) if mla else 0,
        rope_dim=int(getattr(cfg, "qk_rope_head_dim", 0) or 0) if mla else 0,
        sparse_attention=mla and _is_dsa(cfg),
    )


class HpcAdviseAttnBackend(AttentionBackend):
    """Decode-only paged attention on our Triton kernel (see module docstring)."""

    needs_cpu_seq_lens = False  # the page table and plan are built on the device from seq_lens

    def __init__(self, model_runner):
        super().__init__()
        prefill = getattr(model_runner, "prefill_attention_backend_str", None)
        if prefill == NAME:
            _fail(
                "it is a decode-only backend; select it with --decode-attention-backend hpc_advise and keep "
                "a prefill backend (--prefill-attention-backend, default fa3 on SM90)"
            )
        spec = getattr(model_runner, "spec_algorithm", None)
        if spec is not None and spec.is_speculative():
            _fail("speculative decoding (target verify) is not supported")
        pool = model_runner.token_to_kv_pool
        self.mla = bool(getattr(model_runner, "use_mla_backend", False))
        # subclasses change the layout: page-major, fp4, mxfp8, ... (MHA); DSA, fp4 latent rows (MLA)
        if self.mla and type(pool) is not MLATokenToKVPool:
            _fail(
                f"KV pool {type(pool).__name__} is not SGLang's plain MLATokenToKVPool (DSA, fp4 and "
                "unified MLA pools are not supported)"
            )
        if not self.mla and type(pool) is not MHATokenToKVPool:
            _fail(
                f"KV pool {type(pool).__name__} is not SGLang's plain MHATokenToKVPool (SWA, hybrid, "
                "page-major and quantized pools are not supported)"
            )
        if _dcp_size() > 1:
            _fail("decode context parallelism (--dcp-size > 1) is not supported")
        if getattr(pool, "kv_cache_layout", "nhd") != "nhd":
            _fail(f"KV layout {pool.kv_cache_layout!r}: the kernel reads the token-major NHD layout")
        if getattr(pool, "is_quantized_kv_cache", False):
            _fail("quantized (fp4/mxfp8) KV pools are not supported; use bf16 or fp8_e4m3 KV")
        decision = dispatch.decide("decode_attention", runtime_conditions(model_runner))
        if not decision.use_ours:
            _fail(decision.reason)
        self.q_heads, self.kv_heads = heads_per_rank(model_runner)
        if self.mla:
            self._check_mla_pool(pool, model_runner.model_config)
        elif pool.head_num != self.kv_heads or pool.head_dim != model_runner.model_config.head_dim:
            _fail(
                f"KV pool holds {pool.head_num} heads x {pool.head_dim}, the model expects "
                f"{self.kv_heads} x {model_runner.model_config.head_dim} per rank"
            )
        if int(model_runner.model_config.context_len) > decode_op.MAX_SEQ_LEN:
            _fail(
                f"context length {model_runner.model_config.context_len} exceeds the kernel's "
                f"{decode_op.MAX_SEQ_LEN}; pass --context-length {decode_op.MAX_SEQ_LEN}"
            )
        self.device = model_runner.device
        self.page_size = int(model_runner.page_size)
        # GQA: the head dim of K and V; MLA: the width of the latent + rope row (q's and the pool's)
        self.head_dim = self.kv_lora_rank + self.rope_dim if self.mla else int(pool.head_dim)
        self.token_to_kv_pool = pool
        # the pool aliases SGLang's own backends carry, read by its wrappers (TboAttnBackend) and the
        # forward-context accessors (get_req_to_token_pool)
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.kv_index_translator = getattr(model_runner, "kv_index_translator", None)
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.max_context_len = int(model_runner.model_config.context_len)
        self.max_pages = -(-min(self.max_context_len, self.req_to_token.shape[1]) // self.page_size)
        # Token-slot column of each page's first token in req_to_token (static: graph-capturable gather).
        self._page_cols = torch.arange(self.max_pages, device=self.device, dtype=torch.int64) * self.page_size
        self._ones = torch.ones(1, dtype=torch.float32, device=self.device)
        # One plan holds at most the kernel's MAX_BATCH requests; larger eager batches are planned and run
        # in chunks of this size (CUDA-graph batches must fit one plan).
        self.max_plan_batch = decode_op.MAX_BATCH
        self._eager_plans: list[decode_op.DecodePlan] = []
        self._graph_plan: decode_op.DecodePlan | None = None
        self._graph_seq_lens: torch.Tensor | None = None
        self._checked_layers: set[int] = set()
        self.forward_metadata = None
        if torch.device(self.device).type == "cuda":
            self._compile_planners()

    def _compile_planners(self) -> None:
        """Compile the planner for every eager plan size this server can reach (its running-request
        limit), before serving: compiled on the first batch of each size instead, it stalls the engine
        ~2 s each time. Throw-away one-page plans: the planner does not depend on the page table's width."""
        reachable = min(self.max_plan_batch, int(self.req_to_token.shape[0]))
        size = self._eager_plan_size(1)
        while True:
            self._new_plan(size, max_pages=1)
            if size >= self._eager_plan_size(reachable):
                break
            size = self._eager_plan_size(size + 1)

    def _eager_plan_size(self, batch: int) -> int:
        """Eager plans are sized by the planner's batch bucket: one plan and one compile per bucket."""
        return min(self.max_plan_batch, decode_op.batch_bucket(batch))

    def _check_mla_pool(self, pool, cfg) -> None:
        """The MLA pool's row as the model's config and the kernel's MLA form have it; sets the MLA
        geometry (one latent row per token: a single KV head)."""
        self.kv_lora_rank, self.rope_dim = int(pool.kv_lora_rank), int(pool.qk_rope_head_dim)
        want = (int(getattr(cfg, "kv_lora_rank", 0) or 0), int(getattr(cfg, "qk_rope_head_dim", 0) or 0))
        if (self.kv_lora_rank, self.rope_dim) != want:
            _fail(
                f"MLA pool rows hold latent {self.kv_lora_rank} + rope {self.rope_dim}, the model's config "
                f"{want[0]} + {want[1]}"
            )
        if int(pool.kv_cache_dim) != self.kv_lora_rank + self.rope_dim:
            _fail(f"MLA pool rows are {pool.kv_cache_dim} wide, not latent + rope (a packed fp8 layout)")
        self.kv_heads = 1

    # --- metadata -------------------------------------------------------------------------------
    def _fill_page_table(self, dst: torch.Tensor, req_pool_indices: torch.Tensor) -> None:
        """dst[b, j] = page id of request b's j-th page (garbage past its length; never read)."""
        rows = req_pool_indices.to(torch.int64)[:, None]
        slots = self.req_to_token[rows, self._page_cols[None, :]]
        torch.floor_divide(slots, self.page_size, out=dst)

    def _new_plan(self, max_batch: int, max_pages: int | None = None) -> decode_op.DecodePlan:
        if max_batch > decode_op.MAX_BATCH:
            _fail(
                f"batch {max_batch} exceeds the kernel's {decode_op.MAX_BATCH}; lower --cuda-graph-max-bs / "
                "--max-running-requests"
            )
        ones = torch.ones(1, dtype=torch.int32, device=self.device)
        max_pages = max_pages or self.max_pages
        table = torch.zeros(1, max_pages, dtype=torch.int32, device=self.device)
        common = dict(
            page_size=self.page_size,
            max_batch=max_batch,
            max_pages=max_pages,
            kv_dtype=getattr(self.token_to_kv_pool, "dtype", None),
            validate=False,
        )
        if self.mla:
            mla = dict(num_heads=self.q_heads, kv_lora_rank=self.kv_lora_rank, rope_dim=self.rope_dim)
            return decode_op.plan_mla(ones, table, **mla, **common)
        gqa = dict(num_q_heads=self.q_heads, num_kv_heads=self.kv_heads, head_dim=self.head_dim)
        return decode_op.plan(ones, table, **gqa, **common)

    def _replan(
        self, plan: decode_op.DecodePlan, seq_lens: torch.Tensor, req_pool_indices: torch.Tensor, bs: int
    ) -> decode_op.DecodePlan:
        table = plan.page_table[:bs]
        self._fill_page_table(table, req_pool_indices[:bs])
        return plan.update(seq_lens[:bs], table, validate=False)

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        mode = forward_batch.forward_mode
        if mode.is_idle():
            self.forward_metadata = None
            return
        if not mode.is_decode():
            _fail(f"forward mode {mode.name} reached the decode-only backend")
        bs = forward_batch.batch_size
        seq_lens = forward_batch.seq_lens.to(torch.int32)
        segments = []
        for i, start in enumerate(range(0, bs, self.max_plan_batch)):
            end = min(bs, start + self.max_plan_batch)
            if i == len(self._eager_plans) or self._eager_plans[i].max_batch < end - start:
                plan = self._new_plan(self._eager_plan_size(end - start))
                self._eager_plans[i : i + 1] = [plan]
            plan = self._replan(
                self._eager_plans[i],
                seq_lens[start:end],
                forward_batch.req_pool_indices[start:end],
                end - start,
            )
            segments.append((start, end, plan))
        self.forward_metadata = segments

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        self._graph_plan = self._new_plan(max_bs)
        self._graph_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=self.device)

    def init_forward_metadata_out_graph(self, forward_batch: ForwardBatch, in_capture: bool = False):
        mode = forward_batch.forward_mode
        if not mode.is_decode_or_idle():
            _fail(f"CUDA graphs of forward mode {mode.name} are not supported")
        if self._graph_plan is None:
            _fail("CUDA-graph metadata requested before init_cuda_graph_state")
        self.forward_metadata = [(0, forward_batch.batch_size, self._graph_plan)]

    def init_forward_metadata_in_graph(self, forward_batch: ForwardBatch):
        bs = forward_batch.batch_size
        self._graph_seq_lens[:bs].copy_(forward_batch.seq_lens[:bs])
        plan = self._replan(self._graph_plan, self._graph_seq_lens, forward_batch.req_pool_indices, bs)
        self.forward_metadata = [(0, bs, plan)]

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1  # padded rows attend one token (the kernel needs lengths >= 1)

    # --- forward --------------------------------------------------------------------------------
    def _check_layer(self, layer: RadixAttention) -> None:
        if layer.layer_id in self._checked_layers:
            return
        if layer.is_cross_attention:
            _fail(f"layer {layer.layer_id} is cross-attention")
        if layer.sliding_window_size is not None and layer.sliding_window_size > -1:
            _fail(f"layer {layer.layer_id} has a sliding window ({layer.sliding_window_size})")
        if layer.logit_cap and layer.logit_cap > 0:
            _fail(f"layer {layer.layer_id} has a logit cap ({layer.logit_cap})")
        if self.mla:
            self._check_mla_layer(layer)
        elif not layer.qk_head_dim == layer.v_head_dim == self.head_dim:
            _fail(
                f"layer {layer.layer_id}: qk/v head dims {layer.qk_head_dim}/{layer.v_head_dim}, "
                f"pool {self.head_dim}"
            )
        if (layer.tp_q_head_num, layer.tp_k_head_num) != (self.q_heads, self.kv_heads):
            _fail(
                f"layer {layer.layer_id} has {layer.tp_q_head_num}/{layer.tp_k_head_num} heads, "
                f"planned for {self.q_heads}/{self.kv_heads}"
            )
        self._checked_layers.add(layer.layer_id)

    def _check_mla_layer(self, layer: RadixAttention) -> None:
        if (layer.qk_head_dim, layer.v_head_dim) != (self.head_dim, self.kv_lora_rank):
            _fail(
                f"layer {layer.layer_id}: MLA qk/v head dims {layer.qk_head_dim}/{layer.v_head_dim}, "
                f"the pool's row {self.head_dim} (latent {self.kv_lora_rank})"
            )
        # SGLang's triton MLA path stores k / k_scale and descales in its kernel; ours has no scale, so
        # only unit scales (bf16 KV without checkpoint KV scales) are exact
        for name in ("k_scale_float", "v_scale_float"):
            value = getattr(layer, name, None)
            if value is not None and float(value) != 1.0:
                kind = name.split("_")[0]
                _fail(f"layer {layer.layer_id} has KV scale {kind} = {value}: MLA runs unscaled")

    def _scale(self, s) -> torch.Tensor | float:
        if s is None:
            return 1.0
        if isinstance(s, torch.Tensor):
            return s.reshape(1).to(torch.float32)
        return float(s)

    def forward_decode(
        self,
        q,
        k,
        v,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        **kwargs,
    ):
        if kwargs.get("sinks") is not None:
            _fail(f"layer {layer.layer_id} passes attention sinks")
        if self.mla:
            return self._forward_decode_mla(q, k, v, layer, forward_batch, save_kv_cache, kwargs)
        self._check_layer(layer)
        if save_kv_cache and k is not None:
            self.token_to_kv_pool.set_kv_buffer(
                layer, KVWriteLoc(forward_batch.out_cache_loc), k, v, layer.k_scale, layer.v_scale
            )
        k_buf, v_buf = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        shape = (-1, self.page_size, self.kv_heads, self.head_dim)
        k_cache, v_cache = k_buf.view(shape), v_buf.view(shape)
        q3 = q.reshape(-1, self.q_heads, self.head_dim)
        kw = dict(
            k_scale=self._scale(layer.k_scale), v_scale=self._scale(layer.v_scale), sm_scale=layer.scaling
        )
        segments = self.forward_metadata
        if len(segments) == 1:
            out = decode_op.run(segments[0][2], q3, k_cache, v_cache, **kw)
        else:
            out = torch.empty_like(q3)
            for start, end, plan in segments:
                decode_op.run(plan, q3[start:end], k_cache, v_cache, out=out[start:end], **kw)
        return out.view(-1, self.q_heads * self.head_dim)

    # What the model passes on the paths of other MLA backends (FORWARD_ABSORB_CORE_ATTENTION_BACKENDS:
    # the rope part split off, fused rope, sparse indices); none of it reaches a triton-like backend.
    _MLA_FOREIGN_KWARGS = ("q_rope", "k_rope", "cos_sin_cache", "topk_indices", "attn_sink")

    def _forward_decode_mla(self, q, k, v, layer, forward_batch, save_kv_cache, kwargs):
        """SGLang's triton MLA decode, on our kernel: store k's latent + rope row, attend over the pool."""
        passed = [name for name in self._MLA_FOREIGN_KWARGS if kwargs.get(name) is not None]
        if passed:
            _fail(
                f"layer {layer.layer_id} passes {', '.join(passed)}: the MLA path takes the concatenated "
                "q / k that SGLang's DeepseekV2 model passes to triton-like backends"
            )
        self._check_layer(layer)
        if save_kv_cache and k is not None:
            # v is the latent part of k's row: the pool stores the one row
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k, v)
        kv_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id).view(
            -1, self.page_size, 1, self.head_dim
        )
        q3 = q.reshape(-1, self.q_heads, self.head_dim)
        segments = self.forward_metadata
        if len(segments) == 1:
            out = decode_op.run_mla(segments[0][2], q3, kv_cache, sm_scale=layer.scaling)
        else:
            out = q3.new_empty(q3.shape[0], self.q_heads, self.kv_lora_rank)
            for start, end, plan in segments:
                decode_op.run_mla(plan, q3[start:end], kv_cache, sm_scale=layer.scaling, out=out[start:end])
        return out.view(-1, self.q_heads * self.kv_lora_rank)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        _fail(
            "extend/prefill reached the decode-only backend; keep a prefill backend "
            "(--prefill-attention-backend) and use --decode-attention-backend hpc_advise"
        )
