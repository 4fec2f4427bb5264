"""Venvs of isolated envs: a source's requirements, and the venv ``uv`` builds from them.

What goes in (:func:`requirements_for`): the source's own requirements (``[project].dependencies``
of its project's ``pyproject.toml``, the lines of its ``requirements.txt``, and the project itself
when the source is a package inside it: see :func:`source_requirements`), the SDK its kind needs
(the matching extra of this package, unless the source names that SDK itself: its pin wins), and
this package (editable if this one is, so a host runs the same code as the driver). A legacy
Verifiers source (``load_environment``) gets ``verifiers<0.4``: later releases dropped that API.

Where it is built (:func:`ensure_venv`): ``<data dir>/venvs/<hash>``, the hash of the sorted
requirements and the interpreter, so that two envs with the same requirements share one venv and
a change of requirements builds a new one. A file lock makes concurrent builders (several host
processes, several Ray actors of one node) wait for one build; a ``.complete`` marker written last
means a crash mid-build is rebuilt, never used half-built. ``uv`` never downloads an interpreter
here (``UV_PYTHON_DOWNLOADS=never``): ``--python 3.12`` needs that Python on the machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path

from openenv_gym import backends
from openenv_gym.errors import ConfigurationError
from openenv_gym.isolation.paths import venvs_dir
from openenv_gym.pins import CONSTRAINTS_VAR, constraints_for, requirement_name

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["BUILD_TIMEOUT", "requirements_for", "source_requirements", "project_of", "ensure_venv", "venv_python",
           "python_for", "this_package"]

DISTRIBUTION = "openenv-gym"
BUILD_TIMEOUT = 1800.0
"""Seconds a venv build may take (downloads included) before it is a typed error."""

_FORMAT = 1  # bump when the venv layout changes: old venvs are then rebuilt, not reused
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _extra(extra: str) -> list[str]:
    """This package's requirements for ``extra``, without their markers."""
    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return []
    out = []
    for line in requires:
        requirement, _, marker = line.partition(";")
        m = _EXTRA_MARKER.search(marker)
        if m and m[1] == extra:
            # Keep the requirement's own condition (a platform), drop the extra's (this
            # package's extras join conditions with ``and`` only).
            rest = " and ".join(p.strip() for p in re.split(r"\band\b", marker) if not _EXTRA_MARKER.search(p))
            out.append(requirement.strip().replace(" ", "") + (f"; {rest}" if rest else ""))
    return out


def _sdk_requirements(kind: str, sdk: str | None) -> tuple[list[str], set[str]]:
    """The SDK an adapter of ``kind`` needs in the host's venv (``sdk`` picks among several), and
    which of those lines the backend added to its extra's: bounds a source's own pin cannot lift."""
    backend = backends.get(kind)
    if backend is None or (backend.extra is None and backend.venv_requirements is None):
        usable = ", ".join(b.kind for b in backends.backends() if b.extra or b.venv_requirements)
        raise ConfigurationError(f"no isolated venv for kind {kind!r}: use one of {usable}")
    extra = _extra(backend.extra) if backend.extra else []
    wanted = backends.resolve(backend.venv_requirements)(sdk, list(extra)) if backend.venv_requirements else extra
    return wanted, set(wanted) - set(extra)


def this_package() -> str:
    """How a venv installs this package: the same checkout (editable if this one is), or the same release."""
    # Several records may answer to the name (a checkout's own egg-info on sys.path): the installed
    # one says where it came from in direct_url.json.
    version = None
    for dist in metadata.distributions(name=DISTRIBUTION):
        version = version or dist.version
        direct = dist.read_text("direct_url.json")
        if direct:
            info = json.loads(direct)
            url = info.get("url", "")
            if url.startswith("file://"):
                path = url[len("file://"):]
                return f"-e {path}" if info.get("dir_info", {}).get("editable") else path
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "openenv_gym").is_dir():
        return f"-e {checkout}"  # run from a checkout that was never installed
    return f"{DISTRIBUTION}=={version}" if version else DISTRIBUTION


