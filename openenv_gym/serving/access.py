"""Who may use a served env: whoever holds its token (or, on a Unix socket, this user).

A served env runs episodes for whoever reaches it, and its task API hands out task specs,
answers included, so no one but its user may reach it:

* **Where it listens.** 127.0.0.1 by default. Any other address needs a token; a Unix socket
  (``--uds``) is created with mode 0600, so only this user's processes can connect, and needs none.
* **The token.** Every request on TCP, on every route, WebSocket upgrades included, must carry the
  token, as ``Authorization: Bearer <token>`` (OpenEnv's clients: ``headers=``) or ``X-API-Key:
  <token>`` (the ORS clients' ``api_key``). It is compared in constant time; a request without it
  gets 401, a wrong one 403, before any handler runs. On loopback with no token given, a random
  one is made and printed once with the URL (Jupyter's model): other users of the machine can
  reach a loopback port too.
* **Never logged.** The server keeps no access log, echoes no header, and never prints a token
  it was given (``--token``, or :data:`TOKEN_ENV` in its environment, which unlike a command
  line other users cannot read in the process list).
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

from openenv_gym.errors import ConfigurationError
from openenv_gym.serving.limits import RETRY_AFTER, TOKEN_ENV, WRONG_TOKENS_PER_SECOND
from openenv_gym.tokens import Guard, new_token

__all__ = ["Access", "is_loopback", "new_token"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is only reachable from this machine.

    >>> is_loopback("127.0.0.2"), is_loopback("::1"), is_loopback("example.com")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


class Access:
    """The token check of one server, as an aiohttp middleware (:meth:`middleware`).

    Args:
        token: the secret every request must carry; ``None``: no check (a Unix socket).
        generated: the token was made here (so it may be printed once), not given.
    """

    def __init__(self, token: str | None, generated: bool = False):
        if token is not None and (not isinstance(token, str) or len(token) < 16):
            raise ConfigurationError("a serving token must be a string of at least 16 characters")
        self.guard = Guard(token)
        self.generated = generated
        # A token bucket of wrong guesses: brute force slows to WRONG_TOKENS_PER_SECOND.
        self._allowance, self._refilled = 2 * WRONG_TOKENS_PER_SECOND, time.monotonic()

    @classmethod
    def for_bind(cls, host: str | None, token: str | None) -> Access:
        """The access rule of a server on ``host`` (``None``: a Unix socket): a given token (or
        :data:`TOKEN_ENV`'s), else a random one on loopback; any other address without one is
        refused, since anyone who can reach the port could play, and read every task's answer."""
        token = token or os.environ.get(TOKEN_ENV) or None
        if host is None:
            return cls(token)
        if token is None:
            if not is_loopback(host):
                raise ConfigurationError(
                    f"serving on {host} (not loopback) needs a token: pass --token, or set {TOKEN_ENV}; "
                    "clients then send it as 'Authorization: Bearer <token>' or 'X-API-Key: <token>'")
            return cls(new_token(), generated=True)
        return cls(token)

    @property
    def token(self) -> str | None:
        return self.guard.token

    def headers(self) -> dict[str, str]:
        """What a client sends (a secret: pass it on, never log it)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token is not None else {}

    def matches(self, given: str | None) -> bool:
        """Whether ``given`` is the token, in time independent of where they differ."""
        return self.guard.matches(given)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        status = self.guard.check(Guard.credential(request.headers.get(hdrs.AUTHORIZATION),
                                                   request.headers.get("X-API-Key")))
        if status == 401:
            return web.json_response({"detail": "this server needs its token: 'Authorization: Bearer <token>' "
                                                "or 'X-API-Key: <token>'"}, status=401)
        if status == 403:
            if not self._may_guess():
                return web.json_response({"detail": "too many wrong tokens: retry later"}, status=429,
                                         headers={"Retry-After": str(RETRY_AFTER)})
            return web.json_response({"detail": "wrong token"}, status=403)
        return await handler(request)

    def _may_guess(self) -> bool:
        now = time.monotonic()
        self._allowance = min(2 * WRONG_TOKENS_PER_SECOND, self._allowance + (now - self._refilled) * WRONG_TOKENS_PER_SECOND)
        self._refilled = now
        if self._allowance < 1:
            return False
        self._allowance -= 1
        return True
