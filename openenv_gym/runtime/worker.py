"""Daemon threads for blocking calls: :class:`Worker` (one thread, calls in order) and
:class:`DaemonExecutor` (a pool, as an event loop's executor).

Why not ``ThreadPoolExecutor``: its threads are joined when the interpreter exits, so a call that
never returns (an env's step or a tool hung in a sleep or a lock, which ``step_timeout`` gave up
waiting for) would keep the process from ever exiting. A daemon thread does not hold exit up:
what it was running is abandoned with the process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["DaemonExecutor", "Worker", "INLINE_OFFLOADS"]

T = TypeVar("T")
_Call = list[Any]
"""A queued call, ``[future, fn, args, kwargs]``: a list, so the thread running it can empty it."""

INLINE_OFFLOADS: contextvars.ContextVar[Callable[[Callable[..., Any]], bool] | None] = contextvars.ContextVar(
    "openenv_gym_inline_offloads", default=None)
"""Which blocking calls, handed to a :class:`DaemonExecutor` from this context, run at once in the
submitting thread instead of in a thread of the pool: given the function called
(``asyncio.to_thread``'s, unwrapped from its context call). An episode sets it for the task of
the library loop it starts (``loop.create_task(..., context=...)``): that library's own quick,
pure bookkeeping then skips a thread hop, which costs two wake-ups, on a shared machine more than
the call itself, while every other call (a tool's, the user's) still goes to a thread, where a
hang cannot hold the loop and ``step_timeout`` can leave it behind. Scoped to the task (and the
tasks it starts), never to the loop: the same library run by other code on the same loop keeps
its hops."""


class Worker:
    """One daemon thread running the calls handed to it in order (an env that is not thread-safe
    gets every call on the same thread, as a server's session does).

    Start it with :meth:`start` off the event loop (``Thread.start`` waits for the thread to run),
    hand it calls with :meth:`run` (awaitable) or :meth:`submit`, end it with :meth:`shutdown`.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None]
        self._calls = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.busy = False
        """A call is running (one that timed out may be running still)."""

    def start(self) -> None:
        self._thread.start()

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """Queue ``fn(*args, **kwargs)``; its future (cancelling it before it starts skips the call)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.put([future, fn, args, kwargs])
        return future

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the worker's thread, awaited."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def shutdown(self) -> None:
        """End the thread once the calls queued before this one have run (returns at once)."""
        self._calls.put(None)

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            self.busy = True
            try:
                _run_call(item)
            finally:
                self.busy = False
            del item  # hold nothing of a finished call while waiting


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """A thread pool of daemon threads, for ``loop.set_default_executor`` and ``run_in_executor``.

    A ``ThreadPoolExecutor`` by type only, because ``set_default_executor`` accepts nothing else:
    :meth:`submit` and :meth:`shutdown` are this class's own, over the public ``Executor``
    contract, and the base class's threads and queue are never used. As in the standard pool, a
    call goes to an idle thread, else to a new one up to ``max_workers``, else waits its turn.

    A call whose submitting context names it in :data:`INLINE_OFFLOADS` runs at once, in the
    submitting thread.

    Args:
        max_workers: threads at most (default: the standard pool's, ``min(32, cpus + 4)``).
        thread_name_prefix: the threads' names, numbered.
    """

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "openenv-gym-daemon") -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._limit = max_workers if max_workers is not None else min(32, (os.cpu_count() or 1) + 4)
        self._name = thread_name_prefix
        self._pending: queue.SimpleQueue[_Call | None]
        self._pending = queue.SimpleQueue()
        self._free = threading.Semaphore(0)  # one count per thread waiting for a call
        self._guard = threading.Lock()
        self._daemons: list[threading.Thread] = []
        self._ended = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        # ``run_in_executor`` submits synchronously, so this context is the submitting task's.
        inline = INLINE_OFFLOADS.get()
        if inline is not None and not self._ended and inline(_called(fn)):
            _run_call([future, fn, args, kwargs])
            return future
        with self._guard:
            if self._ended:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._pending.put([future, fn, args, kwargs])
            if not self._free.acquire(blocking=False) and len(self._daemons) < self._limit:
                thread = threading.Thread(target=self._serve, name=f"{self._name}_{len(self._daemons)}", daemon=True)
                thread.start()
                self._daemons.append(thread)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more calls; ``cancel_futures`` cancels those not started; ``wait`` joins the threads
        (a hung call holds that wait, never the interpreter's exit)."""
        with self._guard:
            if not self._ended:
                self._ended = True
                if cancel_futures:
                    while True:
                        try:
                            item = self._pending.get_nowait()
                        except queue.Empty:
                            break
                        if item is not None:
                            item[0].cancel()
                for _ in self._daemons:
                    self._pending.put(None)
            threads = list(self._daemons)
        if wait:
            for thread in threads:
                thread.join()

    def _serve(self) -> None:
        while (item := self._pending.get()) is not None:
            _run_call(item)
            del item  # hold nothing of a finished call while waiting
            self._free.release()


def _called(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function a submitted call runs: ``asyncio.to_thread`` submits
    ``functools.partial(context.run, func, ...)``, whose ``func`` is what the caller named."""
    if isinstance(fn, functools.partial) and isinstance(getattr(fn.func, "__self__", None), contextvars.Context) \
            and fn.args and callable(fn.args[0]):
        return fn.args[0]
    return fn


def _run_call(call: _Call) -> None:
    """One queued call, its outcome into its future (none if the future was cancelled first).

    The thread lets go of the call's function and arguments before the future wakes the caller:
    a caller that closes an env and drops it right after (``gc.collect()`` holding the GIL) finds
    nothing of it still held by this thread. (The result is the caller's own.)
    """
    future, fn, args, kwargs = call
    call.clear()
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # handed to the caller, whatever it is
        del fn, args, kwargs
        future.set_exception(exc)
        return
    del fn, args, kwargs
    future.set_result(result)
