"""Where openenv_gym keeps what it builds for isolated envs: source snapshots and venvs."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DATA_ENV", "data_dir", "sources_dir", "venvs_dir"]

DATA_ENV = "OPENENV_GYM_DATA"
"""Overrides the data dir (tests point it at a temporary folder)."""


def data_dir() -> Path:
    """``$OPENENV_GYM_DATA`` if set, else ``$XDG_DATA_HOME/openenv_gym``, else ``~/.local/share/openenv_gym``."""
    override = os.environ.get(DATA_ENV)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME", "")
    # The XDG spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "openenv_gym"


def sources_dir() -> Path:
    """Snapshots of imported sources, one folder per content hash."""
    return data_dir() / "sources"


def venvs_dir() -> Path:
    """Venvs of isolated envs, one folder per hash of their requirements."""
    return data_dir() / "venvs"
