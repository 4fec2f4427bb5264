"""``openenv-gym install``: fetch a source, show what would run, ask, then import it isolated.

A source is a git URL (``git+https://...``, ``git+file://...``, with ``@rev`` and
``#subdirectory=path``), a local folder or file, or a package requirement (``name==1.2``). The
order of things is what makes it safe to point at someone else's code:

1. **fetch** into a temporary folder: git clones without hooks, submodules or a terminal prompt;
   a requirement is downloaded as a wheel (``pip download --only-binary=:all:``) and unzipped,
   never built, so no ``setup.py`` runs;
2. **plan**: detection is static (syntax trees and JSON, see :mod:`openenv_gym.importers`), the
   requirements are read from files, the snapshot's left-out files are listed; nothing fetched is
   imported or run;
3. **consent**: the plan is shown and the user agrees (``--yes`` in scripts; without a terminal
   and without ``--yes`` the install is refused);
4. **import isolated**: the source is snapshotted into the data dir, its venv is built, and the
   catalog records the commit (pinned: the repository moving on changes nothing until the next
   install) and where it came from. Credentials in a URL are given to git and nowhere else: the
   origin recorded, every line printed and every error carry the URL without them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

from openenv_gym.errors import ConfigurationError, SourceNotFound
from openenv_gym.importers import Detected, detect, import_source
from openenv_gym.importers.catalog import CatalogEntry, validate_name
from openenv_gym.isolation.snapshot import preview
from openenv_gym.isolation.venvs import requirements_for

__all__ = ["Fetched", "Plan", "fetch", "plan", "install", "strip_credentials"]

FETCH_TIMEOUT = 600.0
"""Seconds a clone or a download may take."""

_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*([<>=!~]=?.*)?$")
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


class Fetched(NamedTuple):
    """A fetched source: where it is now, where it came from (no credentials), its commit."""

    path: Path
    origin: str
    commit: str | None
    temp: Path | None


class Plan(NamedTuple):
    """What an install would run, shown before asking."""

    fetched: Fetched
    found: Detected
    requirements: list[str]
    excluded: list[str]

    def describe(self, name: str) -> str:
        f = self.found
        what = f.env_class or f"task set of {f.env_name}"
        lines = [
            f"source:       {self.fetched.origin}",
            f"commit:       {self.fetched.commit or '(not a git checkout)'}",
            f"detected:     {f.kind} environment {what} ({f.sdk}) in {f.module_file}",
            f"requirements: {', '.join(self.requirements)}",
            f"left out:     {', '.join(self.excluded) or 'nothing'}",
            f"registers:    openenv/{name}-v0, played in its own venv",
        ]
        return "\n".join(lines)


def strip_credentials(text: str) -> str:
    """``text`` with the user and password of every URL in it removed (``https://u:t@h/x`` -> ``https://h/x``)."""
    return _USERINFO.sub("", text)


def _split_git(source: str) -> tuple[str, str | None, str | None]:
    """``git+URL[@rev][#subdirectory=path]`` -> (URL, rev, subdirectory)."""
    url = source[len("git+"):]
    url, _, fragment = url.partition("#")
    subdirectory = None
    for part in filter(None, fragment.split("&")):
        key, _, value = part.partition("=")
        if key != "subdirectory" or not value:
            raise ConfigurationError(f"unsupported URL fragment {part!r}: only #subdirectory=PATH")
        subdirectory = value
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http", "file", "ssh"):
        raise ConfigurationError(f"unsupported git URL scheme {parts.scheme!r}: use git+https:// or git+file://")
    rev = None
    if "@" in parts.path:
        path, _, rev = parts.path.rpartition("@")
        url = urlunsplit(parts._replace(path=path))
    return url, rev or None, subdirectory


def _git(args: list[str], secret_url: str, timeout: float) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": "",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_LFS_SKIP_SMUDGE": "1"}
    # No hook runs (clone's templates included), and no credential helper is asked.
    cmd = ["git", "-c", "core.hooksPath=/dev/null", "-c", "credential.helper=", "-c", "protocol.file.allow=always",
           *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=timeout)
    except FileNotFoundError:
        raise ConfigurationError("installing from a git URL needs git on the PATH") from None
    except subprocess.TimeoutExpired:
        raise ConfigurationError(f"git {args[0]} of {strip_credentials(secret_url)} took longer than {timeout:.0f} s") from None
    if done.returncode:
        message = strip_credentials(done.stderr.replace(secret_url, strip_credentials(secret_url))).strip()
        raise ConfigurationError(f"git {args[0]} of {strip_credentials(secret_url)} failed: {message[-1500:]}")
    return done.stdout.strip()


def _inside(root: Path, relative: str) -> Path:
    rel = PurePosixPath(relative)
    if rel.is_absolute() or ".." in rel.parts:
        raise ConfigurationError(f"subdirectory {relative!r} must be a relative path inside the repository")
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()) or not path.exists():
        raise SourceNotFound(f"the repository has no subdirectory {relative!r}")
    return path


