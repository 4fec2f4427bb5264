"""A served env's life: it prints its URL once it answers, stops cleanly on SIGINT and SIGTERM
(status 0) or when interrupted while starting, ends every session it opened, and leaves no
process behind; and who may reach it: the token on every route and WebSocket upgrade, loopback
unless a token is given, nothing secret printed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from serve_helpers import ARITHMETIC, PROBE, serve_process  # noqa: F401 (a fixture)

import openenv_gym
from openenv_gym.errors import ConfigurationError
from openenv_gym.pool import SessionPool
from openenv_gym.serving.access import Access, is_loopback
from openenv_gym.testing import procs


def _create(url: str, headers: dict, index: int = 0) -> str:
    sid = uuid.uuid4().hex
    reply = httpx.post(f"{url}/create", json={"split": "train", "index": index},
                       headers={**headers, "X-Session-ID": sid}, timeout=30)
    assert reply.status_code == 200, reply.text
    return sid


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_server_with_its_sessions_open_and_leaves_nothing(serve_process, sig):
    served = serve_process(ARITHMETIC, "--max-sessions", "4")
    assert served.url.startswith("http://127.0.0.1:")
    started = procs.descendants(served.pid)
    assert any("local_servers/serve.py" in procs.cmdline(p) for p in started), "the env's local server runs under the server"
    for index in range(3):
        _create(served.url, served.headers, index)  # episodes left running
    assert served.stop(sig) == 0  # stop() also checks that no process it started is left
    assert served.output().rstrip().endswith("stopped")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{served.url}/health", timeout=5)


def test_a_signal_mid_step_ends_the_step_and_its_stream_at_once(serve_process):
    """A call that would run for a minute when SIGTERM comes: the server stops within seconds, and
    the client's stream ends with an ``error`` event rather than hanging or being cut."""
    import threading

    served = serve_process(*PROBE, "--max-sessions", "2")
    sid = uuid.uuid4().hex
    headers = {**served.headers, "X-Session-ID": sid}
    assert httpx.post(f"{served.url}/create", json={"split": "train", "index": 0}, headers=headers).status_code == 200
    answer: dict = {}

    def slow_call() -> None:
        answer["text"] = httpx.post(f"{served.url}/ors/call", json={"name": "slow", "input": {"seconds": 60}},
                                    headers=headers, timeout=90).text

    caller = threading.Thread(target=slow_call)
    caller.start()
    time.sleep(1.0)  # the call is under way (its task_id is out)
    start = time.monotonic()
    assert served.stop() == 0
    caller.join(30)
    assert time.monotonic() - start < 30 and not caller.is_alive()
    assert "event: error" in answer["text"] and "cancelled" in answer["text"]


def test_stopping_ends_every_session_it_opened(monkeypatch):
    """Every session still open at shutdown is ended (its slot given back, its episode ended on the
    backend) before the pool closes."""
    seen: dict[str, int] = {}
    close = SessionPool.close

    def spying_close(pool: SessionPool) -> None:
        seen.setdefault("free", pool.free)
        seen.setdefault("size", pool.size)
        close(pool)

    monkeypatch.setattr(SessionPool, "close", spying_close)
    server = openenv_gym.serving.Server(ARITHMETIC, max_sessions=4)
    url = server.start()
    try:
        for index in range(3):
            _create(url, url.headers, index)
        assert server.served.active == 3 and server.pool.free == 1
    finally:
        server.stop()
    assert seen == {"free": 4, "size": 4}
    assert server.served.active == 0


def test_the_python_api_serves_until_a_signal_and_as_a_context_manager():
    code = ("import openenv_gym, sys; sys.exit(openenv_gym.serve('openenv/Arithmetic-v0', protocol='openenv', "
            "max_sessions=2))")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={k: v for k, v in os.environ.items() if k != "OPENENV_GYM_TOKEN"})
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("press Ctrl-C"):
                break
        url = next(ln for ln in lines if ln.startswith("serving")).split(" at ")[1].split()[0]
        token = next(ln for ln in lines if ln.startswith("token: ")).split()[1]
        assert httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {token}"}).json() == {"status": "healthy"}
        children = procs.descendants(process.pid)
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
        assert procs.wait_dead(children, 30) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    before = set(procs.descendants())
    with openenv_gym.served(ARITHMETIC, max_sessions=2) as url:
        assert isinstance(url, str) and url.token and url.token not in repr(url)
        assert httpx.get(f"{url}/health", headers=url.headers).json() == {"status": "ok"}
    assert procs.wait_dead(set(procs.descendants()) - before, 30) == []


