"""Layer-step benchmark: SGLang 0.5.23's own decoder layers, decode steps under CUDA graphs and extend steps
(issue 27).

What runs: SGLang's real ``ModelRunner`` (``ModelConfig``, KV pool, ``ScheduleBatch`` -> ``ForwardBatch``,
attention backends, MoE runners, its decode CUDA-graph runner) on a model whose decoder layers have one
rank's real shapes (``MODELS``: Hy3 ``HYV3DecoderLayer`` at TP8; Qwen3-235B ``Qwen3MoeDecoderLayer`` at TP4
and as an EP4 rank, Qwen3-30B at TP1; DeepSeek-V3 ``DeepseekV2DecoderLayer`` (MLA) at TP8 and as an EP8
rank), ``--load-format dummy`` random weights, ``num_hidden_layers`` = ``--layers`` MoE layers (dense
first layers left out) and a 1024-token vocabulary, so the step is the decoder layers plus a small head.
No all-reduce runs (one GPU, tp_size 1): the step is one rank's compute, not a TP step. An EP rank is
emulated by its local experts (``shard_config``). Every (decode attention, MoE runner, router) SGLang can
run here (``combos``) is one worker; for the MLA models (DeepSeek-V3) a chosen set that fits one call
(``MLA_COMBOS``): SGLang's default, our MLA decode attention beside it at SGLang's Triton MoE, what ``launch``
starts (our attention and MoE runner), and our MoE runner without its hand-off beside SGLang's Triton MoE.

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
attention and our runner's MoE layers computed by the pure-torch fp32 ``fused_moe_reference``, eager):
per token t, e_t = ||logits_t - ref_t|| / ||ref_t||; a row keeps the median of e over the batch's tokens,
its max and the fraction of tokens above ``TOKEN_ERR_TOL`` (0.25, its reason at the constant). A wrong kernel
moves the median; top-k routing flips of single tokens through the random layers (which made the earlier
max |logits - ref| / max |ref| over the batch 0.16-1.07 for every combination, SGLang's default included)
move only the fraction. Every cell row also records the paths its MoE layers took at that batch
(``moe_paths``: ``triton`` where our runner handed the bucket to SGLang's triton, the dispatch table's hand-off
from the shipped rows; ``hpc_advise.measured`` pairs no such cell) and ``moe_handoff`` (on for our runner, off
for ``hpc_advise-raw``: the same runner with the hand-off switched off in that worker, whose cells beside
SGLang's Triton at the same attention re-decide the hand-off).

sgl-kernel is not installed on the GPU machine (too large to carry): ``SGLANG_FORCE_FUSED_OP_BACKEND=torch``
puts RMSNorm, SiLU*mul, top-k and rotary on SGLang's torch paths in every combination (a cost common to all
of them), non-expert linears stay bf16 (``SGLANG_FP8_IGNORED_LAYERS``), experts are FP8 per-tensor (online
``--quantization fp8``, the Hy3 deployment's recipe; Qwen3 here too, whose checkpoints are block FP8) or, for the
``-block`` models, 128x128 blocks as DeepSeek-V3's checkpoint has them (``quantization_config`` in config.json),
where SGLang's DeepGEMM MoE runner (``--moe-runner-backend deep_gemm``, standard dispatch, no DeepEP) is timed too
when ``import deep_gemm`` works on the machine (``deep_gemm_skip_reason``; else the table says why not). SGLang's
pin, sgl-deep-gemm 0.2.3.post2, does not load against the GPU machine's torch 2.11 (an undefined c10 symbol), so
``gpu.sh``'s sglang stage builds DeepGEMM from carried source first (``.whl_deepgemm``, ``install_deepgemm``);
the few sgl-kernel names those paths still import are given SGLang's own twins (``_sgl_kernel_twins``).

Usage (GPU machine, SGLang carried as ``benchmarks/pack_sglang_carry.sh`` builds it)::

    python3 benchmarks/bench_layer.py --model hy3 --out $OUT        # all combinations, one table
    python3 benchmarks/bench_layer.py --model hy3 qwen3-30b --skip qwen3-30b:triton:triton:hpc_advise
                                                                     # several models, one GPU lock
    python3 benchmarks/bench_layer.py --table layer_step_hy3.jsonl   # Markdown table from the rows (CPU)
    python3 benchmarks/bench_layer.py --table benchmarks/results/layer_step_hy3.jsonl --ship
        # the committed rows into the package (hpc_advise/advisor/data/kernel_results/), where the advisor
        # and the dispatch table's MoE hand-off read them (benchmarks/ship.py; commit both copies)

The next device call's command, its workers per model and their expected times: benchmarks/README.md,
"Next layer-step call". Routing is not forced equal to the reference's (SGLang's ``TopK`` runs inside each
layer on that worker's own hidden states; feeding it the reference's ids would need a per-layer hook and the
reference's ids saved per cell): the per-token error's median is what separates a wrong kernel from flips.
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import json
import math
import os
import random
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PAGE = 64
VOCAB = 1024
BATCHES = (1, 8, 32, 64, 128, 256)
MIXES = ("uniform-2k", "mixed-1k-32k", "agentic")
MAX_CONTEXT = 32768
AGENTIC_TRACE = Path("examples") / "traces" / "agentic_coding.jsonl"

# One rank's shapes. Full-model numbers: hpc_advise/profiles/models/<key>.json. ``tp``: attention heads (and,
# with ``ep`` 1, expert widths) split that many ways; ``ep``: an expert-parallel rank, emulated on one GPU as
# its local experts (num_experts / ep at full width) with top_k / ep picks per token, the expected local share of
# the real top-k (the router then scores local experts only). ``gate_bytes``: the router weight's element size.
_HY3 = {
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
}
_QWEN3_235B = {
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
}
_QWEN3_30B = dict(
    _QWEN3_235B, hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, intermediate_size=6144,
    moe_intermediate_size=768,
)  # fmt: skip
# DeepSeek-V3 without its YaRN rope scaling (the decode step's rotary is a few hundred bytes either way) and
# without MTP; first_k_dense_replace 0 because the layers here are its MoE layers (58 of 61).
_DSV3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "first_k_dense_replace": 0,
    "moe_layer_freq": 1,
    "n_group": 8,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "num_nextn_predict_layers": 0,
    "attention_bias": False,
}
# How the experts are FP8: ``--quantization fp8`` on bf16 weights (per-tensor, online; the default), or a
# checkpoint's 128x128 blocks (``BLOCK``). Online quantization cannot make blocks.
ONLINE, BLOCK = "online", "block128"
BLOCK_QUANT_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}
MODELS = {
    "hy3": {"tp": 8, "ep": 1, "kv_cache_dtype": "auto", "gate_bytes": 4, "config": _HY3},
    # Qwen3 with bf16 KV takes fused_set_kv_buffer_arg, which the torch rotary path refuses: fp8 KV.
    "qwen3-235b": {"tp": 4, "ep": 1, "kv_cache_dtype": "fp8_e4m3", "gate_bytes": 2, "config": _QWEN3_235B},
    "qwen3-235b-ep4": {
        "tp": 4,
        "ep": 4,
        "kv_cache_dtype": "fp8_e4m3",
        "gate_bytes": 2,
        "config": _QWEN3_235B,
    },
    "qwen3-30b": {"tp": 1, "ep": 1, "kv_cache_dtype": "fp8_e4m3", "gate_bytes": 2, "config": _QWEN3_30B},
    "dsv3": {"tp": 8, "ep": 1, "kv_cache_dtype": "auto", "gate_bytes": 2, "config": _DSV3},
    # the EP8 rank keeps DeepSeek's shared expert whole: SGLang's DeepseekV2MoE calls its shared_experts
    # unconditionally (none -> TypeError), and a 1/8 share cannot be written as n_shared_experts; the floor
    # counts the whole expert (bf16, 88 MB a layer beside 1.4 GB of local FP8 experts)
    "dsv3-ep8": {"tp": 8, "ep": 8, "kv_cache_dtype": "auto", "gate_bytes": 2, "config": _DSV3},
    # DeepSeek-V3's own recipe: its checkpoint's 128x128-block FP8 experts (``quantization_config`` in config.json,
    # as the published checkpoint has it; random FP8 values and block scales), where the runners SGLang picks
    # from for it are its Triton, DeepGEMM (where ``deep_gemm`` imports: see the module docstring) and ours
    "dsv3-block": {
        "tp": 8,
        "ep": 1,
        "kv_cache_dtype": "auto",
        "gate_bytes": 2,
        "config": _DSV3,
        "recipe": BLOCK,
        "profile": "dsv3",
    },
    "dsv3-ep8-block": {
        "tp": 8,
        "ep": 8,
        "kv_cache_dtype": "auto",
        "gate_bytes": 2,
        "config": _DSV3,
        "recipe": BLOCK,
        "profile": "dsv3",
    },
}

ATTENTION = ("triton", "hpc_advise")
# ``hpc_advise-raw``: our runner with the dispatch table's MoE hand-off switched off in that worker only
# (``_disable_moe_handoff``, a benchmark-only control: no flag or variable of the package turns it off), so
# every bucket times our kernel. Beside SGLang's Triton at the same attention it is the pair that
# ``hpc_advise.measured`` decides the hand-off from; its rows say ``moe_runner`` hpc_advise, ``moe_handoff`` off.
RAW = "hpc_advise-raw"
MOE_RUNNERS = ("triton", "hpc_advise", RAW)
# SGLang's DeepGEMM MoE runner (standard dispatch -> deep_gemm's grouped FP8 GEMMs, contiguous in eager extend,
# masked under CUDA graphs): block-FP8 models only, and only where ``import deep_gemm`` works; every other worker
# runs with SGLang's DeepGEMM switched off (SGLANG_ENABLE_JIT_DEEPGEMM=0)
DEEP_GEMM = "deep_gemm"
ROUTERS = ("sglang", "hpc_advise")
# (decode attention, MoE runner, router); the numerical reference runs eager: SGLang's torch_native decode
# attention and ``reference``, our runner's layer with the pure-torch fp32 MoE (``_install_reference_moe``).
DEFAULT = ("triton", "triton", "sglang")
REFERENCE = ("torch_native", "reference", "sglang")
# The MLA models' workers, in GPU-lock order after SGLang's default: every GQA-style combination would be 7
# workers (SGLang's router only), over one call's budget for DeepSeek-V3's step (a worker after the first takes
# 25-40 s, the first and the reference more: benchmarks/README.md). These four answer the tables' questions:
# our MLA decode attention against SGLang's Triton MLA kernel at the same MoE runner, what ``launch`` starts,
# and the MoE hand-off pair (our runner without its hand-off beside SGLang's Triton at SGLang's attention).
MLA_COMBOS = (
    DEFAULT,
    ("hpc_advise", "triton", "sglang"),
    ("hpc_advise", "hpc_advise", "sglang"),
    ("triton", RAW, "sglang"),
)
PREFILL = (1024, 4096, 16384)
IGNORED_LINEARS = (
    "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head,"
    "q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,fused_qkv_a_proj_with_mqa"
)


def is_mla(model: str) -> bool:
    return "kv_lora_rank" in MODELS[model]["config"]


def recipe(model: str) -> str:
    return MODELS[model].get("recipe", ONLINE)


def quantization_text(model: str) -> str:
    if recipe(model) == BLOCK:
        return "fp8 experts 128x128 blocks (checkpoint recipe), bf16 linears"
    return "fp8 experts per-tensor (online), bf16 linears"


def subject_of(model: str) -> str:
    """The rows' subject: the model profile's short name (``profile``, else the key), its TP or EP rank."""
    spec = MODELS[model]
    name = spec.get("profile", model.removesuffix(f"-ep{spec['ep']}") if spec["ep"] > 1 else model)
    return f"{name}-ep{spec['ep']}-rank" if spec["ep"] > 1 else f"{name}-tp{spec['tp']}-rank"


def _keys(cfg: dict) -> tuple[str, str]:
    """(experts key, shared-experts key) of a config."""
    if "n_routed_experts" in cfg:
        return "n_routed_experts", "n_shared_experts"
    return "num_experts", "num_shared_experts"


_DEEP_GEMM_PROBE: list = []  # the probe's answer, once per process
_DEEP_GEMM_VERSION: list = []  # deep_gemm.__version__ where the probe imported it


def _probe_deep_gemm(timeout_s: float = 120.0) -> str | None:
    """None where ``import deep_gemm`` works in a fresh interpreter with this environment, else why not. A
    subprocess: a broken ``_C.so`` raises OSError at import, and a package without one would build it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("deep_gemm")
    except (ImportError, ValueError) as e:
        return f"deep_gemm not importable ({type(e).__name__}: {e})"
    if spec is None or not spec.origin:
        return "no deep_gemm package (carry .whl_deepgemm: bash benchmarks/gpu.sh carry deepgemm)"
    pkg = Path(spec.origin).parent
    if not (pkg / "_C.so").is_file():
        return f"deep_gemm at {pkg} has no _C.so (its import would build one; gpu.sh's install_deepgemm builds it)"
    code = "import deep_gemm; print(getattr(deep_gemm, '__version__', '?'))"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"import deep_gemm took over {timeout_s:.0f} s"
    if r.returncode:
        last = ((r.stderr or r.stdout).strip().splitlines() or ["no output"])[-1]
        return f"import deep_gemm failed: {last[:240]}"
    _DEEP_GEMM_VERSION[:] = (r.stdout.strip().splitlines() or ["?"])[-1:]
    return None


