"""Connections that never prove themselves are closed: a served env's defence against idle and half-sent connections.

Anyone who can reach the port can open connections and send nothing (or half a request):
each holds a file descriptor, and a few thousand starve the clients that hold the token. A
connection counts as *proven* once a request on it passed the token check; until then it may
live :data:`~openenv_gym.serving.limits.AUTH_TIMEOUT` seconds, and at most
:data:`~openenv_gym.serving.limits.MAX_PENDING_CONNECTIONS` unproven ones stay open at once (the
oldest go first). Proven connections are left to aiohttp's keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web import RequestHandler

__all__ = ["ConnectionGuard", "MalformedRequests"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConnectionGuard:
    """Closes a server's unproven connections after ``auth_timeout`` s, and beyond ``max_pending``.

    Put :meth:`middleware` after the token check (it marks a connection proven), and run
    :meth:`watch` while the server runs.
    """

    def __init__(self, auth_timeout: float, max_pending: int, sweep_every: float = 0.5):
        self.auth_timeout, self.max_pending, self.sweep_every = auth_timeout, max_pending, sweep_every
        # Plain containers (aiohttp's handlers take no weak references), pruned to the live
        # connections at every sweep.
        self._proven: set[RequestHandler] = set()
        self._seen: dict[RequestHandler, float] = {}

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self._proven.add(request.protocol)
        return await handler(request)

    def sweep(self, server: web.Server) -> int:
        """Close what must go now; how many were closed."""
        now = time.monotonic()
        live = server.connections
        self._proven.intersection_update(live)
        self._seen = {c: self._seen.get(c, now) for c in live if c not in self._proven}
        pending = [(seen, connection) for connection, seen in self._seen.items()]
        pending.sort(key=lambda seen_and_connection: seen_and_connection[0])
        over = max(0, len(pending) - self.max_pending)
        closed = 0
        for i, (seen, connection) in enumerate(pending):
            if i < over or now - seen >= self.auth_timeout:
                connection.force_close()
                closed += 1
        return closed

    async def watch(self, runner: web.AppRunner) -> None:
        """Sweep ``runner``'s server until cancelled."""
        while True:
            await asyncio.sleep(self.sweep_every)
            server = runner.server
            if server is not None:
                with contextlib.suppress(Exception):  # a connection closing as it is read: next sweep
                    self.sweep(server)


class MalformedRequests(logging.Filter):
    """aiohttp logs every request its parser refuses with a traceback quoting the request's bytes
    (a ``?token=`` among them): this filter on its ``aiohttp.server`` logger turns them into one
    line at most every ``interval`` s, counting them and naming the error's type, no request text."""

    def __init__(self, interval: float):
        super().__init__()
        self.interval, self.count, self._last = interval, 0, -math.inf

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Error handling request"):
            return True
        self.count += 1
        now = time.monotonic()
        if now - self._last < self.interval:
            return False
        kind = type(record.exc_info[1]).__name__ if record.exc_info and record.exc_info[1] else "error"
        record.msg, record.args = "refused %d malformed request(s) (%s); requests are not logged", (self.count, kind)
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        self.count, self._last = 0, now
        return True
