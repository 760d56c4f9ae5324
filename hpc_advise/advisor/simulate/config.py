"""The SGLang server arguments the simulated scheduler obeys, with SGLang 0.5.23's defaults.

From ``sglang/srt/server_args.py`` (``_handle_gpu_memory_settings``): ``chunked_prefill_size`` by GPU
memory (H100 80 GB and H200 141 GB: 8192; >= 160 GB: 16384); the KV pool itself (``max_total_tokens``)
is sized by ``rules.kv_pool_tokens`` from ``rules.static_memory_fraction``; ``max_prefill_tokens``
16384; ``schedule_conservativeness`` 1.0; ``page_size`` 1; ``schedule_policy`` "fcfs"; mixed chunk off.
From ``sglang/srt/environ.py``: the new-token-ratio constants (0.7 initial, x 0.14 minimum, 600 decay
steps), ``SGLANG_RETRACT_DECODE_STEPS`` 20, ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` 4096. From the
model runner: ``max_running_requests`` defaults to min(KV pool // 2, the request-slot pool
min(max(pool / context_len * 512, 2048), 4096)).
"""

from __future__ import annotations

from dataclasses import dataclass

_MIB = 1024


def default_chunked_prefill_size(gpu_mem_gib: float) -> int:
    """SGLang's ``chunked_prefill_size`` for a GPU of this memory."""
    mem = gpu_mem_gib * _MIB
    if mem < 35 * _MIB:
        return 2048
    if mem < 60 * _MIB:
        return 4096
    if mem < 160 * _MIB:
        return 8192
    return 16384


def default_max_running_requests(max_total_tokens: int, context_len: int) -> int:
    """min(pool // 2, request-slot pool), as the model runner sizes them."""
    slots = min(max(int(max_total_tokens / context_len * 512), 2048), 4096)
    return max(1, min(max_total_tokens // 2, slots))


@dataclass(frozen=True)
class SchedulerConfig:
    """One replica's scheduler. ``max_total_tokens`` is the KV pool in tokens (what SGLang logs as
    ``max_total_num_tokens``: the pages memory leaves after weights, times the page size)."""

    max_total_tokens: int
    chunked_prefill_size: int | None = 8192  # None: chunked prefill off
    max_prefill_tokens: int = 16384
    max_running_requests: int | None = None  # None: SGLang's default from the pool
    context_len: int = 131072
    page_size: int = 1
    schedule_conservativeness: float = 1.0
    enable_mixed_chunk: bool = False
    schedule_policy: str = "fcfs"  # "fcfs" or "lpm"
    radix_cache: bool = True  # False: --disable-radix-cache
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    retract_decode_steps: int = 20
    clip_max_new_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.max_total_tokens < 2:
            raise ValueError(f"max_total_tokens must be at least 2, not {self.max_total_tokens}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be at least 1, not {self.page_size}")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size < self.page_size:
            raise ValueError("chunked_prefill_size must hold at least one page")
        if self.schedule_policy not in ("fcfs", "lpm"):
            raise ValueError(f"schedule_policy {self.schedule_policy!r}: known are fcfs, lpm")

    @classmethod
    def for_gpu(cls, gpu_mem_gib: float, max_total_tokens: int, **overrides) -> SchedulerConfig:
        """SGLang's defaults for a GPU of this memory (chunked prefill size)."""
        overrides.setdefault("chunked_prefill_size", default_chunked_prefill_size(gpu_mem_gib))
        return cls(max_total_tokens=max_total_tokens, **overrides)

    @property
    def running_limit(self) -> int:
        if self.max_running_requests is not None:
            return self.max_running_requests
        return default_max_running_requests(self.max_total_tokens, self.context_len)

    @property
    def new_token_ratios(self) -> tuple[float, float, float]:
        """(initial, minimum, decay per decode step)."""
        init = min(self.init_new_token_ratio * self.schedule_conservativeness, 1.0)
        low = min(init * self.min_new_token_ratio_factor, 1.0)
        return init, low, (init - low) / self.new_token_ratio_decay_steps
