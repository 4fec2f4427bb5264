"""Backends: one descriptor per ecosystem openenv_gym plays, and the table every part reads.

A backend is its adapter, the extra that brings its dependencies, what ``gym.make`` needs from
the user, the kwargs that rebuild one of its catalog entries, its static detector and its
discovery of installed environment packages. Registration (the built-in ids, the catalog,
discovered packages, ``isolate=True``), detection (``openenv-gym import``) and the CLI (``--kind``,
``list``) all read :func:`backends`; adding one is one :func:`register` call, from this package or
from anyone's code, with nothing else to edit.

References to code are ``"module:name"`` strings, resolved when first used (:func:`resolve`), so
this table imports nothing of the package and sits below every part that reads it; a descriptor
built elsewhere may give the callables themselves.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Backend", "register", "unregister", "backends", "get", "resolve", "kind_of_adapter"]

Ref = str | Callable[..., Any]
"""A callable, or where to find it: ``"module:name"``."""


@dataclass(frozen=True)
class Backend:
    """What openenv_gym knows of one ecosystem."""

    kind: str
    """The catalog kind (``openenv-gym import --kind``)."""
    adapter: str
    """The adapter that plays it: ``"module:Class"``, or a front door returning the spec to build."""
    needs: str
    """What ``gym.make`` of the built-in id needs from the user (shown by ``openenv-gym list``)."""
    extra: str | None = None
    """The ``pip install 'openenv-gym[extra]'`` that brings its dependencies."""
    builtin: str | None = None
    """The name of its built-in id (``"ORS"``: ``openenv/ORS-v0``)."""
    looks_like: Ref | None = None
    """``(path) -> bool``: a cheap check that a source is of this kind."""
    detect: Ref | None = None
    """``(path, env_class) -> Detected``: the full static detection (``DetectionError`` says what it
    looked for)."""
    catalog_kwargs: Ref | None = None
    """``(entry) -> dict``: the ``gym.make`` kwargs that rebuild a catalog entry of this kind."""
    discover: Ref | None = None
    """``() -> list[dict]``: installed environment packages of this kind (each with a ``name``)."""
    discovered_kwargs: Ref | None = None
    """``(found) -> dict``: the kwargs that play one discovered package."""
    precedence: bool = False
    """A source that matches this kind is of this kind even if others match too (a manifest that
    says how the folder is served)."""
    family: tuple[str, ...] = ()
    """Modules of adapters that belong to this kind besides :attr:`adapter`'s (``isolate=True``
    builds the venv of the kind whose adapter an id names)."""


_lock = threading.Lock()
_table: dict[str, Backend] = {}


def register(backend: Backend) -> None:
    """Add (or replace) the descriptor of ``backend.kind``."""
    with _lock:
        _table[backend.kind] = backend


def unregister(kind: str) -> None:
    """Forget a kind (for a test's own backend)."""
    with _lock:
        _table.pop(kind, None)


def backends() -> list[Backend]:
    """Every descriptor, in the order they were registered."""
    with _lock:
        return list(_table.values())


def get(kind: str) -> Backend | None:
    return _table.get(kind)


def resolve(ref: Ref) -> Callable[..., Any]:
    """The callable ``ref`` names (``"module:name"``), or ``ref`` itself."""
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def kind_of_adapter(entry: str) -> str | None:
    """The kind whose adapter ``entry`` (``"module:Class"``) is: its own, or one of its family."""
    module = entry.partition(":")[0]
    for backend in backends():
        home = backend.adapter.partition(":")[0]
        if module == home or module in backend.family:
            return backend.kind
    return None


for _backend in (
    Backend(
        kind="ors", adapter="openenv_gym.adapters.ors:ORSAdapter", extra="ors", builtin="ORS",
        needs="url= (a running ORS server) or source= (a file or folder)",
        looks_like="openenv_gym.importers.ors:looks_like_ors", detect="openenv_gym.importers:ors_source",
        catalog_kwargs="openenv_gym.importers.catalog:ors_kwargs",
        family=("openenv_gym.adapters.ors_transport",),
    ),
    Backend(
        kind="fleet", adapter="openenv_gym.adapters.fleet:FleetAdapter", extra="fleet", builtin="Fleet",
        needs="env_key=, task= or tasks= (a task file), and api_key= or $FLEET_API_KEY",
        looks_like="openenv_gym.importers.fleet:looks_like_fleet", detect="openenv_gym.importers:fleet_source",
        catalog_kwargs="openenv_gym.importers.catalog:fleet_kwargs",
    ),
    Backend(
        kind="verifiers", adapter="openenv_gym.adapters.verifiers:adapter_spec", extra="verifiers",
        builtin="Verifiers", needs="env_id= (an installed environment) or source= (a file or folder)",
        looks_like="openenv_gym.importers.verifiers:looks_like_verifiers",
        detect="openenv_gym.importers:verifiers_source",
        catalog_kwargs="openenv_gym.importers.catalog:verifiers_kwargs",
        discover="openenv_gym.importers.verifiers:discover_installed",
        discovered_kwargs="openenv_gym.importers.catalog:discovered_verifiers_kwargs",
        family=("openenv_gym.adapters.verifiers_v0", "openenv_gym.adapters.verifiers_v1"),
    ),
    Backend(
        kind="openenv", adapter="openenv_gym.adapters.openenv:OpenEnvAdapter", extra="openenv", builtin="OpenEnv",
        needs="url= (a running OpenEnv server) or source= (an env folder or installed env package)",
        looks_like="openenv_gym.importers.openenv:looks_like_openenv", detect="openenv_gym.importers:openenv_source",
        catalog_kwargs="openenv_gym.importers.catalog:openenv_kwargs",
        discover="openenv_gym.importers.openenv:discover_installed",
        discovered_kwargs="openenv_gym.importers.catalog:discovered_openenv_kwargs",
        precedence=True, family=("openenv_gym.adapters.openenv_transport",),
    ),
):
    register(_backend)
