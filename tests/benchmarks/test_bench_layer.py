"""CPU checks of benchmarks/bench_layer.py's pure parts: one rank's shapes, the context mixes, the byte
count behind the bandwidth floor, and the table from rows (no GPU, no SGLang needed)."""

from __future__ import annotations

import argparse
import json
import math
import statistics

import pytest

from tests.benchmarks.helpers import load_script

bl = load_script("bench_layer")
ROOT_DIR = bl.ROOT


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
                   "default_over_this": 1.0, "err_token_p50": 1e-3, "err_tokens_over_tol": 0.125, "forward_us": 300.0, "layers": 4,
                   "torch_ops_us": 30.0, "ratio_to_floor_excl_torch": 1.4,
                   "tp_shard": 8, "kv_cache_dtype": "auto", "page_size": 64, "quantization": "q", "copy_tbps": 4.2},
    }  # fmt: skip
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert bl.main(["--table", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "| attn=triton,moe=triton | agentic | 8 | 20000 | 100.0 | 50.0 | 2.00 | 30.0 | 1.40 | 1.000 | 1.00e-03 | 12% | 300 |"
        in out
    )


def test_kernel_breakdown_tells_torch_ops_from_gemms_and_triton():
    names = [
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>",
            3.0,
        ),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", 2.0),
        ("void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<>", 1.0),
        ("nvjet_tst_64x8_64x16_2x1_v_bz_TNT", 10.0),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 4.0),
        ("_fused_moe_fp8_kernel", 20.0),
        ("_fused_moe_fp8_kernel", 20.0),
    ]
    k = bl.kernel_breakdown(names, reps=2)
    assert (k["torch_ops_us"], k["gemm_us"], k["other_kernels_us"]) == (3.0, 7.0, 20.0)
    assert k["kernels_us"] == 30.0 and k["top_kernels"][0] == ["_fused_moe_fp8_kernel", 20.0]
    cell = {"p50": 100.0, "kernels": k}
    assert bl.kernel_fields(cell, 50.0)["ratio_to_floor_excl_torch"] == pytest.approx((100.0 - 3.0) / 50.0)
    assert bl.kernel_fields({"p50": 1.0, "kernels_error": "RuntimeError: x"}, 1.0) == {
        "kernels_error": "RuntimeError: x"
    }
    assert bl.kernel_fields({"p50": 1.0}, 1.0) == {}


def test_bad_input_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        bl.main(["--table", "/nonexistent.jsonl"])
    assert e.value.code != 0
    assert "no such file" in capsys.readouterr().err


def test_combinations_per_model():
    hy3 = bl.combos("hy3")
    assert hy3[0] == bl.DEFAULT and len(hy3) == len(set(hy3)) == 10
    assert {c[2] for c in hy3} == {"sglang", "hpc_advise"}
    # the hand-off-off runner only at SGLang's router: it exists to pair with SGLang's Triton MoE
    assert {c for c in hy3 if c[1] == bl.RAW} == {
        ("triton", bl.RAW, "sglang"),
        ("hpc_advise", bl.RAW, "sglang"),
    }
    # MLA: the chosen four (one call's budget), SGLang's router (DeepSeek's bf16 gate, an EP rank's 32 experts):
    # SGLang's default, our MLA attention beside it, what launch starts, the MoE hand-off pair
    for model in ("dsv3", "dsv3-ep8", "dsv3-block"):
        assert bl.combos(model) == [("triton", "triton", "sglang"), ("hpc_advise", "triton", "sglang"),
                                    ("hpc_advise", "hpc_advise", "sglang"), ("triton", bl.RAW, "sglang")]  # fmt: skip
    assert bl._short(bl.combo_name("hpc_advise", bl.RAW)) == "A:ours M:ours-raw R:sglang"
    ep = bl.combos("qwen3-235b-ep4")
    assert len(ep) == 6 and {c[2] for c in ep} == {"sglang"}
    assert bl.REFERENCE not in hy3
    assert bl.combo_name("triton", "triton") == "attn=triton,moe=triton"  # the first table's names
    assert (
        bl.combo_name("hpc_advise", "triton", "hpc_advise") == "attn=hpc_advise,moe=triton,router=hpc_advise"
    )


