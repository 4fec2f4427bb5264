"""Gymnasium registration of every environment openenv_gym knows.

Gymnasium 1.x loads no plugins, so ``import openenv_gym`` registers everything here, from three
places:

1. built-ins: ``openenv/ORS-v0`` (any ORS server or source, by kwargs), ``openenv/Fleet-v0`` (any
   Fleet environment or task set, by kwargs) and the bundled examples;
2. installed Verifiers environment packages (distributions that depend on ``verifiers``);
3. installed packages exposing the entry-point group ``openenv_gym.envs``: each entry point is a
   callable returning an iterable of dicts with ``id``, ``entry_point`` and optional ``kwargs``;
4. the user's catalog of imported sources (``openenv-gym import``), last, so that a name the user
   chose wins over a discovered one.

Every id lives in the ``openenv`` namespace, is registered ``nondeterministic=True`` (a remote
backend may answer differently for the same seed) and with ``order_enforce=False``: AgentEnv
enforces reset-before-step itself with :mod:`openenv_gym.errors` exceptions.
"""

from __future__ import annotations

import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

import gymnasium as gym

from openenv_gym.errors import CatalogError, ConfigurationError

__all__ = ["NAMESPACE", "register_all", "list_environments", "env_info", "env_id"]

NAMESPACE = "openenv"
ENTRY_POINT_GROUP = "openenv_gym.envs"
_EXAMPLES = Path(__file__).parent / "examples"

# kind of a catalog entry -> the Gymnasium entry point that builds it
ENTRY_POINTS: dict[str, str] = {
    "ors": "openenv_gym.adapters.ors:make_env",
    "fleet": "openenv_gym.adapters.fleet:make_env",
    "verifiers": "openenv_gym.adapters.verifiers:make_env",
}
VECTOR_ENTRY_POINTS: dict[str, str] = {
    "ors": "openenv_gym.adapters.ors:make_vec",
    "fleet": "openenv_gym.adapters.fleet:make_vec",
    "verifiers": "openenv_gym.adapters.verifiers:make_vec",
}


def env_id(name: str) -> str:
    """The Gymnasium id of an openenv_gym environment called ``name``."""
    return f"{NAMESPACE}/{name}-v0"


def _register(id: str, entry_point: str, kwargs: dict[str, Any], **extra: Any) -> None:
    kind = next((k for k, v in ENTRY_POINTS.items() if v == entry_point), None)
    if kind in VECTOR_ENTRY_POINTS and "vector_entry_point" not in extra:
        extra["vector_entry_point"] = VECTOR_ENTRY_POINTS[kind]
    if id in gym.registry:
        del gym.registry[id]  # re-registration (a re-import of the catalog) should not warn
    gym.register(
        id=id,
        entry_point=entry_point,
        kwargs=kwargs,
        nondeterministic=True,
        order_enforce=False,
        **extra,
    )


def register_builtins() -> None:
    """Register ``openenv/ORS-v0``, ``openenv/Fleet-v0``, ``openenv/Verifiers-v0`` and the examples."""
    _register(env_id("ORS"), ENTRY_POINTS["ors"], {})
    _register(env_id("Fleet"), ENTRY_POINTS["fleet"], {})
    _register(env_id("Verifiers"), ENTRY_POINTS["verifiers"], {})
    _register(
        env_id("Arithmetic"),
        ENTRY_POINTS["ors"],
        {"source": str(_EXAMPLES / "arithmetic.py"), "env_class": "Arithmetic", "max_turns": 8},
    )


def register_catalog() -> list[str]:
    """Register every entry of the user catalog; returns the ids. A broken catalog only warns."""
    from openenv_gym.importers.catalog import load_catalog

    try:
        entries = load_catalog()
    except CatalogError as exc:
        warnings.warn(f"openenv_gym: the catalog was not loaded: {exc}", stacklevel=2)
        return []
    ids = []
    for entry in entries.values():
        entry_point = ENTRY_POINTS.get(entry.kind)
        if entry_point is None:
            warnings.warn(f"openenv_gym: catalog entry {entry.name!r} has unknown kind {entry.kind!r}", stacklevel=2)
            continue
        _register(env_id(entry.name), entry_point, {**_catalog_kwargs(entry), **entry.options})
        ids.append(env_id(entry.name))
    return ids


def _catalog_kwargs(entry: Any) -> dict[str, Any]:
    """The ``gym.make`` kwargs that rebuild a catalog entry, per kind."""
    if entry.kind == "fleet":
        return {"tasks": entry.source}
    if entry.kind == "verifiers":
        return {"source": entry.source, "generation": entry.sdk}
    kwargs = {"source": entry.source}
    for key in ("env_class", "env_name", "module_file"):
        if getattr(entry, key, None):
            kwargs[key] = getattr(entry, key)
    return kwargs


def register_verifiers_packages() -> list[str]:
    """Register installed Verifiers environment packages as ``openenv/<distribution>-v0``.

    Discovery reads installed metadata only (cached per set of installed distributions); the
    environments are loaded when made. A failure only warns: it must not break the import.
    """
    from openenv_gym.importers.verifiers import discover_installed

    try:
        found = discover_installed()
    except Exception as exc:
        warnings.warn(f"openenv_gym: Verifiers discovery failed: {exc!r}", stacklevel=2)
        return []
    ids = []
    for env in found:
        id = env_id(env["name"])
        _register(id, ENTRY_POINTS["verifiers"], {"env_id": env["module"], "generation": env["generation"]})
        ids.append(id)
    return ids


def register_entry_points() -> list[str]:
    """Register the environments of installed packages (entry-point group ``openenv_gym.envs``)."""
    ids = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            for spec in ep.load()():
                _register(spec["id"], spec["entry_point"], dict(spec.get("kwargs", {})))
                ids.append(spec["id"])
        except Exception as exc:  # one broken plugin must not break `import openenv_gym`
            warnings.warn(f"openenv_gym: entry point {ep.name!r} failed: {exc!r}", stacklevel=2)
    return ids


def register_all() -> None:
    """Register built-ins, the catalog and entry points (called by ``import openenv_gym``)."""
    register_builtins()
    register_verifiers_packages()
    register_entry_points()
    register_catalog()


def list_environments() -> list[str]:
    """Every registered id in the ``openenv`` namespace, sorted."""
    return sorted(i for i in gym.registry if i.startswith(f"{NAMESPACE}/"))


def env_info(id: str) -> dict[str, Any]:
    """What an id is: its entry point and kwargs (secrets redacted), without building it."""
    if id not in gym.registry:
        raise ConfigurationError(f"{id!r} is not registered; known: {', '.join(list_environments())}")
    spec = gym.registry[id]
    from openenv_gym.redact import redact_kwargs

    kwargs = redact_kwargs(spec.kwargs or {})
    return {
        "id": spec.id,
        "entry_point": spec.entry_point if isinstance(spec.entry_point, str) else repr(spec.entry_point),
        "kwargs": kwargs,
        "nondeterministic": spec.nondeterministic,
    }
