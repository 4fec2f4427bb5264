"""SessionPool: sessions of one id leased on demand, for drivers other than a training loop's batches.

A vector env steps a fixed set of sub-envs in batches for one caller. A protocol server answering
clients (:mod:`openenv_gym.serving`), a trainer's rollout slots (:mod:`openenv_gym.trl`) or a web
page need the other shape: a session leased when a client starts, driven one call at a time from
many places at once, handed back when the client is done. A pool gives that over the same shards
a vector env uses (in this process, in host processes, in Ray actors): each slot is one sub-env of
a shard, so deadlines, recreation of a failed session, isolation and dead-shard replacement are the
shard's, written once.

The slots come in blocks, each block one vector env of the id (its backend driven directly): a
pool of a fixed ``size`` is one block; a pool without a size grows a block of ``block`` slots at a
time as leases need them. Blocks of a local source share its server.

Everything but leasing and closing is a coroutine on the runtime loop (``runtime.run_sync`` reaches
it from any thread, so a sync caller may use a pool from many threads at once). A failed op raises
the typed error it carried (:func:`~openenv_gym.errors.from_wire`); the slot's session is then
recreated by its next reset, as a vector env's sub-env is.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from typing import Any

import gymnasium as gym

from openenv_gym import runtime
from openenv_gym.actions import Turn
from openenv_gym.errors import CapacityReached, ConcurrentUse, ConfigurationError, from_wire, inherited
from openenv_gym.shard.ops import Op, OpKind, Result
from openenv_gym.vector.base import AgentVectorEnv, VectorBackend
from openenv_gym.wire import Message, Split, ToolSpec

__all__ = ["SessionPool", "Slot", "BLOCK"]

BLOCK = 32
"""Slots a growing pool adds at a time (one more vector env of the id, sharing its local server)."""
_CALLER_ERRORS = frozenset({"EpisodeNotStarted", "EpisodeFinished", "EpisodeInterrupted", "InvalidAction"})
"""Errors a slot's caller caused: its session is fine, nothing to recreate."""
_CLOSE_TIMEOUT = 30.0


class _Block:
    """One vector env of the pool's id, used for its backend; its slots are ``offset`` on."""

    __slots__ = ("envs", "backend", "offset", "size")

    def __init__(self, envs: AgentVectorEnv, offset: int):
        self.envs, self.backend, self.offset, self.size = envs, envs.backend, offset, envs.num_envs


