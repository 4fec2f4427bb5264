"""SessionPool: the episodes of every environment instance of one env id, over a few shared adapters.

TRL builds one environment instance per rollout slot (``EnvSpec.environment_factory``), hundreds
in a large run. Each instance holds a *slot* of this pool, not an env of its own: the slots'
sessions share the id's adapters, ``envs_per_client`` sessions per adapter, so a local source
runs one server however many slots there are, and nothing here starts a thread. This module is
the only place :mod:`openenv_gym.trl` touches the session machinery; what it asks of it is small
(start, the tools, the task counts, and per slot reset, step and release) so that it can move to
the package's shard when that is the one way to own sessions (docs/architecture.md).

Two kinds of slot storage, one request shape (:class:`~openenv_gym.vector.ops.Op` in,
:class:`~openenv_gym.vector.ops.Result` out, run by :func:`~openenv_gym.vector.ops.run_op`, the
function every vector env runs its sub-envs' requests through):

* in this process: one :class:`~openenv_gym.session.EnvSession` per slot on the runtime loop, as
  :class:`~openenv_gym.vector.concurrent.ConcurrentVectorEnv` holds its sub-envs;
* in host processes (``python=``, ``isolate=True``, isolated catalog entries): slots in blocks of
  ``slots_per_host``, each block one :class:`~openenv_gym.hosts.shard.EnvHost` in a host process
  under that interpreter, as :class:`~openenv_gym.vector.processes.ProcessVectorEnv` shards its
  sub-envs. A host that dies fails only its slots' requests in flight and is replaced at the next
  request; the slots' episodes are lost (their next step is an error, their next reset works).

Async at the core, sync at the edges: the public methods block on the runtime loop through
:func:`~openenv_gym.runtime.run_sync`, from any number of threads at once (TRL's tool threads);
each slot serves one caller at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from openenv_gym import runtime
from openenv_gym.actions import parse_action
from openenv_gym.adapters.base import Adapter, AdapterSpec
from openenv_gym.errors import BackendTimeout, ConcurrentUse, HostDied, RuntimeClosed, from_wire
from openenv_gym.hosts.interpreter import Interpreter
from openenv_gym.session import STEP_TIMEOUT, EnvSession
from openenv_gym.vector.ops import Op, Result, encode_ops, error_dict, failed, run_op
from openenv_gym.wire import Message, ToolSpec

__all__ = ["SessionPool", "StepResult"]

StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]

ENVS_PER_CLIENT = 8
"""Slots per adapter (each adapter keeps a small connection pool), as in the vector envs."""
SLOTS_PER_HOST = 32
"""Slots per host process, as :data:`openenv_gym.vector.processes.ENVS_PER_HOST`."""
_CLOSE_TIMEOUT = 30.0
_TIMEOUT_MARGIN = 30.0


class SessionPool:
    """Episodes of one id for many slots, over shared adapters (in this process or in hosts).

    Args:
        adapter: the recipe of the id's adapter (several are built, each shared by many slots).
        python: run the adapters in host processes under this interpreter (a path, or an
            :class:`~openenv_gym.hosts.interpreter.Interpreter` for ``isolate=True``); ``None``:
            in this process.
        max_turns: truncate each episode after this many agent actions.
        step_timeout: bound on one reset or step (``None``: none), as for every env.
    """

    def __init__(self, adapter: AdapterSpec, *, python: str | Interpreter | None = None,
                 max_turns: int | None = None, step_timeout: float | None = STEP_TIMEOUT,
                 envs_per_client: int = ENVS_PER_CLIENT, slots_per_host: int = SLOTS_PER_HOST):
        self.adapter_spec = adapter
        self.step_timeout = step_timeout
        if python is None:
            self._store: _Store = _Local(adapter, max_turns, step_timeout, envs_per_client)
        else:
            self._store = _Hosted(adapter, python, max_turns, step_timeout, envs_per_client, slots_per_host)
        self._lock = threading.Lock()
        self._free: list[int] = []
        self._next_slot = 0
        self._busy: set[int] = set()
        self._requests: dict[int, int] = {}
        self._broken: set[int] = set()
        self.tools: list[ToolSpec] = []
        self.closed = False
        self._started = False

    @property
    def hosted(self) -> bool:
        """Whether the adapters run in host processes."""
        return isinstance(self._store, _Hosted)

    # -- sync edges --------------------------------------------------------------------------------
    def start(self) -> list[ToolSpec]:
        """Start the first adapter (a local source launches its server here); the tools every task
        offers. Idempotent."""
        if not self._started:
            runtime.track(self)
            try:
                self.tools = runtime.run_sync(self._store.start())
            except BaseException:
                self.close()
                raise
            self._started = True
        return self.tools

    def num_tasks(self, split: str) -> int:
        """How many tasks ``split`` has (the adapter caches it)."""
        return runtime.run_sync(self._store.call("num_tasks", split), self.step_timeout,
                                what="num_tasks()")

    def splits(self) -> list[Any]:
        """The env's splits."""
        return runtime.run_sync(self._store.call("splits"), self.step_timeout, what="splits()")

    def open(self) -> int:
        """A free slot (the lowest): its session is made at its first reset."""
        with self._lock:
            if self.closed:
                raise RuntimeClosed("this environment pool is closed")
            if self._free:
                self._free.sort()
                return self._free.pop(0)
            slot, self._next_slot = self._next_slot, self._next_slot + 1
            return slot

    def release(self, slot: int) -> None:
        """Give ``slot`` back: its episode ends (soon, on the loop) and another instance may take it.
        Safe from any thread and at interpreter exit; never raises."""
        with self._lock:
            if self.closed or slot in self._free:
                return
            self._free.append(slot)
            self._requests.pop(slot, None)
            self._broken.discard(slot)
        with contextlib.suppress(RuntimeClosed, RuntimeError):
            runtime.post(self._store.release_soon, slot)

    def reset(self, slot: int, split: str, index: int) -> tuple[list[Message], dict[str, Any]]:
        """Start task ``index`` of ``split`` in ``slot`` (ending the slot's running episode).

        A slot whose backend failed is recreated first; a failed reset is tried once more on a
        recreated session (a local server that died is relaunched then), then raises the typed
        error (:mod:`openenv_gym.errors`).
        """
        with self._one_caller(slot):
            result = self._request(slot, "reset", options={"split": split, "index": int(index)})
            if result.error is not None and not result.error.get("user"):
                result = self._request(slot, "reset", options={"split": split, "index": int(index)})
            if result.error is not None:
                raise from_wire(result.error)
            return list(result.obs), dict(result.info)

    def step(self, slot: int, action: Any) -> StepResult:
        """Apply one assistant message (str or OpenAI message dict) in ``slot``'s episode.

        The agent's mistakes come back as messages, as in every env; a backend failure raises its
        typed error and the episode is lost (the slot is recreated at its next reset).
        """
        turn = parse_action(action)  # InvalidAction for what is not an action at all
        with self._one_caller(slot):
            result = self._request(slot, "step", turn=turn)
            if result.error is not None:
                raise from_wire(result.error)
            return list(result.obs), float(result.reward), bool(result.terminated), bool(result.truncated), \
                dict(result.info)

    def close(self) -> None:
        """End every episode, close the adapters (stopping their servers) and hosts. Idempotent,
        bounded, never raises."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        runtime.untrack(self)
        with contextlib.suppress(Exception):
            runtime.run_sync(self._store.aclose(), _CLOSE_TIMEOUT + 30.0)

    def __del__(self) -> None:
        # Forgotten (never closed, no longer reachable): close without waiting, as AgentEnv does.
        if getattr(self, "_started", False) and not self.closed:
            self.closed = True
            runtime.untrack(self)
            runtime.close_later(self._store.aclose())

    # -- internals ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _one_caller(self, slot: int) -> Any:
        with self._lock:
            if self.closed:
                raise RuntimeClosed("this environment pool is closed")
            if slot in self._busy:
                raise ConcurrentUse("this environment instance is already running a call in another thread")
            self._busy.add(slot)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(slot)

    def _request(self, slot: int, kind: str, **fields: Any) -> Result:
        with self._lock:
            req = self._requests.get(slot, 0) + 1
            self._requests[slot] = req
            recreate = kind == "reset" and slot in self._broken
        op = Op(slot, req, kind, recreate=recreate, **fields)
        try:
            result = runtime.run_sync(self._store.run(op))
        except BaseException:  # interrupted (Ctrl-C): the episode's state is unknown
            with self._lock:
                self._broken.add(slot)
            raise
        with self._lock:
            if result.error is not None:
                self._broken.add(slot)
            elif kind == "reset":
                self._broken.discard(slot)
        return result


async def _once(starting: dict[int, asyncio.Task[Any]], key: int,
                start: Callable[[int], Coroutine[Any, Any, Any]]) -> Any:
    """What ``start(key)`` returns, started once and awaited by every caller (a cancelled caller
    does not cancel it); a start that failed or was cancelled is made again by the next caller."""
    task = starting.get(key)
    if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
        task = starting[key] = asyncio.get_running_loop().create_task(start(key))
    return await asyncio.shield(task)


async def _cancel(tasks: dict[int, asyncio.Task[Any]]) -> None:
    """Cancel the starts still running, and wait for them to end."""
    running = [t for t in tasks.values() if not t.done()]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


class _Store:
    """Where the slots' sessions live. Every coroutine runs on the runtime loop."""

    async def start(self) -> list[ToolSpec]:
        raise NotImplementedError

    async def call(self, name: str, *args: Any) -> Any:
        """The task API (``num_tasks``, ``splits``) of the first adapter."""
        raise NotImplementedError

    async def run(self, op: Op) -> Result:
        """Run ``op`` for its slot; never raises for a backend failure (the result carries it)."""
        raise NotImplementedError

    def release_soon(self, slot: int) -> None:
        """End ``slot``'s episode without waiting (called on the loop)."""

    async def aclose(self) -> None:
        raise NotImplementedError


