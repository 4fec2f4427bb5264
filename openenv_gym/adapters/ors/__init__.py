"""The ORS backend (Open Reward Standard servers, ``ors-sdk`` and ``openreward`` sources): its descriptor.

The adapter is :mod:`.adapter`, its HTTP/SSE calls :mod:`.transport`, the in-process path
:mod:`.inprocess`, static detection :mod:`.detect`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openenv_gym.backends import Backend, lazy_names, register
from openenv_gym.pins import requirement_name

if TYPE_CHECKING:
    from openenv_gym.importers.catalog import CatalogEntry

__all__ = ["BACKEND", "catalog_kwargs", "venv_requirements", "ORSAdapter"]


def catalog_kwargs(entry: CatalogEntry) -> dict[str, Any]:
    """The ``gym.make`` kwargs that play an imported ORS source."""
    kwargs: dict[str, Any] = {"source": entry.source}
    for key in ("env_class", "env_name", "module_file"):
        if getattr(entry, key, None):
            kwargs[key] = getattr(entry, key)
    return kwargs


def venv_requirements(sdk: str | None, extra: list[str]) -> list[str]:
    """The SDK the source is written against, not the other one."""
    other = {"ors": "openreward", "openreward": "ors-sdk"}.get(sdk or "")
    return [r for r in extra if requirement_name(r) != other]


BACKEND = Backend(
    kind="ors", adapter="openenv_gym.adapters.ors.adapter:ORSAdapter", extra="ors", builtin="ORS",
    needs="url= (a running ORS server) or source= (a file or folder)",
    looks_like="openenv_gym.adapters.ors.detect:looks_like_ors", detect="openenv_gym.adapters.ors.detect:ors_source",
    catalog_kwargs=catalog_kwargs, venv_requirements=venv_requirements,
)
register(BACKEND)


# Ids and plugins of earlier releases name "openenv_gym.adapters.ors:ORSAdapter".
__getattr__ = lazy_names(__name__, {"ORSAdapter": "openenv_gym.adapters.ors.adapter"})
