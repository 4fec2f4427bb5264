"""Running a page's aiohttp app on 127.0.0.1 behind its token, until Ctrl-C, SIGTERM or the app stops it.

One place for what both commands do around their app: bind loopback only (port 0 picks a free
one), print the URL with the token, answer without an access log (a logged URL would hold the
token), and on the way out close the app's connections before its own cleanup (``play`` closes
its env there).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TextIO

from aiohttp import web

from openenv_gym.errors import ConfigurationError
from openenv_gym.web.access import Access

__all__ = ["LoopbackServer", "run"]

STOP = web.AppKey("stop", asyncio.Event)
"""The event an app sets to stop its server (``play`` does when its last page has closed)."""


class LoopbackServer:
    """``app`` served on ``127.0.0.1:port`` (0: a free port), every route behind ``access``."""

    def __init__(self, app: web.Application, access: Access, port: int = 0):
        self.app, self.access, self.port = app, access, port
        app.middlewares.insert(0, access.middleware)
        app[STOP] = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def stopping(self) -> asyncio.Event:
        return self.app[STOP]

    async def start(self) -> str:
        """Bind and start answering; returns the URL to print (with the token)."""
        # shutdown_timeout: a page's long request (a slow step) must not hold Ctrl-C for a minute.
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            if exc.errno == errno.EADDRINUSE:
                raise ConfigurationError(f"port {self.port} is in use: pick another with --port, or 0 for any") from None
            raise ConfigurationError(f"cannot listen on 127.0.0.1:{self.port}: {exc.strerror or exc}") from None
        self.port = self.access.port = self._runner.addresses[0][1]
        return self.access.url()

    async def stop(self) -> None:
        """Stop answering and run the app's cleanup (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


def run(server: LoopbackServer, what: str, out: TextIO | None = None,
        ready: Callable[[str], Awaitable[None]] | None = None) -> int:
    """Serve until Ctrl-C, SIGTERM or ``server.stopping``; prints the URL; returns the exit status (0).

    ``ready`` is awaited with the URL once the server answers (tests use it to learn the port).
    """
    out = out or sys.stdout

    async def main() -> None:
        loop = asyncio.get_running_loop()
        url = await server.start()
        stop = server.stopping
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
                loop.add_signal_handler(sig, stop.set)
        print(f"{what}: {url}", file=out, flush=True)
        print("press Ctrl-C to stop", file=out, flush=True)
        try:
            if ready is not None:
                await ready(url)
            await stop.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
            await server.stop()

    asyncio.run(main())
    print("stopped", file=out, flush=True)
    return 0
