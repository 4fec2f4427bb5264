"""Handle: a driver's side of one :class:`~openenv_gym.shard.shard.Shard`, wherever it runs.

A vector env (:mod:`openenv_gym.vector.shards`) talks to each of its shards through a handle, as
httpx talks to the network through a transport: one small interface, one implementation per way
of reaching a shard.

* :class:`LocalHandle`: the shard is in this process, on the runtime loop. Ops and results pass
  as objects (nothing is encoded) and a sub-env's raw action goes as it is.
* :class:`EncodedHandle`, the base of handles whose shard is in another process: a host process
  (:class:`~openenv_gym.hosts.process.ProcessHandle`) or a Ray actor
  (:class:`~openenv_gym.vector.ray.RayHandle`). Actions are parsed on the driver (a raw action may
  hold what msgpack cannot carry, or would change in transit; a parsed turn always encodes, and
  its problems reach the agent as messages), and ops are encoded as msgpack.

Every method but :meth:`Handle.prepare`, :meth:`Handle.begin` and :meth:`Handle.wait_begun` runs
on the runtime loop. Those three run on the caller's thread: preparing a call is the driver's own
CPU work, and a handle whose calls can start and be waited for from any thread (Ray's) lets a
lockstep ``step`` skip the hop to the loop and back.
"""

from __future__ import annotations

import abc
import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from openenv_gym.actions import parse_action
from openenv_gym.shard.ops import ENCODE_ERRORS, Op, Result, encode_ops, failed
from openenv_gym.shard.shard import Shard
from openenv_gym.wire import ToolSpec

__all__ = ["Handle", "LocalHandle", "EncodedHandle", "HUNG_GRACE", "PING_TIMEOUT"]

HUNG_GRACE = 5.0
"""Seconds past ``step_timeout`` after which a shard still busy with a call is checked for life."""
PING_TIMEOUT = 5.0
"""Seconds a shard has to answer that check (:meth:`Handle.pid`) before it is killed and replaced.
The same rule holds for a vector env's shards and a single env's host process."""


class Handle(abc.ABC):
    """One shard, as its driver reaches it."""

    label = "shard"
    """What the shard runs in, for messages (``"host process"``, ``"Ray actor"``)."""

    @abc.abstractmethod
    async def start(self) -> list[ToolSpec]:
        """Start the shard (its process, its adapters); the tools every task offers."""

    def prepare(self, ops: list[Op]) -> tuple[Any, list[Result]]:
        """What :meth:`run` sends for ``ops``, and the results of ops that cannot be sent (any
        thread). By default the ops themselves."""
        return ops, []

    def begin(self, payload: Any) -> Any:
        """Start the call from the caller's thread where this kind of shard allows it; what
        :meth:`run` and :meth:`wait_begun` then take, or ``None`` (the call starts in :meth:`run`)."""
        return None

    def wait_begun(self, begun: list[Any], limit: float) -> list[list[Result] | None]:
        """Wait on the caller's thread, up to ``limit`` s, for calls :meth:`begin` started on
        handles of this class; per call, its results, or ``None`` if it is not in by then or
        failed (such a call is followed up on the loop by :meth:`run`, which reports any failure).
        The calls that are in count even when others are not: a fast sub-env's answer is never
        held back by a slow one's."""
        return [None] * len(begun)

    def run_here(self, op: Op) -> Coroutine[Any, Any, Result] | None:
        """``op`` as a coroutine for the awaiting task to run itself, where the shard is in this
        process (no task, gather or callback of the shard's own for one op, see
        :meth:`Shard.run_here`); ``None`` where it is not: send the op."""
        return None

    @abc.abstractmethod
    async def run(self, payload: Any, deliver: Callable[[Result], None], begun: Any = None) -> None:
        """Run the call :meth:`prepare` made (or follow up the one :meth:`begin` started), handing
        each result to ``deliver`` (as each finishes, or all at the end); returns when all are
        done. Cancelled ops get no result. :class:`~openenv_gym.errors.HostDied` if the shard's
        process died or its stream broke."""

    @abc.abstractmethod
    def cancel(self, requests: list[tuple[int, int]]) -> None:
        """Ask the shard to cancel these ``(env_id, req_id)`` ops; not awaited."""

    @abc.abstractmethod
    async def call(self, name: str, args: tuple, kwargs: dict, env_ids: list[int] | None = None) -> list[Any]:
        """Call or read ``name`` on each of the shard's sessions (of ``env_ids``, default all)."""

    @abc.abstractmethod
    async def set_attr(self, name: str, values: list[Any]) -> None:
        """Set ``name`` on each of the shard's sessions."""

    @abc.abstractmethod
    async def pid(self) -> int:
        """The id of the process the shard runs in; answering at all shows the shard is alive."""

    @abc.abstractmethod
    async def close(self, timeout: float) -> None:
        """Close the shard's sessions and adapters, then end its process; kill it if that takes
        longer than ``timeout`` seconds. Never raises."""

    def kill(self) -> None:
        """End the shard's process at once (it died or hung); never raises. An in-process shard
        has no process of its own: nothing to do."""
        return None  # a no-op by default, on purpose: only a shard with a process overrides it


class LocalHandle(Handle):
    """A shard in this process, on the runtime loop: ops and results pass as objects."""

    label = "in-process shard"

    def __init__(self, shard: Shard):
        self.shard = shard

    async def start(self) -> list[ToolSpec]:
        return await self.shard.start()

    async def run(self, payload: Any, deliver: Callable[[Result], None], begun: Any = None) -> None:
        await self.shard.submit(payload, deliver)

    def run_here(self, op: Op) -> Coroutine[Any, Any, Result] | None:
        return self.shard.run_here(op)

    def cancel(self, requests: list[tuple[int, int]]) -> None:
        asyncio.get_running_loop().create_task(self.shard.cancel(requests))

    async def call(self, name: str, args: tuple, kwargs: dict, env_ids: list[int] | None = None) -> list[Any]:
        return await self.shard.call(name, args, kwargs, env_ids)

    async def set_attr(self, name: str, values: list[Any]) -> None:
        await self.shard.set_attr(name, values)

    async def pid(self) -> int:
        return os.getpid()

    async def close(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                await self.shard.close()
        except Exception:
            pass


class EncodedHandle(Handle):
    """A shard in another process: actions parsed here, ops sent as msgpack bytes.

    ``any_action``: the sub-envs carry wrappers, which decide what an action may be (token ids,
    say), so actions go as they are (arrays as lists) rather than parsed.
    """

    def __init__(self, any_action: bool = False):
        self.any_action = any_action

    def prepare(self, ops: list[Op]) -> tuple[bytes | None, list[Result]]:
        for op in ops:
            if op.action is not None and not self.any_action:
                op.turn, op.action = (op.turn if op.turn is not None else parse_action(op.action)), None
            elif isinstance(op.action, np.ndarray):
                op.action = op.action.tolist()
            if self.any_action and op.action is not None:
                op.turn = None  # the wrappers take the action as it is
        try:
            return encode_ops(ops), []
        except ENCODE_ERRORS:
            pass
        sendable, failures = [], []
        for op in ops:
            try:
                encode_ops([op])
                sendable.append(op)
            except ENCODE_ERRORS as exc:
                failures.append(failed(op, {"type": "EncodeError",
                                            "message": f"the op cannot be sent to its {self.label}: {exc}"}))
        return (encode_ops(sendable) if sendable else None), failures
