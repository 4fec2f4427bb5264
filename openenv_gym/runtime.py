"""The one background event loop of a process, and the one retry helper.

openenv_gym is async at the core and sync at the edges: adapters are coroutines, while
``gymnasium.Env.step`` is a plain method. Every sync edge reaches the async core through
:func:`run_sync`, which submits the coroutine to a single daemon thread running an asyncio loop.
Keeping one loop per process means connection pools, server sessions and keep-alive tasks live in
one place and survive across calls; nothing else in the package starts an event loop.

The loop is recreated after ``fork`` (a child must not reuse its parent's thread-bound loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from openenv_gym.errors import BackendTimeout

__all__ = ["get_loop", "run_sync", "submit", "on_runtime", "retry", "Backoff"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid: int | None = None


def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    loop.run_forever()


def get_loop() -> asyncio.AbstractEventLoop:
    """Return the process-wide runtime loop, starting its thread on first use."""
    global _loop, _thread, _pid
    if _loop is not None and _pid == os.getpid() and _thread is not None and _thread.is_alive():
        return _loop
    with _lock:
        if _loop is None or _pid != os.getpid() or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(
                target=_serve, args=(loop, ready), name="openenv-gym-runtime", daemon=True
            )
            thread.start()
            ready.wait()
            _loop, _thread, _pid = loop, thread, os.getpid()
    return _loop


def in_runtime_thread() -> bool:
    """True when called from the runtime loop's own thread (where blocking on it would deadlock)."""
    return _thread is not None and threading.current_thread() is _thread


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Schedule ``coro`` on the runtime loop and return a thread-safe future."""
    return asyncio.run_coroutine_threadsafe(coro, get_loop())


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the runtime loop and block until it finishes.

    Args:
        coro: the coroutine to run.
        timeout: seconds to wait; on expiry the coroutine is cancelled and
            :class:`~openenv_gym.errors.BackendTimeout` is raised, so a sync caller never hangs.
    """
    if in_runtime_thread():
        coro.close()
        raise RuntimeError("run_sync() called from the runtime loop; await the coroutine instead")
    future = submit(coro)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        # TimeoutError is also the base of errors the coroutine itself raises (BackendTimeout
        # from an adapter, with its own message): only a wait that ran out is relabelled here.
        if future.done() and not future.cancelled():
            raise
        future.cancel()
        raise BackendTimeout(f"operation did not finish within {timeout} s") from None


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