def deep_gemm_skip_reason() -> str | None:
    """Why SGLang's DeepGEMM MoE runner is left out on this machine (None: it runs), probed once."""
    if not _DEEP_GEMM_PROBE:
        _DEEP_GEMM_PROBE.append(_probe_deep_gemm())
    return _DEEP_GEMM_PROBE[0]


def combos(model: str) -> list[tuple[str, str, str]]:
    """Every (attention, MoE runner, router) SGLang can run for this model here, SGLang's default first;
    for MLA models ``MLA_COMBOS`` (our decode attention runs its MLA form there).
    Router: ours serves 64..512 experts in fp32 (Hy3) or bf16 (Qwen3) ReplicatedLinear gates; DeepSeek's
    bf16 MoEGate stays on SGLang's path under our hook, and an EP rank's 32 local experts are too few.
    DeepGEMM: block-FP8 models, where ``import deep_gemm`` works (``deep_gemm_skip_reason``), last (MLA models:
    at SGLang's Triton attention only)."""
    spec = MODELS[model]
    if is_mla(model):
        attns, out = ("triton",), list(MLA_COMBOS)
    else:
        attns, routers = ATTENTION, ROUTERS if spec["ep"] == 1 else ("sglang",)
        out = [(a, m, r) for a in attns for m in MOE_RUNNERS for r in routers if m != RAW or r == "sglang"]
    if recipe(model) == BLOCK and deep_gemm_skip_reason() is None:
        out += [(a, DEEP_GEMM, "sglang") for a in attns]
    out.sort(key=lambda c: c != DEFAULT)
    return out


