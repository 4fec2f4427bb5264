"""SessionPool: sessions of one id leased on demand, for drivers other than a training loop's batches.

A vector env steps a fixed set of sub-envs in batches for one caller. A protocol server answering
clients (:mod:`openenv_gym.serving`), a trainer's rollout slots (:mod:`openenv_gym.trl`) or a web
page need the other shape: a session leased when a client starts, driven one call at a time from
many places at once, handed back when the client is done. A pool gives that over the same shards
a vector env uses (in this process, in host processes, in Ray actors): each slot is one sub-env of
a shard, so deadlines, recreation of a failed session, isolation and dead-shard replacement are the
shard's, written once.

Everything here is a coroutine on the runtime loop (``runtime.run_sync`` reaches it from any
thread, so a sync caller may use a pool from many threads at once). A failed op raises the typed
error it carried (:func:`~openenv_gym.errors.from_wire`); the slot's session is then recreated by
its next reset, as a vector env's sub-env is.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import gymnasium as gym

from openenv_gym import runtime
from openenv_gym.errors import CapacityReached, ConcurrentUse, ConfigurationError, from_wire, inherited
from openenv_gym.shard.ops import Op, OpKind, Result
from openenv_gym.vector.base import AgentVectorEnv
from openenv_gym.wire import Message, Split, ToolSpec

__all__ = ["SessionPool", "Slot"]

_CALLER_ERRORS = frozenset({"EpisodeNotStarted", "EpisodeFinished", "EpisodeInterrupted", "InvalidAction"})
"""Errors a slot's caller caused: its session is fine, nothing to recreate."""
_CLOSE_TIMEOUT = 30.0


class SessionPool:
    """``size`` sessions of one id, leased one at a time (see the module docstring).

    Build it with :meth:`make` (``gym.make_vec``'s kwargs: ``backend``, ``vector_options``,
    ``isolate``, ``step_timeout``...), or from a vector env of one id, whose backend it takes over.
    """

    def __init__(self, envs: AgentVectorEnv):
        self._envs = envs
        self._owner = os.getpid()
        self._backend = envs.backend
        self._backend.deliver = self._deliver
        runtime.untrack(envs)  # the pool closes it
        runtime.track(self)
        self.size = envs.num_envs
        self.tools: list[ToolSpec] = list(envs.single_action_space.tools)  # type: ignore[attr-defined]
        """The tools every task offers."""
        self._free = list(range(self.size))
        self._broken: set[int] = set()
        self._waiting: dict[tuple[int, int], asyncio.Future[Result]] = {}
        self._next_req = 0
        self.closed = False

    @classmethod
    def make(cls, env_id: str, size: int, **kwargs: Any) -> SessionPool:
        """A pool of ``size`` sessions of ``env_id``; ``kwargs`` as for ``gym.make_vec``."""
        if "autoreset_mode" in kwargs or "group_size" in kwargs:
            raise ConfigurationError("a session pool resets its sessions itself: no autoreset_mode or group_size")
        envs = gym.make_vec(env_id, num_envs=size, autoreset_mode="Disabled", **kwargs)
        return cls(envs.unwrapped)  # type: ignore[arg-type]

    @property
    def free(self) -> int:
        """Slots not leased now."""
        return len(self._free)

    # -- leases ------------------------------------------------------------------------------------
    def lease(self) -> Slot:
        """A free slot; :class:`~openenv_gym.errors.CapacityReached` when all ``size`` are leased."""
        self._check_open()
        if not self._free:
            raise CapacityReached(f"all {self.size} sessions are in use")
        return Slot(self, self._free.pop(0))

    def _release(self, slot: Slot) -> None:
        if not self.closed:
            self._free.append(slot.env_id)

    # -- ops -----------------------------------------------------------------------------------------
    async def _run(self, env_id: int, kind: OpKind, **fields: Any) -> Result:
        """One op for ``env_id``, awaited; a failure is raised, typed."""
        self._check_open()
        self._next_req += 1
        recreate = env_id in self._broken and kind is not OpKind.STEP
        if recreate:
            self._broken.discard(env_id)
        op = Op(env_id, self._next_req, kind, recreate=recreate, **fields)
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        key = (env_id, op.req_id)
        self._waiting[key] = future
        try:
            self._backend.send([op])
            self._backend.settle(False, None)  # calls started where they were sent are followed up here
            result = await future
        except asyncio.CancelledError:  # the caller gave up (a client left): the shard stops the op too
            self._broken.add(env_id)
            await self._backend.cancel([env_id])
            raise
        finally:
            self._waiting.pop(key, None)
        if result.error is not None:
            if not result.error.get("user") and result.error.get("type") not in _CALLER_ERRORS:
                self._broken.add(env_id)
            raise from_wire(result.error)
        return result

    def _deliver(self, result: Result) -> None:
        future = self._waiting.pop((result.env_id, result.req_id), None)
        if future is not None and not future.done():
            future.set_result(result)

    # -- the task API --------------------------------------------------------------------------------
    async def splits(self) -> list[Split]:
        return await self._backend.call_one(0, "splits", (), {})

    async def num_tasks(self, split: str | None = None) -> int:
        return await self._backend.call_one(0, "num_tasks", (split,), {})

    async def task(self, split: str, index: int) -> dict[str, Any]:
        """The task spec (it may hold the answer: never show it to an agent)."""
        return await self._backend.call_one(0, "task", (split, index), {})

    # -- close ---------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ConfigurationError("the session pool is closed")
        if os.getpid() != self._owner:
            raise inherited("session pool", self._owner)

    def close(self) -> None:
        """End every session and release the backend (servers, processes, actors). Idempotent."""
        if self.closed:
            return
        self.closed = True
        runtime.untrack(self)
        if os.getpid() != self._owner:  # a forked child's copy releases nothing of the parent's
            return
        try:
            runtime.run_sync(self._aclose(), _CLOSE_TIMEOUT)
        finally:
            self._envs.closed = True
            self._backend.release()

    async def _aclose(self) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.cancel()
        self._waiting.clear()
        await self._backend.aclose()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.closed = True
            runtime.untrack(self)
            if os.getpid() == self._owner:
                runtime.close_later(self._backend.aclose())


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

    async def step(self, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Apply one action, as ``env.step`` does."""
        result = await self._one(OpKind.STEP, action=action)
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
