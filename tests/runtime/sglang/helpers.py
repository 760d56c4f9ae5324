"""Import real SGLang 0.5.23 on a CPU-only machine, for the runtime tests.

SGLang is installed with ``--no-deps`` plus ``requirements/sglang-cpu.txt``. One dependency cannot be
installed there: torchvision. Its PyPI wheels are CUDA builds whose ``_C.so`` links
``libtorch_cuda.so`` and fails to load against the CPU torch (checked with torchvision
0.28.0 and torch 2.13.0+cpu), and ``import sglang.srt.configs`` imports it at module level for two
image-preprocessing configs (deepseek_ocr, nano_nemotron_vl) our code never touches. So, only when the
real torchvision cannot be imported, ``import_sglang()`` installs a stand-in that provides the names
imported at module level (``InterpolationMode`` and the module tree) and nothing else: any real use
of it raises AttributeError. transformers is asked first whether torchvision is available (it caches the answer
False), so transformers never routes image processing through the stand-in. This is a packaging
boundary of CPU-only CI (the same reason there is no GPU), not a mock of anything we test. On a GPU
machine without sgl-kernel, ``import_sglang()`` also installs the import-only ``sgl_kernel`` stand-in of
``tests/runtime/sglang/sgl_kernel_stand_in.py`` (SGLang's CUDA branches import it at module level).

Also the runtime tests' random inputs: ``fresh_seed()`` draws a new seed per test (team rule: fresh
inputs every run; ``HPC_ADVISE_TEST_SEED=N`` replays one), and ``assert_close_seeded`` puts it in the
failure message and records the error / tolerance ratio in ``ERROR_RATIOS`` (read by seed sweeps).
"""

from __future__ import annotations

import enum
import importlib
import importlib.machinery
import json
import os
import sys
import types

import pytest
import torch

from tests.runtime.sglang import sgl_kernel_stand_in

_STAND_IN_MODULES = (
    "torchvision",
    "torchvision.transforms",
    "torchvision.transforms.functional",
    "torchvision.transforms.v2",
    "torchvision.transforms.v2.functional",
    "torchvision.io",
    "torchvision.ops",
)


class _InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"{self.__name__}.{name}: torchvision is a CPU-CI stand-in here (tests/runtime/sglang/helpers.py)"
        )


def _install_torchvision_stand_in() -> None:
    try:
        import torchvision  # noqa: F401

        return
    except Exception:
        pass
    for name in _STAND_IN_MODULES:
        sys.modules.pop(name, None)
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # cached False before the stand-in exists
    for name in _STAND_IN_MODULES:
        mod = _StandInModule(name)
        mod.__path__ = []
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        sys.modules[name] = mod
    for name in _STAND_IN_MODULES[1:]:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, sys.modules[name])
    sys.modules["torchvision.transforms"].InterpolationMode = _InterpolationMode
    sys.modules["torchvision.transforms.functional"].InterpolationMode = _InterpolationMode


ERROR_RATIOS: list[float] = []  # worst |got - want| / tolerance of each seeded check, in call order


def fresh_seed() -> tuple[int, torch.Generator]:
    """A seed drawn fresh for this test (``HPC_ADVISE_TEST_SEED`` replays one) and a CPU generator
    seeded with it; the global torch RNG is seeded too, for tensors made on the GPU."""
    env = os.environ.get("HPC_ADVISE_TEST_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    return seed, torch.Generator().manual_seed(seed)


def record_ratio(error: float, tolerance: float) -> float:
    ERROR_RATIOS.append(error / tolerance)
    return ERROR_RATIOS[-1]


def assert_close_seeded(got: torch.Tensor, want: torch.Tensor, *, atol: float, rtol: float, seed: int):
    """``torch.testing.assert_close`` (shapes, dtypes, |got - want| <= atol + rtol |want| everywhere)
    with the seed in its message; records max |got - want| / (atol + rtol |want|)."""
    if got.shape == want.shape:  # else assert_close reports the shapes
        err = (got.double() - want.double()).abs()
        ratio = torch.where(err == 0, 0.0, err / (atol + rtol * want.double().abs()))
        record_ratio(float(ratio.max()) if ratio.numel() else 0.0, 1.0)
    torch.testing.assert_close(
        got,
        want,
        atol=atol,
        rtol=rtol,
        msg=lambda m: f"{m}\n(seed {seed}: HPC_ADVISE_TEST_SEED={seed} replays it)",
    )


def import_sglang(*modules: str):
    """Import ``modules`` of real SGLang (skip the test when SGLang is not installed); returns the last."""
    pytest.importorskip("sglang", reason="real SGLang 0.5.23 is installed by scripts/test.sh")
    _install_torchvision_stand_in()
    sgl_kernel_stand_in.install()  # GPU machine without sgl-kernel only (see that module)
    mod = None
    for name in modules:
        mod = importlib.import_module(name)
    return mod


def tiny_model_dir(path, *, q_heads: int = 8, kv_heads: int = 2, head_dim: int = 64) -> str:
    """A directory holding a tiny Qwen3 config.json, enough for SGLang's ``prepare_server_args`` and
    ``ModelConfig`` on CPU (no weights, no tokenizer: pass ``--skip-tokenizer-init``)."""
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": q_heads * head_dim,
        "num_attention_heads": q_heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": 2,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
    }
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)
