"""Who may use a page's server: whoever holds the token printed with its URL (Jupyter's model).

The servers listen on 127.0.0.1 only, but any user of the machine can reach a loopback port, and
rollouts hold tasks and answers while ``play`` drives a live session. So every route, the page,
its data and its API alike, needs the server's random token: in the URL's ``token`` query (what
the printed URL carries; the page's own WebSocket too) or in an ``Authorization: token ...``
header (what the page's scripts send, and scripts). No cookie ever holds it: browsers send a
host's cookies to every port of it, so another local server would collect it. Without a token a
route answers 401, with a wrong one 403; the token is compared in constant time and never logged
or echoed.

Beyond the token, what a browser could be tricked into:

* Another site's page making the browser call the server (CSRF, WebSocket hijacking): the browser
  holds no credential it would attach by itself, a state-changing request must be
  ``application/json`` (which a form cannot send, and a cross-site script cannot send without a
  preflight no route answers), and a request carrying a foreign ``Origin`` is refused.
* DNS rebinding (a hostile name that resolves to 127.0.0.1): the ``Host`` header must name the
  loopback address or ``localhost`` on this server's port.
* The token leaking through ``Referer`` or a cache: ``Referrer-Policy: no-referrer`` and
  ``Cache-Control: no-store`` on every answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

from openenv_gym.tokens import Guard, new_token

__all__ = ["Access", "new_token", "SECURITY_HEADERS"]

SECURITY_HEADERS = {
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Access:
    """The token check, as an aiohttp middleware (:meth:`middleware`) bound to one server.

    Args:
        token: the secret every request must carry.
        port: the port the server listens on (set once bound: ``Host`` and ``Origin`` must name it).
    """

    def __init__(self, token: str | None = None, port: int = 0):
        self.guard = Guard(token or new_token())
        self.port = port

    @property
    def token(self) -> str:
        return self.guard.token or ""

    def url(self, path: str = "/") -> str:
        """The URL to print: loopback, this port, the token in the query."""
        return f"http://127.0.0.1:{self.port}{path}?token={self.token}"

    def matches(self, given: str | None) -> bool:
        """Whether ``given`` is the token, in time independent of where they differ."""
        return given is not None and self.guard.matches(given)

    def _hosts(self) -> set[str]:
        return {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}

    def _origins(self) -> set[str]:
        return {f"http://{h}" for h in self._hosts()}

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await self._check(request, handler)
        if not response.prepared:  # a WebSocket's answer has gone out already
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
        return response

    async def _check(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.host not in self._hosts():
            return _refuse(403, "this server answers only on 127.0.0.1 and localhost")
        from_query = request.query.get("token")
        given = from_query or Guard.credential(request.headers.get(hdrs.AUTHORIZATION))
        status = self.guard.check(given)
        if status == 401:
            return _refuse(401, "this page needs the token printed with its URL (…/?token=…)")
        if status == 403:
            return _refuse(403, "wrong token: use the URL the command printed")
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is not None and origin not in self._origins():
            return _refuse(403, "requests from other sites are refused")
        if request.method not in ("GET", "HEAD") and request.content_type != "application/json":
            return _refuse(403, "state-changing requests must be application/json")
        return await handler(request)


def _refuse(status: int, text: str) -> web.Response:
    return web.json_response({"error": text}, status=status)