class _Local(_Store):
    """Slots as :class:`EnvSession` s on the runtime loop, ``per_client`` to an adapter."""

    def __init__(self, spec: AdapterSpec, max_turns: int | None, step_timeout: float | None, per_client: int):
        self._spec, self._max_turns, self._step_timeout = spec, max_turns, step_timeout
        self._per_client = max(1, per_client)
        self._adapters: dict[int, Adapter] = {}
        self._starting: dict[int, asyncio.Task[Adapter]] = {}
        self._sessions: dict[int, EnvSession] = {}
        self._deadlines = runtime.Deadlines()  # every op's step_timeout, one timer
        self._closing: set[asyncio.Task[Any]] = set()
        self._closed = False

    async def _adapter(self, k: int) -> Adapter:
        adapter = self._adapters.get(k)
        if adapter is not None:
            return adapter
        if k:  # the first adapter starts alone: a local source launches its server once, the rest share it
            await self._adapter(0)
        return await _once(self._starting, k, self._start_one)

    async def _start_one(self, k: int) -> Adapter:
        if self._closed:
            raise RuntimeClosed("this environment pool is closed")
        adapter = self._spec.build()
        try:
            await adapter.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await adapter.aclose()
            raise
        if self._closed:
            await adapter.aclose()
            raise RuntimeClosed("this environment pool is closed")
        self._adapters[k] = adapter
        return adapter

    async def start(self) -> list[ToolSpec]:
        return list(await (await self._adapter(0)).tools())

    async def call(self, name: str, *args: Any) -> Any:
        return await getattr(await self._adapter(0), name)(*args)

    async def run(self, op: Op) -> Result:
        try:
            session = self._sessions.get(op.env_id)
            if session is None or op.recreate:
                adapter = await self._adapter(op.env_id // self._per_client)
                old, session = session, EnvSession(adapter, max_turns=self._max_turns)
                self._sessions[op.env_id] = session
                if old is not None:
                    with contextlib.suppress(Exception):  # the old episode's backend is what failed
                        await runtime.within(old.aclose(), self._step_timeout, "closing the failed episode")
        except Exception as exc:  # the adapter did not start: this request fails, the next tries again
            return failed(op, error_dict(exc))
        return await run_op(session, op, self._step_timeout, None, self._deadlines)

    def release_soon(self, slot: int) -> None:
        session = self._sessions.pop(slot, None)
        if session is not None:
            task = asyncio.get_running_loop().create_task(self._end(session))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _end(self, session: EnvSession) -> None:
        with contextlib.suppress(Exception):
            await runtime.within(session.aclose(), self._step_timeout, "closing the episode")

    async def aclose(self) -> None:
        self._closed = True
        await _cancel(self._starting)
        await asyncio.gather(*self._closing, return_exceptions=True)
        self._deadlines.cancel()
        sessions, self._sessions = list(self._sessions.values()), {}
        adapters, self._adapters = list(self._adapters.values()), {}
        await asyncio.gather(*(s.aclose() for s in sessions), return_exceptions=True)
        await asyncio.gather(*(a.aclose() for a in adapters), return_exceptions=True)


class _Hosted(_Store):
    """Slots in blocks of ``per_host``, each block a shard in a host process under ``python``.

    The hosts are started as slots need them; a dead or hung host is replaced at the next request
    to its block, and the replacement knows its slots' episodes were lost. A host's shard has no
    request that ends one session's episode, so a released slot's episode ends at the slot's next
    reset or when the pool closes.
    """

    def __init__(self, spec: AdapterSpec, python: str | Interpreter, max_turns: int | None,
                 step_timeout: float | None, per_client: int, per_host: int):
        accepts = spec.accepted_here()
        if "server_workers" not in spec.kwargs and accepts is not None and "server_workers" in accepts:
            # As ProcessVectorEnv does: the hosts already spread the slots over the cores.
            spec = AdapterSpec(spec.entry, {**spec.kwargs, "server_workers": 1})
        self._spec, self._python = spec, python
        self._max_turns, self._step_timeout = max_turns, step_timeout
        self._per_client, self._per_host = max(1, per_client), max(1, per_host)
        self._call_timeout = None if step_timeout is None else 3 * step_timeout + _TIMEOUT_MARGIN
        self._handles: dict[int, Any] = {}
        self._starting: dict[int, asyncio.Task[Any]] = {}
        self._dead: set[int] = set()  # blocks whose host died: the next one is told so
        self._resolved: str | None = None
        self._tools: list[ToolSpec] = []
        self._closed = False

    async def _handle(self, block: int) -> Any:
        handle = self._handles.get(block)
        if handle is not None:
            return handle
        return await _once(self._starting, block, self._start_host)

    async def _start_host(self, block: int) -> Any:
        from openenv_gym.hosts.process import ProcessHandle
        from openenv_gym.vector.hosted import START_TIMEOUT

        if self._closed:
            raise RuntimeClosed("this environment pool is closed")
        if self._resolved is None:
            python = self._python
            # Building an isolated venv takes minutes the first time: not on the loop.
            self._resolved = await asyncio.to_thread(python.resolve) if isinstance(python, Interpreter) else str(python)
        spec = self._spec
        handle = ProcessHandle(self._resolved, {
            "entry": spec.entry, "adapter_kwargs": dict(spec.kwargs),
            "env_ids": list(range(block * self._per_host, (block + 1) * self._per_host)),
            "split": None, "max_turns": self._max_turns, "envs_per_client": self._per_client,
            "step_timeout": self._step_timeout, "replaced": block in self._dead, "env_wrappers": None,
        })
        try:
            async with asyncio.timeout(START_TIMEOUT):
                tools = await handle.start()
        except BaseException as exc:
            await handle.close(1.0)
            if isinstance(exc, TimeoutError):
                raise BackendTimeout(f"the host process did not start within {START_TIMEOUT} s") from None
            raise
        if self._closed:
            await handle.close(1.0)
            raise RuntimeClosed("this environment pool is closed")
        self._dead.discard(block)
        self._handles[block] = handle
        self._tools = tools
        return handle

    async def start(self) -> list[ToolSpec]:
        await self._handle(0)
        return list(self._tools)

    async def call(self, name: str, *args: Any) -> Any:
        values = await (await self._handle(0)).call(name, args, {})
        return values[0]

    async def run(self, op: Op) -> Result:
        block = op.env_id // self._per_host
        try:
            handle = await self._handle(block)
        except Exception as exc:
            return failed(op, error_dict(exc))
        results: list[Result] = []
        try:
            if self._call_timeout is None:
                await handle.run(encode_ops([op]), results.append)
            else:
                async with asyncio.timeout(self._call_timeout):
                    await handle.run(encode_ops([op]), results.append)
        except asyncio.CancelledError:
            handle.cancel([(op.env_id, op.req_id)])  # the host stops the op too
            raise
        except HostDied as exc:
            self._lost(block, handle)
            return failed(op, error_dict(exc, f"the host process of this environment died: {exc}"))
        except TimeoutError:
            self._lost(block, handle)
            return failed(op, {"type": "BackendTimeout",
                               "message": f"the host process did not answer within {self._call_timeout} s; "
                                          "it was replaced"})
        except Exception as exc:  # the host's own code failed (its adapters did not start)
            return failed(op, error_dict(exc))
        return results[0] if results else failed(op, {"type": "HostDied", "message": "the host answered no result"})

    def _lost(self, block: int, handle: Any) -> None:
        if self._handles.get(block) is handle:
            del self._handles[block]
            self._starting.pop(block, None)  # its (finished) start would hand the dead host out again
            self._dead.add(block)
            handle.kill()
            task = asyncio.get_running_loop().create_task(handle.close(1.0))  # reaps it
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def aclose(self) -> None:
        self._closed = True
        await _cancel(self._starting)
        handles, self._handles = list(self._handles.values()), {}
        await asyncio.gather(*(h.close(_CLOSE_TIMEOUT) for h in handles), return_exceptions=True)
