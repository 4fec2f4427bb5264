"""Importing a source: detect what it is, snapshot it and build its venv if isolated, record it.

``openenv-gym import`` and ``openenv-gym install`` end here. Detection is
:mod:`openenv_gym.importers` (static, it never runs the source); isolation (the snapshot and the
venv) is :mod:`openenv_gym.isolation`; the catalog entry is written by
:mod:`openenv_gym.importers.catalog`. This module sits above all three.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from openenv_gym.errors import DetectionError
from openenv_gym.importers import detect
from openenv_gym.importers.catalog import CatalogEntry, Isolation, add_entry, validate_name

__all__ = ["import_source"]


def import_source(
    source: str | os.PathLike[str],
    name: str,
    kind: str | None = None,
    env_class: str | None = None,
    catalog: str | os.PathLike[str] | None = None,
    *,
    isolated: bool = False,
    python: str | None = None,
    build: bool = True,
    origin: str | None = None,
    commit: str | None = None,
) -> CatalogEntry:
    """Detect the environment in ``source`` and record it in the catalog as ``name``.

    ``isolated=True`` snapshots the source into the data dir (secrets and caches left out, see
    :mod:`openenv_gym.isolation.snapshot`), records the requirements of its own venv and builds
    that venv with uv now (``build=False`` leaves it to the first ``gym.make``); ``python`` picks
    the venv's Python version. The id then plays the snapshot in a host process under that venv.
    ``origin`` and ``commit`` record where an install fetched the source from.
    """
    validate_name(name)
    if python is not None and not isolated:
        raise DetectionError("--python picks the interpreter of an isolated import: add --isolated")
    found = detect(source, kind=kind, env_class=env_class)
    isolation = None
    if isolated:
        from openenv_gym.isolation.snapshot import snapshot
        from openenv_gym.isolation.venvs import ensure_venv, requirements_for

        snap = snapshot(source, name)
        found = detect(snap.path, kind=found.kind, env_class=env_class)
        requirements = requirements_for(found.kind, found.source, found.sdk)
        venv = str(ensure_venv(requirements, python)) if build else None
        isolation = Isolation(requirements=requirements, python=python, venv=venv, excluded=snap.excluded)
        origin = origin or str(Path(source).expanduser().resolve())
    entry = CatalogEntry(
        name=name,
        kind=found.kind,
        source=found.source,
        env_class=found.env_class or None,
        env_name=found.env_name,
        module_file=found.module_file,
        sdk=found.sdk,
        added_at=datetime.now(UTC).isoformat(timespec="seconds"),
        isolated=isolation,
        origin=origin,
        commit=commit,
    )
    add_entry(entry, path=catalog)
    return entry