def test_interrupted_while_starting_leaves_nothing():
    env = {k: v for k, v in os.environ.items() if k != "OPENENV_GYM_TOKEN"}
    process = subprocess.Popen([sys.executable, "-m", "openenv_gym.cli", "serve", ARITHMETIC], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("local_servers/serve.py" in procs.cmdline(p)
                                                      for p in procs.descendants(process.pid)):
            time.sleep(0.02)  # its env's server is starting
        children = procs.descendants(process.pid)
        process.send_signal(signal.SIGINT)
        code = process.wait(60)
        out = process.stdout.read()
        # Interrupted before it answered (130, "interrupted"), or just after (0, "stopped"): never a leak.
        assert (code, "interrupted" in out) == (130, True) or (code, "stopped" in out) == (0, True), (code, out)
        assert procs.wait_dead(children, 30) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- access ----------------------------------------------------------------------------------------------
def test_every_route_and_the_websocket_upgrade_need_the_token(serve_process):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    served = serve_process(ARITHMETIC, "--protocol", "openenv", "--max-sessions", "2", token=None)
    printed = [ln for ln in served.output().splitlines() if ln.startswith("token: ")]
    assert len(printed) == 1 and served.token in printed[0]  # generated, printed once
    url = served.url
    for method, path in (("GET", "/health"), ("GET", "/schema"), ("GET", "/metadata"), ("POST", "/mcp"),
                         ("GET", "/list_environments"), ("GET", "/Arithmetic/splits"), ("GET", "/nope")):
        assert httpx.request(method, url + path).status_code == 401
        wrong = httpx.request(method, url + path, headers={"Authorization": "Bearer " + "x" * 43})
        assert wrong.status_code == 403 and "x" * 43 not in wrong.text
    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token-wrong"}, {"X-API-Key": "nope"}):
        with pytest.raises(InvalidStatus):
            connect(url.replace("http", "ws") + "/ws", additional_headers=headers, open_timeout=10)
    assert httpx.get(url + "/health", headers={"X-API-Key": served.token}).status_code == 200
    with connect(url.replace("http", "ws") + "/ws", additional_headers=served.headers) as ws:
        ws.send('{"type": "reset", "data": {"seed": 1}}')
        assert '"observation"' in ws.recv()
    assert served.stop() == 0


def test_a_given_token_is_never_printed(serve_process):
    served = serve_process(ARITHMETIC, "--max-sessions", "2")
    reply = httpx.post(f"{served.url}/create", json={"split": "bad", "index": 0},
                       headers={**served.headers, "X-Session-ID": "s"})
    assert reply.status_code == 400 and served.token not in reply.text
    assert served.stop() == 0
    assert served.token not in served.output() and "token:" not in served.output()


def test_binding_beyond_loopback_needs_a_token():
    env = {k: v for k, v in os.environ.items() if k != "OPENENV_GYM_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "openenv_gym.cli", "serve", ARITHMETIC, "--host", "0.0.0.0"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a token" in done.stderr and "OPENENV_GYM_TOKEN" in done.stderr
    assert [is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "10.1.2.3", "example.org")] == \
        [True, True, True, False, False, False]
    assert Access.for_bind("10.1.2.3", "t" * 32).token == "t" * 32
    with pytest.raises(ConfigurationError, match="at least 16"):
        Access.for_bind("127.0.0.1", "short")


def test_mistakes_on_the_command_line_are_one_clear_line(tmp_path, capsys):
    from openenv_gym.cli import main

    taken = tmp_path / "taken.sock"
    taken.write_text("")
    before = set(procs.descendants())
    for args, says in ((["openenv/NoSuch-v0"], "NoSuch"), ([ARITHMETIC, "--uds", str(taken)], "exists"),
                       ([ARITHMETIC, "colour=blue", "--protocol", "openenv"], "colour"),
                       ([ARITHMETIC, "--address", "127.0.0.1:6379"], "--backend ray"),
                       ([ARITHMETIC, "--max-sessions", "0"], "max_sessions")):
        assert main(["serve", *args]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, (args, err)
    assert set(procs.descendants()) == before  # refused before anything started
