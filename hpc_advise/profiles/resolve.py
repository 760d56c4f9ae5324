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
# SGLang's quantization method for those checkpoints (``ModelProfile.quant_method``)
_SUFFIX_METHOD = {"fp8-block128": "fp8", "nvfp4": "modelopt_fp4", "mxfp4": "mxfp4"}


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


def _family(scheme: str) -> str:
    """A weight format's family ('fp8-block128' and 'fp8-per-tensor' are both 'fp8'; bf16 and fp16
    are unquantized): an id's suffix changes the plan only when it names another family."""
    s = scheme.lower()
    return "none" if s in ("bf16", "fp16") else s.split("-", 1)[0]


_HF_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def _with_suffix_quant(profile, name: str):
    """The profile as reached through ``name``: a bf16 profile reached through a quantized re-upload's
    id carries that id's weight format; a Hugging Face id other than the profile's own (a re-upload,
    a fine-tune or point release of the same architecture) is the checkpoint to launch (``hf_id``),
    and a bare name whose suffix set the format names no checkpoint (``hf_id`` empty: the launch asks
    for ``--model-path``)."""
    import dataclasses
    from pathlib import Path

    changes = {}
    q = _suffix_quant(name)
    if q and _family(q) != _family(profile.quantization):
        changes["quantization"] = q
        changes["quant_method"] = _SUFFIX_METHOD[q]
    if _HF_ID.match(name) and name.lower() != profile.hf_id.lower() and not Path(name).expanduser().exists():
        changes["hf_id"] = name
    elif "quantization" in changes and "/" not in name:
        changes["hf_id"] = ""
    return dataclasses.replace(profile, **changes) if changes else profile


@functools.lru_cache(maxsize=256)
def resolve_model(name: str):
    """A ModelProfile for a model name, HF id or config.json path; quantized re-uploads
    ('nvidia/DeepSeek-R1-NVFP4', 'Qwen/Qwen3-235B-A22B-FP8') map to their base architecture, with
    the weight format the suffix names where the profile plans another (``-FP8`` = FP8 block-128;
    an FP8 profile keeps its own FP8 scheme) and the id as the checkpoint to launch.
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
