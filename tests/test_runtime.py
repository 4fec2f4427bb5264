"""The runtime loop and the retry helper."""

from __future__ import annotations

import asyncio
import threading

import pytest

from openenv_gym import runtime
from openenv_gym.errors import BackendTimeout


def test_one_loop_on_one_thread():
    async def where():
        return asyncio.get_running_loop(), threading.current_thread().name

    loop1, name = runtime.run_sync(where())
    loop2, _ = runtime.run_sync(where())
    assert loop1 is loop2 is runtime.get_loop() and name == "openenv-gym-runtime"


def test_run_sync_timeout_cancels_and_raises_a_typed_error():
    cancelled = threading.Event()

    async def forever():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(BackendTimeout):
        runtime.run_sync(forever(), timeout=0.2)
    assert cancelled.wait(5)


def test_retry_retries_only_transient_failures():
    calls = []

    async def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("transient")
        return "ok"

    assert runtime.run_sync(runtime.retry(flaky, retry_if=lambda e: isinstance(e, ConnectionError),
                                          backoff=runtime.Backoff(0.001, 0.01))) == "ok"
    assert len(calls) == 3

    async def fatal():
        calls.append(1)
        raise ValueError("fatal")

    calls.clear()
    with pytest.raises(ValueError):
        runtime.run_sync(runtime.retry(fatal, retry_if=lambda e: isinstance(e, ConnectionError)))
    assert len(calls) == 1


def test_retry_gives_up_after_attempts():
    async def down():
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        runtime.run_sync(runtime.retry(down, retry_if=lambda e: True, attempts=3,
                                       backoff=runtime.Backoff(0.001, 0.01)))
