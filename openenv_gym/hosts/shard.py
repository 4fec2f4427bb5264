"""EnvHost: a shard of sub-envs in a process of its own, answering ops with results.

One implementation serves every out-of-process host: a Ray actor (:mod:`openenv_gym.vector.ray`
runs it as ``ray.remote(EnvHost)``) and an adapter host process under another interpreter
(:mod:`openenv_gym.hosts.server`, for ``python=`` and ``isolate=True``). Both exchange the same
requests and results, :class:`~openenv_gym.vector.ops.Op` and
:class:`~openenv_gym.vector.ops.Result`, as msgspec msgpack bytes.

Every method is a coroutine on the host's own event loop, so the sub-envs' ops run concurrently
there; nothing here uses openenv_gym's runtime thread.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from typing import Any

import msgspec

from openenv_gym.adapters.base import Adapter, AdapterSpec
from openenv_gym.runtime import Deadlines
from openenv_gym.session import EnvSession
from openenv_gym.vector.ops import (
    Op, Result, call_each, decode_ops, encode_results, error_dict, failed, run_op,
)
from openenv_gym.vector.wrapped import SubEnvWrappers
from openenv_gym.wire import ToolSpec

__all__ = ["EnvHost", "encode_tools", "decode_tools", "encodable"]

_tools_encoder = msgspec.msgpack.Encoder()
_tools_decoder = msgspec.msgpack.Decoder(list[ToolSpec])


def encode_tools(tools: list[ToolSpec]) -> bytes:
    return _tools_encoder.encode(tools)


def decode_tools(data: bytes) -> list[ToolSpec]:
    return _tools_decoder.decode(data)


def encodable(result: Result) -> Result:
    """``result``, or a truncated error result if it cannot be sent (an info holding an object)."""
    try:
        encode_results([result])
        return result
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        error = {"type": "EncodeError", "message": f"the sub-env's result cannot be sent to the driver: {exc}"}
        return Result(result.env_id, result.req_id, [], 0.0, False, True, {"error": error}, error=error)


class EnvHost:
    """A shard of sub-envs: one :class:`EnvSession` per sub-env id, over
    ``ceil(len(env_ids) / envs_per_client)`` adapters built from the adapter recipe.

    ``replaced``: this host replaces one that died, so a sub-env whose next op is a step (its
    episode died with the old host) is answered with a truncated error instead of being stepped.
    """

    def __init__(
        self,
        entry: str,
        adapter_kwargs: dict[str, Any],
        env_ids: list[int],
        split: str | None,
        max_turns: int | None,
        envs_per_client: int,
        step_timeout: float | None,
        replaced: bool = False,
        env_wrappers: list[Any] | None = None,
    ):
        self._spec = AdapterSpec(entry, adapter_kwargs)
        self._wrapped = SubEnvWrappers(env_wrappers, len(env_ids)) if env_wrappers else None
        self._ids = list(env_ids)
        self._local = {i: k for k, i in enumerate(self._ids)}
        self._split, self._max_turns = split, max_turns
        self._num_adapters = max(1, math.ceil(len(self._ids) / max(1, envs_per_client)))
        self._step_timeout = step_timeout
        self._deadlines = Deadlines()  # every op's step_timeout, one timer
        self._adapters: list[Adapter] = []
        self._sessions: dict[int, EnvSession] = {}
        self._tools: list[ToolSpec] = []
        self._starting: asyncio.Task[None] | None = None
        self._started = False
        self._tasks: dict[int, tuple[int, asyncio.Task[Result]]] = {}  # env id -> (req id, task)
        # Sub-envs whose episode died with the host this one replaces.
        self._lost: set[int] = set(self._ids) if replaced else set()

    # -- start -----------------------------------------------------------------------------------
    async def _ensure_started(self) -> None:
        if self._started:
            return
        task = self._starting
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._starting = asyncio.get_running_loop().create_task(self._start())
        await asyncio.shield(task)

    async def _start(self) -> None:
        adapters = [self._spec.build() for _ in range(self._num_adapters)]
        # Start one first: a local source launches its server once, and the rest share it.
        try:
            await adapters[0].start()
            await asyncio.gather(*(a.start() for a in adapters[1:]))
            tools = await adapters[0].tools()
        except BaseException:
            await asyncio.gather(*(a.aclose() for a in adapters), return_exceptions=True)
            raise
        self._adapters, self._tools = adapters, list(tools)
        self._sessions = {i: self._session(k) for k, i in enumerate(self._ids)}
        self._started = True

    def _session(self, local_index: int) -> EnvSession:
        adapter = self._adapters[local_index % len(self._adapters)]
        return EnvSession(adapter, split=self._split, max_turns=self._max_turns)

    async def start(self) -> bytes:
        """Build and start the adapters and sessions; returns the tools (msgpack bytes)."""
        await self._ensure_started()
        return encode_tools(self._tools)

    async def tools(self) -> bytes:
        """The tools every task offers (msgpack-encoded ``list[ToolSpec]``)."""
        return await self.start()

    async def pid(self) -> int:
        """The host's process id (for diagnostics and tests)."""
        return os.getpid()

    # -- ops -------------------------------------------------------------------------------------
    async def run(self, data: bytes) -> bytes:
        """Run a batch of ops (msgpack ``list[Op]``) concurrently; returns msgpack ``list[Result]``
        once all are done. Ops cancelled meanwhile (:meth:`cancel`) are left out of the answer."""
        results: list[Result] = []
        await self.submit(decode_ops(data), results.append)
        try:
            return encode_results(results)
        except (TypeError, ValueError, msgspec.EncodeError):
            return encode_results([encodable(r) for r in results])

    async def submit(self, ops: list[Op], emit: Callable[[Result], None]) -> None:
        """Run ``ops`` concurrently, handing each result to ``emit`` as soon as it is ready (the
        first-ready order a streaming host passes on); returns when every op is done or cancelled."""
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
                if self._tasks.get(op.env_id, (None, None))[1] is task:
                    del self._tasks[op.env_id]

    async def _run_one(self, op: Op) -> Result:
        try:
            session = self._sessions.get(op.env_id)
            if session is None:
                return failed(op, {"type": "ConfigurationError", "message": f"sub-env {op.env_id} is not hosted here"})
            if op.recreate:
                new = self._session(self._local[op.env_id])
                new.np_random = session.np_random  # a recreated sub-env keeps its seeded task stream
                self._sessions[op.env_id] = new
                try:
                    if self._step_timeout is None:
                        await session.aclose()
                    else:
                        async with asyncio.timeout(self._step_timeout):
                            await session.aclose()
                except Exception:
                    pass  # the old episode's backend is the thing that failed
                session = new
            elif op.env_id in self._lost and op.kind != "reset":
                self._lost.discard(op.env_id)
                return failed(op, {"type": "HostDied",
                                   "message": "the process hosting this sub-env died and was replaced; "
                                              "its episode was lost"})
            self._lost.discard(op.env_id)
            wrapped = None if self._wrapped is None else (
                self._wrapped, self._wrapped.stack(op.env_id, session, self._tools))
            return await run_op(session, op, self._step_timeout, wrapped, self._deadlines)
        except Exception as exc:  # a bug rather than a backend failure: still only this sub-env
            return failed(op, error_dict(exc))

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
    async def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        """Call (or read) ``name`` on each hosted session, in the order of this host's env ids."""
        await self._ensure_started()
        return await call_each((self._sessions[i] for i in self._ids), name, args, kwargs)

    async def set_attr(self, name: str, values: list[Any]) -> None:
        """Set ``name`` on each hosted session (``values`` in the order of this host's env ids)."""
        await self._ensure_started()
        for i, value in zip(self._ids, values):
            setattr(self._sessions[i], name, value)

    # -- close -----------------------------------------------------------------------------------
    async def close(self) -> None:
        """Cancel every op, end every episode, close the adapters (stopping their servers)."""
        tasks = [task for _, task in self._tasks.values()]
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
