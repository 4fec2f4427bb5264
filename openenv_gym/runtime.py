"""The one background event loop of a process, the one retry helper, and closing at exit.

openenv_gym is async at the core and sync at the edges: adapters are coroutines, while
``gymnasium.Env.step`` is a plain method. Every sync edge reaches the async core through
:func:`run_sync`, which submits the coroutine to a single daemon thread running an asyncio loop.
Keeping one loop per process means connection pools, server sessions and keep-alive tasks live in
one place and survive across calls; nothing else in the package starts an event loop.

The loop is recreated after ``fork`` (a child must not reuse its parent's thread-bound loop).

Closing at exit: envs and vector envs register themselves with :func:`track`. An ``atexit`` hook
closes every one still open (a forgotten ``close()``, a script ended by an exception or Ctrl-C)
within :data:`EXIT_BUDGET` seconds in all, then stops the loop. ``__del__`` cannot do this job:
during interpreter finalisation the loop's daemon thread is frozen, and waiting on it, or starting
a new one, hangs forever. Once the hook has run, the loop refuses to start again.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import concurrent.futures
import os
import random
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from openenv_gym.errors import BackendTimeout, RuntimeClosed

__all__ = [
    "get_loop", "run_sync", "submit", "on_runtime", "retry", "Backoff", "track", "untrack",
    "RuntimeClosed", "EXIT_BUDGET", "within", "close_later",
]

T = TypeVar("T")

EXIT_BUDGET = 5.0
"""Seconds the exit hook may spend closing envs that were never closed, all of them together."""
_CANCEL_GRACE = 5.0
_WAIT_SLICE = 0.1
"""Seconds :func:`run_sync` waits for an interrupted coroutine to finish cancelling."""

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid: int | None = None
_exit_deadline: float | None = None  # monotonic time; set while (and after) the exit hook runs


class _Closable(Protocol):
    def close(self) -> None: ...


_live: dict[int, weakref.ref[Any]] = {}


def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    loop.run_forever()


def get_loop() -> asyncio.AbstractEventLoop:
    """Return the process-wide runtime loop, starting its thread on first use.

    Raises :class:`RuntimeClosed` once the exit hook has stopped the loop: a thread started
    during interpreter finalisation never runs, so waiting on it would hang.
    """
    global _loop, _thread, _pid
    if _loop is not None and _pid == os.getpid() and _thread is not None and _thread.is_alive():
        return _loop
    with _lock:
        if _loop is None or _pid != os.getpid() or _thread is None or not _thread.is_alive():
            if _exit_deadline is not None and _pid == os.getpid():
                raise RuntimeClosed("the openenv_gym runtime was stopped at interpreter exit")
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(
                target=_serve, args=(loop, ready), name="openenv-gym-runtime", daemon=True
            )
            thread.start()
            ready.wait()
            _loop, _thread, _pid = loop, thread, os.getpid()
    return _loop


def track(obj: _Closable) -> None:
    """Close ``obj`` at interpreter exit if it is still open then (held by a weak reference).

    The hook is re-registered on every call so it runs before ``atexit`` hooks registered
    earlier, such as Ray's ``shutdown``: an env must close while its backend still exists.
    """
    _live[id(obj)] = weakref.ref(obj, lambda _, key=id(obj): _live.pop(key, None))
    atexit.unregister(_close_at_exit)
    atexit.register(_close_at_exit)


def untrack(obj: _Closable) -> None:
    """Forget ``obj`` (it was closed)."""
    _live.pop(id(obj), None)


def _close_at_exit() -> None:
    global _exit_deadline
    _exit_deadline = time.monotonic() + EXIT_BUDGET
    for ref in list(_live.values()):
        obj = ref()
        if obj is None:
            continue
        try:
            obj.close()
        except BaseException:  # noqa: BLE001 - exit must go on whatever one env does
            pass
    _live.clear()
    with _lock:
        loop, thread = _loop, _thread
    if loop is not None and thread is not None and thread.is_alive() and _pid == os.getpid():
        grace = max(0.1, min(1.0, _exit_deadline - time.monotonic()))

        async def wind_down() -> None:
            # What is still running (an interrupted call still unwinding) is cancelled and given a
            # moment, as asyncio.run does, before the loop stops under it.
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=grace)
            loop.stop()

        try:
            asyncio.run_coroutine_threadsafe(wind_down(), loop)
        except RuntimeError:  # the loop closed meanwhile
            return
        thread.join(grace + 0.5)
        # A task that outlived the grace would print "Task was destroyed but it is pending!" when
        # the interpreter collects it: at exit that is noise, not news.
        with contextlib.suppress(RuntimeError):  # the set changed while we read it: give up quietly
            for task in asyncio.all_tasks(loop):
                task._log_destroy_pending = False


def close_later(coro: Coroutine[Any, Any, Any]) -> None:
    """Run a closing coroutine on the loop without waiting for it (for ``__del__``).

    Safe from any thread, the loop's own included; does nothing once the loop is stopped or the
    interpreter is finalising (then the exit hook has closed, or will close, what is left).
    """
    loop = _loop
    if loop is None or _exit_deadline is not None or _pid != os.getpid() or loop.is_closed():
        coro.close()
        return
    try:
        asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:
        coro.close()


def _bounded(timeout: float | None) -> float | None:
    """``timeout``, cut to what is left of the exit budget while the exit hook runs."""
    if _exit_deadline is None:
        return timeout
    left = max(0.0, _exit_deadline - time.monotonic())
    return left if timeout is None else min(timeout, left)


def in_runtime_thread() -> bool:
    """True when called from the runtime loop's own thread (where blocking on it would deadlock)."""
    return _thread is not None and threading.current_thread() is _thread


