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
from openenv_gym.session import STEP_TIMEOUT
from openenv_gym.vector.base import AgentVectorEnv, Batch
from openenv_gym.vector.concurrent import ConcurrentVectorEnv

__all__ = ["AgentVectorEnv", "Batch", "ConcurrentVectorEnv", "RayVectorEnv", "make", "make_entry", "BACKENDS"]

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


def make_entry(
    adapter_entry: str,
    num_envs: int = 1,
    *,
    backend: str = "concurrent",
    max_episode_steps: int | None = None,
    render_mode: str | None = None,
    autoreset_mode: Any = None,
    step_timeout: float | None = STEP_TIMEOUT,
    vector_options: dict[str, Any] | None = None,
    session_keys: tuple[str, ...] = ("split", "max_turns"),
    **kwargs: Any,
) -> AgentVectorEnv:
    """The body of every adapter's Gymnasium ``vector_entry_point``.

    ``kwargs`` are what ``gym.make`` takes: the ``session_keys`` (``split`` and ``max_turns``)
    for each sub-env, the rest for the adapter (``"module:Class"`` ``adapter_entry``);
    ``vector_options`` go to the backend (``envs_per_client``, ``max_in_flight``, ``num_actors``,
    ``address``, ``runtime_env``...). ``render_mode`` is accepted for Gymnasium's sake; vector
    envs do not render.
    """
    env_kwargs = {k: kwargs.pop(k) for k in session_keys if k in kwargs}
    if max_episode_steps is not None:
        turns = env_kwargs.get("max_turns")
        env_kwargs["max_turns"] = max_episode_steps if turns is None else min(turns, max_episode_steps)
    options: dict[str, Any] = dict(vector_options or {})
    if autoreset_mode is not None:
        options["autoreset_mode"] = autoreset_mode
    return make(num_envs, AdapterSpec(adapter_entry, kwargs), backend=backend, step_timeout=step_timeout,
                **env_kwargs, **options)


def __getattr__(name: str) -> Any:
    # RayVectorEnv is imported on first use: importing this package must not import ray.
    if name == "RayVectorEnv":
        from openenv_gym.vector.ray import RayVectorEnv

        return RayVectorEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
