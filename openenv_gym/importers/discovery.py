"""Discovery of installed environment packages: what the kinds' scanners share.

Every ``import openenv_gym`` registers the installed environment packages of each kind (Verifiers
environments, OpenEnv environments). Scanning every distribution's metadata costs about 0.1 s,
so each kind's result is cached in a small JSON file under a fingerprint of the installed set
(the names of the ``*.dist-info`` folders on the path): an install, an upgrade or an uninstall
changes the fingerprint and the next import scans again.

The cache names modules that will be served, so it is written ``0600`` and trusted only when it
belongs to this user and nobody else can write it.

Where a distribution's modules are (:func:`module_locations`): a regular install names them in
``top_level.txt`` or lists their files in ``RECORD``, beside the other installed packages. An
editable install (``pip install -e``: how environment authors install what they are writing)
lists neither: its ``RECORD`` holds a ``.pth`` file naming the project folder (hatchling's
default, setuptools with a ``src`` layout) or an import hook that maps module names to folders
(setuptools' ``__editable___*_finder.py``, the ``editables`` package's ``map_module`` calls).
Both are read as text; nothing is imported or run.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib import metadata

__all__ = ["cache_dir", "fingerprint", "cached_scan", "module_locations", "top_modules"]


def cache_dir() -> Path:
    """``$OPENENV_GYM_CACHE``, else ``$XDG_CACHE_HOME/openenv_gym``, else ``~/.cache/openenv_gym``."""
    base = os.environ.get("OPENENV_GYM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "openenv_gym")
    return Path(base)


def fingerprint(paths: list[str]) -> str:
    """A hash of the distributions installed on ``paths``: their metadata folders' names and
    modification times (a reinstall at the same version, e.g. ``pip install -e .`` after editing
    the entry points, rewrites the folder)."""
    digest = hashlib.sha256()
    for entry in paths:
        try:
            with os.scandir(entry or ".") as found:
                names = sorted(f"{e.name}:{e.stat().st_mtime_ns}" for e in found
                               if e.name.endswith((".dist-info", ".egg-info")))
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
    """The importable top-level modules a distribution installs (``top_level.txt``, else its
    files; an editable install's from where its ``.pth`` file or import hook points)."""
    names = _listed_modules(dist)
    for name in _editable_locations(dist, names):
        if name not in names:
            names.append(name)
    return names


def module_locations(dist: metadata.Distribution, paths: list[str]) -> dict[str, Path]:
    """Where each top-level module of ``dist`` is: a package folder or a ``.py`` file.

    A regular install's modules are looked up in ``paths`` (the folders scanned, usually
    ``sys.path``); an editable install's where its ``.pth`` file or import hook says.
    """
    listed = _listed_modules(dist)
    found = _editable_locations(dist, listed)
    for name in listed:
        if name not in found:
            where = _locate(name, paths)
            if where is not None:
                found[name] = where
    return found


def _listed_modules(dist: metadata.Distribution) -> list[str]:
    text = dist.read_text("top_level.txt")
    if text:
        return [n.strip() for n in text.splitlines() if n.strip()]
    names = []
    for f in dist.files or ():
        parts = f.parts
        if len(parts) == 1 and parts[0].endswith(".py") and not _is_hook(parts[0]):
            names.append(parts[0][:-3])
        elif len(parts) > 1 and parts[1] == "__init__.py" and not parts[0].endswith((".dist-info", ".egg-info")):
            names.append(parts[0])
    return names


def _locate(module: str, paths: list[str]) -> Path | None:
    for entry in paths:
        base = Path(entry or ".")
        for cand in (base / module / "__init__.py", base / f"{module}.py"):
            if cand.is_file():
                return cand.parent if cand.name == "__init__.py" else cand
    return None


def _is_hook(filename: str) -> bool:
    """An editable install's import hook module (setuptools' finder, the ``editables`` package's)."""
    return filename.startswith(("__editable__", "_editable_impl_")) and filename.endswith(".py")


_SKIP_IN_PROJECT = frozenset({"tests", "test", "setup", "conftest", "docs", "examples", "build", "dist"})


def _editable_locations(dist: metadata.Distribution, listed: list[str]) -> dict[str, Path]:
    """Module -> folder or file of an editable install, from the ``.pth`` folders and import hooks
    its ``RECORD`` lists (``listed``: names the distribution declares, preferred when given)."""
    found: dict[str, Path] = {}
    for f in dist.files or ():
        if len(f.parts) != 1:
            continue
        path = Path(str(dist.locate_file(f)))
        try:
            if f.name.endswith(".pth"):
                for line in path.read_text(errors="replace").splitlines():
                    line = line.strip()
                    if not line or line.startswith(("#", "import ", "import\t")):
                        continue
                    folder = Path(line) if os.path.isabs(line) else path.parent / line
                    for name, where in _project_modules(folder).items():
                        if not listed or name in listed:
                            found.setdefault(name, where)
            elif _is_hook(f.name):
                for name, where in _hook_mapping(path.read_text(errors="replace")).items():
                    found.setdefault(name, where)
        except (OSError, ValueError, SyntaxError, RecursionError):
            continue
    return found


def _project_modules(folder: Path) -> dict[str, Path]:
    """The top-level packages and modules in a folder a ``.pth`` file puts on ``sys.path``."""
    out: dict[str, Path] = {}
    try:
        children = sorted(folder.iterdir())
    except OSError:
        return out
    for child in children:
        name = child.stem if child.suffix == ".py" else child.name
        if name.startswith((".", "_")) or name in _SKIP_IN_PROJECT or not name.isidentifier():
            continue
        if child.is_dir() and (child / "__init__.py").is_file():
            out[name] = child
        elif child.is_file() and child.suffix == ".py":
            out[name] = child
    return out


def _hook_mapping(text: str) -> dict[str, Path]:
    """The module -> path mapping written into an editable import hook, read from its syntax tree.

    setuptools writes ``MAPPING: dict[str, str] = {"pkg": "/abs/path/pkg"}``; the ``editables``
    package writes ``F.map_module("pkg", "/abs/path/pkg/__init__.py")`` calls.
    """
    out: dict[str, Path] = {}
    tree = ast.parse(text)
    for node in ast.walk(tree):
        value = None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "MAPPING":
            value = node.value
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MAPPING" for t in node.targets):
            value = node.value
        if isinstance(value, ast.Dict):
            for k, v in zip(value.keys, value.values):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and isinstance(k.value, str) \
                        and isinstance(v.value, str) and "." not in k.value:
                    out[k.value] = _module_path(Path(v.value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "map_module" \
                and len(node.args) == 2 \
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
            name, target = node.args[0].value, node.args[1].value  # type: ignore[attr-defined]
            if "." not in name:
                out[name] = _module_path(Path(target))
    return out


def _module_path(target: Path) -> Path:
    """A package folder for its ``__init__.py``; anything else as given."""
    return target.parent if target.name == "__init__.py" else target
