"""AgentEnv: a Gymnasium environment over any adapter's episodes.

This is the contract every backend honours (shared/DESIGN.md §2):

* observation: the **new** chat messages since the agent's last action (OpenAI format);
* action: assistant text or an OpenAI assistant message with tool calls;
* reward: a float, the sum of what the backend reported for this step, never ``None``;
* terminated: the backend ended the episode; truncated: a turn limit (``max_turns``);
* info: ``tools`` (OpenAI format) at reset and whenever they change, ``task_id``, ``split``,
  ``index``, backend metadata, and ``error`` on failures;
* bad actions (malformed JSON, unknown tools, missing arguments, text where a tool call is needed)
  reach the agent as messages and the episode goes on;
* the task API (:meth:`splits`, :meth:`num_tasks`, :meth:`task`) lives on the unwrapped env, for
  the trainer only.

The methods are sync edges over the async core: :meth:`areset` and :meth:`astep` are the same
operations as coroutines, and both run on the package's runtime loop whatever loop awaits them.
"""

from __future__ import annotations

import asyncio
import copy
import sys
from typing import Any, SupportsFloat

import gymnasium as gym
import msgspec

from openenv_gym import runtime
from openenv_gym.actions import parse_action
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.errors import ConfigurationError, EpisodeFinished, EpisodeNotStarted, TaskNotFound
from openenv_gym.spaces import AssistantAction, Messages
from openenv_gym.wire import Message, Split, TaskRef, ToolSpec

__all__ = ["AgentEnv", "SECRET_KWARGS"]

SECRET_KWARGS = frozenset({"secrets", "api_key", "headers"})
"""Keyword arguments whose values are redacted from ``env.spec`` (Gymnasium records make kwargs)."""


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "***" for k in value}
    return "***" if value is not None else None


