"""Overlay a machine's measured figures (stored by ``hpc-advise profile --bench`` in the knowledge
base's ``gpus`` table) on a shipped GPU profile.

A ``gpus`` row's ``facts`` holds ``profile`` (the shipped key), ``measured`` (figure -> value, the
names of ``GpuProfile.measured``) and ``measured_source``. The newest row with measurements wins. The
knowledge base is passed in (anything with a ``gpus()`` method returning rows with decoded ``facts``),
so this module imports no database code.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpc_advise.profiles.gpu import GpuProfile
from hpc_advise.profiles.registry import get_gpu


def latest_measurements(gpu_rows: Iterable[dict], key: str) -> tuple[dict[str, float], str] | None:
    """(measured, source) of the newest row for profile ``key`` that has measurements, or None."""
    best = None
    for row in gpu_rows:
        facts = row.get("facts") or {}
        if facts.get("profile") == key and facts.get("measured"):
            if best is None or (row.get("id") or 0) > (best.get("id") or 0):
                best = row
    if best is None:
        return None
    facts = best["facts"]
    return dict(facts["measured"]), str(
        facts.get("measured_source") or f"knowledge-base gpus row {best.get('id')}"
    )


def with_local_measurements(profile: GpuProfile, gpu_rows: Iterable[dict]) -> GpuProfile:
    """``profile`` with this machine's measured figures overlaid, when the knowledge base has any."""
    found = latest_measurements(gpu_rows, profile.key)
    if found is None:
        return profile
    measured, source = found
    return profile.with_measured(measured, source)


def get_local_gpu(name: str, kb) -> GpuProfile:
    """``get_gpu(name)`` overlaid with the newest measurements stored in ``kb`` (a KnowledgeBase)."""
    return with_local_measurements(get_gpu(name), kb.gpus())
