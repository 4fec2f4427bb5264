"""Gymnasium wrappers per sub-env of a vector env: ``gym.make_vec(..., env_wrappers=[...])``.

The wrappers trainers stack on a single env (``TextToolCalls``, ``ChatTokens``,
``ConversationHistory``, ``RecordEpisodes``, or any ``gym.Wrapper``) are synchronous: their
``step`` calls the inner env's ``step`` and waits. A vector env's sub-envs, though, are sessions
run as coroutines on an event loop. This module joins the two: each sub-env gets a
:class:`SessionEnv` (its session seen as a plain Gymnasium env) with the wrappers stacked on it,
and an op runs that stack on a worker thread of its own (``loop.run_in_executor``), whose inner
``step`` hands the session's coroutine back to the loop and waits. Sub-envs still run
concurrently (one thread each, mostly waiting), first-ready ``recv`` and the autoreset modes are
unchanged, and a SAME_STEP autoreset goes through the wrappers' ``reset`` too. A shard does this
wherever it runs (in-process, in a host process, in a Ray actor), so the wrappers run where the
sub-envs live.

Wrappers are given as callables ``env -> env`` (a wrapper class, or ``functools.partial`` of one
with its arguments), so the Ray backend can ship them to its actors by reference.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from openenv_gym.errors import ConfigurationError
from openenv_gym.runtime import DaemonExecutor
from openenv_gym.session import EnvSession
from openenv_gym.spaces import AssistantAction, Messages

__all__ = ["SessionEnv", "SubEnvWrappers", "check_wrappers"]

Wrapper = Callable[[gym.Env], gym.Env]


def check_wrappers(wrappers: Sequence[Wrapper] | None) -> list[Wrapper]:
    """The wrappers as a list, or :class:`ConfigurationError` naming one that is not callable."""
    if wrappers is None:
        return []
    if not isinstance(wrappers, (list, tuple)):
        raise ConfigurationError("env_wrappers must be a list of callables env -> env (wrapper classes)")
    for w in wrappers:
        if not callable(w):
            raise ConfigurationError(f"env_wrappers[...] must be callable (env -> env), not {type(w).__name__}")
    return list(wrappers)


class SessionEnv(gym.Env):
    """One sub-env's session as a Gymnasium env, for wrappers running on a worker thread.

    ``reset`` and ``step`` run the session's coroutines on ``loop`` (where its clients live) and
    wait for them; they must never be called on that loop's own thread.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, session: EnvSession, loop: asyncio.AbstractEventLoop, tools: Sequence[Any],
                 spec: Any = None):
        self.session = session
        self._loop = loop
        self.observation_space = Messages()
        self.action_space = AssistantAction(list(tools))
        self.spec = spec

    def _wait(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return self._wait(self.session.reset(seed, options))

    def step(self, action: Any):
        return self._wait(self.session.step(action))

    @property  # type: ignore[misc]  # read-only on purpose: the session's task-choice rng is the env's rng
    def np_random(self):
        return self.session.np_random


class SubEnvWrappers:
    """The wrapper stacks of a vector env's sub-envs, and the threads that run them."""

    def __init__(self, wrappers: Sequence[Wrapper], num_envs: int, spec: Any = None):
        self.wrappers = list(wrappers)
        self.spec = spec
        self._stacks: dict[int, tuple[EnvSession, gym.Env]] = {}
        # Daemon threads: a wrapped step that never returns (after step_timeout gave up on it)
        # does not hold up the interpreter's exit, as a ThreadPoolExecutor's thread would.
        self._pool = DaemonExecutor(max_workers=max(1, num_envs), thread_name_prefix="openenv-gym-wrapped")

    def stack(self, env_id: int, session: EnvSession, tools: Sequence[Any]) -> gym.Env:
        """The wrapped env of ``env_id`` over ``session``, rebuilt when the session was replaced
        (the replaced stack is closed first: a recorder's file, say, must not stay open)."""
        held = self._stacks.get(env_id)
        if held is not None and held[0] is session:
            return held[1]
        if held is not None:
            _close_quietly(held[1])
        env: gym.Env = SessionEnv(session, asyncio.get_running_loop(), tools, self.spec)
        for wrap in self.wrappers:
            env = wrap(env)
        self._stacks[env_id] = (session, env)
        return env

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on a worker thread, awaited from the loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def close(self) -> None:
        """Close every stack (wrappers flush what they write) and stop the threads."""
        for _, env in self._stacks.values():
            _close_quietly(env)
        self._stacks.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _close_quietly(env: gym.Env) -> None:
    try:
        env.close()
    except Exception:
        pass  # a wrapper's close must not stop the others'
