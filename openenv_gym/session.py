"""EnvSession: one environment's episode over a (possibly shared) adapter.

This is the async core of the Gymnasium contract, written once: seeded task choice, the reset
options, action parsing, the turn limit, the terminated/truncated split and the info keys.
:class:`~openenv_gym.env.AgentEnv` is a sync facade over one session; the vector envs hold many
sessions over a few shared adapters (one server process and a few connection pools for 64
sub-envs), which is why the session does not own its adapter.
"""

from __future__ import annotations

from typing import Any

from gymnasium.utils import seeding

from openenv_gym.actions import parse_action
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.errors import ConfigurationError, EpisodeFinished, EpisodeNotStarted, TaskNotFound
from openenv_gym.wire import Message, TaskRef, ToolSpec

__all__ = ["EnvSession", "RESET_OPTIONS"]

RESET_OPTIONS = frozenset({"split", "index", "task"})

StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]


class EnvSession:
    """The episode state of one env: its rng, its running episode, its turn count.

    Args:
        adapter: the backend (shared; the session never closes it).
        split: the default split (default: the adapter's first ``train`` split).
        max_turns: truncate after this many agent actions (``None``: no limit).
    """

    def __init__(self, adapter: Adapter, *, split: str | None = None, max_turns: int | None = None):
        if max_turns is not None and max_turns < 1:
            raise ConfigurationError("max_turns must be a positive integer or None")
        self.adapter = adapter
        self.split = split
        self.max_turns = max_turns
        self.np_random, _ = seeding.np_random()
        self.episode: Episode | None = None
        self.done = False
        self.turns = 0
        self.tools: list[ToolSpec] = []
        self.last_messages: list[Message] = []

    def seed(self, seed: int | None) -> None:
        """Reseed the task-choice rng, as ``gymnasium.Env.reset(seed=...)`` does."""
        self.np_random, _ = seeding.np_random(seed)

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """End the running episode, pick a task and start a new episode.

        ``options``: ``split``, ``index`` (without it the index is drawn from ``np_random``) or
        ``task`` (an explicit task spec).
        """
        if seed is not None:
            self.seed(seed)
        options = dict(options or {})
        unknown = set(options) - RESET_OPTIONS
        if unknown:
            raise ConfigurationError(f"unknown reset option(s) {sorted(unknown)}; use split, index or task")
        await self.aclose()
        adapter = self.adapter
        split = options.get("split") or self.split or await adapter.default_split()
        if options.get("task") is not None:
            ref = TaskRef(split=split, spec=dict(options["task"]))
        else:
            n = await adapter.num_tasks(split)
            if n == 0:
                raise TaskNotFound(f"split {split!r} has no tasks")
            index = options.get("index")
            if index is None:
                index = int(self.np_random.integers(n))
            elif not 0 <= int(index) < n:
                raise TaskNotFound(f"index {index} is outside split {split!r} (0..{n - 1})")
            ref = TaskRef(split=split, index=int(index))
        episode = adapter.episode()
        opening = await episode.start(ref)
        self.episode, self.done, self.turns = episode, False, 0
        self.tools = list(opening.tools)
        self.last_messages = opening.messages
        info = {
            **adapter.info(),
            **opening.info,
            "tools": [t.to_openai() for t in opening.tools],
            "task_id": opening.task_id,
            "split": split,
            "index": ref.index,
        }
        return list(opening.messages), info

    def check_steppable(self) -> None:
        """Raise the Gymnasium-style error for a step that cannot happen now."""
        if self.episode is None:
            raise EpisodeNotStarted("call reset() before step()")
        if self.done:
            raise EpisodeFinished("the episode has ended; call reset() to start a new one")

    async def step(self, action: Any) -> StepResult:
        """Apply one assistant message; returns (new messages, reward, terminated, truncated, info)."""
        self.check_steppable()
        episode = self.episode
        assert episode is not None
        outcome = await episode.step(parse_action(action))
        self.turns += 1
        truncated = bool(outcome.truncated) or (
            not outcome.terminated and self.max_turns is not None and self.turns >= self.max_turns
        )
        info = dict(outcome.info)
        info["turn"] = self.turns
        if outcome.tools is not None:
            self.tools = list(outcome.tools)
            info["tools"] = [t.to_openai() for t in outcome.tools]
        if outcome.terminated or truncated:
            self.done = True
            await episode.aclose()
        self.last_messages = outcome.messages
        return list(outcome.messages), float(outcome.reward), bool(outcome.terminated), truncated, info

    async def aclose(self) -> None:
        """End the running episode, if any (the adapter stays open)."""
        if self.episode is not None:
            episode, self.episode = self.episode, None
            await episode.aclose()

    # -- the trainer's task API --------------------------------------------------------------------
    async def splits(self) -> list[Any]:
        return await self.adapter.splits()

    async def num_tasks(self, split: str | None = None) -> int:
        return await self.adapter.num_tasks(split or self.split or await self.adapter.default_split())

    async def task(self, split: str, index: int) -> dict[str, Any]:
        return await self.adapter.task(split, index)

