"""GPU probe: the only module that talks to NVML (``pynvml``, provided by ``nvidia-ml-py``).

``probe()`` reads every GPU's name, UUID, PCI bus id, compute capability, memory total/free, current
and maximum SM/memory clocks, power limit, ECC and MIG mode, temperature, active NVLink links and the
processes using it, plus the host's driver and CUDA driver versions and the GPU-to-GPU topology (NVLink
peer-to-peer or the PCIe level between each pair, as ``nvidia-smi topo -m`` prints it). Each GPU is
matched to a shipped GPU profile by its NVML name.

Queries a GPU does not support (ECC on some boards, MIG outside A100/H100/H200, ...) come back as
``None``. When NVML cannot be used at all (bindings missing, no driver, driver not loaded, no GPU),
``probe()`` raises ``NvmlUnavailable`` with a one-line reason. No torch here: the advisor runs on CPU
laptops.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hpc_advise.profiles import find_gpu

OFFLINE_HINT = "on a machine without GPUs, name the target GPU instead, e.g. `--gpu h200` (see `hpc-advise profiles list`)"

# nvmlDeviceGetTopologyCommonAncestor levels -> the labels of `nvidia-smi topo -m`
TOPOLOGY_LABELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine; the message is one line, the hint says what to do instead."""

    def __init__(self, reason: str, hint: str = OFFLINE_HINT) -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint


@dataclass
class GpuFacts:
    index: int
    name: str
    uuid: str | None
    pci_bus_id: str | None
    compute_capability: tuple[int, int] | None
    memory_total_bytes: int
    memory_free_bytes: int
    sm_clock_mhz: int | None
    sm_clock_max_mhz: int | None
    mem_clock_mhz: int | None
    mem_clock_max_mhz: int | None
    power_limit_w: float | None
    ecc_enabled: bool | None
    mig_enabled: bool | None
    temperature_c: int | None
    nvlink_active_links: int | None
    processes: list[dict[str, Any]] = field(default_factory=list)
    profile: str | None = None  # key of the matched GPU profile, None when none is shipped


