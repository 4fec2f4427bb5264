"""Turning a user's source (file or folder) into one catalog entry, decided statically.

Each backend's descriptor names its detector (``openenv_gym.adapters.<kind>.detect``); :func:`detect`
dispatches over :data:`DETECTORS`, so a bad source fails at ``openenv-gym import`` with a reason,
before anything is launched.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import msgspec

from openenv_gym import backends
from openenv_gym.errors import AmbiguousSource, DetectionError, SourceNotFound

__all__ = ["Detected", "DETECTORS", "precedence", "detect"]

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
