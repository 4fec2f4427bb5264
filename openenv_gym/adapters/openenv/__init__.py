"""The OpenEnv backend (servers over OpenEnv's WebSocket protocol, env folders, installed env packages): its descriptor.

The adapter is :mod:`.adapter`, its WebSocket channel :mod:`.transport`, the in-process path
:mod:`.inprocess`, detection and discovery :mod:`.detect`.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any

from openenv_gym.backends import Backend, lazy_names, register

if TYPE_CHECKING:
    from openenv_gym.importers.catalog import CatalogEntry

__all__ = ["BACKEND", "catalog_kwargs", "discovered_kwargs", "OpenEnvAdapter"]


def catalog_kwargs(entry: CatalogEntry) -> dict[str, Any]:
    """The ``gym.make`` kwargs that play an imported env folder, with its manifest as read now."""
    from openenv_gym.adapters.openenv.detect import MANIFEST, read_manifest

    try:
        manifest = read_manifest(pathlib.Path(entry.source) / MANIFEST)
    except (OSError, ValueError):  # a source moved or unreadable: making the env will say so
        manifest = None
    return {"source": entry.source, **({"manifest": manifest} if manifest else {})}


def discovered_kwargs(found: dict[str, Any]) -> dict[str, Any]:
    """The ``gym.make`` kwargs that play an installed env package."""
    kwargs: dict[str, Any] = {"source": found["module"]}
    if found.get("manifest"):
        kwargs["manifest"] = dict(found["manifest"])
    return kwargs


BACKEND = Backend(
    kind="openenv", adapter="openenv_gym.adapters.openenv.adapter:OpenEnvAdapter", extra="openenv",
    builtin="OpenEnv", needs="url= (a running OpenEnv server) or source= (an env folder or installed env package)",
    looks_like="openenv_gym.adapters.openenv.detect:looks_like_openenv",
    detect="openenv_gym.adapters.openenv.detect:openenv_source", catalog_kwargs=catalog_kwargs,
    discover="openenv_gym.adapters.openenv.detect:discover_installed", discovered_kwargs=discovered_kwargs,
    precedence=True,
)
register(BACKEND)


# Ids and plugins of earlier releases name "openenv_gym.adapters.openenv:OpenEnvAdapter".
__getattr__ = lazy_names(__name__, {"OpenEnvAdapter": "openenv_gym.adapters.openenv.adapter"})
