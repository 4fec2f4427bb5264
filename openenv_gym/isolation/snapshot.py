"""Snapshots: a frozen copy of an imported source in the data dir, secrets and caches left out.

An isolated import plays the snapshot, not the original: editing (or deleting) the original does
not change a running experiment until it is imported again. A folder is copied whole (its data
files included); a single file is copied with the sibling modules it imports (found statically,
transitively) and the requirement files next to it, since its folder may be anything (a home dir).

What is left out, and why: anything that could hold a secret (``.env*``, private keys,
``credentials.json``, ``secrets.*``, ``.netrc``, ``.pypirc``), version-control and cache folders
(``.git``, ``__pycache__``, ``.venv`` ...), and symlinks that lead out of the source. Each left-out
path is listed in :attr:`Snapshot.excluded` (the catalog records the list), never its content.
The snapshot folder is named by a hash of what it holds, so importing the same content twice
reuses one copy, and is written to a temporary name and renamed, so a crash leaves no half copy.
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

from openenv_gym.errors import SourceNotFound
from openenv_gym.isolation.paths import sources_dir

__all__ = ["SECRET_PATTERNS", "SKIPPED_DIRS", "Snapshot", "snapshot", "preview", "excluded_reason"]

SECRET_PATTERNS: tuple[str, ...] = (
    ".env", ".env.*", ".envrc", "*.env", "credentials.json", "credentials", "secrets.*", "secret.*",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    ".netrc", ".pypirc", ".npmrc", ".git-credentials", "*.kdbx",
)
"""File names (fnmatch, case-insensitive) that may hold a secret: never copied."""

SKIPPED_DIRS: tuple[str, ...] = (
    ".git", ".hg", ".svn", ".bzr", "__pycache__", ".venv", "venv", ".tox", ".nox", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", "node_modules", ".eggs", "*.egg-info",
    ".ssh", ".aws", ".gnupg", ".docker", ".kube",
)
"""Folder names left out: version control, caches, environments, and credential stores."""

REQUIREMENT_FILES = ("requirements.txt", "pyproject.toml")


class Snapshot(NamedTuple):
    """Where the copy is (``path``: the folder, or the file inside it) and what was left out."""

    path: Path
    root: Path
    excluded: list[str]


def excluded_reason(name: str, is_dir: bool) -> str | None:
    """Why a file or folder called ``name`` is left out of a snapshot (``None``: it is copied)."""
    lowered = name.lower()
    if is_dir:
        if any(fnmatch.fnmatchcase(lowered, p) for p in SKIPPED_DIRS):
            return "cache, environment or version-control folder"
        return None
    if any(fnmatch.fnmatchcase(lowered, p) for p in SECRET_PATTERNS):
        return "may hold a secret"
    if lowered.endswith((".pyc", ".pyo")):
        return "compiled cache"
    return None


def _walk(root: Path, excluded: list[str]) -> list[Path]:
    """Relative paths of the files of ``root`` to copy, in a stable order."""
    files: list[Path] = []
    real_root = root.resolve()
    for folder, dirs, names in os.walk(root, followlinks=False):
        here = Path(folder)
        keep = []
        for d in sorted(dirs):
            rel = (here / d).relative_to(root)
            if excluded_reason(d, True):
                excluded.append(f"{rel}/ ({excluded_reason(d, True)})")
            elif (here / d).is_symlink():
                excluded.append(f"{rel}/ (a symlink: folders are not followed)")
            else:
                keep.append(d)
        dirs[:] = keep
        for n in sorted(names):
            path, rel = here / n, (here / n).relative_to(root)
            reason = excluded_reason(n, False)
            if reason is None and path.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(real_root) or not target.is_file():
                    reason = "a symlink out of the source"
                elif excluded_reason(target.name, False):
                    reason = "a symlink to a file that may hold a secret"
            if reason is None and not path.is_file():
                reason = "not a regular file"
            if reason:
                excluded.append(f"{rel} ({reason})")
            else:
                files.append(rel)
    return files


def _local_imports(file: Path) -> list[str]:
    """Top-level module names ``file`` imports (absolute imports, and relative ones as siblings)."""
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (SyntaxError, ValueError, OSError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name.partition(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.module:
                names.append(node.module.partition(".")[0])
            if node.level:
                names += [a.name for a in node.names]
    return names


def _file_closure(file: Path, excluded: list[str]) -> list[Path]:
    """``file``, the sibling modules and packages it imports (transitively), and the requirement files."""
    folder = file.parent
    chosen: list[Path] = [Path(file.name)]
    todo, seen = [file], {file.name}
    while todo:
        for name in _local_imports(todo.pop()):
            module, package = folder / f"{name}.py", folder / name
            if module.is_file() and module.name not in seen:
                seen.add(module.name)
                chosen.append(Path(module.name))
                todo.append(module)
            elif package.is_dir() and (package / "__init__.py").is_file() and name not in seen:
                seen.add(name)
                inner: list[str] = []
                found = _walk(package, inner)
                chosen += [Path(name) / p for p in found]
                excluded += [f"{name}/{e}" for e in inner]
                todo += [package / p for p in found if p.suffix == ".py"]
    chosen += [Path(r) for r in REQUIREMENT_FILES if (folder / r).is_file() and r not in seen]
    return chosen


def _digest(root: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for rel in files:
        h.update(str(rel).encode() + b"\0")
        with open(root / rel, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()[:20]


def preview(source: str | os.PathLike[str]) -> tuple[Path, list[Path], list[str]]:
    """What :func:`snapshot` would copy, without copying: the root, the files under it, what is left out."""
    path = Path(source).expanduser()
    if not path.exists():
        raise SourceNotFound(f"import source {path} does not exist")
    path = path.resolve()
    excluded: list[str] = []
    if path.is_dir():
        return path, _walk(path, excluded), excluded
    reason = excluded_reason(path.name, False)
    if reason:
        raise SourceNotFound(f"{path} {reason}: it is not snapshotted")
    return path.parent, _file_closure(path, excluded), excluded


def snapshot(source: str | os.PathLike[str], name: str) -> Snapshot:
    """Copy ``source`` (a file or a folder) into the data dir; returns where the copy is.

    ``name`` (the catalog name) only prefixes the folder, for a human browsing the data dir.
    """
    root, files, excluded = preview(source)
    path = Path(source).expanduser().resolve()
    target = sources_dir() / f"{name}-{_digest(root, files)}"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        try:
            for rel in files:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / rel, staging / rel, follow_symlinks=True)
            try:
                staging.rename(target)
            except OSError:
                if not target.exists():  # another import of the same content won the race: fine
                    raise
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(staging)
    return Snapshot(target if path.is_dir() else target / path.name, target, excluded)
