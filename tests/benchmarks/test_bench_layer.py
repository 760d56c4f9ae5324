"""CPU checks of benchmarks/bench_layer.py's pure parts: one rank's shapes, the context mixes, the byte
count behind the bandwidth floor, and the table from rows (no GPU, no SGLang needed)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from tests.benchmarks.helpers import load_script

bl = load_script("bench_layer")


def test_shard_config_hy3_tp8():
    cfg = bl.shard_config("hy3", 4)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (8, 1, 128)
    assert cfg["moe_intermediate_size"] == 1536 // 8 and cfg["num_experts"] == 192
    assert cfg["num_hidden_layers"] == 4 and cfg["first_k_dense_replace"] == 0
    assert cfg["hidden_size"] == 4096 and cfg["vocab_size"] == bl.VOCAB


def test_shard_config_qwen3_tp4_keeps_one_kv_head():
    cfg = bl.shard_config("qwen3-235b", 2)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (16, 1)
    assert cfg["moe_intermediate_size"] == 384 and cfg["num_experts"] == 128


def test_mixes():
    assert bl.draw_lengths("uniform-2k", 5, 1) == [2048] * 5
    mixed = bl.draw_lengths("mixed-1k-32k", 2000, 3)
    assert 1024 <= min(mixed) and max(mixed) <= bl.MAX_CONTEXT
    # log-uniform: the median sits near the geometric mean of the ends
    assert abs(math.log(statistics.median(mixed)) - math.log(math.sqrt(1024 * bl.MAX_CONTEXT))) < 0.2
    agentic = bl.draw_lengths("agentic", 2000, 3)
    assert 15000 < statistics.mean(agentic) < 25000 and max(agentic) <= bl.MAX_CONTEXT
    assert bl.draw_lengths("agentic", 8, 3) == bl.draw_lengths("agentic", 8, 3)
    with pytest.raises(ValueError):
        bl.draw_lengths("nope", 1, 1)


@pytest.mark.parametrize("length", [65, 128, 129, 2048, 2049, 32768])
def test_split_prefix_leaves_1_to_64_tokens(length):
    prefix = bl.split_prefix(length)
    assert prefix % bl.PAGE == 0 and 1 <= length - prefix <= bl.PAGE


def test_step_bytes_counts_kv_and_touched_experts():
    cfg = bl.shard_config("hy3", 1)
    one = bl.step_bytes(cfg, 2, [1000])
    # one token touches top-k = 8 experts: 8 x 3 x 4096 x 192 fp8 bytes, plus the KV it reads
    assert one["kv_bytes"] == 1000 * 2 * 128 * 2
    assert one["weight_bytes"] > 8 * 3 * 4096 * 192
    big = bl.step_bytes(cfg, 2, [1000] * 256)
    assert big["weight_bytes"] - one["weight_bytes"] == pytest.approx(
        (bl.expected_distinct_experts(192, 8, 256) - 8) * 3 * 4096 * 192 + 255 * 4096 * 2, rel=1e-6
    )
    assert bl.expected_distinct_experts(192, 8, 1) == pytest.approx(8)


def test_table_from_rows(tmp_path, capsys):
    row = {
        "kind": "layer_step", "subject": "hy3-tp8-rank", "provider": "attn=triton,moe=triton", "p50": 100.0,
        "created_at": "t", "command": "c", "versions": {"gpu": "NVIDIA H200"},
        "config": {"mix": "agentic", "batch": 8, "context_mean": 2e4, "floor_us": 50.0, "ratio_to_floor": 2.0,
                   "default_over_this": 1.0, "max_rel_err_vs_ref": 1e-3, "forward_us": 300.0, "layers": 4,
                   "tp_shard": 8, "kv_cache_dtype": "auto", "page_size": 64, "quantization": "q", "copy_tbps": 4.2},
    }  # fmt: skip
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert bl.main(["--table", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "| attn=triton,moe=triton | agentic | 8 | 20000 | 100.0 | 50.0 | 2.00 | 1.000 | 1.00e-03 | 300 |"
        in out
    )


def test_bad_input_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        bl.main(["--table", "/nonexistent.jsonl"])
    assert e.value.code != 0
    assert "no such file" in capsys.readouterr().err
