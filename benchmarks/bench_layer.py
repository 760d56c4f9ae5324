"""Layer-step benchmark: SGLang 0.5.23's own decoder layers, decode steps under CUDA graphs (issue 27).

What runs: SGLang's real ``ModelRunner`` (``ModelConfig``, KV pool, ``ScheduleBatch`` -> ``ForwardBatch``,
attention backends, MoE runners, its decode CUDA-graph runner) on a model whose decoder layers have one
tensor-parallel rank's real shapes (Hy3 at TP8: 8 query / 1 KV heads, 192 experts of width 1536/8;
Qwen3-235B at TP4: 16 / 1 heads, 128 experts of width 1536/4), ``--load-format dummy`` random weights,
``num_hidden_layers`` = ``--layers`` MoE layers (the first-dense layer of Hy3 is left out: 79 of its 80
layers are MoE) and a 1024-token vocabulary, so the step is the decoder layers plus a small head. No
all-reduce runs (one GPU, tp_size 1): the step is one rank's compute, not a TP8 step.

The KV cache of a decode batch is written the way a radix-cache hit leaves it: each request's page-aligned
prefix is allocated from SGLang's own KV allocator and filled with seeded random values, the request's
remaining (< 64) prompt tokens go through SGLang's real extend (``prepare_for_extend``), then one
``prepare_for_decode`` step is timed. The step's time is the replay of SGLang's captured decode graph for
that batch size (``torch.cuda.CUDAGraph.replay``, CUDA events), after one full ``ModelRunner.forward``
has prepared its inputs; ``forward_us`` (the whole ``forward``, host work included) is kept beside it.

One worker process per backend combination (SGLang keeps process-global state); the workers import in
parallel and take turns on the GPU (a file lock around build and timing), so timings do not overlap.
Every worker gets the same weights (the dummy loader is seeded per parameter), the same KV contents and
the same decode tokens, so logits can be compared with the reference worker's (``torch_native`` decode
attention, SGLang's Triton MoE, eager): ``max_rel_err`` = max |logits - ref| / max |ref| over the batch.

sgl-kernel is not installed on the GPU machine (too large to carry): ``SGLANG_FORCE_FUSED_OP_BACKEND=torch``
puts RMSNorm, SiLU*mul, top-k and rotary on SGLang's torch paths in every combination (a cost common to all
of them), non-expert linears stay bf16 (``SGLANG_FP8_IGNORED_LAYERS``), experts are FP8 per-tensor (online
``--quantization fp8``, the Hy3 deployment's recipe) or 128x128 blocks (Qwen3-235B's checkpoint recipe is
block FP8; online quantization cannot make blocks, so Qwen3 here is per-tensor too: see the table's notes);
the few sgl-kernel names those paths still import are given SGLang's own twins (``_sgl_kernel_twins``).

Usage (GPU machine, SGLang carried as ``benchmarks/pack_sglang_carry.sh`` builds it)::

    python3 benchmarks/bench_layer.py --model hy3 --out $OUT        # all combinations, one table
    python3 benchmarks/bench_layer.py --table layer_step_hy3.jsonl   # Markdown table from the rows (CPU)
    python3 benchmarks/bench_layer.py --table benchmarks/results/layer_step_hy3.jsonl --ship
        # the committed rows into the package (hpc_advise/advisor/data/kernel_results/), where the advisor
        # and the dispatch table's MoE hand-off read them (benchmarks/ship.py; commit both copies)
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PAGE = 64
VOCAB = 1024
BATCHES = (1, 8, 32, 64, 128, 256)
MIXES = ("uniform-2k", "mixed-1k-32k", "agentic")
MAX_CONTEXT = 32768
AGENTIC_TRACE = ROOT / "examples" / "traces" / "agentic_coding.jsonl"

# One rank's shapes. Full-model numbers: hpc_advise/profiles/models/<key>.json.
MODELS = {
    "hy3": {
        "tp": 8,
        "kv_cache_dtype": "auto",  # bf16 KV (Hy3's rotary path takes it; see the module docstring)
        "config": {
            "architectures": ["HYV3ForCausalLM"],
            "model_type": "hy_v3",
            "hidden_size": 4096,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 13312,
            "num_experts": 192,
            "num_experts_per_tok": 8,
            "num_shared_experts": 1,
            "moe_intermediate_size": 1536,
            "first_k_dense_replace": 0,
            "use_qk_norm": True,
            "route_norm": True,
            "router_scaling_factor": 1.0,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "num_nextn_predict_layers": 0,
        },
    },
    "qwen3-235b": {
        "tp": 4,
        "kv_cache_dtype": "fp8_e4m3",  # bf16 KV takes fused_set_kv_buffer_arg, refused by torch rotary
        "config": {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "hidden_size": 4096,
            "num_attention_heads": 64,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "intermediate_size": 12288,
            "moe_intermediate_size": 1536,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "decoder_sparse_step": 1,
            "norm_topk_prob": True,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
        },
    },
}

# (attention decode backend, MoE runner); the first is SGLang's default here (FlashInfer and fa3 are not
# carried: see the table notes), the last is the numerical reference and runs eager.
COMBOS = (
    ("triton", "triton"),
    ("hpc_advise", "triton"),
    ("triton", "hpc_advise"),
    ("hpc_advise", "hpc_advise"),
)
REFERENCE = ("torch_native", "triton")
IGNORED_LINEARS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head"


# ---------------------------------------------------------------------------------------------- pure parts


def shard_config(model: str, layers: int) -> dict:
    """config.json of a model whose decoder layers have one TP rank's shapes (heads and expert widths
    divided by the TP size; KV heads at least 1), ``layers`` MoE layers, a 1024-token vocabulary."""
    spec = MODELS[model]
    tp = spec["tp"]
    cfg = dict(spec["config"])
    for key in ("num_attention_heads", "moe_intermediate_size", "intermediate_size"):
        if cfg[key] % tp:
            raise ValueError(f"{model}: {key}={cfg[key]} does not split over TP{tp}")
        cfg[key] //= tp
    cfg["num_key_value_heads"] = max(1, cfg["num_key_value_heads"] // tp)
    cfg.update(
        num_hidden_layers=layers,
        vocab_size=VOCAB,
        max_position_embeddings=MAX_CONTEXT + 2 * PAGE,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    return cfg


def draw_lengths(mix: str, n: int, seed: int) -> list[int]:
    """Context lengths (tokens already in the KV cache) of ``n`` requests of a mix: uniform 2048;
    log-uniform 1K..32K; the agentic example trace's prompt lengths (clipped to 256..32K)."""
    rng = random.Random(f"{mix}:{seed}")
    if mix == "uniform-2k":
        return [2048] * n
    if mix == "mixed-1k-32k":
        return [int(round(math.exp(rng.uniform(math.log(1024), math.log(MAX_CONTEXT))))) for _ in range(n)]
    if mix == "agentic":
        pool = [json.loads(line)["input_length"] for line in AGENTIC_TRACE.read_text().splitlines() if line]
        return [min(max(rng.choice(pool), 256), MAX_CONTEXT) for _ in range(n)]
    raise ValueError(f"unknown mix {mix!r} (one of {', '.join(MIXES)})")