def deep_gemm_note(model: str, state: str | None = None) -> str | None:
    """The table's one line on SGLang's DeepGEMM runner for a block-FP8 model (None for the others). ``state``: a
    row's ``versions['deep_gemm']`` (a version, or "not used: why"); default this machine's probe."""
    if recipe(model) != BLOCK:
        return None
    if state is None:
        why = deep_gemm_skip_reason()
        return "SGLang's DeepGEMM MoE runner: timed (moe=deep_gemm)." if why is None else (
            f"SGLang's DeepGEMM MoE runner: skipped, {why}.")  # fmt: skip
    if state.startswith("not used: "):
        return f"SGLang's DeepGEMM MoE runner: skipped, {state.removeprefix('not used: ')}."
    return f"SGLang's DeepGEMM MoE runner: timed (moe=deep_gemm, deep_gemm {state})."


# ---------------------------------------------------------------------------------------------- pure parts


def shard_config(model: str, layers: int) -> dict:
    """config.json of a model whose decoder layers have one rank's shapes: attention heads divided by the
    TP size (KV heads at least 1; MLA's latent KV is not split), expert widths by the TP size, or with
    ``ep`` > 1 the rank's local experts at full width and top_k / ep picks; ``layers`` MoE layers and a
    1024-token vocabulary."""
    spec = MODELS[model]
    tp, ep = spec["tp"], spec["ep"]
    cfg = dict(spec["config"])
    experts, shared = _keys(cfg)
    split = ["num_attention_heads", "intermediate_size"] + (["moe_intermediate_size"] if ep == 1 else [])
    for key in split:
        if cfg[key] % tp:
            raise ValueError(f"{model}: {key}={cfg[key]} does not split over TP{tp}")
        cfg[key] //= tp
    if not is_mla(model):
        cfg["num_key_value_heads"] = max(1, cfg["num_key_value_heads"] // tp)
    else:
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    if ep > 1:
        for key in (experts, "num_experts_per_tok"):
            if cfg[key] % ep:
                raise ValueError(f"{model}: {key}={cfg[key]} does not split over EP{ep}")
            cfg[key] //= ep
        if "n_group" in cfg:
            cfg.update(n_group=1, topk_group=1)
    if recipe(model) == BLOCK:
        cfg["quantization_config"] = dict(BLOCK_QUANT_CONFIG)
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
        pool = [json.loads(line)["input_length"] for line in _trace().read_text().splitlines() if line]
        return [min(max(rng.choice(pool), 256), MAX_CONTEXT) for _ in range(n)]
    raise ValueError(f"unknown mix {mix!r} (one of {', '.join(MIXES)})")


def _trace() -> Path:
    """The agentic example trace: in this checkout, or (a carried tree holds no examples/) in the checkout
    the device tool sent, ``$CARRY``."""
    for root in (ROOT, Path(os.environ.get("CARRY", ROOT))):
        if (root / AGENTIC_TRACE).is_file():
            return root / AGENTIC_TRACE
    raise FileNotFoundError(f"{AGENTIC_TRACE} is neither under {ROOT} nor under $CARRY")


def split_prefix(length: int) -> int:
    """Page-aligned cached prefix of a request with ``length`` context tokens; 1..64 tokens stay to
    extend (SGLang never caches a whole prompt)."""
    prefix = (length - 1) // PAGE * PAGE
    return prefix


def expected_distinct_experts(experts: int, top_k: int, tokens: int) -> float:
    """Experts touched by ``tokens`` tokens under uniform independent routing (the dummy weights' gate
    is close to that): E (1 - (1 - k/E)^T)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def step_bytes(cfg: dict, kv_bytes_per_elem: int, seq_lens: list[int], gate_bytes: int = 4) -> dict:
    """Fewest bytes one decode step reads: every weight it needs once (bf16 non-expert linears, the
    gate, FP8 experts the batch touches, the head) and every KV element of the batch once."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    experts, shared_key = _keys(cfg)
    e, k, inter = cfg[experts], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    layers, bs = cfg["num_hidden_layers"], len(seq_lens)
    if "kv_lora_rank" in cfg:  # MLA: q_a, q_b, kv_a (replicated), kv_b, o (heads split); latent KV
        ql, kvl, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
        attn_w = (h * ql + ql * heads * (nope + rope) + h * (kvl + rope) + kvl * heads * (nope + v)
                  + heads * v * h) * 2  # fmt: skip
        kv_per_token = (kvl + rope) * kv_bytes_per_elem
    else:
        d = cfg["head_dim"]
        q, kv = heads * d, cfg["num_key_value_heads"] * d
        attn_w = (h * (q + 2 * kv) + q * h) * 2
        kv_per_token = 2 * kv * kv_bytes_per_elem
    gate_w = h * e * gate_bytes
    shared = cfg.get(shared_key, 0) * 3 * h * inter * 2
    expert_w = expected_distinct_experts(e, k, bs) * 3 * h * inter  # fp8: 1 byte
    head = (VOCAB * h + bs * h) * 2
    kv_read = sum(seq_lens) * kv_per_token
    weights = layers * (attn_w + gate_w + shared + expert_w) + head
    return {
        "weight_bytes": int(weights),
        "kv_bytes": int(layers * kv_read),
        "bytes": int(weights + layers * kv_read),
    }


def combo_name(attn: str, moe: str, router: str = "sglang") -> str:
    """Provider name of a combination; SGLang's router is left unnamed (the names of the first table)."""
    return f"attn={attn},moe={moe}" + ("" if router == "sglang" else f",router={router}")


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


def _rescale_dummy_weights(model, seed: int = 1234) -> None:
    """Give SGLang's dummy weights (every element U(-1e-3, 1e-3)) a spread under which the decoder layers
    move the logits, so the output check can tell backends apart: weight matrices U(-a, a) with
    a = sqrt(3 / fan_in) (unit-variance outputs), norm weights 1. FP8 weights get values U(-1, 1)
    and their scales = a (per tensor ``<name>_scale``, online quantization; every 128x128 block's
    ``<name>_scale_inv``, a block checkpoint). Seeded by parameter name (the same
    values in every worker, different ones in every layer); runs where SGLang's ``initialize_dummy_weights`` ran,
    before any ``process_weights_after_loading``."""
    import torch

    state = model.state_dict()
    for name, param in state.items():
        if (
            not torch.is_floating_point(param)
            or name.endswith("_scale")
            or "scale" in name.rsplit(".", 1)[-1]
        ):
            continue
        leaf = name.rsplit(".", 1)[-1]
        if param.dim() == 1 and "norm" in name:
            param.fill_(1.0)
            continue
        if param.dim() < 2 or not leaf.endswith("weight"):
            continue
        a = math.sqrt(3.0 / param.shape[-1])
        g = torch.Generator(device=param.device).manual_seed(seed + zlib.crc32(name.encode()))
        if torch.finfo(param.dtype).bits < 16:
            tmp = torch.empty(param.shape, dtype=torch.float16, device=param.device).uniform_(
                -1, 1, generator=g
            )
            param.copy_(tmp.to(param.dtype))
            for scale in (state.get(f"{name}_scale"), state.get(f"{name}_scale_inv")):  # per tensor / blocks
                if scale is not None:
                    scale.fill_(a)
        else:
            param.uniform_(-a, a, generator=g)


def _install_reference_moe() -> None:
    """The reference worker's MoE: our runner's layers (``--moe-runner-backend hpc_advise``, the same
    loaded FP8 weights, scales and activation recipe) computed by ``fused_moe_reference`` (fp32 math,
    the intermediate quantized per 1x128 as the checkpoints' recipe does), with no hand-off to SGLang's
    triton. Eager only (the reference loops over experts with host syncs)."""
    from hpc_advise.kernels.fused_moe import op, reference

    def fused_moe(hidden, *args, config=None, out=None, **kwargs):
        del config, out
        return reference.fused_moe_reference(hidden, *args, **kwargs).to(hidden.dtype)

    op.fused_moe = fused_moe
    _disable_moe_handoff()


def _disable_moe_handoff() -> None:
    """No measured bucket at any shape in this worker: our runner's layers get no SGLang triton runner
    (``runtime/sglang/moe.py _attach_handoff`` asks ``dispatch.moe_buckets``), every call runs our kernel."""
    from hpc_advise.runtime import dispatch

    dispatch.moe_buckets = lambda shape: []


def _install_weight_rescale() -> None:
    """Wrap the dummy loader's ``initialize_dummy_weights`` (imported by name into the loader module)."""
    from sglang.srt.model_loader import loader

    original = loader.initialize_dummy_weights

    def initialize(model, *args, **kwargs):
        original(model, *args, **kwargs)
        _rescale_dummy_weights(model)

    loader.initialize_dummy_weights = initialize


def _server_argv(a, cfg_dir: str, attn: str, moe: str, max_tokens: int) -> list[str]:
    spec = MODELS[a.model]
    argv = [
        "--model-path", cfg_dir, "--skip-tokenizer-init", "--load-format", "dummy", "--dtype", "bfloat16",
        "--attention-backend", "triton", "--prefill-attention-backend", "triton",
        "--decode-attention-backend", attn, "--moe-runner-backend", "hpc_advise" if moe in ("reference", RAW) else moe,
        *(["--quantization", "fp8"] if recipe(a.model) == ONLINE else []),
        "--kv-cache-dtype", spec["kv_cache_dtype"], "--page-size", str(PAGE),
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
    """The GPU, one worker at a time, in ticket order (lowest live ticket first: the first model's
    combinations, SGLang's default first, whatever the import order). Each worker leaves
    ``<lock>.queue/<ticket>.<pid>`` while it lives; a ticket whose process is gone no longer counts. The
    flock is never released by hand: it goes with the process, so the next worker starts building only once
    this one's GPU memory is gone."""

    def __init__(self, path: Path, ticket: int):
        self.f = open(path, "a")
        self.queue = Path(f"{path}.queue")
        self.queue.mkdir(exist_ok=True)
        self.ticket = ticket
        self.mine = self.queue / f"{ticket:06d}.{os.getpid()}"
        self.mine.touch()
        atexit.register(self.mine.unlink, missing_ok=True)

    @staticmethod
    def _alive(pid: int) -> bool:
        try:  # a process that ended but is not reaped yet (a zombie) counts as gone
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    def wait_until_ahead(self, n: int) -> None:
        """Until at most ``n`` live workers are ahead (so dozens of queued workers do not all import
        SGLang at once, beside a worker being timed)."""
        while True:
            ahead = 0
            for entry in self.queue.iterdir():
                ticket, pid = entry.name.split(".")
                ahead += int(ticket) < self.ticket and int(pid) != os.getpid() and self._alive(int(pid))
            if ahead <= n:
                return
            time.sleep(0.5)

    def _first(self) -> bool:
        for entry in sorted(self.queue.iterdir()):
            ticket, pid = entry.name.split(".")
            if int(pid) == os.getpid():
                return True
            if int(ticket) < self.ticket and self._alive(int(pid)):
                return False
        return True

    def __enter__(self):
        while True:  # the queue is read again whenever the GPU is still busy: a lower ticket may have come
            if self._first():
                try:
                    fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    pass
            time.sleep(0.2)

    def __exit__(self, *exc):
        self.mine.unlink(missing_ok=True)


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


def _moe_paths(runner, tokens: int) -> list[str]:
    """The paths the MoE layers take for a call of ``tokens`` tokens: ``hpc_advise`` (our kernel),
    ``triton`` (SGLang's, our runner's hand-off included: ``runtime/sglang/moe.py path_for``), or the
    layer's own runner."""
    from hpc_advise.runtime.sglang.moe import path_for

    paths = set()
    for mod in runner.model.modules():
        method = getattr(mod, "quant_method", None)
        r = getattr(method, "runner", None)
        if r is None or not hasattr(r, "runner_backend"):
            continue
        name = str(getattr(r.runner_backend, "value", r.runner_backend))
        paths.add(path_for(method, tokens) if name == "hpc_advise" else name)
    return sorted(paths)


def _router_gates(runner) -> dict:
    """How many MoE gates our router GEMM serves, and how many it left on SGLang's GEMM."""
    from hpc_advise.runtime.sglang.router import MARK

    served = kept = 0
    for mod in runner.model.modules():
        state = getattr(mod, MARK, "absent")
        if state == "absent":
            continue
        if state is not None and state[1] is not None:
            served += 1
        else:
            kept += 1
    return {"ours": served, "sglang": kept}


def _fill_kv(runner, seed: int) -> None:
    """Seeded N(0, 1) values in every K and V buffer, or MLA's latent buffer (fp8 buffers get them rounded
    to e4m3)."""
    import torch

    pool = runner.token_to_kv_pool
    g = torch.Generator(device="cuda").manual_seed(seed)
    step = 1 << 20
    for bufs in (
        getattr(pool, "k_buffer", []),
        getattr(pool, "v_buffer", []),
        getattr(pool, "kv_buffer", []),
    ):
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


def _extend_batch(runner, tree, lens, prefixes, rng, tag: str):
    """A ScheduleBatch of requests with ``lens`` context tokens whose cached prefixes are ``prefixes``
    (already filled KV slots), after SGLang's ``prepare_for_extend``, and its ForwardBatch."""
    from array import array

    import torch
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    reqs = []
    for i, (length, prefix) in enumerate(zip(lens, prefixes, strict=True)):
        ids = torch.randint(0, VOCAB, (length,), generator=rng).tolist()
        req = Req(rid=f"{tag}-{i}", origin_input_text="", origin_input_ids=array("q", ids),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=8))  # fmt: skip
        req.full_untruncated_fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        req.extend_end = length
        req.prefix_len = int(prefix.numel())
        tree.prefixes[id(req)] = prefix
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
    return batch, ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)


