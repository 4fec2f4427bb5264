"""openenv_gym: any LLM-agent environment as a plain Gymnasium environment.

``import openenv_gym`` registers every known id (built-ins, the user's catalog of imported
sources, and installed packages' ``openenv_gym.envs`` entry points), because Gymnasium 1.x loads
no plugins by itself::

    import gymnasium as gym, openenv_gym
    env = gym.make("openenv/Arithmetic-v0")
    obs, info = env.reset(seed=0)
"""

from __future__ import annotations

from openenv_gym import errors
from openenv_gym.processes import tune_gc
from openenv_gym.env import AgentEnv
from openenv_gym.registration import env_info, list_environments, register_all
from openenv_gym.spaces import AssistantAction, Messages
from openenv_gym.wire import Opening, Outcome, Split, TaskRef, ToolSpec
from openenv_gym.wrappers import ContextManagement

__version__ = "0.1.0"

__all__ = [
    "AgentEnv",
    "AssistantAction",
    "ContextManagement",
    "Messages",
    "Opening",
    "Outcome",
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
]

register_all()


def __getattr__(name: str) -> object:
    # make_mixture and serving are imported on first use: `import openenv_gym` stays light.
    if name == "make_mixture":
        from openenv_gym.mixture import make_mixture

        return make_mixture
    if name in ("serve", "served"):
        from openenv_gym import serving

        return getattr(serving, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
