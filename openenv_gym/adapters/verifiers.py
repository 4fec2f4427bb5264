"""Verifiers environments: which generation a source is, whether the installed library can run
it, and the adapter that plays it.

The two generations need different adapters (:mod:`openenv_gym.adapters.verifiers_v0` for the
legacy ``load_environment`` API, :mod:`openenv_gym.adapters.verifiers_v1` for v1 tasksets) and
different library versions: verifiers 0.4 has only v1, and 0.3.1 is the last release with the
legacy API (reference/verifiers.md §0). Both adapters invert the library's control: its own
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

from openenv_gym.adapters.base import Adapter
from openenv_gym.errors import ConfigurationError, DetectionError

__all__ = ["make_adapter", "make_env", "make_vec", "resolve_generation"]

_ENTRIES = {"v0": "openenv_gym.adapters.verifiers_v0:VerifiersV0Adapter",
            "v1": "openenv_gym.adapters.verifiers_v1:VerifiersV1Adapter"}


def _module_name(env_id: str) -> str:
    # What verifiers' own loaders do: drop "owner/" and "@version", dashes become underscores.
    return env_id.split("/")[-1].split("@")[0].replace("-", "_")


def resolve_generation(env_id: str | None, source: str | os.PathLike | None) -> str:
    """``"v0"`` or ``"v1"`` for a source path or an importable environment id, found statically."""
    from openenv_gym.importers.verifiers import detect_verifiers

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


def make_adapter(*, env_id: str | None = None, source: str | os.PathLike | None = None,
                 generation: str | None = None, **kwargs: Any) -> Adapter:
    """The adapter for a Verifiers environment: v0 or v1, found statically unless ``generation`` says.

    ``kwargs`` go to the generation's adapter (``env_args``, and its timeout and turn knobs; see
    :class:`~openenv_gym.adapters.verifiers_v0.VerifiersV0Adapter` and
    :class:`~openenv_gym.adapters.verifiers_v1.VerifiersV1Adapter`).
    """
    if generation is None:
        generation = resolve_generation(env_id, source)
    if generation not in _ENTRIES:
        raise ConfigurationError(f"generation must be 'v0' or 'v1', not {generation!r}")
    from openenv_gym.adapters.base import AdapterSpec

    if source is not None:
        kwargs["source"] = str(source)
    if env_id is not None:
        kwargs["env_id"] = env_id
    return AdapterSpec(_ENTRIES[generation], kwargs).build()


def make_env(*, split: str | None = None, render_mode: str | None = None, **adapter_kwargs: Any):
    """Gymnasium entry point of ``openenv/Verifiers-v0``, imported and discovered Verifiers envs.

    ``max_turns`` goes to the library (its own turn limit, so a cut-off episode is still scored
    and reports ``stop_condition``), not to a wrapper that would end it unscored.
    """
    from openenv_gym.env import AgentEnv

    return AgentEnv(make_adapter(**adapter_kwargs), split=split, render_mode=render_mode)


def make_vec(num_envs: int = 1, **kwargs: Any):
    """Gymnasium vector entry point: the sub-envs share one loaded environment per adapter."""
    from openenv_gym.vector import make_entry

    return make_entry("openenv_gym.adapters.verifiers:make_adapter", num_envs, session_keys=("split",), **kwargs)