def _quantiles(samples: list[float]) -> dict:
    samples = sorted(samples)
    q = lambda p: samples[min(len(samples) - 1, int(p * (len(samples) - 1) + 0.5))]  # noqa: E731
    return {"p20": q(0.2), "p50": q(0.5), "p80": q(0.8), "reps": len(samples)}


def _prefill_cell(runner, tree, length: int, seed: int, reference: bool, reps: int) -> dict:
    """One request of ``length`` new tokens (no cached prefix) through SGLang's extend, eager (SGLang
    captures no prefill graph by default): p50 of CUDA-event-timed ``ModelRunner.forward`` calls."""
    import torch

    rng = torch.Generator().manual_seed(seed * 104729 + length)
    empty = torch.empty(0, dtype=torch.int64, device=runner.device)
    _batch, fb = _extend_batch(runner, tree, [length], [empty], rng, f"prefill{length}")
    out = runner.forward(fb)
    logits = out.logits_output.next_token_logits.float().clone()
    row = {"tokens": length, "logits": logits.cpu(), "moe_paths": _moe_paths(runner, length)}
    if reference:
        return row
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    runner.forward(fb)
    samples = []
    for _ in range(reps):
        start.record()
        runner.forward(fb)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    row.update(_quantiles(samples))
    return row


