"""Worker: one daemon thread that runs a session's blocking calls, one after another.

Why not ``ThreadPoolExecutor(max_workers=1)``: the executor's threads are joined when the
interpreter exits, so an environment's call that never returns (a step hung in a sleep or a
lock, which ``step_timeout`` gave up waiting for) would keep the process from ever exiting.
A daemon thread does not hold exit up: what it was running is abandoned with the process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Worker"]

T = TypeVar("T")


class Worker:
    """One daemon thread running the calls handed to it in order (an env that is not thread-safe
    gets every call on the same thread, as a server's session does).

    Start it with :meth:`start` off the event loop (``Thread.start`` waits for the thread to run),
    hand it calls with :meth:`run` (awaitable) or :meth:`submit`, end it with :meth:`shutdown`.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple, dict] | None]
        self._calls = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.busy = False
        """A call is running (one that timed out may be running still)."""

    def start(self) -> None:
        self._thread.start()

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """Queue ``fn(*args, **kwargs)``; its future (cancelling it before it starts skips the call)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.put((future, fn, args, kwargs))
        return future

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the worker's thread, awaited."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def shutdown(self) -> None:
        """End the thread once the calls queued before this one have run (returns at once)."""
        self._calls.put(None)

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            self.busy = True
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller, whatever it is
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                self.busy = False
            del future, fn, args, kwargs, item  # hold nothing of a finished call while waiting