def _requirement_lines(text: str, where: Path) -> list[str]:
    lines = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            # Options (-r, -e, --index-url ...) could reach beyond the registries or out of the
            # source: refused by name rather than dropped, so the venv is never quietly incomplete.
            raise ConfigurationError(f"{where}: option lines are not supported in an isolated import: {line.split()[0]}")
        lines.append(line)
    return lines


def project_of(source: str | os.PathLike[str]) -> Path | None:
    """The project folder (holding ``pyproject.toml``) a source belongs to, if any.

    The source's own folder (a file's folder), or, for a package folder without one, its parent:
    the way Verifiers environments are packaged (``my-env/pyproject.toml`` beside
    ``my-env/my_env/__init__.py``), where the catalog records the package folder.
    """
    path = Path(source)
    folder = path if path.is_dir() else path.parent
    if (folder / "pyproject.toml").is_file():
        return folder
    if (folder / "__init__.py").is_file() and (folder.parent / "pyproject.toml").is_file():
        return folder.parent
    return None


def _read_pyproject(pyproject: Path) -> dict:
    try:
        data = tomllib.loads(pyproject.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{pyproject} is not valid TOML: {exc}") from None
    deps = data.get("project", {}).get("dependencies", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise ConfigurationError(f"{pyproject}: [project].dependencies must be a list of strings")
    return data


def source_requirements(source: str | os.PathLike[str] | None) -> list[str]:
    """The requirements a source declares: its project's dependencies and ``requirements.txt``.

    The project is :func:`project_of` the source. When the source is a module or package *inside*
    its project (``my-env/my_env/`` or ``my-env/my_env.py`` beside ``my-env/pyproject.toml``) and
    the project can be built (a ``[project]`` table, or a ``[build-system]``), the project itself
    is installed too, editable (``-e <project>``: its package data and entry points, and the
    source keeps running from its own folder). A source that *is* the project folder (an ORS or
    OpenEnv folder) gets only the dependencies.
    """
    if source is None:
        return []
    path = Path(source)
    folder = path if path.is_dir() else path.parent
    project = project_of(path)
    found: list[str] = []
    if project is not None:
        data = _read_pyproject(project / "pyproject.toml")
        found += [d.strip() for d in data.get("project", {}).get("dependencies", [])]
        inside = path.resolve() != project.resolve()
        if inside and ("build-system" in data or data.get("project", {}).get("name")):
            found.append(f"-e {project.resolve()}")
    for where in dict.fromkeys(p for p in (folder, project) if p is not None):
        requirements = where / "requirements.txt"
        if requirements.is_file():
            found += _requirement_lines(requirements.read_text(), requirements)
    return list(dict.fromkeys(found))


def requirements_for(kind: str, source: str | os.PathLike[str] | None, sdk: str | None = None,
                     extra: Sequence[str] = ()) -> list[str]:
    """Everything the venv of a ``kind`` source needs: its own requirements, its SDK, this package.

    The source's pin of its SDK wins over this package's, except a bound the backend adds
    (the legacy Verifiers ``verifiers<0.4``, which a v0 source always gets: a project that depends
    on a bare ``verifiers`` would otherwise resolve to 0.4, which has no v0 API).
    """
    own = [*source_requirements(source), *extra]
    named = {requirement_name(r) for r in own if not r.startswith("-")}
    wanted, forced = _sdk_requirements(kind, sdk)
    sdk_reqs = [r for r in wanted if requirement_name(r) not in named or r in forced]
    seen: dict[str, None] = {}
    for r in [*own, *sdk_reqs, this_package()]:
        seen.setdefault(r, None)
    return list(seen)


def _uv() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise ConfigurationError("isolated envs need uv: pip install uv")


def _interpreter(python: str | None) -> str:
    """What ``uv venv --python`` gets: the driver's interpreter unless a version or path is named."""
    return python or sys.executable


def _key(requirements: Sequence[str], python: str | None, constraints: str | None) -> str:
    version = python or f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    blob = json.dumps({"format": _FORMAT, "python": version, "requirements": sorted(requirements),
                       "constraints": constraints})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _run(cmd: list[str], log: Path, env: dict[str, str], deadline: float, hint: str = "") -> None:
    import time

    with open(log, "ab") as out:
        out.write(("$ " + " ".join(cmd[1:]) + "\n").encode())
        out.flush()
        try:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                  timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise ConfigurationError(f"building the venv took longer than {BUILD_TIMEOUT:.0f} s; see {log}") from None
    if done.returncode:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        raise ConfigurationError(f"building the venv failed (uv exited with {done.returncode}){hint}; the end of {log}:\n"
                                 + "\n".join(tail))


def ensure_venv(requirements: Sequence[str], python: str | None = None) -> Path:
    """The venv holding ``requirements`` (built now if not yet, minutes at most once); its folder.

    ``python`` is a version (``"3.12"``) or an interpreter path; default: this interpreter.
    The resolution is held to the tested versions (:func:`openenv_gym.pins.constraints_for`: the
    requirements' own version pins win), which are part of the venv's hash: new pins, new venv.
    Raises :class:`~openenv_gym.errors.ConfigurationError` with the end of uv's log when the
    requirements cannot be resolved or installed (a conflict, a missing Python), or after
    :data:`BUILD_TIMEOUT`.
    """
    import time

    root = venvs_dir()
    constraints = constraints_for(requirements, python)
    venv = root / _key(requirements, python, constraints)
    marker = venv / ".complete"
    if marker.is_file():
        return venv
    with _lock(root / f"{venv.name}.lock"):
        if marker.is_file():  # built by whoever held the lock before us
            return venv
        if venv.exists():
            shutil.rmtree(venv)  # a build that crashed half-way
        deadline = time.monotonic() + BUILD_TIMEOUT
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "VIRTUAL_ENV": ""}
        env.pop("VIRTUAL_ENV")
        uv = _uv()
        log = root / f"{venv.name}.log"
        log.write_text("")
        _run([uv, "venv", "--quiet", "--python", _interpreter(python), str(venv)], log, env, deadline)
        listed = venv / "requirements.txt"
        listed.write_text("\n".join(requirements) + "\n")
        install = [uv, "pip", "install", "--python", str(venv_python(venv)), "-r", str(listed)]
        hint = ""
        if constraints is not None:
            pinned = venv / "constraints.txt"
            pinned.write_text(constraints)
            install += ["-c", str(pinned)]
            hint = (f" under the tested versions ({pinned}; {CONSTRAINTS_VAR}=none resolves without them, "
                    "or pin the package in the env's own requirements)")
        try:
            _run(install, log, env, deadline, hint)
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        shutil.move(str(log), venv / "build.log")
        marker.write_text(json.dumps({"requirements": list(requirements), "python": python,
                                      "constraints": constraints is not None}) + "\n")
    return venv


def python_for(kind: str, source: str | os.PathLike[str] | None, sdk: str | None = None,
               python: str | None = None, requirements: Sequence[str] | None = None) -> str:
    """The interpreter of the isolated venv of a ``kind`` source (built first if need be).

    ``sdk`` (which SDK or generation) is detected statically from ``source`` when not given.
    ``requirements`` replaces the computed list (the catalog's record of an install).
    """
    if requirements is None:
        if sdk is None and source is not None and kind in ("ors", "verifiers"):
            from openenv_gym.importers import detect

            with contextlib.suppress(Exception):  # detection failing leaves the default SDK set
                sdk = detect(source, kind=kind).sdk
        requirements = requirements_for(kind, source, sdk)
    return str(venv_python(ensure_venv(requirements, python)))
