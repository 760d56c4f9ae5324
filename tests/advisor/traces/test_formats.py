"""Each supported trace format: detection from content, the fields read, failures, and the
format-specific rules (BurstGPT's 0-token failures, ShareGPT's token estimate, benchmark outputs)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from hpc_advise.advisor.traces import Request, TraceError, read_trace, summarize
from hpc_advise.advisor.traces import parse as trace_parse
from hpc_advise.advisor.traces.parse import datetime_seconds


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_2023_and_2024(tmp_path):
    path = write(
        tmp_path,
        "AzureLLMInferenceTrace_code.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,4808,10\n"
        "2023-11-16 18:15:50.9951690,3180,8\n"
        "2023-11-16 18:15:51.0000000+00:00,110,27\n",
    )
    reader = read_trace(path)
    reqs = list(reader)
    assert reader.format == "azure"
    assert [(r.input_len, r.output_len) for r in reqs] == [(4808, 10), (3180, 8), (110, 27)]
    assert reqs[1].t - reqs[0].t == pytest.approx(4.314579, abs=1e-6)
    assert reqs[0].t == pytest.approx(1700158546.68059)


def test_datetime_parser():
    assert datetime_seconds("1970-01-01 00:00:01") == 1.0
    assert datetime_seconds("1970-01-01T01:00:00.5+01:00") == 0.5
    assert datetime_seconds("2024-05-10 00:00:00.0093050Z") == pytest.approx(1715299200.009305)
    with pytest.raises(ValueError, match="not a date-time"):
        datetime_seconds("yesterday at noon")
    with pytest.raises(ValueError, match="invalid time of day"):
        datetime_seconds("2024-05-10 25:00:00")


def test_burstgpt_failed_rows_and_extra_columns(tmp_path):
    path = write(
        tmp_path,
        "BurstGPT_1.csv",
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,1,0.9,ChatGPT,472,18,490,Conversation log\n"
        "45,2,1.2,ChatGPT,1087,0,1087,Conversation log\n"
        "118,3,2.0,GPT-4,417,276,693,API log\n",
    )
    reqs = list(read_trace(path))
    assert reqs[1] == Request(45.0, 1087, 0, None, True)
    s = summarize(path)
    assert (s.format, s.n_requests, s.n_failed) == ("burstgpt", 3, 1)
    assert s.isl["max"] == 472 and s.total_input_tokens == 472 + 417  # the failed one is left out
    assert s.duration_s == 113.0


def test_csv_header_missing_column(tmp_path):
    path = write(tmp_path, "x.csv", "Timestamp,Model,Request tokens,Response tokens\n1,a,2,3\n")
    assert read_trace(path).format == "burstgpt"
    path = write(tmp_path, "y.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(TraceError, match="no requests"):
        summarize(path)
    path = write(tmp_path, "z.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1\n")
    with pytest.raises(TraceError, match=r"z\.csv:2: expected 3 CSV fields, got 2"):
        summarize(path)


def test_bailian(tmp_path):
    lines = [
        {
            "chat_id": 159,
            "parent_chat_id": -1,
            "timestamp": 61.114,
            "input_length": 521,
            "output_length": 132,
            "type": "text",
            "turn": 1,
            "hash_ids": [1089, 1090, 1091],
        },
        {
            "chat_id": 160,
            "parent_chat_id": 159,
            "timestamp": 70.5,
            "input_length": 700,
            "output_length": 10,
            "type": "text",
            "turn": 2,
            "hash_ids": [1089, 1090, 1091, 1092],
        },
    ]
    path = write(tmp_path, "qwen_traceA_blksz_16.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    s = summarize(path)
    assert s.format == "bailian" and s.prefix_block_size == 16
    assert s.prefix_reuse == pytest.approx(3 / 7)
    assert s.duration_s == pytest.approx(70.5 - 61.114)


def test_openai_logs_and_batch_output(tmp_path):
    lines = [
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "gpt-4o",
            "choices": [],
            "usage": {
                "prompt_tokens": 1200,
                "completion_tokens": 80,
                "total_tokens": 1280,
                "prompt_tokens_details": {"cached_tokens": 1024},
            },
        },
        {
            "id": "batch_req_2",
            "custom_id": "request-2",
            "response": {
                "status_code": 200,
                "request_id": "r2",
                "body": {
                    "object": "chat.completion",
                    "created": 1700000003,
                    "usage": {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320},
                },
            },
            "error": None,
        },
        {
            "id": "batch_req_3",
            "custom_id": "request-3",
            "response": None,
            "error": {"code": "batch_expired", "message": "expired"},
        },
        {
            "id": "resp_4",
            "object": "response",
            "created_at": 1700000005,
            "usage": {"input_tokens": 50, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 0}},
        },
    ]
    path = write(tmp_path, "log.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    reqs = list(read_trace(path))
    assert read_trace(path).format == "openai"
    assert reqs[0] == Request(1700000000.0, 1200, 80, 1024, False)
    assert reqs[1] == Request(1700000003.0, 300, 20, None, False)
    assert reqs[2].failed and reqs[2].t is None
    assert reqs[3] == Request(1700000005.0, 50, 5, 0, False)
    s = summarize(path)
    assert s.n_failed == 1 and s.cached_fraction == pytest.approx(1024 / 1250)
    bad = write(
        tmp_path, "in.jsonl", json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat"}) + "\n"
    )
    with pytest.raises(TraceError, match=r"in\.jsonl:1: Batch API line without 'response'"):
        summarize(bad)


SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "human", "value": "Write a haiku about GPUs."},
            {"from": "gpt", "value": "Silicon rivers / " * 10},
            {"from": "human", "value": "Another one, shorter."},
            {"from": "gpt", "value": "Warm fans hum."},
        ],
    },
    {"id": "b", "conversations": [{"from": "gpt", "value": "Hello! How can I help?"}]},
    {
        "id": "c",
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "你好"},
            {"from": "gpt", "value": "你好！"},
        ],
    },
]


def _tok(text):
    return -(-len(text.encode()) // 4)


def test_sharegpt_streamed_with_estimate(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_parse, "_CHUNK", 16)  # elements cross many read boundaries
    path = write(tmp_path, "sg.json", json.dumps(SHAREGPT, indent=2, ensure_ascii=False))
    reader = read_trace(path)
    reqs = list(reader)
    assert reader.format == "sharegpt"
    c = SHAREGPT[0]["conversations"]
    first_in, first_out = _tok(c[0]["value"]), _tok(c[1]["value"])
    assert [(r.input_len, r.output_len) for r in reqs] == [
        (first_in, first_out),
        (first_in + first_out + _tok(c[2]["value"]), _tok(c[3]["value"])),
        (_tok("Be brief.") + _tok("你好"), _tok("你好！")),
    ]  # conversation b starts with the assistant: no request
    assert all(r.t is None for r in reqs)
    s = summarize(path)
    assert s.rate_rps is None and any("utf8_bytes / 4" in n for n in s.notes)


def test_sharegpt_errors(tmp_path):
    broken = json.dumps(SHAREGPT, indent=1)[:-40]
    path = write(tmp_path, "cut.json", broken)
    with pytest.raises(TraceError, match=r"cut\.json:\d+: invalid JSON"):
        summarize(path, skip_bad=True)  # cannot resynchronise inside an array: fatal even when skipping
    odd = write(
        tmp_path, "odd.json", json.dumps([SHAREGPT[0], {"id": "x", "conversations": "nope"}], indent=1)
    )
    with pytest.raises(TraceError, match=r"odd\.json:\d+: conversation without a 'conversations' list"):
        summarize(odd)
    assert summarize(odd, skip_bad=True).n_bad == 1


def test_tokenizer_missing_or_unknown_is_a_clear_error(tmp_path):
    path = write(tmp_path, "sg.json", json.dumps(SHAREGPT))
    installed = [m for m in ("transformers", "tokenizers", "tiktoken") if importlib.util.find_spec(m)]
    reason = "cannot load it" if installed else "none of transformers, tokenizers, tiktoken is installed"
    with pytest.raises(TraceError, match=f"--tokenizer no-such/tokenizer-xyz: {reason}"):
        summarize(path, tokenizer="no-such/tokenizer-xyz")


def test_sglang_bench_serving_output(tmp_path):
    run = {
        "backend": "sglang",
        "dataset_name": "random",
        "request_rate": 4.0,
        "duration": 10.0,
        "completed": 3,
        "input_lens": [1024, 900, 1100, 1000],
        "output_lens": [128, 100, 0, 90],
        "ttfts": [0.05, 0.07, 0.0, 0.06],
        "itls": [[0.01, 0.012], [0.011], [], [0.01]],
        "errors": ["", "", "timeout", ""],
    }
    path = write(tmp_path, "sglang_0101_4.jsonl", json.dumps(run) + "\n" + json.dumps(run) + "\n")
    s = summarize(path)
    assert s.format == "sglang-bench"
    assert (s.n_requests, s.n_failed) == (8, 2)
    assert s.duration_s == 20.0 and s.rate_rps == pytest.approx(8 / 20)
    assert s.observed["ttft_ms"]["n"] == 6
    assert s.observed["ttft_ms"]["p50"] == pytest.approx(60.0)
    assert s.observed["tpot_ms"]["p50"] == pytest.approx(11.0)  # per-request mean ITLs: 11, 11, 10 (x2)


def test_vllm_bench_serve_json(tmp_path):
    result = {
        "date": "20250101-120000",
        "backend": "vllm",
        "model_id": "m",
        "tokenizer_id": "m",
        "num_prompts": 2,
        "request_rate": "inf",
        "duration": 4.0,
        "completed": 2,
        "input_lens": [512, 2048],
        "output_lens": [64, 256],
        "ttfts": [0.1, 0.2],
        "itls": [[0.02] * 63, [0.03] * 255],
        "generated_texts": ["", ""],
        "errors": ["", ""],
    }
    path = write(tmp_path, "vllm-result.json", json.dumps(result, indent=4))
    s = summarize(path)
    assert s.format == "vllm-bench" and s.n_requests == 2
    assert s.isl["max"] == 2048 and s.observed["tpot_ms"]["p99"] == pytest.approx(29.9, abs=0.2)


def test_forced_format_and_detection_table(tmp_path):
    canonical = write(tmp_path, "c.jsonl", '{"t": 0, "in": 3, "out": 4}\n')
    with pytest.raises(TraceError, match=r"c\.jsonl:1: missing field 'timestamp'"):
        summarize(canonical, fmt="mooncake")
    assert summarize(canonical, fmt="canonical").n_requests == 1


def test_sharegpt_with_a_real_local_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok_path = tmp_path / "tokenizer.json"
    tok.save(str(tok_path))
    convo = [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "hello world hello"},
                {"from": "gpt", "value": "world of many words here"},
            ],
        }
    ]
    path = write(tmp_path, "sg.json", json.dumps(convo))
    (req,) = list(read_trace(path, tokenizer=str(tok_path)))
    assert (req.input_len, req.output_len) == (3, 5)  # whitespace words, unknown ones as [UNK]
    assert any(f"tokenizers:{tok_path}" in n for n in summarize(path, tokenizer=str(tok_path)).notes)


@pytest.mark.parametrize(
    "line, reason",
    [
        ("[1]", "expected a JSON object, got list"),
        ("{bad", "invalid JSON"),
        (
            '{"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": ["a"]}',
            "hash_ids holds a non-integer: 'a'",
        ),
        ('{"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": 7}', "hash_ids is not a list"),
        ('{"timestamp": NaN, "input_length": 3, "output_length": 1}', "timestamp is not finite"),
        ('{"timestamp": 1, "input_length": "3x", "output_length": 1}', "input_length is not a number"),
        ('{"timestamp": 1, "output_length": 1}', "missing field 'input_length'"),
    ],
)
def test_mooncake_bad_lines(tmp_path, line, reason):
    good = '{"timestamp": 0, "input_length": 5, "output_length": 3, "hash_ids": [1]}'
    path = write(tmp_path, "m.jsonl", f"{good}\n   \n{line}\n{good}\n")
    with pytest.raises(TraceError) as err:
        summarize(path)
    assert str(err.value).startswith(f"{path}:3: {reason}")
    assert summarize(path, skip_bad=True).n_requests == 2
