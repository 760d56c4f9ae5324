"""Where hpc-advise keeps its files: the user data dir (``HPC_ADVISE_HOME`` overrides) and kb.db."""

from __future__ import annotations

import os
from pathlib import Path

ENV_HOME = "HPC_ADVISE_HOME"


def home() -> Path:
    """The directory for the knowledge base and caches (created on demand by writers)."""
    override = os.environ.get(ENV_HOME)
    if override:
        return Path(override).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("hpc-advise", appauthor=False))


def kb_path() -> Path:
    """Default location of the knowledge-base SQLite file."""
    return home() / "kb.db"


def cache_dir() -> Path:
    """Directory for derived, re-creatable files (fitted models, compiled tables)."""
    return home() / "cache"
