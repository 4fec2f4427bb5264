"""The one background event loop of a process, and closing what was left open at exit.

openenv_gym is async at the core and sync at the edges: adapters are coroutines, while
``gymnasium.Env.step`` is a plain method. Every sync edge reaches the async core through
:meth:`Runtime.run_sync`, which submits the coroutine to a single daemon thread running an asyncio
loop. Keeping one loop per process means connection pools, server sessions and keep-alive tasks
live in one place and survive across calls. The loop is recreated after ``fork`` (a child must not
reuse its parent's thread-bound loop).

Closing at exit: envs and vector envs register themselves with :meth:`Runtime.track`. An
``atexit`` hook closes every one still open (a forgotten ``close()``, a script ended by an
exception or Ctrl-C) within :data:`EXIT_BUDGET` seconds in all, then stops the loop. ``__del__``
cannot do this job: during interpreter finalisation the loop's daemon thread is frozen, and
waiting on it, or starting a new one, hangs forever. Once the hook has run, the loop refuses to
start again.

All of that state has one owner, a :class:`Runtime`; the process's own is :data:`RUNTIME`, which
the module-level functions of :mod:`openenv_gym.runtime` use. A test builds a fresh
:class:`Runtime` to exercise start, exit and fork without touching the process's.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from openenv_gym.errors import BackendTimeout, RuntimeClosed
from openenv_gym.runtime.worker import DaemonExecutor

__all__ = ["Runtime", "RUNTIME", "EXIT_BUDGET", "CANCEL_GRACE", "WAIT_SLICE", "timed_out"]

T = TypeVar("T")

EXIT_BUDGET = 5.0
"""Seconds the exit hook may spend closing envs that were never closed, all of them together."""
CANCEL_GRACE = 5.0
"""Seconds an interrupted call's coroutine is given to finish cancelling."""
WAIT_SLICE = 0.1
"""Seconds a blocked caller waits at a time, so Ctrl-C is seen promptly."""


class _Closable(Protocol):
    def close(self) -> None: ...


def timed_out(budget: float | None, timeout: float | None, what: str | None, limit: str) -> BackendTimeout:
    """The error for a blocking call whose wait ran out: the exit budget's, or the named limit's."""
    if budget != timeout:
        return BackendTimeout(f"stopped waiting at interpreter exit (exit budget {EXIT_BUDGET} s)")
    if what is not None:
        return BackendTimeout(f"{what} did not finish within {limit}={timeout} s")
    return BackendTimeout(f"operation did not finish within {timeout} s")


