"""GPU probe. NVML is the hardware boundary: tests named ``*_fake_nvml`` replace only the ``pynvml``
module (its own exception classes and return shapes, see nvml_fake.py); one test uses the real NVML."""

from __future__ import annotations

import pynvml
import pytest

from hpc_advise.advisor.gpu_probe import NvmlUnavailable, probe
from tests.advisor.nvml_fake import FakeGpu, FakeNvml


@pytest.mark.parametrize(
    "error,reason",
    [
        (pynvml.NVMLError_LibraryNotFound, "no NVIDIA driver"),
        (pynvml.NVMLError_DriverNotLoaded, "not loaded"),
        (pynvml.NVMLError_NoPermission, "no permission"),
        (pynvml.NVMLError_Unknown, "NVML failed to start"),
    ],
)
def test_init_failures_fake_nvml(error, reason):
    with pytest.raises(NvmlUnavailable, match=reason) as info:
        probe(FakeNvml(init_error=error))
    assert "--gpu h200" in info.value.hint
    assert "\n" not in str(info.value)


def test_no_gpu_fake_nvml():
    fake = FakeNvml(gpus=[])
    with pytest.raises(NvmlUnavailable, match="reports no GPU"):
        probe(fake)
    assert fake.shutdown_calls == 1


def test_two_h200_fake_nvml():
    fake = FakeNvml(gpus=[FakeGpu(processes=[(4242, 2**30)]), FakeGpu()])
    host = probe(fake)
    assert fake.shutdown_calls == 1
    assert (host.driver_version, host.cuda_driver_version) == ("580.159.04", "13.0")
    assert len(host.gpus) == 2
    g0 = host.gpus[0]
    assert (g0.name, g0.profile, g0.compute_capability) == ("NVIDIA H200", "h200", (9, 0))
    assert g0.memory_total_bytes == 143771 * 2**20 and g0.memory_free_bytes == 143000 * 2**20
    assert (g0.sm_clock_mhz, g0.sm_clock_max_mhz, g0.mem_clock_max_mhz) == (1980, 1980, 3201)
    assert g0.power_limit_w == 700.0 and g0.ecc_enabled is True and g0.mig_enabled is False
    assert g0.uuid == "GPU-00000000-fake" and g0.pci_bus_id == "00000000:18:00.0"
    assert g0.nvlink_active_links == 18
    assert g0.processes == [{"pid": 4242, "name": "python3", "used_memory_bytes": 2**30}]
    assert host.topology == [["X", "NV18"], ["NV18", "X"]]
    assert list(host.groups()) == ["NVIDIA H200"]
    d = host.to_dict()
    assert d["gpus"][1]["profile"] == "h200"


def test_unsupported_queries_are_none_and_unknown_gpu_has_no_profile_fake_nvml():
    fake = FakeNvml(
        gpus=[FakeGpu(name="NVIDIA H100 PCIe", links=None, ecc=None, mig=None), FakeGpu(links=None)]
    )
    host = probe(fake)
    g = host.gpus[0]
    assert g.profile is None
    assert g.ecc_enabled is None and g.mig_enabled is None and g.nvlink_active_links is None
    assert host.topology[0][1] == "SYS"
    assert set(host.groups()) == {"NVIDIA H100 PCIe", "NVIDIA H200"}


def test_real_nvml_answers_or_says_why():
    """No fake: on a machine without a GPU, NVML's real failure becomes NvmlUnavailable."""
    try:
        host = probe()
    except NvmlUnavailable as exc:
        assert exc.reason and exc.hint
    else:
        assert host.gpus and all(g.memory_total_bytes > 0 for g in host.gpus)
