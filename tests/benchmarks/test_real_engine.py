"""CPU checks of benchmarks/diagnostics/real_engine.py (the tiny model folder, the scaled trace, the
table) and of sglang_site/sitecustomize.py's MoE patch (on a throw-away module, no SGLang needed)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

DIAG = Path(__file__).resolve().parents[2] / "benchmarks" / "diagnostics"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


re_ = _load(DIAG / "real_engine.py", "real_engine_under_test")


def test_model_folder_loads_with_transformers_and_prompts_are_exact(tmp_path):
    pytest.importorskip("transformers")
    info = re_.make_model(tmp_path / "tiny-qwen3-moe")
    assert info["vocab"] == re_.VOCAB
    cfg = json.loads((tmp_path / "tiny-qwen3-moe" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["vocab_size"] == re_.VOCAB
    from hpc_advise.advisor.bench.prompts import PromptBuilder, load_tokenizer
    from hpc_advise.profiles.resolve import resolve_model

    ids, desc = load_tokenizer(str(tmp_path / "tiny-qwen3-moe"))
    b = PromptBuilder(ids, seed=0, description=desc)
    p = b.prompt(0, 77, [5, 6], 16)
    assert len(p) == 77 and all(len(re_.SPECIALS) <= t < re_.VOCAB for t in p)
    m = resolve_model(str(tmp_path / "tiny-qwen3-moe"))
    assert m.key == "tiny-qwen3-moe" and m.is_moe


def test_trace_is_scaled_and_keeps_the_prefix_blocks(tmp_path):
    src = tmp_path / "src.jsonl"
    src.write_text(
        json.dumps({"timestamp": 1000, "input_length": 1754, "output_length": 53, "hash_ids": [1, 2, 3, 4]}) + "\n"
        + json.dumps({"timestamp": 9000, "input_length": 100, "output_length": 500, "hash_ids": [1]}) + "\n"
    )  # fmt: skip
    out = tmp_path / "t.jsonl"
    info = re_.make_trace(src, out, requests=10, len_div=32, time_div=8.0, max_out=64)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert info["requests"] == 2 and info["span_s"] == pytest.approx(1.0)
    assert rows[0] == {"timestamp": 0.0, "input_length": 54, "output_length": 26, "hash_ids": [1, 2, 3, 4],
                       "block_size": 16}  # fmt: skip
    assert rows[1]["input_length"] == 8 and rows[1]["output_length"] == 64


def test_table_from_a_run(tmp_path):
    ab = {
        "targets": [
            {"role": "candidate", "url": "http://x:30001", "partial": False, "partial_reasons": [],
             "summary": {"completed": 9, "requests": 10, "duration_s": 2.0, "request_throughput": 4.5,
                         "output_throughput": 100.0, "ttft_ms": {"median": 5.0}, "tpot_ms": {"median": 1.25},
                         "failures": {"http_500": 1}}},
        ],
        "ab": [{"metric": "median_tpot_ms", "candidate": 1.25, "baseline": 1.5, "diff": -0.25, "ci": [-0.3, -0.2],
                "verdict": "a_lower"}],
        "consistency": {"prompts": 8, "max_new_tokens": 32, "token_agreement": 0.5, "identical_outputs": 2,
                        "first_divergence_min": 3, "mean_kl": 0.01, "top1_agreement": 0.9},
        "prompt_lengths": "exact", "tokenizer": "tokenizers:x",
    }  # fmt: skip
    (tmp_path / "ab.json").write_text(json.dumps(ab))
    (tmp_path / "server_triton.log").write_text("... Capture cuda graph end. Time elapsed: 3 s\n")
    text = re_.render_table(tmp_path)
    assert "| median_tpot_ms | 1.25 | 1.50 | -0.25 [-0.30, -0.20] | a_lower |" in text
    assert "completed 9/10" in text and "http_500" in text and "token agreement 50.0 %" in text
    assert "server triton: CUDA graphs" in text and "server hpc_advise: no log" in text
    # SGLang 0.5.23's lines (its first device run): the capture names the phase, decode lines say graph or not
    (tmp_path / "server_hpc_advise.log").write_text(
        "[t] Capture target decode CUDA graph end. bs=[1, 2, 4], elapsed=32.39 s, mem usage=0.07 GB\n"
        "[t] Uvicorn running on http://127.0.0.1:30001\n"
        "[t] Decode batch, #running-req: 3, #token: 192, token usage: 0.00, cuda graph: True, gen throughput\n"
        "[t] Decode batch, #running-req: 64, #token: 6336, token usage: 0.05, cuda graph: False, gen throughput\n"
    )
    (tmp_path / "server_triton.log").write_text(
        "x\n=== retry eager ===\n[t] The server is fired up and ready to roll!\n"
    )
    text = re_.render_table(tmp_path)
    assert (
        "server hpc_advise: CUDA graphs (decode bs [1, 2, 4] captured; 1 of 2 logged decode batches replayed"
        in text
    )
    assert "server triton: eager (--disable-cuda-graph)" in text


def test_sitecustomize_sends_the_moe_method_to_forward_cuda(tmp_path, monkeypatch):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "unquant.py").write_text(
        "class UnquantizedFusedMoEMethod:\n"
        "    def forward(self, x):\n        return 'native'\n"
        "    def forward_cuda(self, x):\n        return ('cuda', x)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("HPC_ADVISE_SGLANG_STAND_INS", raising=False)
    site = _load(DIAG / "sglang_site" / "sitecustomize.py", "sitecustomize_under_test")
    monkeypatch.setattr(site, "_MOE_MODULE", "fakepkg.unquant")
    finder = site._PatchAfterExec()
    sys.meta_path.insert(0, finder)
    try:
        import fakepkg.unquant as u

        assert u.UnquantizedFusedMoEMethod().forward(3) == ("cuda", 3)
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("fakepkg.unquant", None)
        sys.modules.pop("fakepkg", None)
