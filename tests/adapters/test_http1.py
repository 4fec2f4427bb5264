"""Tool calls over openenv_gym's own HTTP/1.1 connections (``adapters/net/http1.py``), against a server
that writes raw bytes (``tests/raw_http_server.py``, its own process, stopped by PID).

What a user relies on: every answer is the answer to its own call (a connection is reused only
after a complete response, never after a cancel or a stray reply), the pool holds at most
``max_connections``, and whatever bytes a server sends, a call ends with its result or a typed
error within the read limit, never a hang or a foreign exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openenv_gym.adapters.net import http1
from openenv_gym.adapters.ors.transport import ORSTransport, RunToolResult, Timeouts
from openenv_gym.errors import BackendTimeout, BackendUnavailable, ConfigurationError, OpenEnvGymError, ServerError
from openenv_gym.testing import procs

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).parents[1] / "raw_http_server.py"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    process = subprocess.Popen([sys.executable, str(SCRIPT)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               text=True)
    try:
        line = process.stdout.readline().strip()
        assert line.startswith("http://127.0.0.1:"), line
        yield line
    finally:
        procs.terminate(process)
    assert not procs.alive(process.pid)


def transport(url: str, *, read: float = 2.0, max_connections: int = 4) -> ORSTransport:
    link = ORSTransport(url, timeouts=Timeouts(connect=2.0, read=read), max_connections=max_connections)
    assert link._plain is not None, "plain http without a proxy takes http1's connections"
    return link


@contextlib.asynccontextmanager
async def linked(url: str, **kwargs) -> AsyncIterator[ORSTransport]:
    link = transport(url, **kwargs)
    try:
        yield link
    finally:
        await link.aclose()


async def call(link: ORSTransport, mode: str, raw: str | None = None) -> RunToolResult | str:
    return await link.call_tool(mode, "s1", "t", None if raw is None else {"raw": raw}, resume_attempts=0)


def conn_of(result: RunToolResult | str) -> str:
    assert isinstance(result, RunToolResult) and result.ok and result.output is not None, result
    text = result.output.blocks[0].text
    assert text is not None and text.startswith("conn "), text
    return text


def run(coro_fn, *args, loop_factory=None):
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(coro_fn(*args))


def _loops() -> list:
    """asyncio's loop, and uvloop's where installed (Ray actors and ``serve`` run on it)."""
    try:
        import uvloop
    except ImportError:
        return [None]
    return [None, uvloop.new_event_loop]


LOOPS = pytest.mark.parametrize("loop_factory", _loops(), ids=lambda f: "asyncio" if f is None else "uvloop")


@LOOPS
def test_calls_reuse_one_connection_and_a_body_ended_by_close_is_read_whole(url, loop_factory):
    async def go() -> None:
        async with linked(url) as link:
            first = [conn_of(await call(link, "ok")) for _ in range(3)]
            assert len(set(first)) == 1, first  # one keep-alive connection for all three
            assert conn_of(await call(link, "eofbody")) == first[0]
            assert conn_of(await call(link, "ok")) != first[0]  # that connection ended with its body
    run(go, loop_factory=loop_factory)


def test_plain_requests_share_the_pool_and_a_header_cannot_smuggle_a_line(url):
    async def go() -> None:
        async with linked(url) as link:
            first = conn_of(await call(link, "ok"))
            reply = await link.request("GET", "/ok/prompt", sid="s1")  # read whole, on the same connection
            assert reply.status_code == 200 and f'"text": "{first}"' in reply.text, reply
            with pytest.raises(ConfigurationError, match="line break"):
                await link.request("GET", "/ok/prompt", headers={"X-Note": "a\r\nX-Injected: 1"})
            assert conn_of(await call(link, "ok")) == first
    run(go)


def test_a_connection_idle_past_the_limit_is_not_reused(url, monkeypatch):
    """A server closes idle connections after its keep-alive limit (uvicorn: 5 s); a request written
    as it does would be lost, so the pool never reuses a connection near that age."""
    monkeypatch.setattr(http1, "IDLE_LIMIT", 0.2)

    async def go() -> None:
        async with linked(url) as link:
            first = conn_of(await call(link, "ok"))
            assert conn_of(await call(link, "ok")) == first
            await asyncio.sleep(0.35)
            assert conn_of(await call(link, "ok")) != first
    run(go)


def _sockets() -> int:
    """Sockets this process holds open."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            count += (fds / fd.name).readlink().name.startswith("socket:")
    return count


