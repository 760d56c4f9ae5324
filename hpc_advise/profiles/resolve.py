"""Name -> profile resolution for the advisor: a model name, Hugging Face id or config.json path, or
a GPU name, to its shipped profile, including the model ids that only a quantized re-upload or a
point release tells apart from a shipped architecture."""

from __future__ import annotations

import functools
import re

from hpc_advise.profiles.registry import ProfileNotFound, get_gpu, get_model

ARCH_ALIASES = {"deepseek-v3.1": "deepseek-v3", "deepseek-v3.2": "deepseek-v3"}
_QUANT_SUFFIX = re.compile(r"[-_](fp8|nvfp4|fp4|mxfp4|awq|gptq|int4|w4a16|instruct)$", re.I)


@functools.lru_cache(maxsize=256)
def resolve_model(name: str):
    """A ModelProfile for a model name, HF id or config.json path; quantized re-uploads
    ('nvidia/DeepSeek-R1-NVFP4', 'Qwen/Qwen3-235B-A22B-FP8') map to their base architecture.
    Raises ``ProfileNotFound`` ("no model profile for ...")."""
    try:
        return get_model(name)
    except ProfileNotFound as first:
        base = name.rsplit("/", 1)[-1]
        for _ in range(3):
            base = _QUANT_SUFFIX.sub("", base)
        for cand in (base, ARCH_ALIASES.get(base.lower(), "")):
            if cand:
                try:
                    return get_model(cand)
                except ProfileNotFound:
                    continue
        raise ProfileNotFound(f"no model profile for {name!r} ({first})") from None


@functools.lru_cache(maxsize=64)
def resolve_gpu(name: str):
    """The GpuProfile for a GPU name. Raises ``ProfileNotFound`` ("no GPU profile for ...")."""
    try:
        return get_gpu(name)
    except ProfileNotFound as exc:
        raise ProfileNotFound(f"no GPU profile for {name!r} ({exc})") from None
