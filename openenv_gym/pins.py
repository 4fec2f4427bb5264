"""The versions openenv_gym was tested with, and how every resolution it starts is held to them.

The package resolves environments on the user's machine in three places: the Verifiers v1
harness programs (PEP 723 scripts the library hands to ``uv sync --script``), isolated venvs
(``isolate=True``, ``openenv-gym import --isolated``) and ``openenv-gym install``. Left alone, each
takes whatever is newest on the registry that day, so an upstream release can break an env that
worked yesterday without a line of ours changing. So the package ships, per supported Python, the
set CI tested (``openenv_gym/constraints/py3.X.txt``, written by ``.ci/pins.py`` from CI's venvs)
and hands it to every resolution:

* a venv that ``uv pip install`` builds gets it as a constraints file (:func:`constraints_for`),
  less every package the env's own requirements give a version for: the env's pins win;
* a PEP 723 script takes no constraints file (``uv sync --script`` reads none, and the library
  passes ``--no-config``), so a harness program gets the file's resolution date instead, as
  ``UV_EXCLUDE_NEWER``, and ``PIP_CONSTRAINT`` for the ``pip install uv`` the library may run
  first (:func:`script_env`).

Each line of a file caps one package at the newest version CI tested (``name<=version``): a
resolver takes that version where it can, and never a newer, untested one.

``OPENENV_GYM_CONSTRAINTS`` (:data:`CONSTRAINTS_VAR`) overrides the shipped set: a path to a
constraints file of the user's own (its ``# uv-exclude-newer:`` line, if any, dates the scripts),
or ``none`` to resolve without any.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from openenv_gym.errors import ConfigurationError

__all__ = ["CONSTRAINTS_VAR", "Pins", "active", "canonical", "constraints_for", "requirement_name",
           "script_env", "shipped"]

CONSTRAINTS_VAR = "OPENENV_GYM_CONSTRAINTS"
"""The environment variable that replaces the shipped constraints: a file's path, or ``none``."""

OFF = "none"
"""The value of :data:`CONSTRAINTS_VAR` that turns the constraints off."""

FOLDER = Path(__file__).with_name("constraints")
"""Where the shipped files are: ``py3.11.txt``, ``py3.12.txt``, ..."""

_DATE = re.compile(r"^#\s*uv-exclude-newer:\s*(\S+)\s*$", re.MULTILINE)
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them.

    >>> canonical("Ors_SDK")
    'ors-sdk'
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str | None:
    """The canonical distribution name a requirement line names (``None`` for ``-e path`` and options).

    >>> requirement_name("Verifiers[all]>=0.3.1,<0.4"), requirement_name("-e ./my_env")
    ('verifiers', None)
    """
    m = _NAME.match(requirement)
    return canonical(m[1]) if m and not requirement.lstrip().startswith("-") else None


def _gives_version(requirement: str) -> bool:
    """Whether a requirement says which versions it takes (``foo>=1``, ``foo==2``, ``foo @ url``)."""
    m = _NAME.match(requirement.split(";", 1)[0])
    return bool(m and m[3].strip())


@dataclass(frozen=True)
class Pins:
    """One constraints file: its path, its lines by package, and the date scripts resolve at."""

    path: Path
    lines: dict[str, str] = field(default_factory=dict)
    """Canonical name -> the line as written (``openai<=3.63.0``)."""
    exclude_newer: str | None = None
    """``# uv-exclude-newer: DATE``: what a PEP 723 script resolves against (``UV_EXCLUDE_NEWER``)."""

    @classmethod
    def read(cls, path: Path) -> Pins:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigurationError(f"cannot read the constraints file {path} ({CONSTRAINTS_VAR}): {exc.strerror}") from None
        lines: dict[str, str] = {}
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            name = requirement_name(line) if line else None
            if name:
                lines[name] = line
        date = _DATE.search(text)
        return cls(path, lines, date[1] if date else None)

    def version(self, name: str) -> str | None:
        """The version a line caps or pins ``name`` at (``3.63.0``), if it names one."""
        line = self.lines.get(canonical(name), "")
        m = re.search(r"(?:<=|==|===)\s*([^,;\s]+)", line)
        return m[1] if m else None


def _version_of(python: str | None) -> str:
    """``"3.11"`` for a version (``"3.11"``, ``"3.11.7"``), an interpreter path, or ``None`` (this one)."""
    if python is None:
        return f"{sys.version_info[0]}.{sys.version_info[1]}"
    m = re.fullmatch(r"(?:python)?(\d+)\.(\d+)(?:\.\d+)?", Path(python).name)
    if m:
        return f"{m[1]}.{m[2]}"
    import subprocess

    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return f"{sys.version_info[0]}.{sys.version_info[1]}"
    return out.stdout.strip()


def shipped(python: str | None = None) -> Path | None:
    """The shipped file for ``python`` (a version, an interpreter path, or this interpreter), if any."""
    path = FOLDER / f"py{_version_of(python)}.txt"
    return path if path.is_file() else None


def active(python: str | None = None) -> Pins | None:
    """The constraints in force for ``python``: the user's (:data:`CONSTRAINTS_VAR`), else the shipped file.

    ``None`` when the user turned them off or no file ships for that Python.
    """
    chosen = os.environ.get(CONSTRAINTS_VAR, "").strip()
    if chosen.lower() == OFF:
        return None
    if chosen:
        return Pins.read(Path(chosen).expanduser())
    path = shipped(python)
    return Pins.read(path) if path is not None else None


def constraints_for(requirements: Iterable[str], python: str | None = None) -> str | None:
    """The constraints text for a venv of ``requirements``, or ``None`` when none are in force.

    Every package a requirement gives a version for (``verifiers==0.4.0``, ``openai>=3``) is left
    out, so the env's own pins win; a bare name (``openai``) keeps the tested cap.
    """
    pins = active(python)
    if pins is None:
        return None
    own = {requirement_name(r) for r in requirements if _gives_version(r)}
    kept = [line for name, line in sorted(pins.lines.items()) if name not in own]
    header = f"# from {pins.path.name}, less the packages the env's own requirements give versions for\n"
    return header + "".join(f"{line}\n" for line in kept)


def script_env(python: str | None = None) -> dict[str, str]:
    """Environment variables that hold a PEP 723 script's resolution (a harness program) to the tested set.

    ``UV_EXCLUDE_NEWER`` (the file's date) unless the user set one, and ``PIP_CONSTRAINT`` (the file)
    for the ``pip install uv`` that a runtime may run before it. Empty when the constraints are off.
    """
    pins = active(python)
    if pins is None:
        return {}
    env: dict[str, str] = {}
    if pins.exclude_newer and not os.environ.get("UV_EXCLUDE_NEWER"):
        env["UV_EXCLUDE_NEWER"] = pins.exclude_newer
    if not os.environ.get("PIP_CONSTRAINT"):
        env["PIP_CONSTRAINT"] = str(pins.path.resolve())
    return env
