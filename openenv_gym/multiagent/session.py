"""How an id becomes a game: the adapter recipe of a multi-agent env, and a started
:class:`~openenv_gym.session.GameSession` for the PettingZoo edges.

:func:`game_spec` turns an id and ``gym.make``-style kwargs into the adapter recipe a game is
played from, wherever it is built (here, or in a shard in a host process or a Ray actor);
:func:`open_session` builds and starts it here, with every seat played by the caller.
"""

from __future__ import annotations

from typing import Any

from openenv_gym import runtime
from openenv_gym.adapters.base import AdapterSpec, accepted_kwargs
from openenv_gym.errors import ConfigurationError
from openenv_gym.session import START_TIMEOUT, STEP_TIMEOUT, GameSession

__all__ = ["GameSession", "as_game", "game_spec", "open_session", "start_session"]


def game_spec(env_id: str, kwargs: dict[str, Any]) -> tuple[AdapterSpec, dict[str, Any]]:
    """The recipe of ``env_id``'s adapter in game mode, and the env kwargs left (``split``,
    ``step_timeout``...); a ConfigurationError for an env that has no seats to play."""
    from openenv_gym.registration import adapter_spec

    return as_game(*adapter_spec(env_id, dict(kwargs)), env_id)


def as_game(spec: AdapterSpec, env_kwargs: dict[str, Any], env_id: str = "this env") -> tuple[AdapterSpec, dict[str, Any]]:
    """``spec`` (an adapter recipe, as ``gym.make`` splits its kwargs) set to play games."""
    if "python" in env_kwargs:
        raise ConfigurationError("a multi-agent env runs in this process (python=/isolate= are not supported for games)")
    accepted = accepted_kwargs(spec.target()) or frozenset()
    if "multiagent" not in accepted:
        raise ConfigurationError(
            f"{env_id} is not a multi-agent env (its backend, {spec.entry.rsplit(':', 1)[-1]}, plays one agent): "
            "play it with gym.make")
    spec.kwargs["multiagent"] = True
    env_kwargs.pop("render_mode", None)
    return spec, env_kwargs


def open_session(env_id: str, kwargs: dict[str, Any]) -> GameSession:
    """The started :class:`GameSession` of ``env_id`` with ``kwargs`` (as ``gym.make`` takes them),
    every seat played by the caller; a ConfigurationError for an env that has no seats to play."""
    return start_session(*game_spec(env_id, kwargs))


def start_session(spec: AdapterSpec, env_kwargs: dict[str, Any]) -> GameSession:
    """The started :class:`GameSession` of a game recipe (:func:`game_spec`, :func:`as_game`)."""
    adapter = spec.build()
    session = GameSession(adapter, split=env_kwargs.get("split"),
                          step_timeout=env_kwargs.get("step_timeout") or STEP_TIMEOUT,
                          start_timeout=env_kwargs.get("start_timeout") or START_TIMEOUT)
    try:
        runtime.run_sync(adapter.start(), session.start_timeout, what="starting the env", limit="start_timeout")
    except BaseException:
        runtime.run_sync(adapter.aclose(), session.step_timeout)
        raise
    runtime.track(session)  # closed at interpreter exit if the caller forgets
    return session
