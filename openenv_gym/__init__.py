"""openenv_gym: any LLM-agent environment as a plain Gymnasium environment.

``import openenv_gym`` registers every known id (built-ins, the user's catalog of imported
sources, and installed packages' ``openenv_gym.envs`` entry points), because Gymnasium 1.x loads
no plugins by itself::

    import gymnasium as gym, openenv_gym
    env = gym.make("openenv/Arithmetic-v0")
    obs, info = env.reset(seed=0)

Registering needs only the ids' recipes; the classes (envs, vector envs, wrappers...) are imported
when first used, so ``import openenv_gym`` costs little more than ``import gymnasium``.
"""

from __future__ import annotations

import importlib
from typing import Any

from openenv_gym import errors
from openenv_gym.registration import env_info, list_environments, register_all
from openenv_gym.version import __version__

__all__ = [
    # the env and the vector env (made by gym.make / gym.make_vec) and their spaces
    "AgentEnv",
    "AgentVectorEnv",
    "AssistantAction",
    "Messages",
    # wrappers for training
    "ChatTokens",
    "ContextManagement",
    "ConversationHistory",
    "RecordEpisodes",
    "TextToolCalls",
    # rollouts, pools, mixtures, serving
    "collect",
    "SessionPool",
    "make_mixture",
    "serve",
    "served",
    # the registry
    "env_info",
    "list_environments",
    "register_all",
    "errors",
    "tune_gc",
    "__version__",
]
"""The user's API. A backend's author finds theirs in :mod:`openenv_gym.adapters`; any other
module's names are the package's own and may change between releases (docs/architecture.md, "Public API")."""

_LAZY = {
    "AgentEnv": "openenv_gym.env",
    "AgentVectorEnv": "openenv_gym.vector",
    "AssistantAction": "openenv_gym.spaces",
    "Messages": "openenv_gym.spaces",
    "ChatTokens": "openenv_gym.wrappers",
    "ContextManagement": "openenv_gym.wrappers",
    "ConversationHistory": "openenv_gym.wrappers",
    "RecordEpisodes": "openenv_gym.wrappers",
    "TextToolCalls": "openenv_gym.wrappers",
    "collect": "openenv_gym.rollout",
    "SessionPool": "openenv_gym.pool",
    "make_mixture": "openenv_gym.mixture",
    "serve": "openenv_gym.serving",
    "served": "openenv_gym.serving",
    "tune_gc": "openenv_gym.processes",
    # Exported here by earlier releases; an adapter's author now takes them from openenv_gym.adapters.
    "Opening": "openenv_gym.wire",
    "Outcome": "openenv_gym.wire",
    "Split": "openenv_gym.wire",
    "TaskRef": "openenv_gym.wire",
    "ToolSpec": "openenv_gym.wire",
}
"""Public names imported on first use (module that defines each)."""

register_all()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
