"""A game as PettingZoo's ``AECEnv``: one seat acts at a time, the one the env waits on.

Seats are the env's own (``player0``, ``player1``; ``proposer``, ``solver_0`` ... for a seat run
several times, see ``seat_runs``). ``agents`` are the seats the game has started and not yet
paid; ``agent_selection`` is a seat the env waits on (the first to ask). ``last()`` gives that
seat's new messages since it last acted (at its first turn its whole opening: system prompt and
prompt, never another seat's), its reward since, and whether it is done. Rewards arrive when the
game is over, for every seat at once (the env settles them then); each seat then ends
(``terminated``, or ``truncated`` when its rollout hit a limit or failed) and is stepped with
``None``, as PettingZoo's loop does.
"""

from __future__ import annotations

from typing import Any

from pettingzoo import AECEnv

from openenv_gym.adapters.games import Moves, NotAsked
from openenv_gym.errors import EpisodeFinished, EpisodeNotStarted
from openenv_gym.multiagent.seats import Observation, Seats, end_info
from openenv_gym.session import GameSession

__all__ = ["GameAECEnv", "Observation"]


class GameAECEnv(Seats, AECEnv[str, Observation, Any]):
    """PettingZoo's ``AECEnv`` over a :class:`GameSession` (made by :func:`openenv_gym.multiagent.aec_env`).

    ``step(action)`` answers ``agent_selection`` with an assistant message (text, or a message
    with tool calls, as ``gym.make``'s env takes it); a message the env cannot read comes back to
    the same seat as an observation saying why. ``infos[seat]`` holds, while the seat is asked,
    ``asked: True`` (and ``tools`` at its first turn or when they change); at the end its reward
    components (``rewards``, ``reward_weights``), ``metrics``, ``stop_condition``, ``ok`` and
    ``error`` when its rollout or the env failed, plus the game's ``task_id``.
    """

    metadata = {"name": "openenv_gym_game", "render_modes": [], "is_parallelizable": True}

    def __init__(self, session: GameSession, env_id: str = ""):
        super().__init__()
        self._seats(session, env_id)
        self.agents: list[str] = []
        self.rewards: dict[str, float] = {}
        self._cumulative_rewards: dict[str, float] = {}
        self.terminations: dict[str, bool] = {}
        self.truncations: dict[str, bool] = {}
        self.infos: dict[str, dict[str, Any]] = {}
        self.agent_selection = ""
        self._seen: dict[str, Observation] = {}
        self._over = False
        self._started = False

    def __str__(self) -> str:
        return f"<GameAECEnv {self.env_id}>"

    # -- the game ----------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        moves = self._start(seed, options)
        self.agents = []
        self.rewards, self._cumulative_rewards = {}, {}
        self.terminations, self.truncations, self.infos = {}, {}, {}
        self._seen, self._over, self._started = {}, False, True
        self._skip_agent_selection = None
        self._apply(moves)

    def observe(self, agent: str) -> Observation:
        return self._seen.get(agent, Observation())

    def step(self, action: Any) -> None:
        if not self._started:
            raise EpisodeNotStarted("no game is running: call reset() first")
        if not self.agents:
            raise EpisodeFinished("the game is over: call reset() to play again")
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0
        moves = self.session.call(self.session.act({agent: action}), f"{agent}'s step")
        self._seen[agent] = Observation()
        self._apply(moves)

    def _apply(self, moves: Moves) -> None:
        for seat in moves.appeared:
            if seat not in self.rewards and not self._over:
                self.agents.append(seat)
                self.rewards[seat] = self._cumulative_rewards[seat] = 0.0
                self.terminations[seat] = self.truncations[seat] = False
                self.infos[seat] = {}
        self._clear_rewards()
        for seat, asked in moves.asked.items():
            self._seen[seat] = Observation(asked.messages)
            info: dict[str, Any] = {**asked.info, "asked": True}
            if asked.tools is not None:
                self.action_space(seat).tools = list(asked.tools)
                info["tools"] = [t.to_openai() for t in asked.tools]
            self.infos[seat] = info
        for seat in self.agents:
            if seat not in moves.asked and not self.terminations[seat] and not self.truncations[seat]:
                self.infos[seat] = {"asked": False}
        if moves.paid is not None:
            self._over = True
            for seat in self.agents:
                paid = moves.paid.get(seat)
                if paid is None:
                    continue
                self.rewards[seat] = paid.reward
                self.terminations[seat], self.truncations[seat] = paid.terminated, paid.truncated
                self.infos[seat] = end_info(paid, moves)
                self._seen[seat] = Observation()
            self._accumulate_rewards()
            self.agent_selection = self.agents[0]
            return
        self._accumulate_rewards()
        if not moves.asked:
            raise NotAsked("the game settled with no seat asked")  # Game guarantees one; a bug if not
        self.agent_selection = next(iter(moves.asked))

