"""The per-user catalog of imported environment sources.

``openenv-gym import`` detects an environment once and records the result here; ``import
openenv_gym`` then registers every entry as ``openenv/<name>-v0`` without detecting again. This
module owns the file: where it lives, its format, name validation and safe updates.

The file is JSON, ``{"version": 1, "entries": {name: entry}}``. Several processes may import at
once (a sweep launching jobs, two shells), so every read-modify-write holds an exclusive
``flock`` on a sibling lock file, and the new content replaces the old atomically: readers never
see a half-written file and need no lock.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import msgspec
from gymnasium.envs.registration import ENV_ID_RE

from openenv_gym.errors import CatalogError, InvalidName

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; writes stay atomic, not serialised
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CATALOG_ENV",
    "CATALOG_VERSION",
    "CatalogEntry",
    "catalog_path",
    "load_catalog",
    "add_entry",
    "remove_entry",
    "validate_name",
]

CATALOG_ENV = "OPENENV_GYM_CATALOG"
CATALOG_VERSION = 1
NAMESPACE = "openenv"


class CatalogEntry(msgspec.Struct, omit_defaults=True):
    """One imported source, enough to build its Gymnasium spec without re-detecting.

    ``source`` is absolute; ``module_file`` is relative to the source root (the folder, or the
    file's directory). ``options`` are extra kwargs later passed to ``gym.make``.
    """

    name: str
    kind: str
    source: str
    env_class: str | None = None
    env_name: str | None = None
    module_file: str | None = None
    sdk: str | None = None
    added_at: str = ""
    options: dict[str, Any] = {}


class _CatalogFile(msgspec.Struct):
    version: int = CATALOG_VERSION
    entries: dict[str, CatalogEntry] = {}


def catalog_path() -> pathlib.Path:
    """``$OPENENV_GYM_CATALOG`` if set, else ``$XDG_CONFIG_HOME/openenv_gym/catalog.json``."""
    override = os.environ.get(CATALOG_ENV)
    if override:
        return pathlib.Path(override).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    # The XDG spec says a relative XDG_CONFIG_HOME is invalid and must be ignored.
    base = pathlib.Path(xdg) if xdg and os.path.isabs(xdg) else pathlib.Path.home() / ".config"
    return base / "openenv_gym" / "catalog.json"


def validate_name(name: str) -> str:
    """Return ``name`` if ``openenv/<name>-v0`` is a Gymnasium id that parses back to it.

    Raises :class:`InvalidName` otherwise (empty, ``:``, ``/``, whitespace, other characters
    Gymnasium's id grammar rejects).
    """
    if not isinstance(name, str) or not name:
        raise InvalidName(f"environment name must be a non-empty string, got {name!r}")
    bad = sorted({c for c in name if c in ":/" or c.isspace()})
    if bad:
        raise InvalidName(f"environment name {name!r} must not contain {' '.join(map(repr, bad))}")
    env_id = f"{NAMESPACE}/{name}-v0"
    m = ENV_ID_RE.fullmatch(env_id)
    if m is None or (m["namespace"], m["name"], m["version"]) != (NAMESPACE, name, "0"):
        raise InvalidName(
            f"environment name {name!r} does not make a valid Gymnasium id ({env_id!r}); "
            "use letters, digits, '_', '-' and '.'"
        )
    return name


def _resolve(path: str | os.PathLike[str] | None) -> pathlib.Path:
    return pathlib.Path(path).expanduser() if path is not None else catalog_path()


def _read(path: pathlib.Path) -> dict[str, CatalogEntry]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CatalogError(f"cannot read the catalog {path}: {exc}") from exc
    try:
        data = msgspec.json.decode(raw, type=_CatalogFile)
    except msgspec.DecodeError as exc:
        raise CatalogError(f"the catalog {path} is corrupt ({exc}); fix or delete it") from exc
    if data.version != CATALOG_VERSION:
        raise CatalogError(
            f"the catalog {path} has format version {data.version}; this openenv_gym reads version "
            f"{CATALOG_VERSION} (was it written by a newer release?)"
        )
    for key, entry in data.entries.items():
        if key != entry.name:
            raise CatalogError(f"the catalog {path} is corrupt: entry {key!r} is named {entry.name!r}")
    return dict(data.entries)


def _write(path: pathlib.Path, entries: dict[str, CatalogEntry]) -> None:
    payload = msgspec.json.encode(_CatalogFile(entries=entries), order="sorted")
    payload = msgspec.json.format(payload, indent=2) + b"\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # Make the rename itself durable; not every filesystem lets a directory be fsynced.
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    """Exclusive lock for one read-modify-write of ``path`` (across processes)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A separate lock file: the catalog itself is replaced, so a lock on it would not hold.
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise CatalogError(f"cannot lock the catalog {path}: {exc}") from exc
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def load_catalog(path: str | os.PathLike[str] | None = None) -> dict[str, CatalogEntry]:
    """All entries by name; ``{}`` when the file does not exist. A bad file is a CatalogError."""
    return _read(_resolve(path))


def add_entry(entry: CatalogEntry, path: str | os.PathLike[str] | None = None, replace: bool = True) -> None:
    """Add ``entry``, stamping ``added_at`` if empty; an existing name is replaced unless ``replace=False``."""
    validate_name(entry.name)
    if not entry.added_at:
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        entry = msgspec.structs.replace(entry, added_at=now)
    target = _resolve(path)
    with _locked(target):
        entries = _read(target)
        if entry.name in entries and not replace:
            raise CatalogError(
                f"the catalog {target} already has an entry {entry.name!r} "
                f"(source {entries[entry.name].source}); remove it first or pick another name"
            )
        entries[entry.name] = entry
        try:
            _write(target, entries)
        except OSError as exc:
            raise CatalogError(f"cannot write the catalog {target}: {exc}") from exc


def remove_entry(name: str, path: str | os.PathLike[str] | None = None) -> CatalogEntry:
    """Remove and return the entry called ``name``; an unknown name is a CatalogError."""
    target = _resolve(path)
    with _locked(target):
        entries = _read(target)
        if name not in entries:
            known = ", ".join(sorted(entries)) or "none"
            raise CatalogError(f"no catalog entry named {name!r} in {target}; known names: {known}")
        removed = entries.pop(name)
        try:
            _write(target, entries)
        except OSError as exc:
            raise CatalogError(f"cannot write the catalog {target}: {exc}") from exc
    return removed
