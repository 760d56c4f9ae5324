"""Launch configs of the fused MoE: one frozen dataclass per path, and the reader of ``configs.json``.

A field exists only while a shipped ``configs.json`` entry or a default (``op.default_config``,
``op_small.default_small_config``) sets its key; the field name is the key in lower case. The first
fields of each class are required; the rest are optional launch variants whose ``None`` means "absent"
(the path's own default applies: 0, DN_TILES 1, DN_SPLIT 1, H_GROUP 128), so ``to_dict`` gives back
exactly the keys that were given and an entry round-trips unchanged.

- ``Config``: the regular path (routing pass, gate/up GEMM, down GEMM; ``op.py``).
- ``SmallConfig``: the small-T path (``"PATH": "small"``; ``op_small.py``).

What each key does is in ``op.py`` / ``op_small.py`` (module docstrings) and the kernel README. The
checks against a shape (tile forms, scale groups, TMA rows) stay in ``op.check_config`` /
``op.check_forms``: they need the problem, this module only the keys and their types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

CONFIG_PATH = Path(__file__).with_name("configs.json")
SMALL_PATH = "small"  # the value of the key PATH that selects SmallConfig


class ConfigError(ValueError):
    """A launch config whose keys or value types no path takes."""


class _Keys:
    """The dict form shared by both classes: upper-case keys, optional fields left out while None."""

    REQUIRED: tuple[str, ...] = ()

    @classmethod
    def keys(cls) -> frozenset[str]:
        """Every key the class takes (upper case), PATH included for the small path."""
        extra = {"PATH"} if cls is SmallConfig else set()
        return frozenset(f.name.upper() for f in fields(cls)) | extra

    @classmethod
    def from_dict(cls, d: dict):
        unknown = sorted(set(d) - cls.keys())
        if unknown:
            raise ConfigError(f"{cls.__name__} takes no keys {unknown}")
        missing = [k for k in cls.REQUIRED if k.upper() not in d]
        if missing:
            raise ConfigError(f"{cls.__name__} lacks {[k.upper() for k in missing]}")
        kw = {}
        for f in fields(cls):
            v = d.get(f.name.upper())
            if v is not None and type(v) is not int:
                raise ConfigError(f"{f.name.upper()}={v!r} must be an int")
            kw[f.name] = v
        return cls(**kw)

    def to_dict(self) -> dict:
        out = {"PATH": SMALL_PATH} if isinstance(self, SmallConfig) else {}
        out.update({f.name.upper(): getattr(self, f.name) for f in fields(self)})
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class Config(_Keys):
    """Regular path: BLOCK_M rows per routed block, gate/up (GU_*) and down (DN_*) GEMM tiles."""

    block_m: int
    gu_n: int
    gu_k: int
    split_k: int
    gu_group_m: int
    gu_warps: int
    gu_stages: int
    dn_n: int
    dn_k: int
    dn_group_m: int
    dn_warps: int
    dn_stages: int
    pdl: int | None = None
    route: int | None = None
    block_exit: int | None = None
    w_tma: int | None = None
    w_scalar: int | None = None
    gu_two_dots: int | None = None
    gu_swap_ab: int | None = None
    dn_swap_ab: int | None = None
    gu_half: int | None = None
    dn_half: int | None = None
    dn_tiles: int | None = None
    dn_a_tma: int | None = None
    gu_maxnreg: int | None = None
    dn_gluon: int | None = None
    dn_gluon_m: int | None = None

    REQUIRED = (
        "block_m",
        "gu_n",
        "gu_k",
        "split_k",
        "gu_group_m",
        "gu_warps",
        "gu_stages",
        "dn_n",
        "dn_k",
        "dn_group_m",
        "dn_warps",
        "dn_stages",
    )


@dataclass(frozen=True)
class SmallConfig(_Keys):
    """Small-T path (``"PATH": "small"``): gate/up (GU_*) and down (DN_*; DN_N = BLOCK_H) tiles, no routing pass."""

    gu_n: int
    gu_k: int
    split_k: int
    gu_warps: int
    gu_stages: int
    dn_n: int
    dn_k: int
    dn_warps: int
    dn_stages: int
    pre_q: int | None = None
    gu_red: int | None = None
    dn_split: int | None = None
    pdl: int | None = None
    prefetch: int | None = None
    fuse_quant: int | None = None
    h_group: int | None = None

    REQUIRED = ("gu_n", "gu_k", "split_k", "gu_warps", "gu_stages", "dn_n", "dn_k", "dn_warps", "dn_stages")


def parse(d: dict) -> Config | SmallConfig:
    """The dataclass of a launch config dict: ``SmallConfig`` with ``"PATH": "small"``, else ``Config``."""
    if not isinstance(d, dict):
        raise ConfigError(f"a launch config is a dict of keys, not {type(d).__name__}")
    path = d.get("PATH")
    if path is None:
        return Config.from_dict(d)
    if path != SMALL_PATH:
        raise ConfigError(f"PATH={path!r}: the only path named in a config is {SMALL_PATH!r}")
    return SmallConfig.from_dict(d)


ENTRY_KEYS = ("E", "H", "I", "top_k", "mode", "T")  # the key of a configs.json entry
MODES = ("tensor-static", "tensor-dynamic", "block-static", "block-dynamic")


def load_entries(path: Path = CONFIG_PATH) -> list[tuple[tuple, Config | SmallConfig]]:
    """``configs.json``'s entries as ((E, H, I, top_k, mode, T), config); a bad entry raises ConfigError
    naming the file and the entry's index."""
    if not path.exists():
        return []
    out = []
    for i, e in enumerate(json.loads(path.read_text()).get("entries", [])):
        try:
            key = tuple(e[k] for k in ENTRY_KEYS)
            if e["mode"] not in MODES:
                raise ConfigError(f"mode={e['mode']!r} is none of {MODES}")
            if not all(type(v) is int and v > 0 for k, v in zip(ENTRY_KEYS, key, strict=True) if k != "mode"):
                raise ConfigError(f"E, H, I, top_k and T must be positive ints, got {key}")
            out.append((key, parse(e["config"])))
        except KeyError as exc:
            raise ConfigError(f"{path}: entry {i}: lacks {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"{path}: entry {i}: {exc}") from None
    return out