def post(callback: Callable[..., Any], *args: Any) -> None:
    """Run ``callback(*args)`` on the runtime loop soon, without waiting (callbacks keep their order)."""
    try:
        get_loop().call_soon_threadsafe(callback, *args)
    except RuntimeError as exc:  # closed between get_loop() and the call: the runtime is stopping
        raise RuntimeClosed(f"the runtime loop is stopping ({exc})") from None


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Schedule ``coro`` on the runtime loop and return a thread-safe future."""
    return asyncio.run_coroutine_threadsafe(coro, get_loop())


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None, *, what: str | None = None,
             limit: str = "step_timeout") -> T:
    """Run ``coro`` on the runtime loop and block until it finishes.

    Args:
        coro: the coroutine to run.
        timeout: seconds to wait; on expiry the coroutine is cancelled and
            :class:`~openenv_gym.errors.BackendTimeout` is raised, so a sync caller never hangs.
        what, limit: name the operation and the limit in that error (``"step did not finish
            within step_timeout=0.5 s"``), as :func:`within` does; the caller's thread keeps the
            time, so a step costs no timer on the loop.

    Any interruption of the wait (``KeyboardInterrupt``, ``SystemExit``, the timeout) cancels the
    coroutine and waits up to a few seconds for the cancellation to run through it, so no work
    goes on behind the caller's back: an interrupted ``recv`` leaves no waiter that would consume
    later results, and an interrupted ``make`` leaves no server starting.
    """
    if in_runtime_thread():
        coro.close()
        raise RuntimeError("run_sync() called from the runtime loop; await the coroutine instead")
    try:
        loop = get_loop()
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
    budget = _bounded(timeout)
    try:
        finished = _wait(done, budget)
    except BaseException:
        _cancel(loop, box, done)
        raise
    if not finished:
        _cancel(loop, box, done)
        if budget != timeout:
            raise BackendTimeout(f"stopped waiting at interpreter exit (exit budget {EXIT_BUDGET} s)")
        if what is not None:
            raise BackendTimeout(f"{what} did not finish within {limit}={timeout} s")
        raise BackendTimeout(f"operation did not finish within {timeout} s")
    task = box[0]
    if task.cancelled():  # cancelled on the loop by someone else (the loop is stopping)
        raise RuntimeClosed("the operation was cancelled because the runtime loop is stopping")
    return task.result()


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
        slice_ = _WAIT_SLICE if deadline is None else min(_WAIT_SLICE, deadline - time.monotonic())
        if slice_ <= 0:
            return done.is_set()
        if done.wait(slice_):
            return True


def _cancel(loop: asyncio.AbstractEventLoop, box: list[asyncio.Task[Any]], done: _Signal) -> None:
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
    done.wait(_bounded(_CANCEL_GRACE))


async def within(coro: Awaitable[T], seconds: float | None, what: str, limit: str = "step_timeout") -> T:
    """Await ``coro``, cancelling it and raising :class:`BackendTimeout` if it runs past ``seconds``.

    The message names the limit that fired (``"reset did not finish within step_timeout=900.0
    s"``). A ``TimeoutError`` the coroutine raises itself (an adapter's read timeout, with its own
    limit in its message) passes through unchanged: relabelling it would blame the wrong limit.
    """
    if seconds is None:
        return await coro
    # One timer handle and a flag: what ``asyncio.timeout`` does, without its context-manager
    # object and state machine, which a vector env would otherwise build for every op.
    task = asyncio.current_task()
    assert task is not None
    fired = False

    def fire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    before = task.cancelling()
    handle = task.get_loop().call_later(seconds, fire)
    try:
        return await coro
    except asyncio.CancelledError:
        if fired:
            fired = False
            if task.uncancel() <= before:  # only our timer cancelled it: a timeout, not a cancel
                raise BackendTimeout(f"{what} did not finish within {limit}={seconds} s") from None
        raise
    finally:
        handle.cancel()
        if fired:  # fired, but the coroutine finished anyway: take back the cancel request
            task.uncancel()


async def on_runtime(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the runtime loop from any event loop (clients are bound to that loop)."""
    if asyncio.get_running_loop() is get_loop():
        return await coro
    return await asyncio.wrap_future(submit(coro))


class Backoff:
    """Exponential backoff with full jitter: attempt ``n`` waits ``uniform(0, min(cap, base*2**n))``."""

    def __init__(self, base: float = 0.1, cap: float = 2.0, rng: random.Random | None = None):
        self.base, self.cap = base, cap
        self._rng = rng or random.Random()

    def delay(self, attempt: int) -> float:
        return self._rng.uniform(0.0, min(self.cap, self.base * (2**attempt)))


async def retry(
    fn: Callable[[], Awaitable[T]],
    *,
    retry_if: Callable[[BaseException], bool],
    attempts: int = 4,
    deadline: float | None = None,
    backoff: Backoff | None = None,
    delay_for: Callable[[BaseException], float | None] | None = None,
) -> T:
    """Call ``fn`` until it succeeds, retrying only failures ``retry_if`` calls transient.

    Args:
        fn: a zero-argument coroutine factory (called anew for every attempt).
        retry_if: decides whether an exception is transient; others propagate at once.
        attempts: the maximum number of calls.
        deadline: an overall budget in seconds; no retry starts after it is spent.
        backoff: the wait between attempts (exponential with jitter by default).
        delay_for: an optional server-provided wait for an exception (e.g. ``Retry-After``),
            used instead of the backoff when it returns a number.
    """
    backoff = backoff or Backoff()
    loop = asyncio.get_running_loop()
    start = loop.time()
    attempt = 0
    while True:
        try:
            return await fn()
        except Exception as exc:
            attempt += 1
            if attempt >= attempts or not retry_if(exc):
                raise
            wait = delay_for(exc) if delay_for is not None else None
            if wait is None:
                wait = backoff.delay(attempt - 1)
            if deadline is not None and loop.time() - start + wait > deadline:
                raise
            await asyncio.sleep(wait)
