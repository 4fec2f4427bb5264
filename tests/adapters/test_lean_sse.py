"""``serve.lean_sse``: a local server's SSE responses behave as sse-starlette's own, without
leaving a garbage cycle behind each one.

Each scenario runs in a child process (``lean_sse`` changes a library class for the whole
process), with a real uvicorn server on a Unix socket in a thread and httpx as the client.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("sse_starlette")
pytest.importorskip("uvicorn")

_SERVER = textwrap.dedent("""
    import asyncio, gc, os, sys, tempfile, threading, time
    import httpx, uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Route
    from sse_starlette.sse import EventSourceResponse
    from openenv_gym.adapters.local_servers import serve

    LEAN = sys.argv[1] == "lean"
    if LEAN:
        assert serve.lean_sse() and serve.lean_sse()  # idempotent
    closed = []

    async def quick(request):
        async def body():
            yield {"event": "task_id", "data": "t"}
            await asyncio.sleep(0)
            yield {"event": "end", "data": "result"}
        return EventSourceResponse(body())

    async def slow(request):  # pinged while it waits; its body is closed when the client leaves
        async def body():
            try:
                await asyncio.sleep(float(request.query_params.get("wait", "0.5")))
                yield {"event": "end", "data": "late"}
            finally:
                closed.append(True)
        return EventSourceResponse(body(), ping=0.1)

    async def failing(request):
        async def body():
            yield {"event": "task_id", "data": "t"}
            raise RuntimeError("the body failed")
        return EventSourceResponse(body())

    app = Starlette(routes=[Route("/quick", quick), Route("/slow", slow), Route("/failing", failing)])
    sock = os.path.join(tempfile.mkdtemp(), "s.sock")
    server = uvicorn.Server(uvicorn.Config(app, uds=sock, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    client = httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://local", timeout=10)
""")


_STOP = """
client.close()
server.should_exit = True
thread.join(30)
assert not thread.is_alive(), "the server thread did not stop"
print('ok')
"""


def _child(mode: str, scenario: str) -> str:
    # The server thread is stopped and joined before the interpreter exits: a daemon thread still
    # inside uvicorn during interpreter teardown crashed the child once (SIGSEGV after "ok").
    code = _SERVER + textwrap.dedent(scenario) + _STOP
    out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("mode", ["library", "lean"])
def test_streams_pings_disconnects_and_errors_as_the_library_does(mode):
    _child(mode, """
        body = client.get("/quick").text
        assert body.replace("\\r\\n", "\\n") == "event: task_id\\ndata: t\\n\\nevent: end\\ndata: result\\n\\n", body
        slow = client.get("/slow").text
        assert slow.count(": ping") >= 2 and "data: late" in slow, slow  # keep-alive while waiting
        with client.stream("GET", "/slow", params={"wait": "30"}) as stream:  # the client leaves
            next(stream.iter_raw())
        deadline = time.monotonic() + 5
        while not closed and time.monotonic() < deadline:
            time.sleep(0.02)
        assert closed, "the body of a stream whose client left was not closed"
        try:
            client.get("/failing")
        except httpx.HTTPError:
            pass  # the body's error ends the stream early
        assert client.get("/quick").status_code == 200  # the server goes on
    """)


@pytest.mark.parametrize("mode", ["library", "lean"])
def test_lean_responses_leave_no_garbage_cycles(mode):
    # The client's own garbage (httpx) is in the same process: count what the server's
    # responses leave to the collector, the response objects and the exceptions.
    out = _child(mode, """
        for _ in range(20):  # warm-up: imports, pools
            client.get("/quick")
        gc.collect()
        gc.disable()
        for _ in range(200):
            assert client.get("/quick").status_code == 200
        time.sleep(0.2)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = sum(isinstance(o, (EventSourceResponse, BaseException)) for o in gc.garbage)
        print("left", left)
    """)
    left = int(out.split("left ")[1].split()[0])
    if mode == "lean":
        assert left == 0, f"{left} responses and exceptions of 200 responses were left to the collector"
    else:  # what lean_sse is for (sse-starlette 2.x on anyio 4): a cycle per response
        assert left >= 200, (f"the library's own responses left {left} objects: if sse-starlette or anyio no "
                              "longer make a cycle per response, lean_sse is not needed any more")


def test_another_major_version_is_left_alone(monkeypatch):
    import importlib.metadata

    from openenv_gym.adapters.local_servers import serve

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "4.0.0")
    from sse_starlette.sse import EventSourceResponse

    before = EventSourceResponse.__call__
    assert serve.lean_sse() is False and EventSourceResponse.__call__ is before
