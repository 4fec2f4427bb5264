"""Many games at once, first-ready over (game, seat) pairs: a self-play trainer's batch.

:class:`GameVectorEnv` runs ``num_games`` games of one multi-agent env concurrently on the runtime
loop, EnvPool-style: :meth:`GameVectorEnv.recv` returns whichever seats are ready (their prompt,
whichever game they belong to), :meth:`GameVectorEnv.send` answers any of them; the trainer's one
policy plays every seat of every game. A finished game pays all its seats at once (one
:class:`Ready` each, ``terminated`` or ``truncated``) and starts again on its next task.

For training: ``group_size=k`` makes groups of ``k`` games whose ``e``-th games share a task
(per-seat GRPO groups: same task, same seat, ``k`` games), and every finished seat leaves an
:class:`~openenv_gym.records.EpisodeRecord` of its own trajectory (its messages, its rewards, the
game's id and the other seats), with its advantage over its group's same seat once the group's
``k`` games are done (:meth:`GameVectorEnv.pop_records`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from openenv_gym import runtime
from openenv_gym.adapters.games import Moves, NotAsked
from openenv_gym.errors import ConfigurationError, EpisodeNotStarted
from openenv_gym.multiagent.seats import Observation, end_info
from openenv_gym.multiagent.session import GameSession, open_session
from openenv_gym.records import EpisodeRecord, as_assistant_message
from openenv_gym.rollout import advantages
from openenv_gym.session import TaskCursor, checked_options, pick_task
from openenv_gym.wire import TaskRef

__all__ = ["GameVectorEnv", "Ready"]


class Ready(NamedTuple):
    """One seat of one game, ready: asked (``observation`` is its new messages) or paid
    (``terminated`` or ``truncated``, ``reward`` its reward for the game)."""

    game: int
    seat: str
    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class _Trajectory:
    """One seat's side of one game, for its record."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.rewards: list[float] = []
        self.errors: list[dict[str, Any]] = []


class _Game:
    """One slot of the vector env: its session, the seats it has emitted, the game's trajectories."""

    def __init__(self, session: GameSession, index: int, group: int | None):
        self.session = session
        self.index = index
        self.group = group
        self.lock = asyncio.Lock()
        self.emitted: set[str] = set()
        self.trajectories: dict[str, _Trajectory] = {}
        self.game_id = ""
        self.episode = -1
        self.task: TaskRef | None = None
        self.task_id: str | None = None