@dataclass
class HostFacts:
    hostname: str
    driver_version: str | None
    cuda_driver_version: str | None
    nvml_version: str | None
    gpus: list[GpuFacts]
    # topology[i][j]: "X" on the diagonal, "NV<links>" for NVLink peer-to-peer, else the PCIe level
    topology: list[list[str]]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def groups(self) -> dict[str, list[GpuFacts]]:
        """GPUs grouped by NVML name (one knowledge-base ``gpus`` row per group)."""
        out: dict[str, list[GpuFacts]] = {}
        for g in self.gpus:
            out.setdefault(g.name, []).append(g)
        return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_nvml(nvml=None):
    """The started NVML module (``nvml`` defaults to ``pynvml``); ``NvmlUnavailable`` says why not.
    The caller shuts it down with ``nvmlShutdown()``."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            raise NvmlUnavailable("NVML Python bindings are missing (pip install nvidia-ml-py)") from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound:
        raise NvmlUnavailable("no NVIDIA driver: the NVML library (libnvidia-ml.so) was not found") from None
    except nvml.NVMLError_DriverNotLoaded:
        raise NvmlUnavailable("the NVIDIA driver is installed but not loaded") from None
    except nvml.NVMLError_NoPermission:
        raise NvmlUnavailable("no permission to open the NVIDIA driver (NVML)") from None
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML failed to start: {exc}") from None
    return nvml


def probe(nvml=None) -> HostFacts:
    """Read the host's GPUs through NVML. ``nvml`` defaults to the ``pynvml`` module."""
    nvml = open_nvml(nvml)
    try:
        return _read(nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _read(nvml) -> HostFacts:
    def opt(fn: Callable, *args):
        """An optional query: None when NVML says it is unsupported or unavailable for this GPU."""
        try:
            return fn(*args)
        except nvml.NVMLError:
            return None

    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML cannot count the GPUs: {exc}") from None
    if count == 0:
        raise NvmlUnavailable("the NVIDIA driver is loaded but reports no GPU")

    cuda = opt(nvml.nvmlSystemGetCudaDriverVersion_v2) or opt(nvml.nvmlSystemGetCudaDriverVersion)
    handles, gpus = [], []
    for i in range(count):
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(nvml.nvmlDeviceGetName(h))
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML cannot read GPU {i}: {exc}") from None
        handles.append(h)
        cc = opt(nvml.nvmlDeviceGetCudaComputeCapability, h)
        pci = opt(nvml.nvmlDeviceGetPciInfo, h)
        power_mw = opt(nvml.nvmlDeviceGetEnforcedPowerLimit, h) or opt(
            nvml.nvmlDeviceGetPowerManagementLimit, h
        )
        ecc = opt(nvml.nvmlDeviceGetEccMode, h)
        mig = opt(nvml.nvmlDeviceGetMigMode, h)
        prof = find_gpu(name)
        gpus.append(
            GpuFacts(
                index=i,
                name=name,
                uuid=_text(u) if (u := opt(nvml.nvmlDeviceGetUUID, h)) is not None else None,
                pci_bus_id=_text(pci.busId) if pci is not None else None,
                compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
                memory_total_bytes=int(mem.total),
                memory_free_bytes=int(mem.free),
                sm_clock_mhz=opt(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
                sm_clock_max_mhz=opt(nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_SM),
                mem_clock_mhz=opt(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM),
                mem_clock_max_mhz=opt(nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_MEM),
                power_limit_w=power_mw / 1000.0 if power_mw else None,
                ecc_enabled=bool(ecc[0]) if ecc is not None else None,
                mig_enabled=bool(mig[0]) if mig is not None else None,
                temperature_c=opt(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
                nvlink_active_links=_active_links(nvml, h),
                processes=_processes(nvml, h, opt),
                profile=prof.key if prof else None,
            )
        )
    return HostFacts(
        hostname=socket.gethostname(),
        driver_version=_text(d) if (d := opt(nvml.nvmlSystemGetDriverVersion)) is not None else None,
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        nvml_version=_text(v) if (v := opt(nvml.nvmlSystemGetNVMLVersion)) is not None else None,
        gpus=gpus,
        topology=_topology(nvml, handles, gpus),
    )


def _active_links(nvml, h) -> int | None:
    """Active NVLink links of one GPU; None when the GPU has no NVLink (first query unsupported)."""
    active = 0
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(h, link)
        except nvml.NVMLError_NotSupported:
            return None if link == 0 else active
        except nvml.NVMLError:  # link index past this GPU's links, or unreadable
            break
        active += int(state == nvml.NVML_FEATURE_ENABLED)
    return active


def _processes(nvml, h, opt) -> list[dict[str, Any]]:
    procs = []
    for getter in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
        for p in opt(getter, h) or []:
            used = getattr(p, "usedGpuMemory", None)
            name = opt(nvml.nvmlSystemGetProcessName, p.pid)
            procs.append(
                {
                    "pid": int(p.pid),
                    "name": _text(name) if name is not None else None,
                    "used_memory_bytes": int(used) if isinstance(used, int) else None,
                }
            )
    return procs


def _topology(nvml, handles: list, gpus: list[GpuFacts]) -> list[list[str]]:
    n = len(handles)
    matrix = [["X"] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            try:
                p2p = nvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], nvml.NVML_P2P_CAPS_INDEX_NVLINK)
            except nvml.NVMLError:
                p2p = None
            if p2p == nvml.NVML_P2P_STATUS_OK:
                matrix[i][j] = f"NV{gpus[i].nvlink_active_links or ''}"
                continue
            try:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                matrix[i][j] = TOPOLOGY_LABELS.get(int(level), str(level))
            except nvml.NVMLError:
                matrix[i][j] = "?"
    return matrix