class SessionPool:
    """Sessions of ``env_id``, leased one at a time (see the module docstring).

    Args:
        env_id: a registered id.
        size: the most sessions at once (leasing more raises
            :class:`~openenv_gym.errors.CapacityReached`); ``None``: the pool grows as needed.
        block: slots added at a time when the pool grows (default :data:`BLOCK`; with a ``size``,
            the first block is the whole pool).
        kwargs: as for ``gym.make_vec`` (``backend``, ``vector_options``, ``isolate``, ``python``,
            ``step_timeout``, ``max_turns``...).
    """

    def __init__(self, env_id: str, *, size: int | None = None, block: int = BLOCK, **kwargs: Any):
        if "autoreset_mode" in kwargs or "group_size" in kwargs:
            raise ConfigurationError("a session pool resets its sessions itself: no autoreset_mode or group_size")
        for name, value in (("size", size), ("block", block)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"{name} must be a positive integer, not {value!r}")
        self.env_id = env_id
        self.size = size
        self._block = size if size is not None else block
        self._kwargs = kwargs
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self._blocks: list[_Block] = []
        self._free: list[int] = []
        self._broken: set[int] = set()
        self._waiting: dict[tuple[int, int], asyncio.Future[Result]] = {}
        self._next_req = 0
        self.closed = False
        self._grow()  # the first block now: its tools, and any error of the id, are known at once
        first = self._blocks[0].envs
        self.tools: list[ToolSpec] = list(first.single_action_space.tools)  # type: ignore[attr-defined]
        """The tools every task offers."""
        runtime.track(self)

    @classmethod
    def make(cls, env_id: str, size: int, **kwargs: Any) -> SessionPool:
        """A pool of exactly ``size`` sessions of ``env_id``; ``kwargs`` as for ``gym.make_vec``."""
        return cls(env_id, size=size, **kwargs)

    @property
    def free(self) -> int:
        """Slots not leased now (of the blocks built so far)."""
        return len(self._free)

    @property
    def capacity(self) -> int:
        """Slots built so far."""
        return sum(b.size for b in self._blocks)

    @property
    def blocks(self) -> list[AgentVectorEnv]:
        """The vector env of each block (for diagnostics: its adapters, pids...)."""
        return [b.envs for b in self._blocks]

    # -- blocks -------------------------------------------------------------------------------------
    def _grow(self) -> None:
        """Build one more block (a vector env of the id; blocking: never on the runtime loop)."""
        n = self._block if self.size is None else min(self._block, self.size - self.capacity)
        envs = gym.make_vec(self.env_id, num_envs=n, autoreset_mode="Disabled", **self._kwargs).unwrapped
        assert isinstance(envs, AgentVectorEnv)
        runtime.untrack(envs)  # the pool closes it
        block = _Block(envs, self.capacity)
        block.backend.deliver = functools.partial(self._deliver, offset=block.offset)
        self._blocks.append(block)
        self._free += range(block.offset, block.offset + block.size)

    def _where(self, slot: int) -> tuple[_Block, int]:
        for block in self._blocks:
            if block.offset <= slot < block.offset + block.size:
                return block, slot - block.offset
        raise ConfigurationError(f"no slot {slot} in this pool")

    # -- leases ---------------------------------------------------------------------------------------
    def lease(self) -> Slot:
        """A free slot (the lowest); a pool without a size grows a block if none is free
        (blocking: call :meth:`alease` from an event loop). :class:`CapacityReached` when all
        ``size`` are leased."""
        self._check_open()
        with self._lock:
            if not self._free and (self.size is None or self.capacity < self.size):
                if runtime.in_runtime_thread():
                    raise CapacityReached("every slot built so far is leased; grow the pool with alease()")
                self._grow()
            if not self._free:
                raise CapacityReached(f"all {self.size} sessions are in use")
            self._free.sort()
            return Slot(self, self._free.pop(0))

    async def alease(self) -> Slot:
        """:meth:`lease` from an event loop (a block is built on a worker thread)."""
        try:
            return self.lease()
        except CapacityReached:
            if self.size is not None and self.capacity >= self.size:
                raise
        return await asyncio.to_thread(self.lease)

    def _release(self, slot: Slot) -> None:
        with self._lock:
            if not self.closed and slot.env_id not in self._free:
                self._free.append(slot.env_id)

    # -- ops ------------------------------------------------------------------------------------------
    async def _run(self, slot: int, kind: OpKind, **fields: Any) -> Result:
        """One op for ``slot``, awaited; a failure is raised, typed."""
        self._check_open()
        block, local = self._where(slot)
        self._next_req += 1
        recreate = slot in self._broken and kind is not OpKind.STEP
        if recreate:
            self._broken.discard(slot)
        op = Op(local, self._next_req, kind, recreate=recreate, **fields)
        direct = block.backend.run_here(op)
        if direct is not None:  # its shard is in this process: run here, in the caller's task
            try:
                result = await direct
            except asyncio.CancelledError:  # the caller gave up (a client left): the op with it
                self._broken.add(slot)
                raise
        else:
            result = await self._sent(block, slot, op)
        if result.error is not None:
            if not result.error.get("user") and result.error.get("type") not in _CALLER_ERRORS:
                self._broken.add(slot)
            raise from_wire(result.error)
        return result

    async def _sent(self, block: _Block, slot: int, op: Op) -> Result:
        """``op`` sent to its shard (in another process, or busy), its result awaited."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        key = (slot, op.req_id)
        self._waiting[key] = future
        try:
            block.backend.send([op])
            block.backend.settle(False, None)  # calls started where they were sent are followed up here
            return await future
        except asyncio.CancelledError:  # the caller gave up (a client left): the shard stops the op too
            self._broken.add(slot)
            await block.backend.cancel([op.env_id])
            raise
        finally:
            self._waiting.pop(key, None)

    def _deliver(self, result: Result, offset: int) -> None:
        future = self._waiting.pop((result.env_id + offset, result.req_id), None)
        if future is not None and not future.done():
            result.env_id += offset
            future.set_result(result)

    # -- the task API ---------------------------------------------------------------------------------
    async def splits(self) -> list[Split]:
        return await self._blocks[0].backend.call_one(0, "splits", (), {})

    async def num_tasks(self, split: str | None = None) -> int:
        return await self._blocks[0].backend.call_one(0, "num_tasks", (split,), {})

    async def task(self, split: str, index: int) -> dict[str, Any]:
        """The task spec (it may hold the answer: never show it to an agent)."""
        return await self._blocks[0].backend.call_one(0, "task", (split, index), {})

    # -- close ----------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ConfigurationError("the session pool is closed")
        if os.getpid() != self._owner:
            raise inherited("session pool", self._owner)

    def close(self) -> None:
        """End every session and release the backends (servers, processes, actors). Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        runtime.untrack(self)
        if os.getpid() != self._owner:  # a forked child's copy releases nothing of the parent's
            return
        try:
            runtime.run_sync(self._aclose(), _CLOSE_TIMEOUT)
        finally:
            for block in self._blocks:
                block.envs.closed = True
                block.backend.release()

    async def _aclose(self) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.cancel()
        self._waiting.clear()
        await asyncio.gather(*(b.backend.aclose() for b in self._blocks), return_exceptions=True)

    def __enter__(self) -> SessionPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True) and getattr(self, "_owner", None) == os.getpid():
            self.closed = True
            runtime.untrack(self)
            backends: list[VectorBackend] = [b.backend for b in self._blocks]

            async def aclose() -> None:
                await asyncio.gather(*(b.aclose() for b in backends), return_exceptions=True)

            runtime.close_later(aclose())


