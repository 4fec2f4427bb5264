"""ConcurrentVectorEnv: every sub-env's episode runs concurrently on this process's runtime loop.

The best fit for remote, I/O-bound backends (ORS servers, Fleet): 1,024 sub-envs cost 1,024
coroutines, not 1,024 processes. Sub-envs share a few adapters (``envs_per_client`` sessions per
adapter): one server process, and connection pools small enough that httpx does not collapse,
which it does when one pool carries 32+ concurrent requests.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gymnasium.vector import AutoresetMode

from openenv_gym import runtime
from openenv_gym.adapters.base import Adapter, AdapterSpec
from openenv_gym.redact import RedactedSpec
from openenv_gym.session import STEP_TIMEOUT, EnvSession
from openenv_gym.vector.base import AgentVectorEnv
from openenv_gym.vector.ops import Op, call_each, run_op
from openenv_gym.vector.wrapped import SubEnvWrappers, check_wrappers

__all__ = ["ConcurrentVectorEnv"]


class ConcurrentVectorEnv(RedactedSpec, AgentVectorEnv):
    """Sub-envs as concurrent sessions over a few shared adapters, on the runtime loop.

    Args:
        num_envs: how many sub-envs.
        adapter: how to build an adapter (several are built, each shared by many sub-envs).
        split: the default split of every sub-env.
        max_turns: truncate each episode after this many agent actions.
        envs_per_client: sub-envs per adapter (each adapter has its own connection pool).
        max_in_flight: bound on concurrent backend operations (``None``: no bound).
        env_wrappers: Gymnasium wrappers (callables ``env -> env``) stacked on every sub-env, as
            on a single env (:mod:`openenv_gym.vector.wrapped`).
        autoreset_mode, step_timeout: see :class:`~openenv_gym.vector.base.AgentVectorEnv`.
    """

    def __init__(
        self,
        num_envs: int,
        adapter: AdapterSpec,
        *,
        split: str | None = None,
        max_turns: int | None = None,
        envs_per_client: int = 8,
        max_in_flight: int | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = STEP_TIMEOUT,
        env_wrappers: Sequence[Callable[[Any], Any]] | None = None,
    ):
        autoreset_mode = AutoresetMode(autoreset_mode)  # fail before any server or client starts
        wrappers = check_wrappers(env_wrappers)
        self._wrapped = SubEnvWrappers(wrappers, num_envs) if wrappers else None
        self._tools: list[Any] = []
        self._spec_adapter = adapter
        self._split, self._max_turns = split, max_turns
        self._adapters: list[Adapter] = []
        self._sessions: list[EnvSession] = []
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._max_in_flight = max_in_flight
        self._sem: asyncio.Semaphore | None = None
        self._deadlines = runtime.Deadlines()  # every op's step_timeout, one timer
        shards = max(1, math.ceil(num_envs / max(1, envs_per_client)))
        tools = runtime.run_sync(self._start(num_envs, shards))
        self._tools = list(tools)
        super().__init__(num_envs, tools, autoreset_mode=autoreset_mode, step_timeout=step_timeout)
        self._any_action = self._wrapped is not None  # a wrapper decides what an action may be

    async def _start(self, num_envs: int, shards: int) -> list[Any]:
        adapters = [self._spec_adapter.build() for _ in range(shards)]
        # Start one first: a local source launches its server once, and the rest share it.
        try:
            await adapters[0].start()
            await asyncio.gather(*(a.start() for a in adapters[1:]))
        except BaseException:
            await asyncio.gather(*(a.aclose() for a in adapters), return_exceptions=True)
            raise
        self._adapters = adapters
        self._sessions = [self._session(i) for i in range(num_envs)]
        if self._max_in_flight:
            self._sem = asyncio.Semaphore(self._max_in_flight)
        return await adapters[0].tools()

    def _session(self, env_id: int) -> EnvSession:
        adapter = self._adapters[env_id % len(self._adapters)]
        return EnvSession(adapter, split=self._split, max_turns=self._max_turns)

    async def _execute(self, ops: list[Op]) -> None:
        self._start_ops(ops)

    def _start_ops(self, ops: list[Op]) -> None:
        loop = runtime.get_loop()
        for op in ops:
            self._tasks[op.env_id] = loop.create_task(self._run(op))

    def _dispatch(self, ops: list[Op]) -> None:
        # Starting the ops' tasks cannot fail, so ``send`` posts them and returns without a round
        # trip to the loop: what runs next on the loop (a ``recv``'s wait, ``close``) comes after
        # them, as the loop runs callbacks in the order they were posted.
        runtime.post(self._start_ops, ops)

    async def _run(self, op: Op) -> None:
        if op.recreate:
            old = self._sessions[op.env_id]
            new = self._session(op.env_id)
            new.np_random = old.np_random  # a recreated sub-env keeps its seeded task stream
            self._sessions[op.env_id] = new
            try:
                await old.aclose()
            except Exception:
                pass  # the old episode's backend is the thing that failed
        session = self._sessions[op.env_id]
        wrapped = None if self._wrapped is None else (self._wrapped, self._wrapped.stack(op.env_id, session, self._tools))
        if self._sem is None:
            result = await run_op(session, op, self.step_timeout, wrapped, self._deadlines)
        else:
            async with self._sem:
                result = await run_op(session, op, self.step_timeout, wrapped, self._deadlines)
        if self._tasks.get(op.env_id) is asyncio.current_task():
            del self._tasks[op.env_id]
        self._deliver(result)

    async def _cancel(self, env_ids: Iterable[int]) -> None:
        tasks = [t for i in env_ids if (t := self._tasks.pop(i, None)) is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        return await call_each(self._sessions, name, args, kwargs)

    async def _set_attr(self, name: str, values: list[Any]) -> None:
        for session, value in zip(self._sessions, values):
            setattr(session, name, value)

    async def _aclose_backend(self) -> None:
        await self._cancel(list(self._tasks))
        self._deadlines.cancel()
        if self._wrapped is not None:
            self._wrapped.close()
        await asyncio.gather(*(s.aclose() for s in self._sessions), return_exceptions=True)
        await asyncio.gather(*(a.aclose() for a in self._adapters), return_exceptions=True)
        self._sessions, self._adapters = [], []
