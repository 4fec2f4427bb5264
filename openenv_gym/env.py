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

import sys
from typing import Any, SupportsFloat

import gymnasium as gym
import msgspec

from openenv_gym import runtime
from openenv_gym.adapters.base import Adapter
from openenv_gym.errors import ConfigurationError
from openenv_gym.redact import RedactedSpec
from openenv_gym.session import EnvSession
from openenv_gym.spaces import AssistantAction, Messages
from openenv_gym.wire import Message, Split

__all__ = ["AgentEnv"]

class AgentEnv(RedactedSpec, gym.Env[list[Message], Any]):
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
        self.adapter = adapter
        self.render_mode = render_mode
        self.timeout = timeout
        self._session = EnvSession(adapter, split=split, max_turns=max_turns)
        self._split = split
        self._closed = False
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

    @property
    def max_turns(self) -> int | None:
        """Agent actions after which an episode is truncated (``None``: no limit)."""
        return self._session.max_turns

    # -- task API (trainer side) ---------------------------------------------------------------
    def splits(self) -> list[Split]:
        """The task splits, in the backend's order."""
        return runtime.run_sync(self._session.splits(), self.timeout)

    def num_tasks(self, split: str | None = None) -> int:
        """How many tasks ``split`` (default: the env's default split) holds."""
        return runtime.run_sync(self._session.num_tasks(split), self.timeout)

    def task(self, split: str, index: int) -> dict[str, Any]:
        """The task spec at ``index`` of ``split``; it may hold the answer, so keep it from the agent."""
        return runtime.run_sync(self._session.task(split, index), self.timeout)

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
        self._session.check_steppable()
        return runtime.run_sync(self._session.step(action), self.timeout)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """:meth:`reset` as a coroutine (runs on the runtime loop whatever loop awaits it)."""
        return await runtime.on_runtime(self._areset(seed, options))

    async def astep(self, action: Any) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """:meth:`step` as a coroutine."""
        self._session.check_steppable()
        return await runtime.on_runtime(self._session.step(action))

    async def _areset(
        self, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[list[Message], dict[str, Any]]:
        if self._closed:
            raise ConfigurationError("the environment is closed")
        gym.Env.reset(self, seed=seed)
        self._session.np_random = self.np_random  # task choice draws from the env's own rng
        obs, info = await self._session.reset(None, options)
        self.action_space.tools = list(self._session.tools)
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
        """End the running episode and release the backend (a shared server stops with its last user)."""
        if self._closed:
            return
        self._closed = True
        runtime.run_sync(self._aclose(), 60.0)

    async def _aclose(self) -> None:
        await self._session.aclose()
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
