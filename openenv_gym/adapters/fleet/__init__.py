"""The Fleet backend (hosted instances: an HTTP orchestration API and MCP tool endpoints): its descriptor.

The adapter is :mod:`.adapter`, its MCP connection :mod:`.mcp`, task-file detection :mod:`.detect`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openenv_gym.backends import Backend, lazy_names, register

if TYPE_CHECKING:
    from openenv_gym.importers.catalog import CatalogEntry

__all__ = ["BACKEND", "catalog_kwargs", "FleetAdapter"]


def catalog_kwargs(entry: CatalogEntry) -> dict[str, Any]:
    """The ``gym.make`` kwargs that play an imported task file."""
    return {"tasks": entry.source}


BACKEND = Backend(
    kind="fleet", adapter="openenv_gym.adapters.fleet.adapter:FleetAdapter", extra="fleet", builtin="Fleet",
    needs="env_key=, task= or tasks= (a task file), and api_key= or $FLEET_API_KEY",
    looks_like="openenv_gym.adapters.fleet.detect:looks_like_fleet",
    detect="openenv_gym.adapters.fleet.detect:fleet_source", catalog_kwargs=catalog_kwargs,
)
register(BACKEND)


# Ids and plugins of earlier releases name "openenv_gym.adapters.fleet:FleetAdapter".
__getattr__ = lazy_names(__name__, {"FleetAdapter": "openenv_gym.adapters.fleet.adapter"})