def _fetch_git(source: str, temp: Path) -> Fetched:
    url, rev, subdirectory = _split_git(source)
    repo = temp / "repo"
    _git(["clone", "--quiet", "--no-checkout", "--", url, str(repo)], url, FETCH_TIMEOUT)
    _git(["-C", str(repo), "checkout", "--quiet", "--detach", rev or "HEAD"], url, FETCH_TIMEOUT)
    commit = _git(["-C", str(repo), "rev-parse", "HEAD"], url, 60)
    path = _inside(repo, subdirectory) if subdirectory else repo
    return Fetched(path, strip_credentials(source), commit, temp)


def _local_commit(path: Path) -> str | None:
    """The HEAD commit of a clean git work tree holding ``path`` (``None`` otherwise)."""
    folder = path if path.is_dir() else path.parent
    try:
        run = lambda *a: subprocess.run(["git", "-C", str(folder), *a], capture_output=True, text=True,  # noqa: E731
                                        stdin=subprocess.DEVNULL, timeout=60)
        head, status = run("rev-parse", "HEAD"), run("status", "--porcelain", "--", ".")
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    if head.returncode or status.returncode or status.stdout.strip():
        return None
    return head.stdout.strip()


def _fetch_requirement(requirement: str, temp: Path) -> Fetched:
    wheels = temp / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--dest", str(wheels), requirement]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=FETCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ConfigurationError(f"downloading {requirement} took longer than {FETCH_TIMEOUT:.0f} s") from None
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if done.returncode or len(found) != 1:
        why = strip_credentials(done.stderr.strip())[-1500:] or "no wheel was downloaded"
        raise ConfigurationError(f"cannot fetch {requirement} as a wheel (installs never build sdists): {why}")
    wheel = found[0]
    name, version = wheel.name.split("-")[:2]
    folder = temp / "package"
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():  # a wheel that writes outside its folder is refused
            if PurePosixPath(member).is_absolute() or ".." in PurePosixPath(member).parts:
                raise ConfigurationError(f"{wheel.name} holds a path outside its folder: {member!r}")
        z.extractall(folder)
    # The venv installs the package itself (and with it its dependencies) from the registry.
    (folder / "requirements.txt").write_text(f"{name.replace('_', '-')}=={version}\n")
    return Fetched(folder, requirement, None, temp)


def _into_temp(fetcher: Callable[[str, Path], Fetched], source: str) -> Fetched:
    """Run ``fetcher`` into a new temporary folder, removed again if it fails."""
    temp = Path(tempfile.mkdtemp(prefix="openenv-gym-install-"))
    try:
        return fetcher(source, temp)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def fetch(source: str) -> Fetched:
    """Bring ``source`` here (into a temporary folder, unless it is a local path) without running it."""
    if source.startswith("git+"):
        return _into_temp(_fetch_git, source)
    path = Path(source).expanduser()
    if path.exists():
        path = path.resolve()
        return Fetched(path, str(path), _local_commit(path), None)
    if "://" in source or source.startswith((".", "/", "~")) or os.sep in source:
        raise SourceNotFound(f"{strip_credentials(source)} is neither a local path, a git+ URL nor a requirement")
    if not _REQUIREMENT.match(source):
        raise ConfigurationError(f"{source!r} is not a package requirement such as name==1.2")
    return _into_temp(_fetch_requirement, source)


def plan(fetched: Fetched, kind: str | None = None, env_class: str | None = None) -> Plan:
    """What installing ``fetched`` would run: detected statically, nothing imported or executed."""
    found = detect(fetched.path, kind=kind, env_class=env_class)
    _, _, excluded = preview(fetched.path)
    return Plan(fetched, found, requirements_for(found.kind, found.source, found.sdk), excluded)


def install(source: str, name: str, *, yes: bool = False, kind: str | None = None, env_class: str | None = None,
            python: str | None = None, build: bool = True, ask: Callable[[str], str] | None = None,
            show: Callable[[str], None] = print) -> CatalogEntry:
    """Fetch ``source``, show the plan, get consent, import it isolated as ``name``; the catalog entry.

    ``yes=True`` is consent given in advance. Otherwise ``ask`` (default: :func:`input`, only when
    stdin is a terminal) must answer ``y``; without a terminal the install is refused. A refusal
    is a :class:`~openenv_gym.errors.ConfigurationError`, and leaves the catalog and the data dir
    as they were. The temporary folder of the fetch is removed whatever happens.
    """
    validate_name(name)
    fetched = fetch(source)
    try:
        p = plan(fetched, kind, env_class)
        show(p.describe(name))
        if not yes:
            if ask is None:
                if not sys.stdin or not sys.stdin.isatty():
                    raise ConfigurationError(f"{name} was not installed: there is no terminal to ask for consent on; "
                                             "read the above and pass --yes to install without asking")
                ask = input
            if ask(f"install {name}? [y/N] ").strip().lower() not in ("y", "yes"):
                raise ConfigurationError(f"{name} was not installed (no consent)")
        return import_source(fetched.path, name, kind=p.found.kind, env_class=env_class, isolated=True,
                             python=python, build=build, origin=fetched.origin, commit=fetched.commit)
    finally:
        if fetched.temp is not None:
            shutil.rmtree(fetched.temp, ignore_errors=True)
