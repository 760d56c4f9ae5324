"""Lookup of shipped profiles by name: ``get_gpu``, ``get_model``, ``list_gpus``, ``list_models``.

Names match case-insensitively after normalisation (``NVIDIA H200`` == ``h200``; spaces, ``_`` and
``-`` are equivalent). A GPU matches its key, an alias or an NVML device name listed in its file; a
model matches its key, an alias or its Hugging Face id. ``get_model`` also accepts a path to a
``config.json`` (or a directory holding one).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
import sys
from importlib import resources
from pathlib import Path

from hpc_advise.profiles.gpu import GpuProfile, gpu_from_toml
from hpc_advise.profiles.hf_config import from_hf_config
from hpc_advise.profiles.model import ModelConfigError, ModelProfile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class ProfileNotFound(KeyError):
    """No shipped profile matches the name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def normalize(name: str) -> str:
    s = name.strip().lower()
    s = re.sub(r"^nvidia[\s_-]+", "", s)
    return re.sub(r"[\s_\-]+", "-", s)


def _data_dir(kind: str):
    return resources.files("hpc_advise.profiles").joinpath(kind)


def _load_dir(kind: str, suffix: str, parse, build) -> dict:
    """Every ``*suffix`` file of the ``kind`` data folder, parsed and built into a profile, by key."""
    out = {}
    for entry in sorted(_data_dir(kind).iterdir(), key=lambda p: p.name):
        if entry.name.endswith(suffix):
            prof = build(parse(entry.read_text(encoding="utf-8"), entry.name), entry.name)
            out[prof.key] = prof
    return out


def _parse_toml(text: str, origin: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{origin}: {exc}") from exc


def _parse_json(text: str, origin: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{origin}:{exc.lineno}: {exc.msg}") from None


@functools.lru_cache(maxsize=1)
def _gpus() -> dict[str, GpuProfile]:
    return _load_dir("gpus", ".toml", _parse_toml, gpu_from_toml)


def model_from_json(data: dict, origin: str) -> ModelProfile:
    """A shipped model profile: our metadata plus a subset of the model's config.json."""
    try:
        return from_hf_config(
            data["config"],
            key=data["key"],
            hf_id=data["hf_id"],
            source=data["source"],
            aliases=tuple(data.get("aliases", ())),
            overrides=data.get("overrides"),
        )
    except KeyError as exc:
        raise ModelConfigError(f"{origin}: missing field {exc.args[0]!r}") from None
    except ModelConfigError as exc:
        raise ModelConfigError(f"{origin}: {exc}") from None


@functools.lru_cache(maxsize=1)
def _models() -> dict[str, ModelProfile]:
    return _load_dir("models", ".json", _parse_json, model_from_json)


def _names(key: str, aliases: tuple[str, ...], extra: tuple[str, ...] = ()) -> set[str]:
    return {normalize(n) for n in (key, *aliases, *extra) if n}


def _index(table: dict, extra=lambda p: ()) -> dict:
    """Normalised name -> the first profile (in ``table`` order) that answers to it."""
    out: dict = {}
    for prof in table.values():
        for n in _names(prof.key, prof.aliases, extra(prof)):
            out.setdefault(n, prof)
    return out


@functools.lru_cache(maxsize=1)
def _gpu_index() -> dict:
    return _index(_gpus())


@functools.lru_cache(maxsize=1)
def _model_index() -> dict:
    return _index(_models(), extra=lambda p: (p.hf_id, p.hf_id.split("/")[-1]))


def _lookup(name: str, index: dict):
    return index.get(normalize(name))


def _not_found(kind: str, name: str, keys: list[str]) -> ProfileNotFound:
    close = difflib.get_close_matches(normalize(name), keys, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ProfileNotFound(f"no {kind} profile named {name!r}{hint} (known: {', '.join(keys)})")


def get_gpu(name: str) -> GpuProfile:
    """The GPU profile for a key, alias or NVML device name."""
    prof = _lookup(name, _gpu_index())
    if prof is None:
        raise _not_found("GPU", name, sorted(_gpus()))
    return prof


def find_gpu(nvml_name: str) -> GpuProfile | None:
    """The GPU profile for an NVML device name, or None when none is shipped."""
    return _lookup(nvml_name, _gpu_index())


def list_gpus() -> list[GpuProfile]:
    return list(_gpus().values())


def get_model(name: str) -> ModelProfile:
    """The model profile for a key, alias, Hugging Face id, or a path to a config.json (or its dir)."""
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        return load_config_json(path)
    prof = _lookup(name, _model_index())
    if prof is None:
        raise _not_found("model", name, sorted(_models()))
    return prof


def load_config_json(path: str | Path) -> ModelProfile:
    """Parse a model's own config.json; errors name the file (and line for malformed JSON)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    except OSError as exc:
        raise ModelConfigError(f"{path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ModelConfigError(f"{path}: not a config.json (not UTF-8 text)") from None
    hf_id = str(data.get("_name_or_path") or path.parent.name) if isinstance(data, dict) else ""
    try:
        return from_hf_config(
            data, key=normalize(hf_id.split("/")[-1] or path.stem), hf_id=hf_id, source=str(path)
        )
    except ModelConfigError as exc:
        raise ModelConfigError(f"{path}: {exc}") from None


def list_models() -> list[ModelProfile]:
    return list(_models().values())