def test_shard_config_ep_and_mla():
    ep = bl.shard_config("qwen3-235b-ep4", 2)
    assert (ep["num_experts"], ep["num_experts_per_tok"], ep["moe_intermediate_size"]) == (32, 2, 1536)
    assert (ep["num_attention_heads"], ep["num_key_value_heads"]) == (16, 1)
    ds = bl.shard_config("dsv3", 2)
    assert (ds["num_attention_heads"], ds["n_routed_experts"], ds["moe_intermediate_size"]) == (16, 256, 256)
    assert ds["kv_lora_rank"] == 512 and ds["n_group"] == 8
    ds8 = bl.shard_config("dsv3-ep8", 2)
    assert (ds8["n_routed_experts"], ds8["num_experts_per_tok"], ds8["moe_intermediate_size"]) == (
        32,
        1,
        2048,
    )
    assert (ds8["n_group"], ds8["topk_group"], ds8["n_shared_experts"]) == (1, 1, 1)
    q30 = bl.shard_config("qwen3-30b", 1)
    assert (q30["hidden_size"], q30["num_attention_heads"], q30["num_key_value_heads"]) == (2048, 32, 4)


def test_step_bytes_mla_reads_the_latent_once():
    cfg = bl.shard_config("dsv3", 1)
    one = bl.step_bytes(cfg, 2, [1000], gate_bytes=2)
    assert one["kv_bytes"] == 1000 * (512 + 64) * 2
    two = bl.step_bytes(cfg, 2, [1000, 1000], gate_bytes=2)
    assert two["kv_bytes"] == 2 * one["kv_bytes"]


def _fake_work(tmp_path, model):
    """Worker outputs as the GPU run leaves them: one JSON per combination, logits per cell."""
    import torch

    work = tmp_path / "work"
    work.mkdir()
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(8, bl.VOCAB, generator=g)
    for i, combo in enumerate(bl.combos(model) + [bl.REFERENCE]):
        tag = bl._tag(*combo)
        reference = combo == bl.REFERENCE
        cells = [{"bs": 8, "mix": "agentic", "graph": not reference, "seq_lens": [3000] * 8}]
        prefill = [{"tokens": 1024}]
        if not reference:
            cells[0].update(p20=90.0 + i, p50=100.0 + i, p80=110.0 + i, reps=40, forward_us=300.0)
            prefill[0].update(p20=900.0, p50=1000.0 - i, p80=1100.0, reps=5)
        cells[0]["moe_paths"] = (
            ["hpc_advise"] if combo[1] in ("hpc_advise", bl.RAW, "reference") else ["triton"]
        )
        log = {"cells": cells, "prefill": prefill, "errors": ["agentic bs=256: boom"] if i == 1 else [],
               "copy_tbps": 4.0, "build_s": 10.0, "moe_runners": [combo[1]], "router_gates": {"ours": 0, "sglang": 4}}  # fmt: skip
        (work / f"{tag}.json").write_text(json.dumps(log))
        torch.save(ref * (1 + (0 if reference else 0.01 * i)), work / f"logits__{tag}__agentic__8.pt")
        torch.save(ref[:1], work / f"logits__{tag}__prefill__1024.pt")
    return work


def test_collect_rows_and_tables(tmp_path):

    work = _fake_work(tmp_path, "hy3")
    cfg = bl.shard_config("hy3", 4)
    a = argparse.Namespace(model="hy3")
    rows = bl.collect(a, work, cfg, {"gpu": "NVIDIA H200"})
    steps = [r for r in rows if r["kind"] == "layer_step"]
    assert len(steps) == 10 and {r["provider"] for r in steps} == {
        bl.combo_name(*c) for c in bl.combos("hy3")
    }
    d = next(r for r in steps if r["provider"] == "attn=triton,moe=triton")
    assert d["config"]["default_over_this"] == 1.0 and d["subject"] == "hy3-tp8-rank"
    # schema the advisor reads: kept from the first table, router added
    for key in ("attention", "moe_runner", "router", "mix", "batch", "context_mean", "floor_us", "ratio_to_floor",
                "default_over_this", "err_token_p50", "err_tokens_over_tol", "kv_cache_dtype", "tp_shard", "moe_paths"):  # fmt: skip
        assert key in d["config"]
    worst = max(r["config"]["err_token_p50"] for r in steps)
    assert worst == pytest.approx(0.09, rel=1e-5)  # combination 9 of the fake logits is 9 % off the reference
    assert all(r["config"]["err_tokens_over_tol"] == 0.0 for r in steps)
    raw = next(r for r in steps if r["provider"] == "attn=hpc_advise,moe=hpc_advise-raw")
    assert (raw["config"]["moe_runner"], raw["config"]["moe_handoff"]) == ("hpc_advise", "off")
    assert d["config"]["moe_handoff"] is None
    pre = [r for r in rows if r["kind"] == "layer_prefill"]
    assert len(pre) == 10 and all(r["config"]["err_token_p50"] == 0.0 for r in pre)
    assert [r["config"]["error"] for r in rows if r["kind"] == "layer_step_error"] == ["agentic bs=256: boom"]
    table = bl.render_table(rows, "hy3")
    assert (
        "| attn=triton,moe=triton | agentic | 8 | 3000 | 100.0 |" in table
        and "Prefill (extend) step" in table
    )
    summary = bl.render_summary(rows, "hy3")
    assert "| agentic 8 | 100.0 | attn=triton,moe=triton | 100.0 | 1.000 |" in summary
    assert "| prefill 1024 | 1000.0 | attn=hpc_advise,moe=hpc_advise-raw | 991.0 | 1.009 |" in summary


