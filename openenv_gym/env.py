"""AgentEnv: a Gymnasium environment over any adapter's episodes.

This is the contract every backend honours (docs/architecture.md, "The Gymnasium contract"):

* observation: the **new** chat messages since the agent's last action (OpenAI format);
* action: assistant text or an OpenAI assistant message with tool calls;
* reward: a float, the sum of what the backend reported for this step, never ``None``;
* terminated: the backend ended the episode; truncated: a turn limit (``max_turns``);
* info: ``tools`` (OpenAI format) at reset and whenever they change, ``task_id``, ``split``,
  ``index``, backend metadata, and ``error`` on failures;
* bad actions (malformed JSON, unknown tools, missing arguments, text where a tool call is needed)
  reach the agent as messages and the episode goes on;
* the task API (:meth:`splits`, :meth:`num_tasks`, :meth:`task`) lives on the unwrapped env, for
  the trainer only;
* every call is bounded by ``step_timeout``; a step cut short (the timeout, Ctrl-C) leaves the
  episode needing ``reset`` (:class:`~openenv_gym.errors.EpisodeInterrupted`); two threads on one
  env get :class:`~openenv_gym.errors.ConcurrentUse` rather than a corrupted episode.

The methods are sync edges over the async core: :meth:`areset` and :meth:`astep` are the same
operations as coroutines, and both run on the package's runtime loop whatever loop awaits them.
Two kinds of env skip the hop to that loop's thread, which costs two thread wake-ups a call: a
hosted env talks to its host over a blocking socket, and an in-process adapter that holds nothing
between calls (``Adapter.caller_thread``, e.g. a legacy Verifiers env) runs on a loop of the env's
own, driven by the caller's thread while a call lasts (:class:`~openenv_gym.runtime.CallerLoop`);
their async methods run the sync ones in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any, SupportsFloat

import gymnasium as gym
import msgspec

from openenv_gym import runtime
from openenv_gym.adapters.base import Adapter
from openenv_gym.errors import ConcurrentUse, ConfigurationError
from openenv_gym.hosts.session import HostedSession
from openenv_gym.redact import RedactedSpec
from openenv_gym.session import STEP_TIMEOUT, EnvSession
from openenv_gym.spaces import AssistantAction, Messages
from openenv_gym.wire import Message, Split

__all__ = ["AgentEnv"]

_CLOSE_TIMEOUT = 30.0
"""Seconds :meth:`AgentEnv.close` waits for the backend; adapters bound their own teardown."""

class AgentEnv(RedactedSpec, gym.Env[list[Message], Any]):
    """A chat environment backed by an :class:`~openenv_gym.adapters.base.Adapter`.

    Args:
        adapter: the backend; started here and closed by :meth:`close`. ``None`` with ``hosted``.
        split: the default split for :meth:`reset` (default: the first ``train`` split).
        max_turns: truncate an episode after this many agent actions (``None``: no limit).
        render_mode: ``"ansi"`` to have :meth:`render` return the latest messages as text.
        step_timeout: seconds one reset or step (or a task-API call) may take before it is
            cancelled with :class:`~openenv_gym.errors.BackendTimeout` naming this limit (default
            :data:`~openenv_gym.session.STEP_TIMEOUT`, 900 s; ``None``: no limit). The same name
            and default as the vector envs'. A step cut short this way, or by Ctrl-C, leaves the
            episode needing :meth:`reset`.
        hosted: play the env in an adapter host process instead (``gym.make(id, python=...)`` or
            ``isolate=True``): the same contract, every call one request to the host, made on the
            caller's thread (a blocking socket needs no hop to the runtime loop).

    An env serves one caller at a time: a second thread calling ``reset`` or ``step`` while a
    call runs gets :class:`~openenv_gym.errors.ConcurrentUse`. A forgotten :meth:`close` is done
    at interpreter exit (within a few seconds), never left to ``__del__`` there.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        adapter: Adapter | None,
        *,
        split: str | None = None,
        max_turns: int | None = None,
        render_mode: str | None = None,
        step_timeout: float | None = STEP_TIMEOUT,
        hosted: HostedSession | None = None,
    ):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigurationError(f"render_mode must be one of {self.metadata['render_modes']}")
        self.adapter = adapter
        self.render_mode = render_mode
        if step_timeout is not None and not step_timeout > 0:
            raise ConfigurationError(f"step_timeout must be a positive number of seconds or None, got {step_timeout!r}")
        self.step_timeout = step_timeout
        if (adapter is None) == (hosted is None):
            raise ConfigurationError("AgentEnv needs an adapter, or a hosted session (python=, isolate=True)")
        self._session: EnvSession | HostedSession = hosted or EnvSession(adapter, split=split, max_turns=max_turns)
        self._hosted = hosted
        self._own_loop = runtime.CallerLoop() if adapter is not None and adapter.caller_thread else None
        self._run_on = self._own_loop.run if self._own_loop is not None else runtime.run_sync
        if hosted is not None:
            hosted.step_timeout = step_timeout
        self._split = split
        self._closed = False
        self._busy = threading.Lock()
        try:
            # Starting may launch a server (seconds to minutes; adapters bound it themselves):
            # a short step_timeout is for steps, so the start gets at least the default.
            start_limit = None if step_timeout is None else max(step_timeout, STEP_TIMEOUT)
            if hosted is not None:
                self._base_tools = hosted.start(start_limit)
                if split is not None:
                    hosted.num_tasks(split)  # fail at construction for an unknown split
            else:
                self._run_on(self._start(), start_limit, what="starting the environment", limit="the start limit")
        except BaseException:
            self._closed = True
            with contextlib.suppress(Exception):
                if hosted is not None:
                    hosted.close()
                else:
                    self._close_with(self._release_backend())
            raise
        runtime.track(self)
        self.observation_space = Messages()
        self.action_space = AssistantAction(self._base_tools)

    async def _start(self) -> None:
        assert self.adapter is not None
        await self.adapter.start()
        self._base_tools = await self.adapter.tools()
        if self._split is not None:
            await self.adapter.num_tasks(self._split)  # fail at construction for an unknown split

    async def _release_backend(self) -> None:
        """Close the adapter, or stop the host process that runs it."""
        if self._hosted is not None:
            await asyncio.to_thread(self._hosted.close)
        elif self.adapter is not None:
            await self.adapter.aclose()

    @property
    def max_turns(self) -> int | None:
        """Agent actions after which an episode is truncated (``None``: no limit)."""
        return self._session.max_turns

    def _run(self, coro: Any, what: str) -> Any:
        """Run one call of this env on its loop (the runtime loop, or its own), bounded by ``step_timeout``."""
        return self._run_on(coro, self.step_timeout, what=what)

    def _close_with(self, coro: Any) -> None:
        """Run a closing coroutine, bounded by the close limit (then close the env's own loop)."""
        if self._own_loop is not None:
            self._own_loop.close(coro, _CLOSE_TIMEOUT)
        else:
            runtime.run_sync(coro, _CLOSE_TIMEOUT)

    def _call(self, name: str, *args: Any) -> Any:
        """Call the session's ``name``: a hosted session's calls block on the caller's thread (each
        bounded by ``step_timeout`` itself); an in-process one's run on the runtime loop."""
        if self._hosted is not None:
            return getattr(self._hosted, name)(*args)
        return self._run(getattr(self._session, name)(*args), "step" if name == "step" else f"{name}()")

    @contextlib.contextmanager
    def _one_caller(self, what: str) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            raise self._concurrent(what)
        try:
            yield
        finally:
            self._busy.release()

    @staticmethod
    def _concurrent(what: str) -> ConcurrentUse:
        return ConcurrentUse(f"{what}() was called while another call on this env is running (from "
                             "another thread?); an env serves one caller at a time")

    # -- task API (trainer side) ---------------------------------------------------------------
    def splits(self) -> list[Split]:
        """The task splits, in the backend's order."""
        self._check_open()
        return self._call("splits")

    def num_tasks(self, split: str | None = None) -> int:
        """How many tasks ``split`` (default: the env's default split) holds."""
        self._check_open()
        return self._call("num_tasks", split)

    def task(self, split: str, index: int) -> dict[str, Any]:
        """The task spec at ``index`` of ``split``; it may hold the answer, so keep it from the agent."""
        self._check_open()
        return self._call("task", split, index)

    # -- episode -------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Close the previous episode, pick a task and start a new episode.

        Args:
            seed: reseeds ``np_random``, from which the task index is drawn: the same seed gives
                the same task.
            options: ``split`` (default: the env's split), ``index`` (a task index of that split;
                overrides the seeded draw), or ``task`` (an explicit task spec of plain JSON, for
                backends that accept one).

        Returns:
            ``(observation, info)``: the task's opening messages (OpenAI chat format), and an info
            dict with ``tools`` (OpenAI tool specs), ``task_id``, ``split``, ``index`` and backend
            metadata (``backend``, ``session_id``...). The task's answer is never in either.

        Raises:
            TaskNotFound: an unknown split or an index out of range.
            ConfigurationError: an unknown option, or a task spec that is not JSON.
            BackendUnavailable, BackendTimeout, ServerError: the backend failed (typed, bounded by
                ``step_timeout``).

        >>> env = gym.make("openenv/Arithmetic-v0")          # doctest: +SKIP
        >>> obs, info = env.reset(seed=7)                    # doctest: +SKIP
        >>> obs[0]["role"], [t["function"]["name"] for t in info["tools"]]   # doctest: +SKIP
        ('user', ['calculator', 'submit'])
        """
        with self._one_caller("reset"):
            self._check_open()
            if self._hosted is not None:
                return self._hosted_reset(seed, options)
            return self._run(self._areset(seed, options), "reset")

    def step(self, action: Any) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Apply one assistant action and return what it produced.

        Args:
            action: assistant text (``str``) or an OpenAI assistant message dict, optionally with
                ``tool_calls`` (``arguments`` as a JSON string or a dict); several calls run in
                order. Whatever a model writes is accepted: a malformed action (bad JSON, an
                unknown tool, bad arguments, text where a tool call is needed) is answered with a
                message saying what was wrong, reward 0, and the episode goes on.

        Returns:
            ``(observation, reward, terminated, truncated, info)``: the **new** messages since this
            action (tool results, the environment's replies), the float reward of this step
            (never ``None``), whether the backend ended the episode, whether ``max_turns`` cut it,
            and an info dict with ``turn``, ``calls`` (per tool call: ``ok``, ``reward``,
            ``reason``...), ``tools`` when they changed, and ``error`` when a tool raised.

        Raises:
            InvalidAction: ``action`` is not an action at all (a set, bytes, an object).
            EpisodeNotStarted, EpisodeFinished, EpisodeInterrupted: call :meth:`reset` first.
            BackendUnavailable, BackendTimeout, ServerError: the backend failed; a step cut
                short leaves the episode needing :meth:`reset`.

        >>> obs, reward, terminated, truncated, info = env.step(       # doctest: +SKIP
        ...     {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
        ...      "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'}}]})
        >>> obs[0]["role"], obs[0]["content"], reward                   # doctest: +SKIP
        ('tool', '4', 0.0)
        """
        # _one_caller's work, inline: a generator-based context manager costs more than the rest
        # of this method
        if not self._busy.acquire(blocking=False):
            raise self._concurrent("step")
        try:
            self._check_open()
            self._session.check_steppable()
            return self._call("step", action)
        finally:
            self._busy.release()

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """:meth:`reset` as a coroutine (runs on the runtime loop whatever loop awaits it)."""
        if self._hosted is not None:  # blocking calls on a socket of their own: a worker thread
            return await asyncio.to_thread(self._hosted_reset, seed, options)
        if self._own_loop is not None:  # a loop of its own, which this thread's loop cannot drive
            return await asyncio.to_thread(self.reset, seed=seed, options=options)
        return await runtime.on_runtime(runtime.within(self._areset(seed, options), self.step_timeout, "reset"))

    async def astep(self, action: Any) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """:meth:`step` as a coroutine."""
        self._check_open()
        self._session.check_steppable()
        if self._hosted is not None:
            return await asyncio.to_thread(self._hosted.step, action)
        if self._own_loop is not None:
            return await asyncio.to_thread(self.step, action)
        return await runtime.on_runtime(runtime.within(self._session.step(action), self.step_timeout, "step"))

    async def _areset(
        self, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[list[Message], dict[str, Any]]:
        self._check_open()
        gym.Env.reset(self, seed=seed)
        self._session.np_random = self.np_random  # task choice draws from the env's own rng
        obs, info = await self._session.reset(None, options)  # type: ignore[misc]
        self.action_space.tools = list(self._session.tools)
        return obs, info

    def _hosted_reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[list[Message], dict[str, Any]]:
        """:meth:`_areset` for a hosted session, on the caller's thread."""
        assert self._hosted is not None
        self._check_open()
        gym.Env.reset(self, seed=seed)
        self._hosted.np_random = self.np_random
        obs, info = self._hosted.reset(None, options)
        self.action_space.tools = list(self._hosted.tools)
        return obs, info

    # -- rendering and closing -------------------------------------------------------------------
    def render(self) -> str | None:
        """With ``render_mode="ansi"``: the latest messages as text."""
        if self.render_mode != "ansi":
            return None
        lines = []
        for m in self._session.last_messages:
            content = m.get("content")
            if not isinstance(content, str):
                content = msgspec.json.encode(content).decode()
            lines.append(f"[{m['role']}] {content}")
        return "\n".join(lines)

    def close(self) -> None:
        """End the running episode and release the backend (a shared server stops with its last user).

        Idempotent, and bounded: a backend that does not answer (a hung server) is abandoned
        after a few seconds rather than holding the caller.
        """
        if self._closed:
            return
        self._closed = True
        runtime.untrack(self)
        if self._hosted is not None:
            self._hosted.close()
            return
        self._close_with(self._aclose())

    async def _aclose(self) -> None:
        if self._hosted is not None:
            await self._release_backend()
            return
        try:
            await self._session.aclose()
        finally:
            await self._release_backend()

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("the environment is closed")

    def __del__(self) -> None:
        # A server process must not outlive every env that used it, even when close() is
        # forgotten; never block here (this may run in any thread, or during finalisation).
        if not getattr(self, "_closed", True):
            self._closed = True
            runtime.untrack(self)
            if getattr(self, "_own_loop", None) is not None:
                self._own_loop.close_later(self._aclose())
            else:
                runtime.close_later(self._aclose())
