"""The runtime loop and the retry helper."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import gc
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
import weakref
from typing import Any

import pytest

from openenv_gym import runtime
from openenv_gym.errors import BackendTimeout, RuntimeClosed


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


def test_backoff_jitters_within_its_cap_and_a_given_rng_repeats_it():
    import random

    backoff = runtime.Backoff(0.1, 1.0)
    for attempt in range(8):
        waits = {backoff.delay(attempt) for _ in range(50)}
        assert all(0.0 <= w <= min(1.0, 0.1 * 2**attempt) for w in waits) and len(waits) > 1  # full jitter
    seeded = [runtime.Backoff(0.1, 1.0, random.Random(3)).delay(n) for n in range(5)]
    assert seeded == [runtime.Backoff(0.1, 1.0, random.Random(3)).delay(n) for n in range(5)]


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


# -- CallerLoop: a single in-process env's own loop, run on the caller's thread -------------------

def sigint_after(seconds: float) -> threading.Timer:
    """A real SIGINT, delivered to another thread than the main one (Ctrl-C may land anywhere)."""
    timer = threading.Timer(seconds, lambda: signal.pthread_kill(threading.get_ident(), signal.SIGINT))
    timer.start()
    return timer


@pytest.fixture(params=[None, 0.02], ids=["no-idle-pass", "idle-pass"])
def runner(request):
    """A CallerLoop, also with idle passes every 20 ms (every call then races them for the loop)."""
    loop = runtime.CallerLoop(request.param)
    yield loop
    loop.close(asyncio.sleep(0), 5)  # nothing if the test closed it


def idle_pass_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "openenv-gym-idle-pass"]


def test_caller_loop_idle_passes_run_what_arrives_between_calls_and_end_with_the_loop():
    """Between calls only the idle passes drive the loop: data that arrives is read (a WebSocket's
    ping answered) within a pass, not at the next call; the passes end when the loop is closed or
    dropped."""
    before = set(idle_pass_threads())
    for idle_pass in (None, 0.05):
        ours, theirs = socket.socketpair()
        got: list[bytes] = []
        caller_loop = runtime.CallerLoop(idle_pass)

        caller_loop.run(_listen(ours, got), 5)
        theirs.send(b"ping")
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        if idle_pass is None:
            assert got == []  # read only once a call drives the loop
            caller_loop.run(asyncio.sleep(0), 5)
        assert got == [b"ping"]
        caller_loop.run(_remove_reader(ours.fileno()), 5)
        ours.close(), theirs.close()
        if idle_pass is not None:
            assert len(set(idle_pass_threads()) - before) == 1
            caller_loop.close(asyncio.sleep(0), 5)
            _wait_until(lambda: set(idle_pass_threads()) <= before)
            dropped = runtime.CallerLoop(idle_pass)
            assert len(set(idle_pass_threads()) - before) == 1
            del dropped  # never closed: the thread holds it weakly, and ends at its next pass
            gc.collect()
            _wait_until(lambda: set(idle_pass_threads()) <= before)
        else:
            caller_loop.close(asyncio.sleep(0), 5)


async def _listen(sock: socket.socket, got: list[bytes]) -> None:
    asyncio.get_running_loop().add_reader(sock.fileno(), lambda: got.append(sock.recv(16)))


async def _remove_reader(fd: int) -> None:
    asyncio.get_running_loop().remove_reader(fd)


def _wait_until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.01)


def test_caller_loop_runs_on_the_callers_thread_and_keeps_state_between_calls(runner):
    async def start() -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()

        async def produce() -> None:  # a task of the backend's own that lives across calls
            for i in range(3):
                await queue.put((i, threading.current_thread().name))

        asyncio.get_running_loop().create_task(produce())
        return queue

    queue = runner.run(start(), 5)
    got = [runner.run(queue.get(), 5) for _ in range(3)]
    assert got == [(i, threading.current_thread().name) for i in range(3)]
    assert runner.run(asyncio.to_thread(lambda: 7), 5) == 7  # the loop's own worker threads
    runner.close(asyncio.sleep(0), 5)
    assert runner.closed
    with pytest.raises(RuntimeClosed):
        runner.run(asyncio.sleep(0))


def test_caller_loop_timeout_cancels_names_the_limit_and_the_loop_goes_on(runner):
    cancelled = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    start = time.monotonic()
    with pytest.raises(BackendTimeout, match=r"step did not finish within step_timeout=0\.3 s"):
        runner.run(forever(), 0.3, what="step")
    assert 0.3 <= time.monotonic() - start < 3 and cancelled == [True]
    assert runner.run(asyncio.sleep(0, "again"), 5) == "again"


def test_caller_loop_ctrl_c_cancels_the_call_then_raises_and_restores_the_handler(runner):
    unwound = []

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.05)  # the cancellation runs through an await of its own
            unwound.append(True)

    sigint_after(0.3)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        runner.run(slow(), 60)
    assert time.monotonic() - start < 5 and unwound == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert runner.run(asyncio.sleep(0, "after"), 5) == "after"


def test_caller_loop_takes_ctrl_c_over_only_in_a_call_that_lasts(runner):
    """A short call leaves the SIGINT handler alone (its swap would cost a tenth of a Verifiers
    step); a call that lasts takes Ctrl-C over, so a press cancels it rather than raising inside
    the backend's code; either way a press ends the call with KeyboardInterrupt and the loop goes on."""
    async def handler_now(wait: float) -> object:
        await asyncio.sleep(wait)
        return signal.getsignal(signal.SIGINT)

    assert runner.run(handler_now(0), 5) is signal.default_int_handler
    assert runner.run(handler_now(0.3), 5) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    finished = []

    async def busy() -> None:  # Python code of the backend's, running when the press lands
        end = time.monotonic() + 2
        while time.monotonic() < end:  # never yields: the watch cannot take Ctrl-C over
            pass
        finished.append(True)

    sigint_after(0.05)
    with pytest.raises(KeyboardInterrupt):
        runner.run(busy(), 5)
    assert finished == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert runner.run(asyncio.sleep(0, "after"), 5) == "after"
    assert not [t for t in asyncio.all_tasks(runner.loop) if not t.done()]