def test_collect_ep_subject(tmp_path):

    work = _fake_work(tmp_path, "dsv3-ep8")
    rows = bl.collect(argparse.Namespace(model="dsv3-ep8"), work, bl.shard_config("dsv3-ep8", 4), {})
    step = next(r for r in rows if r["kind"] == "layer_step")
    assert (
        step["subject"] == "dsv3-ep8-rank"
        and step["config"]["mla"]
        and "EP8 rank emulated" in step["config"]["emulation"]
    )


def test_bad_combination_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        bl.main(["--model", "dsv3", "--skip", "hpc_advise:triton:hpc_advise"])
    assert e.value.code != 0
    assert "unknown combination" in capsys.readouterr().err


def test_several_models_share_one_lock_and_split_skips(monkeypatch, capsys):
    started = []

    class Proc:
        returncode = 0

        def __init__(self, cmd, **kw):
            started.append(cmd[2:])

        def communicate(self):
            return "", None

    monkeypatch.setattr(bl.subprocess, "Popen", Proc)
    monkeypatch.setattr(bl.time, "sleep", lambda s: None)
    argv = ["--model", "hy3", "dsv3", "--skip", "hy3:triton:triton:hpc_advise", "triton:hpc_advise-raw:sglang",
            "--budget-s", "9", "--out", "/tmp/x"]  # fmt: skip
    assert bl.main(argv) == 0
    hy3, dsv3 = started
    assert hy3[:2] == ["--model", "hy3"] and dsv3[:2] == ["--model", "dsv3"]
    assert hy3[hy3.index("--lock") + 1] == dsv3[dsv3.index("--lock") + 1]
    assert hy3[hy3.index("--skip") + 1 :] == ["hy3:triton:triton:hpc_advise", "triton:hpc_advise-raw:sglang"]
    assert dsv3[dsv3.index("--skip") + 1 :] == ["triton:hpc_advise-raw:sglang"]
    assert "--budget-s" in dsv3 and "9" in dsv3


def test_gpu_lock_goes_by_ticket_not_arrival(tmp_path):
    """Workers queued before the GPU is free take it lowest ticket first; a dead ticket is skipped."""
    import subprocess
    import sys
    import time

    lock, order = tmp_path / "gpu.lock", tmp_path / "order"
    (tmp_path / "gpu.lock.queue").mkdir()
    (tmp_path / "gpu.lock.queue" / "000000.999999999").touch()  # a worker that died in the queue
    prog = (
        "import sys, time; sys.path.insert(0, {b!r}); import bench_layer as bl; "
        "lk = bl._Lock(bl.Path({lock!r}), int(sys.argv[1])); time.sleep(float(sys.argv[2])); "
        "lk.__enter__(); open({order!r}, 'a').write(sys.argv[1] + ' '); "
        "[time.sleep(0.1) for _ in range(600) if len(list(lk.queue.iterdir())) < int(sys.argv[3])]"
    ).format(b=str(bl.ROOT / "benchmarks"), lock=str(lock), order=str(order))
    # ticket 5 keeps the GPU until the dead ticket, itself and the three others are all in the queue
    first = subprocess.Popen([sys.executable, "-c", prog, "5", "0", "5"])
    deadline = time.time() + 60
    while not order.exists() and time.time() < deadline:
        time.sleep(0.1)
    procs = [first] + [subprocess.Popen([sys.executable, "-c", prog, t, d, "0"]) for t, d in (("3", "0"), ("1", "0.3"), ("2", "0.6"))]  # fmt: skip
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    assert order.read_text().split() == ["5", "1", "2", "3"]