def _cell(runner, tree, lens, prefix_tensors, seed, reference: bool, reps: int) -> dict:
    import torch

    bs = len(lens)
    rng = torch.Generator().manual_seed(seed * 7919 + bs)
    prefixes = [t[: split_prefix(n)] for t, n in zip(prefix_tensors[:bs], lens, strict=True)]
    batch, fb = _extend_batch(runner, tree, lens, prefixes, rng, str(bs))
    runner.forward(fb)
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    nxt = torch.randint(0, VOCAB, (bs,), generator=rng).to(runner.device)
    batch.input_ids = nxt.to(torch.int64)
    batch.prepare_for_decode()
    fb = ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)
    out = runner.forward(fb)
    logits = out.logits_output.next_token_logits.float().clone()
    row = {
        "bs": bs,
        "graph": bool(getattr(out, "can_run_graph", False)),
        "seq_lens": [n + 1 for n in lens],
        "moe_paths": _moe_paths(runner, bs),
    }
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
    row.update(_quantiles(samples))
    try:
        row["kernels"] = _profile_replays(graph.replay)
    except Exception as exc:  # the step's timing stands without the breakdown
        row["kernels_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    row["logits"] = logits.cpu()
    return row


# Kernel names that are torch's own CUDA ops (at::native elementwise / reduce / softmax / top-k / cat / index, and
# the cub sorts torch calls): in these steps they are the sgl-kernel stand-ins (RMSNorm, QK norm, SiLU*mul,
# top-k, rotary on SGLang's torch paths) plus the few copies and adds every combination shares.
TORCH_OP_MARKS = ("at::native", "at_cuda_detail", "at::cuda")
GEMM_MARKS = ("nvjet", "cutlass", "xmma", "gemm", "cublas")


def kernel_class(name: str) -> str:
    """``torch`` (torch's own ops: the stand-ins), ``gemm`` (cuBLAS / CUTLASS) or ``other`` (Triton and
    every other kernel: attention, MoE, router, SGLang's JIT twins)."""
    if any(m in name for m in TORCH_OP_MARKS):
        return "torch"
    if any(m in name.lower() for m in GEMM_MARKS):
        return "gemm"
    return "other"


def kernel_breakdown(events: list[tuple[str, float]], reps: int) -> dict:
    """Per-step kernel time by class and the heaviest kernels, from (name, µs) of ``reps`` profiled steps."""
    by_class = {"torch": 0.0, "gemm": 0.0, "other": 0.0}
    by_name: dict[str, float] = {}
    for name, us in events:
        by_class[kernel_class(name)] += us / reps
        by_name[name] = by_name.get(name, 0.0) + us / reps
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:10]
    return {
        "torch_ops_us": by_class["torch"],
        "gemm_us": by_class["gemm"],
        "other_kernels_us": by_class["other"],
        "kernels_us": sum(by_class.values()),
        "top_kernels": [[n[:160], round(us, 2)] for n, us in top],
    }


def _profile_replays(replay, reps: int = 5) -> dict:
    """Kernels of ``reps`` graph replays under torch's profiler (CUPTI reports each kernel a graph
    launches), grouped by ``kernel_breakdown``; copies and memsets are left out."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            replay()
        torch.cuda.synchronize()
    events = []
    for evt in prof.events():
        if "CUDA" not in str(getattr(evt, "device_type", "")):
            continue
        name = evt.name
        if "memcpy" in name.lower() or "memset" in name.lower():
            continue
        events.append((name, float(evt.device_time_total)))
    if not events:
        raise RuntimeError("the profiler saw no kernel of the replayed graph")
    return kernel_breakdown(events, reps)


def _tag(attn: str, moe: str, router: str) -> str:
    return f"{attn}__{moe}__{router}"


def worker(a) -> int:
    import torch

    attn, moe, router = a.combo.split(":")
    work = Path(a.work)
    name = combo_name(attn, moe, router)
    reference = (attn, moe, router) == REFERENCE
    log = {
        "combo": name,
        "attn": attn,
        "moe": moe,
        "router": router,
        "cells": [],
        "prefill": [],
        "errors": [],
    }
    out_json = work / f"{_tag(attn, moe, router)}.json"
    save = lambda: out_json.write_text(json.dumps(log))  # noqa: E731  (after every cell: a kill keeps them)
    lock = _Lock(Path(a.lock) if a.lock else work / "gpu.lock", a.ticket)  # in the queue before importing
    lock.wait_until_ahead(3)
    t0 = time.time()
    _sgl_kernel_twins()
    import sglang.srt.managers.schedule_batch  # noqa: F401  (import cost outside the lock)
    import sglang.srt.model_executor.model_runner  # noqa: F401

    _install_weight_rescale()
    if moe == "reference":
        _install_reference_moe()
    elif moe == RAW:
        _disable_moe_handoff()

    log["import_s"] = round(time.time() - t0, 1)
    mixes = {m: draw_lengths(m, max(a.batches), a.seed) for m in a.mixes}
    need = sum(sum(split_prefix(n) for n in lens) for lens in mixes.values())
    max_tokens = need + 1600 * 2 * PAGE + 8 * PAGE * len(a.batches) + sum(a.prefill) + 4 * PAGE
    with lock:
        t1 = time.time()
        try:
            runner = _build_runner(a, str(work / "model"), attn, moe, max_tokens)
        except Exception as exc:  # one line into the table, the worker's log has the traceback
            import traceback

            traceback.print_exc()
            log["errors"].append(
                f"build: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            )
            save()
            return 1
        log["build_s"] = round(time.time() - t1, 1)
        log["moe_runners"] = sorted(set(_moe_runners(runner).values()))
        log["router_gates"] = _router_gates(runner)
        log["max_total_num_tokens"] = int(runner.max_total_num_tokens)
        log["copy_tbps"] = _copy_rate_tbps()
        _fill_kv(runner, a.seed)
        save()
        alloc = runner.token_to_kv_pool_allocator
        tree = _TreeCache(runner, PAGE)
        for mix, lens_all in mixes.items():
            prefixes = [alloc.alloc(split_prefix(n)) for n in lens_all]
            if any(p is None for p in prefixes):
                log["errors"].append(f"{mix}: KV allocator ran out ({max_tokens} tokens)")
                continue
            for bs in a.batches:
                try:
                    row = _cell(runner, tree, lens_all[:bs], prefixes, a.seed, reference, a.reps)
                except Exception as exc:
                    import traceback

                    traceback.print_exc()
                    log["errors"].append(f"{mix} bs={bs}: {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                torch.save(row.pop("logits"), work / f"logits__{_tag(attn, moe, router)}__{mix}__{bs}.pt")
                row["mix"] = mix
                log["cells"].append(row)
                save()
                print(
                    f"[{name}] {mix} bs={bs} p50={row.get('p50', float('nan')):.1f}us graph={row['graph']} "
                    f"moe={'+'.join(row['moe_paths'])}",
                    flush=True,
                )
        log["decode_s"] = round(time.time() - t1, 1)
        for length in a.prefill:
            try:
                row = _prefill_cell(runner, tree, length, a.seed, reference, max(3, a.reps // 8))
            except Exception as exc:
                import traceback

                traceback.print_exc()
                log["errors"].append(f"prefill {length}: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            torch.save(row.pop("logits"), work / f"logits__{_tag(attn, moe, router)}__prefill__{length}.pt")
            log["prefill"].append(row)
            save()
            print(
                f"[{name}] prefill {length} p50={row.get('p50', float('nan')):.1f}us "
                f"moe={'+'.join(row['moe_paths'])}",
                flush=True,
            )
        log["run_s"] = round(time.time() - t1, 1)
    save()
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
    env["deep_gemm"] = _deep_gemm_version()
    return env


def _deep_gemm_version() -> str:
    """deep_gemm's version where it imports (built from carried source: no dist-info), else why not."""
    why = deep_gemm_skip_reason()
    return f"not used: {why}" if why is not None else (_DEEP_GEMM_VERSION or ["?"])[0]