def quiet_about_pending_tasks(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A loop exception handler that drops "Task was destroyed but it is pending!": set on a loop
    that is being shut down, whose unfinished tasks are collected with it (noise, not news)."""
    if "was destroyed but it is pending" not in str(context.get("message", "")):
        loop.default_exception_handler(context)


class _Signal:
    """A one-shot flag set on the loop and awaited by one thread: a bare lock, the cheapest wake-up.

    ``threading.Event`` builds a Condition and a waiter lock per wait; a step of a single env
    waits once, so that cost is paid on every step.
    """

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:  # only ever called on the loop thread
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None) -> bool:
        if self._set:
            return True
        if self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            self._lock.release()  # later waits (the cancel grace) return at once
        return self._set


def _wait(done: _Signal, limit: float | None) -> bool:
    """``done.wait(limit)`` in short slices, so Ctrl-C is seen within one slice.

    A SIGINT may be delivered to any thread (the loop's, say); the main thread then runs Python's
    handler only when it next executes bytecode, which a single long wait would put off until
    the step ends.
    """
    deadline = None if limit is None else time.monotonic() + limit
    while True:
        slice_ = WAIT_SLICE if deadline is None else min(WAIT_SLICE, deadline - time.monotonic())
        if slice_ <= 0:
            return done.is_set()
        if done.wait(slice_):
            return True


class Runtime:
    """A process's background event loop, its thread, and the envs to close at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._exit_deadline: float | None = None  # monotonic time; set while (and after) the exit hook runs
        self._live: dict[int, weakref.ref[Any]] = {}
        self._loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
        self._end: asyncio.Future[None] | None = None  # set by the exit hook: the loop's main task ends
        self._main: asyncio.Task[None] | None = None

    def use_loop_factory(self, factory: Callable[[], asyncio.AbstractEventLoop]) -> bool:
        """Build the runtime loop with ``factory`` (uvloop's, for a process that is a server);
        only before the loop starts. Returns ``False`` (and changes nothing) once it runs."""
        with self._lock:
            if self._loop is not None and self._pid == os.getpid() and self._thread is not None \
                    and self._thread.is_alive():
                return False
            self._loop_factory = factory
            return True

    # -- the loop ------------------------------------------------------------------------------------
    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event, main: asyncio.Task[None]) -> None:
        # The loop runs one main task until the exit hook ends it, as asyncio.run runs one:
        # libraries look for that task (anyio hands its worker threads' lifetime to it, and without
        # one it scans every task of the loop on every call to a thread: with 64 idle sessions of an
        # MCP env, 100 us more per tool call).
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        with contextlib.suppress(BaseException):
            loop.run_until_complete(main)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        """The runtime loop, its thread started on first use (and anew in a forked child).

        Raises :class:`RuntimeClosed` once the exit hook has stopped the loop: a thread started
        during interpreter finalisation never runs, so waiting on it would hang.
        """
        loop, thread = self._loop, self._thread
        if loop is not None and self._pid == os.getpid() and thread is not None and thread.is_alive():
            return loop
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                if self._exit_deadline is not None and self._pid == os.getpid():
                    raise RuntimeClosed("the openenv_gym runtime was stopped at interpreter exit")
                loop = self._loop_factory()
                # to_thread's pool, of daemon threads: a blocking call that never returns (a
                # library's, on this loop) must not hold up the interpreter's exit
                loop.set_default_executor(DaemonExecutor(thread_name_prefix="openenv-gym-blocking"))
                ready = threading.Event()
                self._end = loop.create_future()
                self._main = loop.create_task(_until(self._end), name="openenv-gym-runtime-main")
                thread = threading.Thread(target=self._serve, args=(loop, ready, self._main),
                                          name="openenv-gym-runtime", daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread, self._pid = loop, thread, os.getpid()
                self._exit_deadline = None  # a forked child starts with its own budget
        assert self._loop is not None
        return self._loop

    def in_runtime_thread(self) -> bool:
        """True on the runtime loop's own thread (where blocking on it would deadlock)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def bounded(self, timeout: float | None) -> float | None:
        """``timeout``, cut to what is left of the exit budget while the exit hook runs."""
        if self._exit_deadline is None:
            return timeout
        left = max(0.0, self._exit_deadline - time.monotonic())
        return left if timeout is None else min(timeout, left)

    def post(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run ``callback(*args)`` on the loop soon, without waiting (callbacks keep their order)."""
        try:
            loop = self.get_loop()
            if self.in_runtime_thread():  # already on the loop (a served session): no self-pipe wake-up
                loop.call_soon(callback, *args)
            else:
                loop.call_soon_threadsafe(callback, *args)
        except RuntimeError as exc:  # closed between get_loop() and the call: the runtime is stopping
            raise RuntimeClosed(f"the runtime loop is stopping ({exc})") from None

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; a thread-safe future of its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.get_loop())

    async def on_runtime(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the runtime loop from any event loop (clients are bound to that loop)."""
        if asyncio.get_running_loop() is self.get_loop():
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    # -- blocking calls ------------------------------------------------------------------------------
    def run_sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *, what: str | None = None,
                 limit: str = "step_timeout") -> T:
        """Run ``coro`` on the loop and block until it finishes.

        Args:
            coro: the coroutine to run.
            timeout: seconds to wait; on expiry the coroutine is cancelled and
                :class:`~openenv_gym.errors.BackendTimeout` is raised, so a sync caller never hangs.
            what, limit: name the operation and the limit in that error (``"step did not finish
                within step_timeout=0.5 s"``); the caller's thread keeps the time, so a step costs
                no timer on the loop.

        Any interruption of the wait (``KeyboardInterrupt``, ``SystemExit``, the timeout) cancels
        the coroutine and waits up to a few seconds for the cancellation to run through it, so no
        work goes on behind the caller's back: an interrupted ``recv`` leaves no waiter that would
        consume later results, and an interrupted ``make`` leaves no server starting.
        """
        if self.in_runtime_thread():
            coro.close()
            raise RuntimeError("run_sync() called from the runtime loop; await the coroutine instead")
        try:
            loop = self.get_loop()
        except RuntimeClosed:
            coro.close()
            raise
        done = _Signal()
        box: list[asyncio.Task[T]] = []

        def start() -> None:
            task = loop.create_task(coro)
            task.add_done_callback(lambda _: done.set())
            box.append(task)

        loop.call_soon_threadsafe(start)
        budget = self.bounded(timeout)
        try:
            finished = _wait(done, budget)
        except BaseException:
            self._cancel(loop, box, done)
            raise
        if not finished:
            self._cancel(loop, box, done)
            raise timed_out(budget, timeout, what, limit)
        task = box[0]
        if task.cancelled():  # cancelled on the loop by someone else (the loop is stopping)
            raise RuntimeClosed("the operation was cancelled because the runtime loop is stopping")
        return task.result()

    def _cancel(self, loop: asyncio.AbstractEventLoop, box: list[asyncio.Task[Any]], done: _Signal) -> None:
        """Cancel the task ``run_sync`` started and give it a moment to unwind its ``finally`` blocks."""
        def cancel() -> None:
            if box:  # ``start`` was scheduled first, so it has run unless the loop stopped
                box[0].cancel()
            else:
                done.set()

        try:
            loop.call_soon_threadsafe(cancel)
        except RuntimeError:  # the loop is closed: nothing runs any more
            return
        done.wait(self.bounded(CANCEL_GRACE))

    # -- closing at exit -----------------------------------------------------------------------------
    def track(self, obj: _Closable) -> None:
        """Close ``obj`` at interpreter exit if it is still open then (held by a weak reference).

        The hook is re-registered on every call so it runs before ``atexit`` hooks registered
        earlier, such as Ray's ``shutdown``: an env must close while its backend still exists.
        """
        key = id(obj)
        def forget(_: weakref.ref[Any], key: int = key) -> None:
            self._live.pop(key, None)

        self._live[key] = weakref.ref(obj, forget)
        atexit.unregister(self.close_at_exit)
        atexit.register(self.close_at_exit)

    def untrack(self, obj: _Closable) -> None:
        """Forget ``obj`` (it was closed)."""
        self._live.pop(id(obj), None)

    def close_at_exit(self) -> None:
        """Close what is still tracked, within :data:`EXIT_BUDGET` s, then stop the loop."""
        self._exit_deadline = time.monotonic() + EXIT_BUDGET
        for ref in list(self._live.values()):
            obj = ref()
            if obj is None:
                continue
            try:
                obj.close()
            except BaseException:  # noqa: BLE001 - exit must go on whatever one env does
                pass
        self._live.clear()
        with self._lock:
            loop, thread, end, main = self._loop, self._thread, self._end, self._main
        if loop is None or end is None or thread is None or not thread.is_alive() or self._pid != os.getpid():
            return
        grace = max(0.1, min(1.0, self._exit_deadline - time.monotonic()))

        async def wind_down() -> None:
            # What is still running (an interrupted call still unwinding) is cancelled and given a
            # moment, as asyncio.run does, before the loop stops under it; a task that outlives the
            # grace is collected with the loop, silently.
            loop.set_exception_handler(quiet_about_pending_tasks)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and t is not main]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=grace)
            if not end.done():
                end.set_result(None)  # the main task ends, and the loop stops after it

        try:
            asyncio.run_coroutine_threadsafe(wind_down(), loop)
        except RuntimeError:  # the loop closed meanwhile
            return
        thread.join(grace + 0.5)

    def close_later(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a closing coroutine on the loop without waiting for it (for ``__del__``).

        Safe from any thread, the loop's own included; does nothing once the loop is stopped or the
        interpreter is finalising (then the exit hook has closed, or will close, what is left).
        """
        loop = self._loop
        if loop is None or self._exit_deadline is not None or self._pid != os.getpid() or loop.is_closed():
            coro.close()
            return
        try:
            asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:
            coro.close()


async def _until(end: asyncio.Future[None]) -> None:
    """The runtime loop's main task: it lasts until ``end`` is set."""
    await end


RUNTIME = Runtime()
"""This process's runtime."""