def split_prefix(length: int) -> int:
    """Page-aligned cached prefix of a request with ``length`` context tokens; 1..64 tokens stay to
    extend (SGLang never caches a whole prompt)."""
    prefix = (length - 1) // PAGE * PAGE
    return prefix


def expected_distinct_experts(experts: int, top_k: int, tokens: int) -> float:
    """Experts touched by ``tokens`` tokens under uniform independent routing (the dummy weights' gate
    is close to that): E (1 - (1 - k/E)^T)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def step_bytes(cfg: dict, kv_bytes_per_elem: int, seq_lens: list[int], moe_block: bool = False) -> dict:
    """Fewest bytes one decode step reads: every weight it needs once (bf16 non-expert linears, fp32
    gate, FP8 experts the batch touches, the head) and every KV element of the batch once."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    e, k, inter = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    layers, bs = cfg["num_hidden_layers"], len(seq_lens)
    attn_w = (h * (q + 2 * kv) + q * h) * 2
    gate_w = h * e * 4
    shared = cfg.get("num_shared_experts", 0) * 3 * h * inter * 2
    expert_w = expected_distinct_experts(e, k, bs) * 3 * h * inter  # fp8: 1 byte
    head = (VOCAB * h + bs * h) * 2
    kv_read = sum(seq_lens) * 2 * kv * kv_bytes_per_elem
    weights = layers * (attn_w + gate_w + shared + expert_w) + head
    return {
        "weight_bytes": int(weights),
        "kv_bytes": int(layers * kv_read),
        "bytes": int(weights + layers * kv_read),
    }


