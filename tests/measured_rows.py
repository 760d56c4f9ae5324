"""Rows in the shipped tables' schema for tests of the MoE hand-off and the layer-step models: a
``layer_step`` row as benchmarks/bench_layer.py's ``collect`` writes it, and a fused_moe kernel row as
benchmarks/bench_fused_moe.py writes it (only the fields the readers use)."""

from __future__ import annotations

RUN = "2026-12-01T22:53:38+00:00"


def layer_row(attn: str, moe: str, mix: str, batch: int, p50: float, *, subject: str = "hy3-tp8-rank",
              layers: int = 4, context: float = 2049.0, tp: int = 8, command: str = "bench_layer",
              router: str = "sglang", moe_paths: list[str] | None = None) -> dict:  # fmt: skip
    kv_bytes = layers * batch * context * 2 * 128 * 2  # one KV head of 128 per rank, bf16
    row = {
        "kind": "layer_step", "subject": subject, "unit": "us",
        "provider": f"attn={attn},moe={moe}" + ("" if router == "sglang" else f",router={router}"),
        "p20": p50 * 0.99, "p50": p50, "p80": p50 * 1.01, "created_at": RUN, "command": command,
        "config": {
            "attention": attn, "moe_runner": moe, "mix": mix, "batch": batch, "layers": layers,
            "context_mean": context, "kv_bytes": kv_bytes, "copy_tbps": 4.2, "kv_cache_dtype": "auto",
            "page_size": 64, "tp_shard": tp, "router": router, "quantization": "fp8 experts per-tensor (online), bf16 linears",
        },
    }  # fmt: skip
    if moe_paths is not None:
        row["config"]["moe_paths"] = moe_paths
    return row


def kernel_row(provider: str, tokens: int, p50: float, *, shape=(192, 4096, 192, 8), mode="tensor-static") -> dict:
    e, h, i, k = shape
    return {
        "kind": "kernel", "subject": "fused_moe", "provider": provider, "unit": "us", "p50": p50,
        "created_at": RUN, "command": "bench_fused_moe",
        "config": {"E": e, "H": h, "I": i, "top_k": k, "T": tokens, "mode": mode, "shape": "hy3-tp8"},
    }  # fmt: skip
