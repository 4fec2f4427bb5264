"""The game state of one multi-agent env, behind every PettingZoo edge: its adapter, its task rng,
its running game.

:class:`GameSession` is to a game what :class:`~openenv_gym.session.EnvSession` is to an episode:
``reset`` picks the task exactly as ``gym.make``'s env does (``split``, ``index`` or ``task``
options; without an index one drawn from ``np_random``; in an endless split, task ``k`` for seed
``k``) and starts a :class:`~openenv_gym.adapters.games.Game` on it; ``act`` answers seats. The
sync edges (:mod:`.aec`, :mod:`.parallel`) call it through the runtime loop, each call bounded
by ``step_timeout``; :func:`open_session` builds and starts the adapter of an id as ``gym.make``
would, with every seat played by the caller.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from gymnasium.utils import seeding

from openenv_gym import runtime
from openenv_gym.actions import parse_action
from openenv_gym.adapters.base import Adapter
from openenv_gym.adapters.games import Game, Moves
from openenv_gym.errors import ConfigurationError, EpisodeNotStarted
from openenv_gym.session import RESET_OPTIONS, START_TIMEOUT, STEP_TIMEOUT, TaskCursor, checked_options, pick_task

__all__ = ["GameSession", "open_session"]


class GameSession:
    """One multi-agent env's games, one at a time, on the runtime loop.

    Args:
        adapter: a started adapter that plays games (``adapter.game()``); closed by :meth:`aclose`.
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
        turns = {seat: parse_action(action) for seat, action in actions.items()}
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


def open_session(env_id: str, kwargs: dict[str, Any]) -> GameSession:
    """The started :class:`GameSession` of ``env_id`` with ``kwargs`` (as ``gym.make`` takes them),
    every seat played by the caller; a ConfigurationError for an env that has no seats to play."""
    from openenv_gym.adapters.base import accepted_kwargs
    from openenv_gym.registration import adapter_spec

    spec, env_kwargs = adapter_spec(env_id, dict(kwargs))
    if "python" in env_kwargs:
        raise ConfigurationError("a multi-agent env runs in this process (python=/isolate= are not supported for games)")
    accepted = accepted_kwargs(spec.target()) or frozenset()
    if "multiagent" not in accepted:
        raise ConfigurationError(
            f"{env_id} is not a multi-agent env (its backend, {spec.entry.rsplit(':', 1)[-1]}, plays one agent): "
            "play it with gym.make")
    spec.kwargs["multiagent"] = True
    env_kwargs.pop("render_mode", None)
    adapter = spec.build()
    session = GameSession(adapter, split=env_kwargs.get("split"),
                          step_timeout=env_kwargs.get("step_timeout") or STEP_TIMEOUT,
                          start_timeout=env_kwargs.get("start_timeout") or START_TIMEOUT)
    try:
        runtime.run_sync(adapter.start(), session.start_timeout, what="starting the env", limit="start_timeout")
    except BaseException:
        runtime.run_sync(adapter.aclose(), session.step_timeout)
        raise
    runtime.track(session)  # closed at interpreter exit if the caller forgets
    return session
