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
   install) and where it came from.

Credentials in a URL (``git+https://USER:TOKEN@host/...``) are given to git and nowhere else: the
URL git runs with has none (a command line is visible to every user of the machine in ``ps``), and
git gets them from a credential helper that reads them from its environment (readable by this user
only), answering only for the URL's own scheme, host and port. A token in the query
(``?access_token=``) is refused: git puts the whole URL on its helpers' command lines and breaks the
query when it appends its paths. The origin recorded, every line printed and every error carry the
URL without user, password or secret query values (:func:`openenv_gym.redact.redact_urls`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import msgspec

from openenv_gym.errors import ConfigurationError, SourceNotFound
from openenv_gym.importers import Detected, detect
from openenv_gym.importers.catalog import CatalogEntry, add_entry, validate_name
from openenv_gym.importing import import_source
from openenv_gym.isolation.snapshot import INCLUDE_HINT, Snapshot, check_include, including, stage
from openenv_gym.isolation.venvs import requirements_for
from openenv_gym.redact import HIDDEN, is_secret_query_key, redact_urls

__all__ = ["Fetched", "Plan", "fetch", "plan", "install", "strip_credentials"]

FETCH_TIMEOUT = 600.0
"""Seconds a clone or a download may take."""

_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*([<>=!~]=?.*)?$")

_USER_ENV, _PASSWORD_ENV, _FOR_ENV = "OPENENV_GYM_GIT_USERNAME", "OPENENV_GYM_GIT_PASSWORD", "OPENENV_GYM_GIT_FOR"
# A credential helper (git runs it with ``sh``) answering ``get`` for one protocol://host[:port] with
# the user and password of the environment; ``printf`` and ``read`` are builtins, so the secret is
# on no command line. Other hosts (a redirect) and other actions get nothing.
_HELPER = ('!f() { test "$1" = get || return 0; p=; h=; '
           'while IFS= read -r line; do case "$line" in protocol=*) p="${line#protocol=}";; '
           'host=*) h="${line#host=}";; esac; done; '
           f'test "$p://$h" = "${_FOR_ENV}" || return 0; '
           f'printf "username=%s\\npassword=%s\\n" "${_USER_ENV}" "${_PASSWORD_ENV}"; }}; f')


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
    staged: Snapshot
    """The copy the plan was made from (what would be imported), in the install's temporary folder."""

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
        if self.excluded:
            lines.insert(-1, f"              ({INCLUDE_HINT})")
        return "\n".join(lines)


def strip_credentials(text: str) -> str:
    """``text`` with the user and password of every URL in it removed and secret query values hidden.

    ``https://u:t@h/x?access_token=a`` -> ``https://h/x?access_token=***`` (see :func:`~openenv_gym.redact.redact_urls`).
    """
    return redact_urls(text)


class _GitUrl(NamedTuple):
    """A git URL split for running git: ``url`` has no credentials; they travel in ``env``."""

    url: str
    env: dict[str, str]


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
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a host:port that does not parse)
    except ValueError:
        # Most often a password with an unencoded "/", which puts part of it where the host goes:
        # no part of such a URL is shown.
        raise ConfigurationError(f"{source.partition('://')[0]}://... is not a valid URL: percent-encode the "
                                 "'/', '?', '#' and '@' of a user or password (%2F, %3F, %23, %40)") from None
    if parts.scheme not in ("https", "http", "file", "ssh"):
        raise ConfigurationError(f"unsupported git URL scheme {parts.scheme!r}: use git+https:// or git+file://")
    secret_keys = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True) if is_secret_query_key(k)]
    if secret_keys:
        raise ConfigurationError(
            f"a token in the query of {redact_urls(source)} ({', '.join(f'{k}={HIDDEN}' for k in secret_keys)}) "
            "would be on git's command line, visible to every user of this machine, and git cannot use it: "
            "give it as the URL's user and password instead (USER:TOKEN@ before the host), which reach git "
            "through a credential helper")
    rev = None
    if "@" in parts.path:
        path, _, rev = parts.path.rpartition("@")
        url = urlunsplit(parts._replace(path=path))
    return url, rev or None, subdirectory


