"""Shard: a set of sub-env sessions answering ops with results, the one place sessions live.

The same class runs wherever sub-envs run: in this process for a
:class:`~openenv_gym.vector.concurrent.ConcurrentVectorEnv` (through a
:class:`~openenv_gym.shard.handle.LocalHandle`, ops passed as objects), in an adapter host process
under another interpreter (:mod:`openenv_gym.hosts.server`), and in a Ray actor
(``ray.remote(Shard)``, :mod:`openenv_gym.vector.ray`), the way PufferLib's Ray backend is
``ray.remote`` of the class it runs in-process. It owns:

* the sessions of its sub-env ids, over ``ceil(len(env_ids) / envs_per_client)`` adapters built
  from one recipe (one local server, a few connection pools);
* running ops concurrently, each bounded by ``step_timeout`` (one timer for all,
  :class:`~openenv_gym.runtime.Deadlines`), at most ``max_in_flight`` at once;
* recreating a session whose previous request failed (the old one closed within
  ``step_timeout``; the sub-env keeps its seeded task stream), and the wrapper stacks of its
  sub-envs (a replaced stack is closed);
* cancelling an op by ``(env_id, req_id)``, so a cancel overtaken by the sub-env's next op never
  cancels that one;
* closing everything, bounded.

A shard may hold *games* instead (``ShardConfig.games``: a multi-agent env's
:class:`~openenv_gym.session.GameSession`, one per game id): a game is one session, answered
by the same ops (``RESET``, ``STEP`` with the turns of the seats it waits on, ``END``), whose
results carry the game's :class:`~openenv_gym.adapters.games.Moves`. So games run wherever
sub-envs run, in this process, in host processes and in Ray actors
(:class:`~openenv_gym.multiagent.vector.GameVectorEnv`).

Every method is a coroutine on the loop of the process it runs in; nothing here knows about
batching, autoreset or which process it is in.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from typing import Any

import msgspec

from openenv_gym.adapters.base import Adapter, AdapterSpec
from openenv_gym.errors import ConfigurationError
from openenv_gym.processes import ensure_open_files
from openenv_gym.runtime import Deadlines
from openenv_gym.session import EnvSession, GameSession, TaskCursor
from openenv_gym.shard.ops import (
    Op,
    OpKind,
    Result,
    call_each,
    decode_ops,
    encode_results,
    error_dict,
    failed,
    run_game_op,
    run_op,
)
from openenv_gym.shard.wrapped import SubEnvWrappers
from openenv_gym.wire import ToolSpec

__all__ = ["Shard", "ShardConfig", "encode_tools", "decode_tools", "FILES_BASE", "open_files_needed"]

FILES_BASE = 128
"""Open files a shard counts for everything else (servers' logs, pipes, the interpreter's own)."""

def open_files_needed(adapters: list[Adapter], sessions: int) -> int:
    """Open files ``sessions`` sessions spread evenly over ``adapters`` hold in this process, with
    :data:`FILES_BASE`: each adapter's own figure per session (an in-process session opens none;
    one over HTTP holds one connection)."""
    per, extra = divmod(sessions, len(adapters))
    return FILES_BASE + math.ceil(sum(a.open_files_per_session * (per + (k < extra)) for k, a in enumerate(adapters)))


_tools_encoder = msgspec.msgpack.Encoder()
_tools_decoder = msgspec.msgpack.Decoder(list[ToolSpec])


def encode_tools(tools: list[ToolSpec]) -> bytes:
    return _tools_encoder.encode(tools)


def decode_tools(data: bytes) -> list[ToolSpec]:
    return _tools_decoder.decode(data)


class ShardConfig(msgspec.Struct, kw_only=True):
    """Everything a :class:`Shard` is built from; pickled to a host process or a Ray actor.

    ``replaced``: this shard replaces one that died, so a sub-env whose next op is a step (its
    episode died with the old shard) is answered with a truncated error instead of being stepped.
    ``env_wrappers``: callables ``env -> env`` (classes, or ``functools.partial`` of them: they
    travel by reference).
    """

    entry: str
    adapter_kwargs: dict[str, Any]
    env_ids: list[int]
    num_envs: int = 0
    """The vector env's sub-env count (``0``: one env): the stride of its sub-envs in an endless split."""
    split: str | None = None
    max_turns: int | None = None
    envs_per_client: int = 8
    step_timeout: float | None = None
    max_in_flight: int | None = None
    replaced: bool = False
    env_wrappers: list[Any] = []
    games: bool = False
    """The sessions are games of a multi-agent env (the adapter recipe plays games)."""

    @property
    def adapter(self) -> AdapterSpec:
        return AdapterSpec(self.entry, self.adapter_kwargs)