def test_caller_loop_a_call_deaf_to_its_cancel_is_left_after_the_grace(monkeypatch, runner):
    monkeypatch.setattr("openenv_gym.runtime.caller_loop.CANCEL_GRACE", 0.5)

    async def deaf() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass

    start = time.monotonic()
    with pytest.raises(BackendTimeout):
        runner.run(deaf(), 0.2, what="step")
    assert time.monotonic() - start < 3
    runner.close(asyncio.sleep(0), 1)
    assert runner.closed


def test_caller_loop_refuses_a_running_loop_and_a_second_thread(runner):
    async def inside() -> None:
        coro = asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="areset/astep"):
            runner.run(coro)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the refused coroutine is closed, never "never awaited"
        asyncio.run(inside())
    started, errors = threading.Event(), []

    async def hold() -> None:
        started.set()
        await asyncio.sleep(0.5)

    def other() -> None:
        started.wait(5)
        try:
            runner.run(asyncio.sleep(0))
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    runner.run(hold(), 5)
    thread.join(5)
    assert len(errors) == 1 and "another thread" in str(errors[0])


def test_caller_loop_close_from_another_thread_ends_a_hung_call(runner):
    closed = []

    async def closing() -> None:
        closed.append(threading.current_thread().name)

    threading.Timer(0.3, lambda: runner.close(closing(), 5)).start()
    start = time.monotonic()
    with pytest.raises(RuntimeClosed, match="closed while this call ran"):
        runner.run(asyncio.sleep(3600), 60)
    assert time.monotonic() - start < 5
    deadline = time.monotonic() + 5
    while not runner.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runner.closed and len(closed) == 1


# -- Deadlines: within() for many calls, one timer --------------------------------------------------