class AgentEnv(gym.Env[list[Message], Any]):
    """A chat environment backed by an :class:`~openenv_gym.adapters.base.Adapter`.

    Args:
        adapter: the backend; started here and closed by :meth:`close`.
        split: the default split for :meth:`reset` (default: the first ``train`` split).
        max_turns: truncate an episode after this many agent actions (``None``: no limit).
        render_mode: ``"ansi"`` to have :meth:`render` return the latest messages as text.
        timeout: seconds a single reset or step may take before
            :class:`~openenv_gym.errors.BackendTimeout` (a sync caller must never hang).
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        adapter: Adapter,
        *,
        split: str | None = None,
        max_turns: int | None = None,
        render_mode: str | None = None,
        timeout: float | None = 900.0,
    ):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigurationError(f"render_mode must be one of {self.metadata['render_modes']}")
        if max_turns is not None and max_turns < 1:
            raise ConfigurationError("max_turns must be a positive integer or None")
        self.adapter = adapter
        self.render_mode = render_mode
        self.max_turns = max_turns
        self.timeout = timeout
        self._split = split
        self._episode: Episode | None = None
        self._done = False
        self._turns = 0
        self._last_messages: list[Message] = []
        self._tools: dict[str, ToolSpec] = {}
        self._closed = False
        self._spec: gym.envs.registration.EnvSpec | None = None
        try:
            runtime.run_sync(self._start(), timeout)
        except BaseException:
            runtime.run_sync(adapter.aclose(), 60.0)
            self._closed = True
            raise
        self.observation_space = Messages()
        self.action_space = AssistantAction(self._base_tools)

    async def _start(self) -> None:
        await self.adapter.start()
        self._base_tools = await self.adapter.tools()
        if self._split is not None:
            await self.adapter.num_tasks(self._split)  # fail at construction for an unknown split

    # Gymnasium's make() stores the merged kwargs on env.unwrapped.spec; keep secrets out of it.
    @property
    def spec(self) -> gym.envs.registration.EnvSpec | None:  # type: ignore[override]
        return getattr(self, "_spec", None)

    @spec.setter
    def spec(self, value: gym.envs.registration.EnvSpec | None) -> None:
        if value is not None and any(k in value.kwargs for k in SECRET_KWARGS):
            kwargs = {k: (_redact(v) if k in SECRET_KWARGS else v) for k, v in value.kwargs.items()}
            value = copy.copy(value)
            value.kwargs = kwargs
        self._spec = value

    # -- task API (trainer side) ---------------------------------------------------------------
    def splits(self) -> list[Split]:
        """The task splits, in the backend's order."""
        return runtime.run_sync(self.adapter.splits(), self.timeout)

    def num_tasks(self, split: str | None = None) -> int:
        """How many tasks ``split`` (default: the env's default split) holds."""
        return runtime.run_sync(self._num_tasks(split), self.timeout)

    def task(self, split: str, index: int) -> dict[str, Any]:
        """The task spec at ``index`` of ``split``; it may hold the answer, so keep it from the agent."""
        return runtime.run_sync(self.adapter.task(split, index), self.timeout)

    async def _num_tasks(self, split: str | None) -> int:
        return await self.adapter.num_tasks(split or self._split or await self.adapter.default_split())

    # -- episode -------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Close the previous episode, pick a task and start a new episode.

        ``options``: ``split`` (default: the env's split), ``index`` (a task index; without it the
        index is drawn from ``np_random``, so the same seed gives the same task), or ``task`` (an
        explicit task spec, for backends that accept one).
        """
        return runtime.run_sync(self._areset(seed, options), self.timeout)

    def step(self, action: Any) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Apply one assistant message and return the new messages, reward and episode status."""
        if self._episode is None:
            raise EpisodeNotStarted("call reset() before step()")
        if self._done:
            raise EpisodeFinished("the episode has ended; call reset() to start a new one")
        return runtime.run_sync(self._astep(action), self.timeout)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """:meth:`reset` as a coroutine (runs on the runtime loop whatever loop awaits it)."""
        return await self._on_runtime(self._areset(seed, options))

    async def astep(self, action: Any) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """:meth:`step` as a coroutine."""
        if self._episode is None:
            raise EpisodeNotStarted("call areset() before astep()")
        if self._done:
            raise EpisodeFinished("the episode has ended; call areset() to start a new one")
        return await self._on_runtime(self._astep(action))

    @staticmethod
    async def _on_runtime(coro: Any) -> Any:
        if asyncio.get_running_loop() is runtime.get_loop():
            return await coro
        return await asyncio.wrap_future(runtime.submit(coro))

    async def _areset(
        self, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[list[Message], dict[str, Any]]:
        if self._closed:
            raise ConfigurationError("the environment is closed")
        gym.Env.reset(self, seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"split", "index", "task"}
        if unknown:
            raise ConfigurationError(f"unknown reset option(s) {sorted(unknown)}; use split, index or task")
        if self._episode is not None:
            episode, self._episode = self._episode, None
            await episode.aclose()
        split = options.get("split") or self._split or await self.adapter.default_split()
        if options.get("task") is not None:
            ref = TaskRef(split=split, spec=dict(options["task"]))
        else:
            n = await self.adapter.num_tasks(split)
            if n == 0:
                raise TaskNotFound(f"split {split!r} has no tasks")
            index = options.get("index")
            if index is None:
                index = int(self.np_random.integers(n))
            elif not 0 <= int(index) < n:
                raise TaskNotFound(f"index {index} is outside split {split!r} (0..{n - 1})")
            ref = TaskRef(split=split, index=int(index))
        episode = self.adapter.episode()
        opening = await episode.start(ref)
        self._episode, self._done, self._turns = episode, False, 0
        self._tools = {t.name: t for t in opening.tools}
        self.action_space.tools = list(opening.tools)
        self._last_messages = opening.messages
        info = {
            **self.adapter.info(),
            **opening.info,
            "tools": [t.to_openai() for t in opening.tools],
            "task_id": opening.task_id,
            "split": split,
            "index": ref.index,
        }
        return list(opening.messages), info

    async def _astep(self, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        assert self._episode is not None
        turn = parse_action(action)
        outcome = await self._episode.step(turn)
        self._turns += 1
        truncated = outcome.truncated
        if (
            not outcome.terminated
            and not truncated
            and self.max_turns is not None
            and self._turns >= self.max_turns
        ):
            truncated = True
        info = dict(outcome.info)
        info["turn"] = self._turns
        if outcome.tools is not None:
            self._tools = {t.name: t for t in outcome.tools}
            self.action_space.tools = list(outcome.tools)
            info["tools"] = [t.to_openai() for t in outcome.tools]
        if outcome.terminated or truncated:
            self._done = True
            await self._episode.aclose()
        self._last_messages = outcome.messages
        return list(outcome.messages), float(outcome.reward), bool(outcome.terminated), truncated, info

    # -- rendering and closing -------------------------------------------------------------------
    def render(self) -> str | None:
        """With ``render_mode="ansi"``: the latest messages as text."""
        if self.render_mode != "ansi":
            return None
        lines = []
        for m in self._last_messages:
            content = m.get("content")
            if not isinstance(content, str):
                content = msgspec.json.encode(content).decode()
            lines.append(f"[{m['role']}] {content}")
        return "\n".join(lines)

    def close(self) -> None:
        """End the running episode and release the backend (a shared server stops with its last user)."""
        if self._closed:
            return
        self._closed = True
        runtime.run_sync(self._aclose(), 60.0)

    async def _aclose(self) -> None:
        if self._episode is not None:
            episode, self._episode = self._episode, None
            await episode.aclose()
        await self.adapter.aclose()

    def __del__(self) -> None:
        # A server process must not outlive every env that used it, even when close() is forgotten.
        try:
            if (
                not getattr(self, "_closed", True)
                and not sys.is_finalizing()
                and not runtime.in_runtime_thread()
            ):
                self.close()
        except Exception:
            pass