class Slot:
    """One leased session of a :class:`SessionPool`: one call at a time, then :meth:`release`."""

    __slots__ = ("pool", "env_id", "_busy", "released")

    def __init__(self, pool: SessionPool, env_id: int):
        self.pool, self.env_id = pool, env_id
        self._busy = False
        self.released = False

    async def _one(self, kind: OpKind, **fields: Any) -> Result:
        if self.released:
            raise ConfigurationError("this session was released")
        if self._busy:
            raise ConcurrentUse("a call on this session is still running; a session serves one call at a time")
        self._busy = True
        try:
            return await self.pool._run(self.env_id, kind, **fields)
        finally:
            self._busy = False

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None
                    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode, as ``env.reset`` does (the seed picks the task; ``options``: split, index, task)."""
        result = await self._one(OpKind.RESET, seed=seed, options=options)
        return result.obs, result.info

    async def step(self, action: Any, turn: Turn | None = None) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Apply one action, as ``env.step`` does; ``turn``: the action already parsed (by
        :func:`~openenv_gym.actions.parse_action`), which then need not be parsed again."""
        result = await self._one(OpKind.STEP, action=action, turn=turn)
        return result.obs, result.reward, result.terminated, result.truncated, result.info

    async def release(self) -> None:
        """End the running episode and give the slot back (idempotent; never raises)."""
        if self.released:
            return
        self.released = True
        try:
            if not self.pool.closed:
                await self.pool._run(self.env_id, OpKind.END)
        except Exception:
            pass  # its session is recreated by the next lease's reset
        finally:
            self.pool._release(self)
