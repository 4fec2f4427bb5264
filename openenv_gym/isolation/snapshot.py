"""Snapshots: a frozen copy of an imported source in the data dir, secrets and caches left out.

An isolated import plays the snapshot, not the original: editing (or deleting) the original does
not change a running experiment until it is imported again. A folder is copied (its data files
included); a single file is copied with the sibling modules it imports (found statically,
transitively) and the requirement files next to it, since its folder may be anything (a home dir).

What is left out is decided by name, deny-by-default where a name may hold a secret:

* every dotfile and dot-folder (``.env``, ``.pgpass``, ``.dockercfg``, ``.htpasswd``, ``.git/``,
  ``.aws/`` ...): configuration that programs keep next to a project is where tokens live;
* credential-shaped names (:data:`SECRET_PATTERNS`: keys, ``credentials.json``, ``kubeconfig``
  ...; and, for files other than Python modules and for folders, any name holding one of the
  words of :data:`SECRET_WORDS`, such as ``token.txt`` or ``service-account.json``);
* caches, environments and build folders (:data:`SKIPPED_DIRS`) and compiled files;
* every symlink that leads out of the source, or to a file the rules above leave out (``gitcfg ->
  .git/config``): a symlink is copied (as the file it points at) only when its target would be
  copied itself. Symlinked folders are never followed; fifos, sockets and devices are not copied.

Each left-out path is listed in :attr:`Snapshot.excluded` with its reason (the catalog records the
list), never its content. A user who needs a left-out file names it: ``include=`` (the ``--include
PATTERN`` option of ``import --isolated`` and ``install``) takes globs matched against the path
relative to the source, which waive the name rules for what they match (an included folder's own
files are still judged by their names). A symlink out of the source is never copied.

The snapshot folder is named by a hash of what it holds, so importing the same content twice
reuses one copy, and is written to a temporary name and renamed, so a crash leaves no half copy.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import fnmatch
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from openenv_gym.errors import ConfigurationError, SourceNotFound
from openenv_gym.isolation.paths import sources_dir

__all__ = ["SECRET_PATTERNS", "SECRET_WORDS", "SKIPPED_DIRS", "INCLUDE_HINT", "Selection", "Snapshot",
           "check_include", "excluded_reason", "including", "preview", "select", "snapshot", "stage"]

SECRET_PATTERNS: tuple[str, ...] = (
    ".env", ".env.*", ".envrc", "*.env", "credentials.json", "credentials", "secrets.*", "secret.*",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.ppk", "*.keytab", "*.gpg", "*.pgp", "*.ovpn",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.kdbx", "*.tfstate", "*.tfstate.*", "*.tfvars",
    ".netrc", "_netrc", ".pypirc", ".npmrc", ".git-credentials", ".pgpass", "pgpass.conf", ".dockercfg",
    "kubeconfig", "kubeconfig.*", "*.kubeconfig", ".htpasswd", "htpasswd", "*.htpasswd", "auth.json",
)
"""File names (fnmatch, case-insensitive) that may hold a secret: never copied unless included."""

SECRET_WORDS: frozenset[str] = frozenset({
    "token", "secret", "secrets", "credential", "credentials", "password", "passwords", "passwd", "htpasswd",
    "pgpass", "apikey", "kubeconfig", "netrc", "dockercfg", "keystore", "truststore", "privatekey",
    "serviceaccount", "api key", "private key", "service account", "access key",
})
"""Words (of a name split at every non-alphanumeric character, lower-cased; two-word entries are
adjacent words) that make a data file or a folder credential-shaped: ``token.txt``,
``service-account.json``, ``github_token``, ``client_secret_123.json``. Python modules are not
judged by these words (``token_utils.py`` is code), only by :data:`SECRET_PATTERNS`; nor are
Python packages (folders with an ``__init__.py``), whose files are judged one by one."""

SKIPPED_DIRS: tuple[str, ...] = ("__pycache__", "venv", "node_modules", "*.egg-info")
"""Folder names left out besides every dot-folder: caches and environments."""

REQUIREMENT_FILES = ("requirements.txt", "pyproject.toml")

INCLUDE_HINT = "to copy a left-out file anyway, name it: --include PATH (a glob relative to the source)"
"""What to tell a user whose snapshot left something out."""

_INCLUDE: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("openenv_gym_snapshot_include",
                                                                            default=())
_WORD = re.compile(r"[a-z0-9]+")


class Snapshot(NamedTuple):
    """Where the copy is (``path``: the folder, or the file inside it) and what was left out."""

    path: Path
    root: Path
    excluded: list[str]


class Selection(NamedTuple):
    """What a snapshot of a source would hold, before copying anything.

    ``root`` is the source folder (a file's own folder), ``entry`` the file imported (``None`` for
    a folder), ``files`` each relative path to copy and the real file its bytes come from (a
    symlink's target), ``excluded`` each left-out path with its reason.
    """

    root: Path
    entry: PurePosixPath | None
    files: dict[PurePosixPath, Path]
    excluded: list[str]


def _words_say_secret(name: str) -> bool:
    words = _WORD.findall(name)
    return any(w in SECRET_WORDS for w in words) or any(f"{a} {b}" in SECRET_WORDS for a, b in zip(words, words[1:]))


def excluded_reason(name: str, is_dir: bool, package: bool = False) -> str | None:
    """Why a file or folder called ``name`` is left out of a snapshot by default (``None``: it is copied).

    ``package``: the folder is a Python package (code, like a module: not judged by :data:`SECRET_WORDS`).
    """
    lowered = name.lower()
    if is_dir:
        if lowered.startswith("."):
            return "a dot-folder: version control, caches or credential stores"
        if any(fnmatch.fnmatchcase(lowered, p) for p in SKIPPED_DIRS):
            return "cache or environment folder"
        if not package and _words_say_secret(lowered):
            return "may hold secrets"
        return None
    if any(fnmatch.fnmatchcase(lowered, p) for p in SECRET_PATTERNS):
        return "may hold a secret"
    if lowered.startswith("."):
        return "a dotfile: may hold a secret"
    if lowered.endswith((".pyc", ".pyo")):
        return "compiled cache"
    if not lowered.endswith(".py") and _words_say_secret(lowered):
        return "may hold a secret"
    return None


def check_include(patterns: Iterable[str] | None) -> tuple[str, ...]:
    """``patterns`` as a tuple, each checked: a relative path or glob that stays inside the source."""
    if patterns is None:
        return ()
    if isinstance(patterns, str):
        patterns = [patterns]
    checked = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern.strip():
            raise ConfigurationError(f"an include pattern must be a non-empty path, not {pattern!r}")
        posix = PurePosixPath(pattern.replace(os.sep, "/"))
        if posix.is_absolute() or ".." in posix.parts:
            raise ConfigurationError(f"include pattern {pattern!r} must be a path relative to the source, inside it")
        checked.append(posix.as_posix())
    return tuple(checked)


@contextlib.contextmanager
def including(patterns: Iterable[str] | None) -> Iterator[None]:
    """Within the block, snapshots also copy what ``patterns`` name (see the module docstring).

    For callers that reach :func:`snapshot` through code that does not pass ``include=`` on
    (``import_source``): the patterns apply to this context only (thread- and task-local).
    """
    token = _INCLUDE.set(check_include(patterns))
    try:
        yield
    finally:
        _INCLUDE.reset(token)


class _Selector:
    """Judges the paths of one source root against the rules and the include patterns."""

    def __init__(self, root: Path, include: tuple[str, ...]):
        self.root = root  # resolved: the test of where a symlink leads
        self.include = include
        self.files: dict[PurePosixPath, Path] = {}
        self.excluded: list[str] = []

    def included(self, rel: PurePosixPath) -> bool:
        text = rel.as_posix()
        return any(fnmatch.fnmatchcase(text, p) for p in self.include)

    def named_inside(self, rel: PurePosixPath) -> bool:
        """Whether an include pattern names something inside the folder ``rel``."""
        prefix = rel.as_posix() + "/"
        return any(p.startswith(prefix) for p in self.include)

    def rule(self, rel: PurePosixPath, is_dir: bool) -> str | None:
        """Why the name rules leave ``rel`` out, judging every folder on its way (``None``: copied)."""
        if self.included(rel):
            return None
        parts = rel.parts
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            here = PurePosixPath(*parts[:i + 1])
            reason = excluded_reason(name, is_dir or not last)
            if reason is not None and (is_dir or not last) and (self.root / here / "__init__.py").is_file():
                reason = excluded_reason(name, True, package=True)
            if reason is None:
                continue
            if last:
                return reason
            if not self.included(here):
                return f"inside {here}/: {reason}"
        return None

    def leave(self, rel: PurePosixPath, reason: str, is_dir: bool = False) -> None:
        self.excluded.append(f"{rel}{'/' if is_dir else ''} ({reason})")

    def real_file(self, rel: PurePosixPath) -> tuple[Path | None, str | None]:
        """The file whose bytes ``rel`` stands for, or why it is not copied."""
        path = self.root / rel
        try:
            st = path.lstat()
        except OSError:
            return None, "cannot be read"
        if stat.S_ISLNK(st.st_mode):
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError):
                return None, "a broken or looping symlink"
            if not target.is_relative_to(self.root):
                return None, "a symlink out of the source"
            if target.is_dir():
                return None, "a symlink to a folder: not followed"
            target_rel = PurePosixPath(target.relative_to(self.root).as_posix())
            why = self.rule(target_rel, False)
            if why is not None:
                return None, f"a symlink to {target_rel}, which is left out: {why}"
            try:
                st = target.stat()
            except OSError:
                return None, "cannot be read"
            path = target
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        return path, None

    def file(self, rel: PurePosixPath, quiet: bool = False) -> bool:
        """Take the file ``rel`` if the rules allow it; else list it (unless ``quiet``). Whether it was taken."""
        if rel in self.files:
            return True
        reason = self.rule(rel, False)
        real = None
        if reason is None:
            real, reason = self.real_file(rel)
        if reason is not None or real is None:
            if not quiet:
                self.leave(rel, reason or "cannot be read")
            return False
        self.files[rel] = real
        return True

    def folder(self, rel: PurePosixPath, quiet: bool = False) -> None:
        """Walk the folder ``rel`` (``PurePosixPath()`` for the root), taking and listing its files.

        A folder the rules leave out is still entered for what an include pattern names inside
        it (``quiet``: its other content is covered by the folder's own line in the list).
        """
        path = self.root / rel
        if rel.parts:
            if path.is_symlink():
                if not quiet:
                    self.leave(rel, "a symlink to a folder: not followed", is_dir=True)
                return
            reason = self.rule(rel, True)
            if reason is None:
                quiet = False  # included by name: walked (and its left-out content listed) as usual
            else:
                named = self.named_inside(rel)
                if not quiet:
                    self.leave(rel, reason + ("; only what --include names inside was copied" if named else ""),
                               is_dir=True)
                if not named:
                    return
                quiet = True
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            if not quiet:
                self.leave(rel, "cannot be read", is_dir=True)
            return
        for entry in entries:
            child = rel / entry.name
            if quiet and not (self.included(child) or self.named_inside(child)):
                continue
            if entry.is_dir(follow_symlinks=False):
                self.folder(child, quiet)
            else:
                self.file(child, quiet)


def _local_imports(file: Path) -> list[str]:
    """Top-level module names ``file`` imports (absolute imports, and relative ones as siblings)."""
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (SyntaxError, ValueError, OSError, RecursionError, MemoryError):
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


def _file_closure(sel: _Selector, entry: PurePosixPath) -> None:
    """``entry``, the sibling modules and packages it imports (transitively), and the requirement files.

    Every sibling is judged as in a folder walk: an imported ``secrets.py``, a module or a
    ``requirements.txt`` that is a symlink out of the folder, a symlinked package: left out, listed.
    """
    if not sel.file(entry):
        raise SourceNotFound(f"{sel.root / entry}: {sel.excluded[-1]}")
    todo, seen = [entry], {entry.stem}
    while todo:
        for name in _local_imports(sel.files[todo.pop()]):
            if not name.isidentifier() or name in seen:
                continue
            module, package = PurePosixPath(f"{name}.py"), PurePosixPath(name)
            if os.path.lexists(sel.root / module) and not (sel.root / module).is_dir():
                seen.add(name)
                if sel.file(module):
                    todo.append(module)
            elif os.path.lexists(sel.root / package / "__init__.py"):
                seen.add(name)
                before = set(sel.files)
                sel.folder(package)
                todo += [p for p in sel.files if p not in before and p.suffix == ".py"]
    for requirement in REQUIREMENT_FILES:
        rel = PurePosixPath(requirement)
        if requirement not in seen and os.path.lexists(sel.root / rel):
            sel.file(rel)


def select(source: str | os.PathLike[str], include: Iterable[str] | None = None) -> Selection:
    """What :func:`snapshot` would copy from ``source``, without copying (see the module docstring).

    ``include``: patterns of left-out paths to copy anyway (default: those of :func:`including`).
    """
    patterns = check_include(include) if include is not None else _INCLUDE.get()
    path = Path(source).expanduser()
    if not path.exists():
        raise SourceNotFound(f"import source {path} does not exist")
    path = path.resolve()  # a source named through a symlink is the file it names: the user's choice
    if path.is_dir():
        sel = _Selector(path, patterns)
        sel.folder(PurePosixPath())
        return Selection(path, None, sel.files, sel.excluded)
    sel = _Selector(path.parent, patterns)
    entry = PurePosixPath(path.name)
    reason = sel.rule(entry, False)
    if reason:
        raise SourceNotFound(f"{path}: {reason}, so it is not snapshotted ({INCLUDE_HINT})")
    _file_closure(sel, entry)
    return Selection(path.parent, entry, sel.files, sel.excluded)


def preview(source: str | os.PathLike[str], include: Iterable[str] | None = None
            ) -> tuple[Path, list[Path], list[str]]:
    """What :func:`snapshot` would copy, without copying: the root, the files under it, what is left out."""
    chosen = select(source, include)
    return chosen.root, [Path(p) for p in chosen.files], chosen.excluded


def _copy(chosen: Selection, into: Path) -> str:
    """Copy the chosen files into the folder ``into``; the hash of what was copied (paths and bytes)."""
    digest = hashlib.sha256()
    for rel in sorted(chosen.files):
        real = chosen.files[rel]
        # O_NOFOLLOW: a file swapped for a symlink since it was judged is refused, not followed.
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as src:
            st = os.fstat(src.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise SourceNotFound(f"{chosen.root / rel} changed while it was copied: not a regular file any more")
            dest = into / Path(*rel.parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            digest.update(rel.as_posix().encode() + b"\0")
            with open(dest, "xb") as out:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
            digest.update(b"\0")
        os.chmod(dest, stat.S_IMODE(st.st_mode) & 0o755)
        os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    return digest.hexdigest()[:20]


def _snapshot_of(chosen: Selection, root: Path) -> Snapshot:
    path = root / Path(*chosen.entry.parts) if chosen.entry is not None else root
    return Snapshot(path, root, chosen.excluded)


def stage(source: str | os.PathLike[str], folder: str | os.PathLike[str],
          include: Iterable[str] | None = None) -> Snapshot:
    """Copy what a snapshot of ``source`` would hold into ``folder`` (new or empty), nothing else.

    ``install`` detects and reads requirements from this copy, so the plan it shows is of
    exactly the files it would import.
    """
    chosen = select(source, include)
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    _copy(chosen, target)
    return _snapshot_of(chosen, target)


def snapshot(source: str | os.PathLike[str], name: str, include: Iterable[str] | None = None) -> Snapshot:
    """Copy ``source`` (a file or a folder) into the data dir; returns where the copy is.

    ``name`` (the catalog name) only prefixes the folder, for a human browsing the data dir.
    ``include``: left-out paths to copy anyway (default: those of :func:`including`).
    """
    chosen = select(source, include)
    parent = sources_dir()
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}."))
    try:
        target = parent / f"{name}-{_copy(chosen, staging)}"
        if not target.exists():
            try:
                staging.rename(target)
            except OSError:
                if not target.exists():  # another import of the same content won the race: fine
                    raise
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
    return _snapshot_of(chosen, target)
