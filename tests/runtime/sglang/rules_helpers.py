"""Run a launch command's arguments through real SGLang 0.5.23's ``prepare_server_args`` +
``resolve_once`` in this process, with our plugin loaded and the GPU of a profile standing in for the
machine's.

SGLang reads the machine through ``get_platform()`` facts (is_sm90, device_capability, ...), which it
lets tests set with ``override_platform``, and in a few resolution steps through
``torch.cuda.get_device_capability``; both are set to the GPU profile's compute capability for the
duration of one resolution. Its memory-dependent defaults (chunked prefill, CUDA-graph batch sizes,
``mem_fraction_static``: ``arg_groups/memory_hook.py``) read the GPU's memory through
``get_device_memory_capacity`` (nvidia-smi on CUDA, None without CUDA), which the resolution steps that
call it (``MEMORY_READERS``) are given as the profile's memory. The prefill CUDA-graph default
(``model_executor/cuda_graph_config.default_prefill_backend``: breakable on CUDA, read through
``torch.cuda.is_available()``) is set to CUDA's, since SGLang sizes its memory reserve by it. Nothing of SGLang's resolution is replaced. The models are the shipped
profiles' config subsets written as config.json (``architectures`` added where a profile omits it: the
real checkpoints' configs carry them).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
from pathlib import Path

from tests.runtime.sglang.helpers import import_sglang

# architectures[0] of each shipped profile's model_type (the checkpoints' own config.json values)
ARCHITECTURES = {
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "glm_moe_dsa": "GlmMoeDsaForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "kimi_k25": "KimiK25ForConditionalGeneration",
    "llama": "LlamaForCausalLM",
    "minimax_m2": "MiniMaxM2ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "hy_v3": "HYV3ForCausalLM",
}
PROFILES = Path(__file__).resolve().parents[3] / "hpc_advise" / "profiles" / "models"


def model_dir(root: Path, key: str) -> str:
    """A folder with the shipped profile ``key``'s config as config.json (no weights, no tokenizer)."""
    data = json.loads((PROFILES / f"{key}.json").read_text(encoding="utf-8"))
    cfg = dict(data["config"])
    cfg.setdefault("architectures", [ARCHITECTURES[cfg["model_type"]]])
    cfg.setdefault("torch_dtype", "bfloat16")
    path = root / key
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return str(path)


def load():
    """Import SGLang's server args and load its plugins (ours among them); returns prepare_server_args.

    ``msgspec.structs.fields`` is memoized per class for this process: SGLang calls it on ``ServerArgs``
    twice per resolution and it re-evaluates the class's annotations each time (43 % of a resolution's
    time); a class's fields do not change, so the answers are the same."""
    import functools

    import msgspec.structs

    if not hasattr(msgspec.structs.fields, "cache_info"):
        msgspec.structs.fields = functools.lru_cache(maxsize=None)(msgspec.structs.fields)
    import_sglang("sglang.srt.server_args", "sglang.srt.plugins")
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    return prepare_server_args


def _facts(sm: tuple[int, int]) -> dict:
    major = sm[0]
    return dict(
        is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False, is_mps=False,
        is_sm90=major == 9, is_sm100=major == 10, is_sm100_or_sm110=major in (10, 11), is_sm110=major == 11,
        is_sm120=major == 12, is_blackwell=major >= 10, is_hopper_with_cuda_12_3=major == 9,
        has_amx=False, has_flashinfer=True, device_sm=major * 10 + sm[1], device_capability=sm,
    )  # fmt: skip


@contextlib.contextmanager
def gpu(sm: tuple[int, int], memory_gib: float | None = None):
    """SGLang sees a CUDA GPU of compute capability ``sm`` (and ``memory_gib`` GiB of memory; None: the
    memory is unknown, as without nvidia-smi) inside this block."""
    import torch
    from sglang.srt.model_executor import cuda_graph_config as graphs
    from sglang.srt.runtime_context import override_platform

    readers = [importlib.import_module(m) for m in MEMORY_READERS]
    saved = torch.cuda.get_device_capability, [m.get_device_memory_capacity for m in readers]
    saved_prefill = graphs.default_prefill_backend
    torch.cuda.get_device_capability = lambda *a, **k: sm
    graphs.default_prefill_backend = lambda: graphs.Backend.BREAKABLE
    mib = None if memory_gib is None else float(memory_gib) * 1024
    for m in readers:
        m.get_device_memory_capacity = lambda device=None: mib
    try:
        with override_platform(**_facts(sm)):
            yield
    finally:
        torch.cuda.get_device_capability = saved[0]
        graphs.default_prefill_backend = saved_prefill
        for m, fn in zip(readers, saved[1], strict=True):
            m.get_device_memory_capacity = fn


# the resolution modules that import utils.common.get_device_memory_capacity by name
MEMORY_READERS = (
    "sglang.srt.arg_groups.memory_hook",
    "sglang.srt.arg_groups.kv_shard_hook",
    "sglang.srt.arg_groups.model_overrides.qwen3_vl",
)
FIXED = ["--device", "cuda", "--skip-tokenizer-init"]
_PARSER: list = []
_MODEL_CONFIGS: dict[tuple, object] = {}


def parse_fast(args: list[str]):
    """``prepare_server_args(args)`` with its argparse parser built once (building it is most of the
    call's time); the record equals prepare_server_args' (``test_parse_fast_is_prepare_server_args``)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    if not _PARSER:
        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        _PARSER.append(parser)
    raw = _PARSER[0].parse_args(args)
    raw._radix_eviction_policy_explicitly_set = any(a.startswith("--radix-eviction-policy") for a in args)
    return ServerArgs.from_cli_args(raw)


def resolve(prepare_server_args, args: list[str], *, fast: bool = False):
    """``prepare_server_args`` + ``resolve_once`` (SGLang's INFO/WARNING lines silenced); returns the
    record, or raises what SGLang or our plugin raised. ``fast``: the parser built once, and the
    ``ModelConfig`` of a (model path, --quantization) pair built once and handed to later records the
    way SGLang's ``model_config_of`` takes a fixture's (it reads nothing else our commands vary)."""
    previous = logging.root.manager.disable
    if previous < logging.WARNING:  # each call clears every logger's cache: only when it changes
        logging.disable(logging.WARNING)
    try:
        argv = [*args, *FIXED]
        sa = parse_fast(argv) if fast else prepare_server_args(argv)
        key = (sa.model_path, sa.quantization)
        if fast and key in _MODEL_CONFIGS:
            sa._model_config = _MODEL_CONFIGS[key]
        sa.resolve_once()
        if fast and key not in _MODEL_CONFIGS and getattr(sa, "_model_config", None) is not None:
            _MODEL_CONFIGS[key] = sa._model_config
        return sa
    finally:
        if previous < logging.WARNING:
            logging.disable(previous)
