"""Retrying transient failures: exponential backoff with full jitter, within a deadline."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["retry", "Backoff"]

T = TypeVar("T")


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
