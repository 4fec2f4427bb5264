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
    "AgentEnv",
    "AssistantAction",
    "ContextManagement",
    "Messages",
    "Opening",
    "Outcome",
    "SessionPool",
    "Split",
    "TaskRef",
    "ToolSpec",
    "env_info",
    "errors",
    "list_environments",
    "make_mixture",
    "register_all",
    "serve",
    "served",
    "tune_gc",
    "__version__",
]

_LAZY = {
    "AgentEnv": "openenv_gym.env",
    "AssistantAction": "openenv_gym.spaces",
    "Messages": "openenv_gym.spaces",
    "ContextManagement": "openenv_gym.wrappers",
    "Opening": "openenv_gym.wire",
    "Outcome": "openenv_gym.wire",
    "Split": "openenv_gym.wire",
    "TaskRef": "openenv_gym.wire",
    "ToolSpec": "openenv_gym.wire",
    "SessionPool": "openenv_gym.pool",
    "make_mixture": "openenv_gym.mixture",
    "serve": "openenv_gym.serving",
    "served": "openenv_gym.serving",
    "tune_gc": "openenv_gym.processes",
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