class Shard:
    """The sessions of ``config.env_ids`` and the ops in flight to them (see the module docstring)."""

    def __init__(self, config: ShardConfig):
        self.config = config
        self._spec = config.adapter
        self._wrapped = SubEnvWrappers(config.env_wrappers, len(config.env_ids)) if config.env_wrappers else None
        self._ids = list(config.env_ids)
        self._local = {i: k for k, i in enumerate(self._ids)}
        self._num_adapters = max(1, math.ceil(len(self._ids) / max(1, config.envs_per_client)))
        self._step_timeout = config.step_timeout
        self._deadlines = Deadlines()  # every op's step_timeout, one timer
        self._sem: asyncio.Semaphore | None = None
        self._adapters: list[Adapter] = []
        self._sessions: dict[int, Any] = {}  # EnvSession, or GameSession for games
        self._tools: list[ToolSpec] = []
        self._starting: asyncio.Task[None] | None = None
        self._started = False
        self._tasks: dict[int, tuple[int, asyncio.Task[Result]]] = {}  # env id -> (req id, task)
        # Sub-envs whose episode died with the shard this one replaces.
        self._lost: set[int] = set(self._ids) if config.replaced else set()

    @property
    def env_ids(self) -> list[int]:
        return list(self._ids)

    @property
    def adapters(self) -> list[Adapter]:
        """The adapters the sessions share (for diagnostics: a local source's server pids)."""
        return list(self._adapters)

    @property
    def in_flight(self) -> int:
        """Ops running now."""
        return len(self._tasks)

    def session(self, env_id: int) -> Any:
        """The session of ``env_id`` (started shards only): for an in-process driver's reads."""
        return self._sessions[env_id]

    # -- start -----------------------------------------------------------------------------------
    async def _ensure_started(self) -> None:
        if self._started:
            return
        task = self._starting
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._starting = asyncio.get_running_loop().create_task(self._start())
        await asyncio.shield(task)

    async def _start(self) -> None:
        adapters = [self._spec.build() for _ in range(self._num_adapters)]  # nothing opened yet
        try:
            ensure_open_files(open_files_needed(adapters, len(self._ids)), f"{len(self._ids)} sub-envs", FILES_BASE)
        except OSError as exc:
            raise ConfigurationError(str(exc.strerror)) from None
        # Start one first: a local source launches its server once, and the rest share it.
        try:
            await adapters[0].start()
            await asyncio.gather(*(a.start() for a in adapters[1:]))
            tools = [] if self.config.games else await adapters[0].tools()  # a game's seats get theirs as asked
        except BaseException:
            await asyncio.gather(*(a.aclose() for a in adapters), return_exceptions=True)
            raise
        self._adapters, self._tools = adapters, list(tools)
        self._sessions = {i: self._new_session(k) for k, i in enumerate(self._ids)}
        if self.config.max_in_flight:
            self._sem = asyncio.Semaphore(self.config.max_in_flight)
        self._started = True

    def _new_session(self, local_index: int) -> Any:
        adapter = self._adapters[local_index % len(self._adapters)]
        session: Any
        if self.config.games:
            session = GameSession(adapter, split=self.config.split, owns_adapter=False,
                                  step_timeout=self._step_timeout or float("inf"))
        else:
            session = EnvSession(adapter, split=self.config.split, max_turns=self.config.max_turns)
        # Sub-env i of n walks an endless split from task i in steps of n: together they play every task once.
        session.cursor = TaskCursor(self.config.env_ids[local_index], self.config.num_envs or 1)
        return session

    async def start(self) -> list[ToolSpec]:
        """Build and start the adapters and sessions; the tools every task offers."""
        await self._ensure_started()
        return list(self._tools)

    async def start_encoded(self) -> bytes:
        """:meth:`start`, the tools as msgpack bytes (for a driver in another process)."""
        return encode_tools(await self.start())

    async def pid(self) -> int:
        """The id of the process the shard runs in (for diagnostics, and a driver's liveness check)."""
        return os.getpid()

    # -- ops -------------------------------------------------------------------------------------
    async def submit(self, ops: list[Op], emit: Callable[[Result], None]) -> None:
        """Run ``ops`` concurrently, handing each result to ``emit`` as soon as it is ready (the
        first-ready order); returns when every op is done or cancelled (a cancelled op gets no
        result)."""
        await self._ensure_started()
        loop = asyncio.get_running_loop()
        tasks = []
        for op in ops:
            task = loop.create_task(self._run_one(op))
            task.add_done_callback(lambda t: None if t.cancelled() else emit(t.result()))
            self._tasks[op.env_id] = (op.req_id, task)
            tasks.append(task)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise
        finally:
            for op, task in zip(ops, tasks):
                self._forget(op.env_id, task)

    async def run_here(self, op: Op) -> Result:
        """:meth:`submit` of one op, run in the awaiting task: a caller in this process that
        awaits one op at a time (a served session) pays for no task, gather or callback of its
        own, and two passes of the loop fewer. Cancelling the caller cancels the op; :meth:`cancel`
        and :meth:`close` find it by its request id, as they find a submitted op (and cancel the
        caller's task, whose op it is)."""
        await self._ensure_started()
        task = asyncio.current_task()
        assert task is not None
        self._tasks[op.env_id] = (op.req_id, task)
        try:
            return await self._run_one(op)
        finally:
            self._forget(op.env_id, task)

    def _forget(self, env_id: int, task: asyncio.Task[Any]) -> None:
        """Drop ``env_id``'s op from the running ones, unless a newer op of it replaced ``task``."""
        if self._tasks.get(env_id, (None, None))[1] is task:
            del self._tasks[env_id]

    async def run_encoded(self, data: bytes) -> bytes:
        """:meth:`submit` for a driver in another process: msgpack ``list[Op]`` in, msgpack
        ``list[Result]`` out once all are done (ops cancelled meanwhile are left out)."""
        results: list[Result] = []
        await self.submit(decode_ops(data), results.append)
        return encode_results(results)

    async def _run_one(self, op: Op) -> Result:
        try:
            session = self._sessions.get(op.env_id)
            if session is None:
                return failed(op, {"type": "ConfigurationError", "message": f"sub-env {op.env_id} is not hosted here"})
            if op.recreate:
                session = await self._recreate(op.env_id, session)
            elif op.env_id in self._lost and op.kind is not OpKind.RESET:
                self._lost.discard(op.env_id)
                return failed(op, {"type": "HostDied",
                                   "message": "the process hosting this sub-env died and was replaced; "
                                              "its episode was lost"})
            self._lost.discard(op.env_id)
            if self.config.games:
                return await run_game_op(session, op, self._step_timeout, self._deadlines)
            wrapped = None if self._wrapped is None else (
                self._wrapped, self._wrapped.stack(op.env_id, session, self._tools))
            if self._sem is None:
                return await run_op(session, op, self._step_timeout, wrapped, self._deadlines)
            async with self._sem:
                return await run_op(session, op, self._step_timeout, wrapped, self._deadlines)
        except Exception as exc:  # a bug rather than a backend failure: still only this sub-env
            return failed(op, error_dict(exc))

    async def _recreate(self, env_id: int, old: Any) -> Any:
        """A fresh session for ``env_id`` (its previous request failed); the old one is closed,
        within ``step_timeout`` (its backend is the thing that failed)."""
        new = self._new_session(self._local[env_id])
        new.np_random, new.cursor = old.np_random, old.cursor  # a recreated sub-env keeps its seeded task stream
        self._sessions[env_id] = new
        try:
            await self._deadlines.within(old.aclose(), self._step_timeout, "closing the failed session")
        except Exception:
            pass
        return new

    async def cancel(self, requests: list[tuple[int, int]]) -> None:
        """Cancel the in-flight ops ``(env_id, req_id)``; a newer op of the same sub-env runs on."""
        tasks = []
        for env_id, req_id in requests:
            entry = self._tasks.get(env_id)
            if entry is not None and entry[0] == req_id:
                del self._tasks[env_id]
                entry[1].cancel()
                tasks.append(entry[1])
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- attributes ------------------------------------------------------------------------------
    async def call(self, name: str, args: tuple, kwargs: dict, env_ids: list[int] | None = None) -> list[Any]:
        """Call (or read) ``name`` on each session (of ``env_ids``, default all), in that order."""
        await self._ensure_started()
        return await call_each((self._sessions[i] for i in (self._ids if env_ids is None else env_ids)),
                               name, args, kwargs)

    async def set_attr(self, name: str, values: list[Any]) -> None:
        """Set ``name`` on each session (``values`` in the order of this shard's env ids)."""
        await self._ensure_started()
        for i, value in zip(self._ids, values):
            setattr(self._sessions[i], name, value)

    # -- close -----------------------------------------------------------------------------------
    async def close(self) -> None:
        """Cancel every op, end every episode, close the wrapper stacks and the adapters (stopping
        their servers). Idempotent."""
        tasks: list[asyncio.Task[Any]] = [task for _, task in self._tasks.values()]
        self._tasks.clear()
        if self._starting is not None and not self._starting.done():
            tasks.append(self._starting)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._deadlines.cancel()
        if self._wrapped is not None:
            self._wrapped.close()  # wrappers flush what they write (RecordEpisodes)
        sessions, self._sessions = list(self._sessions.values()), {}
        adapters, self._adapters = self._adapters, []
        self._started = False
        await asyncio.gather(*(s.aclose() for s in sessions), return_exceptions=True)
        await asyncio.gather(*(a.aclose() for a in adapters), return_exceptions=True)
