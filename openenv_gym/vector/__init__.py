"""openenv_gym's vector envs: many sub-envs behind one Gymnasium ``VectorEnv``.

``gym.make_vec("openenv/X-v0", num_envs=64)`` returns a :class:`ConcurrentVectorEnv`;
``backend="ray"`` hosts the sub-envs in Ray actors instead; with ``python=`` or ``isolate=True``
the default backend runs them in adapter host processes (:class:`ProcessVectorEnv`). Both share
:class:`~openenv_gym.vector.base.AgentVectorEnv`: Gymnasium's autoreset modes, EnvPool-style
``send``/``recv`` of the first ready sub-envs, and per-sub-env error isolation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openenv_gym.adapters.base import AdapterSpec
from openenv_gym.errors import ConfigurationError
from openenv_gym.vector.base import AgentVectorEnv, Batch
from openenv_gym.vector.concurrent import ConcurrentVectorEnv
from openenv_gym.vector.groups import check_group_size

__all__ = ["AgentVectorEnv", "Batch", "ConcurrentVectorEnv", "RayVectorEnv", "make", "backend_class", "BACKENDS"]

BACKENDS = ("concurrent", "ray")


def make(num_envs: int, adapter: AdapterSpec, *, backend: str = "concurrent", group_size: int | None = None,
         **kwargs: Any) -> AgentVectorEnv:
    """Build a vector env of ``num_envs`` sub-envs over adapters built from ``adapter``.

    ``group_size``: groups of that many consecutive sub-envs play the same tasks
    (:mod:`openenv_gym.vector.groups`). ``kwargs`` go to the backend's class (``split``,
    ``max_turns``, ``autoreset_mode``, ``step_timeout``, and backend options such as
    ``envs_per_client`` or ``num_actors``).
    """
    check_group_size(num_envs, group_size)  # before any server or actor starts
    if kwargs.get("python") is None:
        kwargs.pop("python", None)
    cls = backend_class(backend, hosted="python" in kwargs)
    envs: AgentVectorEnv = cls(num_envs, adapter, **kwargs)
    envs.use_groups(group_size)
    return envs


def backend_class(backend: str, hosted: bool = False) -> Callable[..., AgentVectorEnv]:
    """The vector env class of ``backend``; ``hosted``: the adapter runs under another interpreter
    (``python=``/``isolate=``), which the default backend does in host processes
    (:class:`~openenv_gym.vector.processes.ProcessVectorEnv`) and Ray in its actors' hosts.
    Each takes ``(num_envs, adapter, **options)``, not the base class's ``(num_envs, tools, ...)``."""
    if backend == "concurrent":
        if hosted:
            from openenv_gym.vector.processes import ProcessVectorEnv

            return ProcessVectorEnv
        return ConcurrentVectorEnv
    if backend == "ray":
        from openenv_gym.vector.ray import RayVectorEnv

        return RayVectorEnv
    raise ConfigurationError(f"unknown vector backend {backend!r}; use one of {BACKENDS}")


def __getattr__(name: str) -> Any:
    # RayVectorEnv is imported on first use: importing this package must not import ray.
    if name == "RayVectorEnv":
        from openenv_gym.vector.ray import RayVectorEnv

        return RayVectorEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
