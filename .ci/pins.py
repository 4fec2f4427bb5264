"""Write the tested set (openenv_gym/constraints/py3.X.txt) from the venvs CI tested with.

    python .ci/pins.py [--exclude-newer DATE] VENV [VENV ...]

Each VENV is a venv CI ran its suites in (.venv, .venv-py3.12, .venv-py3.13, .venv-mcp2,
.venv-vf04, .venv-trl). For each Python among them, one file caps every installed distribution at
the newest version any venv of that Python holds (``name<=version``); a distribution that only
venvs of another Python hold gets that Python's cap, in a section of its own (the extras CI runs
under 3.11 alone). ``--exclude-newer`` sets the date PEP 723 scripts (the Verifiers harness
programs) resolve at; without it each file keeps the date it had. openenv_gym reads these files
through ``openenv_gym.pins``; ``.ci/run`` installs with them.

To move the tested set forward: build the venvs without constraints (``.ci/upstream`` shows what
that resolves and whether it passes), run CI's suites in them, then this script, then CI again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "openenv_gym" / "constraints"
SKIP = {"openenv-gym", "pip", "setuptools", "wheel"}  # this package, and the installers themselves
DATE = re.compile(r"^#\s*uv-exclude-newer:\s*(\S+)\s*$", re.MULTILINE)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(venv: Path) -> tuple[str, dict[str, Version]]:
    """(``"3.11"``, canonical name -> version) of a venv, read by its own interpreter."""
    code = ("import sys, json, importlib.metadata as m; "
            "print(json.dumps(['%d.%d' % sys.version_info[:2], "
            "[[d.metadata['Name'], d.version] for d in m.distributions()]]))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    python, dists = json.loads(out.stdout)
    return python, {canonical(n): Version(v) for n, v in dists if n and canonical(n) not in SKIP}


def cap(version: Version) -> str:
    return version.base_version if version.local else str(version)  # <= takes no local label


def merge(into: dict[str, Version], found: dict[str, Version]) -> None:
    for name, version in found.items():
        if name not in into or version > into[name]:
            into[name] = version


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("venvs", nargs="+", type=Path)
    parser.add_argument("--exclude-newer", help="RFC 3339 date for PEP 723 scripts (default: keep each file's)")
    args = parser.parse_args()
    by_python: dict[str, dict[str, Version]] = {}
    sources: dict[str, list[str]] = {}
    for venv in args.venvs:
        python, found = installed(venv)
        merge(by_python.setdefault(python, {}), found)
        sources.setdefault(python, []).append(venv.name)
    FOLDER.mkdir(exist_ok=True)
    today = datetime.date.today().isoformat()
    for python, own in sorted(by_python.items()):
        others: dict[str, Version] = {}
        for other, found in by_python.items():
            if other != python:
                merge(others, {n: v for n, v in found.items() if n not in own})
        path = FOLDER / f"py{python}.txt"
        old = DATE.search(path.read_text()) if path.is_file() else None
        date = args.exclude_newer or (old[1] if old else None)
        lines = [f"# The versions openenv_gym was tested with under Python {python}: no release newer than these.",
                 f"# Written by .ci/pins.py on {today} from CI's venvs {', '.join(sorted(sources[python]))}; do not edit by hand.",
                 "# pip: pip install -c THIS_FILE ...; openenv_gym hands it to uv itself (OPENENV_GYM_CONSTRAINTS overrides it)."]
        if date:
            lines += ["# The date PEP 723 scripts (the Verifiers harness programs) resolve at, as UV_EXCLUDE_NEWER:",
                      f"# uv-exclude-newer: {date}"]
        lines += [f"{name}<={cap(v)}" for name, v in sorted(own.items())]
        if others:
            lines += [f"# Tested under another Python only (CI runs these extras under {', '.join(sorted(set(by_python) - {python}))}):"]
            lines += [f"{name}<={cap(v)}" for name, v in sorted(others.items())]
        path.write_text("\n".join(lines) + "\n")
        print(f"{path.relative_to(ROOT)}: {len(own)} packages tested here, {len(others)} elsewhere")
    return 0


if __name__ == "__main__":
    sys.exit(main())
