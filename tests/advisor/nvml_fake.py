"""A stand-in for the ``pynvml`` module: the hardware boundary faked in tests named ``*_fake_nvml``.

It raises pynvml's own exception classes and returns what NVML returns (objects with ``total``/``free``,
``busId`` bytes, process records with ``pid``/``usedGpuMemory``), for a configurable set of GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    total: int = 143771 * 2**20
    free: int = 143000 * 2**20
    cc: tuple[int, int] = (9, 0)
    links: int | None = 18  # None: NVLink unsupported
    ecc: bool | None = True  # None: unsupported
    mig: bool | None = False
    processes: list[tuple[int, int]] = field(default_factory=list)


class FakeNvml:
    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
    NVMLError_NoPermission = pynvml.NVMLError_NoPermission
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_P2P_CAPS_INDEX_NVLINK = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
    NVML_P2P_STATUS_OK = pynvml.NVML_P2P_STATUS_OK

    def __init__(self, gpus=(), init_error: type | None = None, driver="580.159.04", cuda=13000):
        self.gpus = list(gpus)
        self.init_error = init_error
        self.driver, self.cuda = driver, cuda
        self.initialized = False
        self.shutdown_calls = 0

    # --- library ---
    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error()
        self.initialized = True

    def nvmlShutdown(self):
        self.shutdown_calls += 1
        self.initialized = False

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return self.cuda

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlSystemGetNVMLVersion(self):
        return "13.580.159.04"

    def nvmlSystemGetProcessName(self, pid):
        return b"python3"

    def nvmlDeviceGetCount(self):
        assert self.initialized
        return len(self.gpus)

    # --- devices (a handle is the index) ---
    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return i

    def nvmlDeviceGetName(self, h):
        return self.gpus[h].name

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h:08d}-fake"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return self.gpus[h].cc

    def nvmlDeviceGetMemoryInfo(self, h):
        g = self.gpus[h]
        return SimpleNamespace(total=g.total, free=g.free, used=g.total - g.free)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980 if kind == pynvml.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980 if kind == pynvml.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700000

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return 700000

    def nvmlDeviceGetEccMode(self, h):
        if self.gpus[h].ecc is None:
            raise pynvml.NVMLError_NotSupported()
        return (int(self.gpus[h].ecc), int(self.gpus[h].ecc))

    def nvmlDeviceGetMigMode(self, h):
        if self.gpus[h].mig is None:
            raise pynvml.NVMLError_NotSupported()
        return (int(self.gpus[h].mig), int(self.gpus[h].mig))

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 35

    def nvmlDeviceGetNvLinkState(self, h, link):
        links = self.gpus[h].links
        if links is None:
            raise pynvml.NVMLError_NotSupported()
        if link >= 18:
            raise pynvml.NVMLError_InvalidArgument()
        return pynvml.NVML_FEATURE_ENABLED if link < links else 0

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.gpus[h].processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        both = self.gpus[a].links and self.gpus[b].links
        return pynvml.NVML_P2P_STATUS_OK if both else 2  # 2: NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return pynvml.NVML_TOPOLOGY_SYSTEM
