"""openenv_gym's vector envs: many sub-envs behind one Gymnasium ``VectorEnv``.

``gym.make_vec("openenv/X-v0", num_envs=64)`` returns a :class:`ConcurrentVectorEnv`;
``backend="ray"`` hosts the sub-envs in Ray actors instead. Both share
:class:`~openenv_gym.vector.base.AgentVectorEnv`: Gymnasium's autoreset modes, EnvPool-style
``send``/``recv`` of the first ready sub-envs, and per-sub-env error isolation.
"""

from __future__ import annotations

from typing import Any

from openenv_gym.adapters.base import AdapterSpec
from openenv_gym.errors import ConfigurationError
from openenv_gym.vector.base import AgentVectorEnv, Batch
from openenv_gym.vector.concurrent import ConcurrentVectorEnv

__all__ = ["AgentVectorEnv", "Batch", "ConcurrentVectorEnv", "RayVectorEnv", "make", "BACKENDS"]

BACKENDS = ("concurrent", "ray")


def make(num_envs: int, adapter: AdapterSpec, *, backend: str = "concurrent", **kwargs: Any) -> AgentVectorEnv:
    """Build a vector env of ``num_envs`` sub-envs over adapters built from ``adapter``.

    ``kwargs`` go to the backend's class (``split``, ``max_turns``, ``autoreset_mode``,
    ``step_timeout``, and backend options such as ``envs_per_client`` or ``num_actors``).
    """
    if backend == "concurrent":
        return ConcurrentVectorEnv(num_envs, adapter, **kwargs)
    if backend == "ray":
        from openenv_gym.vector.ray import RayVectorEnv

        return RayVectorEnv(num_envs, adapter, **kwargs)
    raise ConfigurationError(f"unknown vector backend {backend!r}; use one of {BACKENDS}")


def __getattr__(name: str) -> Any:
    # RayVectorEnv is imported on first use: importing this package must not import ray.
    if name == "RayVectorEnv":
        from openenv_gym.vector.ray import RayVectorEnv

        return RayVectorEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