def worker_env(moe: str, router: str) -> dict:
    """The environment of a worker process: SGLang's torch paths for the sgl-kernel ops, bf16 non-expert
    linears, no NVLink multicast, our router GEMM only for ``router`` hpc_advise and SGLang's DeepGEMM only for
    its own runner (set before SGLang is imported: it reads them then)."""
    return dict(
        os.environ,
        SGLANG_FORCE_FUSED_OP_BACKEND="torch",
        SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK="1",
        SGLANG_FP8_IGNORED_LAYERS=IGNORED_LINEARS,
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
        PYTHONUNBUFFERED="1",
        HPC_ADVISE_ROUTER_GEMM="1" if router == "hpc_advise" else "0",
        SGLANG_ENABLE_JIT_DEEPGEMM="1" if moe == DEEP_GEMM else "0",
        SGLANG_JIT_DEEPGEMM_PRECOMPILE="0",
    )


def driver(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work or f"/tmp/layer_work_{a.model}")
    a.work = str(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "model").mkdir(exist_ok=True)
    cfg = shard_config(a.model, a.layers)
    (work / "model" / "config.json").write_text(json.dumps(cfg, indent=1))
    todo = [c for c in combos(a.model) if ":".join(c) not in a.skip] + [REFERENCE]
    procs = []
    for i, (attn, moe, router) in enumerate(todo):
        cmd = [sys.executable, __file__, "--worker", "--combo", f"{attn}:{moe}:{router}", "--model", a.model,
               "--layers", str(a.layers), "--seed", str(a.seed), "--work", str(work), "--reps", str(a.reps),
               "--batches", *map(str, a.batches), "--mixes", *a.mixes, "--prefill", *map(str, a.prefill)]  # fmt: skip
        cmd += ["--ticket", str(a.ticket + i)] + (["--lock", a.lock] if a.lock else [])
        logf = open(out / f"worker_{a.model}__{_tag(attn, moe, router)}.log", "w")
        procs.append(subprocess.Popen(cmd, env=worker_env(moe, router), stdout=logf, stderr=subprocess.STDOUT))
        time.sleep(0.5)  # lock order = start order: the default combination builds first
    deadline = min(time.time() + a.budget_s, a.deadline or float("inf"))
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
    rows = collect(a, work, cfg, _versions())
    path = out / f"layer_step_{a.model}.jsonl"
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    (out / f"layer_step_{a.model}.md").write_text(render_table(rows, a.model, deep_gemm_note(a.model)))
    if deep_gemm_note(a.model):
        print(deep_gemm_note(a.model))
    print(render_summary(rows, a.model))
    return 0


def _ship(path: Path) -> Path:
    """benchmarks/ship.py: the advisor and the dispatch table read layer-step rows only from the package."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ship import ship

    return ship(path)


def _tree_commit() -> str | None:
    """The carried tree's commit (benchmarks/gpu.sh carry tree writes TREE_COMMIT at its root)."""
    f = ROOT / "TREE_COMMIT"
    return f.read_text().strip()[:12] if f.is_file() else os.environ.get("LAYER_TREE_COMMIT")


