"""Backends: one descriptor per ecosystem openenv_gym plays, and the table every part reads.

A backend is one folder (``openenv_gym/adapters/<kind>/``) whose ``__init__`` registers its
:class:`Backend`; registration, detection, isolation and the CLI read only this table, so adding
one is one :func:`register` call. References to code are ``"module:name"`` strings resolved on
first use (:func:`resolve`): the table imports nothing of the package and sits below every reader.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Backend", "register", "unregister", "backends", "get", "resolve", "kind_of_adapter", "lazy_names"]

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
    """Modules of adapters that belong to this kind besides those in :attr:`adapter`'s package
    (``isolate=True`` builds the venv of the kind whose adapter an id names)."""
    venv_requirements: Ref | None = None
    """``(sdk, extra) -> list[str]``: what an isolated venv of a source written against ``sdk`` needs
    of :attr:`extra`'s requirements (``extra``); left out, all of them."""


BUILTIN = ("openenv_gym.adapters.ors", "openenv_gym.adapters.fleet", "openenv_gym.adapters.verifiers",
           "openenv_gym.adapters.openenv")
"""The packages of the built-in backends: importing one registers it (its ``__init__`` holds the
descriptor and nothing heavy)."""

_lock = threading.Lock()
_table: dict[str, Backend] = {}
_loaded = threading.Lock()
_builtins_in = False


def _load_builtins() -> None:
    """Register the built-in backends once, on the first read of the table."""
    global _builtins_in
    if _builtins_in:
        return
    with _loaded:  # not _lock: each import below calls register()
        if not _builtins_in:
            for package in BUILTIN:
                importlib.import_module(package)
            _builtins_in = True


def register(backend: Backend) -> None:
    """Add (or replace) the descriptor of ``backend.kind``."""
    with _lock:
        _table[backend.kind] = backend


def unregister(kind: str) -> None:
    """Forget a kind (for a test's own backend)."""
    with _lock:
        _table.pop(kind, None)


def backends() -> list[Backend]:
    """Every descriptor, in the order they were registered (the built-ins first)."""
    _load_builtins()
    with _lock:
        return list(_table.values())


def get(kind: str) -> Backend | None:
    _load_builtins()
    return _table.get(kind)


def resolve(ref: Ref) -> Callable[..., Any]:
    """The callable ``ref`` names (``"module:name"``), or ``ref`` itself."""
    if callable(ref):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def lazy_names(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A package's ``__getattr__`` that imports each of ``names`` (name -> its module) on first use,
    so importing the package (a backend's descriptor, the adapter API) stays cheap."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__


def kind_of_adapter(entry: str) -> str | None:
    """The kind whose adapter ``entry`` (``"module:Class"``) is: its own, or one of its family."""
    module = entry.partition(":")[0]
    for backend in backends():
        home = backend.adapter.partition(":")[0]
        package = home.rpartition(".")[0]
        if module in (home, package) or module.startswith(f"{package}.") or module in backend.family:
            return backend.kind
    return None
