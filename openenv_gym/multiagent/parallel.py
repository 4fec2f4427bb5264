"""A game as PettingZoo's ``ParallelEnv``: every seat the env waits on acts in one step.

At each step the seats the env waits on together act at once (``proposer_solver``'s solvers, all
of them in one step; where seats take turns, the one whose turn it is). ``agents`` are the seats
the game has started and not yet paid, as PettingZoo's contract wants them (a seat, once gone,
never comes back): a seat that has had its last turn but not yet its reward (the proposer, paid
when the solvers finish) stays in ``agents`` until the game pays it. ``infos[seat]["asked"]``
says which seats the env waits on; the action of a seat that is not asked is ignored (``None``
is the natural one to send), and its observation is empty.
"""

from __future__ import annotations

from typing import Any

from pettingzoo import ParallelEnv

from openenv_gym.adapters.games import Moves, NotAsked
from openenv_gym.errors import EpisodeFinished, EpisodeNotStarted
from openenv_gym.multiagent.seats import Observation, Seats, end_info
from openenv_gym.session import GameSession

__all__ = ["GameParallelEnv"]

Step = tuple[dict[str, Observation], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict[str, Any]]]


class GameParallelEnv(Seats, ParallelEnv[str, Observation, Any]):
    """PettingZoo's ``ParallelEnv`` over a :class:`GameSession` (made by :func:`openenv_gym.multiagent.parallel_env`).

    ``step(actions)`` needs an action for every asked seat (a :class:`NotAsked` error names the
    missing ones); infos are as :class:`~openenv_gym.multiagent.aec.GameAECEnv`'s.
    """

    metadata = {"name": "openenv_gym_game", "render_modes": []}

    def __init__(self, session: GameSession, env_id: str = ""):
        self._seats(session, env_id)
        self.agents: list[str] = []
        self._asked: set[str] = set()
        self._started = False

    def __str__(self) -> str:
        return f"<GameParallelEnv {self.env_id}>"

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, Observation], dict[str, dict[str, Any]]]:
        moves = self._start(seed, options)
        self.agents, self._started = [], True
        observations, _, _, _, infos = self._read(moves)
        return observations, infos

    def step(self, actions: dict[str, Any]) -> Step:
        if not self._started:
            raise EpisodeNotStarted("no game is running: call reset() first")
        if not self.agents:
            raise EpisodeFinished("the game is over: call reset() to play again")
        unknown = sorted(str(a)[:40] for a in actions if a not in self.possible_agents)
        if unknown:
            raise NotAsked(f"{unknown[0]!r} is no seat of this game (its seats: {', '.join(self.possible_agents)})")
        missing = sorted(self._asked - set(actions))
        if missing:
            raise NotAsked(f"no action for {', '.join(missing)}, which the game waits on")
        turns = {seat: actions[seat] for seat in self._asked}
        moves = self.session.call(self.session.act(turns), "step")
        return self._read(moves)

    def _read(self, moves: Moves) -> Step:
        for seat in moves.appeared:
            if seat not in self.agents and (moves.paid is None or seat in moves.paid):
                self.agents.append(seat)
        live = list(self.agents)
        observations = {seat: Observation() for seat in live}
        rewards = dict.fromkeys(live, 0.0)
        terminations = dict.fromkeys(live, False)
        truncations = dict.fromkeys(live, False)
        infos: dict[str, dict[str, Any]] = {seat: {"asked": False} for seat in live}
        for seat, asked in moves.asked.items():
            observations[seat] = Observation(asked.messages)
            infos[seat] = {**asked.info, "asked": True}
            if asked.tools is not None:
                self.action_space(seat).tools = list(asked.tools)
                infos[seat]["tools"] = [t.to_openai() for t in asked.tools]
        self._asked = set(moves.asked)
        if moves.paid is not None:
            for seat in live:
                paid = moves.paid[seat]
                rewards[seat] = paid.reward
                terminations[seat], truncations[seat] = paid.terminated, paid.truncated
                infos[seat] = end_info(paid, moves)
            self.agents = []
        return observations, rewards, terminations, truncations, infos