def combo_name(attn: str, moe: str) -> str:
    return f"attn={attn},moe={moe}"


# ---------------------------------------------------------------------------------------------- worker


def _sgl_kernel_twins() -> None:
    """Import-time names of sgl-kernel that SGLang's CUDA paths reach here, given SGLang's own twins:
    ``moe_sum_reduce`` <- ``moe_sum_reduce_triton`` (same signature), ``moe_align_block_size`` (the AOT
    kernel SGLang's selector loads for the Triton runner) <- ``sglang.kernels.ops.moe.moe_align`` (JIT, same
    positional arguments), ``sgl_kernel.utils.
    is_arch_support_pdl`` <- ``sglang.kernels.jit.utils``, ``weak_ref_tensor`` <- identity (the graph
    runner only uses it to drop references to its captured outputs). Everything else stays the tests'
    raising placeholder (tests/runtime/sglang/sgl_kernel_stand_in.py)."""
    import types

    from tests.runtime.sglang import sgl_kernel_stand_in

    sgl_kernel_stand_in.install(cuda=True)
    sk = sys.modules["sgl_kernel"]
    from sglang.kernels.jit.utils import is_arch_support_pdl
    from sglang.kernels.ops.moe.fused_moe_triton_kernels import moe_sum_reduce_triton
    from sglang.kernels.ops.moe.moe_align import moe_align_block_size as jit_align

    def moe_align_block_size(topk_ids, num_experts, block_size, sorted_ids, expert_ids, n_post_pad, cumsum,
                             pad_sorted_token_ids=False, ignore_invalid_expert=False):  # fmt: skip
        if ignore_invalid_expert:  # the EP form; none of the combinations here takes it
            raise NotImplementedError("moe_align_block_size(ignore_invalid_expert=True) has no JIT twin here")
        jit_align(
            topk_ids,
            num_experts,
            block_size,
            sorted_ids,
            expert_ids,
            n_post_pad,
            cumsum,
            pad_sorted_token_ids,
        )

    sk.moe_sum_reduce = moe_sum_reduce_triton
    sk.moe_align_block_size = moe_align_block_size
    sk.weak_ref_tensor = lambda t: t
    utils = types.ModuleType("sgl_kernel.utils")
    utils.is_arch_support_pdl = is_arch_support_pdl
    sys.modules["sgl_kernel.utils"] = utils
    sk.utils = utils


def _server_argv(a, cfg_dir: str, attn: str, moe: str, max_tokens: int) -> list[str]:
    spec = MODELS[a.model]
    argv = [
        "--model-path", cfg_dir, "--skip-tokenizer-init", "--load-format", "dummy", "--dtype", "bfloat16",
        "--attention-backend", "triton", "--prefill-attention-backend", "triton",
        "--decode-attention-backend", attn, "--moe-runner-backend", moe,
        "--quantization", "fp8", "--kv-cache-dtype", spec["kv_cache_dtype"], "--page-size", str(PAGE),
        "--sampling-backend", "pytorch", "--disable-custom-all-reduce", "--disable-radix-cache",
        "--max-total-tokens", str(max_tokens), "--max-running-requests", "1600",
        "--context-length", str(MAX_CONTEXT + 2 * PAGE), "--mem-fraction-static", "0.8",
        "--random-seed", str(a.seed),
    ]  # fmt: skip
    if attn == REFERENCE[0]:
        argv += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    else:
        argv += ["--cuda-graph-bs-decode", *map(str, a.batches), "--cuda-graph-max-bs-decode", str(max(a.batches)),
                 "--cuda-graph-backend-prefill", "disabled"]  # fmt: skip
    return argv


