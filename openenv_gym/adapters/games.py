"""What a game with several seats is to the package, whichever backend plays it.

A *game* is one episode of an environment with several seats (Verifiers v1 multi-agent envs:
``kuhn_poker_v1``'s two players, ``proposer_solver_v1``'s proposer and solvers). Each seat is
played by a caller, and the env decides who acts: at any moment it waits on some seats (they
*asked*: their model call is pending) while the others wait on it. :class:`Game` is that, on the
runtime loop: :meth:`Game.start` and :meth:`Game.act` return the :class:`Moves` once the env has
settled (every seat that will ask has asked, or the game is over). The PettingZoo envs of
:mod:`openenv_gym.multiagent` are the sync edges over it.

A seat is *appeared* once the env has started it (its rollout exists), *asked* while its call
waits for an answer, and *paid* when the game is over: every appeared seat gets its reward
then, since rewards may be settled only after the last seat's turn (``proposer_solver``'s
``learnability``, ``kuhn``'s payoff).
"""

from __future__ import annotations

import abc
from typing import Any

import msgspec

from openenv_gym.actions import Turn
from openenv_gym.errors import ConfigurationError
from openenv_gym.wire import Message, TaskRef, ToolSpec

__all__ = ["Asked", "Game", "Moves", "NotAsked", "Paid"]


class NotAsked(ConfigurationError):
    """An action for a seat the game is not waiting on (another seat's turn, a finished seat, or
    a name that is no seat of the game)."""


class Asked(msgspec.Struct):
    """A seat the game waits on: what it has not yet seen, and its tools when they changed."""

    seat: str
    messages: list[Message]
    """The seat's new messages since it last acted (at its first ask: its whole opening)."""
    tools: list[ToolSpec] | None = None
    """The seat's tools at its first ask, or when they changed; else ``None``."""
    info: dict[str, Any] = {}


class Paid(msgspec.Struct):
    """A seat's end: its reward for the game (named components in ``info``) and how it ended."""

    seat: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = {}


class Moves(msgspec.Struct):
    """Where a game stands once it settled: whom it waits on, who has appeared, and at the end
    every appeared seat's :class:`Paid`.

    Structs (not dataclasses), so that a game run in another process (a host process, a Ray
    actor: :class:`~openenv_gym.shard.shard.Shard`) sends its moves as msgpack, typed."""

    asked: dict[str, Asked]
    """The seats the game waits on, in the order they asked."""
    appeared: list[str]
    """Every seat started so far, in the order it started."""
    paid: dict[str, Paid] | None = None
    """Set once the game is over: one entry per appeared seat."""
    info: dict[str, Any] = {}
    """The game's own: ``task_id``, and ``error`` (``{"type", "message"}``) when the env failed."""

    @property
    def over(self) -> bool:
        return self.paid is not None


class Game(abc.ABC):
    """One game of a multi-seat environment, played on the runtime loop."""

    players: list[str]
    """Every seat name a game of this env may have (PettingZoo's ``possible_agents``)."""

    @abc.abstractmethod
    async def start(self, task: TaskRef) -> Moves:
        """Start the game on ``task``; the moves once the first seats have asked."""

    @abc.abstractmethod
    async def act(self, turns: dict[str, Turn]) -> Moves:
        """Answer the seats in ``turns`` (each must be asked: :class:`NotAsked` otherwise); the
        moves once the game settled again. A turn the env cannot read leaves its seat asked,
        with a message saying why."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """End the game now (every seat's rollout is stopped); idempotent."""