def test_deadlines_time_out_each_call_by_its_own_deadline_and_leave_the_rest_alone():
    async def scenario() -> list:
        deadlines = runtime.Deadlines()
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def op(seconds: float, limit: float) -> tuple:
            try:
                await deadlines.within(asyncio.sleep(seconds), limit, "the sub-env's step")
                return ("done", round(loop.time() - start, 1))
            except BackendTimeout as exc:
                return (str(exc), round(loop.time() - start, 1))

        # later deadlines first, so the timer must re-arm for an earlier one
        out = await asyncio.gather(op(0.1, 5.0), op(2.0, 0.6), op(2.0, 0.3), op(0.05, 0.3))
        # a cancel from outside passes through as a cancel, not a timeout
        task = asyncio.ensure_future(deadlines.within(asyncio.sleep(5), 5.0, "x"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadlines.cancel()
        return out

    out = asyncio.run(scenario())
    assert out[0] == ("done", 0.1) and out[3][0] == "done"
    assert out[1] == ("the sub-env's step did not finish within step_timeout=0.6 s", 0.6)
    assert out[2] == ("the sub-env's step did not finish within step_timeout=0.3 s", 0.3)


def test_deadlines_a_call_that_finished_leaves_no_cancel_behind_when_the_timer_fires_late():
    async def scenario() -> str:
        deadlines = runtime.Deadlines()

        async def busy() -> str:
            time.sleep(0.2)  # blocks the loop past the deadline, then finishes without awaiting
            return "finished"

        got = await deadlines.within(busy(), 0.1, "step")
        await asyncio.sleep(0.2)  # a stale cancel would land here
        return got

    assert asyncio.run(scenario()) == "finished"


def test_tune_gc_collects_less_often_but_still_frees_garbage_cycles():
    """Run in a child: it changes the process's collector for good."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import gc, weakref
        import openenv_gym
        openenv_gym.tune_gc()
        from openenv_gym.processes import GC_THRESHOLDS
        assert gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 0
        freed = []
        class Node: pass
        for i in range(200_000):  # cycles and other garbage, well past the young threshold
            a, b = Node(), Node()
            a.b, b.a = b, a
            if i % 1000 == 0:
                weakref.finalize(a, freed.append, i)
            del a, b
        assert len(freed) > 150, len(freed)  # collected without any gc.collect()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_caller_loop_a_call_that_never_stops_yielding_still_times_out_and_sees_io(runner):
    # Ready callbacks run in batches without the I/O poll: a task that always has one queued
    # must not starve the deadline timer, a thread's result or a socket.
    async def spin() -> None:
        while True:
            await asyncio.sleep(0)

    start = time.monotonic()
    with pytest.raises(BackendTimeout, match="step_timeout=0.3 s"):
        runner.run(spin(), 0.3, what="step")
    assert time.monotonic() - start < 3

    async def io_while_spinning() -> tuple[int, bytes]:
        spinner = asyncio.get_running_loop().create_task(spin())
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours)
        try:
            value = await asyncio.to_thread(lambda: 7)  # a worker thread's result wakes the poll
            threading.Timer(0.05, theirs.sendall, (b"ok",)).start()
            return value, await reader.readexactly(2)  # and so does a socket
        finally:
            spinner.cancel()
            writer.close()
            theirs.close()

    assert runner.run(io_while_spinning(), 5) == (7, b"ok")


def test_caller_loop_a_timer_due_between_calls_fires_before_the_next_call_goes_on(runner):
    # A backend's timeout that expired while the caller was away (a Verifiers timeout_seconds
    # during the policy's thinking) must fire before the next call's work goes on, as it would
    # under the loop's own iterations.
    fired = []

    async def arm() -> None:
        asyncio.get_running_loop().call_later(0.05, fired.append, True)

    async def look() -> bool:
        await asyncio.sleep(0)
        return bool(fired)

    runner.run(arm(), 5)
    time.sleep(0.1)
    assert runner.run(look(), 5) is True


def test_daemon_executor_runs_calls_as_a_thread_pool_does():
    """What a loop's executor must do: calls in parallel up to max_workers (then queued), results
    and errors through the futures, the unstarted calls cancelled by shutdown, none after it."""
    pool = runtime.DaemonExecutor(max_workers=3, thread_name_prefix="test-daemon")
    assert isinstance(pool, concurrent.futures.ThreadPoolExecutor)  # what set_default_executor takes
    together = threading.Barrier(3, timeout=10)  # three calls that can end only together
    futures = [pool.submit(lambda i=i: (together.wait(), i)[1]) for i in range(3)]
    assert [f.result(timeout=10) for f in futures] == [0, 1, 2]
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=10)
    names = {pool.submit(lambda: threading.current_thread().name).result(timeout=10) for _ in range(20)}
    assert names <= {"test-daemon_0", "test-daemon_1", "test-daemon_2"}
    release, started = threading.Event(), threading.Semaphore(0)
    busy = [pool.submit(lambda: (started.release(), release.wait(10))[1]) for _ in range(3)]
    assert all(started.acquire(timeout=10) for _ in range(3))  # every thread held
    queued = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: None)
    release.set()
    assert all(f.result(timeout=10) is True for f in busy)

    async def on_loop() -> str:
        return await asyncio.to_thread(lambda: threading.current_thread().name)

    loop = asyncio.new_event_loop()
    loop.set_default_executor(runtime.DaemonExecutor(thread_name_prefix="test-loop"))
    try:
        assert loop.run_until_complete(on_loop()) == "test-loop_0"
    finally:
        loop.close()


@pytest.mark.parametrize("kind", ["executor", "worker"])
def test_a_thread_lets_go_of_a_call_before_the_caller_wakes(kind):
    """An env closed through a thread's call and dropped at once (``gc.collect()`` right after,
    which holds the GIL) must be collectable: the thread holds neither the call's function nor its
    arguments when the future wakes the caller (its done callbacks run then), and nothing of the
    result once the call is over."""
    class Job:
        def __call__(self, arg: object) -> object:
            gate.wait(10)
            return Result()

    class Arg:
        pass

    class Result:
        pass

    gate = threading.Event()
    job, arg = Job(), Arg()
    refs = (weakref.ref(job), weakref.ref(arg))
    if kind == "executor":
        pool = runtime.DaemonExecutor(max_workers=1, thread_name_prefix="test-let-go")
        future = pool.submit(job, arg)
    else:
        pool = runtime.Worker("test-let-go")
        pool.start()
        future = pool.submit(job, arg)
    held: list[tuple[object, object]] = []
    future.add_done_callback(lambda f: held.append((refs[0](), refs[1]())))
    del job, arg
    gate.set()
    result = future.result(timeout=10)
    assert held == [(None, None)]
    pool.submit(lambda: None).result(timeout=10)  # one thread: the first call is wholly over
    result_ref = weakref.ref(result)
    del result, future
    assert result_ref() is None  # the thread kept no reference to the result either
    pool.shutdown()


def test_daemon_executor_runs_the_calls_a_task_names_at_once_in_the_submitting_thread():
    """``INLINE_OFFLOADS``, set in a task's context, names calls (by the function
    ``asyncio.to_thread`` was given) that run at once where the task submits them: an episode
    skips the thread hop for its library's quick bookkeeping; every other call still goes to a
    thread, and so does every call of a task without it (another user of the same library on the
    same loop), and the setting reaches the tasks the named task starts."""

    def pure(x: int) -> tuple[int, threading.Thread]:
        return 2 * x, threading.current_thread()

    def fails() -> None:
        raise ValueError("from the call")

    def elsewhere() -> threading.Thread:
        return threading.current_thread()

    async def named() -> None:
        here = threading.current_thread()
        assert await asyncio.to_thread(pure, 21) == (42, here)
        assert (await asyncio.get_running_loop().run_in_executor(None, pure, 1))[1] is here
        with pytest.raises(ValueError, match="from the call"):
            await asyncio.to_thread(fails)
        assert (await asyncio.to_thread(elsewhere)) is not here
        assert (await asyncio.create_task(asyncio.to_thread(pure, 1)))[1] is here  # a task it starts

    async def unnamed() -> None:
        assert (await asyncio.to_thread(pure, 1))[1] is not threading.current_thread()

    async def calls() -> None:
        context = contextvars.copy_context()
        context.run(runtime.INLINE_OFFLOADS.set, lambda fn: fn in (pure, fails))
        await asyncio.get_running_loop().create_task(named(), context=context)
        await unnamed()
        assert runtime.INLINE_OFFLOADS.get() is None

    loop = asyncio.new_event_loop()
    pool = runtime.DaemonExecutor(thread_name_prefix="test-inline")
    loop.set_default_executor(pool)
    try:
        loop.run_until_complete(calls())
    finally:
        pool.shutdown(wait=False)
        loop.close()


def test_the_runtime_loop_runs_a_main_task_that_libraries_keep_their_threads_for():
    """The runtime loop runs one main task until exit, as ``asyncio.run`` does: anyio ties its
    worker threads to it, so one thread serves call after call from any task (without one, anyio
    scans every task of the loop on every call, and a thread ends with the task that started it),
    and the threads end when the main task ends at exit."""
    import anyio

    own = runtime.Runtime()

    async def worker_thread() -> threading.Thread:
        return await anyio.to_thread.run_sync(threading.current_thread)

    first = own.run_sync(worker_thread(), 10)
    assert own.run_sync(worker_thread(), 10) is first  # a second task, the same thread
    assert first is not threading.current_thread()
    own.close_at_exit()
    first.join(5)
    assert not first.is_alive()


_HUNG_THREAD = """
import asyncio, threading
from openenv_gym import runtime
from openenv_gym.errors import BackendTimeout

async def hang():
    await asyncio.to_thread(threading.Event().wait)  # a library's blocking call that never returns

for run in (runtime.run_sync, runtime.CallerLoop().run):
    try:
        run(hang(), 0.5)
    except BackendTimeout:
        print("timed out", flush=True)
print("end", flush=True)
"""


def test_a_blocking_call_that_never_returns_does_not_hold_the_exit():
    """A library's ``to_thread`` call stuck for good, on the runtime loop and on an env's own loop:
    the timeout gives up on it and the script ends (both loops' executors are daemon threads; a
    ThreadPoolExecutor's are joined at exit, and this script then never ended)."""
    process = subprocess.Popen([sys.executable, "-c", _HUNG_THREAD], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert out.split() == ["timed", "out", "timed", "out", "end"] and process.returncode == 0, (out, process.returncode)