class _Lock:
    def __init__(self, path: Path):
        self.f = open(path, "a")

    def __enter__(self):
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)


def _build_runner(a, cfg_dir, attn, moe, max_tokens):
    from sglang.srt.server_args import PortArgs, prepare_server_args

    from hpc_advise.runtime.sglang import plugin as sglang_plugin

    sglang_plugin.register()
    server_args = prepare_server_args(_server_argv(a, cfg_dir, attn, moe, max_tokens))
    server_args.resolve_once()
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import bootstrap
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.runtime_context import SpawnRanks, get_device, publish

    _set_envs_and_config(server_args)
    port_args = PortArgs.init_new(server_args)
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
    initialize_moe_config()
    initialize_fp8_gemm_config()
    initialize_bf16_gemm_config()
    initialize_fp4_gemm_config()
    cfg = resolving_view(server_args)
    model_config = ModelConfig.from_server_args(server_args)
    bootstrap.init_parallel_runtime(
        server_args=server_args, device=get_device().device, dist_port=port_args.nccl_port
    )
    bootstrap.init_layer_runtime(model_config=model_config)
    runner = ModelRunner(
        model_config=model_config,
        mem_fraction_static=cfg.mem_fraction_static,
        gpu_id=0,
        nccl_port=port_args.nccl_port,
        server_args=server_args,
    )
    runner.alloc_memory_pool()
    runner.init_attention_backends()
    runner.init_cuda_graphs()
    return runner


def _moe_runners(runner) -> dict:
    """Which runner each FusedMoE layer ended with (our hooks may send a layer to triton, logged)."""
    seen = {}
    for name, mod in runner.model.named_modules():
        method = getattr(mod, "quant_method", None)
        r = getattr(method, "runner", None)
        if r is not None and hasattr(r, "runner_backend"):
            seen[name] = str(getattr(r.runner_backend, "value", r.runner_backend))
    return seen


def _fill_kv(runner, seed: int) -> None:
    """Seeded N(0, 1) values in every K and V buffer (fp8 buffers get them rounded to e4m3)."""
    import torch

    pool = runner.token_to_kv_pool
    g = torch.Generator(device="cuda").manual_seed(seed)
    step = 1 << 20
    for bufs in (getattr(pool, "k_buffer", []), getattr(pool, "v_buffer", [])):
        for buf in bufs:
            for i in range(0, buf.shape[0], step):
                part = buf[i : i + step]
                tmp = torch.empty(part.shape, dtype=torch.bfloat16, device=buf.device).normal_(generator=g)
                if part.dtype in (torch.bfloat16, torch.float16, torch.float32):
                    part.copy_(tmp)
                else:  # fp8 KV, stored as float8_e4m3fn or as its uint8 bytes
                    part.copy_(tmp.to(torch.float8_e4m3fn).view(part.dtype))


def _copy_rate_tbps() -> float:
    import torch

    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        s.record()
        for _ in range(5):
            dst.copy_(src)
        e.record()
        e.synchronize()
        best = min(best, s.elapsed_time(e) / 5)
    return 2 * n / (best * 1e-3) / 1e12