def test_agentic_trace_from_the_sent_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(bl, "ROOT", tmp_path / "tree")
    monkeypatch.setenv("CARRY", str(ROOT_DIR))
    assert bl._trace() == ROOT_DIR / bl.AGENTIC_TRACE
    monkeypatch.setenv("CARRY", str(tmp_path))
    with pytest.raises(FileNotFoundError):
        bl._trace()


def test_rescaled_dummy_weights():
    """Unit-variance layer outputs from the dummy weights, fp8 values carried by their scale, norms at 1."""
    import torch

    m = torch.nn.Module()
    m.proj = torch.nn.Linear(1024, 64, bias=False)
    m.input_layernorm = torch.nn.Module()
    m.input_layernorm.weight = torch.nn.Parameter(torch.full((1024,), 1e-3))
    m.w13_weight = torch.nn.Parameter(torch.zeros(4, 32, 1024).to(torch.float8_e4m3fn), requires_grad=False)
    m.w13_weight_scale = torch.nn.Parameter(torch.full((4,), 1e-3), requires_grad=False)
    with torch.no_grad():
        m.proj.weight.uniform_(-1e-3, 1e-3)
        bl._rescale_dummy_weights(m)
    x = torch.randn(256, 1024)
    assert 0.8 < (x @ m.proj.weight.t()).std().item() < 1.2
    assert torch.all(m.input_layernorm.weight == 1)
    w = m.w13_weight.float() * m.w13_weight_scale[0]
    assert 0.8 < (x @ w[0].t()).std().item() < 1.2
    first = m.proj.weight.clone()
    with torch.no_grad():
        bl._rescale_dummy_weights(m)
    assert torch.equal(first, m.proj.weight)  # seeded: every worker gets the same weights


def test_reference_moe_worker_takes_the_torch_reference_and_no_handoff(monkeypatch):
    """The reference worker's runner layers call ``fused_moe_reference`` (bf16 out, fp32 math) in place
    of our kernel, and the dispatch table hands it no bucket."""
    import torch

    from hpc_advise.kernels.fused_moe import op, reference
    from hpc_advise.runtime import dispatch

    monkeypatch.setattr(op, "fused_moe", op.fused_moe)  # restored after the test
    monkeypatch.setattr(dispatch, "moe_buckets", dispatch.moe_buckets)
    assert bl.REFERENCE == ("torch_native", "reference", "sglang")
    assert "hpc_advise" in bl._server_argv(
        argparse.Namespace(model="hy3", seed=1, batches=[1]), "/m", "torch_native", "reference", 4096
    )
    bl._install_reference_moe()
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 256, generator=g).to(torch.bfloat16)
    w13, s13 = reference.quantize_weight(torch.randn(4, 2 * 128, 256, generator=g) / 16, "tensor")
    w2, s2 = reference.quantize_weight(torch.randn(4, 256, 128, generator=g) / 16, "tensor")
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)
    wts = torch.full((3, 2), 0.5)
    got = op.fused_moe(hidden, w13, w2, wts, ids, w13_scale=s13, w2_scale=s2, config={"x": 1})
    want = reference.fused_moe_reference(hidden, w13, w2, wts, ids, w13_scale=s13, w2_scale=s2)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16))
    assert dispatch.moe_buckets(object()) == []


def test_token_error_tells_a_routing_flip_from_a_wrong_kernel():
    """64 tokens: quantization-sized noise (2 %) everywhere, one token whose logits are unrelated (a top-k
    flip) keeps the median low and 1/64 above the tolerance; a factor-2 scale on every token (a wrong kernel)
    puts the median and every token above it."""
    import torch

    g = torch.Generator().manual_seed(3)
    ref = torch.randn(64, bl.VOCAB, generator=g)
    close = ref + 0.02 * torch.randn(ref.shape, generator=g)
    flipped = close.clone()
    flipped[17] = torch.randn(bl.VOCAB, generator=g)
    flip = bl.token_errors(flipped, ref)
    assert flip["err_token_p50"] < 0.05 and flip["err_tokens_over_tol"] == pytest.approx(1 / 64)
    assert flip["err_token_max"] > 1.0
    wrong = bl.token_errors(2 * close, ref)
    assert wrong["err_token_p50"] > bl.TOKEN_ERR_TOL and wrong["err_tokens_over_tol"] == 1.0
    nan = close.clone()
    nan[0, 0] = float("nan")
    assert bl.token_errors(nan, ref)["err_tokens_over_tol"] == pytest.approx(1 / 64)
    with pytest.raises(ValueError):
        bl.token_errors(ref[:3], ref)


