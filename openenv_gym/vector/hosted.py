"""HostedVectorEnv: sub-envs in shards, each shard in a host of its own (a process or a Ray actor).

The driver logic every out-of-process backend shares, written once over
:class:`~openenv_gym.hosts.handle.Handle`:

* **Shards.** Sub-env ``i`` lives in shard ``i % num_shards``; each shard is one
  :class:`~openenv_gym.hosts.shard.EnvHost` running its sub-envs' episodes concurrently. A
  ``send`` makes one call per shard, whatever the number of sub-envs in it.
* **Parsed actions.** Actions are parsed here: a raw action may hold what msgpack cannot carry (a
  lone surrogate, a huge int, deep nesting) or would change in transit (a set arrives as a
  list), while a parsed turn always encodes, and its problems reach the agent as messages, as
  in a single env. Under sub-env wrappers the action is theirs to read, so it goes as it is
  (arrays as lists).
* **Fault model.** An op that fails inside a host is already a truncated result with ``error``.
  If the *host* dies or stops answering (a call longer than ``3 * step_timeout + 30`` s), every
  unanswered op of the call gets a truncated result with ``info["error"]``, and the host is
  killed and replaced by a fresh one for the same sub-env ids; the other shards go on. The
  replacement knows it replaced a dead host: a sub-env whose next op is a step (its episode died
  with the old host) is answered with the same kind of error, and is back after its next reset.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import numpy as np

from openenv_gym import runtime
from openenv_gym.actions import parse_action
from openenv_gym.errors import BackendTimeout, HostDied
from openenv_gym.hosts.handle import Handle
from openenv_gym.vector.base import AgentVectorEnv
from openenv_gym.vector.ops import Op, Result, decode_results, encode_ops, error_dict, failed
from openenv_gym.wire import ToolSpec

__all__ = ["HostedVectorEnv", "START_TIMEOUT", "default_shards"]

START_TIMEOUT = 600.0
"""Seconds the hosts of a new env may take to start (a process or actor, plus the adapters' start)."""
_CLOSE_TIMEOUT = 30.0
_TIMEOUT_MARGIN = 30.0
_HELD_WAIT = 1.0
"""Seconds a lockstep ``step`` waits for its calls on the caller's thread before handing them to
the loop (a slower step loses nothing by the hand-over, a fast one saves two thread wake-ups)."""


def _first_line(exc: BaseException, limit: int = 500) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


class _Call:
    """One ``run`` in flight: the shard, the handle it went to, its ops (and their encoding),
    which were answered."""

    __slots__ = ("shard", "handle", "ops", "data", "begun", "answered", "task")

    def __init__(self, shard: int, handle: Handle, ops: list[Op], data: bytes, begun: Any = None):
        self.shard, self.handle, self.ops, self.data, self.begun = shard, handle, ops, data, begun
        self.answered: set[int] = set()
        self.task: asyncio.Task[None] | None = None


class HostedVectorEnv(AgentVectorEnv):
    """Sub-envs sharded over hosts; subclasses say how a shard's host is made (:meth:`_new_handle`).

    Subclasses set ``self._shards`` (the env ids of each shard) and call :meth:`_start_hosts`
    before ``AgentVectorEnv.__init__``.
    """

    _shards: list[list[int]]
    _env_wrappers: list[Any]

    def _init_hosts(self, step_timeout: float | None) -> None:
        self._hold = False  # set by step(): _dispatch leaves the calls to it (see _wait_held)
        self._held: tuple[list[tuple[int, list[Op], bytes]], list[Any]] | None = None
        self._step_timeout = step_timeout
        self._call_timeout = None if step_timeout is None else 3 * step_timeout + _TIMEOUT_MARGIN
        self._handles: list[Handle] = []
        self._calls: set[_Call] = set()
        self._in_flight: dict[int, _Call] = {}
        self._starts: dict[int, asyncio.Task[Any]] = {}  # id(handle) -> its start
        self._background: set[asyncio.Task[Any]] = set()
        self.replaced_hosts = 0
        """How many dead or hung hosts were replaced."""

    @abc.abstractmethod
    def _new_handle(self, shard: int, replaced: bool = False) -> Handle:
        """A host for ``shard`` (not started yet); ``replaced``: it replaces a dead one."""

    def _start_failed(self, exc: BaseException) -> BaseException:
        """The exception to raise when the hosts fail to start (subclasses unwrap their own)."""
        return exc

    async def _start_hosts(self) -> list[ToolSpec]:
        self._handles = [self._new_handle(k) for k in range(len(self._shards))]
        try:
            async with asyncio.timeout(START_TIMEOUT):
                tools = await asyncio.gather(*(h.start() for h in self._handles))
        except TimeoutError:
            raise BackendTimeout(
                f"the {self._handles[0].label}s did not start within {START_TIMEOUT} s{self._start_hint()}"
            ) from None
        except BaseException as exc:
            raise self._start_failed(exc) from None
        return tools[0]

    def _start_hint(self) -> str:
        return ""

    @property
    def num_hosts(self) -> int:
        return len(self._shards)

    # -- ops ---------------------------------------------------------------------------------------
    def _dispatch(self, ops: list[Op]) -> None:
        # Parsing and encoding happen on the caller's thread, and so does starting each call
        # where the host allows it (Ray), shard by shard: the first host is at work while the
        # next shard's actions are parsed. Following the calls up needs the loop, and that is
        # posted, not waited for: a send costs one hop to the loop, not two (a held lockstep
        # step, none: see step()).
        failures: list[Result] = []
        calls, begun = [], []
        for call in self._prepare(ops, failures):
            calls.append(call)
            begun.append(self._begin(call[0], call[2]))
        if self._hold and calls and not failures and all(b is not None for b in begun):
            self._held = (calls, begun)  # step() waits for them itself (see _wait_held)
            return
        runtime.post(self._launch, calls, failures, begun)

    # -- lockstep steps --------------------------------------------------------------------------
    def step(self, actions: Any) -> Any:
        """:meth:`AgentVectorEnv.step`; where the hosts allow it (Ray), the caller's thread waits
        for the step's calls itself (see :meth:`_wait_held`)."""
        self._hold = True
        try:
            self.step_async(actions)
        finally:
            self._hold = False
        return self.step_wait()

    def step_wait(self, timeout: float | None = None) -> Any:
        held, self._held = self._held, None
        if held is not None:
            with self._one_caller("step_wait"):
                self._wait_held(held, timeout)
        return super().step_wait(timeout)

    def _wait_held(self, held: tuple[list[tuple[int, list[Op], bytes]], list[Any]], timeout: float | None) -> None:
        """Wait for a lockstep step's calls on the caller's thread and leave their results for
        ``step_wait`` to accept there, with no hop to the loop; awaited on the loop, each answer
        would cost two thread wake-ups more (the host library's thread, then the loop's).

        Whatever is not settled here (not answered within :data:`_HELD_WAIT` s, a failed call,
        Ctrl-C) goes to the loop as an ordinary call, which reports it as any other: a dead
        host is replaced, an interrupted step loses nothing."""
        calls, begun = held
        results: list[Result] | None = None
        try:
            answers = self._wait_begun(begun, _HELD_WAIT if timeout is None else min(timeout, _HELD_WAIT))
            if answers is not None:
                results = [r for data in answers for r in decode_results(data)]
        except Exception:  # noqa: BLE001 - an answer that does not decode: the loop's call reports it
            results = None
        except BaseException:
            runtime.post(self._launch, calls, [], begun)
            raise
        if results is None:
            runtime.post(self._launch, calls, [], begun)
        else:
            self._handed_over = results  # accepted by step_wait on this thread (no hop)

    def _wait_begun(self, begun: list[Any], limit: float) -> list[bytes] | None:
        """The answers (encoded results) of calls :meth:`Handle.begin` started, waited for on the
        caller's thread for up to ``limit`` s; ``None`` if they are not all in by then or one
        failed (the default: hosts whose calls only the loop can follow)."""
        return None

    async def _execute(self, ops: list[Op]) -> None:
        failures: list[Result] = []
        calls = list(self._prepare(ops, failures))
        self._launch(calls, failures)

    def _begin(self, shard: int, data: bytes) -> Any:
        handle = self._handles[shard]
        if id(handle) in self._starts:  # a replacement still starting: the call waits for it
            return None
        try:
            return handle.begin(data)
        except Exception:  # noqa: BLE001 - the call made from the loop reports the failure
            return None

    def _prepare(self, ops: list[Op], failures: list[Result]) -> Iterator[tuple[int, list[Op], bytes]]:
        """The calls to make, ``(shard, ops, encoded ops)``, one shard at a time (any thread):
        the actions parsed, the ops encoded. Ops that cannot be encoded (an action holding an
        arbitrary object, under sub-env wrappers) fail alone, their results put in ``failures``."""
        groups: dict[int, list[Op]] = {}
        n = len(self._shards)
        for op in ops:
            groups.setdefault(op.env_id % n, []).append(op)
        for shard, shard_ops in groups.items():
            for op in shard_ops:
                if op.action is not None and not self._env_wrappers:
                    op.turn, op.action = parse_action(op.action), None
                elif isinstance(op.action, np.ndarray):
                    op.action = op.action.tolist()
            try:
                data = encode_ops(shard_ops)
            except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError):
                shard_ops = self._drop_unencodable(shard_ops, failures)
                if not shard_ops:
                    continue
                data = encode_ops(shard_ops)
            yield shard, shard_ops, data

    def _launch(self, calls: list[tuple[int, list[Op], bytes]], failures: list[Result],
                begun: list[Any] | None = None) -> None:
        """Start (or follow up, ``begun``) one call per shard, on the loop; deliver the ops that
        could not be sent."""
        for result in failures:
            self._deliver(result)
        if self.closed:  # closed between the send and this: nothing may start any more
            return
        loop = asyncio.get_running_loop()
        for k, (shard, shard_ops, data) in enumerate(calls):
            call = _Call(shard, self._handles[shard], shard_ops, data, None if begun is None else begun[k])
            call.task = loop.create_task(self._await_call(call))
            self._calls.add(call)
            for op in shard_ops:
                self._in_flight[op.env_id] = call

    @staticmethod
    def _drop_unencodable(ops: list[Op], failures: list[Result]) -> list[Op]:
        """The ops that can be encoded; the others' failed results go to ``failures``."""
        ok = []
        for op in ops:
            try:
                encode_ops([op])
                ok.append(op)
            except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
                failures.append(failed(op, {"type": "EncodeError",
                                            "message": f"the op cannot be sent to its host: {exc}"}))
        return ok

    async def _await_call(self, call: _Call) -> None:
        def deliver(result: Result) -> None:
            call.answered.add(result.env_id)
            self._deliver(result)

        handle = call.handle
        try:
            start = self._starts.get(id(handle))
            if start is not None and not start.done():
                # A replacement may take long to start (it launches servers): the call's deadline
                # counts from when it is up. A failed start shows up on the call itself.
                await asyncio.wait([start], timeout=START_TIMEOUT)
            if self._call_timeout is None:
                await handle.run(call.data, deliver, call.begun)
            else:
                async with asyncio.timeout(self._call_timeout):
                    await handle.run(call.data, deliver, call.begun)
        except asyncio.CancelledError:
            raise
        except HostDied as exc:
            message = (f"the {handle.label} hosting sub-envs {self._shards[call.shard]} failed and was replaced "
                       f"({_first_line(exc)})")
            self._replace(call.shard, handle)
            self._fail(call, error_dict(self._fault_type(exc), message))
        except TimeoutError:
            message = (f"the {handle.label} hosting sub-envs {self._shards[call.shard]} did not answer within "
                       f"{self._call_timeout} s; it was replaced")
            self._replace(call.shard, handle)
            self._fail(call, {"type": "BackendTimeout", "message": message})
        except Exception as exc:  # the host's own code raised (e.g. its adapters failed to start)
            self._fail(call, error_dict(exc, _first_line(exc)))
        finally:
            self._calls.discard(call)
            for op in call.ops:
                if self._in_flight.get(op.env_id) is call:
                    del self._in_flight[op.env_id]

    def _fault_type(self, exc: HostDied) -> BaseException:
        """The exception whose name a dead host's error carries (Ray keeps its own, e.g. ActorDiedError)."""
        return exc.__cause__ if isinstance(exc.__cause__, BaseException) else exc

    def _fail(self, call: _Call, error: dict[str, Any]) -> None:
        for op in call.ops:
            if op.env_id not in call.answered:
                self._deliver(failed(op, error))

    def _replace(self, shard: int, dead: Handle) -> None:
        """Swap a dead or hung host for a fresh one hosting the same sub-env ids (once per death)."""
        if shard >= len(self._handles) or self._handles[shard] is not dead:
            return  # already replaced (several calls failed on the same host), or closing
        handle = self._new_handle(shard, replaced=True)
        self._handles[shard] = handle
        self.replaced_hosts += 1
        self._starts.pop(id(dead), None)
        dead.kill()
        self._spawn(dead.close(1.0))  # reaps it
        start = asyncio.get_running_loop().create_task(self._settle(handle.start()))
        self._starts[id(handle)] = start
        start.add_done_callback(lambda t, key=id(handle): self._starts.pop(key) if self._starts.get(key) is t else None)

    async def _settle(self, awaitable: Any) -> None:
        """Await something whose value nobody needs (its failure shows on the next call)."""
        try:
            await awaitable
        except Exception:
            pass

    def _spawn(self, awaitable: Any) -> None:
        task = asyncio.get_running_loop().create_task(self._settle(awaitable))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cancel(self, env_ids: Iterable[int]) -> None:
        by_handle: dict[int, tuple[Handle, list[tuple[int, int]]]] = {}
        for i in env_ids:
            call = self._in_flight.pop(i, None)
            if call is None:
                continue
            req = next(op.req_id for op in call.ops if op.env_id == i)
            by_handle.setdefault(id(call.handle), (call.handle, []))[1].append((i, req))
        for handle, requests in by_handle.values():
            # One cheap message per host, not awaited. Ops are matched by request id there, so a
            # cancel overtaken by the sub-env's next op never cancels that op.
            handle.cancel(requests)

    # -- attributes --------------------------------------------------------------------------------
    async def _gather(self, coros: list[Any]) -> list[Any]:
        try:
            if self._call_timeout is None:
                return await asyncio.gather(*coros)
            async with asyncio.timeout(self._call_timeout):
                return await asyncio.gather(*coros)
        except TimeoutError:
            raise BackendTimeout(f"the hosts did not answer within {self._call_timeout} s") from None

    async def _call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        outs = await self._gather([h.call(name, args, kwargs) for h in self._handles])
        values: list[Any] = [None] * self.num_envs
        for shard, out in zip(self._shards, outs):
            for i, value in zip(shard, out):
                values[i] = value
        return values

    async def _set_attr(self, name: str, values: list[Any]) -> None:
        await self._gather([h.set_attr(name, [values[i] for i in shard])
                            for h, shard in zip(self._handles, self._shards)])

    # -- close -------------------------------------------------------------------------------------
    async def _aclose_backend(self) -> None:
        tasks = [c.task for c in self._calls if c.task is not None]
        tasks += [*self._starts.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._calls.clear()
        self._in_flight.clear()
        handles, self._handles = self._handles, []
        await asyncio.gather(*(h.close(_CLOSE_TIMEOUT) for h in handles), return_exceptions=True)
        background = list(self._background)  # the reaping of replaced hosts
        await asyncio.gather(*background, return_exceptions=True)


def default_shards(num_envs: int, num_hosts: int) -> list[list[int]]:
    """Sub-env ``i`` in shard ``i % n`` (``n = min(num_envs, num_hosts)``)."""
    n = max(1, min(num_envs, num_hosts))
    return [list(range(k, num_envs, n)) for k in range(n)]