def test_a_burst_s_connections_close_once_idle_past_the_limit_with_no_call_after_it(url, monkeypatch):
    """After a burst (a reset of many sessions at once) nothing may call that pool again; its idle
    connections still close, so thousands of sessions never hold twice their sockets here and in
    the server."""
    monkeypatch.setattr(http1, "IDLE_LIMIT", 0.2)

    async def go() -> None:
        async with linked(url, max_connections=6) as link:
            before = _sockets()
            results = await asyncio.gather(*(call(link, "slowok") for _ in range(6)))
            assert len({conn_of(r) for r in results}) == 6
            assert _sockets() == before + 6  # kept for reuse
            await asyncio.sleep(0.6)
            assert _sockets() == before
            conn_of(await call(link, "ok"))  # and the pool still works
    run(go)


@LOOPS
def test_a_result_returns_before_its_stream_ends_and_the_connection_is_reused_after_the_end(url, loop_factory):
    """A busy server writes a stream's end well after its result: the step does not wait for it,
    and the connection goes back to the pool when it comes (a dropped one is replaced by a new
    connection, which waits behind the busy server's accept queue)."""
    async def go() -> None:
        async with linked(url) as link:
            loop = asyncio.get_running_loop()
            start = loop.time()
            first = conn_of(await call(link, "lateend"))
            assert loop.time() - start < 0.25  # the end comes 0.3 s after the result
            await asyncio.sleep(0.5)
            assert conn_of(await call(link, "ok")) == first
    run(go, loop_factory=loop_factory)


@pytest.mark.parametrize("mode", ["noend", "moreafter"])
def test_a_stream_that_never_ends_or_sends_more_after_its_result_loses_its_connection(url, mode, monkeypatch):
    from openenv_gym.adapters.ors import transport as ors_transport

    monkeypatch.setattr(ors_transport, "DETACHED_END_GRACE", 0.3)

    async def go() -> None:
        async with linked(url) as link:
            before = _sockets()
            first = conn_of(await call(link, mode))
            assert _sockets() == before + 1
            await asyncio.sleep(0.6)  # no call meanwhile: the pool's own timer drops it
            assert _sockets() == before
            assert conn_of(await call(link, "ok")) != first
    run(go)


def test_a_connection_the_server_closed_while_idle_is_replaced(url):
    async def go() -> None:
        async with linked(url) as link:
            before = conn_of(await call(link, "closeafter"))
            await asyncio.sleep(0.4)
            assert conn_of(await call(link, "ok")) != before
    run(go)


def test_a_reply_nobody_asked_for_is_never_read_as_the_next_one(url):
    async def go() -> None:
        async with linked(url) as link:
            first = conn_of(await call(link, "twice"))
            await asyncio.sleep(0.1)  # the stray reply is in by now
            second = await call(link, "ok")
            assert conn_of(second) != first  # the connection that carried the stray reply was dropped
    run(go)


@pytest.mark.parametrize(("mode", "error", "says"), [
    ("garbage", ServerError, "not HTTP/1.1"),
    ("bighead", ServerError, "headers are over 65536 bytes"),
    ("cut", BackendUnavailable, "cannot be reached .*Dropped"),
    ("hang", BackendTimeout, "read_timeout=0.5"),
])
@LOOPS
def test_a_broken_answer_is_a_typed_error_and_the_next_call_works(url, mode, error, says, loop_factory):
    async def go() -> None:
        async with linked(url, read=0.5, max_connections=1) as link:
            with pytest.raises(error, match=says):
                await call(link, mode)
            conn_of(await call(link, "ok"))  # one connection allowed: the broken one was given back closed
    run(go, loop_factory=loop_factory)


def test_the_pool_holds_at_most_max_connections_and_every_call_gets_its_answer(url):
    async def go() -> None:
        async with linked(url, max_connections=2) as link:
            results = await asyncio.gather(*(call(link, "slowok") for _ in range(6)))
            conns = {conn_of(r) for r in results}
            assert len(conns) <= 2, conns
    run(go)


def test_a_cancelled_call_does_not_leave_its_connection_behind(url):
    async def go() -> None:
        async with linked(url, max_connections=1) as link:
            task = asyncio.ensure_future(call(link, "hang"))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # the only connection was mid-response: reusing it would read the hung answer's rest
            conn_of(await asyncio.wait_for(call(link, "ok"), 5))
    run(go)


def test_closing_the_transport_ends_a_call_in_flight(url):
    async def go() -> None:
        link = transport(url, read=30.0)
        task = asyncio.ensure_future(call(link, "hang"))
        await asyncio.sleep(0.3)
        await link.aclose()
        with pytest.raises(BackendUnavailable, match="closed"):
            await asyncio.wait_for(task, 5)
    run(go)


