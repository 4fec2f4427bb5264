"""Runners: how a single env's calls reach its one session, chosen once when the env is made.

:class:`~openenv_gym.env.AgentEnv` is the Gymnasium edge; what it calls is a :class:`Runner`, one
implementation per place the session can live:

* :class:`SessionRunner`: an :class:`~openenv_gym.session.EnvSession` in this process, its calls run
  on the package's runtime loop (``runtime.run_sync``), or, for an adapter that needs nothing
  between calls but a short pass of its loop now and then (``Adapter.caller_thread``: a legacy
  Verifiers env; an OpenEnv server given by URL), on a loop of the env's own that the caller's
  thread drives while a call lasts (:class:`~openenv_gym.runtime.CallerLoop`), which saves the
  two thread wake-ups of a hop to the runtime loop.
* :class:`~openenv_gym.hosts.runner.HostRunner`: a one-sub-env
  :class:`~openenv_gym.shard.shard.Shard` in an adapter host process under another interpreter
  (``python=``, ``isolate=True``), driven over a blocking socket from the caller's thread; a host
  that dies or stops answering is replaced.

Every call takes the limit that bounds it, so the env never branches on where its session is.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Coroutine
from typing import Any

import numpy as np

from openenv_gym import runtime
from openenv_gym.session import EnvSession, StepResult
from openenv_gym.wire import Message, ToolSpec

__all__ = ["Runner", "SessionRunner"]


class Runner(abc.ABC):
    """One env's session, wherever it lives: start, reset, step, the task API, close."""

    tools: list[ToolSpec]
    """The tools of the running episode."""
    last_messages: list[Message]
    """The messages the last reset or step produced (what ``render`` shows)."""
    max_turns: int | None

    @abc.abstractmethod
    def start(self, timeout: float | None) -> list[ToolSpec]:
        """Start the backend (it may launch a server); the tools every task offers."""

    @abc.abstractmethod
    def reset(self, rng: np.random.Generator, options: dict[str, Any] | None,
              timeout: float | None, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode; the task index, unless ``options`` names one, is drawn from ``rng``
        (in an endless split: task ``seed`` when the env was just seeded, else the next one)."""

    @abc.abstractmethod
    def step(self, action: Any, timeout: float | None) -> StepResult:
        """Apply one action."""

    @abc.abstractmethod
    def task_api(self, name: str, args: tuple, timeout: float | None) -> Any:
        """``splits``, ``num_tasks`` or ``task`` of the backend."""

    @abc.abstractmethod
    def check_steppable(self) -> None:
        """Raise the :class:`gymnasium.error.ResetNeeded` error for a step that cannot happen now."""

    @abc.abstractmethod
    def close(self, timeout: float) -> None:
        """End the episode and release the backend, within ``timeout``; never raises."""

    @abc.abstractmethod
    def close_later(self) -> None:
        """:meth:`close` without waiting, from any thread (for ``__del__``)."""

    async def areset(self, rng: np.random.Generator, options: dict[str, Any] | None,
                     timeout: float | None, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        """:meth:`reset` from any event loop (by default on a worker thread)."""
        return await asyncio.to_thread(self.reset, rng, options, timeout, seed)

    async def astep(self, action: Any, timeout: float | None) -> StepResult:
        """:meth:`step` from any event loop (by default on a worker thread)."""
        return await asyncio.to_thread(self.step, action, timeout)


class SessionRunner(Runner):
    """An :class:`EnvSession` over its own adapter, in this process.

    Args:
        session: the session (its adapter is started by :meth:`start` and closed by :meth:`close`).
        own_loop: run on a loop of the env's own driven by the caller's thread
            (:class:`~openenv_gym.runtime.CallerLoop`) rather than on the runtime loop.
        idle_pass: with ``own_loop``, seconds between the passes a thread makes over that loop
            while no call runs (what the adapter's connections need between calls:
            :attr:`~openenv_gym.adapters.base.Adapter.idle_pass`).
    """

    def __init__(self, session: EnvSession, *, own_loop: bool = False, idle_pass: float | None = None):
        self.session = session
        self.max_turns = session.max_turns
        self._own = runtime.CallerLoop(idle_pass) if own_loop else None
        self._run = self._own.run if self._own is not None else runtime.run_sync

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the session's calls run on (the env's own, or the runtime loop)."""
        return self._own.loop if self._own is not None else runtime.get_loop()

    @property
    def tools(self) -> list[ToolSpec]:  # type: ignore[override]
        return self.session.tools

    @property
    def last_messages(self) -> list[Message]:  # type: ignore[override]
        return self.session.last_messages

    def start(self, timeout: float | None) -> list[ToolSpec]:
        return self._run(self._start(), timeout, what="starting the environment", limit="start_timeout")

    async def _start(self) -> list[ToolSpec]:
        adapter = self.session.adapter
        await adapter.start()
        tools = await adapter.tools()
        if self.session.split is not None:
            await adapter.num_tasks(self.session.split)  # fail at construction for an unknown split
        return tools

    def reset(self, rng: np.random.Generator, options: dict[str, Any] | None,
              timeout: float | None, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        self.session.np_random = rng  # task choice draws from the env's own rng
        if seed is not None:
            self.session.cursor.seed(seed)
        return self._run(self.session.reset(None, options), timeout, what="reset")

    def step(self, action: Any, timeout: float | None) -> StepResult:
        return self._run(self.session.step(action), timeout, what="step")

    def task_api(self, name: str, args: tuple, timeout: float | None) -> Any:
        return self._run(getattr(self.session, name)(*args), timeout, what=f"{name}()")

    def check_steppable(self) -> None:
        self.session.check_steppable()

    async def areset(self, rng: np.random.Generator, options: dict[str, Any] | None,
                     timeout: float | None, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        if self._own is not None:  # a loop of its own, which this thread's loop cannot drive
            return await super().areset(rng, options, timeout, seed)
        self.session.np_random = rng
        if seed is not None:
            self.session.cursor.seed(seed)
        return await runtime.on_runtime(runtime.within(self.session.reset(None, options), timeout, "reset"))

    async def astep(self, action: Any, timeout: float | None) -> StepResult:
        if self._own is not None:
            return await super().astep(action, timeout)
        return await runtime.on_runtime(runtime.within(self.session.step(action), timeout, "step"))

    async def _aclose(self) -> None:
        try:
            await self.session.aclose()
        finally:
            await self.session.adapter.aclose()

    def close(self, timeout: float) -> None:
        if self._own is not None:
            self._own.close(self._aclose(), timeout)
        else:
            try:
                runtime.run_sync(self._aclose(), timeout)
            except Exception:
                pass  # a hung backend is abandoned after the close limit

    def close_later(self) -> None:
        coro: Coroutine[Any, Any, Any] = self._aclose()
        if self._own is not None:
            self._own.close_later(coro)
        else:
            runtime.close_later(coro)