class GameVectorEnv:
    """``num_games`` games of ``env_id`` at once (kwargs as :func:`openenv_gym.multiagent.aec_env` takes them).

    Args:
        env_id: a multi-agent id.
        num_games: games run at once.
        group_size: games per group (``num_games`` must be a multiple); a group's ``e``-th games
            play the same task.
        autoreset: start a finished game's next game at once (default); ``False`` leaves the
            slot idle until :meth:`reset`.
        step_timeout: the bound of one ``recv`` wait (default: the env's ``step_timeout``).
    """

    def __init__(self, env_id: str, num_games: int, *, group_size: int | None = None, autoreset: bool = True,
                 **kwargs: Any):
        if isinstance(num_games, bool) or not isinstance(num_games, int) or num_games < 1:
            raise ConfigurationError(f"num_games must be a positive integer, not {num_games!r}")
        if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                       or group_size < 1 or num_games % group_size):
            raise ConfigurationError(f"group_size must divide num_games={num_games}, not {group_size!r}")
        self.env_id = env_id
        self.num_games = num_games
        self.group_size = group_size
        self.autoreset = bool(autoreset)
        first = open_session(env_id, kwargs)  # builds and starts the adapter every game shares
        self._adapter = first.adapter
        self._step_timeout = first.step_timeout
        self.possible_agents = first.players
        sessions = [first] + [GameSession(first.adapter, split=first.split, step_timeout=first.step_timeout,
                                          owns_adapter=False) for _ in range(num_games - 1)]
        first.owns_adapter = False
        self._games = [_Game(s, i, None if group_size is None else i // group_size) for i, s in enumerate(sessions)]
        self._out: list[Ready] = []
        self._failure: BaseException | None = None
        self._changed: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._group_tasks: dict[tuple[int, int], TaskRef] = {}
        self._group_done: dict[tuple[int, int], list[EpisodeRecord]] = {}
        self._records: list[EpisodeRecord] = []
        self._rng = np.random.default_rng()
        self._cursor = TaskCursor()
        self._options: dict[str, Any] = {}
        self._split = first.split
        self._closed = False
        self._started = False
        runtime.track(self)

    # -- the sync edges --------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None) -> list[Ready]:
        """Start a game in every slot; the seats the games first ask (all of them)."""
        self._check_open()
        self._options = checked_options(options)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            self._cursor.seed(seed)
        self._group_tasks.clear()
        self._started = True
        return runtime.run_sync(self._reset_all(), self._step_timeout, what="reset", limit="step_timeout")

    def send(self, actions: Mapping[tuple[int, str], Any]) -> None:
        """Answer ready seats: ``{(game, seat): action}``; returns at once (the games move on the
        runtime loop). A pair that is not ready raises :class:`~openenv_gym.adapters.games.NotAsked`."""
        self._check_open()
        if not self._started:
            raise EpisodeNotStarted("call reset() first")
        by_game: dict[int, dict[str, Any]] = {}
        for key, action in actions.items():
            game, seat = key
            if not isinstance(game, int) or not 0 <= game < self.num_games or seat not in self._games[game].emitted:
                raise NotAsked(f"({game!r}, {seat!r}) is not a ready seat (answer only what recv returned)")
            by_game.setdefault(game, {})[seat] = action
        for game, turns in by_game.items():
            slot = self._games[game]
            slot.emitted -= set(turns)
            for seat, action in turns.items():
                slot.trajectories.setdefault(seat, _Trajectory()).messages.append(_assistant(action))
                slot.trajectories[seat].rewards.append(0.0)
            runtime.post(self._spawn, game, turns)

    def recv(self, timeout: float | None = None) -> list[Ready]:
        """Whatever seats are ready now, waiting for at least one (up to ``timeout``, default
        ``step_timeout``); a game that failed raises its error here."""
        self._check_open()
        return runtime.run_sync(self._recv(), timeout or self._step_timeout, what="recv", limit="step_timeout")

    def step(self, actions: Mapping[tuple[int, str], Any]) -> list[Ready]:
        """:meth:`send` then :meth:`recv`."""
        self.send(actions)
        return self.recv()

    def pop_records(self) -> list[EpisodeRecord]:
        """The seat trajectories of the games finished since the last call (grouped ones once their
        whole group is done, with their advantage over the group's same seat)."""
        records, self._records = self._records, []
        return records

    def close(self) -> None:
        """End every game and close the env; idempotent."""
        if self._closed:
            return
        self._closed = True
        runtime.untrack(self)
        runtime.run_sync(self._aclose(), self._step_timeout, what="closing the env", limit="step_timeout")

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("the env is closed")

    # -- the async core ---------------------------------------------------------------------------------
    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _spawn(self, game: int, turns: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._act(game, turns))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reset_all(self) -> list[Ready]:
        self._out = []
        await asyncio.gather(*(self._new_game(slot) for slot in self._games))
        out, self._out = self._out, []
        return out

    async def _new_game(self, slot: _Game) -> None:
        slot.episode += 1
        slot.emitted.clear()
        slot.trajectories = {}
        slot.game_id = uuid.uuid4().hex
        options = dict(self._options)
        if slot.group is not None and "task" not in options:
            key = (slot.group, slot.episode)
            if key not in self._group_tasks:
                self._group_tasks[key] = await pick_task(self._adapter, options.get("split") or self._split, options,
                                                         self._rng, self._cursor)
            ref = self._group_tasks[key]
            options.update(split=ref.split, index=ref.index)
        elif "index" not in options and "task" not in options:
            ref = await pick_task(self._adapter, options.get("split") or self._split, options, self._rng, self._cursor)
            options.update(split=ref.split, index=ref.index)
        moves = await slot.session.reset(options=options)
        slot.task_id = moves.info.get("task_id")
        slot.task = TaskRef(split=moves.info.get("split"), index=moves.info.get("index"))
        self._emit(slot, moves)

    async def _act(self, game: int, turns: dict[str, Any]) -> None:
        slot = self._games[game]
        try:
            async with slot.lock:
                moves = await slot.session.act(turns)
                self._emit(slot, moves)
                if moves.over and self.autoreset:
                    await self._new_game(slot)
        except Exception as exc:  # noqa: BLE001 - handed to the caller's recv, typed as raised
            exc.add_note(f"(game {game} of {self.env_id})")
            self._failure = self._failure or exc
            self._event().set()

    def _emit(self, slot: _Game, moves: Moves) -> None:
        for seat, asked in moves.asked.items():
            if seat in slot.emitted:
                continue
            slot.emitted.add(seat)
            traj = slot.trajectories.setdefault(seat, _Trajectory())
            traj.messages += asked.messages
            info = {**asked.info, "asked": True, "game_id": slot.game_id, "task_id": slot.task_id}
            if asked.tools is not None:
                info["tools"] = [t.to_openai() for t in asked.tools]
            self._out.append(Ready(slot.index, seat, Observation(asked.messages), 0.0, False, False, info))
        if moves.paid is not None:
            for seat, paid in moves.paid.items():
                info = {**end_info(paid, moves), "game_id": slot.game_id}
                self._out.append(Ready(slot.index, seat, Observation(), paid.reward, paid.terminated, paid.truncated,
                                       info))
                self._record(slot, seat, paid.reward, paid.terminated, paid.truncated, info, list(moves.paid))
        self._event().set()

    def _record(self, slot: _Game, seat: str, reward: float, terminated: bool, truncated: bool,
                info: dict[str, Any], seats: list[str]) -> None:
        traj = slot.trajectories.get(seat, _Trajectory())
        rewards = list(traj.rewards) or [0.0]
        rewards[-1] += reward  # paid at the game's end: after the seat's last action
        task = slot.task
        record = EpisodeRecord(
            env=self.env_id, env_id=slot.index, task_id=slot.task_id, split=task.split if task else None,
            index=task.index if task else None, messages=list(traj.messages), rewards=rewards,
            total_reward=float(sum(rewards)), terminated=terminated, truncated=truncated,
            errors=[info["error"]] if "error" in info else [], group=slot.group,
            group_episode=slot.episode if slot.group is not None else None,
            seat=seat, game_id=slot.game_id, other_seats=[s for s in seats if s != seat])
        if slot.group is None or self.group_size is None:
            self._records.append(record)
            return
        key = (slot.group, slot.episode)
        done = self._group_done.setdefault(key, [])
        done.append(record)
        seats_per_game = len(seats)
        if len(done) == self.group_size * seats_per_game:
            del self._group_done[key]
            for s in {r.seat for r in done}:
                same = [r for r in done if r.seat == s]
                for r, a in zip(same, advantages([r.total_reward for r in same])):
                    r.advantage = float(a)
            self._records += done

    async def _recv(self) -> list[Ready]:
        event = self._event()
        while not self._out:
            if self._failure is not None:
                failure, self._failure = self._failure, None
                raise failure
            if not self._tasks:  # nothing moves: waiting would only run out the timeout
                waiting = sum(len(slot.emitted) for slot in self._games)
                raise NotAsked(f"no game is moving: {waiting} ready seat(s) wait for send()" if waiting else
                               "no game is moving: every game is over (autoreset=False); call reset()")
            event.clear()
            await event.wait()
        out, self._out = self._out, []
        return out

    async def _aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=60)
        await asyncio.gather(*(slot.session.end_game() for slot in self._games), return_exceptions=True)
        await self._adapter.aclose()


def _assistant(action: Any) -> dict[str, Any]:
    try:
        return as_assistant_message(action)
    except Exception:  # noqa: BLE001 - the record keeps what it can read of it
        return {"role": "assistant", "content": str(action)[:1000]}
