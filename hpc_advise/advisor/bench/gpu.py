"""GPU memory and utilization sampled through NVML while a bench runs, when the server is on this host.

NVML is opened through ``gpu_probe.open_nvml`` (the advisor's one NVML entry); a host without NVML, or
a server elsewhere, samples nothing and the run says so. Samples are folded into running maxima and
means as they come, so a long run keeps no sample list.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlparse

SAMPLE_S = 0.5


def is_local(url: str) -> bool:
    """Whether ``url``'s host is this machine (loopback, or one of this host's names/addresses)."""
    host = urlparse(url).hostname or ""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        try:
            addr = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError):
            return False
    if addr.is_loopback:
        return True
    try:
        return str(addr) in {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False


class GpuSampler:
    """Samples every GPU of this host every ``SAMPLE_S``; ``result()`` gives the summary or the reason
    nothing was sampled."""

    def __init__(self, nvml=None) -> None:
        self.reason: str | None = None
        self.nvml = nvml
        self.handles: list = []
        self.n = 0
        self.mem_max = 0
        self.util_sum = 0.0
        self.util_max = 0.0
        self.name: str | None = None

    def open(self) -> bool:
        from hpc_advise.advisor import gpu_probe

        try:
            nvml = gpu_probe.open_nvml(self.nvml)
            count = nvml.nvmlDeviceGetCount()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            if self.handles:
                raw = nvml.nvmlDeviceGetName(self.handles[0])
                self.name = raw.decode() if isinstance(raw, bytes) else str(raw)
            self.nvml = nvml
        except Exception as exc:  # NvmlUnavailable and any NVMLError
            self.reason = f"no GPU sampling: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            return False
        if not self.handles:
            self.reason = "no GPU sampling: NVML sees no GPU"
            return False
        return True

    def sample(self) -> None:
        used, util = 0, 0.0
        for h in self.handles:
            used += int(self.nvml.nvmlDeviceGetMemoryInfo(h).used)
            util += float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        util /= len(self.handles)
        self.n += 1
        self.mem_max = max(self.mem_max, used)
        self.util_sum += util
        self.util_max = max(self.util_max, util)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.sample()
            except Exception as exc:  # a GPU that stops answering ends sampling, not the run
                self.reason = f"GPU sampling stopped: {exc}"
                return
            try:
                await asyncio.wait_for(stop.wait(), SAMPLE_S)
            except asyncio.TimeoutError:
                pass

    def close(self) -> None:
        if self.nvml is not None and self.handles:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass

    def result(self) -> dict:
        if not self.n:
            return {"reason": self.reason or "no GPU samples"}
        return {
            "gpu": self.name,
            "gpus": len(self.handles),
            "samples": self.n,
            "max_gpu_memory_used_gib": self.mem_max / 2**30,
            "mean_gpu_utilization_pct": self.util_sum / self.n,
            "max_gpu_utilization_pct": self.util_max,
        }
