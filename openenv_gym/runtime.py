"""The one background event loop of a process, the one retry helper, and closing at exit.

openenv_gym is async at the core and sync at the edges: adapters are coroutines, while
``gymnasium.Env.step`` is a plain method. Every sync edge reaches the async core through
:func:`run_sync`, which submits the coroutine to a single daemon thread running an asyncio loop.
Keeping one loop per process means connection pools, server sessions and keep-alive tasks live in
one place and survive across calls. The one exception is :class:`CallerLoop`: a loop of a single
in-process env's own, run on the caller's thread only while a call lasts, for backends that hold
nothing between calls and would otherwise pay two thread wake-ups a step.

The loop is recreated after ``fork`` (a child must not reuse its parent's thread-bound loop).

Closing at exit: envs and vector envs register themselves with :func:`track`. An ``atexit`` hook
closes every one still open (a forgotten ``close()``, a script ended by an exception or Ctrl-C)
within :data:`EXIT_BUDGET` seconds in all, then stops the loop. ``__del__`` cannot do this job:
during interpreter finalisation the loop's daemon thread is frozen, and waiting on it, or starting
a new one, hangs forever. Once the hook has run, the loop refuses to start again.
"""

from __future__ import annotations

import _signal
import asyncio
import atexit
import contextlib
import concurrent.futures
import os
import random
import signal
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from openenv_gym.errors import BackendTimeout, RuntimeClosed

__all__ = [
    "get_loop", "run_sync", "submit", "on_runtime", "retry", "Backoff", "track", "untrack",
    "RuntimeClosed", "EXIT_BUDGET", "within", "Deadlines", "close_later", "CallerLoop",
]

T = TypeVar("T")

EXIT_BUDGET = 5.0
"""Seconds the exit hook may spend closing envs that were never closed, all of them together."""
_CANCEL_GRACE = 5.0
"""Seconds :func:`run_sync` waits for an interrupted coroutine to finish cancelling."""
_WAIT_SLICE = 0.1
_BURST = 16
"""Batches of ready callbacks :func:`_drive` runs between two full loop iterations."""

_MAIN_THREAD = threading.main_thread().ident
_SIGINT = int(signal.SIGINT)

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
        raise _timed_out(budget, timeout, what, limit)
    task = box[0]
    if task.cancelled():  # cancelled on the loop by someone else (the loop is stopping)
        raise RuntimeClosed("the operation was cancelled because the runtime loop is stopping")
    return task.result()


def _timed_out(budget: float | None, timeout: float | None, what: str | None, limit: str) -> BackendTimeout:
    """The error for a blocking call whose wait ran out: the exit budget's, or the named limit's."""
    if budget != timeout:
        return BackendTimeout(f"stopped waiting at interpreter exit (exit budget {EXIT_BUDGET} s)")
    if what is not None:
        return BackendTimeout(f"{what} did not finish within {limit}={timeout} s")
    return BackendTimeout(f"operation did not finish within {timeout} s")


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


