"""Turning a user's source (file or folder) into one catalog entry.

This package owns import-time decisions: which kind of environment a source holds, which single
class to serve from it, and whether the SDK server would accept that class -- all decided
statically, before anything is launched, so a bad source fails at ``openenv-gym import`` with an
explanation instead of at ``gym.make`` with a server traceback.

Each kind's descriptor (:mod:`openenv_gym.backends`) names its detector: ``"ors"`` (a Python
source of an ORS environment class: :func:`ors_source`), ``"fleet"`` (a JSON file of Fleet tasks:
:func:`fleet_source`), ``"verifiers"`` (a legacy ``load_environment`` module or a v1 Taskset
package: :func:`verifiers_source`) and ``"openenv"`` (an OpenEnv environment folder:
``openenv.yaml``, ``server/app.py``: :func:`openenv_source`). :func:`detect` dispatches over
:data:`DETECTORS` and picks the class; :func:`openenv_gym.importing.import_source` also validates the name and records the result
with :mod:`openenv_gym.importers.catalog`. This package reads sources; it never builds or runs
anything (isolated venvs are built by :mod:`openenv_gym.importing` on top of it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from openenv_gym import backends
from openenv_gym.errors import AmbiguousSource, DetectionError, SourceNotFound

if TYPE_CHECKING:
    from openenv_gym.importers.ors import EnvClassInfo, ToolInfo

__all__ = ["Detected", "DETECTORS", "precedence", "detect", "ors_source", "fleet_source", "verifiers_source",
           "openenv_source"]

class Detected(msgspec.Struct):
    """The one environment chosen from a source (``source`` is the resolved absolute path).

    For a Fleet task set ``env_class`` is empty and ``env_name`` is the environment key of its
    first task.
    """

    kind: str
    env_class: str
    env_name: str
    module_file: str
    sdk: str
    source: str


class KindDetector(NamedTuple):
    """How one kind is recognised (cheaply) and detected (fully, raising DetectionError)."""

    looks_like: Callable[[Path], bool]
    detect: Callable[[Path, str | None], Detected]


def _tool_problem(t: ToolInfo) -> str:
    if not t.valid:
        return f"{t.name} (dropped: needs `-> ToolOutput` and at most one parameter, a pydantic model)"
    if not t.listed:
        return f"{t.name} (not listed: shared=False)"
    return t.name


def _servable(env: EnvClassInfo) -> bool:
    if any(t.valid and t.listed and not t.terminal for t in env.tools):
        return True
    # openreward accepts an environment whose only tool is its @terminal one.
    return env.sdk == "openreward" and any(t.valid and t.terminal for t in env.tools)


def _pick(envs: list[EnvClassInfo], env_class: str | None, where: Path) -> EnvClassInfo:
    labels = [f"{e.module_file}:{e.class_name}" for e in envs]
    if env_class is None:
        if len(envs) > 1:
            raise AmbiguousSource(
                f"{where} defines {len(envs)} environments: {', '.join(labels)}; "
                "pass --env-class NAME (or env_class=) to pick one"
            )
        return envs[0]
    # "pkg/env.py:Cls" picks among same-named classes of different files.
    chosen = [e for e, label in zip(envs, labels) if env_class in (e.class_name, label)]
    if not chosen:
        raise DetectionError(f"no environment class {env_class!r} in {where}; found: {', '.join(labels)}")
    if len(chosen) > 1:
        raise AmbiguousSource(
            f"several environment classes are named {env_class!r} in {where}: "
            f"{', '.join(f'{e.module_file}:{e.class_name}' for e in chosen)}; pass --env-class FILE:NAME"
        )
    return chosen[0]


def ors_source(source: Path, env_class: str | None) -> Detected:
    """The ORS environment class ``source`` serves (DetectionError: none, or the server would refuse it)."""
    # Each kind's reader is imported when a source is read: registering the ids at `import
    # openenv_gym` reads none.
    from openenv_gym.importers.ors import detect_ors

    found = detect_ors(source)
    if not found.envs:
        skipped = ""
        if found.skipped:
            skipped = f" ({len(found.skipped)} could not be parsed: {', '.join(found.skipped)})"
        raise DetectionError(
            f"no ORS environment found in {source}: looked for classes deriving from ors.Environment or "
            "openreward.environments.Environment (directly or through local base classes) with at least "
            f"one @tool method, in {found.files_scanned} .py file(s){skipped}"
        )
    env = _pick(found.envs, env_class, source)
    label = f"{env.module_file}:{env.class_name}"
    server = "ors-sdk" if env.sdk == "ors" else "openreward"
    if env.missing:
        raise DetectionError(
            f"{label} does not define {', '.join(env.missing)} (on the class or its local base classes); "
            f"the {server} server would refuse it"
        )
    if not _servable(env):
        problems = ", ".join(_tool_problem(t) for t in env.tools)
        raise DetectionError(
            f"{label} has no tool the {server} server would list: {problems}; "
            "the server refuses an environment without tools"
        )
    return Detected(
        kind="ors",
        env_class=env.class_name,
        env_name=env.env_name,
        module_file=env.module_file,
        sdk=env.sdk,
        source=str(source),
    )


def fleet_source(source: Path, env_class: str | None) -> Detected:
    """The Fleet task set ``source`` holds."""
    from openenv_gym.importers.fleet import detect_fleet_tasks

    if env_class is not None:
        raise DetectionError("a Fleet task set has no environment classes; drop --env-class")
    tasks, _splits = detect_fleet_tasks(source)
    return Detected(kind="fleet", env_class="", env_name=tasks[0]["env_key"], module_file=source.name,
                    sdk="fleet-python", source=str(source))


def verifiers_source(source: Path, env_class: str | None) -> Detected:
    """The Verifiers environment (either generation) ``source`` defines."""
    from openenv_gym.importers.verifiers import detect_verifiers

    found = detect_verifiers(source)
    if env_class is not None and env_class != found.entry:
        raise DetectionError(f"{source} defines {found.entry}, not {env_class!r}")
    return Detected(kind="verifiers", env_class=found.entry, env_name=found.module,
                    module_file=Path(found.path).name, sdk=found.generation, source=found.path)


def openenv_source(source: Path, env_class: str | None) -> Detected:
    """The OpenEnv environment folder ``source`` is."""
    from openenv_gym.importers.openenv import detect_openenv

    found = detect_openenv(source)
    if env_class is not None and env_class != found.app:
        raise DetectionError(f"{source} serves {found.app}, not {env_class!r}")
    return Detected(kind="openenv", env_class=found.app, env_name=found.name,
                    module_file=found.app.partition(":")[0].replace(".", "/") + ".py",
                    sdk=str(found.manifest.get("version") or "openenv"), source=found.folder)


class _Detectors(Mapping[str, KindDetector]):
    """Kind -> its detector, read from the backends' descriptors when asked (a backend registered
    later, by a plugin or a test, is detected too)."""

    def _table(self) -> dict[str, KindDetector]:
        return {b.kind: KindDetector(backends.resolve(b.looks_like), backends.resolve(b.detect))
                for b in backends.backends() if b.looks_like is not None and b.detect is not None}

    def __getitem__(self, kind: str) -> KindDetector:
        return self._table()[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


DETECTORS: Mapping[str, KindDetector] = _Detectors()
"""Every importable kind and its detector."""


def precedence() -> tuple[str, ...]:
    """Kinds whose signal is a manifest saying what serves the folder: when one matches, matches of
    other kinds are ignored. A folder ``openenv import`` made is both an OpenEnv environment and an
    ORS (or Verifiers) source, vendored inside it; its ``openenv.yaml`` says how it is served."""
    return tuple(b.kind for b in backends.backends() if b.precedence)



def detect(source: str | os.PathLike[str], kind: str | None = None, env_class: str | None = None) -> Detected:
    """Statically find the environment class to serve from ``source`` (a file or a folder).

    ``kind`` skips kind detection; ``env_class`` (``Name`` or ``module_file:Name``) picks one class
    when the source defines several. Never imports or runs the source.
    """
    path = Path(source).expanduser()
    if not path.exists():
        raise SourceNotFound(f"import source {path} does not exist")
    path = path.resolve()
    detectors = dict(DETECTORS)
    supported = ", ".join(repr(k) for k in detectors)
    if kind is not None:
        if kind not in detectors:
            raise DetectionError(f"unsupported kind {kind!r}; supported kinds: {supported}")
        return detectors[kind].detect(path, env_class)
    matching = [k for k, d in detectors.items() if d.looks_like(path)]
    first = precedence()
    matching = [k for k in matching if k in first] or matching
    if len(matching) == 1:
        return detectors[matching[0]].detect(path, env_class)
    if len(matching) > 1:
        raise AmbiguousSource(f"{path} looks like several kinds ({', '.join(matching)}); pass --kind")
    # Nothing matched the cheap checks: run each detector for the error that says what it wanted.
    reasons = []
    for k, d in detectors.items():
        try:
            return d.detect(path, env_class)
        except AmbiguousSource:
            raise
        except DetectionError as exc:
            reasons.append(str(exc) if len(detectors) == 1 else f"{k}: {exc}")
    raise DetectionError("; ".join(reasons))
