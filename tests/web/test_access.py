"""Nobody without the printed token reads rollouts or drives a session, on either server.

Both servers run for real on 127.0.0.1 (as the commands run them, on a thread). Every route
answers 401 without a token and 403 with a wrong one, the API and the WebSocket included; a
foreign Host (DNS rebinding), a foreign Origin (another site's page) and a form-encoded POST
(CSRF) are refused even with the token; the token never reaches a log.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import gymnasium as gym
import httpx
import pytest
from web_fixtures import rollout_file, serve, started_worker  # noqa: F401 (pytest fixtures, used by name)

from openenv_gym.web.access import Access
from openenv_gym.web.play import PlaySession
from openenv_gym.web.play import make_app as play_app
from openenv_gym.web.serving import LoopbackServer
from openenv_gym.web.view import view_server

VIEW_ROUTES = [("GET", "/"), ("GET", "/api/episode/0"), ("GET", "/api/search?q=a"), ("GET", "/nope")]
PLAY_ROUTES = [("GET", "/"), ("GET", "/api/state"), ("POST", "/api/reset"), ("POST", "/api/step"),
               ("POST", "/api/save"), ("GET", "/api/live")]


@pytest.fixture
def view(serve, rollout_file: Path):
    server, _ = view_server([rollout_file])
    return serve(server)


@pytest.fixture
def play(serve, tmp_path: Path):
    env = gym.make("openenv/Arithmetic-v0")
    session = PlaySession(env, "openenv/Arithmetic-v0", tmp_path / "play.jsonl")
    session.reset(seed=0)
    return serve(LoopbackServer(play_app(session, started_worker(), linger=60), Access()))


def _requests(served, routes, **kwargs):
    with httpx.Client(base_url=served.base, follow_redirects=False, timeout=30) as client:
        for method, path in routes:
            yield path, client.request(method, path, json={} if method == "POST" else None, **kwargs)


@pytest.mark.parametrize("which", ["view", "play"])
def test_every_route_needs_the_token(request, which: str) -> None:
    served = request.getfixturevalue(which)
    routes = VIEW_ROUTES if which == "view" else PLAY_ROUTES
    for path, response in _requests(served, routes):
        assert response.status_code == 401, path
        assert served.token not in response.text
    for path, response in _requests(served, [(m, p + ("&" if "?" in p else "?") + "token=wrong") for m, p in routes]):
        assert response.status_code == 403, path
    for path, response in _requests(served, routes, headers={"Authorization": "token " + served.token[:-1] + "x"}):
        assert response.status_code == 403, path
    with httpx.Client(base_url=served.base, timeout=30) as client:  # a cookie is no credential here
        client.cookies.set(f"openenv_gym_{served.server.port}", served.token)
        assert client.get("/").status_code == 401


@pytest.mark.parametrize("which", ["view", "play"])
def test_the_printed_url_opens_the_page_and_no_cookie_carries_the_token(request, which: str) -> None:
    """Browsers send a host's cookies to every port of it: a token in a cookie would reach any
    other server on 127.0.0.1. The page keeps it in its URL and sends it as a header."""
    served = request.getfixturevalue(which)
    assert served.url == f"{served.base}/?token={served.token}"
    assert f"test: {served.url}" in served.output.getvalue()
    with httpx.Client(timeout=30) as client:
        page = client.get(served.url, follow_redirects=False)
        assert "set-cookie" not in page.headers and not client.cookies
        assert page.status_code == 200 and "<html" in page.text
        assert client.get(served.base + "/").status_code == 401  # nothing was kept for the next request
        assert served.token not in page.text
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "'unsafe-inline'" not in csp
        assert page.headers["referrer-policy"] == "no-referrer" and page.headers["cache-control"] == "no-store"
    api = httpx.get(served.base + ("/api/episode/0" if which == "view" else "/api/state"),
                    headers={"Authorization": f"token {served.token}"}, timeout=30)
    assert api.status_code == 200 and api.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize("which", ["view", "play"])
def test_rebinding_other_sites_and_forms_are_refused_even_with_the_token(request, which: str) -> None:
    served = request.getfixturevalue(which)
    auth = {"Authorization": f"token {served.token}"}
    with httpx.Client(base_url=served.base, timeout=30) as client:
        assert client.get("/", headers={**auth, "Host": f"evil.example:{served.server.port}"}).status_code == 403
        assert client.get("/", headers={**auth, "Host": "127.0.0.1:1"}).status_code == 403
        assert client.get("/", headers={**auth, "Origin": "http://evil.example"}).status_code == 403
        form = client.post("/api/save" if which == "play" else "/", headers=auth, data={"a": "b"})
        assert form.status_code == 403
        assert client.get("/", headers={**auth, "Host": f"localhost:{served.server.port}"}).status_code == 200


def test_the_websocket_needs_the_token_and_our_origin(play) -> None:
    async def attempt(query: str, origin: str | None) -> int:
        headers = {"Origin": origin} if origin else {}
        async with aiohttp.ClientSession() as http:
            try:
                async with http.ws_connect(f"{play.base}/api/live{query}", headers=headers) as ws:
                    await ws.close()
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    assert asyncio.run(attempt("", None)) == 401
    assert asyncio.run(attempt("?token=nope", None)) == 403
    assert asyncio.run(attempt(f"?token={play.token}", "http://evil.example")) == 403
    assert asyncio.run(attempt(f"?token={play.token}", play.base)) == 101


def test_the_token_is_never_logged(serve, rollout_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server, _ = view_server([rollout_file])
    served = serve(server)
    with httpx.Client(timeout=30) as client:
        client.get(served.url)
        client.get(served.base + "/api/episode/0")
        client.get(served.base + f"/api/episode/zz?token={served.token}")
        client.get(served.base + f"/?token={served.token}x")
    served.stop()
    # Everything logged in this process but by the test's own HTTP client, which logs its URLs.
    server_side = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    logged = "\n".join(r.getMessage() + str(r.args) + str(r.exc_text or "") for r in server_side)
    assert served.token not in logged
    assert served.output.getvalue().count(served.token) == 1  # printed once, in the URL


def test_the_server_listens_on_loopback_only(view) -> None:
    import socket

    for family, address in [(socket.AF_INET, ("127.0.0.2", view.server.port))]:
        with socket.socket(family) as s, pytest.raises(OSError):
            s.settimeout(2)
            s.connect(address)
    assert Access(port=1).matches(None) is False
    assert Access("abc").matches("\udcff") is False  # a lone surrogate in a query: refused, no crash
