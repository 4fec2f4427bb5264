"""Discovery of installed environment packages: what the kinds' scanners share.

Every ``import openenv_gym`` registers the installed environment packages of each kind (Verifiers
environments, OpenEnv environments). Scanning every distribution's metadata costs about 0.1 s,
so each kind's result is cached in a small JSON file under a fingerprint of the installed set
(the names of the ``*.dist-info`` folders on the path): an install, an upgrade or an uninstall
changes the fingerprint and the next import scans again.

The cache names modules that will be served, so it is written ``0600`` and trusted only when it
belongs to this user and nobody else can write it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["cache_dir", "fingerprint", "cached_scan", "top_modules"]


def cache_dir() -> Path:
    """``$OPENENV_GYM_CACHE``, else ``$XDG_CACHE_HOME/openenv_gym``, else ``~/.cache/openenv_gym``."""
    base = os.environ.get("OPENENV_GYM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "openenv_gym")
    return Path(base)


def fingerprint(paths: list[str]) -> str:
    """A hash of the distributions installed on ``paths`` (their metadata folders' names)."""
    digest = hashlib.sha256()
    for entry in paths:
        try:
            names = sorted(n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
        digest.update(entry.encode() + b"\0" + "\0".join(names).encode() + b"\1")
    return digest.hexdigest()


def _trusted(path: Path) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def cached_scan(
    cache: Path,
    scan: Callable[[list[str]], list[dict[str, Any]]],
    paths: list[str] | None = None,
    *,
    use_cache: bool = True,
) -> list[dict[str, Any]]:
    """``scan(paths)`` (default ``sys.path``), answered from ``cache`` while the installed set is unchanged.

    A cache that cannot be read or written is ignored: discovery must never break an import.
    """
    paths = list(sys.path if paths is None else paths)
    key = fingerprint(paths)
    if use_cache and _trusted(cache):
        try:
            data = json.loads(cache.read_text())
            if data.get("fingerprint") == key:
                return list(data["envs"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    envs = scan(paths)
    if use_cache:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps({"fingerprint": key, "envs": envs}))
            os.replace(tmp, cache)
        except OSError:
            pass
    return envs


def top_modules(dist: metadata.Distribution) -> list[str]:
    """The importable top-level modules a distribution installs (``top_level.txt``, else its files)."""
    text = dist.read_text("top_level.txt")
    if text:
        return [n.strip() for n in text.splitlines() if n.strip()]
    names = []
    for f in dist.files or ():
        parts = f.parts
        if len(parts) == 1 and parts[0].endswith(".py"):
            names.append(parts[0][:-3])
        elif len(parts) > 1 and parts[1] == "__init__.py" and not parts[0].endswith((".dist-info", ".egg-info")):
            names.append(parts[0])
    return names