# -- whatever the bytes: a result or a typed error, within the read limit ------------------------------
_HEADERS = st.sampled_from([
    "content-type: text/event-stream", "content-type: application/json", "transfer-encoding: chunked",
    "content-length: 0", "content-length: 5", "content-length: 999999", "content-length: -1",
    "connection: close", "connection: keep-alive", "transfer-encoding: gzip", "x: \x00\xff",
])
_BODIES = st.sampled_from([
    "", "event: end\ndata: {\"ok\": true}\n\n", "event: end\ndata: {\"ok\": tru", "5\r\nevent\r\n0\r\n\r\n",
    "zz\r\nnope\r\n", "event: error\ndata: boom\n\n", "data: x\n\n" * 50, "\r\n\r\n", "event: end\ndata: [1, 2]\n\n",
])
_RESPONSES = st.one_of(
    st.text(alphabet=st.characters(max_codepoint=255), max_size=300),
    st.builds(lambda status, headers, body: f"HTTP/1.1 {status} X\r\n" + "".join(h + "\r\n" for h in headers)
              + "\r\n" + body,
              st.sampled_from(["200", "204", "404", "503", "99", "1000", "abc"]),
              st.lists(_HEADERS, max_size=4), _BODIES),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=_RESPONSES)
def test_any_answer_gives_a_result_or_a_typed_error_in_bounded_time(url, raw):
    async def go() -> None:
        async with linked(url, read=1.0) as link:
            try:
                result = await asyncio.wait_for(call(link, "raw", raw), 10)
            except OpenEnvGymError:  # the package's own, typed (an HTTP 4xx is a ConfigurationError)
                return
            assert isinstance(result, (RunToolResult, str))
    run(go)



def test_out_of_descriptors_one_pool_s_idle_connections_are_closed_for_another_s_call(url):
    """A vector env holds a pool per adapter and server, and one pool's idle connections cannot
    serve another's calls: when the process has no descriptor left, they are given back, so the
    call connects instead of failing (a reset of 16,384 sub-envs went past 20,000 otherwise).
    Run in a subprocess: it takes every descriptor it may open."""
    code = textwrap.dedent(f"""
        import asyncio
        from openenv_gym.adapters.ors.transport import ORSTransport, Timeouts

        async def main():
            a = ORSTransport({url!r}, timeouts=Timeouts(connect=2.0, read=5.0), max_connections=4)
            b = ORSTransport({url!r}, timeouts=Timeouts(connect=2.0, read=5.0), max_connections=4)
            await asyncio.gather(*(a.call_tool("slowok", "s", "t", None, resume_attempts=0) for _ in range(4)))
            hog = []
            try:
                while True:
                    hog.append(open("/dev/null"))
            except OSError:
                pass
            result = await b.call_tool("ok", "s", "t", None, resume_attempts=0)  # a's 4 idle ones are all there is
            print("b got", result.ok)
            for f in hog:
                f.close()
            print("a still works", (await a.call_tool("ok", "s", "t", None, resume_attempts=0)).ok)
            await a.aclose()
            await b.aclose()

        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "b got True" in out.stdout and "a still works True" in out.stdout, out.stdout + out.stderr[-2000:]


def test_more_calls_at_once_than_descriptors_allow_wait_their_turn_and_all_succeed(url):
    """16,384 sessions have nearly all a call in flight, each on a connection: the pools of a
    process share a budget (its open-files limit less a reserve), so calls beyond it wait for a
    connection, taking idle ones from other pools, instead of failing for want of descriptors.
    In a subprocess whose limit is 300 files: a budget of 44 connections for 300 calls at once (more than it may open)."""
    code = textwrap.dedent(f"""
        import asyncio, os, resource
        from openenv_gym.adapters.ors.transport import ORSTransport, Timeouts

        resource.setrlimit(resource.RLIMIT_NOFILE, (300, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        def sockets():
            n = 0
            for fd in os.listdir("/proc/self/fd"):
                try:
                    n += os.readlink("/proc/self/fd/" + fd).startswith("socket:")
                except OSError:
                    pass
            return n

        async def main():
            links = [ORSTransport({url!r}, timeouts=Timeouts(connect=2.0, read=30.0), max_connections=100)
                     for _ in range(3)]
            await links[0].call_tool("ok", "s", "t", None, resume_attempts=0)  # an idle one in another pool
            base = sockets() - 1
            peak = 0
            done = False

            async def watch():
                nonlocal peak
                while not done:
                    peak = max(peak, sockets() - base)
                    await asyncio.sleep(0.01)

            watcher = asyncio.create_task(watch())
            results = await asyncio.gather(*(links[k % 3].call_tool("slowok", "s", "t", None, resume_attempts=0)
                                             for k in range(300)), return_exceptions=True)
            done = True
            await watcher
            print("ok", sum(getattr(r, "ok", False) is True for r in results), "peak", peak)
            print("errors", [repr(r)[:200] for r in results if isinstance(r, BaseException)][:3])
            for link in links:
                await link.aclose()

        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ok 300 " in out.stdout, out.stdout + out.stderr[-2000:]
    peak = int(out.stdout.split("peak ", 1)[1].split()[0])
    assert peak <= 44, out.stdout
