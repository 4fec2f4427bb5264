"""Multi-agent environments behind PettingZoo's API: every seat a policy can train.

An env with several seats (Verifiers v1 multi-agent envs: ``kuhn_poker_v1``'s two players,
``proposer_solver_v1``'s proposer and solvers) is a game: each seat is played by the caller, and
the env decides whom it waits on. Three ways to play one (``pip install -e '.[multiagent]'``)::

    from openenv_gym.multiagent import aec_env, parallel_env, SinglePlayer

    env = aec_env("openenv/Verifiers-v0", source="environments/kuhn_poker_v1")
    env.reset(seed=0)
    for seat in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        env.step(None if terminated or truncated else policy(seat, obs))

* :func:`aec_env`: PettingZoo's ``AECEnv`` (:class:`~.aec.GameAECEnv`), the seat the env waits
  on acts;
* :func:`parallel_env`: PettingZoo's ``ParallelEnv`` (:class:`~.parallel.GameParallelEnv`), the
  seats the env waits on together act in one step;
* :func:`vector_env`: many games at once, first-ready over (game, seat) pairs, with per-seat
  groups and records (:class:`~.vector.GameVectorEnv`);
* :class:`SinglePlayer`: one seat as a Gymnasium env, the others played by a given policy.

Ids and kwargs are ``gym.make``'s, plus ``seat_runs={"solver": 4}`` for a seat the env runs
several times per game (its players are then ``solver_0`` ... ``solver_3``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openenv_gym.errors import ConfigurationError

if TYPE_CHECKING:
    from openenv_gym.multiagent.aec import GameAECEnv
    from openenv_gym.multiagent.parallel import GameParallelEnv
    from openenv_gym.multiagent.single_player import SinglePlayer
    from openenv_gym.multiagent.vector import GameVectorEnv

__all__ = ["aec_env", "parallel_env", "vector_env", "SinglePlayer", "GameAECEnv", "GameParallelEnv", "GameVectorEnv"]


def _pettingzoo() -> None:
    try:
        import pettingzoo  # noqa: F401
    except ImportError:
        raise ConfigurationError("multi-agent envs need PettingZoo: pip install -e '.[multiagent]'") from None


def aec_env(env_id: str, **kwargs: Any) -> GameAECEnv:
    """PettingZoo's ``AECEnv`` for ``env_id`` (kwargs as ``gym.make`` takes them, plus ``seat_runs``)."""
    _pettingzoo()
    from openenv_gym.multiagent.aec import GameAECEnv
    from openenv_gym.multiagent.session import open_session

    return GameAECEnv(open_session(env_id, kwargs), env_id)


def parallel_env(env_id: str, **kwargs: Any) -> GameParallelEnv:
    """PettingZoo's ``ParallelEnv`` for ``env_id`` (kwargs as ``gym.make`` takes them, plus ``seat_runs``)."""
    _pettingzoo()
    from openenv_gym.multiagent.parallel import GameParallelEnv
    from openenv_gym.multiagent.session import open_session

    return GameParallelEnv(open_session(env_id, kwargs), env_id)


def vector_env(env_id: str, num_games: int, **kwargs: Any) -> GameVectorEnv:
    """Many games of ``env_id`` at once, first-ready over (game, seat) pairs (see :mod:`.vector`)."""
    _pettingzoo()
    from openenv_gym.multiagent.vector import GameVectorEnv

    return GameVectorEnv(env_id, num_games, **kwargs)


def __getattr__(name: str) -> Any:
    if name in ("SinglePlayer", "GameAECEnv", "GameParallelEnv", "GameVectorEnv"):
        _pettingzoo()
        from openenv_gym.multiagent import aec, parallel, single_player, vector

        return {"SinglePlayer": single_player.SinglePlayer, "GameAECEnv": aec.GameAECEnv,
                "GameParallelEnv": parallel.GameParallelEnv, "GameVectorEnv": vector.GameVectorEnv}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
