"""Profiles: GPU (TOML) and model (JSON) profiles as package data, loaded into frozen dataclasses.

Imports only the standard library. Never imports torch, triton, ``kernels`` or ``runtime``.

- ``gpu.py``: ``GpuProfile`` (vendor figures + measured figures, ``rate()``, ``with_measured()``);
- ``model.py``: ``ModelProfile`` and the derived numbers (KV bytes per token, parameters, weight bytes);
- ``hf_config.py``: Hugging Face ``config.json`` -> ``ModelProfile``;
- ``measured.py``: overlay of a machine's measured figures stored in the knowledge base;
- ``registry.py``: name lookup over the shipped files ``gpus/*.toml`` and ``models/*.json``;
- ``resolve.py``: name -> profile resolution for the advisor (quantized re-uploads, aliases);
- ``cli.py``: ``hpc-advise profiles list|show``.
"""

from hpc_advise.profiles.gpu import GpuProfile
from hpc_advise.profiles.hf_config import from_hf_config
from hpc_advise.profiles.measured import get_local_gpu, latest_measurements, with_local_measurements
from hpc_advise.profiles.model import LinearAttention, ModelConfigError, ModelProfile
from hpc_advise.profiles.registry import (
    ProfileNotFound,
    find_gpu,
    get_gpu,
    get_model,
    list_gpus,
    list_models,
    load_config_json,
    normalize,
)

__all__ = [
    "GpuProfile",
    "LinearAttention",
    "ModelConfigError",
    "ModelProfile",
    "ProfileNotFound",
    "find_gpu",
    "from_hf_config",
    "get_gpu",
    "get_local_gpu",
    "get_model",
    "list_gpus",
    "latest_measurements",
    "list_models",
    "load_config_json",
    "normalize",
    "with_local_measurements",
]