def test_raw_worker_rows_pair_with_triton_beside_a_handoff_worker(tmp_path):
    """The rows collect writes for SGLang's default, our runner handing bs 8 to triton, and the hand-off-off
    runner at the same attention: ``hpc_advise.measured`` pairs the hand-off-off cell with Triton's."""
    from hpc_advise import measured

    work = _fake_work(tmp_path, "hy3")
    for combo in bl.combos("hy3"):
        if combo[1] == "hpc_advise":
            f = work / f"{bl._tag(*combo)}.json"
            log = json.loads(f.read_text())
            log["cells"][0]["moe_paths"] = ["triton"]  # the hand-off in effect at this batch
            f.write_text(json.dumps(log))
    rows = bl.collect(argparse.Namespace(model="hy3"), work, bl.shard_config("hy3", 4), {})
    cells = measured.layer_cells(rows)
    assert {(c.attention, c.handoff_off) for c in cells if c.moe == "hpc_advise" and not c.handed_off} == {
        ("triton", True), ("hpc_advise", True)}  # fmt: skip
    points = measured.moe_points(rows)
    by_attn = {p.source: p for p in points}
    assert len(points) == 2 and all(p.runner == "hpc_advise" and p.tokens == 8 for p in points), by_attn
    raw_us = {c.attention: c.p50 for c in cells if c.handoff_off}
    assert sorted(p.runner_us for p in points) == sorted(raw_us.values())


def test_raw_worker_switches_the_handoff_off(monkeypatch):
    """``hpc_advise-raw`` starts SGLang with our runner and leaves the dispatch table no bucket in that worker."""
    from hpc_advise.runtime import dispatch

    monkeypatch.setattr(dispatch, "moe_buckets", dispatch.moe_buckets)
    argv = bl._server_argv(
        argparse.Namespace(model="hy3", seed=1, batches=[1]), "/m", "hpc_advise", bl.RAW, 4096
    )
    assert argv[argv.index("--moe-runner-backend") + 1] == "hpc_advise"
    bl._disable_moe_handoff()
    assert dispatch.moe_buckets(object()) == []


def test_block_recipe_models(monkeypatch):
    """DeepSeek-V3's checkpoint recipe: block-FP8 experts named in config.json (no --quantization), rows under the
    same subject as the per-tensor model, the same combinations where deep_gemm does not import."""
    monkeypatch.setattr(bl, "deep_gemm_skip_reason", lambda: "no deep_gemm package")
    for model, subject in (("dsv3-block", "dsv3-tp8-rank"), ("dsv3-ep8-block", "dsv3-ep8-rank")):
        assert bl.subject_of(model) == subject and bl.recipe(model) == bl.BLOCK
        cfg = bl.shard_config(model, 2)
        assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
        assert "128x128 blocks" in bl.quantization_text(model)
        argv = bl._server_argv(
            argparse.Namespace(model=model, seed=0, batches=[1]), "/m", "triton", "triton", 4096
        )
        assert "--quantization" not in argv
    assert [bl.subject_of(m) for m in ("hy3", "dsv3-ep8", "qwen3-235b-ep4", "qwen3-30b")] == [
        "hy3-tp8-rank", "dsv3-ep8-rank", "qwen3-235b-ep4-rank", "qwen3-30b-tp1-rank"]  # fmt: skip
    assert "quantization_config" not in bl.shard_config("dsv3", 2)
    assert "--quantization" in bl._server_argv(argparse.Namespace(model="hy3", seed=0, batches=[1]), "/m",
                                               "triton", "triton", 4096)  # fmt: skip
    assert bl.combos("dsv3-block") == bl.combos("dsv3")


