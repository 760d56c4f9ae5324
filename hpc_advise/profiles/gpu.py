"""GPU profiles: the frozen ``GpuProfile`` dataclass and its TOML loader.

One TOML file per GPU under ``profiles/gpus/``. Units are in the field names:

- ``memory_gib``: device memory in GiB (2**30 bytes);
- ``*_tbps``: terabytes per second (10**12 bytes/s); ``*_gbps``: gigabytes per second (10**9 bytes/s,
  bytes, not bits);
- ``*_tflops``: dense (no 2:4 sparsity) tensor-core rates in 10**12 FLOP/s; ``fp32_tflops`` is the
  non-tensor FP32 rate;
- ``nvlink_gbps``: NVLink bandwidth per GPU **per direction** (the datasheet's "900 GB/s" for H100/H200
  is both directions together, so 450 here). This is the ceiling that nccl-tests' bus bandwidth is
  compared against;
- ``nic_gbps``: inter-node (scale-out) bandwidth per GPU per direction, of the vendor's reference
  system (one 400 Gb/s ConnectX-7 per GPU on HGX H100/H200/B200 = 50); ``gpus_per_node``: GPUs that
  share one NVLink domain in that system (8 on HGX). Beyond it collectives cross the NIC;
- ``power_w``: board power (TDP) in watts; ``l2_mib``: L2 cache in MiB (the vendor's "MB").

The ``[vendor]`` table holds datasheet figures (with ``source``); the ``[measured]`` table holds figures
measured on a real machine (with ``source``: machine, date, command). ``GpuProfile.rate(name)`` returns
the measured value when there is one, else the vendor figure it stands for.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# measured name -> vendor attribute it falls back to
MEASURED_FALLBACK: dict[str, str] = {
    "copy_bw_tbps": "mem_bw_tbps",
    "mem_bw_tbps": "mem_bw_tbps",
    "bf16_tflops": "bf16_tflops",
    "fp8_tflops": "fp8_tflops",
    "tf32_tflops": "tf32_tflops",
    "fp32_tflops": "fp32_tflops",
    "allreduce_busbw_gbps": "nvlink_gbps",
    "allgather_busbw_gbps": "nvlink_gbps",
    "reducescatter_busbw_gbps": "nvlink_gbps",
    "alltoall_busbw_gbps": "nvlink_gbps",
    "memory_gib": "memory_gib",
}

VENDOR_FIELDS = (
    "memory_gib",
    "mem_bw_tbps",
    "bf16_tflops",
    "fp8_tflops",
    "fp4_tflops",
    "tf32_tflops",
    "fp32_tflops",
    "sm_count",
    "compute_capability",
    "nvlink_gbps",
    "pcie_gbps",
    "nic_gbps",
    "gpus_per_node",
    "power_w",
    "l2_mib",
)

# vendor figures a GPU may lack (no FP8 on A100, no NVLink on L40S, unpublished L2): None when absent
OPTIONAL_VENDOR_FIELDS = (
    "fp8_tflops",
    "fp4_tflops",
    "nvlink_gbps",
    "pcie_gbps",
    "nic_gbps",
    "gpus_per_node",
    "l2_mib",
)
DEFAULT_GPUS_PER_NODE = 8  # a profile that does not say: the usual 8-GPU server


@dataclass(frozen=True)
class GpuProfile:
    """One GPU model: vendor (datasheet) figures plus measured figures for the machine, if any.

    Rates that a GPU lacks (e.g. fp8 on A100) are ``None``.
    """

    key: str
    name: str
    aliases: tuple[str, ...]
    memory_gib: float
    mem_bw_tbps: float
    bf16_tflops: float
    fp8_tflops: float | None
    tf32_tflops: float
    fp32_tflops: float
    sm_count: int
    compute_capability: tuple[int, int]
    nvlink_gbps: float | None
    power_w: float
    l2_mib: float | None
    fp4_tflops: float | None = None
    pcie_gbps: float | None = None
    nic_gbps: float | None = None
    gpus_per_node: int | None = None
    vendor_source: str = ""
    measured: dict[str, float] = field(default_factory=dict)
    measured_source: str = ""

    def rate(self, name: str) -> float | None:
        """Measured ``name`` when present, else the vendor figure it falls back to.

        ``rate("copy_bw_tbps")`` falls back to ``mem_bw_tbps``; ``rate("allreduce_busbw_gbps")`` to
        ``nvlink_gbps``. Unknown names raise ``KeyError``.
        """
        if name in self.measured:
            return float(self.measured[name])
        vendor = MEASURED_FALLBACK.get(name, name if name in VENDOR_FIELDS else None)
        if vendor is None:
            raise KeyError(
                f"unknown rate {name!r}; known: {sorted(set(MEASURED_FALLBACK) | set(VENDOR_FIELDS))}"
            )
        value = getattr(self, vendor)
        return None if value is None else value

    @property
    def node_gpus(self) -> int:
        """GPUs of one node (one NVLink domain): the profile's ``gpus_per_node``, else 8."""
        return int(self.gpus_per_node or DEFAULT_GPUS_PER_NODE)

    def with_measured(self, measured: dict[str, float], source: str) -> GpuProfile:
        """A copy whose measured figures are overlaid by ``measured`` (e.g. from this machine's KB row)."""
        merged = dict(self.measured)
        merged.update({k: float(v) for k, v in measured.items() if v is not None})
        return dataclasses.replace(self, measured=merged, measured_source=source)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["aliases"] = list(self.aliases)
        d["compute_capability"] = list(self.compute_capability)
        return d


def gpu_from_toml(data: dict[str, Any], origin: str) -> GpuProfile:
    """Build a ``GpuProfile`` from a parsed TOML document; ``origin`` names the file in errors."""
    try:
        vendor = dict(data["vendor"])
        measured = dict(data.get("measured", {}))
        cc = vendor.pop("compute_capability")
        major, minor = (int(x) for x in str(cc).split("."))
        known = {f.name for f in dataclasses.fields(GpuProfile)}
        vendor_source = vendor.pop("source")
        unknown = set(vendor) - known
        if unknown:
            raise ValueError(f"unknown [vendor] fields {sorted(unknown)}")
        for name in OPTIONAL_VENDOR_FIELDS:
            vendor.setdefault(name, None)
        measured_source = measured.pop("source", "")
        if measured and not measured_source:
            raise ValueError("[measured] needs a source")
        return GpuProfile(
            key=data["key"],
            name=data["name"],
            aliases=tuple(data.get("aliases", ())),
            compute_capability=(major, minor),
            vendor_source=vendor_source,
            measured={k: float(v) for k, v in measured.items()},
            measured_source=measured_source,
            **vendor,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{origin}: malformed GPU profile: {exc!r}") from exc
