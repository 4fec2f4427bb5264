"""Connections that never pass the token check are closed: silent ones after ``auth_timeout``,
half-sent ones too, and beyond MAX_PENDING_CONNECTIONS the oldest at once, while a client with
the token is served throughout."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from openenv_gym.serving import served
from openenv_gym.serving.limits import MAX_PENDING_CONNECTIONS


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (whatever it answered first is read and dropped)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_silent_and_half_sent_connections_are_closed_and_token_holders_are_served():
    with served("openenv/Arithmetic-v0", in_process=True, auth_timeout=2.0) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        idle = [socket.create_connection((host, int(port))) for _ in range(MAX_PENDING_CONNECTIONS + 40)]
        half = socket.create_connection((host, int(port)))
        half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        wrong = socket.create_connection((host, int(port)))
        wrong.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope-nope-nope\r\n\r\n")
        try:
            time.sleep(1.2)
            # Over the cap: the oldest unproven connections went at once, the newest wait their time.
            assert sum(closed_by_server(s) for s in idle[:40]) == 40
            assert not any(closed_by_server(s) for s in idle[-10:])
            with httpx.Client(headers=url.headers, timeout=10) as client:
                assert client.get(f"{url}/health").json() == {"status": "ok"}
                time.sleep(2.5)
                # A connection that passed the token check is kept (keep-alive) after the timeout...
                assert client.get(f"{url}/health").json() == {"status": "ok"}
            # ... while the rest, silent, half-sent or refused, are gone.
            assert all(closed_by_server(s) for s in [*idle, half, wrong])
        finally:
            for s in [*idle, half, wrong]:
                s.close()


def test_a_server_sized_for_many_sessions_lets_as_many_clients_connect_at_once():
    # 4,096 clients of a server started with --max-sessions 4096 connect together; under load
    # their first requests sit unread for a while, so they must not be cut off as idle ones are
    # (ORS clients' resets failed "the server closed the connection" at 4,096, benchmarks/scale.py)
    sessions = 2 * MAX_PENDING_CONNECTIONS
    with served("openenv/Arithmetic-v0", in_process=True, auth_timeout=5.0, max_sessions=sessions) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        waiting = [socket.create_connection((host, int(port))) for _ in range(sessions)]
        try:
            time.sleep(1.2)
            assert not any(closed_by_server(s) for s in waiting)
            extra = [socket.create_connection((host, int(port))) for _ in range(40)]  # beyond the sessions
            time.sleep(1.2)
            assert sum(closed_by_server(s) for s in waiting[:40]) == 40  # the oldest go, as before
            for s in extra:
                s.close()
        finally:
            for s in waiting:
                s.close()


def test_auth_timeout_must_be_positive():
    from openenv_gym.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="auth_timeout"):
        served("openenv/Arithmetic-v0", auth_timeout=0).__enter__()


def test_wrong_tokens_are_slowed_and_malformed_requests_are_counted_not_quoted():
    from serve_helpers import ARITHMETIC, start_serve

    served = start_serve(ARITHMETIC, "in_process=true", "--max-sessions", "2")
    try:
        with httpx.Client(timeout=30) as client:
            answers = [client.get(f"{served.url}/health", headers={"Authorization": f"Bearer wrong-{i:012d}"}).status_code
                       for i in range(60)]
            assert answers[:20] == [403] * 20 and 429 in answers  # a burst, then refused outright
            assert client.get(f"{served.url}/health", headers=served.headers).json() == {"status": "ok"}  # never the right one
        host, port = served.url.removeprefix("http://").rsplit(":", 1)
        for _ in range(200):
            with socket.create_connection((host, int(port))) as raw:
                raw.sendall(b"GET /x?token=" + served.token.encode() + b" HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n")
                raw.recv(1000)
        time.sleep(0.5)
        printed = served.output()
        assert served.token not in printed and "Traceback" not in printed and "Content-Length" not in printed
        assert printed.count("malformed request") <= 2, printed[-2000:]
        assert "refused 1 malformed request(s) (BadHttpMessage)" in printed
    finally:
        assert served.stop() == 0
