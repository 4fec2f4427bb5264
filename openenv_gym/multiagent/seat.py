"""One seat of a game as an adapter: episodes are games seen from that seat, the others played by a policy.

``gym.make(ID, single_player=SEAT, opponents=...)`` builds a :class:`SeatAdapter` over the game's
adapter, so the seat is an ordinary single-agent env wherever envs run: ``gym.make``,
``gym.make_vec`` (in process, Ray), ``openenv-gym rollout`` (tested), and what builds on the same
adapters (``serve``, TRL's ``EnvSpec``, the session pool; not yet tested with a seat).
:class:`~openenv_gym.multiagent.SinglePlayer` is the same adapter
under :class:`~openenv_gym.env.AgentEnv`. An episode is one game on the task the env picked:
``start`` plays the other seats until this one is asked, ``step`` answers it and plays the others
again, and the game's end is the episode's, paid with the seat's own reward.

``opponents`` answers every other seat:

* a function ``(seat, observation, info) -> action`` (a coroutine function too);
* a :class:`~openenv_gym.policies.Policy` (``OpenAIPolicy`` for a model, ``RandomPolicy``), keeping
  each seat's conversation per game;
* what a command line or a JSON config can say: ``"random"`` (``RandomPolicy``), or
  ``{"base_url": URL, "model": NAME, ...}`` (``OpenAIPolicy`` with those arguments).

An env that runs in another process (host processes, Ray actors) builds its adapter there, so
its ``opponents`` must pickle: one of the last two forms, a module-level function, or a policy
object that pickles.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Mapping
from typing import Any

from openenv_gym.actions import Turn, parse_action
from openenv_gym.adapters.base import Adapter, AdapterSpec, Episode, accepted_kwargs
from openenv_gym.adapters.games import Game, Moves
from openenv_gym.errors import ConfigurationError, ServerError
from openenv_gym.policies import OpenAIPolicy, Policy, RandomPolicy
from openenv_gym.wire import Opening, Outcome, Split, TaskRef, ToolSpec

__all__ = ["SeatAdapter", "MAX_SKIPPED_GAMES", "ENTRY"]

ENTRY = "openenv_gym.multiagent.seat:SeatAdapter"
"""The adapter entry of one seat (what ``gym.make``'s ``single_player=`` builds)."""

MAX_SKIPPED_GAMES = 8
"""Games in a row an episode's start may replay on its task because they ended before the seat
was asked (an opponent forfeited at once) before it gives up with a ServerError."""

Opponent = Callable[[str, list[Any], dict[str, Any]], Any]

_POLICY_IDS = itertools.count()
"""The ids a Policy knows the other seats by: one per (game, seat), across every adapter sharing it."""


class SeatAdapter(Adapter):
    """``seat`` of the game ``game`` builds, the other seats played by ``opponents``.

    Args:
        game: the game's adapter recipe (``{"entry": ..., "kwargs": ...}`` or an
            :class:`~openenv_gym.adapters.base.AdapterSpec`), or a started game adapter to share
            (then not closed here).
        seat: the seat played through the episodes (one of the game's seats).
        opponents: who plays the others (see the module docstring).
    """

    def __init__(self, game: Any, seat: str, opponents: Any = None):
        super().__init__()
        if opponents is None:
            raise ConfigurationError("single_player= needs opponents=: a function (seat, observation, info) -> "
                                     "action, a Policy, \"random\", or {\"base_url\": URL, \"model\": NAME}")
        self.seat = seat
        self.opponents = opponent_policy(opponents)
        self._owns_opponents = self.opponents is not opponents  # built here from "random" or a dict
        self._owns = not isinstance(game, Adapter)
        if isinstance(game, Adapter):
            self.game = game
        else:
            spec = game if isinstance(game, AdapterSpec) else AdapterSpec(game["entry"], dict(game.get("kwargs") or {}))
            if "multiagent" not in (accepted_kwargs(spec.target()) or frozenset()):
                raise ConfigurationError(f"single_player= plays one seat of a game, and this env is not a "
                                         f"multi-agent env (its backend, {spec.entry.rsplit(':', 1)[-1]}, plays one agent): drop it")
            self.game = AdapterSpec(spec.entry, {**spec.kwargs, "multiagent": True}).build()
        self.kind = self.game.kind

    async def start(self) -> None:
        if self._owns:
            await self.game.start()
        seats = list(self.game.players())  # type: ignore[attr-defined]
        if self.seat not in seats:
            if self._owns:
                await self.game.aclose()
            raise ConfigurationError(f"{self.seat!r} is not a seat of this game; its seats are {seats}")

    async def aclose(self) -> None:
        if self._owns:
            await self.game.aclose()
        if self._owns_opponents:
            await _close(self.opponents)

    def episode(self) -> Episode:
        return _SeatEpisode(self)

    async def tools(self) -> list[ToolSpec]:
        return []  # a seat's tools arrive with its first ask (Opening.tools)

    async def _fetch_splits(self) -> list[Split]:
        return list(await self.game.splits())

    async def _fetch_num_tasks(self, split: str) -> int:
        return await self.game.num_tasks(split)

    async def task(self, split: str, index: int) -> dict[str, Any]:
        return await self.game.task(split, index)

    def info(self) -> dict[str, Any]:
        return {**self.game.info(), "seat": self.seat}


class _SeatEpisode(Episode):
    """One game seen from the adapter's seat."""

    def __init__(self, adapter: SeatAdapter):
        self.adapter = adapter
        self.seat = adapter.seat
        self.game: Game | None = None
        self.keys: dict[str, int] = {}  # the other seats' ids for a Policy (fresh per game)

    async def start(self, task: TaskRef) -> Opening:
        for skipped in range(MAX_SKIPPED_GAMES + 1):
            await self.aclose()
            self.game = self.adapter.game.game()  # type: ignore[attr-defined]
            moves = await self._others(await self.game.start(task))
            asked = moves.asked.get(self.seat)
            if asked is not None:
                info = {**moves.info, **asked.info, "seat": self.seat}
                if skipped:
                    info["games_skipped"] = skipped
                return Opening(list(asked.messages), list(asked.tools or []), str(moves.info.get("task_id") or ""), info)
        raise ServerError(f"{MAX_SKIPPED_GAMES + 1} games in a row ended before {self.seat!r} was asked "
                          f"(MAX_SKIPPED_GAMES={MAX_SKIPPED_GAMES})")

    async def step(self, turn: Turn) -> Outcome:
        if self.game is None:
            raise ServerError("the game is not running")
        moves = await self._others(await self.game.act({self.seat: turn}))
        asked = moves.asked.get(self.seat)
        if asked is not None:
            return Outcome(list(asked.messages), info={**asked.info, "seat": self.seat}, tools=asked.tools)
        paid = (moves.paid or {}).get(self.seat)
        if paid is None:
            raise ServerError(f"the game ended without paying {self.seat!r}")
        info = {**moves.info, **paid.info, "seat": self.seat}
        return Outcome([], paid.reward, paid.terminated, paid.truncated, info)

    async def _others(self, moves: Moves) -> Moves:
        """Answer every other asked seat until this seat is asked or the game is over."""
        assert self.game is not None
        while not moves.over and self.seat not in moves.asked:
            turns = {seat: parse_action(await self._opponent(seat, list(asked.messages),
                                                             {**asked.info, **_tools(asked.tools)}))
                     for seat, asked in moves.asked.items()}
            if not turns:
                raise ServerError(f"the game waits on no seat and is not over ({self.seat!r} is never asked)")
            moves = await self.game.act(turns)
        return moves

    async def _opponent(self, seat: str, obs: list[Any], info: dict[str, Any]) -> Any:
        opponents = self.adapter.opponents
        if isinstance(opponents, Policy):
            key = self.keys.get(seat)
            if key is None:
                key = self.keys[seat] = next(_POLICY_IDS)
                opponents.reset(key, obs, info)
            act = getattr(opponents, "aact_batch", None)
            if act is not None:
                return (await act([key], [obs], [info]))[0]
            return opponents.act_batch([key], [obs], [info])[0]
        action = opponents(seat, obs, info)
        return await action if inspect.isawaitable(action) else action

    async def aclose(self) -> None:
        forget = getattr(self.adapter.opponents, "forget", None)
        if callable(forget):
            for key in self.keys.values():
                forget(key)
        self.keys = {}
        if self.game is not None:
            game, self.game = self.game, None
            await game.aclose()


async def _close(policy: Any) -> None:
    """Close a policy the adapter built, from the runtime loop."""
    aclose = getattr(policy, "aclose", None)
    if callable(aclose):
        await aclose()
    elif callable(getattr(policy, "close", None)):
        policy.close()


def _tools(tools: list[ToolSpec] | None) -> dict[str, Any]:
    return {} if tools is None else {"tools": [t.to_openai() for t in tools]}


def opponent_policy(value: Any) -> Opponent | Policy:
    """``opponents`` as a function or a Policy (see the module docstring for the forms)."""
    if isinstance(value, Policy) or (callable(value) and not isinstance(value, type)):
        return value
    if value == "random":
        return RandomPolicy(text_probability=1.0)
    if isinstance(value, Mapping) and "base_url" in value:
        return OpenAIPolicy(**dict(value))
    raise ConfigurationError(f"opponents must be a function (seat, observation, info) -> action, a Policy, "
                             f"\"random\" or {{\"base_url\": URL, \"model\": NAME}}, not {type(value).__name__}")
