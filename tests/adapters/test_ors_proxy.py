"""A remote ORS server reached through the proxy of ``HTTP_PROXY`` (with its credentials), past it
with ``NO_PROXY``, and with ``.netrc`` credentials: what aiohttp's ``trust_env`` would do, read
once per transport instead of on every request."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

import openenv_gym  # noqa: F401
from openenv_gym.testing import procs

sys.path.insert(0, str(Path(__file__).parents[1]))
from conftest import free_port  # noqa: E402

HINT = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "hint", "arguments": json.dumps({})}}]}


@pytest.fixture
def proxy(tmp_path):
    log, port = tmp_path / "proxy.log", free_port()
    process = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "forward_proxy.py"), str(port), str(log)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # listening: a connection is accepted (a request would be forwarded)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"127.0.0.1:{port}", log
    procs.terminate(process)


def play(url: str) -> list:
    env = gym.make("openenv/ORS-v0", url=url, env_name="probe")
    try:
        obs, _ = env.reset(options={"index": 0})
        return [obs, env.step(HINT)[0]]
    finally:
        env.close()


def test_requests_go_through_the_environments_proxy_with_its_credentials(ors_server, proxy, monkeypatch, tmp_path):
    address, log = proxy
    direct = play(ors_server.url)
    monkeypatch.setenv("HTTP_PROXY", f"http://user:p%40ss@{address}")
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    assert play(ors_server.url) == direct  # the episode is the same through the proxy
    lines = log.read_text().splitlines()
    assert any(f"POST {ors_server.url}/create" in line for line in lines)
    assert any(f"POST {ors_server.url}/probe/call" in line for line in lines)  # the SSE stream too
    assert all("proxy-auth=Basic dXNlcjpwQHNz" in line for line in lines), lines  # user:p@ss


def test_no_proxy_bypasses_it_and_netrc_credentials_are_sent(ors_server, proxy, monkeypatch, tmp_path):
    address, log = proxy
    monkeypatch.setenv("HTTP_PROXY", f"http://{address}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    play(ors_server.url)
    assert not log.exists() or log.read_text() == ""
    # netrc: read for the server's host; sent as Basic auth (seen by the proxy, which logs it)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login agent password s3cret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("NO_PROXY", "")
    play(ors_server.url)
    lines = log.read_text().splitlines()
    assert lines and all("auth=Basic YWdlbnQ6czNjcmV0" in line for line in lines)  # agent:s3cret
