"""CallerLoop: a single in-process env's own event loop, driven by the caller's thread per call.

For backends whose work all happens inside the calls (a legacy Verifiers env), or whose
connections need between calls only what a short pass of the loop now and then gives them (an
OpenEnv server's WebSocket: its pings answered): they skip the hop to the runtime loop's thread
(:mod:`openenv_gym.runtime.loop`) and back, two thread wake-ups a call, by running on a loop the
caller's own thread drives while the call lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from openenv_gym.errors import RuntimeClosed
from openenv_gym.runtime.loop import CANCEL_GRACE, RUNTIME, WAIT_SLICE, quiet_about_pending_tasks, timed_out
from openenv_gym.runtime.worker import DaemonExecutor

__all__ = ["CallerLoop"]

T = TypeVar("T")
_MAIN_THREAD = threading.main_thread().ident


class CallerLoop:
    """An event loop of one env's own, run on the caller's thread for the length of each call.

    ``run_sync`` costs two thread wake-ups per call (the runtime loop's, then the caller's):
    tens of microseconds, a fifth of a step of an in-process backend such as a Verifiers
    environment (benchmarks/verifiers_v0_bench.py). A backend whose work all happens inside the
    calls (no connection pool, server or background task that must go on between them, see
    :attr:`~openenv_gym.adapters.base.Adapter.caller_thread`) can instead run on a loop of its own
    that the caller's thread drives only while a call lasts (``loop.run_forever``, stopped by the
    call as it ends): no hop, no wake-up.

    :meth:`run` keeps ``run_sync``'s contract: the timeout cancels the coroutine and raises
    :class:`BackendTimeout` naming the limit; Ctrl-C cancels it, lets the cancellation run through
    it (up to a few seconds), then raises ``KeyboardInterrupt`` (in a call shorter than 50 ms it
    raises where it lands, as in any Python function, and what is left of the call is cancelled
    before it propagates); the exit budget bounds every call
    made while the exit hook runs. A call from inside a running event loop is refused: that
    thread's loop would have to stop for this one to run (use a worker thread, as
    ``AgentEnv.areset``/``astep`` do).

    Args:
        idle_pass: seconds between the passes a thread of its own makes over the loop while no call
            runs (``None``: none). A pass runs what is ready (data that arrived, timers that are
            due) and returns: a WebSocket's pings are answered, and its keep-alive timers run,
            while the caller spends minutes between steps generating the next action.
    """

    def __init__(self, idle_pass: float | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        # A default executor of our own, of daemon threads: closing can leave a hung worker
        # behind, and a call hung in it (a library's to_thread) does not hold up the exit.
        self._executor = DaemonExecutor(thread_name_prefix="openenv-gym-env")
        self._loop.set_default_executor(self._executor)
        self._running = threading.Lock()  # held by the thread driving the loop
        self._calling = threading.Lock()  # held by the thread of the running call
        self._task: asyncio.Task[Any] | None = None
        self._deadline: float | None = None  # loop time by which the running call must end
        self._why: str | None = None  # what cut the running call short: "timeout" or "interrupt"
        self._grace: asyncio.TimerHandle | None = None
        self._started = 0.0  # loop time the running call began
        self._restore: Any = None  # the SIGINT handler to put back when the running call ends
        self._close_when_free: Coroutine[Any, Any, Any] | None = None
        # One timer for the loop's whole life (a call costs no timer of its own): it looks at the
        # running call's deadline every WAIT_SLICE seconds, and wakes the selector so a SIGINT
        # delivered to another thread is seen. Between calls it waits in the loop's heap.
        self._watch = self._loop.call_later(WAIT_SLICE, self._on_watch)
        self._idle_ended = threading.Event()
        if idle_pass is not None:
            # The thread holds the loop by a weak reference: an env dropped without close() is
            # collected (its close_later ends the thread), as it would be without one.
            threading.Thread(target=_keep_idle, args=(weakref.ref(self), idle_pass, self._idle_ended),
                             name="openenv-gym-idle-pass", daemon=True).start()

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
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # no loop runs on this thread: this one may
        else:
            coro.close()
            raise RuntimeError("a blocking call of an env made inside a running event loop; await its "
                               "async method (areset/astep) instead")
        if not self._calling.acquire(blocking=False):
            coro.close()
            raise RuntimeError("this environment's loop is already running in another thread")
        try:
            self._running.acquire()  # an idle pass holds it for a moment at most
            try:
                return self._run(coro, RUNTIME.bounded(timeout), timeout, what, limit)
            finally:
                self._task = self._deadline = self._why = None
                if self._grace is not None:
                    self._grace.cancel()
                    self._grace = None
                self._running.release()
        finally:
            self._calling.release()
            closing, self._close_when_free = self._close_when_free, None
            if closing is not None:  # close() gave up waiting for this call: close here
                self.close(closing, CANCEL_GRACE)

    def _run(self, coro: Coroutine[Any, Any, T], budget: float | None, timeout: float | None,
             what: str | None, limit: str) -> T:
        loop = self._loop
        task = self._task = loop.create_task(_stopping(coro, loop))
        if budget is not None:
            self._deadline = loop.time() + budget
        self._started = loop.time()
        try:
            # run_forever, stopped by the call itself as it ends: run_until_complete would stop
            # the loop from the task's done callback, one more pass of the loop per call (a fifth
            # of what a Verifiers step adds, benchmarks/verifiers_v0_bench.py)
            loop.run_forever()
        except BaseException:  # an exception raised by a handler of the user's, or a second Ctrl-C
            if self._why is None and not task.done():
                self._cut("interrupt")
                with contextlib.suppress(BaseException):
                    loop.run_forever()  # until the cancelled call ends, or the cancel grace
            raise
        finally:
            restore, self._restore = self._restore, None
            if restore is not None:
                signal.signal(signal.SIGINT, restore)
        why = self._why
        if why == "interrupt":
            raise KeyboardInterrupt
        if task.done() and not task.cancelled():
            return task.result()  # its value or its error (also after a timeout it outlived)
        if why is not None:
            raise timed_out(budget, timeout, what, limit)
        if task.cancelled():  # cancelled by close() from another thread
            raise RuntimeClosed("the environment was closed while this call ran")
        raise RuntimeError("the environment's event loop was stopped before its call ended")

    def _cut(self, reason: str) -> None:
        """Cancel the running call; a call deaf to its cancel is left after the cancel grace."""
        task = self._task
        if self._why is None and task is not None and not task.done():
            self._why = reason
            task.cancel()
            self._grace = self._loop.call_later(CANCEL_GRACE, self._loop.stop)

    def _on_watch(self) -> None:
        loop = self._loop
        self._watch = loop.call_later(WAIT_SLICE, self._on_watch)
        if self._task is None:
            return
        now = loop.time()
        if self._deadline is not None and now >= self._deadline:
            self._cut("timeout")
        elif self._restore is None and now - self._started >= WAIT_SLICE / 2:
            self._catch_sigint()

    def _catch_sigint(self) -> None:
        """From now until the call ends, Ctrl-C cancels it rather than raising inside whatever code
        it lands in (the backend's own tasks included), as asyncio.Runner does.

        Only a call that has lasted half a watch slice pays for it: swapping the handler in and out
        (``signal.getsignal`` and two ``signal.signal``) costs about 9 us, a tenth of what a
        Verifiers step adds, and a call shorter than a human's reaction to it gains nothing (a
        Ctrl-C that lands in one raises ``KeyboardInterrupt`` there, and :meth:`_run` cancels what
        is left of the call before re-raising it).
        """
        if threading.get_ident() == _MAIN_THREAD and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._restore = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._why is not None:  # a second Ctrl-C: stop waiting for the cancellation
            raise KeyboardInterrupt
        self._cut("interrupt")
        self._loop.call_soon_threadsafe(_nothing)  # wakes the selector

    def close(self, coro: Coroutine[Any, Any, Any], timeout: float) -> None:
        """Run the closing coroutine ``coro`` (bounded by ``timeout``), then close the loop.

        From another thread while a call runs: that call is cancelled and given the cancel grace to
        end; if it does not, the thread running it closes the loop (``coro`` first) when it returns.
        """
        if self._loop.is_closed():
            coro.close()
            return
        if not self._calling.acquire(blocking=False):
            task, loop = self._task, self._loop
            if task is not None:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(task.cancel)
            if not self._calling.acquire(timeout=RUNTIME.bounded(CANCEL_GRACE) or 0.0):
                self._close_when_free = coro
                return
        self._calling.release()
        try:
            with contextlib.suppress(RuntimeClosed):
                self.run(coro, timeout, what="close", limit="the close limit")
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        """Cancel what is left on the loop, give it a moment, and close the loop."""
        loop = self._loop
        if loop.is_closed() or not self._calling.acquire(blocking=False):
            return
        self._idle_ended.set()
        self._running.acquire()  # an idle pass holds it for a moment at most
        try:
            self._watch.cancel()
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in tasks:
                task.cancel()
            # A task deaf to its cancel is collected with the loop, silently.
            loop.set_exception_handler(quiet_about_pending_tasks)
            with contextlib.suppress(BaseException):
                if tasks:
                    loop.run_until_complete(asyncio.wait(tasks, timeout=RUNTIME.bounded(CANCEL_GRACE)))
                loop.run_until_complete(loop.shutdown_asyncgens())
            # A worker thread that hangs must not hold the caller.
            self._executor.shutdown(wait=False, cancel_futures=True)
            loop.close()
        finally:
            self._running.release()
            self._calling.release()

    def _idle_pass(self) -> None:
        """One pass over the loop while no call runs: what is ready runs, then it returns."""
        if not self._running.acquire(blocking=False):
            return  # a call drives the loop now
        try:
            loop = self._loop
            if loop.is_closed():
                return
            loop.call_soon(loop.stop)
            # An error of a callback goes to the loop's exception handler; only a BaseException
            # (SystemExit from a library) gets here, and this thread is no place for it.
            with contextlib.suppress(BaseException):
                loop.run_forever()
        finally:
            self._running.release()

    def close_later(self, coro: Coroutine[Any, Any, Any]) -> None:
        """:meth:`close` without waiting, from any thread (for ``__del__``): a thread of its own
        drives this loop through ``coro`` (bounded by :data:`CANCEL_GRACE` and the close limit).

        The thread is started here, not from the runtime loop: a script that drops an env and
        ends at once reaches interpreter exit before the loop could start one (exit then refuses
        new threads, and the episode's tasks were destroyed pending, with warnings). Started
        here, it is a thread the interpreter joins before finalising.
        """
        if sys.is_finalizing():  # no thread can start now: the loop is collected as it is
            coro.close()
            return
        try:
            threading.Thread(target=self.close, args=(coro, CANCEL_GRACE), name="openenv-gym-close").start()
        except RuntimeError:  # the interpreter is shutting down
            coro.close()


def _keep_idle(ref: weakref.ref[CallerLoop], every: float, ended: threading.Event) -> None:
    """The idle-pass thread of a :class:`CallerLoop`: a pass every ``every`` seconds until it closes."""
    while not ended.wait(every):
        caller_loop = ref()
        if caller_loop is None:
            return
        caller_loop._idle_pass()
        del caller_loop


async def _stopping(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """``coro``, stopping ``loop`` as it ends: the loop's ``run_forever`` returns in the same pass."""
    try:
        return await coro
    finally:
        loop.stop()


def _nothing() -> None:
    """Wakes a loop's selector (scheduled from a signal handler)."""
