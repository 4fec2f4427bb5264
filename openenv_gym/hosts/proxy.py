"""ShardProxy: a Ray actor whose shard runs in a host process under another interpreter.

A Ray worker runs the driver's Python (Ray's own code must import there), so an env that needs
other dependencies cannot run in the actor itself. This actor answers the methods a Ray driver
calls on a :class:`~openenv_gym.shard.shard.Shard` actor (``start_encoded``, ``run_encoded``,
``cancel``, ``call``, ``set_attr``, ``pid``, ``close``) and passes each on, bytes as they are, to a
:class:`~openenv_gym.hosts.process.HostProcess` it starts on its own node, under the interpreter
the :class:`~openenv_gym.hosts.interpreter.Interpreter` resolves to *there* (``isolate=True``
builds or reuses the venv on the node that runs the actor). The host dies with the actor.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import msgspec

from openenv_gym.hosts.interpreter import Interpreter
from openenv_gym.hosts.process import HostProcess
from openenv_gym.hosts.protocol import Kind
from openenv_gym.shard.ops import decode_results, encode_results
from openenv_gym.shard.shard import ShardConfig

__all__ = ["ShardProxy"]

_CLOSE_TIMEOUT = 30.0
_msgpack = msgspec.msgpack.Encoder()


class ShardProxy:
    """A :class:`~openenv_gym.shard.shard.Shard` in a host process under ``interpreter``."""

    def __init__(self, interpreter: Interpreter, init: ShardConfig):
        self._interpreter = interpreter
        self._init = init
        self._host: HostProcess | None = None

    async def _ensure(self) -> HostProcess:
        if self._host is None:
            import asyncio

            python = await asyncio.to_thread(self._interpreter.resolve)  # a first venv build takes minutes
            host = HostProcess(python, self._init)
            await host.open()
            self._host = host
        return self._host

    async def start_encoded(self) -> bytes:
        return await (await self._ensure()).request(Kind.START)

    async def pid(self) -> int:
        """The actor's process id, once its host answered too (a frozen host makes it hang)."""
        if self._host is not None:
            await self._host.request(Kind.PID)
        return os.getpid()

    async def host_pid(self) -> int | None:
        """The host process's id (it runs the env)."""
        return None if self._host is None else self._host.pid

    async def run_encoded(self, data: bytes) -> bytes:
        results: list[Any] = []
        rest = await (await self._ensure()).request(Kind.RUN, data, lambda body: results.extend(decode_results(body)))
        if not results:  # everything came in the reply: pass it on as it is
            return rest or encode_results([])
        if rest:
            results.extend(decode_results(rest))
        return encode_results(results)

    async def cancel(self, requests: list[tuple[int, int]]) -> None:
        if self._host is not None:
            self._host.notify(Kind.CANCEL, _msgpack.encode(requests))

    async def call(self, name: str, args: tuple, kwargs: dict, env_ids: list[int] | None = None) -> list[Any]:
        host = await self._ensure()
        return pickle.loads(await host.request(Kind.CALL, pickle.dumps((name, args, kwargs, env_ids))))

    async def set_attr(self, name: str, values: list[Any]) -> None:
        await (await self._ensure()).request(Kind.SET_ATTR, pickle.dumps((name, values)))

    async def close(self) -> None:
        host, self._host = self._host, None
        if host is not None:
            await host.close(_CLOSE_TIMEOUT)