def several(a, argv: list[str]) -> int:
    """One driver per model, all at once, sharing one GPU lock (imports overlap others' GPU turns);
    the short tables last."""
    lock = a.lock or "/tmp/layer_gpu.lock"
    rest, drop = [], False
    for x in argv:  # argv without --model, --skip and their values
        if x in ("--model", "--skip"):
            drop = True
            continue
        if drop and not x.startswith("--"):
            continue
        drop = False
        rest.append(x)
    procs = []
    deadline = time.time() + a.budget_s
    for k, m in enumerate(a.model):
        names = {":".join(c) for c in combos(m)}
        skip = [c for c in a.skip if (c.split(":", 1)[1] if c.count(":") == 3 and c.startswith(m + ":") else c) in names
                and (c.count(":") == 2 or c.startswith(m + ":"))]  # fmt: skip
        cmd = [sys.executable, __file__, "--model", m, "--lock", lock, "--ticket", str(100 * k),
               "--deadline", str(deadline), *rest] + (["--skip", *skip] if skip else [])  # fmt: skip
        procs.append((m, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        time.sleep(1.0)
    rc = 0
    for _m, p in procs:
        out, _ = p.communicate()
        rc |= p.returncode
        print(out, flush=True)
    return rc


# Per-token error tolerance: ||logits_t - ref_t|| / ||ref_t|| above this is a token whose output is wrong.
# Why 0.25: the recipes compared here differ by quantization alone (SGLang's Triton per-tensor activations vs
# the reference's 1x128 groups, fp8 vs fp32 accumulation order) and the last call measured those at <= 0.13
# on single tokens (prefill, bs 1); a wrong kernel (wrong scale, expert, head or page) leaves a token's logits
# uncorrelated with or scaled off the reference: ~1.4 for an unrelated vector of the same norm, 1.0 for a
# factor-2 scale error. A top-k routing flip through the random layers is such a token too, but one of a few:
# so the median over the batch's tokens tells a wrong kernel (median > TOL) from routing flips (median below,
# a small fraction of tokens above).
TOKEN_ERR_TOL = 0.25


def token_errors(mine, ref, tol: float = TOKEN_ERR_TOL) -> dict:
    """Per-token relative L2 error of logits ``[tokens, vocab]`` against the reference's: its median, its
    max and the fraction of tokens above ``tol``."""
    import torch

    m, r = mine.float().reshape(-1, mine.shape[-1]), ref.float().reshape(-1, ref.shape[-1])
    if m.shape != r.shape:
        raise ValueError(f"logits {tuple(m.shape)} vs reference {tuple(r.shape)}")
    err = (m - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-30)
    err = torch.where(torch.isfinite(err), err, torch.full_like(err, float("inf")))
    return {
        "err_token_p50": float(err.median()),
        "err_token_max": float(err.max()),
        "err_tokens_over_tol": float((err > tol).float().mean()),
        "err_tol": tol,
    }


def _token_err(work: Path, mine: str, ref: str) -> dict:
    import torch

    ref_f, mine_f = work / f"logits__{ref}.pt", work / f"logits__{mine}.pt"
    if not (ref_f.exists() and mine_f.exists()):
        return dict.fromkeys(("err_token_p50", "err_token_max", "err_tokens_over_tol"), None) | {
            "err_tol": TOKEN_ERR_TOL
        }
    return token_errors(torch.load(mine_f), torch.load(ref_f))


def kernel_fields(cell: dict, floor_us: float) -> dict:
    """A decode cell's kernel breakdown and its step without torch's ops over the floor: what the step
    would be with free stand-ins, a lower bound for the step with sgl-kernel's fused ops (which cost
    something)."""
    k = cell.get("kernels")
    if not k:
        return {"kernels_error": cell.get("kernels_error")} if cell.get("kernels_error") else {}
    return dict(k, ratio_to_floor_excl_torch=(cell["p50"] - k["torch_ops_us"]) / floor_us)


def collect(a, work: Path, cfg: dict, env_v: dict) -> list[dict]:
    from hpc_advise.runtime.measure.harness import Timing, run_row

    spec = MODELS[a.model]
    logs = {}
    for c in [c for c in combos(a.model) if ":".join(c) not in getattr(a, "skip", [])] + [REFERENCE]:
        f = work / f"{_tag(*c)}.json"
        logs[c] = (
            json.loads(f.read_text()) if f.exists() else {"errors": ["worker wrote nothing"], "cells": []}
        )
    kvb = 1 if spec["kv_cache_dtype"].startswith("fp8") else 2
    subject = subject_of(a.model)  # qwen3-235b-ep4-rank
    command = " ".join(["python3", "benchmarks/bench_layer.py", *sys.argv[1:]])
    ref_tag = _tag(*REFERENCE)
    default = {(c["mix"], c["bs"]): c["p50"] for c in logs[DEFAULT].get("cells", []) if "p50" in c}
    default_pf = {c["tokens"]: c["p50"] for c in logs[DEFAULT].get("prefill", []) if "p50" in c}
    quant = quantization_text(a.model)
    emulation = (
        f"EP{spec['ep']} rank emulated: {cfg[_keys(cfg)[0]]} local experts at full width, top-{cfg['num_experts_per_tok']}"
        if spec["ep"] > 1 else None
    )  # fmt: skip
    rows = []
    for combo, log in logs.items():
        if combo == REFERENCE:
            continue
        attn, moe, router = combo
        tag = _tag(*combo)
        common = {
            "attention": attn, "moe_runner": "hpc_advise" if moe == RAW else moe, "router": router,
            "moe_handoff": "off" if moe == RAW else "on" if moe == "hpc_advise" else None, "layers": cfg["num_hidden_layers"],
            "kv_cache_dtype": spec["kv_cache_dtype"], "page_size": PAGE, "tp_shard": spec["tp"], "ep_shard": spec["ep"],
            "mla": is_mla(a.model), "emulation": emulation, "quantization": quant,
            "reference": combo_name(*REFERENCE) + " (eager)", "moe_runners_seen": log.get("moe_runners"),
            "router_gates": log.get("router_gates"), "copy_tbps": log.get("copy_tbps"),
            "sgl_kernel": "not installed; torch norms/activation/top-k/rotary (SGLANG_FORCE_FUSED_OP_BACKEND=torch)",
            "tree_commit": _tree_commit(),
        }  # fmt: skip
        for cell in log.get("cells", []):
            if "p50" not in cell:
                continue
            mix, bs = cell["mix"], cell["bs"]
            nbytes = step_bytes(cfg, kvb, cell["seq_lens"], spec["gate_bytes"])
            floor_us = nbytes["bytes"] / (log["copy_tbps"] * 1e12) * 1e6
            extra = dict(common, **{
                "mix": mix, "batch": bs, "context_mean": sum(cell["seq_lens"]) / bs, "context_max": max(cell["seq_lens"]),
                "cuda_graph": cell["graph"], "floor_us": floor_us, **nbytes, "ratio_to_floor": cell["p50"] / floor_us,
                "default_over_this": default[(mix, bs)] / cell["p50"] if (mix, bs) in default else None,
                **_token_err(work, f"{tag}__{mix}__{bs}", f"{ref_tag}__{mix}__{bs}"),
                "forward_us": cell.get("forward_us"), "moe_paths": cell.get("moe_paths"),
                **kernel_fields(cell, floor_us),
            })  # fmt: skip
            t = Timing(cell["p20"], cell["p50"], cell["p80"], cell["reps"])
            rows.append(run_row(kind="layer_step", subject=subject, provider=combo_name(*combo), config={},
                                metric="latency", unit="us", timing=t, env=env_v, extra=extra))  # fmt: skip
            rows[-1]["command"] = command
        for cell in log.get("prefill", []):
            if "p50" not in cell:
                continue
            n = cell["tokens"]
            extra = dict(common, **{
                "tokens": n, "tokens_per_s": n / (cell["p50"] * 1e-6),
                "default_over_this": default_pf[n] / cell["p50"] if n in default_pf else None,
                **_token_err(work, f"{tag}__prefill__{n}", f"{ref_tag}__prefill__{n}"),
                "prefill_attention": "triton", "moe_paths": cell.get("moe_paths"),
            })  # fmt: skip
            t = Timing(cell["p20"], cell["p50"], cell["p80"], cell["reps"])
            rows.append(run_row(kind="layer_prefill", subject=subject, provider=combo_name(*combo), config={},
                                metric="latency", unit="us", timing=t, env=env_v, extra=extra))  # fmt: skip
            rows[-1]["command"] = command
    for combo, log in logs.items():
        for e in log.get("errors", []):
            rows.append(run_row(kind="layer_step_error", subject=subject, provider=combo_name(*combo), config={"error": e},
                                metric="error", unit="", value=0.0, env=env_v))  # fmt: skip
            rows[-1]["command"] = command
        meta = {
            k: log.get(k)
            for k in ("import_s", "build_s", "decode_s", "run_s", "max_total_num_tokens", "moe_runners",
                      "router_gates", "copy_tbps")
        }  # fmt: skip
        rows.append(run_row(kind="layer_step_meta", subject=subject, provider=combo_name(*combo), config=meta,
                            metric="build", unit="s", value=float(log.get("build_s") or 0.0), env=env_v))  # fmt: skip
        rows[-1]["command"] = command
    return rows


def _f(x, p=2) -> str:
    return "-" if x is None else f"{x:.{p}f}"


def _e(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def _err(c: dict) -> str:
    """The two error columns of a row: median per-token error | fraction of tokens above the tolerance
    (rows written before the per-token metric have neither)."""
    frac = c.get("err_tokens_over_tol")
    return f"{_e(c.get('err_token_p50'))} | {'-' if frac is None else f'{frac:.0%}'}"


def render_table(rows: list[dict], model: str, note: str | None = None) -> str:
    """The model's table; ``note`` (the driver's ``deep_gemm_note``) is printed once under the header. Re-rendered
    from rows (``--table``), a block-FP8 model's note comes from the rows' ``versions['deep_gemm']``."""
    steps = [r for r in rows if r["kind"] == "layer_step"]
    pre = [r for r in rows if r["kind"] == "layer_prefill"]
    first = (steps or pre or [None])[0]
    lines = [f"# Layer step: {model} ({first['subject'] if first else model})", ""]
    dg = (first or {}).get("versions", {}).get("deep_gemm")
    if note is None and dg:
        note = deep_gemm_note(model, dg)
    if note:
        lines += [note, ""]
    if first:
        v, c = first["versions"], first["config"]
        lines += [
            f"GPU {v.get('gpu')}, driver {v.get('driver')}, torch {v.get('torch')}, triton {v.get('triton')}, "
            f"sglang {v.get('sglang')}, transformers {v.get('transformers')}, flashinfer {v.get('flashinfer-python')}; "
            f"measured {first['created_at']}; command `{first['command']}`; tree {c.get('tree_commit')}.",
            f"{c['layers']} MoE decoder layers of one {'EP' + str(c.get('ep_shard')) if (c.get('ep_shard') or 1) > 1 else 'TP' + str(c['tp_shard'])} "
            f"rank{' (MLA)' if c.get('mla') else ''}, KV {c['kv_cache_dtype']}, page {c['page_size']}, {c['quantization']}"
            f"{'; ' + c['emulation'] if c.get('emulation') else ''}; copy rate {_f(c.get('copy_tbps'))} TB/s "
            "(read + write) measured in each worker. "
            "Step = replay of SGLang's captured decode graph (p50 of CUDA-event-timed replays). "
            "floor = (weights + KV bytes) / copy rate. default/this = SGLang default (attn=triton,moe=triton) p50 / this p50 "
            "(> 1: this is faster). err p50 / >tol = median over the batch's tokens of ||logits_t - ref_t|| / ||ref_t|| "
            f"and the fraction of tokens above {TOKEN_ERR_TOL:g} (a wrong kernel moves the median, routing flips only the "
            "fraction) against the reference "
            f"({first['config'].get('reference')}: torch_native decode attention"
            + (" + SGLang triton MoE" if "moe=triton" in str(first['config'].get('reference')) else
               " + the pure-torch fp32 MoE on our runner's FP8 weights and recipe")
            + ", SGLang's router), same weights, KV and tokens.",
            "",
        ]  # fmt: skip
    if steps or pre:
        lines += [render_matrix(rows), ""]
    if steps:
        lines += [
            "| combination | mix | bs | ctx mean | step us p50 | floor us | step/floor | torch ops us | (step-torch)/floor | "
            "default/this | err p50 | >tol | forward us |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sorted(steps, key=lambda r: (r["config"]["mix"], r["config"]["batch"], r["provider"])):
            c = r["config"]
            lines.append(
                f"| {r['provider']} | {c['mix']} | {c['batch']} | {c['context_mean']:.0f} | {r['p50']:.1f} | "
                f"{c['floor_us']:.1f} | {_f(c['ratio_to_floor'])} | {_f(c.get('torch_ops_us'), 1)} | "
                f"{_f(c.get('ratio_to_floor_excl_torch'))} | {_f(c['default_over_this'], 3)} | "
                f"{_err(c)} | {_f(c.get('forward_us'), 0)} |"
            )
    if pre:
        lines += [
            "",
            "Prefill (extend) step, one request, no cached prefix, eager (SGLang's default captures no prefill graph), "
            "prefill attention SGLang's Triton in every combination (ours is decode-only):",
            "",
            "| combination | tokens | step us p50 | tokens/s | default/this | err p50 | >tol |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in sorted(pre, key=lambda r: (r["config"]["tokens"], r["provider"])):
            c = r["config"]
            lines.append(
                f"| {r['provider']} | {c['tokens']} | {r['p50']:.1f} | {c['tokens_per_s']:.0f} | "
                f"{_f(c['default_over_this'], 3)} | {_err(c)} |"
            )
    errs = [r for r in rows if r["kind"] == "layer_step_error"]
    if errs:
        lines += ["", "Could not run:", ""]
        lines += [f"- {r['provider']}: {r['config']['error']}" for r in errs]
    meta = [r for r in rows if r["kind"] == "layer_step_meta"]
    if meta:
        lines += [
            "",
            "| worker | import s | build s | decode cells s | build+all s | MoE runners seen | router gates ours/sglang |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in meta:
            c = r["config"]
            g = c.get("router_gates") or {}
            lines.append(
                f"| {r['provider']} | {c.get('import_s')} | {c.get('build_s')} | {c.get('decode_s')} | {c.get('run_s')} | "
                f"{c.get('moe_runners')} | {g.get('ours', '-')}/{g.get('sglang', '-')} |"
            )
    return "\n".join(lines) + "\n"


def _short(provider: str) -> str:
    """attn=hpc_advise,moe=triton,router=hpc_advise -> A:ours M:triton R:ours (moe=hpc_advise-raw: M:ours-raw)."""
    parts = dict(kv.split("=") for kv in provider.split(","))
    name = lambda v: v.replace("hpc_advise", "ours")  # noqa: E731
    return f"A:{name(parts['attn'])} M:{name(parts['moe'])} R:{name(parts.get('router', 'sglang'))}"


def render_matrix(rows: list[dict]) -> str:
    """One line per cell: SGLang's default step, its floor, and default / this for every other
    combination (> 1: faster than SGLang's default)."""
    cells: dict = {}
    for r in rows:
        if r["kind"] not in ("layer_step", "layer_prefill"):
            continue
        c = r["config"]
        key = (
            (c["mix"], c["batch"], c["context_mean"])
            if r["kind"] == "layer_step"
            else ("prefill", c["tokens"], None)
        )
        cells.setdefault(key, {})[r["provider"]] = (r["p50"], c.get("floor_us"))
    dflt = combo_name(*DEFAULT)
    others = sorted({p for got in cells.values() for p in got if p != dflt})
    lines = [
        "| cell | ctx mean | SGLang default us | floor us | default/floor | "
        + " | ".join(_short(p) for p in others)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(others),
    ]
    order = {m: i for i, m in enumerate(MIXES + ("prefill",))}
    for key in sorted(cells, key=lambda k: (order.get(k[0], 99), k[1])):
        got = cells[key]
        d = got.get(dflt, (None, None))
        ratios = [_f(d[0] / got[p][0] if d[0] and p in got else None) for p in others]
        floor = d[1]
        lines.append(
            f"| {key[0]} {key[1]} | {'-' if key[2] is None else f'{key[2]:.0f}'} | {_f(d[0], 1)} | {_f(floor, 1)} | "
            f"{_f(d[0] / floor if d[0] and floor else None)} | " + " | ".join(ratios) + " |"
        )
    return "\n".join(lines)


def render_summary(rows: list[dict], model: str) -> str:
    """Short table: per cell, SGLang's default, the fastest of ours, their ratio, the worst combination's median per-token error."""
    cells: dict = {}
    for r in rows:
        if r["kind"] not in ("layer_step", "layer_prefill"):
            continue
        c = r["config"]
        key = (c["mix"], c["batch"]) if r["kind"] == "layer_step" else ("prefill", c["tokens"])
        cells.setdefault(key, {})[r["provider"]] = (
            r["p50"],
            c.get("err_token_p50"),
            c.get("floor_us"),
            c.get("ratio_to_floor_excl_torch"),
        )
    dflt = combo_name(*DEFAULT)
    lines = [f"## {model}", "", "| cell | default us | best combination | best us | default/best | floor x | "
             "floor x without torch ops | worst err p50 |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for key in sorted(cells, key=lambda k: (k[0], k[1])):
        got = cells[key]
        best = min(got, key=lambda p: got[p][0])
        d = got.get(dflt, (None,))[0]
        errs = [v[1] for v in got.values() if v[1] is not None]
        floor, excl = got[best][2], got[best][3]
        lines.append(
            f"| {key[0]} {key[1]} | {_f(d, 1)} | {best} | {got[best][0]:.1f} | {_f(d / got[best][0] if d else None, 3)} | "
            f"{_f(got[best][0] / floor if floor else None)} | {_f(excl)} | {_e(max(errs) if errs else None)} |"
        )
    nerr = sum(1 for r in rows if r["kind"] == "layer_step_error")
    lines.append(f"({nerr} error rows)")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), nargs="+", default=["hy3"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--mixes", nargs="+", default=list(MIXES))
    p.add_argument(
        "--prefill", type=int, nargs="*", default=list(PREFILL), help="extend-step lengths (tokens)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--skip", nargs="*", default=[], help="combinations attn:moe:router to leave out")
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    p.add_argument("--work", default=None, help="scratch folder (default /tmp/layer_work_<model>)")
    p.add_argument("--lock", default=None, help="GPU lock file shared by drivers of several models at once")
    p.add_argument("--budget-s", type=float, default=420.0, help="wall time the workers get")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--combo", help=argparse.SUPPRESS)
    p.add_argument("--ticket", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--table", help="render the Markdown table of a layer_step .jsonl and exit")
    p.add_argument("--ship", action="store_true",
                   help="with --table: copy the jsonl into the package's kernel tables")  # fmt: skip
    argv = sys.argv[1:] if argv is None else list(argv)
    a = p.parse_args(argv)
    for c in a.skip:  # attn:moe:router, or model:attn:moe:router for one model only
        if c.count(":") not in (2, 3) or (c.count(":") == 3 and c.split(":")[0] not in MODELS):
            p.error(f"--skip {c!r}: give attn:moe:router or model:attn:moe:router")
    if len(a.model) > 1:
        if a.worker or a.table or a.work:
            p.error("--worker, --table and --work take one --model")
        return several(a, argv)
    a.model = a.model[0]
    a.skip = [c.split(":", 1)[1] if c.count(":") == 3 else c for c in a.skip
              if c.count(":") == 2 or c.split(":")[0] == a.model]  # fmt: skip
    for m in a.mixes:
        if m not in MIXES:
            p.error(f"unknown mix {m!r} (one of {', '.join(MIXES)})")
    if any(n < 1 or n > MAX_CONTEXT for n in a.prefill):
        p.error(f"prefill lengths must be 1..{MAX_CONTEXT}")
    names = {":".join(c) for c in combos(a.model)}
    for c in a.skip:
        if c not in names:
            p.error(f"unknown combination {c!r} for {a.model} (one of {', '.join(sorted(names))})")
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
