"""The Verifiers backend (legacy ``load_environment`` modules and v1 tasksets): its descriptor.

The front door is :mod:`.adapter` (it picks the generation), the adapters :mod:`.v0` and :mod:`.v1`,
detection and discovery :mod:`.detect`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openenv_gym.backends import Backend, lazy_names, register
from openenv_gym.pins import requirement_name

if TYPE_CHECKING:
    from openenv_gym.importers.catalog import CatalogEntry

__all__ = ["BACKEND", "catalog_kwargs", "discovered_kwargs", "venv_requirements", "adapter_spec"]


def catalog_kwargs(entry: CatalogEntry) -> dict[str, Any]:
    """The ``gym.make`` kwargs that play an imported source, in the generation detected."""
    return {"source": entry.source, "generation": entry.sdk}


def discovered_kwargs(found: dict[str, Any]) -> dict[str, Any]:
    """The ``gym.make`` kwargs that play an installed environment package."""
    return {"env_id": found["module"], "generation": found["generation"]}


def venv_requirements(sdk: str | None, extra: list[str]) -> list[str]:
    """verifiers 0.4 has no legacy API: a v0 source gets the last release that has it."""
    if sdk == "v0":
        return ["verifiers>=0.3.1,<0.4", *[r for r in extra if requirement_name(r) != "verifiers"]]
    return extra


BACKEND = Backend(
    kind="verifiers", adapter="openenv_gym.adapters.verifiers.adapter:adapter_spec", extra="verifiers",
    builtin="Verifiers", needs="env_id= (an installed environment) or source= (a file or folder)",
    looks_like="openenv_gym.adapters.verifiers.detect:looks_like_verifiers",
    detect="openenv_gym.adapters.verifiers.detect:verifiers_source", catalog_kwargs=catalog_kwargs,
    discover="openenv_gym.adapters.verifiers.detect:discover_installed", discovered_kwargs=discovered_kwargs,
    venv_requirements=venv_requirements,
)
register(BACKEND)


# Ids and plugins of earlier releases name "openenv_gym.adapters.verifiers:adapter_spec".
__getattr__ = lazy_names(__name__, {"adapter_spec": "openenv_gym.adapters.verifiers.adapter"})
