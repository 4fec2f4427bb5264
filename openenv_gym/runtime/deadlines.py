"""Time limits that name themselves: :func:`within` for one call, :class:`Deadlines` for many.

A limit that fires raises :class:`~openenv_gym.errors.BackendTimeout` saying which limit it was
(``"step did not finish within step_timeout=0.5 s"``), so a trainer can tell a step limit from an
adapter's own read timeout, whose message is left as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from openenv_gym.errors import BackendTimeout

__all__ = ["within", "Deadlines"]

T = TypeVar("T")


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
