"""EnvSession: one environment's episode over a (possibly shared) adapter; GameSession: one
multi-seat environment's game.

This is the async core of the Gymnasium contract, written once: seeded task choice, the reset
options, action parsing, the turn limit, the terminated/truncated split and the info keys.
:class:`~openenv_gym.env.AgentEnv` is a sync facade over one session; the vector envs hold many
sessions over a few shared adapters (one server process and a few connection pools for 64
sub-envs), which is why the session does not own its adapter.
"""

from __future__ import annotations

import asyncio
import operator
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium.utils import seeding

from openenv_gym import runtime
from openenv_gym.actions import Turn, parse_action
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.adapters.games import Game, Moves
from openenv_gym.errors import (
    ConfigurationError,
    EpisodeFinished,
    EpisodeInterrupted,
    EpisodeNotStarted,
    TaskNotFound,
)
from openenv_gym.wire import UNBOUNDED_TASKS, Message, TaskRef, ToolSpec, to_plain_json

__all__ = ["EnvSession", "GameSession", "RESET_OPTIONS", "STEP_TIMEOUT", "START_TIMEOUT", "StepResult", "TaskCursor", "check_steppable",
           "pick_index", "pick_task", "check_env_values", "checked_options"]

RESET_OPTIONS = frozenset({"split", "index", "task"})

STEP_TIMEOUT = 900.0
"""The default ``step_timeout`` of every env and vector env: the seconds one reset or step may
take before it is cancelled with :class:`~openenv_gym.errors.BackendTimeout`. Long, because one
step may run several slow tools; never unlimited, because a hung backend must not hang a trainer."""

START_TIMEOUT = 600.0
"""The default ``start_timeout`` of every env and vector env: the seconds starting may take (a local
source launches a server; an isolated env starts a host process; Ray places actors) before it is
abandoned with :class:`~openenv_gym.errors.BackendTimeout` naming that limit."""


def check_env_values(kwargs: dict[str, Any]) -> None:
    """Refuse an env kwarg of the wrong type or range by its name (``gym.make`` checks them before
    anything is built; :class:`~openenv_gym.env.AgentEnv` again, for a direct caller).

    >>> check_env_values({"max_turns": "eight"})
    Traceback (most recent call last):
    openenv_gym.errors.ConfigurationError: max_turns must be a positive integer or None, not 'eight' (str)
    """
    turns = kwargs.get("max_turns")
    if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
        raise ConfigurationError(f"max_turns must be a positive integer or None, not {turns!r} ({type(turns).__name__})")
    for name in ("step_timeout", "start_timeout"):
        value = kwargs.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ConfigurationError(f"{name} must be a positive number of seconds or None, not {value!r} ({type(value).__name__})")
    split = kwargs.get("split")
    if split is not None and not isinstance(split, str):
        raise ConfigurationError(f"split must be a split's name (a string) or None, not {split!r} ({type(split).__name__})")


StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]


def checked_options(options: Any) -> dict[str, Any]:
    """``reset``'s options, validated; a bad one is the caller's mistake: ConfigurationError.

    A ``task`` spec goes to the backend as it is, so it must be plain JSON (see
    :func:`openenv_gym.wire.to_plain_json`: no sets or objects, no NaN, no lone surrogates, at
    most 100 levels deep); the error says what and where, never the spec's values.
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"reset options must be a dict, not {type(options).__name__}")
    options = dict(options)
    unknown = set(options) - RESET_OPTIONS
    if unknown:
        names = ", ".join(sorted(repr(k)[:40] for k in unknown))
        raise ConfigurationError(f"unknown reset option(s) {names}; use split, index or task")
    split = options.get("split")
    if split is not None and not isinstance(split, str):
        raise ConfigurationError(f"reset option 'split' must be a string, not {type(split).__name__}")
    index = options.get("index")
    if index is not None:
        try:
            if isinstance(index, bool):
                raise TypeError
            options["index"] = operator.index(index)  # numpy integers too
        except TypeError:
            raise ConfigurationError(f"reset option 'index' must be an integer, not {type(index).__name__}") from None
    task = options.get("task")
    if task is not None:
        if not isinstance(task, Mapping):
            raise ConfigurationError(f"reset option 'task' must be a dict (a task spec), not {type(task).__name__}")
        try:
            task = dict(task)
        except Exception as exc:
            raise ConfigurationError(f"reset option 'task' cannot be read as a dict ({type(exc).__name__})") from None
        options["task"], why = to_plain_json(task)
        if why is not None:
            raise ConfigurationError(f"reset option 'task' is not plain JSON: {why}")
    return options


def check_steppable(started: bool, done: bool, interrupted: bool) -> None:
    """Raise the error for a step that cannot happen now: one wording for every kind of session."""
    if not started:
        raise EpisodeNotStarted("call reset() before step()")
    if done:
        raise EpisodeFinished("the episode has ended; call reset() to start a new one")
    if interrupted:
        raise EpisodeInterrupted(
            "the last step was interrupted before it finished, so its tool calls may or may not "
            "have run; call reset() to start a new episode"
        )


class TaskCursor:
    """Which task an env plays next in a split that never ends (:data:`~openenv_gym.wire.UNBOUNDED_TASKS`).

    A seed cannot pick uniformly among endless tasks, and an endless taskset is often a generator
    whose task ``k`` costs ``k`` draws, so the choice is a walk: a reset with seed ``k`` plays task
    ``k``, each later one the task ``stride`` further. A vector env gives sub-env ``i`` of ``n``
    the start ``i`` and the stride ``n``, so its sub-envs play every task once between them, as
    they do after ``reset(seed=s)`` (sub-env ``i`` seeded ``s + i``).
    """

    def __init__(self, start: int = 0, stride: int = 1):
        self.next = start
        self.stride = max(1, stride)

    def seed(self, seed: int) -> None:
        self.next = int(seed) % UNBOUNDED_TASKS

    def take(self) -> int:
        index = self.next
        self.next = (index + self.stride) % UNBOUNDED_TASKS
        return index


def pick_index(n: int, rng: np.random.Generator, cursor: TaskCursor) -> int:
    """The task an unspecified reset plays in a split of ``n`` tasks: drawn from ``rng``, or the cursor's in an endless split."""
    return cursor.take() if n == UNBOUNDED_TASKS else int(rng.integers(n))


