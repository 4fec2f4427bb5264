"""The per-user catalog of imported environment sources.

``openenv-gym import`` detects an environment once and records the result here; ``import
openenv_gym`` then registers every entry as ``openenv/<name>-v0`` without detecting again. This
module owns the file: where it lives, its format, name validation and safe updates.

The file is JSON, ``{"version": 1, "entries": {name: entry}}``. Several processes may import at
once (a sweep launching jobs, two shells), so every read-modify-write holds an exclusive
``flock`` on a sibling lock file, and the new content replaces the old atomically: readers never
see a half-written file and need no lock.

The file is the user's to edit, so one bad entry (a name no Gymnasium id can hold, a missing
field, options nested thousands deep) must not cost the others: :func:`read_catalog` checks each
entry on its own, with the same rules as ``openenv-gym import``, and returns the bad ones apart,
with a reason each; :func:`remove_entry` deletes any entry, a bad one included, and writes every
other entry back byte for byte. Reading is linear in the number of entries.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import tempfile
import unicodedata
from collections.abc import Collection, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

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
    "CatalogContents",
    "CatalogEntry",
    "Isolation",
    "MAX_DEPTH",
    "REMOVE_HINT",
    "describe_invalid",
    "catalog_path",
    "read_catalog",
    "load_catalog",
    "add_entry",
    "remove_entry",
    "remove_invalid",
    "validate_name",
]

CATALOG_ENV = "OPENENV_GYM_CATALOG"
CATALOG_VERSION = 1
NAMESPACE = "openenv"
MAX_NAME_LENGTH = 128
MAX_DEPTH = 32
"""How deeply an entry may nest (the entry object counts 1, its ``options`` 2): ``options`` are
``gym.make`` kwargs, and deeper values break JSON encoders, ``copy.deepcopy`` and the decoder."""


class Isolation(msgspec.Struct, omit_defaults=True):
    """How an isolated import runs: in the venv built from ``requirements`` (under ``python``).

    ``venv`` is where it was built at import (``None`` if the build was left for the first
    ``gym.make``); ``excluded`` lists what the snapshot left out (paths, never contents).
    """

    requirements: list[str] = []
    python: str | None = None
    venv: str | None = None
    excluded: list[str] = []


class CatalogEntry(msgspec.Struct, omit_defaults=True):
    """One imported source, enough to build its Gymnasium spec without re-detecting.

    ``source`` is absolute; ``module_file`` is relative to the source root (the folder, or the
    file's directory). ``options`` are extra kwargs later passed to ``gym.make``. An isolated
    import plays a snapshot (``source`` is then the copy in the data dir) in its own venv
    (``isolated``); ``origin`` is where it was imported or installed from (a path, or a URL
    without credentials) and ``commit`` the pinned commit of a git install.
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
    isolated: Isolation | None = None
    origin: str | None = None
    commit: str | None = None


class _RawFile(msgspec.Struct):
    """The file with each entry left undecoded, so that entries are judged (and kept) one by one."""

    version: int = CATALOG_VERSION
    entries: dict[str, msgspec.Raw] = {}


class CatalogContents(NamedTuple):
    """What :func:`read_catalog` found: the good entries, and the bad ones' names with a reason each."""

    entries: dict[str, CatalogEntry]
    invalid: dict[str, str]


_ENTRY = msgspec.json.Decoder(CatalogEntry)
_RAW_FILE = msgspec.json.Decoder(_RawFile)


def catalog_path() -> pathlib.Path:
    """``$OPENENV_GYM_CATALOG`` if set, else ``$XDG_CONFIG_HOME/openenv_gym/catalog.json``."""
    override = os.environ.get(CATALOG_ENV)
    if override:
        return pathlib.Path(override).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    # The XDG spec says a relative XDG_CONFIG_HOME is invalid and must be ignored.
    base = pathlib.Path(xdg) if xdg and os.path.isabs(xdg) else pathlib.Path.home() / ".config"
    return base / "openenv_gym" / "catalog.json"


def _describe(char: str) -> str:
    if char.isascii() and char.isprintable():
        return repr(char)
    return f"U+{ord(char):04X} ({unicodedata.name(char, 'unnamed character')})"


def _name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a catalog entry, in a few words; ``None`` if it can."""
    if not isinstance(name, str) or not name:
        return "is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"is longer than {MAX_NAME_LENGTH} characters"
    # ASCII only: Gymnasium's grammar (\w) also takes other scripts' letters, which lets a name
    # look like another (Cyrillic 'а' for 'a'), and invisible or reordering marks (zero-width,
    # RTL overrides) would make an id that prints like a different one.
    bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c in "_-."))})
    if bad:
        shown = " ".join(_describe(c) for c in bad[:5]) + (" ..." if len(bad) > 5 else "")
        return f"must not contain {shown}"
    if not (name[0].isalnum() or name[0] == "_"):
        return "must start with a letter, a digit or '_'"
    env_id = f"{NAMESPACE}/{name}-v0"
    m = ENV_ID_RE.fullmatch(env_id)
    if m is None or (m["namespace"], m["name"], m["version"]) != (NAMESPACE, name, "0"):
        return f"does not make a valid Gymnasium id ({env_id!r})"
    return None


def validate_name(name: str) -> str:
    """Return ``name`` if ``openenv/<name>-v0`` is a Gymnasium id that parses back to it.

    Names are ASCII letters, digits, ``_``, ``-`` and ``.``, starting with a letter, digit or
    ``_``, at most 128 characters. Raises :class:`InvalidName` otherwise (empty, ``:``, ``/``,
    whitespace, non-ASCII letters, emoji, invisible or right-to-left marks).

    >>> validate_name("Gsm8k.tools")
    'Gsm8k.tools'
    >>> validate_name("../x")
    Traceback (most recent call last):
    openenv_gym.errors.InvalidName: environment name '../x' must not contain '/'; use ASCII letters, digits, '_', '-' and '.'
    """
    problem = _name_problem(name)
    if problem is not None:
        raise InvalidName(
            f"environment name {name!r} {problem}; use ASCII letters, digits, '_', '-' and '.'"
        )
    return name


def _depth(value: Any) -> int:
    """How many containers deep ``value`` nests (iteratively: a deep value must not recurse)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


def _resolve(path: str | os.PathLike[str] | None) -> pathlib.Path:
    return pathlib.Path(path).expanduser() if path is not None else catalog_path()


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _defuse_deep_entries(raw: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    """``raw`` with every top-level entry nested deeper than :data:`MAX_DEPTH` swapped for a marker.

    The decoder recurses, so one entry nested thousands deep fails the whole file with
    ``RecursionError``. Called only then: finds each such entry by bracket depth (computed with
    numpy over the file with its strings blanked out, so brackets inside strings do not count)
    and replaces it by a unique JSON string. Returns the new bytes and marker -> original bytes,
    so that the entry is reported bad by its name, and written back unchanged by ``remove``.
    """
    import numpy as np

    blank = _JSON_STRING.sub(lambda m: b" " * len(m[0]), raw)
    chars = np.frombuffer(blank, dtype=np.uint8)
    opens = (chars == ord("{")) | (chars == ord("["))
    closes = (chars == ord("}")) | (chars == ord("]"))
    depth = np.cumsum(opens.astype(np.int32) - closes.astype(np.int32), dtype=np.int32)
    # {"entries": {"name": {...}}}: an entry's value opens at depth 3 and closes back to 2.
    starts = np.flatnonzero(opens & (depth == 3))
    ends = np.flatnonzero(closes & (depth == 2))
    deep = np.flatnonzero(depth > MAX_DEPTH + 2)
    if not len(deep) or len(starts) != len(ends) or not np.all(starts < ends):
        return raw, {}  # not nested inside entries, or not JSON: the caller reports the file
    which = np.searchsorted(starts, deep, side="right") - 1
    spans = sorted({int(k) for k in which if k >= 0})
    nonce = os.urandom(8).hex()
    pieces, originals, at = [], {}, 0
    for k in spans:
        start, end = int(starts[k]), int(ends[k]) + 1
        marker = f'"\\u0000openenv-gym-too-deep-{nonce}-{k}"'.encode()
        pieces += [raw[at:start], marker]
        originals[marker] = raw[start:end]
        at = end
    pieces.append(raw[at:])
    return b"".join(pieces), originals


def _read_raw(path: pathlib.Path) -> tuple[dict[str, msgspec.Raw], dict[str, str]]:
    """The file's entries undecoded, and the names of those too deep to decode (with the reason).

    Raises :class:`CatalogError` when the file itself is unreadable: not JSON, not the catalog's
    shape, or another format version.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, {}
    except OSError as exc:
        raise CatalogError(f"cannot read the catalog {path}: {exc}") from exc
    too_deep: dict[str, str] = {}
    try:
        try:
            data = _RAW_FILE.decode(raw)
        except RecursionError:
            patched, originals = _defuse_deep_entries(raw)
            data = _RAW_FILE.decode(patched)
            for name, value in data.entries.items():
                original = originals.get(bytes(value))
                if original is not None:
                    data.entries[name] = msgspec.Raw(original)
                    too_deep[name] = f"nests more than {MAX_DEPTH} levels deep"
    except msgspec.DecodeError as exc:
        raise CatalogError(f"the catalog {path} is corrupt ({exc}); fix or delete it") from exc
    except RecursionError:
        raise CatalogError(f"the catalog {path} is corrupt (nested too deeply to read); fix or delete it") from None
    if data.version != CATALOG_VERSION:
        raise CatalogError(
            f"the catalog {path} has format version {data.version}; this openenv_gym reads version "
            f"{CATALOG_VERSION} (was it written by a newer release?)"
        )
    return data.entries, too_deep


def _entry_problem(key: str, value: msgspec.Raw,
                   kinds: Collection[str] | None = None) -> tuple[CatalogEntry | None, str | None]:
    """The entry stored under ``key`` if it is good, else why not (never raises)."""
    try:
        entry = _ENTRY.decode(value)
    except (msgspec.DecodeError, RecursionError) as exc:
        return None, f"not a catalog entry ({str(exc) or 'nested too deeply'})"
    problem = _name_problem(key)
    if problem is not None:
        return None, f"the name {problem}"
    if entry.name != key:
        return None, f"stored under {_shown(key)} but named {_shown(entry.name)}"
    if 1 + _depth(entry.options) > MAX_DEPTH:
        return None, f"nests more than {MAX_DEPTH} levels deep"
    if kinds is not None and entry.kind not in kinds:
        return None, f"unknown kind {_shown(entry.kind)} (this release knows {', '.join(kinds)})"
    return entry, None


def _check_entries(raw: dict[str, msgspec.Raw], too_deep: dict[str, str],
                   kinds: Collection[str] | None = None) -> CatalogContents:
    entries: dict[str, CatalogEntry] = {}
    invalid = dict(too_deep)
    for key, value in raw.items():
        if key in invalid:
            continue
        entry, problem = _entry_problem(key, value, kinds)
        if entry is None:
            invalid[key] = problem or "invalid"
        else:
            entries[key] = entry
    return CatalogContents(entries, invalid)


def _shown(name: str) -> str:
    text = repr(name)  # repr makes invisible and control characters visible as escapes
    return text if len(text) <= 60 else text[:57] + "..."


def describe_invalid(invalid: dict[str, str], limit: int = 50) -> str:
    """``'name' (reason), ...`` for the first ``limit`` bad entries, then how many more."""
    parts = [f"{_shown(name)} ({reason})" for name, reason in list(invalid.items())[:limit]]
    if len(invalid) > limit:
        parts.append(f"and {len(invalid) - limit} more")
    return ", ".join(parts)


REMOVE_HINT = "remove them with `openenv-gym remove NAME`, or all at once with `openenv-gym remove --invalid`"


def _write(path: pathlib.Path, entries: Mapping[str, CatalogEntry | msgspec.Raw]) -> None:
    payload = msgspec.json.encode({"version": CATALOG_VERSION, "entries": entries}, order="sorted")
    try:
        payload = msgspec.json.format(payload, indent=2) + b"\n"
    except RecursionError:  # a bad entry kept for the user is too deep to re-indent: stay compact
        payload += b"\n"
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


def read_catalog(path: str | os.PathLike[str] | None = None,
                 kinds: Collection[str] | None = None) -> CatalogContents:
    """Every entry, each checked on its own: the good ones, and the bad ones by name with a reason.

    An entry is bad when it is not a catalog entry (a missing field, a wrong type), its name
    fails :func:`validate_name` or differs from its key, it nests deeper than
    :data:`MAX_DEPTH`, or (if ``kinds`` is given) its kind is not one of ``kinds``. Only an
    unreadable file raises :class:`CatalogError`. No file: empty.
    """
    return _check_entries(*_read_raw(_resolve(path)), kinds)


def load_catalog(path: str | os.PathLike[str] | None = None) -> dict[str, CatalogEntry]:
    """All entries by name; ``{}`` when the file does not exist.

    Strict: a bad file, or any bad entry, is a :class:`CatalogError` naming it (see
    :func:`read_catalog` for the lenient read that ``import openenv_gym`` uses).
    """
    target = _resolve(path)
    contents = _check_entries(*_read_raw(target))
    if contents.invalid:
        raise CatalogError(
            f"the catalog {target} has invalid entries: {describe_invalid(contents.invalid)}; {REMOVE_HINT}"
        )
    return contents.entries


def add_entry(entry: CatalogEntry, path: str | os.PathLike[str] | None = None, replace: bool = True) -> None:
    """Add ``entry``, stamping ``added_at`` if empty; an existing name is replaced unless ``replace=False``.

    A catalog holding bad entries is not written to (they would have to be dropped or rewritten):
    the :class:`CatalogError` names them and says how to remove them.
    """
    validate_name(entry.name)
    if 1 + _depth(entry.options) > MAX_DEPTH:
        raise CatalogError(f"the options of {entry.name!r} nest more than {MAX_DEPTH} levels deep")
    if not entry.added_at:
        now = datetime.now(UTC).isoformat(timespec="seconds")
        entry = msgspec.structs.replace(entry, added_at=now)
    target = _resolve(path)
    with _locked(target):
        entries = load_catalog(target)
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


def remove_entry(name: str, path: str | os.PathLike[str] | None = None) -> CatalogEntry | None:
    """Remove the entry called ``name`` and return it (``None`` if it was a bad entry).

    Works on any entry, a bad one included (a name no Gymnasium id can hold, a corrupt entry):
    that is how a user repairs the catalog. Every other entry is written back unchanged. An
    unknown name is a :class:`CatalogError` listing the known ones.
    """
    target = _resolve(path)
    with _locked(target):
        raw, too_deep = _read_raw(target)
        if name not in raw:
            names = [n if _name_problem(n) is None else _shown(n) for n in sorted(raw)]
            known = ", ".join(names[:50]) + (f" and {len(names) - 50} more" if len(names) > 50 else "")
            raise CatalogError(f"no catalog entry named {_shown(name)} in {target}; known names: {known or 'none'}")
        value = raw.pop(name)
        removed = None if name in too_deep else _entry_problem(name, value)[0]
        try:
            _write(target, raw)
        except OSError as exc:
            raise CatalogError(f"cannot write the catalog {target}: {exc}") from exc
    return removed


def remove_invalid(path: str | os.PathLike[str] | None = None,
                   kinds: Collection[str] | None = None) -> dict[str, str]:
    """Remove every bad entry (see :func:`read_catalog`); returns their names with the reasons."""
    target = _resolve(path)
    with _locked(target):
        raw, too_deep = _read_raw(target)
        invalid = _check_entries(raw, too_deep, kinds).invalid
        if invalid:
            for name in invalid:
                del raw[name]
            try:
                _write(target, raw)
            except OSError as exc:
                raise CatalogError(f"cannot write the catalog {target}: {exc}") from exc
    return invalid
