"""What every PettingZoo edge of a game shares: a seat's observation type, its spaces, its end.

:class:`Seats` holds the per-seat spaces (the same object every call, as PettingZoo's tests
require) and starts a game from a :class:`~openenv_gym.session.GameSession`;
:func:`end_info` is a paid seat's info, the game's own facts added.
"""

from __future__ import annotations

from typing import Any

from openenv_gym.adapters.games import Moves, Paid
from openenv_gym.errors import ServerError
from openenv_gym.session import GameSession
from openenv_gym.spaces import AssistantAction, Messages

__all__ = ["Observation", "Seats", "end_info"]


class Observation(list[Any]):
    """A seat's new messages: a plain list of OpenAI messages. Its ``dtype`` is ``None``, as its
    space's (:class:`~openenv_gym.spaces.Messages`) is: PettingZoo's conformance test compares them."""

    dtype = None


def end_info(paid: Paid, moves: Moves) -> dict[str, Any]:
    """A paid seat's info: its own (rewards, metrics, ...), the game's ``task_id``, ``split`` and
    ``index``, and the game's ``error`` where the seat's own says none."""
    info = {**paid.info, **{k: v for k, v in moves.info.items() if k != "error"}}
    if "error" in moves.info and "error" not in info:
        info["error"] = moves.info["error"]
    return info


class Seats:
    """The spaces of a game's seats, and the start of its games (a base of the PettingZoo envs)."""

    session: GameSession
    env_id: str
    possible_agents: list[str]

    def _seats(self, session: GameSession, env_id: str) -> None:
        self.session, self.env_id = session, env_id
        self.possible_agents = session.players
        self.observation_spaces = {seat: Messages() for seat in self.possible_agents}
        self.action_spaces = {seat: AssistantAction() for seat in self.possible_agents}

    def observation_space(self, agent: str) -> Messages:
        return self.observation_spaces.get(agent) or self.observation_spaces.setdefault(agent, Messages())

    def action_space(self, agent: str) -> AssistantAction:
        return self.action_spaces.get(agent) or self.action_spaces.setdefault(agent, AssistantAction())

    def _start(self, seed: int | None, options: dict[str, Any] | None) -> Moves:
        """A new game's first moves (every seat's action space seeded with ``seed``)."""
        moves = self.session.call(self.session.reset(seed, options), "reset")
        if seed is not None:
            for seat in self.possible_agents:
                self.action_space(seat).seed(seed)
        if moves.over:
            raise ServerError(f"the game of {self.env_id} ended before any seat was asked: "
                              f"{moves.info.get('error') or 'no seat asked the model'}")
        return moves

    def render(self) -> None:
        return None

    def close(self) -> None:
        self.session.close()