class _TreeCache:
    """The tree-cache object ``ScheduleBatch`` needs, holding our pre-filled prefixes (radix cache off)."""

    def __init__(self, runner, page_size):
        self.page_size = page_size
        self.device = runner.device
        self.token_to_kv_pool_allocator = runner.token_to_kv_pool_allocator
        self.prefixes: dict[int, object] = {}

    def supports_swa(self):
        return False

    def supports_mamba(self):
        return False

    def supports_prefix_sharing(self):
        return True

    def evict(self, params):
        pass

    def maybe_hand_to_session(self, req):
        pass

    def prefix_device_indices(self, req):
        return self.prefixes[id(req)]


def _cell(runner, tree, lens, prefix_tensors, seed, reference: bool, reps: int) -> dict:
    from array import array

    import torch
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    bs = len(lens)
    rng = torch.Generator().manual_seed(seed * 7919 + bs)
    reqs = []
    for i, length in enumerate(lens):
        ids = torch.randint(0, VOCAB, (length,), generator=rng).tolist()
        req = Req(rid=f"{bs}-{i}", origin_input_text="", origin_input_ids=array("q", ids),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=8))  # fmt: skip
        req.full_untruncated_fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        req.extend_end = length
        req.prefix_len = split_prefix(length)
        tree.prefixes[id(req)] = prefix_tensors[i][: req.prefix_len]
        reqs.append(req)
    batch = ScheduleBatch.init_new(
        reqs=reqs, req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator, tree_cache=tree,
        model_config=runner.model_config, enable_overlap=False, spec_algorithm=SpeculativeAlgorithm.NONE,
    )  # fmt: skip
    batch.prepare_for_extend()
    if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
        batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device, non_blocking=True)
        batch.prefill_input_ids_cpu = None
    fb = ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)
    runner.forward(fb)
    nxt = torch.randint(0, VOCAB, (bs,), generator=rng).to(runner.device)
    batch.input_ids = nxt.to(torch.int64)
    batch.prepare_for_decode()
    fb = ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)
    out = runner.forward(fb)
    logits = out.logits_output.next_token_logits.float().clone()
    row = {"bs": bs, "graph": bool(getattr(out, "can_run_graph", False)), "seq_lens": [n + 1 for n in lens]}
    if reference:
        row["logits"] = logits.cpu()
        return row
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        runner.forward(fb)
    torch.cuda.synchronize()
    row["forward_us"] = (time.perf_counter() - t0) / 10 * 1e6
    graph = None
    gr = runner.decode_cuda_graph_runner
    key = getattr(gr, "_replay_graph_key", None)
    graphs = getattr(getattr(gr, "backend", None), "_graphs", {})
    if row["graph"] and key in graphs:
        graph = graphs[key]
    if graph is None:
        row["error"] = "no captured decode graph found for this batch (eager timing only)"
        row["logits"] = logits.cpu()
        return row
    for _ in range(5):
        graph.replay()
    samples = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    samples.sort()
    q = lambda p: samples[min(len(samples) - 1, int(p * (len(samples) - 1) + 0.5))]  # noqa: E731
    row.update(p20=q(0.2), p50=q(0.5), p80=q(0.8), reps=reps)
    row["logits"] = logits.cpu()
    return row


