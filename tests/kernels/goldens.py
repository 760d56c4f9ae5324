"""Bitwise goldens of the kernels: sha256 of the output bytes of fixed-seed small problems.

The goldens were recorded on the kernels before the issue-25 refactor (under the CPU interpreter, with the
interpreter patches of tests/conftest.py) and must stay equal through any change that claims not to touch
the arithmetic of a shipped form. ``HPC_ADVISE_RECORD_GOLDENS=1`` makes the golden tests write their
``goldens.json`` instead of comparing with it (only when the arithmetic is meant to change: say why in the
commit).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

RECORD = os.environ.get("HPC_ADVISE_RECORD_GOLDENS") == "1"


def digest(t: torch.Tensor) -> dict:
    """Shape, dtype and sha256 of the bytes of ``t`` (moved to the CPU, contiguous)."""
    c = t.detach().cpu().contiguous()
    raw = c.view(torch.uint8).numpy().tobytes() if c.numel() else b""
    return {"shape": list(c.shape), "dtype": str(c.dtype), "sha256": hashlib.sha256(raw).hexdigest()}


class Goldens:
    """The recorded digests of one kernel (``path``), by case id; records them with RECORD."""

    def __init__(self, path: Path):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}

    def check(self, case_id: str, out: torch.Tensor) -> None:
        got = digest(out)
        if RECORD:
            self.data[case_id] = got
            self.path.write_text(json.dumps(dict(sorted(self.data.items())), indent=1) + "\n")
            return
        assert case_id in self.data, f"no golden for {case_id} (record with HPC_ADVISE_RECORD_GOLDENS=1)"
        assert got == self.data[case_id], f"{case_id}: output differs from its golden"