def test_deep_gemm_runner_only_for_block_models_where_it_imports(monkeypatch):
    """SGLang's DeepGEMM MoE runner: one combination per attention for the block-FP8 models, last, SGLang's router,
    only where ``import deep_gemm`` works; never for per-tensor models; the table says once why it was left out."""
    monkeypatch.setattr(bl, "deep_gemm_skip_reason", lambda: None)
    for model in ("dsv3-block", "dsv3-ep8-block"):
        got = bl.combos(model)
        assert got[0] == bl.DEFAULT and got[-1] == ("triton", bl.DEEP_GEMM, "sglang")
        assert [c for c in got if c[1] == bl.DEEP_GEMM] == [
            ("triton", bl.DEEP_GEMM, "sglang")
        ]  # MLA: triton only
        assert got[:-1] == [c for c in bl.combos(model.replace("-block", "")) if c[1] != bl.DEEP_GEMM]
        assert "timed" in bl.deep_gemm_note(model)
    for model in ("dsv3", "dsv3-ep8", "hy3", "qwen3-30b", "qwen3-235b"):
        assert bl.DEEP_GEMM not in {c[1] for c in bl.combos(model)}  # per-tensor: DeepGEMM takes blocks only
        assert bl.deep_gemm_note(model) is None
    argv = bl._server_argv(argparse.Namespace(model="dsv3-block", seed=0, batches=[1]), "/m", "triton",
                           bl.DEEP_GEMM, 4096)  # fmt: skip
    assert argv[argv.index("--moe-runner-backend") + 1] == "deep_gemm" and "--quantization" not in argv
    why = "import deep_gemm failed: OSError: undefined symbol"
    monkeypatch.setattr(bl, "deep_gemm_skip_reason", lambda: why)
    assert bl.DEEP_GEMM not in {c[1] for c in bl.combos("dsv3-block")}
    note = bl.deep_gemm_note("dsv3-block")
    assert note == f"SGLang's DeepGEMM MoE runner: skipped, {why}."
    table = bl.render_table([], "dsv3-block", note)
    assert table.count("DeepGEMM") == 1 and why in table


def test_deep_gemm_probe(monkeypatch, tmp_path):
    """The probe: no package, a package without _C.so (its import would build one), an import that fails in a fresh
    interpreter; asked once per process."""
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert bl._probe_deep_gemm().startswith("no deep_gemm package")
    pkg = tmp_path / "deep_gemm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "raise OSError('undefined symbol: _ZN3c104cuda19CUDAErrorLogCaptureC1Ev')\n"
    )
    spec = importlib.util.spec_from_file_location("deep_gemm", pkg / "__init__.py")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    assert "has no _C.so" in bl._probe_deep_gemm()
    (pkg / "_C.so").write_bytes(b"")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    why = bl._probe_deep_gemm()
    assert why.startswith("import deep_gemm failed") and "CUDAErrorLogCapture" in why, why
    (pkg / "__init__.py").write_text("")
    assert bl._probe_deep_gemm() is None
    calls = []
    monkeypatch.setattr(bl, "_DEEP_GEMM_PROBE", [])
    monkeypatch.setattr(bl, "_probe_deep_gemm", lambda: calls.append(1) or "x")
    assert bl.deep_gemm_skip_reason() == bl.deep_gemm_skip_reason() == "x" and calls == [1]


def test_rescaled_dummy_weights_fill_block_scales():
    import torch

    m = torch.nn.Module()
    m.w13_weight = torch.nn.Parameter(torch.zeros(2, 256, 384).to(torch.float8_e4m3fn), requires_grad=False)
    m.w13_weight_scale_inv = torch.nn.Parameter(torch.full((2, 2, 3), -1e-3), requires_grad=False)
    with torch.no_grad():
        bl._rescale_dummy_weights(m)
    assert torch.allclose(m.w13_weight_scale_inv, torch.full((2, 2, 3), math.sqrt(3 / 384)))
    assert m.w13_weight.float().abs().max() > 0.5


def test_mla_workers_pass_the_plugins_launch_rules():
    """Each MLA worker's set-up (our decode attention's MLA form among them) passes the refusals our
    plugin's resolution checks enforce, at the rank shape the worker builds (bf16 KV, page 64, SM90)."""
    from hpc_advise import rules
    from hpc_advise.profiles.hf_config import from_hf_config

    for model in ("dsv3", "dsv3-ep8", "dsv3-block"):
        profile = from_hf_config(bl.shard_config(model, 4), key="deepseek", hf_id=model)
        assert profile.attention == "mla"
        for attn, moe, _ in bl.combos(model):
            setup = rules.Setup("triton", attn, "hpc_advise" if moe == bl.RAW else moe, page_size=bl.PAGE)
            refused = rules.launch_refusal(setup, profile, (9, 0), kinds=("refuse",), ours_only=True)
            assert refused is None, (model, attn, moe, refused)