class Deadlines:
    """:func:`within` for many concurrent calls on one loop, for the price of one timer.

    A vector env or a host bounds every op it runs by ``step_timeout``; with :func:`within`
    each op schedules and cancels a timer of its own, which costs more than an op of a cheap
    backend (benchmarks/ray_bench.py). Here each call only records its deadline; one timer, armed
    for the earliest deadline, cancels the calls that ran past theirs and re-arms itself for the
    next one. A call that overran raises the same :class:`BackendTimeout` as :func:`within`.
    """

    __slots__ = ("_calls", "_fired", "_timer", "_armed")

    def __init__(self) -> None:
        self._calls: dict[object, tuple[asyncio.Task[Any], float]] = {}
        self._fired: set[object] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._armed = float("inf")  # the loop time the timer fires at

    async def within(self, coro: Awaitable[T], seconds: float | None, what: str, limit: str = "step_timeout") -> T:
        """:func:`within`: await ``coro``, raising :class:`BackendTimeout` after ``seconds``."""
        if seconds is None:
            return await coro
        task = asyncio.current_task()
        assert task is not None
        loop = task.get_loop()
        token = object()
        deadline = loop.time() + seconds
        self._calls[token] = (task, deadline)
        if deadline < self._armed:
            self._arm(loop, deadline)
        before = task.cancelling()
        try:
            return await coro
        except asyncio.CancelledError:
            if token in self._fired:
                self._fired.discard(token)
                if task.uncancel() <= before:  # only the deadline cancelled it: a timeout
                    raise BackendTimeout(f"{what} did not finish within {limit}={seconds} s") from None
            raise
        finally:
            self._calls.pop(token, None)
            if token in self._fired:  # the deadline passed as it finished: take the cancel back
                self._fired.discard(token)
                task.uncancel()

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = when
        self._timer = loop.call_at(when, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._armed = None, float("inf")
        now = loop.time() + 1e-3  # the loop may run a timer a clock tick early
        upcoming = float("inf")
        for token, (task, deadline) in list(self._calls.items()):
            if deadline <= now:
                del self._calls[token]
                self._fired.add(token)
                task.cancel()
            elif deadline < upcoming:
                upcoming = deadline
        if upcoming != float("inf"):
            self._arm(loop, upcoming)

    def cancel(self) -> None:
        """Drop the timer (the owner is closing)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._armed = None, float("inf")


async def on_runtime(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the runtime loop from any event loop (clients are bound to that loop)."""
    if asyncio.get_running_loop() is get_loop():
        return await coro
    return await asyncio.wrap_future(submit(coro))


class Backoff:
    """Exponential backoff with full jitter: attempt ``n`` waits ``uniform(0, min(cap, base*2**n))``."""

    def __init__(self, base: float = 0.1, cap: float = 2.0, rng: random.Random | None = None):
        self.base, self.cap = base, cap
        # The random module's own generator unless one is given: seeding a new one reads the OS's
        # entropy pool, which cost more than a step's client work (a Backoff is made per tool
        # call), and the module reseeds its own in a forked child, so siblings do not retry in step.
        self._uniform = (rng or random).uniform

    def delay(self, attempt: int) -> float:
        return self._uniform(0.0, min(self.cap, self.base * (2**attempt)))


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


class CallerLoop:
    """An event loop of one env's own, run on the caller's thread for the length of each call.

    :func:`run_sync` costs two thread wake-ups per call (the runtime loop's, then the caller's):
    tens of microseconds, a fifth of a step of an in-process backend such as a Verifiers
    environment (benchmarks/verifiers_v0_bench.py). A backend whose work all happens inside the
    calls (no connection pool, server or background task that must go on between them, see
    :attr:`~openenv_gym.adapters.base.Adapter.caller_thread`) can instead run on a loop of its own
    that the caller's thread drives only while a call lasts: no hop, no wake-up.

    :meth:`run` keeps :func:`run_sync`'s contract: the timeout cancels the coroutine and raises
    :class:`BackendTimeout` naming the limit; Ctrl-C cancels it, lets the cancellation run through
    it (up to a few seconds), then raises ``KeyboardInterrupt``; the exit budget bounds every call
    made while the exit hook runs. A call from inside a running event loop is refused: that
    thread's loop would have to stop for this one to run (use a worker thread, as
    ``AgentEnv.areset``/``astep`` do).
    """

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        # A default executor of our own, so closing can leave a hung worker behind (and uvloop
        # does not expose its own).
        self._executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="openenv-gym-env")
        self._loop.set_default_executor(self._executor)
        self._running = threading.Lock()  # held by the thread driving the loop
        self._task: asyncio.Task[Any] | None = None
        self._deadline: float | None = None  # loop time by which the running call must end
        self._why: str | None = None  # what cut the running call short: "timeout" or "interrupt"
        self._grace: asyncio.TimerHandle | None = None
        self._close_when_free: Coroutine[Any, Any, Any] | None = None
        # One timer for the loop's whole life (a call costs no timer of its own): it looks at the
        # running call's deadline every _WAIT_SLICE seconds, and wakes the selector so a SIGINT
        # delivered to another thread is seen. Between calls it waits in the loop's heap.
        self._watch = self._loop.call_later(_WAIT_SLICE, self._on_watch)

    @property
    def closed(self) -> bool:
        return self._loop.is_closed()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop itself (to inspect its tasks; it runs only inside :meth:`run`)."""
        return self._loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *, what: str | None = None,
            limit: str = "step_timeout") -> T:
        """Run ``coro`` to completion on this loop, on the calling thread (see the class docstring)."""
        if self._loop.is_closed():
            coro.close()
            raise RuntimeClosed("this environment's event loop is closed")
        if asyncio._get_running_loop() is not None:
            coro.close()
            raise RuntimeError("a blocking call of an env made inside a running event loop; await its "
                               "async method (areset/astep) instead")
        if not self._running.acquire(blocking=False):
            coro.close()
            raise RuntimeError("this environment's loop is already running in another thread")
        try:
            return self._run(coro, _bounded(timeout), timeout, what, limit)
        finally:
            self._task = self._deadline = self._why = None
            if self._grace is not None:
                self._grace.cancel()
                self._grace = None
            self._running.release()
            closing, self._close_when_free = self._close_when_free, None
            if closing is not None:  # close() gave up waiting for this call: close here
                self.close(closing, _CANCEL_GRACE)

    def _run(self, coro: Coroutine[Any, Any, T], budget: float | None, timeout: float | None,
             what: str | None, limit: str) -> T:
        loop = self._loop
        task = self._task = loop.create_task(coro)
        if budget is not None:
            self._deadline = loop.time() + budget
        # Ctrl-C cancels the call rather than raising inside whatever code it lands in (the
        # backend's own tasks included), as asyncio.Runner does. ``_signal`` is ``signal``
        # without its enum conversions, which would cost more than the rest of a call.
        restore: Any = None
        if threading.get_ident() == _MAIN_THREAD and _signal.getsignal(_SIGINT) is signal.default_int_handler:
            restore = _signal.signal(_SIGINT, self._on_sigint)
        try:
            _drive(loop, task)
        except asyncio.CancelledError:
            if self._why is None:  # cancelled by close() from another thread
                raise RuntimeClosed("the environment was closed while this call ran") from None
        except RuntimeError:
            if task.done() or self._why is None:  # not "loop stopped": the coroutine's own error
                raise
        except BaseException:  # an exception raised by a handler of the user's, or a second Ctrl-C
            if self._why is None and not task.done():
                self._cut("interrupt")
                with contextlib.suppress(BaseException):
                    _drive(loop, task)
            raise
        finally:
            if restore is not None:
                _signal.signal(_SIGINT, restore)
        why = self._why
        if why == "interrupt":
            raise KeyboardInterrupt
        if why is not None and (not task.done() or task.cancelled()):
            raise _timed_out(budget, timeout, what, limit)
        return task.result()

    def _cut(self, reason: str) -> None:
        """Cancel the running call; a call deaf to its cancel is left after the cancel grace."""
        task = self._task
        if self._why is None and task is not None and not task.done():
            self._why = reason
            task.cancel()
            self._grace = self._loop.call_later(_CANCEL_GRACE, self._loop.stop)

    def _on_watch(self) -> None:
        loop = self._loop
        self._watch = loop.call_later(_WAIT_SLICE, self._on_watch)
        if self._deadline is not None and loop.time() >= self._deadline:
            self._cut("timeout")

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._why is not None:  # a second Ctrl-C: stop waiting for the cancellation
            raise KeyboardInterrupt
        self._cut("interrupt")
        self._loop.call_soon_threadsafe(_nothing)

    def close(self, coro: Coroutine[Any, Any, Any], timeout: float) -> None:
        """Run the closing coroutine ``coro`` (bounded by ``timeout``), then close the loop.

        From another thread while a call runs: that call is cancelled and given the cancel grace to
        end; if it does not, the thread running it closes the loop (``coro`` first) when it returns.
        """
        if self._loop.is_closed():
            coro.close()
            return
        if not self._running.acquire(blocking=False):
            task, loop = self._task, self._loop
            if task is not None:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(task.cancel)
            if not self._running.acquire(timeout=_bounded(_CANCEL_GRACE) or 0.0):
                self._close_when_free = coro
                return
        self._running.release()
        try:
            with contextlib.suppress(RuntimeClosed):
                self.run(coro, timeout, what="close", limit="the close limit")
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        """Cancel what is left on the loop, give it a moment, and close the loop."""
        loop = self._loop
        if loop.is_closed() or not self._running.acquire(blocking=False):
            return
        try:
            self._watch.cancel()
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                if tasks:
                    loop.run_until_complete(asyncio.wait(tasks, timeout=_bounded(_CANCEL_GRACE)))
                loop.run_until_complete(loop.shutdown_asyncgens())
            for task in tasks:
                task._log_destroy_pending = False  # type: ignore[attr-defined]
            # A worker thread that hangs must not hold the caller.
            self._executor.shutdown(wait=False, cancel_futures=True)
            loop.close()
        finally:
            self._running.release()

    def close_later(self, coro: Coroutine[Any, Any, Any]) -> None:
        """:meth:`close` without waiting, from any thread (for ``__del__``): a worker thread of the
        runtime loop drives this loop through ``coro``, so the exit hook still bounds it."""
        async def elsewhere() -> None:
            await asyncio.to_thread(self.close, coro, _CANCEL_GRACE)

        close_later(elsewhere())


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed: a loop iteration costs a fraction of asyncio's, and
    a backend's task hand-offs take an iteration each."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _drive(loop: asyncio.AbstractEventLoop, task: asyncio.Task[T]) -> T:
    """``loop.run_until_complete(task)`` without its per-call set-up and its last iteration
    (the one that only runs the done-callback stopping the loop): the loop's own iterations, run
    until ``task`` is done. What ``run_forever`` sets for its duration is set here too (the running
    loop, the async-generator hooks). A loop without ``_run_once`` (not asyncio's) is run the
    ordinary way.

    While callbacks are ready and no timer is due (a task handing a result to another: every
    step of an in-process backend is such hand-offs), they run without the I/O poll that
    ``_run_once`` makes before each batch, which costs more than the hand-off itself. A due timer
    takes a full iteration at once, so it runs in the same order as under ``_run_once`` (a
    library's timeout that expired while the caller was away fires before the next action is
    handed over); I/O gets a full iteration at least every ``_BURST`` batches, so a task that
    keeps yielding starves nothing. Debug mode takes the full path (it times each callback)."""
    run_once = getattr(loop, "_run_once", None)
    if run_once is None:
        return loop.run_until_complete(task)
    if loop.is_running():
        raise RuntimeError("this event loop is already running")
    hooks = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(firstiter=loop._asyncgen_firstiter_hook,  # type: ignore[attr-defined]
                           finalizer=loop._asyncgen_finalizer_hook)  # type: ignore[attr-defined]
    asyncio.events._set_running_loop(loop)
    ready = getattr(loop, "_ready", None) if not loop.get_debug() else None
    timers = getattr(loop, "_scheduled", None)
    resolution = getattr(loop, "_clock_resolution", 0.0)
    burst = 0
    try:
        while not task.done():
            if (ready and burst < _BURST and timers is not None
                    and not (timers and timers[0]._when <= loop.time() + resolution)):
                burst += 1
                for _ in range(len(ready)):
                    handle = ready.popleft()
                    if not handle._cancelled:
                        handle._run()
            else:
                burst = 0
                run_once()
            if loop._stopping:  # type: ignore[attr-defined]  # loop.stop(): the cancel grace ran out
                loop._stopping = False  # type: ignore[attr-defined]
                raise RuntimeError("Event loop stopped before Future completed.")
    finally:
        asyncio.events._set_running_loop(None)
        sys.set_asyncgen_hooks(*hooks)
    return task.result()


def _nothing() -> None:
    """Wakes a loop's selector (scheduled from a signal handler)."""


