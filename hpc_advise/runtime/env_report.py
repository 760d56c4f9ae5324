"""Environment report for ``hpc-advise runtime check``: GPU, driver, CUDA, and the versions of the stack.

Package versions come from installed distribution metadata (``importlib.metadata``), so the report
imports neither torch nor SGLang just to name their versions; the GPU, driver and CUDA driver version
come from NVML (``pynvml`` from ``nvidia-ml-py``), the CUDA runtime torch was built with from
``torch.version.cuda`` (the one place torch is imported, only when it is installed). Anything missing
is reported as missing, never guessed.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util

MISSING = "missing"

# (label, distribution names to try in order)
PACKAGES: list[tuple[str, tuple[str, ...]]] = [
    ("torch", ("torch",)),
    ("triton", ("triton",)),
    ("sglang", ("sglang",)),
    ("flashinfer", ("flashinfer-python", "flashinfer_python", "flashinfer")),
    ("sglang-kernel", ("sglang-kernel", "sgl-kernel")),
    ("hpc-advise", ("hpc-advise",)),
]


def package_version(dists: tuple[str, ...]) -> str:
    for name in dists:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return MISSING


def _nvml() -> dict[str, str]:
    """GPU name(s), count, compute capability, driver and CUDA driver version from NVML."""
    try:
        import pynvml
    except ImportError:
        return {"gpu": f"{MISSING} (nvidia-ml-py not installed)"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver / no GPU: NVML raises its own error classes
        return {"gpu": f"{MISSING} (NVML: {exc})"}
    try:
        count = pynvml.nvmlDeviceGetCount()
        info: dict[str, str] = {"gpu_count": str(count)}
        if count:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            info["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            info["compute_capability"] = f"{major}.{minor}"
        else:
            info["gpu"] = f"{MISSING} (NVML sees no device)"
        driver = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        info["cuda_driver"] = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        return info
    finally:
        pynvml.nvmlShutdown()


def _torch_cuda() -> str:
    if importlib.util.find_spec("torch") is None:
        return MISSING
    import torch

    return str(torch.version.cuda) if torch.version.cuda else "none (CPU build of torch)"


def plugin_status(sglang: str, environ: dict | None = None) -> str:
    """Whether SGLang will load our plugin: entry point installed, SGLang version, SGLANG_PLUGINS."""
    import os

    from hpc_advise.runtime.sglang.plugin import NAME, SUPPORTED_SGLANG

    env = os.environ if environ is None else environ
    eps = [ep for ep in md.entry_points(group="sglang.srt.plugins") if ep.name == NAME]
    if not eps:
        return f"{MISSING} (entry point not installed: pip install hpc-advise)"
    if sglang == MISSING:
        return f"entry point installed ({eps[0].value}); sglang not installed"
    if sglang not in SUPPORTED_SGLANG:
        return f"inactive: sglang {sglang} not supported (supported: {', '.join(SUPPORTED_SGLANG)})"
    allowed = {x.strip() for x in env.get("SGLANG_PLUGINS", "").split(",") if x.strip()}
    if allowed and NAME not in allowed:
        return f"disabled by SGLANG_PLUGINS={env['SGLANG_PLUGINS']}"
    return f"active ({eps[0].value})"


def report() -> dict[str, str]:
    """Ordered mapping label -> value; absent pieces say ``missing`` and why when known."""
    out: dict[str, str] = {}
    nv = _nvml()
    out["gpu"] = nv.pop("gpu")
    for key in ("gpu_count", "compute_capability"):
        if key in nv:
            out[key] = nv[key]
    out["driver"] = nv.get("driver", MISSING)
    out["cuda_driver"] = nv.get("cuda_driver", MISSING)
    out["cuda_runtime (torch)"] = _torch_cuda()
    for label, dists in PACKAGES:
        out[label] = package_version(dists)
    out["sglang plugin"] = plugin_status(out["sglang"])
    return out


def local_gpu_name(rep: dict[str, str]) -> str | None:
    """The GPU name of a report, None when there is none."""
    gpu = rep.get("gpu", MISSING)
    return None if gpu.startswith(MISSING) else gpu
