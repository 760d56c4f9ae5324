"""Name -> profile resolution for the advisor: a model name, Hugging Face id or config.json path, or
a GPU name, to its shipped profile, including the model ids that only a quantized re-upload or a
point release tells apart from a shipped architecture."""

from __future__ import annotations

import functools
import re

from hpc_advise.profiles.registry import ProfileNotFound, get_gpu, get_model

ARCH_ALIASES = {"deepseek-v3.1": "deepseek-v3", "deepseek-v3.2": "deepseek-v3"}
_QUANT_SUFFIX = re.compile(r"[-_](fp8|nvfp4|fp4|mxfp4|awq|gptq|int4|w4a16|instruct)$", re.I)
# A re-upload's suffix that names the weights' format (Qwen's and Z.ai's "-FP8" checkpoints are FP8
# with 128 x 128 block scales in their config.json; NVIDIA's "-NVFP4" are NVFP4).
_SUFFIX_QUANT = {"fp8": "fp8-block128", "nvfp4": "nvfp4", "fp4": "nvfp4", "mxfp4": "mxfp4"}


def _suffix_quant(name: str) -> str | None:
    base = name.rsplit("/", 1)[-1]
    for _ in range(3):
        m = _QUANT_SUFFIX.search(base)
        if not m:
            return None
        if m.group(1).lower() in _SUFFIX_QUANT:
            return _SUFFIX_QUANT[m.group(1).lower()]
        base = base[: m.start()]
    return None


def _with_suffix_quant(profile, name: str):
    """A bf16 profile reached through a quantized re-upload's id carries that id's weight format."""
    q = _suffix_quant(name)
    if q and profile.quantization in ("bf16", "fp16"):
        import dataclasses

        return dataclasses.replace(profile, quantization=q)
    return profile


@functools.lru_cache(maxsize=256)
def resolve_model(name: str):
    """A ModelProfile for a model name, HF id or config.json path; quantized re-uploads
    ('nvidia/DeepSeek-R1-NVFP4', 'Qwen/Qwen3-235B-A22B-FP8') map to their base architecture, with
    the weight format the suffix names when the base profile is bf16 (``-FP8`` = FP8 block-128).
    Raises ``ProfileNotFound`` ("no model profile for ...")."""
    try:
        return _with_suffix_quant(get_model(name), name)
    except ProfileNotFound as first:
        base = name.rsplit("/", 1)[-1]
        for _ in range(3):
            base = _QUANT_SUFFIX.sub("", base)
        for cand in (base, ARCH_ALIASES.get(base.lower(), "")):
            if cand:
                try:
                    return _with_suffix_quant(get_model(cand), name)
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
