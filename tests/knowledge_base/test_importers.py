"""SGLang bench_serving / vLLM bench serve imports: field mapping, FILE:LINE errors, all-or-nothing."""

from __future__ import annotations

import json

import pytest

from hpc_advise.knowledge_base.importers import ImportFailed, launch_command, parse_files
from tests.knowledge_base.conftest import SGLANG_BROKEN, SGLANG_JSONL, VLLM_JSON


def _raw(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_sglang_lines_map_to_serving_rows():
    raw = _raw(SGLANG_JSONL)
    rows = parse_files([SGLANG_JSONL], gpu="NVIDIA H200")
    assert len(rows) == len(raw) == 4
    for i, (row, rec) in enumerate(zip(rows, raw, strict=True), start=1):
        assert row["kind"] == "serving" and row["subject"] == "sglang"
        assert row["metric"] == "output_throughput" and row["unit"] == "tok/s"
        assert row["p50"] == rec["output_throughput"]
        m = row["metrics"]
        assert m["median_ttft_ms"] == rec["median_ttft_ms"] and m["p99_ttft_ms"] == rec["p99_ttft_ms"]
        assert m["median_tpot_ms"] == rec["median_tpot_ms"] and m["p99_tpot_ms"] == rec["p99_tpot_ms"]
        assert m["median_itl_ms"] == rec["median_itl_ms"] and m["p95_itl_ms"] == rec["p95_itl_ms"]
        assert (
            m["median_e2e_latency_ms"] == rec["median_e2e_latency_ms"]
            and m["p90_e2e_latency_ms"] == rec["p90_e2e_latency_ms"]
        )
        assert m["request_throughput"] == rec["request_throughput"]
        assert m["total_throughput"] == rec["total_throughput"]
        assert m["concurrency"] == rec["concurrency"]
        assert row["config"]["max_concurrency"] == rec["max_concurrency"]
        assert row["config"]["request_rate"] == "inf"  # Infinity in the file
        assert row["config"]["model"] == "Qwen/Qwen3-30B-A3B-Instruct-2507"
        assert row["config"]["tp_size"] == 1 and "model_path" not in row["config"]
        assert row["versions"] == {"sglang": "0.5.23"}
        assert row["source"] == f"{SGLANG_JSONL}:{i}"
        assert row["gpu"] == "NVIDIA H200"
        json.dumps(row, allow_nan=False)  # storable as strict JSON
    assert [r["provider"] for r in rows] == ["sglang", "sglang", "hpc_advise-decode", "smoke-details"]
    assert rows[2]["config"]["page_size"] == 64
    assert "--page-size 64" in rows[2]["command"]
    assert rows[3]["config"]["isl"] == 256 and rows[3]["config"]["osl_max"] == 128
    assert len({r["fingerprint"] for r in rows}) == 4


def test_launch_command_from_server_info():
    cmd = launch_command({"model_path": "m", "tp_size": 8, "enable_dp_attention": True, "page_size": 64})
    assert (
        cmd
        == "python -m sglang.launch_server --model-path m --tp-size 8 --enable-dp-attention --page-size 64"
    )
    assert launch_command({"tp_size": 8}) is None


def test_vllm_result_maps_to_a_row():
    raw = json.loads(VLLM_JSON.read_text())
    [row] = parse_files([VLLM_JSON])
    assert row["subject"] == "vllm" and row["provider"] == "vllm"
    assert row["created_at"] == "2026-11-28T21:45:03+00:00"  # from "date": "20261128-214503"
    m = row["metrics"]
    assert m["median_ttft_ms"] == raw["median_ttft_ms"] and m["p99_itl_ms"] == raw["p99_itl_ms"]
    assert m["total_throughput"] == raw["total_token_throughput"]
    assert m["input_throughput"] == pytest.approx(raw["total_input_tokens"] / raw["duration"])
    assert m["failed"] == 0
    assert row["config"]["burstiness"] == 1.0 and row["config"]["num_prompts"] == 200
    assert row["command"] is None


def test_vllm_pretty_printed_and_appended(tmp_path):
    raw = json.loads(VLLM_JSON.read_text())
    pretty = tmp_path / "pretty.json"
    pretty.write_text(
        json.dumps(raw | {"p99.9_ttft_ms": 250.0, "median_e2el_ms": 900.0, "label": "tp1"}, indent=4)
    )
    [row] = parse_files([pretty])
    assert (
        row["metrics"]["p99.9_ttft_ms"] == 250.0
        and row["metrics"]["median_e2e_latency_ms"] == 900.0
        and row["provider"] == "tp1"
    )
    appended = tmp_path / "appended.json"  # vllm bench serve --append-result
    appended.write_text(json.dumps(raw) + "\n" + json.dumps(raw | {"max_concurrency": 32}))
    assert [r["config"]["max_concurrency"] for r in parse_files([appended])] == [16, 32]


def test_half_broken_file_reports_every_bad_line():
    with pytest.raises(ImportFailed) as info:
        parse_files([SGLANG_BROKEN, SGLANG_JSONL])
    errors = info.value.errors
    assert len(errors) == 2
    assert errors[0].startswith(f"{SGLANG_BROKEN}:2: invalid JSON")
    assert errors[1] == f"{SGLANG_BROKEN}:3: sglang.bench_serving result without 'median_ttft_ms'"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"hello": 1}\n', ":1: not an SGLang bench_serving or vLLM bench serve result"),
        ("[1, 2]\n", ":1: expected a JSON object, got list"),
        ("", ":1: no records"),
        ('{"model_id": "m", "duration": -3, "completed": 1, "request_throughput": 1, "output_throughput": 1}',
         ":1: 'duration' must be a non-negative number, got -3"),
        ('{"model_id": "m", "duration": 3, "completed": 1, "request_throughput": "fast", "output_throughput": 1}',
         ":1: 'request_throughput' must be a non-negative number, got 'fast'"),
        ('{\n  "model_id": "m",\n  "duration": 3,\n}', ":4: invalid JSON"),
    ],
)  # fmt: skip
def test_malformed_records(tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(ImportFailed) as info:
        parse_files([bad])
    assert info.value.errors[0].startswith(f"{bad}{message}"), info.value.errors


def test_reimport_is_idempotent(kb):
    rows = parse_files([SGLANG_JSONL, VLLM_JSON])
    ids, new = kb.import_runs(rows)
    assert new == 5 and len(set(ids)) == 5
    again, new2 = kb.import_runs(parse_files([SGLANG_JSONL]))
    assert new2 == 0 and again == ids[:4]
