"""SGLang's own ``DeepseekV2DecoderLayer`` (MLA) decoding through our attention backend on the H200, against
SGLang's Triton MLA decode in the same model runner.

The runner is the layer-step benchmark's (``benchmarks/bench_layer.py``: SGLang's real ``ModelRunner``,
``--load-format dummy`` weights rescaled to unit-variance outputs, the sgl-kernel twins, SGLang's torch norms
and rotary): DeepSeek-V3's TP8 rank shape (16 heads, latent 512 + rope 64) with two dense decoder layers (no
MoE: the attention is what is compared, and no fused-MoE JIT slows the build), bf16 KV, page 64,
``--decode-attention-backend hpc_advise`` beside SGLang's Triton prefill. Prefixes are filled with seeded
values, the last tokens go through SGLang's extend (Triton), then one decode step runs (1) replayed from
SGLang's captured CUDA graph with our backend, (2) eager with our backend, (3) eager with SGLang's
``TritonAttnBackend`` put in the hybrid backend's decode slot. Each layer's ``attn_mqa`` output of (2) and
(3) is compared, and the logits of all three. The runner lives in a child process (SGLang keeps process-global
state, and the benchmark's environment must be set before SGLang is imported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BATCHES = (1, 8, 33)
# bf16 attention outputs from fp32 accumulation in both kernels, different split orders (2^-8 relative each)
ATTN_ATOL, ATTN_RTOL = 3e-2, 3e-2
# per-token ||logits - logits_triton|| / ||logits_triton|| through two layers and the head
LOGIT_TOL = 0.05
# the child imports SGLang, builds the runner (Triton JIT of SGLang's prefill and our kernels, graph capture for
# three batch sizes) and runs nine decode steps; gpu.sh's pytest timeout must allow it (TEST_TIMEOUT)
CHILD_TIMEOUT_S = 540


def _child(out_path: str) -> None:
    """Build the runner, run the three decode steps per batch, write the errors as JSON."""
    import argparse

    from tests.benchmarks.helpers import load_script

    bl = load_script("bench_layer")
    bl._sgl_kernel_twins()
    bl._install_weight_rescale()
    import torch
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    work = Path(out_path).parent
    (work / "model").mkdir(exist_ok=True)
    cfg = bl.shard_config("dsv3", 2)
    cfg["first_k_dense_replace"] = 2  # both layers dense: DeepseekV2DecoderLayer with its MLP
    (work / "model" / "config.json").write_text(json.dumps(cfg))
    a = argparse.Namespace(model="dsv3", seed=3, batches=list(BATCHES))
    online_fp8 = bl._server_argv

    def bf16_argv(*args):  # no --quantization fp8: dense layers, every linear bf16
        argv = online_fp8(*args)
        i = argv.index("--quantization")
        return argv[:i] + argv[i + 2 :]

    bl._server_argv = bf16_argv
    lens_all = bl.draw_lengths("mixed-1k-32k", max(BATCHES), a.seed)
    need = sum(bl.split_prefix(n) for n in lens_all)
    runner = bl._build_runner(
        a, str(work / "model"), "hpc_advise", "triton", need + 1600 * 2 * bl.PAGE + 64 * bl.PAGE
    )
    hybrid = runner.attn_backend
    assert type(hybrid.decode_backend).__name__ == "HpcAdviseAttnBackend", type(hybrid.decode_backend)
    bl._fill_kv(runner, a.seed)
    outputs: dict[str, list] = {}
    mqa = [layer.self_attn.attn_mqa for layer in runner.model.model.layers]
    hooks = [
        m.register_forward_hook(
            lambda mod, args, out, i=i: outputs.setdefault(f"l{i}", []).append(out.float().clone())
        )
        for i, m in enumerate(mqa)
    ]
    tree = bl._TreeCache(runner, bl.PAGE)
    prefixes = [runner.token_to_kv_pool_allocator.alloc(bl.split_prefix(n)) for n in lens_all]
    triton = TritonAttnBackend(runner)
    ours, graphs = hybrid.decode_backend, runner.decode_cuda_graph_runner
    result = []
    for bs in BATCHES:
        rng = torch.Generator().manual_seed(bs)
        lens = lens_all[:bs]
        cached = [p[: bl.split_prefix(n)] for p, n in zip(prefixes[:bs], lens, strict=True)]
        batch, fb = bl._extend_batch(runner, tree, lens, cached, rng, f"mla{bs}")
        runner.forward(fb)
        batch.input_ids = torch.randint(0, bl.VOCAB, (bs,), generator=rng).to(runner.device)
        batch.prepare_for_decode()
        fb = ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)
        got = runner.forward(fb)
        assert got.can_run_graph, f"bs {bs}: no captured decode graph"
        logits = {"graph": got.logits_output.next_token_logits.float().clone()}
        runner.decode_cuda_graph_runner = None  # eager steps from here
        outputs.clear()
        logits["ours"] = runner.forward(fb).logits_output.next_token_logits.float().clone()
        mine = {k: v[-1] for k, v in outputs.items()}
        hybrid.decode_backend, hybrid.decode_attention_backend_str = triton, "triton"
        outputs.clear()
        logits["triton"] = runner.forward(fb).logits_output.next_token_logits.float().clone()
        ref = {k: v[-1] for k, v in outputs.items()}
        hybrid.decode_backend, hybrid.decode_attention_backend_str = ours, "hpc_advise"
        runner.decode_cuda_graph_runner = graphs
        attn = {}
        for k in ref:
            excess = (mine[k] - ref[k]).abs() - (ATTN_ATOL + ATTN_RTOL * ref[k].abs())
            attn[k] = {"max_excess": float(excess.max()), "max_ref": float(ref[k].abs().max())}
        errs = {name: bl.token_errors(logits[name], logits["triton"]) for name in ("graph", "ours")}
        errs["graph_vs_eager"] = bl.token_errors(logits["graph"], logits["ours"])
        result.append({"bs": bs, "attn": attn, "logits": errs})
    for h in hooks:
        h.remove()
    Path(out_path).write_text(json.dumps(result))


@pytest.mark.gpu
def test_deepseek_decoder_layer_decodes_with_our_mla_backend_as_with_triton(tmp_path):
    import torch

    from tests.benchmarks.helpers import load_script

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("sglang")
    out = tmp_path / "result.json"
    bl = load_script("bench_layer")
    env = bl.worker_env("triton", "sglang")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    code = f"from tests.runtime.sglang.test_deepseek_layer_gpu import _child; _child({str(out)!r})"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = json.loads(out.read_text())
    assert [r["bs"] for r in rows] == list(BATCHES)
    for r in rows:
        assert sorted(r["attn"]) == ["l0", "l1"], r  # both layers' attn_mqa ran in both eager steps
        for layer, a in r["attn"].items():
            assert a["max_excess"] <= 0, (r["bs"], layer, a)  # |ours - triton| within atol + rtol |triton|
        for name, e in r["logits"].items():
            assert e["err_token_max"] <= LOGIT_TOL, (r["bs"], name, e)
