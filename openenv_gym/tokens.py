"""The one token guard every server of the package uses: a random secret, read from a request, compared in constant time.

``serve``, the ``view``/``play`` pages, each local env server and the Verifiers policy endpoint
all listen where other users of the machine can connect, so each holds a :class:`Guard`. The
standard library only: a local server loads this file by path, without the package.

>>> guard = Guard("s3cret-token-of-16+")
>>> guard.check(Guard.credential("Bearer s3cret-token-of-16+")), guard.check(None), guard.check("nope")
(200, 401, 403)
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Guard", "new_token"]

SCHEMES = ("bearer", "token")
"""``Authorization`` schemes that carry the token (matched in any case, as RFC 9110 says)."""


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


class Guard:
    """Whether a request holds the token: ``check`` gives 200 (it does, or no token is set), 401
    (it holds none) or 403 (a wrong one). Nothing here logs or echoes what it is given."""

    def __init__(self, token: str | None):
        self._token = token.encode() if token is not None else None

    @property
    def token(self) -> str | None:
        return self._token.decode() if self._token is not None else None

    @staticmethod
    def credential(authorization: str | bytes | None, api_key: str | bytes | None = None) -> str | None:
        """The token a request offers: ``Authorization: Bearer <t>`` (or ``token <t>``), else ``X-API-Key``."""
        if isinstance(authorization, bytes):
            authorization = authorization.decode("latin-1")
        if isinstance(api_key, bytes):
            api_key = api_key.decode("latin-1")
        if authorization:
            scheme, _, given = authorization.strip().partition(" ")
            if scheme.lower() in SCHEMES and given.strip():
                return given.strip()
        return api_key or None

    def matches(self, given: str | None) -> bool:
        """Whether ``given`` is the token, in time independent of where they differ."""
        if self._token is None:
            return True
        return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self._token)

    def check(self, given: str | None) -> int:
        """200, 401 or 403 for a request offering ``given`` (see :meth:`credential`)."""
        if self._token is None or self.matches(given):
            return 200
        return 401 if not given else 403

    def asgi(self, app: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        """``app`` behind this guard, as ASGI middleware: a refused request gets 401 (a WebSocket is
        closed with 1008) before the app sees it; lifespan events pass through."""

        async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] in ("http", "websocket"):
                headers = dict(scope.get("headers", ()))
                status = self.check(self.credential(headers.get(b"authorization"), headers.get(b"x-api-key")))
                if status != 200:
                    if scope["type"] == "websocket":
                        await send({"type": "websocket.close", "code": 1008})
                        return
                    body = b'{"detail":"missing or wrong server token"}'
                    await send({"type": "http.response.start", "status": 401, "headers": [
                        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", b"Bearer")]})
                    await send({"type": "http.response.body", "body": body})
                    return
            await app(scope, receive, send)

        return guarded
