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


def test_within_names_its_limit_and_leaves_other_cancels_and_timeouts_alone():
    import asyncio

    import pytest

    from openenv_gym.errors import BackendTimeout
    from openenv_gym.runtime import within

    async def main() -> None:
        with pytest.raises(BackendTimeout, match=r"step did not finish within step_timeout=0.05 s"):
            await within(asyncio.sleep(1), 0.05, "step")
        assert asyncio.current_task().cancelling() == 0
        assert await within(asyncio.sleep(0, result=5), 1.0, "step") == 5

        task = asyncio.create_task(within(asyncio.sleep(1), 5.0, "step"))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):  # a cancel from outside stays a cancel
            await task

        async def swallows() -> int:
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                return 7
            return 0

        assert await within(swallows(), 0.05, "step") == 7
        await asyncio.sleep(0.01)  # no cancel request is left behind on the caller's task
        assert asyncio.current_task().cancelling() == 0

        async def own_timeout() -> None:
            raise TimeoutError("read_timeout=2 s")

        with pytest.raises(TimeoutError, match="read_timeout") as err:  # the adapter's own limit keeps its name
            await within(own_timeout(), 1.0, "step")
        assert not isinstance(err.value, BackendTimeout)

    asyncio.run(main())
