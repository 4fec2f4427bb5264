"""Many games at once, first-ready over (game, seat) pairs: a self-play trainer's batch.

:class:`GameVectorEnv` runs ``num_games`` games of one multi-agent env concurrently, EnvPool-style:
:meth:`GameVectorEnv.recv` returns whichever seats are ready (their prompt, whichever game they
belong to), :meth:`GameVectorEnv.send` answers any of them; the trainer's one policy plays every
seat of every game. A finished game pays all its seats at once (one :class:`Ready` each,
``terminated`` or ``truncated``) and starts again on its next task.

The games live in :class:`~openenv_gym.shard.shard.Shard` s, as a vector env's sub-envs do, and
wherever those run: in this process (``backend="concurrent"``), in host processes
(``vector_options={"num_hosts": k}``) or in Ray actors (``backend="ray"``). A game is one session
of its shard; the seats it waits on are its pending op, answered by one ``STEP`` carrying their
turns (a seat answered while its game's previous op runs waits for it, merged into the next).
The shards' fault model holds: a game whose env fails, or whose process dies, ends every seat
that appeared ``truncated`` with ``info["error"]`` and starts again.

For training: ``group_size=k`` makes groups of ``k`` games whose ``e``-th games share a task
(per-seat GRPO groups: same task, same seat, ``k`` games; the seeds of
:class:`~openenv_gym.vector.groups.Groups`), and every finished seat leaves an
:class:`~openenv_gym.records.EpisodeRecord` of its own trajectory (its messages, the token ids its
policy reported, its rewards, the game's id and the other seats), with its advantage over its
group's same seat once the group's ``k`` games are done (:meth:`GameVectorEnv.pop_records`).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from openenv_gym import runtime
from openenv_gym.actions import Turn, parse_action
from openenv_gym.adapters.games import Moves, NotAsked
from openenv_gym.errors import ConfigurationError, EpisodeNotStarted
from openenv_gym.multiagent.seats import Observation, end_info
from openenv_gym.multiagent.session import game_spec
from openenv_gym.records import EpisodeRecord, as_assistant_message
from openenv_gym.rollout import TOKEN_FIELDS, advantages
from openenv_gym.session import START_TIMEOUT, STEP_TIMEOUT, checked_options
from openenv_gym.shard.handle import Handle, LocalHandle
from openenv_gym.shard.ops import Op, OpKind, Result
from openenv_gym.shard.shard import Shard, ShardConfig
from openenv_gym.vector.groups import Groups, check_group_size
from openenv_gym.vector.shards import Shards, default_layout, open_shards

__all__ = ["GameVectorEnv", "Ready", "BACKENDS"]

BACKENDS = ("concurrent", "ray")
_OPTIONS = {"concurrent": frozenset({"num_hosts"}),
            "ray": frozenset({"num_actors", "address", "runtime_env", "actor_options"})}


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
        self.tokens: list[dict[str, Any]] = []
        """Per assistant turn: the token ids its policy reported (empty where none)."""


class _Game:
    """One slot of the vector env, as the driver sees it: its op in flight, the seats it has
    handed out and those answered meanwhile, the running game's trajectories."""

    def __init__(self, index: int, group: int | None):
        self.index = index
        self.group = group
        self.req: int | None = None
        """The request id of the op in flight (``None``: none)."""
        self.kind = OpKind.RESET
        self.queued: dict[str, Turn] = {}
        """Seats answered while an op was in flight: the next ``STEP`` carries them."""
        self.emitted: set[str] = set()
        self.trajectories: dict[str, _Trajectory] = {}
        self.appeared: list[str] = []
        self.live = False
        self.recreate = False
        self.game_id = ""
        self.episode = -1
        self.slot = -1
        self.task: dict[str, Any] = {}


