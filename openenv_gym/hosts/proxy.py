"""IsolatedEnvHost: a Ray actor whose shard runs in a host process under another interpreter.

A Ray worker runs the driver's Python (Ray's own code must import there), so an env that needs
other dependencies cannot run in the actor itself. This actor has the same methods as
:class:`~openenv_gym.hosts.shard.EnvHost` and passes each on, bytes as they are, to a
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
from openenv_gym.vector.ops import decode_results, encode_results

__all__ = ["IsolatedEnvHost"]

_CLOSE_TIMEOUT = 30.0
_msgpack = msgspec.msgpack.Encoder()


class IsolatedEnvHost:
    """An :class:`~openenv_gym.hosts.shard.EnvHost` in a host process under ``interpreter``."""

    def __init__(self, interpreter: Interpreter, init: dict[str, Any]):
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

    async def start(self) -> bytes:
        return await (await self._ensure()).request("start")

    async def tools(self) -> bytes:
        return await self.start()

    async def pid(self) -> int:
        return os.getpid()

    async def host_pid(self) -> int | None:
        """The host process's id (it runs the env)."""
        return None if self._host is None else self._host.pid

    async def run(self, data: bytes) -> bytes:
        results: list[Any] = []
        rest = await (await self._ensure()).request("run", data, lambda body: results.extend(decode_results(body)))
        if not results:  # everything came in the reply: pass it on as it is
            return rest or encode_results([])
        if rest:
            results.extend(decode_results(rest))
        return encode_results(results)

    async def cancel(self, requests: list[tuple[int, int]]) -> None:
        if self._host is not None:
            self._host.notify("cancel", _msgpack.encode(requests))

    async def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        host = await self._ensure()
        return pickle.loads(await host.request("call", pickle.dumps((name, args, kwargs))))

    async def set_attr(self, name: str, values: list[Any]) -> None:
        await (await self._ensure()).request("set_attr", pickle.dumps((name, values)))

    async def close(self) -> None:
        host, self._host = self._host, None
        if host is not None:
            await host.close(_CLOSE_TIMEOUT)