def worker(a) -> int:
    import torch

    attn, moe = a.combo.split(":")
    work = Path(a.work)
    name = combo_name(attn, moe)
    log = {"combo": name, "attn": attn, "moe": moe, "cells": [], "errors": []}
    out_json = work / f"{attn}__{moe}.json"
    t0 = time.time()
    _sgl_kernel_twins()
    import sglang.srt.managers.schedule_batch  # noqa: F401  (import cost outside the lock)
    import sglang.srt.model_executor.model_runner  # noqa: F401

    log["import_s"] = round(time.time() - t0, 1)
    mixes = {m: draw_lengths(m, max(a.batches), a.seed) for m in a.mixes}
    need = sum(sum(split_prefix(n) for n in lens) for lens in mixes.values())
    max_tokens = need + 1600 * 2 * PAGE + 8 * PAGE * len(a.batches)
    with _Lock(work / "gpu.lock"):
        t1 = time.time()
        try:
            runner = _build_runner(a, str(work / "model"), attn, moe, max_tokens)
        except Exception as exc:  # one line into the table, the worker's log has the traceback
            import traceback

            traceback.print_exc()
            log["errors"].append(
                f"build: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            )
            out_json.write_text(json.dumps(log))
            return 1
        log["build_s"] = round(time.time() - t1, 1)
        log["moe_runners"] = sorted(set(_moe_runners(runner).values()))
        log["max_total_num_tokens"] = int(runner.max_total_num_tokens)
        log["copy_tbps"] = _copy_rate_tbps()
        _fill_kv(runner, a.seed)
        alloc = runner.token_to_kv_pool_allocator
        tree = _TreeCache(runner, PAGE)
        for mix, lens_all in mixes.items():
            prefixes = [alloc.alloc(split_prefix(n)) for n in lens_all]
            if any(p is None for p in prefixes):
                log["errors"].append(f"{mix}: KV allocator ran out ({max_tokens} tokens)")
                continue
            for bs in a.batches:
                try:
                    row = _cell(runner, tree, lens_all[:bs], prefixes, a.seed, attn == REFERENCE[0], a.reps)
                except Exception as exc:
                    import traceback

                    traceback.print_exc()
                    log["errors"].append(f"{mix} bs={bs}: {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                torch.save(row.pop("logits"), work / f"logits__{attn}__{moe}__{mix}__{bs}.pt")
                row["mix"] = mix
                log["cells"].append(row)
                print(
                    f"[{name}] {mix} bs={bs} p50={row.get('p50', float('nan')):.1f}us graph={row['graph']}",
                    flush=True,
                )
        log["run_s"] = round(time.time() - t1, 1)
    out_json.write_text(json.dumps(log))
    return 0


# ---------------------------------------------------------------------------------------------- driver


def _versions() -> dict:
    import importlib.metadata as md

    from hpc_advise.runtime.measure.harness import environment

    env = environment()
    for d in ("sglang", "transformers", "flashinfer-python"):
        try:
            env[d] = md.version(d)
        except md.PackageNotFoundError:
            env[d] = "not installed"
    return env


def driver(a) -> int:
    import torch

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "model").mkdir(exist_ok=True)
    cfg = shard_config(a.model, a.layers)
    (work / "model" / "config.json").write_text(json.dumps(cfg, indent=1))
    env = dict(os.environ)
    env.update(
        SGLANG_FORCE_FUSED_OP_BACKEND="torch",
        SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK="1",
        SGLANG_FP8_IGNORED_LAYERS=IGNORED_LINEARS,
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
        PYTHONUNBUFFERED="1",
    )
    combos = [c for c in COMBOS if f"{c[0]}:{c[1]}" not in a.skip] + [REFERENCE]
    procs = []
    for attn, moe in combos:
        cmd = [sys.executable, __file__, "--worker", "--combo", f"{attn}:{moe}", "--model", a.model,
               "--layers", str(a.layers), "--seed", str(a.seed), "--work", str(work), "--reps", str(a.reps),
               "--batches", *map(str, a.batches), "--mixes", *a.mixes]  # fmt: skip
        logf = open(out / f"worker_{attn}__{moe}.log", "w")
        procs.append((attn, moe, subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)))
        time.sleep(0.5)  # lock order = start order: the default combination builds first
    deadline = time.time() + a.budget_s
    for _attn, _moe, p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
    env_v = _versions()
    rows = collect(a, work, cfg, env_v)
    path = out / f"layer_step_{a.model}.jsonl"
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    (out / f"layer_step_{a.model}.md").write_text(render_table(rows, a.model))
    print(render_table(rows, a.model))
    if a.ship:
        print(f"shipped {_ship(path)}")
    del torch
    return 0