async def pick_task(adapter: Adapter, split: str | None, options: dict[str, Any], rng: np.random.Generator,
                    cursor: TaskCursor) -> TaskRef:
    """The task a reset plays: ``options["task"]`` (a spec), else ``options["index"]`` of ``split``
    (default: the adapter's first train split), else one drawn from ``rng`` (the cursor's in an
    endless split). ``options`` are checked ones (:func:`checked_options`)."""
    split = split or await adapter.default_split()
    if options.get("task") is not None:
        return TaskRef(split=split, spec=options["task"])
    n = await adapter.num_tasks(split)
    if n == 0:
        raise TaskNotFound(f"split {split!r} has no tasks")
    index = options.get("index")
    if index is None:
        index = pick_index(n, rng, cursor)
    elif not 0 <= int(index) < n:
        raise TaskNotFound(f"index {index} is outside split {split!r} (0..{n - 1})")
    return TaskRef(split=split, index=int(index))


class EnvSession:
    """The episode state of one env: its rng, its running episode, its turn count.

    Args:
        adapter: the backend (shared; the session never closes it).
        split: the default split (default: the adapter's first ``train`` split).
        max_turns: truncate after this many agent actions (``None``: no limit).
    """

    def __init__(self, adapter: Adapter, *, split: str | None = None, max_turns: int | None = None):
        check_env_values({"split": split, "max_turns": max_turns})
        self.adapter = adapter
        self.split = split
        self.max_turns = max_turns
        self.np_random, _ = seeding.np_random()
        self.cursor = TaskCursor()
        """Where an unspecified reset goes in an endless split (a vector env sets its start and stride)."""
        self.episode: Episode | None = None
        self.done = False
        self.interrupted = False
        """The last step was cancelled midway (Ctrl-C, a timeout): the episode needs a reset."""
        self.turns = 0
        self.tools: list[ToolSpec] = []
        self.last_messages: list[Message] = []

    def seed(self, seed: int | None) -> None:
        """Reseed the task-choice rng, as ``gymnasium.Env.reset(seed=...)`` does (and, in an endless split, go to task ``seed``)."""
        self.np_random, _ = seeding.np_random(seed)
        if seed is not None:
            self.cursor.seed(seed)

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """End the running episode, pick a task and start a new episode.

        ``options``: ``split``, ``index`` (without it the index is drawn from ``np_random``) or
        ``task`` (an explicit task spec).
        """
        if seed is not None:
            self.seed(seed)
        options = checked_options(options)
        await self.aclose()
        adapter = self.adapter
        ref = await pick_task(adapter, options.get("split") or self.split, options, self.np_random, self.cursor)
        split = ref.split
        episode = adapter.episode()
        opening = await episode.start(ref)
        self.episode, self.done, self.turns, self.interrupted = episode, False, 0, False
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
        check_steppable(self.episode is not None, self.done, self.interrupted)

    async def step(self, action: Any) -> StepResult:
        """Apply one assistant message; returns (new messages, reward, terminated, truncated, info).

        ``action`` may also be a :class:`~openenv_gym.actions.Turn` that :func:`parse_action`
        made (a vector env may parse in the driver and ship the Turn, which is always encodable).
        Raises :class:`~openenv_gym.errors.InvalidAction` for a value that is not an action at all.
        """
        self.check_steppable()
        episode = self.episode
        assert episode is not None
        turn = action if isinstance(action, Turn) else parse_action(action)
        try:
            outcome = await episode.step(turn)
        except asyncio.CancelledError:
            self.interrupted = True  # cancelled midway: the backend's state is unknown
            raise
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


