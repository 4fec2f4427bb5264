"""One seat of a game as a Gymnasium env: the other seats are played by a given policy.

``SinglePlayer(aec_env(ID), "player1", opponents=...)`` is a plain ``gymnasium.Env`` whose
episodes are games seen from one seat, so every single-agent tool (wrappers, rollouts, a trainer
of one agent) works on a multi-agent env unchanged. ``opponents`` answers every other seat: a
function ``(seat, observation, info) -> action``, or a :class:`~openenv_gym.policies.Policy`
(:class:`~openenv_gym.policies.OpenAIPolicy` for a model behind an OpenAI-compatible endpoint,
:class:`~openenv_gym.policies.RandomPolicy`), which keeps each seat's conversation as it does a
sub-env's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from openenv_gym.errors import ConfigurationError, EpisodeFinished, EpisodeNotStarted, ServerError
from openenv_gym.multiagent.aec import GameAECEnv
from openenv_gym.multiagent.seats import Observation
from openenv_gym.policies import Policy
from openenv_gym.spaces import AssistantAction, Messages

__all__ = ["SinglePlayer", "MAX_SKIPPED_GAMES", "from_make"]

MAX_SKIPPED_GAMES = 8
"""Games in a row a reset may skip because they ended before the seat was asked (an opponent
forfeited at once) before it gives up with a ServerError."""

Opponent = Callable[[str, list[Any], dict[str, Any]], Any]


class SinglePlayer(gym.Env[list[Any], Any]):
    """``agent``'s seat of ``env`` as a Gymnasium env; ``opponents`` plays every other seat.

    Args:
        env: a game (:func:`openenv_gym.multiagent.aec_env`); closed by :meth:`close`.
        agent: the seat played through ``step`` (one of ``env.possible_agents``).
        opponents: a function ``(seat, observation, info) -> action`` or a
            :class:`~openenv_gym.policies.Policy`.

    An episode is one game. ``reset`` returns the seat's first prompt (games that end before
    it is asked are skipped: ``info["games_skipped"]``); ``step`` answers it and returns its next
    prompt, the other seats having moved meanwhile; the reward is the seat's, paid when the game
    is over (``info`` then holds its reward components and the game's ``task_id``).
    """

    metadata = {"render_modes": []}

    def __init__(self, env: GameAECEnv, agent: str, opponents: Opponent | Policy):
        if agent not in env.possible_agents:
            raise ConfigurationError(f"{agent!r} is not a seat of this game; its seats are {env.possible_agents}")
        if not callable(opponents) and not isinstance(opponents, Policy):
            raise ConfigurationError("opponents must be a function (seat, observation, info) -> action, or a Policy")
        self.env = env
        self.agent = agent
        self.opponents = opponents
        self.observation_space = Messages()
        self.action_space: AssistantAction = AssistantAction()
        self._ids = {seat: i for i, seat in enumerate(env.possible_agents)}
        self._started: set[str] = set()
        self._running = False
        self._played = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        for skipped in range(MAX_SKIPPED_GAMES + 1):
            self.env.reset(seed=seed if skipped == 0 else None, options=options)
            self._started = set()
            if self._play_others():
                obs, _, _, _, info = self.env.last()
                self._running = self._played = True
                info = {**info, "seat": self.agent}
                if skipped:
                    info["games_skipped"] = skipped
                self._tools()
                return obs, info
        raise ServerError(f"{MAX_SKIPPED_GAMES + 1} games in a row ended before {self.agent!r} was asked "
                          f"(MAX_SKIPPED_GAMES={MAX_SKIPPED_GAMES})")

    def step(self, action: Any) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if not self._running:
            if not self._played:
                raise EpisodeNotStarted("no game is running: call reset() first")
            raise EpisodeFinished("the game is over: call reset() to play again")
        self.env.step(action)
        asked = self._play_others()
        obs, reward, terminated, truncated, info = self.env.last() if asked else self._final()
        info = {**info, "seat": self.agent}
        if asked:
            self._tools()
        else:
            self._running = False
        return obs, float(reward), bool(terminated), bool(truncated), info

    def _play_others(self) -> bool:
        """Step the other seats (and the finished ones) until ``agent`` is asked: ``True``, or the
        game is over for it: ``False``."""
        env = self.env
        for seat in env.agent_iter():
            obs, _, terminated, truncated, info = env.last()
            if seat == self.agent and not (terminated or truncated):
                return True
            if seat == self.agent:
                return False
            env.step(None if terminated or truncated else self._opponent(seat, obs, info))
        return False

    def _final(self) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """The seat's end (it is selected, dead: :meth:`_play_others` stopped there), then every
        finished seat stepped out of the game."""
        env = self.env
        if env.agent_selection != self.agent or self.agent not in env.agents:
            raise ServerError(f"the game ended without paying {self.agent!r}")
        _, reward, terminated, truncated, info = env.last()
        while env.agents:
            env.step(None)
        return Observation(), reward, terminated, truncated, info

    def _opponent(self, seat: str, obs: list[Any], info: dict[str, Any]) -> Any:
        opponents = self.opponents
        if isinstance(opponents, Policy):
            key = self._ids[seat]
            if seat not in self._started:
                self._started.add(seat)
                opponents.reset(key, list(obs), info)
            return opponents.act_batch([key], [list(obs)], [info])[0]
        return opponents(seat, list(obs), info)

    def _tools(self) -> None:
        """The seat's action space samples the tools it has now."""
        self.action_space.tools = list(self.env.action_space(self.agent).tools)

    # -- the task API, as gym.make's env has it (the play page lists splits with it) ------------------
    def splits(self) -> list[Any]:
        session = self.env.session
        return list(session.call(session.adapter.splits(), "splits"))

    def num_tasks(self, split: str) -> int:
        session = self.env.session
        return int(session.call(session.adapter.num_tasks(split), "num_tasks"))

    def close(self) -> None:
        self.env.close()


def from_make(spec: Any, env_kwargs: dict[str, Any], seat: Any, opponents: Any) -> SinglePlayer:
    """``gym.make(ID, single_player=seat, opponents=...)``: the seat of a game as a Gymnasium env.

    Called by the package's ``gym.make`` entry point (by name, so that registering ids never
    imports this module) with the adapter recipe it split from the kwargs."""
    from openenv_gym.multiagent.session import as_game, start_session

    if opponents is None:
        raise ConfigurationError("single_player= needs opponents=: a function (seat, observation, info) -> action, "
                                 "or a Policy (OpenAIPolicy for a model) playing the other seats")
    session = start_session(*as_game(spec, env_kwargs))
    try:
        return SinglePlayer(GameAECEnv(session, ""), seat, opponents)
    except BaseException:
        session.close()
        raise
