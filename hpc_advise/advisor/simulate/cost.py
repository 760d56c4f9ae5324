"""Step cost: what one forward pass of an SGLang replica costs, as the simulator asks for it.

The simulator knows nothing about GPUs. Each batch it runs is described by token counts and handed to a
``StepCost``; the fitted serving model (roofline terms, kernel models, communication) implements it.
``LinearStepCost`` is the analytic reference used by the tests: a few coefficients, every term visible.

A prefill (extend) batch is described by ``PrefillShape``: ``new_tokens`` (tokens computed this pass,
summed over the batch), ``context_tokens`` (tokens already in the KV cache that those tokens attend to:
cached prefixes and earlier chunks), ``n_seqs`` and ``attention_pairs`` (query-key pairs of causal
attention, sum over sequences of ``extend * (prefix + (extend + 1) / 2)``), enough for a roofline of
the GEMMs (``new_tokens``), the attention FLOPs (``attention_pairs``) and the KV reads
(``context_tokens``). A mixed batch (``--enable-mixed-chunk``) is one extend pass in SGLang: each
decoding request enters it as one new token over its context, and the simulator describes it so.
A decode batch is ``batch_size`` sequences over ``context_tokens`` KV tokens in all.

A cost may also offer ``decode_run_s(batch_size, context_tokens, k)``: the times of ``k`` decode
steps of one unchanged batch, step ``j`` over ``context_tokens + batch_size * j`` tokens (each step
adds one token per sequence), as an array. The simulator then runs a stretch of decode steps in which
nothing else can happen as one numpy call instead of ``k`` Python calls; the results are the same up
to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class PrefillShape:
    """One extend pass (see the module docstring for each field)."""

    new_tokens: int
    context_tokens: int
    n_seqs: int
    attention_pairs: float


@runtime_checkable
class StepCost(Protocol):
    """Seconds of one scheduler step (forward pass plus the scheduler's own time per step)."""

    def prefill_s(self, shape: PrefillShape) -> float: ...

    def decode_s(self, batch_size: int, context_tokens: int) -> float: ...


@dataclass(frozen=True)
class LinearStepCost:
    """Reference cost, linear in every term (seconds):

    prefill = prefill_fixed_s + per_token_s * new_tokens + per_pair_s * attention_pairs
              + per_context_token_s * context_tokens
    decode  = decode_fixed_s + per_seq_s * batch_size + per_kv_token_s * context_tokens
    """

    prefill_fixed_s: float = 0.0
    per_token_s: float = 0.0
    per_pair_s: float = 0.0
    per_context_token_s: float = 0.0
    decode_fixed_s: float = 0.0
    per_seq_s: float = 0.0
    per_kv_token_s: float = 0.0

    def prefill_s(self, shape: PrefillShape) -> float:
        return (
            self.prefill_fixed_s
            + self.per_token_s * shape.new_tokens
            + self.per_pair_s * shape.attention_pairs
            + self.per_context_token_s * shape.context_tokens
        )

    def decode_s(self, batch_size: int, context_tokens: int) -> float:
        return self.decode_fixed_s + self.per_seq_s * batch_size + self.per_kv_token_s * context_tokens

    def decode_run_s(self, batch_size: int, context_tokens: int, k: int) -> np.ndarray:
        ctx = context_tokens + batch_size * np.arange(k, dtype=np.float64)
        return self.decode_fixed_s + self.per_seq_s * batch_size + self.per_kv_token_s * ctx
