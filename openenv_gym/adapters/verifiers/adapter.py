"""Verifiers environments: which generation a source is, whether the installed library can run
it, and the adapter that plays it.

The two generations need different adapters (:mod:`openenv_gym.adapters.verifiers.v0` for the
legacy ``load_environment`` API, :mod:`openenv_gym.adapters.verifiers.v1` for v1 tasksets) and
different library versions: verifiers 0.4 has only v1, and 0.3.1 is the last release with the
legacy API (docs/backends.md, "Verifiers"). Both adapters invert the library's control: its own
rollout loop runs, and each model call it makes becomes an observation the agent's action
answers.

This module is the one front door (``openenv/Verifiers-v0``, imported sources, discovered
packages): it finds the generation statically and hands over to that generation's adapter,
which checks that the installed library can run it (by the names it needs, not by a version
number) and says what to install when it cannot, before any environment code runs.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from openenv_gym.adapters.base import Adapter, AdapterSpec
from openenv_gym.errors import ConfigurationError, DetectionError

__all__ = ["adapter_spec", "make_adapter", "resolve_generation"]

_ENTRIES = {"v0": "openenv_gym.adapters.verifiers.v0:VerifiersV0Adapter",
            "v1": "openenv_gym.adapters.verifiers.v1:VerifiersV1Adapter"}


def _module_name(env_id: str) -> str:
    # What verifiers' own loaders do: drop "owner/" and "@version", dashes become underscores.
    return env_id.split("/")[-1].split("@")[0].replace("-", "_")


def resolve_generation(env_id: str | None, source: str | os.PathLike | None) -> str:
    """``"v0"`` or ``"v1"`` for a source path or an importable environment id, found statically."""
    from openenv_gym.adapters.verifiers.detect import detect_verifiers

    if source is not None:
        return detect_verifiers(source).generation
    if not env_id:
        raise ConfigurationError("a Verifiers environment needs env_id= (an installed environment) or source= (a path)")
    name = _module_name(env_id)
    try:
        spec = importlib.util.find_spec(name)  # a top-level name: found, not executed
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        raise ConfigurationError(
            f"Verifiers environment {env_id!r} is not installed (no module {name!r}); install its package "
            "(e.g. `prime env install` or `pip install -e ./environments/<name>`) or pass source=PATH")
    origin = Path(spec.origin)
    try:
        return detect_verifiers(origin.parent if origin.name == "__init__.py" else origin).generation
    except DetectionError as exc:
        raise ConfigurationError(str(exc)) from None


def adapter_spec(*, env_id: str | None = None, source: str | os.PathLike | None = None,
                 generation: str | None = None, **kwargs: Any) -> AdapterSpec:
    """The front door: which generation's adapter plays a Verifiers environment, with its kwargs.

    The generation is found statically unless ``generation`` says; nothing is imported or run.
    ``kwargs`` go to the generation's adapter (``env_args``, ``max_turns`` -- the library's own
    turn limit, so a cut-off episode is still scored -- and its timeout knobs; see
    :class:`~openenv_gym.adapters.verifiers.v0.VerifiersV0Adapter` and
    :class:`~openenv_gym.adapters.verifiers.v1.VerifiersV1Adapter`).
    """
    if generation is None:
        generation = resolve_generation(env_id, source)
    if generation not in _ENTRIES:
        raise ConfigurationError(f"generation must be 'v0' or 'v1', not {generation!r}")
    if source is not None:
        kwargs["source"] = str(source)
    if env_id is not None:
        kwargs["env_id"] = env_id
    return AdapterSpec(_ENTRIES[generation], kwargs)


def make_adapter(**kwargs: Any) -> Adapter:
    """The adapter for a Verifiers environment (see :func:`adapter_spec`), not yet started."""
    return adapter_spec(**kwargs).build()