class GameVectorEnv:
    """``num_games`` games of ``env_id`` at once (kwargs as :func:`openenv_gym.multiagent.aec_env` takes them).

    Args:
        env_id: a multi-agent id.
        num_games: games run at once.
        group_size: games per group (``num_games`` must be a multiple); a group's ``e``-th games
            play the same task.
        autoreset: start a finished game's next game at once (default); ``False`` leaves the
            slot idle until :meth:`reset`.
        backend: ``"concurrent"`` (this process, or host processes with ``num_hosts``) or
            ``"ray"`` (Ray actors), as for ``gym.make_vec``.
        vector_options: the backend's options: ``num_hosts`` (host processes under this
            interpreter, game ``i`` in host ``i % num_hosts``); ``num_actors``, ``address``,
            ``runtime_env``, ``actor_options`` for Ray.
        step_timeout: the bound of one game op and of one ``recv`` wait (default: the env's).
    """

    metadata: dict[str, Any] = {"name": "openenv_gym_games"}

    def __init__(self, env_id: str, num_games: int, *, group_size: int | None = None, autoreset: bool = True,
                 backend: str = "concurrent", vector_options: Mapping[str, Any] | None = None, **kwargs: Any):
        if isinstance(num_games, bool) or not isinstance(num_games, int) or num_games < 1:
            raise ConfigurationError(f"num_games must be a positive integer, not {num_games!r}")
        try:
            check_group_size(num_games, group_size)
        except ConfigurationError:
            raise ConfigurationError(f"group_size must divide num_games={num_games}, not {group_size!r}") from None
        if backend not in BACKENDS:
            raise ConfigurationError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
        options = dict(vector_options or {})
        unknown = sorted(set(options) - _OPTIONS[backend])
        if unknown:
            raise ConfigurationError(f"unknown vector_options {unknown} for the {backend!r} backend; it takes "
                                     f"{sorted(_OPTIONS[backend])}")
        self.env_id = env_id
        self.num_games = num_games
        self.group_size = group_size
        self.autoreset = bool(autoreset)
        self.backend = backend
        spec, env_kwargs = game_spec(env_id, kwargs)
        self._step_timeout = float(env_kwargs.get("step_timeout") or STEP_TIMEOUT)
        start_timeout = float(env_kwargs.get("start_timeout") or START_TIMEOUT)
        self._groups = Groups(num_games, group_size) if group_size else None
        self._games = [_Game(i, None if group_size is None else i // group_size) for i in range(num_games)]
        self._req = itertools.count(1)
        self._lock = threading.Lock()  # the slots' state: the caller's send and the loop's answers
        self._out: list[Ready] = []
        self._failure: BaseException | None = None
        self._changed: asyncio.Event | None = None
        self._records: list[EpisodeRecord] = []
        self._group_done: dict[tuple[int, int], list[list[EpisodeRecord]]] = {}  # (group, slot) -> games
        self._options: dict[str, Any] = {}
        self._seeds: list[int | None] = [None] * num_games
        self._closed = False
        self._started = False

        def config(ids: list[int], replaced: bool) -> ShardConfig:
            # One adapter per shard: its games share the env's servers, as a sub-env's shard does.
            return ShardConfig(entry=spec.entry, adapter_kwargs=dict(spec.kwargs), env_ids=ids, num_envs=num_games,
                               split=env_kwargs.get("split"), envs_per_client=len(ids),
                               step_timeout=self._step_timeout, replaced=replaced, games=True)

        layout, new_handle, release = _handles(backend, options, num_games, config, start_timeout)
        self._shards = Shards(layout, new_handle, step_timeout=self._step_timeout, start_timeout=start_timeout,
                              release=release)
        self._shards.deliver = self._deliver
        open_shards(self._shards)
        runtime.track(self)  # closed at interpreter exit if the caller forgets
        try:
            self.possible_agents: list[str] = list(runtime.run_sync(
                self._shards.call_one(0, "players", (), {}), self._step_timeout, what="reading the seats"))
        except BaseException:
            self.close()
            raise

    # -- the sync edges --------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None) -> list[Ready]:
        """Start a game in every slot (game ``i`` seeded ``seed + i``, or its group's task); the
        seats the games first ask. A game whose start fails raises its error here."""
        self._check_open()
        self._options = checked_options(options)
        if seed is not None and self._groups is not None:
            self._groups.reseed(int(seed))
        self._seeds = [None if seed is None else int(seed) + i for i in range(self.num_games)]
        self._started = True
        return runtime.run_sync(self._reset_all(), self._step_timeout, what="reset", limit="step_timeout")

    def send(self, actions: Mapping[tuple[int, str], Any],
             tokens: Mapping[tuple[int, str], Mapping[str, Any] | None] | None = None) -> None:
        """Answer ready seats: ``{(game, seat): action}``; returns at once (the games move
        without the caller). A pair that is not ready raises
        :class:`~openenv_gym.adapters.games.NotAsked`.

        An action is what ``env.step`` takes (text, or an assistant message). ``tokens``: per
        answered pair, the turn's ``prompt_token_ids``, ``completion_token_ids`` and
        ``logprobs`` (what ``OpenAIPolicy(token_ids=True).tokens(...)`` reports), kept in the
        seat's record one entry per assistant turn, as ``rollout`` keeps a single agent's."""
        self._check_open()
        if not self._started:
            raise EpisodeNotStarted("call reset() first")
        by_game: dict[int, dict[str, Any]] = {}
        for key, action in actions.items():
            game, seat = key
            if not isinstance(game, int) or not 0 <= game < self.num_games or seat not in self._games[game].emitted:
                raise NotAsked(f"({game!r}, {seat!r}) is not a ready seat (answer only what recv returned)")
            by_game.setdefault(game, {})[seat] = action
        turns = {game: {seat: parse_action(action) for seat, action in acts.items()} for game, acts in by_game.items()}
        ops: list[Op] = []
        with self._lock:
            for game, acts in by_game.items():
                slot = self._games[game]
                slot.emitted -= set(acts)
                for seat, action in acts.items():
                    traj = slot.trajectories.setdefault(seat, _Trajectory())
                    traj.messages.append(_assistant(action))
                    traj.rewards.append(0.0)
                    traj.tokens.append(dict((tokens or {}).get((game, seat)) or {}))
                slot.queued.update(turns[game])
                if slot.req is None:
                    ops.append(self._step_op(slot))
        if ops:
            runtime.post(self._send_ops, ops)

    def recv(self, timeout: float | None = None) -> list[Ready]:
        """Whatever seats are ready now, waiting for at least one (up to ``timeout``, default
        ``step_timeout``). A caller's mistake that reached a game (a seat run more often than
        declared) raises here, typed."""
        self._check_open()
        return runtime.run_sync(self._recv(), timeout or self._step_timeout, what="recv", limit="step_timeout")

    def step(self, actions: Mapping[tuple[int, str], Any],
             tokens: Mapping[tuple[int, str], Mapping[str, Any] | None] | None = None) -> list[Ready]:
        """:meth:`send` then :meth:`recv`."""
        self.send(actions, tokens)
        return self.recv()

    def pop_records(self) -> list[EpisodeRecord]:
        """The seat trajectories of the games finished since the last call (grouped ones once their
        whole group is done, with their advantage over the group's same seat)."""
        with self._lock:
            records, self._records = self._records, []
        return records

    @property
    def pids(self) -> list[int]:
        """The process each shard of games runs in (this one's, a host's, a Ray actor's), one per shard."""
        self._check_open()

        async def ask() -> list[int]:
            return list(await asyncio.gather(*(h.pid() for h in self._shards.handles)))

        return runtime.run_sync(ask(), self._step_timeout, what="asking the shards")

    @property
    def replaced_shards(self) -> int:
        """How many dead or hung shards (host processes, actors) were replaced."""
        return self._shards.replaced

    def close(self) -> None:
        """End every game and close the env (no process or actor is left); idempotent."""
        if self._closed:
            return
        self._closed = True
        runtime.untrack(self)
        try:
            runtime.run_sync(self._shards.aclose(), self._step_timeout, what="closing the env", limit="step_timeout")
        finally:
            self._shards.release()

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigurationError("the env is closed")

    # -- ops -------------------------------------------------------------------------------------------
    def _op(self, slot: _Game, kind: OpKind, **fields: Any) -> Op:
        slot.req, slot.kind = next(self._req), kind
        return Op(slot.index, slot.req, kind, **fields)

    def _step_op(self, slot: _Game) -> Op:
        turns, slot.queued = slot.queued, {}
        return self._op(slot, OpKind.STEP, turns=turns)

    def _reset_op(self, slot: _Game) -> Op:
        options = dict(self._options)
        seed = self._seeds[slot.index]
        self._seeds[slot.index] = None  # later games walk on from the seeded one
        if self._groups is not None and "index" not in options and "task" not in options:
            slot.slot, seed = self._groups.next_seed(slot.index)
            self._groups.begun(slot.index, slot.slot)
        else:
            slot.slot = slot.episode + 1
        slot.queued.clear()
        recreate, slot.recreate = slot.recreate, False
        return self._op(slot, OpKind.RESET, seed=seed, options=options or None, recreate=recreate)

    def _send_ops(self, ops: list[Op]) -> None:
        """Start ``ops`` (on the loop, so that the caller's sends and the games' own follow-ups
        reach the shards in one order)."""
        if self._closed:
            return
        self._shards.send(ops)
        self._shards.settle(False, None)

    # -- answers (the loop) ----------------------------------------------------------------------------
    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _deliver(self, result: Result) -> None:
        slot = self._games[result.env_id]
        follow: Op | None = None
        with self._lock:
            if result.req_id != slot.req:
                return  # the answer to an op a reset cancelled
            slot.req = None
            if result.error is not None:
                follow = self._failed(slot, result.error)
            elif result.moves is not None:
                if slot.kind is OpKind.RESET:
                    self._begin(slot, result.moves)
                follow = self._emit(slot, result.moves)
        if follow is not None:
            self._send_ops([follow])
        self._event().set()

    def _begin(self, slot: _Game, moves: Moves) -> None:
        slot.episode += 1
        slot.live = True
        slot.emitted.clear()
        slot.trajectories = {}
        slot.appeared = []
        slot.game_id = uuid.uuid4().hex
        slot.task = {k: moves.info.get(k) for k in ("task_id", "split", "index")}

    def _emit(self, slot: _Game, moves: Moves) -> Op | None:
        """Hand out the seats ``moves`` newly asks, and pays; the slot's next op, if any."""
        slot.appeared = list(moves.appeared)
        for seat, asked in moves.asked.items():
            if seat in slot.emitted or seat in slot.queued:
                continue
            slot.emitted.add(seat)
            slot.trajectories.setdefault(seat, _Trajectory()).messages += asked.messages
            info = {**asked.info, "asked": True, "game_id": slot.game_id, "task_id": slot.task.get("task_id")}
            if asked.tools is not None:
                info["tools"] = [t.to_openai() for t in asked.tools]
            self._out.append(Ready(slot.index, seat, Observation(asked.messages), 0.0, False, False, info))
        if moves.paid is None:
            return self._step_op(slot) if slot.queued else None
        self._pay(slot, [(seat, paid.reward, paid.terminated, paid.truncated,
                          {**end_info(paid, moves), "game_id": slot.game_id}) for seat, paid in moves.paid.items()])
        return self._over(slot)

    def _failed(self, slot: _Game, error: dict[str, Any]) -> Op | None:
        if error.get("user") or not slot.live:
            # A caller's mistake, or a game that could not start: recv raises it, and the slot
            # waits for reset() (a start that failed once would fail again, in a loop).
            self._failure = self._failure or _raised(error, f"game {slot.index} of {self.env_id}")
            slot.live = False
            slot.recreate = not error.get("user")
            return None
        info = {"error": error, "game_id": slot.game_id, "task_id": slot.task.get("task_id")}
        self._pay(slot, [(seat, 0.0, False, True, dict(info)) for seat in slot.appeared or sorted(slot.trajectories)])
        slot.recreate = True  # its session failed: the next game gets a fresh one
        return self._over(slot)

    def _over(self, slot: _Game) -> Op | None:
        slot.live = False
        slot.emitted.clear()
        slot.queued.clear()
        return self._reset_op(slot) if self.autoreset and not self._closed else None

    def _pay(self, slot: _Game, paid: list[tuple[str, float, bool, bool, dict[str, Any]]]) -> None:
        """Hand out every seat's end (``(seat, reward, terminated, truncated, info)``, the whole
        game at once) and keep each seat's record."""
        seats = [p[0] for p in paid]
        grouped = slot.group is not None and self.group_size is not None
        records = []
        for seat, reward, terminated, truncated, info in paid:
            self._out.append(Ready(slot.index, seat, Observation(), reward, terminated, truncated, info))
            traj = slot.trajectories.get(seat, _Trajectory())
            rewards = list(traj.rewards) or [0.0]
            rewards[-1] += reward  # paid at the game's end: after the seat's last action
            tokens: dict[str, Any] = {f: [t.get(f) for t in traj.tokens] for f in TOKEN_FIELDS
                                      if any(t.get(f) is not None for t in traj.tokens)}
            records.append(EpisodeRecord(
                env=self.env_id, env_id=slot.index, task_id=slot.task.get("task_id"), split=slot.task.get("split"),
                index=slot.task.get("index"), messages=list(traj.messages), rewards=rewards,
                total_reward=float(sum(rewards)), terminated=terminated, truncated=truncated,
                errors=[info["error"]] if "error" in info else [], group=slot.group,
                group_episode=slot.slot if grouped else None,
                seat=seat, game_id=slot.game_id, other_seats=[s for s in seats if s != seat], **tokens))
        if not grouped:
            self._records += records
            return
        key = (int(slot.group or 0), slot.slot)
        done = self._group_done.setdefault(key, [])
        done.append(records)
        if len(done) == self.group_size:  # the group's e-th games are all over: advantages per seat
            del self._group_done[key]
            every = [r for game in done for r in game]
            for s in dict.fromkeys(r.seat for r in every):
                same = [r for r in every if r.seat == s]
                for r, a in zip(same, advantages([r.total_reward for r in same])):
                    r.advantage = float(a)
            self._records += every

    # -- waiting (the loop) ----------------------------------------------------------------------------
    async def _reset_all(self) -> list[Ready]:
        busy = [slot.index for slot in self._games if slot.req is not None]
        if busy:
            await self._shards.cancel(busy)
        with self._lock:
            self._out, self._failure = [], None
            self._group_done.clear()  # groups cut short by the reset: their games are abandoned
            ops = [self._reset_op(slot) for slot in self._games]
        self._send_ops(ops)
        event = self._event()
        while any(slot.req is not None for slot in self._games):
            event.clear()
            await event.wait()
        with self._lock:
            out, self._out = self._out, []
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        return out

    async def _recv(self) -> list[Ready]:
        event = self._event()
        while True:
            with self._lock:
                if self._out:
                    out, self._out = self._out, []
                    return out
                if self._failure is not None:
                    failure, self._failure = self._failure, None
                    raise failure
                moving = any(slot.req is not None for slot in self._games)
                waiting = sum(len(slot.emitted) for slot in self._games)
            if not moving:  # waiting would only run out the timeout
                raise NotAsked(f"no game is moving: {waiting} ready seat(s) wait for send()" if waiting else
                               "no game is moving: every game is over (autoreset=False); call reset()")
            event.clear()
            await event.wait()


def _handles(backend: str, options: dict[str, Any], num_games: int,
             config: Callable[[list[int], bool], ShardConfig], start_timeout: float
             ) -> tuple[list[list[int]], Callable[[int, bool], Handle], Callable[[], None] | None]:
    """The layout of the games over shards, how to reach shard ``k``, and what to release last."""
    if backend == "concurrent" and not options.get("num_hosts"):
        layout = [list(range(num_games))]
        return layout, lambda k, replaced: LocalHandle(Shard(config(layout[k], replaced))), None
    if backend == "concurrent":
        from openenv_gym.hosts.process import ProcessHandle

        num_hosts = options["num_hosts"]
        if isinstance(num_hosts, bool) or not isinstance(num_hosts, int) or num_hosts < 1:
            raise ConfigurationError(f"num_hosts must be a positive integer, not {num_hosts!r}")
        layout = default_layout(num_games, num_hosts)
        return layout, lambda k, replaced: ProcessHandle(sys.executable, config(layout[k], replaced),
                                                         init_timeout=start_timeout), None
    import ray

    from openenv_gym.vector.ray import RAY, RayHandle, RemoteShard

    owns_ray = RAY.acquire(options.get("address"))
    try:
        num_actors = options.get("num_actors") or max(1, int(ray.cluster_resources().get("CPU", 1)))
        actor_options = {"num_cpus": 0, **(options.get("actor_options") or {})}
        if options.get("runtime_env") is not None:
            actor_options["runtime_env"] = options["runtime_env"]
    except BaseException:
        if owns_ray:
            RAY.release()
        raise
    layout = default_layout(num_games, num_actors)
    return (layout, lambda k, replaced: RayHandle(RemoteShard.options(**actor_options).remote(config(layout[k], replaced))),
            RAY.release if owns_ray else None)


def _raised(error: dict[str, Any], where: str) -> BaseException:
    """The exception a game's failure is raised as in the caller: its own type where the package
    defines it (``TooManyRuns``, ``NotAsked``, ``TaskNotFound``...), else a ConfigurationError or
    a BackendError naming the type."""
    from openenv_gym import errors
    from openenv_gym.adapters import games

    name, message = str(error.get("type", "Error")), f"{error.get('message', '')} ({where})"
    cls = getattr(errors, name, None) or getattr(games, name, None) or _v1_error(name)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 - a type that wants other arguments: fall back below
            pass
    if error.get("user"):
        return ConfigurationError(f"{name}: {message}")
    return errors.BackendError(f"{name}: {message}")


def _v1_error(name: str) -> Any:
    if name != "TooManyRuns":
        return None
    from openenv_gym.adapters.verifiers.v1_env import TooManyRuns

    return TooManyRuns


def _assistant(action: Any) -> dict[str, Any]:
    try:
        return as_assistant_message(action)
    except Exception:  # noqa: BLE001 - the record keeps what it can read of it
        return {"role": "assistant", "content": str(action)[:1000]}