class GameSession:
    """One multi-agent env's games, one at a time: to a game what :class:`EnvSession` is to an episode.

    ``reset`` picks the task exactly as ``gym.make``'s env does (``split``, ``index`` or ``task``
    options; without an index one drawn from ``np_random``; in an endless split, task ``k`` for
    seed ``k``) and starts a :class:`~openenv_gym.adapters.games.Game` on it; ``act`` answers
    seats. The PettingZoo edges (:mod:`openenv_gym.multiagent`) call it through the runtime
    loop, each call bounded by ``step_timeout``; a shard holds many, in any process.

    Args:
        adapter: a started adapter that plays games (``adapter.game()``); closed by :meth:`aclose`
            when ``owns_adapter`` (a shard's games share one and close it themselves).
        split: the default split (default: the adapter's first train split).
        step_timeout, start_timeout: the bounds of one call and of starting (as ``gym.make``'s).
    """

    def __init__(self, adapter: Adapter, *, split: str | None = None, step_timeout: float = STEP_TIMEOUT,
                 start_timeout: float = START_TIMEOUT, owns_adapter: bool = True):
        self.adapter = adapter
        self.owns_adapter = owns_adapter
        self.split = split
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        self.np_random, _ = seeding.np_random()
        self.cursor = TaskCursor()
        self.game: Game | None = None
        self.moves: Moves | None = None
        self.closed = False

    @property
    def players(self) -> list[str]:
        """Every seat a game may have (``possible_agents``)."""
        return list(self.adapter.players())  # type: ignore[attr-defined]

    # -- async core ------------------------------------------------------------------------------------
    async def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None) -> Moves:
        """End the running game, pick a task and start a new game; its first moves.

        Unknown option names are ignored with a warning (PettingZoo's conformance test passes
        one), where ``gym.make``'s env refuses them.
        """
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
            self.cursor.seed(seed)
        given = dict(options or {}) if isinstance(options, Mapping) or options is None else options
        if isinstance(given, dict):
            unknown = sorted(repr(k)[:40] for k in given if k not in RESET_OPTIONS)
            if unknown:
                warnings.warn(f"unknown reset option(s) {', '.join(unknown)} ignored; a game takes split, index or task",
                              stacklevel=3)
                given = {k: v for k, v in given.items() if k in RESET_OPTIONS}
        checked = checked_options(given)
        await self.end_game()
        ref = await pick_task(self.adapter, checked.get("split") or self.split, checked, self.np_random, self.cursor)
        game = self.adapter.game()  # type: ignore[attr-defined]
        self.game = game
        moves = await game.start(ref)
        moves.info.update(split=ref.split, index=ref.index)
        self.moves = moves
        return moves

    async def act(self, actions: Mapping[str, Any]) -> Moves:
        """Answer the seats in ``actions`` (assistant messages, as ``env.step`` takes them)."""
        if self.game is None:
            raise EpisodeNotStarted("no game is running: call reset() first")
        # A driver in another process sends turns parsed where the model's reply was read.
        turns = {seat: action if isinstance(action, Turn) else parse_action(action) for seat, action in actions.items()}
        moves = await self.game.act(turns)
        if self.moves is not None:
            moves.info = {**self.moves.info, **moves.info}
        self.moves = moves
        return moves

    async def end_game(self) -> None:
        if self.game is not None:
            game, self.game = self.game, None
            await game.aclose()

    async def aclose(self) -> None:
        self.closed = True
        try:
            await self.end_game()
        finally:
            if self.owns_adapter:
                await self.adapter.aclose()

    # -- sync edges ------------------------------------------------------------------------------------
    def call(self, coro: Any, what: str) -> Any:
        """Run ``coro`` on the runtime loop, bounded by ``step_timeout``."""
        if self.closed:
            coro.close()
            raise ConfigurationError("the env is closed")
        return runtime.run_sync(coro, self.step_timeout, what=what, limit="step_timeout")

    def close(self) -> None:
        """End the game (every seat's rollout) and close the adapter; idempotent."""
        if not self.closed:
            runtime.untrack(self)
            runtime.run_sync(self.aclose(), self.step_timeout, what="closing the env", limit="step_timeout")