def _without_credentials(url: str) -> _GitUrl:
    """``url`` without its user and password, and the environment that gives them to git."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return _GitUrl(url, {})
    user, _, password = (unquote(x) for x in userinfo.partition(":"))
    if parts.scheme == "file":  # nothing to log in to
        return _GitUrl(urlunsplit(parts._replace(netloc=host)), {})
    if parts.scheme == "ssh":
        if password:
            raise ConfigurationError("an ssh URL takes no password (ssh authenticates with your keys): "
                                     f"remove it from {redact_urls(url)}")
        return _GitUrl(url, {})  # the user (git@) is not a secret: ssh needs it in the URL
    if any(c in user + password for c in "\n\r\0"):
        raise ConfigurationError(f"the user or password of {redact_urls(url)} holds a line break or a NUL")
    env = {_USER_ENV: user, _PASSWORD_ENV: password, _FOR_ENV: f"{parts.scheme}://{host}"}
    return _GitUrl(urlunsplit(parts._replace(netloc=host)), env)


def _git_env(credentials: dict[str, str]) -> dict[str, str]:
    """The environment git runs in: no prompt, no system or user credential helper, no hook."""
    config = [("core.hooksPath", "/dev/null"), ("protocol.file.allow", "always"),
              ("credential.helper", "")]  # an empty helper clears the list: the user's helpers are not asked
    if credentials:
        config.append(("credential.helper", _HELPER))
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": "",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_LFS_SKIP_SMUDGE": "1", **credentials,
           "GIT_CONFIG_COUNT": str(len(config))}
    for i, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


def _git(args: list[str], url: _GitUrl, timeout: float) -> str:
    shown = redact_urls(url.url)
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, env=_git_env(url.env),
                              stdin=subprocess.DEVNULL, timeout=timeout)
    except FileNotFoundError:
        raise ConfigurationError("installing from a git URL needs git on the PATH") from None
    except subprocess.TimeoutExpired:
        raise ConfigurationError(f"git {args[0]} of {shown} took longer than {timeout:.0f} s") from None
    if done.returncode:
        message = done.stderr
        for secret in filter(None, (url.env.get(_PASSWORD_ENV), url.env.get(_USER_ENV))):
            message = message.replace(secret, HIDDEN)  # git never saw them in a URL, but be sure
        raise ConfigurationError(f"git {args[0]} of {shown} failed: {redact_urls(message).strip()[-1500:]}")
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
    git_url = _without_credentials(url)
    repo = temp / "repo"
    _git(["clone", "--quiet", "--no-checkout", "--", git_url.url, str(repo)], git_url, FETCH_TIMEOUT)
    _git(["-C", str(repo), "checkout", "--quiet", "--detach", rev or "HEAD"], git_url, FETCH_TIMEOUT)
    commit = _git(["-C", str(repo), "rev-parse", "HEAD"], git_url, 60)
    path = _inside(repo, subdirectory) if subdirectory else repo
    return Fetched(path, redact_urls(source), commit, temp)


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
        why = redact_urls(done.stderr.strip())[-1500:] or "no wheel was downloaded"
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
        raise SourceNotFound(f"{redact_urls(source)} is neither a local path, a git+ URL nor a requirement")
    if not _REQUIREMENT.match(source):
        raise ConfigurationError(f"{source!r} is not a package requirement such as name==1.2")
    return _into_temp(_fetch_requirement, source)


def plan(fetched: Fetched, workdir: Path, kind: str | None = None, env_class: str | None = None,
         include: Iterable[str] = ()) -> Plan:
    """What installing ``fetched`` would run: detected statically, nothing imported or executed.

    What a snapshot of ``fetched`` would hold is copied into ``workdir`` first (secrets, files
    behind symlinks out of the source and the like left out, ``include`` copied anyway), and
    detection and requirements are read from that copy: the plan shows what would be imported.
    """
    staged = stage(fetched.path, workdir / "staged", include)
    found = detect(staged.path, kind=kind, env_class=env_class)
    return Plan(fetched, found, requirements_for(found.kind, found.source, found.sdk), staged.excluded, staged)


def install(source: str, name: str, *, yes: bool = False, kind: str | None = None, env_class: str | None = None,
            python: str | None = None, build: bool = True, ask: Callable[[str], str] | None = None,
            show: Callable[[str], None] = print, include: Iterable[str] | None = None) -> CatalogEntry:
    """Fetch ``source``, show the plan, get consent, import it isolated as ``name``; the catalog entry.

    ``yes=True`` is consent given in advance. Otherwise ``ask`` (default: :func:`input`, only when
    stdin is a terminal) must answer ``y``; without a terminal the install is refused. A refusal
    is a :class:`~openenv_gym.errors.ConfigurationError`, and leaves the catalog and the data dir
    as they were. The temporary folder of the fetch is removed whatever happens. ``include``:
    paths (globs, relative to the source) the snapshot leaves out by default and should copy.
    """
    validate_name(name)
    patterns = check_include(include)
    fetched = fetch(source)
    workdir = fetched.temp or Path(tempfile.mkdtemp(prefix="openenv-gym-install-"))
    try:
        p = plan(fetched, workdir, kind, env_class, patterns)
        show(p.describe(name))
        if not yes:
            if ask is None:
                if not sys.stdin or not sys.stdin.isatty():
                    raise ConfigurationError(f"{name} was not installed: there is no terminal to ask for consent on; "
                                             "read the above and pass --yes to install without asking")
                ask = input
            if ask(f"install {name}? [y/N] ").strip().lower() not in ("y", "yes"):
                raise ConfigurationError(f"{name} was not installed (no consent)")
        # The staged copy is what the plan showed, so it is what is imported (a local folder edited
        # since is not); it holds the included files, which the snapshot of it keeps.
        with including(patterns):
            entry = import_source(p.staged.path, name, kind=p.found.kind, env_class=env_class, isolated=True,
                                  python=python, build=build, origin=fetched.origin, commit=fetched.commit)
        if entry.isolated is not None and entry.isolated.excluded != p.excluded:
            # What the original left out, not what the staged copy (already without it) did.
            entry = msgspec.structs.replace(entry, isolated=msgspec.structs.replace(entry.isolated,
                                                                                    excluded=p.excluded))
            add_entry(entry)
        return entry
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # the fetch's own temp folder, or the staging of a local one