def _ship(path: Path) -> Path:
    """benchmarks/ship.py: the advisor and the dispatch table read layer-step rows only from the package."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ship import ship

    return ship(path)


def collect(a, work: Path, cfg: dict, env_v: dict) -> list[dict]:
    import torch

    from hpc_advise.runtime.measure.harness import Timing, run_row

    logs = {}
    for attn, moe in list(COMBOS) + [REFERENCE]:
        f = work / f"{attn}__{moe}.json"
        logs[(attn, moe)] = (
            json.loads(f.read_text()) if f.exists() else {"errors": ["worker wrote nothing"], "cells": []}
        )
    kvb = 1 if MODELS[a.model]["kv_cache_dtype"].startswith("fp8") else 2
    subject = f"{a.model}-tp{MODELS[a.model]['tp']}-rank"
    command = " ".join(["python3", "benchmarks/bench_layer.py", *sys.argv[1:]])
    rows = []
    default = {}
    for (attn, moe), log in logs.items():
        if (attn, moe) == REFERENCE:
            continue
        for cell in log["cells"]:
            if "p50" not in cell:
                continue
            if (attn, moe) == COMBOS[0]:
                default[(cell["mix"], cell["bs"])] = cell["p50"]
    for (attn, moe), log in logs.items():
        if (attn, moe) == REFERENCE:
            continue
        for cell in log["cells"]:
            mix, bs = cell["mix"], cell["bs"]
            nbytes = step_bytes(cfg, kvb, cell["seq_lens"])
            floor_us = nbytes["bytes"] / (log["copy_tbps"] * 1e12) * 1e6
            err = None
            ref_f = work / f"logits__{REFERENCE[0]}__{REFERENCE[1]}__{mix}__{bs}.pt"
            mine_f = work / f"logits__{attn}__{moe}__{mix}__{bs}.pt"
            if ref_f.exists() and mine_f.exists():
                ref, mine = torch.load(ref_f), torch.load(mine_f)
                err = float((mine - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
            extra = {
                "attention": attn, "moe_runner": moe, "mix": mix, "batch": bs, "layers": cfg["num_hidden_layers"],
                "context_mean": sum(cell["seq_lens"]) / bs, "context_max": max(cell["seq_lens"]),
                "kv_cache_dtype": MODELS[a.model]["kv_cache_dtype"], "page_size": PAGE, "tp_shard": MODELS[a.model]["tp"],
                "quantization": "fp8 experts per-tensor (online), bf16 linears", "cuda_graph": cell["graph"],
                "floor_us": floor_us, "copy_tbps": log["copy_tbps"], **nbytes,
                "ratio_to_floor": (cell["p50"] / floor_us) if "p50" in cell else None,
                "default_over_this": (default[(mix, bs)] / cell["p50"]) if "p50" in cell and (mix, bs) in default else None,
                "max_rel_err_vs_ref": err, "reference": combo_name(*REFERENCE) + " (eager)",
                "forward_us": cell.get("forward_us"), "moe_runners_seen": log.get("moe_runners"),
                "sgl_kernel": "not installed; torch norms/activation/top-k/rotary (SGLANG_FORCE_FUSED_OP_BACKEND=torch)",
                "tree_commit": os.environ.get("LAYER_TREE_COMMIT"),
            }  # fmt: skip
            if "p50" in cell:
                t = Timing(cell["p20"], cell["p50"], cell["p80"], cell["reps"])
                rows.append(run_row(kind="layer_step", subject=subject, provider=combo_name(attn, moe), config={},
                                    metric="latency", unit="us", timing=t, env=env_v, extra=extra))  # fmt: skip
                rows[-1]["command"] = command
    for (attn, moe), log in logs.items():
        for e in log.get("errors", []):
            rows.append(run_row(kind="layer_step_error", subject=subject, provider=combo_name(attn, moe), config={"error": e},
                                metric="error", unit="", value=0.0, env=env_v))  # fmt: skip
            rows[-1]["command"] = command
        meta = {
            k: log.get(k)
            for k in ("import_s", "build_s", "run_s", "max_total_num_tokens", "moe_runners", "copy_tbps")
        }
        rows.append(run_row(kind="layer_step_meta", subject=subject, provider=combo_name(attn, moe), config=meta,
                            metric="build", unit="s", value=float(log.get("build_s") or 0.0), env=env_v))  # fmt: skip
        rows[-1]["command"] = command
    return rows


def render_table(rows: list[dict], model: str) -> str:
    steps = [r for r in rows if r["kind"] == "layer_step"]
    lines = [f"# Layer step: {model} ({steps[0]['subject'] if steps else model})", ""]
    if steps:
        v = steps[0]["versions"]
        c = steps[0]["config"]
        lines += [
            f"GPU {v.get('gpu')}, driver {v.get('driver')}, torch {v.get('torch')}, triton {v.get('triton')}, "
            f"sglang {v.get('sglang')}, transformers {v.get('transformers')}, flashinfer {v.get('flashinfer-python')}; "
            f"measured {steps[0]['created_at']}; command `{steps[0]['command']}`; tree {c.get('tree_commit')}.",
            f"{c['layers']} MoE decoder layers of one TP{c['tp_shard']} rank, KV {c['kv_cache_dtype']}, page {c['page_size']}, "
            f"{c['quantization']}; copy rate {c['copy_tbps']:.2f} TB/s (read + write) measured in each worker. "
            "Step = replay of SGLang's captured decode graph (p50 of CUDA-event-timed replays). "
            "floor = (weights + KV bytes) / copy rate. default/this = SGLang default (attn=triton,moe=triton) p50 / this p50 "
            "(> 1: this is faster). err = max |logits - ref| / max |ref| against torch_native decode attention + "
            "SGLang triton MoE, eager, same weights, KV and tokens.",
            "",
            "| combination | mix | bs | ctx mean | step us p50 | floor us | step/floor | default/this | err | forward us |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sorted(steps, key=lambda r: (r["config"]["mix"], r["config"]["batch"], r["provider"])):
            c = r["config"]
            f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
            lines.append(
                f"| {r['provider']} | {c['mix']} | {c['batch']} | {c['context_mean']:.0f} | {r['p50']:.1f} | "
                f"{c['floor_us']:.1f} | {f(c['ratio_to_floor'])} | {f(c['default_over_this'], 3)} | "
                f"{'-' if c['max_rel_err_vs_ref'] is None else format(c['max_rel_err_vs_ref'], '.2e')} | {f(c['forward_us'], 0)} |"
            )
    errs = [r for r in rows if r["kind"] == "layer_step_error"]
    if errs:
        lines += ["", "Could not run:", ""]
        lines += [f"- {r['provider']}: {r['config']['error']}" for r in errs]
    meta = [r for r in rows if r["kind"] == "layer_step_meta"]
    if meta:
        lines += [
            "",
            "| worker | import s | build s | build+cells s | MoE runners seen |",
            "|---|---|---|---|---|",
        ]
        lines += [f"| {r['provider']} | {r['config'].get('import_s')} | {r['config'].get('build_s')} | "
                  f"{r['config'].get('run_s')} | {r['config'].get('moe_runners')} |" for r in meta]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="hy3")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--mixes", nargs="+", default=list(MIXES))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--skip", nargs="*", default=[], help="combinations attn:moe to leave out")
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    p.add_argument("--work", default="/tmp/layer_work")
    p.add_argument("--budget-s", type=float, default=420.0, help="wall time the workers get")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--combo", help=argparse.SUPPRESS)
    p.add_argument("--table", help="render the Markdown table of a layer_step .jsonl and exit")
    p.add_argument("--ship", action="store_true",
                   help="copy the jsonl (written, or given with --table) into the package's kernel tables")  # fmt: skip
    a = p.parse_args(argv)
    for m in a.mixes:
        if m not in MIXES:
            p.error(f"unknown mix {m!r} (one of {', '.join(MIXES)})")
    if a.table:
        path = Path(a.table)
        if not path.is_file():
            p.error(f"no such file: {path}")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        print(render_table(rows, a.model), end="")
        if a.ship:
            print(f"shipped {_ship(path)}")
        return 0
    if a.worker:
        return worker(a)
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())
