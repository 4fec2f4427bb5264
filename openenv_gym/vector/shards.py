"""Shards: the shards behind one vector env, and the calls in flight to them.

A vector env (:class:`~openenv_gym.vector.base.AgentVectorEnv`) keeps Gymnasium's semantics;
what runs its sub-envs is a :class:`Shards`: a fixed layout of sub-env ids over
:class:`~openenv_gym.shard.shard.Shard` instances, each reached through a
:class:`~openenv_gym.shard.handle.Handle` (in this process, in a host process, in a Ray actor).
Written once for every kind of handle:

* **One call per shard.** A ``send`` groups its ops by shard and makes one call to each, whatever
  the number of sub-envs in it; results come back as each sub-env finishes (or per call, where
  the shard's transport batches them) and are handed to the vector env in arrival order.
* **Calls started on the caller's thread.** Preparing a call (parsing, encoding) is done on the
  caller's thread. A handle whose calls can also start and be waited for there (Ray's) starts
  them at once; if a later wait needs every call in flight (a lockstep ``step``), the caller's
  thread waits for them itself, skipping the hop to the runtime loop and back
  (:meth:`Shards.settle`); otherwise they are followed up on the loop, as every other call is.
* **Fault model.** An op that fails inside a shard is already a truncated result with ``error``.
  If a shard's *process* dies (:class:`~openenv_gym.errors.HostDied`), every unanswered op of its
  calls gets a truncated result with ``info["error"]``, and the shard is replaced by a fresh one
  for the same sub-env ids; the others go on. A shard whose calls run past ``step_timeout`` plus
  :data:`HUNG_GRACE` is asked whether it is alive; if it does not answer within
  :data:`PING_TIMEOUT` (a stopped process, a frozen loop) it is killed, which ends its calls as a
  death, and replaced. The replacement knows it replaced a dead shard: a sub-env whose next op is
  a step (its episode died with the old one) gets the same kind of error, and is back after its
  next reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

from openenv_gym import runtime
from openenv_gym.errors import BackendTimeout, HostDied
from openenv_gym.session import START_TIMEOUT
from openenv_gym.shard.handle import HUNG_GRACE, PING_TIMEOUT, Handle
from openenv_gym.shard.ops import Op, Result, error_dict, failed
from openenv_gym.wire import ToolSpec

__all__ = ["Shards", "open_shards", "default_layout", "START_TIMEOUT", "HUNG_GRACE", "PING_TIMEOUT"]

SETTLE_WAIT = 1.0
"""Seconds the caller's thread waits for calls it started before handing them to the loop (a
slower step loses nothing by the hand-over, a fast one saves two thread wake-ups)."""
_CLOSE_TIMEOUT = 30.0


def default_layout(num_envs: int, num_shards: int) -> list[list[int]]:
    """Sub-env ``i`` in shard ``i % n`` (``n = min(num_envs, num_shards)``)."""
    n = max(1, min(num_envs, num_shards))
    return [list(range(k, num_envs, n)) for k in range(n)]


def open_shards(shards: Shards) -> list[ToolSpec]:
    """Start ``shards`` from the caller's thread; the tools. If that fails (or is interrupted),
    whatever started is closed and released before the error is raised."""
    try:
        return runtime.run_sync(shards.start(), shards.start_timeout + 60.0, what="starting the vector env",
                                limit="start_timeout")
    except BaseException:
        with contextlib.suppress(Exception):
            runtime.run_sync(shards.aclose(), 120.0)
        shards.release()
        raise


def _first_line(exc: BaseException, limit: int = 500) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


class _Call:
    """One call in flight: the shard, the handle it went to, its ops and payload, which were answered."""

    __slots__ = ("shard", "handle", "ops", "payload", "begun", "answered", "task", "deadline")

    def __init__(self, shard: int, handle: Handle, ops: list[Op], payload: Any, begun: Any):
        self.shard, self.handle, self.ops, self.payload, self.begun = shard, handle, ops, payload, begun
        self.answered: set[int] = set()
        self.task: asyncio.Task[None] | None = None
        self.deadline = 0.0  # loop time after which the shard is checked for life


class Shards:
    """Sub-env ids laid out over shards, each reached through a handle ``new_handle(k, replaced)``.

    Args:
        layout: the sub-env ids of each shard.
        new_handle: makes the (unstarted) handle of shard ``k``; ``replaced``: it replaces one
            that died.
        step_timeout: the sub-envs' limit (``None``: none, and no shard is ever considered hung).
        start_timeout: seconds the shards may take to start.
        start_hint: said after a start that timed out (what may be missing).
        release: called once, last, by :meth:`release` (Ray's runtime use count, say).

    :attr:`deliver` receives every result, on the runtime loop; the vector env sets it.
    """

    def __init__(self, layout: list[list[int]], new_handle: Callable[[int, bool], Handle], *,
                 step_timeout: float | None, start_timeout: float = START_TIMEOUT,
                 release: Callable[[], None] | None = None, start_hint: str = ""):
        self.layout = layout
        self._where = {i: k for k, ids in enumerate(layout) for i in ids}
        self._new_handle = new_handle
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        self._release_hook = release
        self._start_hint = start_hint
        self.deliver: Callable[[Result], None] = lambda result: None
        self.handles: list[Handle] = []
        self._calls: set[_Call] = set()
        self._in_flight: dict[int, _Call] = {}
        self._held: list[_Call] = []  # calls started on the caller's thread, not yet followed up
        self._starts: dict[int, asyncio.Task[Any]] = {}  # id(handle) -> its start
        self._hung: weakref.WeakKeyDictionary[Handle, str] = weakref.WeakKeyDictionary()  # why it was killed
        self._background: set[asyncio.Task[Any]] = set()
        self._watch: asyncio.TimerHandle | None = None
        self.replaced = 0
        """How many dead or hung shards were replaced."""

    @property
    def num_envs(self) -> int:
        return len(self._where)

    # -- start -------------------------------------------------------------------------------------
    async def start(self) -> list[ToolSpec]:
        """Start every shard (within ``start_timeout``); the tools every task offers."""
        self.handles = [self._new_handle(k, False) for k in range(len(self.layout))]
        try:
            async with asyncio.timeout(self.start_timeout):
                tools = await asyncio.gather(*(h.start() for h in self.handles))
        except TimeoutError:
            raise BackendTimeout(f"the {self.handles[0].label}s did not start within "
                                 f"start_timeout={self.start_timeout} s{self._start_hint}") from None
        return tools[0]

    # -- sending (the caller's thread) ---------------------------------------------------------------
    def send(self, ops: list[Op]) -> None:
        """Start ``ops``: one call per shard, prepared (and where the handle allows, started) here."""
        by_shard: dict[int, list[Op]] = {}
        for op in ops:
            by_shard.setdefault(self._where[op.env_id], []).append(op)
        failures: list[Result] = []
        calls: list[_Call] = []
        for shard, shard_ops in by_shard.items():
            handle = self.handles[shard]
            payload, bad = handle.prepare(shard_ops)
            if bad:
                failures += bad
                lost = {r.env_id for r in bad}
                shard_ops = [op for op in shard_ops if op.env_id not in lost]
            if payload is None:
                continue
            begun = None
            if id(handle) not in self._starts:  # a replacement still starting: the loop waits for it
                try:
                    begun = handle.begin(payload)
                except Exception:  # noqa: BLE001 - the call made from the loop reports the failure
                    begun = None
            calls.append(_Call(shard, handle, shard_ops, payload, begun))
        if calls and not failures and all(c.begun is not None for c in calls):
            self._held += calls  # followed up by settle(): here, or on the loop
            return
        runtime.post(self._launch, calls, failures)

    def run_here(self, op: Op) -> Coroutine[Any, Any, Result] | None:
        """``op`` for the awaiting task to run itself, when its shard is in this process, started,
        and running nothing else for its sub-env (:meth:`Handle.run_here`); else ``None``."""
        if not self.handles:  # closed: the sending path reports it
            return None
        handle = self.handles[self._where[op.env_id]]
        if id(handle) in self._starts or op.env_id in self._in_flight:
            return None
        return handle.run_here(op)

    def settle(self, all_needed: bool, limit: float | None) -> list[Result] | None:
        """Follow up the calls :meth:`send` started on this thread (the caller's).

        If ``all_needed`` (the caller waits for every request in flight), wait for them here up to
        ``limit`` s (at most :data:`SETTLE_WAIT`) and return the results of those that are in by
        then, handing the rest to the loop; otherwise hand them all to the loop and return
        ``None``. Ctrl-C hands them all over too, and is raised: nothing is lost.
        """
        held, self._held = self._held, []
        if not held:
            return None
        if not all_needed:
            runtime.post(self._launch, held, [])
            return None
        wait = SETTLE_WAIT if limit is None else min(limit, SETTLE_WAIT)
        try:
            answers = held[0].handle.wait_begun([c.begun for c in held], wait)
        except Exception:  # noqa: BLE001 - the loop's follow-up reports it (a dead shard is replaced there)
            answers = [None] * len(held)
        except BaseException:
            runtime.post(self._launch, held, [])
            raise
        rest = [call for call, got in zip(held, answers) if got is None]
        if rest:
            runtime.post(self._launch, rest, [])
        return [result for got in answers if got is not None for result in got]

    # -- following calls up (the loop) ---------------------------------------------------------------
    def _launch(self, calls: list[_Call], failures: list[Result]) -> None:
        for result in failures:
            self.deliver(result)
        loop = asyncio.get_running_loop()
        for call in calls:
            if not self.handles:
                return  # closed between the send and this: nothing may start any more
            call.task = loop.create_task(self._await_call(call))
            self._calls.add(call)
            for op in call.ops:
                self._in_flight[op.env_id] = call
            self._arm(call, loop)

    async def _await_call(self, call: _Call) -> None:
        def deliver(result: Result) -> None:
            call.answered.add(result.env_id)
            self.deliver(result)

        handle = call.handle
        try:
            start = self._starts.get(id(handle))
            if start is not None and not start.done():
                # A replacement may take long to start (it launches servers): the call waits, and
                # its liveness deadline counts from when the shard is up.
                await asyncio.wait([start], timeout=self.start_timeout)
                self._arm(call, asyncio.get_running_loop())
            await handle.run(call.payload, deliver, call.begun)
        except asyncio.CancelledError:
            raise
        except HostDied as exc:
            hung = self._hung.get(handle)
            where = f"the {handle.label} hosting sub-envs {self.layout[call.shard]}"
            if hung is not None:
                error = {"type": "BackendTimeout", "message": f"{where} {hung}; it was replaced"}
            else:
                cause = exc.__cause__ if isinstance(exc.__cause__, BaseException) else exc
                error = error_dict(cause, f"{where} failed and was replaced ({_first_line(exc)})")
            self._replace(call.shard, handle)
            self._fail(call, error)
        except Exception as exc:  # the shard's own code raised (e.g. its adapters failed to start)
            self._fail(call, error_dict(exc, _first_line(exc)))
        finally:
            self._calls.discard(call)
            for op in call.ops:
                if self._in_flight.get(op.env_id) is call:
                    del self._in_flight[op.env_id]

    def _fail(self, call: _Call, error: dict[str, Any]) -> None:
        for op in call.ops:
            if op.env_id not in call.answered:
                self.deliver(failed(op, error))

    # -- liveness ------------------------------------------------------------------------------------
    def _arm(self, call: _Call, loop: asyncio.AbstractEventLoop) -> None:
        """Give ``call`` its liveness deadline; one timer serves every call in flight."""
        if self.step_timeout is None:
            return
        call.deadline = loop.time() + self.step_timeout + HUNG_GRACE
        if self._watch is None:
            self._watch = loop.call_at(call.deadline, self._check_overdue, loop)

    def _check_overdue(self, loop: asyncio.AbstractEventLoop) -> None:
        self._watch = None
        now = loop.time()
        overdue: dict[int, Handle] = {}
        upcoming = float("inf")
        for call in self._calls:
            if call.deadline <= now:
                overdue[id(call.handle)] = call.handle
                call.deadline = now + self.step_timeout + HUNG_GRACE  # type: ignore[operator]
            upcoming = min(upcoming, call.deadline)
        for handle in overdue.values():
            self._spawn(self._check_alive(handle))
        if upcoming != float("inf"):
            self._watch = loop.call_at(upcoming, self._check_overdue, loop)

    async def _check_alive(self, handle: Handle) -> None:
        """Kill ``handle``'s shard if it does not answer within :data:`PING_TIMEOUT` (its calls then
        end as a death, and it is replaced)."""
        try:
            async with asyncio.timeout(PING_TIMEOUT):
                await handle.pid()
        except HostDied:
            return  # already dead: its calls report it
        except Exception:
            self._hung[handle] = (f"stopped answering (no answer to a liveness check within "
                                      f"{PING_TIMEOUT} s, after step_timeout={self.step_timeout} s "
                                      f"+ {HUNG_GRACE} s)")
            handle.kill()

    def _replace(self, shard: int, dead: Handle) -> None:
        """Swap a dead or hung shard for a fresh one hosting the same sub-env ids (once per death)."""
        if shard >= len(self.handles) or self.handles[shard] is not dead:
            return  # already replaced (several calls failed on the same shard), or closing
        handle = self._new_handle(shard, True)
        self.handles[shard] = handle
        self.replaced += 1
        self._starts.pop(id(dead), None)
        dead.kill()
        self._spawn(dead.close(1.0))  # reaps it
        start = asyncio.get_running_loop().create_task(_settle(handle.start()))
        self._starts[id(handle)] = start
        key = id(handle)

        def forget(t: asyncio.Task[Any]) -> None:
            if self._starts.get(key) is t:
                self._starts.pop(key)

        start.add_done_callback(forget)

    def _spawn(self, awaitable: Any) -> None:
        task = asyncio.get_running_loop().create_task(_settle(awaitable))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- cancelling, attributes ----------------------------------------------------------------------
    async def cancel(self, env_ids: Iterable[int]) -> None:
        """Stop waiting for these sub-envs' ops, and ask their shards to stop them (not awaited)."""
        held, self._held = self._held, []
        if held:  # the caller's thread waits in run_sync: the held calls are the loop's to follow now
            self._launch(held, [])
        by_handle: dict[int, tuple[Handle, list[tuple[int, int]]]] = {}
        for i in env_ids:
            call = self._in_flight.pop(i, None)
            if call is None:
                continue
            req = next(op.req_id for op in call.ops if op.env_id == i)
            by_handle.setdefault(id(call.handle), (call.handle, []))[1].append((i, req))
        for handle, requests in by_handle.values():
            # Ops are matched by request id in the shard, so a cancel overtaken by the sub-env's
            # next op never cancels that op.
            handle.cancel(requests)

    async def _gather(self, coros: list[Any]) -> list[Any]:
        limit = None if self.step_timeout is None else self.step_timeout + HUNG_GRACE
        try:
            async with asyncio.timeout(limit):
                return await asyncio.gather(*coros)
        except TimeoutError:
            raise BackendTimeout(f"the shards did not answer within step_timeout={self.step_timeout} s "
                                 f"+ {HUNG_GRACE} s") from None

    async def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        """Call (or read) ``name`` on every sub-env's session; one value per sub-env, in id order."""
        outs = await self._gather([h.call(name, args, kwargs) for h in self.handles])
        values: list[Any] = [None] * self.num_envs
        for ids, out in zip(self.layout, outs):
            for i, value in zip(ids, out):
                values[i] = value
        return values

    async def call_one(self, env_id: int, name: str, args: tuple, kwargs: dict) -> Any:
        """Call (or read) ``name`` on one sub-env's session."""
        (value,) = await self._gather([self.handles[self._where[env_id]].call(name, args, kwargs, [env_id])])
        return value[0]

    async def set_attr(self, name: str, values: Sequence[Any]) -> None:
        """Set ``name`` on every sub-env's session (``values`` in id order)."""
        await self._gather([h.set_attr(name, [values[i] for i in ids]) for h, ids in zip(self.handles, self.layout)])

    # -- close ---------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Cancel every call, close every shard (no process or actor is left). Idempotent."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._held = []
        tasks = [c.task for c in self._calls if c.task is not None]
        tasks += [*self._starts.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._calls.clear()
        self._in_flight.clear()
        handles, self.handles = self.handles, []
        await asyncio.gather(*(h.close(_CLOSE_TIMEOUT) for h in handles), return_exceptions=True)
        await asyncio.gather(*list(self._background), return_exceptions=True)  # replaced shards' reaping

    def release(self) -> None:
        """Release what outlives the shards (Ray's runtime), from the closing thread; once."""
        hook, self._release_hook = self._release_hook, None
        if hook is not None:
            hook()


async def _settle(awaitable: Any) -> None:
    """Await something whose value nobody needs (its failure shows on the next call)."""
    try:
        await awaitable
    except Exception:
        pass
