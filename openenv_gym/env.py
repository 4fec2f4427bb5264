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
operations as coroutines. Where the session lives (in this process on the runtime loop or on a
loop of its own, or in a host process) is the env's :class:`~openenv_gym.runners.Runner`, chosen
once when the env is made; the env never branches on it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any, SupportsFloat

import gymnasium as gym
import msgspec

from openenv_gym import runtime
from openenv_gym.adapters.base import Adapter
from openenv_gym.errors import ConcurrentUse, ConfigurationError, inherited
from openenv_gym.redact import RedactedSpec
from openenv_gym.runners import Runner, SessionRunner
from openenv_gym.session import START_TIMEOUT, STEP_TIMEOUT, EnvSession, check_env_values
from openenv_gym.spaces import AssistantAction, Messages
from openenv_gym.wire import Message, Split

__all__ = ["AgentEnv"]

_CLOSE_TIMEOUT = 30.0
"""Seconds :meth:`AgentEnv.close` waits for the backend; adapters bound their own teardown."""


class AgentEnv(RedactedSpec, gym.Env[list[Message], Any]):
    """A chat environment backed by an :class:`~openenv_gym.adapters.base.Adapter`.

    Args:
        adapter: the backend; started here and closed by :meth:`close`. ``None`` with ``runner``.
        split: the default split for :meth:`reset` (default: the first ``train`` split).
        max_turns: truncate an episode after this many agent actions (``None``: no limit).
        render_mode: ``"ansi"`` to have :meth:`render` return the latest messages as text.
        step_timeout: seconds one reset or step (or a task-API call) may take before it is
            cancelled with :class:`~openenv_gym.errors.BackendTimeout` naming this limit (default
            :data:`~openenv_gym.session.STEP_TIMEOUT`, 900 s; ``None``: no limit). The same name
            and default as the vector envs'. A step cut short this way, or by Ctrl-C, leaves the
            episode needing :meth:`reset`.
        start_timeout: seconds the backend may take to start (a local source launches a server;
            default :data:`~openenv_gym.session.START_TIMEOUT`; ``None``: no limit).
        runner: where the session lives when it is not this process (``gym.make(id, python=...)``
            or ``isolate=True`` give a :class:`~openenv_gym.hosts.runner.HostRunner`); then
            ``split`` and ``max_turns`` are the runner's.

    An env serves one caller at a time: a second thread calling ``reset`` or ``step`` while a
    call runs gets :class:`~openenv_gym.errors.ConcurrentUse`. A forgotten :meth:`close` is done
    at interpreter exit (within a few seconds), never left to ``__del__`` there.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}
    action_space: AssistantAction  # its tools are the current episode's

    def __init__(
        self,
        adapter: Adapter | None,
        *,
        split: str | None = None,
        max_turns: int | None = None,
        render_mode: str | None = None,
        step_timeout: float | None = STEP_TIMEOUT,
        start_timeout: float | None = START_TIMEOUT,
        runner: Runner | None = None,
    ):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigurationError(f"render_mode must be one of {self.metadata['render_modes']}")
        check_env_values({"split": split, "max_turns": max_turns, "step_timeout": step_timeout,
                          "start_timeout": start_timeout})
        if (adapter is None) == (runner is None):
            raise ConfigurationError("AgentEnv needs an adapter, or a runner (python=, isolate=True)")
        self._owner = os.getpid()  # a forked child must never touch this env's sessions
        self.adapter = adapter
        self.render_mode = render_mode
        self.step_timeout = step_timeout
        self.runner: Runner
        """Where this env's session lives (:mod:`openenv_gym.runners`)."""
        if runner is not None:
            self.runner = runner
        else:
            assert adapter is not None  # exactly one of the two, checked above
            self.runner = SessionRunner(EnvSession(adapter, split=split, max_turns=max_turns),
                                        own_loop=adapter.caller_thread, idle_pass=adapter.idle_pass)
        self._closed = False
        self._busy = threading.Lock()
        try:
            self._base_tools = self.runner.start(start_timeout)
            if split is not None and runner is not None:
                self.runner.task_api("num_tasks", (split,), start_timeout)  # fail now for an unknown split
        except BaseException:
            self._closed = True
            self.runner.close(_CLOSE_TIMEOUT)
            raise
        runtime.track(self)
        self.observation_space = Messages()
        self.action_space = AssistantAction(self._base_tools)

    @property
    def max_turns(self) -> int | None:
        """Agent actions after which an episode is truncated (``None``: no limit)."""
        return self.runner.max_turns

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
        return self.runner.task_api("splits", (), self.step_timeout)

    def num_tasks(self, split: str | None = None) -> int:
        """How many tasks ``split`` (default: the env's default split) holds."""
        self._check_open()
        return self.runner.task_api("num_tasks", (split,), self.step_timeout)

    def task(self, split: str, index: int) -> dict[str, Any]:
        """The task spec at ``index`` of ``split``; it may hold the answer, so keep it from the agent."""
        self._check_open()
        return self.runner.task_api("task", (split, index), self.step_timeout)

    # -- episode -------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Close the previous episode, pick a task and start a new episode.

        Args:
            seed: reseeds ``np_random``, from which the task index is drawn: the same seed gives
                the same task (in a split that never ends, ``num_tasks`` being
                :data:`~openenv_gym.wire.UNBOUNDED_TASKS`: task ``seed``, then the next at each
                unseeded reset).
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
            gym.Env.reset(self, seed=seed)
            obs, info = self.runner.reset(self.np_random, options, self.step_timeout, seed)
            self.action_space.tools = list(self.runner.tools)
            return obs, info

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
            self.runner.check_steppable()
            return self.runner.step(action, self.step_timeout)
        finally:
            self._busy.release()

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """:meth:`reset` as a coroutine, from any event loop."""
        self._check_open()
        gym.Env.reset(self, seed=seed)
        obs, info = await self.runner.areset(self.np_random, options, self.step_timeout, seed)
        self.action_space.tools = list(self.runner.tools)
        return obs, info

    async def astep(self, action: Any) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """:meth:`step` as a coroutine, from any event loop."""
        self._check_open()
        self.runner.check_steppable()
        return await self.runner.astep(action, self.step_timeout)

    # -- rendering and closing -------------------------------------------------------------------
    def render(self) -> str | None:
        """With ``render_mode="ansi"``: the latest messages as text."""
        if self.render_mode != "ansi":
            return None
        lines = []
        for m in self.runner.last_messages:
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
        if os.getpid() == self._owner:  # a forked child's copy releases nothing of the parent's
            self.runner.close(_CLOSE_TIMEOUT)

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("the environment is closed")
        if os.getpid() != self._owner:
            raise inherited("env", self._owner)

    def __del__(self) -> None:
        # A server process must not outlive every env that used it, even when close() is
        # forgotten; never block here (this may run in any thread, or during finalisation).
        if not getattr(self, "_closed", True):
            self._closed = True
            runtime.untrack(self)
            if os.getpid() == self._owner:
                self.runner.close_later()
