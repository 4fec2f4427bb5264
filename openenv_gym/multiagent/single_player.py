"""One seat of a game as a Gymnasium env: the other seats are played by a given policy.

``SinglePlayer(aec_env(ID), "player1", opponents=...)`` is a plain ``gymnasium.Env`` whose
episodes are games seen from one seat, so every single-agent tool (wrappers, rollouts, a trainer
of one agent) works on a multi-agent env unchanged. It is the package's own env
(:class:`~openenv_gym.env.AgentEnv`) over :class:`~openenv_gym.multiagent.seat.SeatAdapter`, the
adapter ``gym.make(ID, single_player=SEAT, opponents=...)`` builds too, here sharing the game
adapter the AEC env started. ``opponents`` answers every other seat: a function ``(seat,
observation, info) -> action``, a :class:`~openenv_gym.policies.Policy`
(:class:`~openenv_gym.policies.OpenAIPolicy` for a model behind an OpenAI-compatible endpoint,
:class:`~openenv_gym.policies.RandomPolicy`), ``"random"``, or ``{"base_url": URL, "model": NAME}``.
"""

from __future__ import annotations

from typing import Any

from openenv_gym.env import AgentEnv
from openenv_gym.errors import ConfigurationError
from openenv_gym.multiagent.aec import GameAECEnv
from openenv_gym.multiagent.seat import MAX_SKIPPED_GAMES, SeatAdapter

__all__ = ["SinglePlayer", "MAX_SKIPPED_GAMES"]


class SinglePlayer(AgentEnv):
    """``agent``'s seat of ``env`` as a Gymnasium env; ``opponents`` plays every other seat.

    Args:
        env: a game (:func:`openenv_gym.multiagent.aec_env`); its adapter plays the games, and it
            is closed by :meth:`close`.
        agent: the seat played through ``step`` (one of ``env.possible_agents``).
        opponents: see the module docstring.

    An episode is one game on the task ``reset`` picks (as ``gym.make``'s env picks it). ``reset``
    returns the seat's first prompt (a game that ends before the seat is asked, an opponent
    forfeiting at once, is replayed on the same task: ``info["games_skipped"]``, at most
    :data:`MAX_SKIPPED_GAMES` in a row); ``step`` answers it and returns its next prompt, the
    other seats having moved meanwhile; the reward is the seat's, paid when the game is over
    (``info`` then holds its reward components and the game's ``task_id``).
    """

    def __init__(self, env: GameAECEnv, agent: str, opponents: Any):
        if agent not in env.possible_agents:
            raise ConfigurationError(f"{agent!r} is not a seat of this game; its seats are {env.possible_agents}")
        self.game_env = env
        self.agent = agent
        session = env.session
        super().__init__(SeatAdapter(session.adapter, agent, opponents), split=session.split,
                         step_timeout=session.step_timeout, start_timeout=session.start_timeout)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.game_env.close()
