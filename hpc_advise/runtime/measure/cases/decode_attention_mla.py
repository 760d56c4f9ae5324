"""Workloads of the MLA form of paged decode attention (op.plan_mla / op.run_mla) and its launch sweep.

One case = lengths of a decode batch at DeepSeek-V3's latent geometry (512 + 64 bf16 columns per token, one row
for all heads), a pool far over L2 with R rotations of scattered page tables, q for H heads. Our calls are
timed as CUDA-graph replays of the rotated calls (harness.time_cuda), each output checked against the float64
reference on rotation 0. ``tune_decode_attention.py --form mla`` runs ``sweep``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hpc_advise.runtime.measure.cases.decode_attention import (
    MAX_ROTATIONS,
    ROTATE_BYTES,
    case_lengths,
    rotated_page_tables,
)
from hpc_advise.runtime.measure.harness import rotating, run_row, time_cuda

PAGE = 64
LORA, ROPE = 512, 64
ROW_BYTES = (LORA + ROPE) * 2
TOL = 5e-3  # tests/kernels/decode_attention/helpers.py: bf16 KV
SM_SCALE = 1.0 / math.sqrt(192)
# name -> (count, length) runs; length -1: log-uniform over 1K-32K (case_lengths, fixed seed)
CASES = {
    "1 x 2K": [(1, 2048)],
    "32 x 2K": [(32, 2048)],
    "128 x 2K": [(128, 2048)],
    "1 x 32K": [(1, 32768)],
    "8 x 1K-32K": [(8, -1)],
    "64 x 1K-32K": [(64, -1)],
    "128 x 20K": [(128, 20480)],
    "16 x 16K + 48 x 1K": [(16, 16384), (48, 1024)],
}


class MlaWorkload:
    """A latent pool [pages, PAGE, 1, 576] bf16, R rotations of page tables, q [B, H, 576]."""

    def __init__(self, lens: list[int], heads: int, seed: int = 0):
        import torch

        self.lens, self.heads = lens, heads
        self.kv_bytes = sum(lens) * ROW_BYTES
        self.rotations = max(1, min(MAX_ROTATIONS, math.ceil(ROTATE_BYTES / self.kv_bytes)))
        gen = torch.Generator(device="cuda").manual_seed(seed)
        need = [math.ceil(n / PAGE) for n in lens]
        pool_pages = sum(need) * self.rotations + 16
        self.kv = torch.randn(pool_pages, PAGE, 1, LORA + ROPE, device="cuda", generator=gen).bfloat16()
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        self.tables, _ = rotated_page_tables(need, pool_pages, self.rotations, gen)
        self.q = torch.randn(len(lens), heads, LORA + ROPE, device="cuda", generator=gen).bfloat16()

    def floor_us(self, copy_tbps: float) -> float:
        return self.kv_bytes / (copy_tbps * 1e12) * 1e6


def ours(w: MlaWorkload, config=None):
    """(calls, plans, outs): one plan and call per rotation."""
    from hpc_advise.kernels.decode_attention import op

    plans = [op.plan_mla(w.seq_lens, t, page_size=PAGE, num_heads=w.heads, config=config) for t in w.tables]
    outs = [w.q.new_empty(len(w.lens), w.heads, LORA) for _ in plans]
    calls = [
        lambda p=p, o=o: op.run_mla(p, w.q, w.kv, sm_scale=SM_SCALE, out=o)
        for p, o in zip(plans, outs, strict=True)
    ]
    return calls, plans, outs


def error(w: MlaWorkload, out) -> float:
    from hpc_advise.kernels.decode_attention.reference import mla_decode_reference

    ref = mla_decode_reference(
        w.q, w.kv, w.tables[0], w.seq_lens, page_size=PAGE, kv_lora_rank=LORA, sm_scale=SM_SCALE
    )
    return ((out.double() - ref).norm() / ref.norm()).item()


def sweep(case_names: list[str], variants: list[dict], heads: int = 16, copy_tbps: float | None = None):
    """Per case: the tuned config, each variant (Config fields replaced), the tuned config again. Returns
    (rows, table lines)."""
    from hpc_advise.kernels.decode_attention import op

    tuned = op.tuned_mla_config(None)
    rows, table = [], []
    for name in case_names:
        w = MlaWorkload(case_lengths_of(name), heads)
        runs = [("tuned", {})] + [(str(v), v) for v in variants] + [("tuned again", {})]
        for label, keys in runs:
            cfg = replace(tuned, **keys)
            calls, _, outs = ours(w, cfg)
            t = time_cuda(rotating(calls, lambda c: c()), graph=True, inner=len(calls) * 2, reps=20)
            err = error(w, outs[0])
            tbps = w.kv_bytes / (t.p50 * 1e-6) / 1e12
            extra = {"case": name, "heads": heads, "label": label, "err": err, "tbps": tbps}
            rows.append(
                run_row(
                    kind="kernel_tune",
                    subject="decode_attention_mla",
                    provider="hpc_advise",
                    config={**cfg.to_dict(), "stages": op.mla_num_stages(cfg)},
                    metric="latency",
                    unit="us",
                    timing=t,
                    extra=extra,
                )
            )
            floor = f"{w.floor_us(copy_tbps):.1f}" if copy_tbps else "-"
            fail = "FAIL" if err > TOL else ""
            table.append([name, label, round(t.p50, 1), floor, round(tbps, 2), f"{err:.1e}", fail])
            print(table[-1], flush=True)
    return rows, table


def case_lengths_of(name: str) -> list[int]:
    """Lengths of an MLA case (log-uniform runs drawn as the GQA cases' are)."""
    if name not in CASES:
        raise ValueError(f"unknown MLA case {name!r} (known: {', '.join(CASES)})")
    return case_lengths(name, cases=CASES)
