"""Serving an id: its session pool behind a protocol server, from start to a clean stop.

:class:`Server` builds the id's :class:`~openenv_gym.pool.SessionPool` (``max_sessions`` slots
over the shards a vector env of the id uses: in this process, in ``workers`` host processes, in
Ray actors), puts an aiohttp app speaking the protocol in front of it on the runtime loop (where
the pool's coroutines run, so a request costs no thread hop), and binds it: 127.0.0.1 (or another
address, with a token) on ``port``, or a Unix socket. :meth:`Server.stop` stops accepting, ends
every session it opened (each backend episode is ended), stops the app and closes the pool, which
stops every process and actor it started.

:func:`serve` runs one until SIGINT or SIGTERM (the ``openenv-gym serve`` command); :func:`served`
is the same as a context manager giving the URL, for tests and notebooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from openenv_gym import runtime
from openenv_gym.errors import ConfigurationError, OpenEnvGymError
from openenv_gym.pool import SessionPool
from openenv_gym.processes import ensure_open_files, tune_gc
from openenv_gym.serving import openenv as openenv_protocol
from openenv_gym.serving import ors as ors_protocol
from openenv_gym.serving.access import Access
from openenv_gym.serving.connections import ConnectionGuard, MalformedRequests
from openenv_gym.serving.http import json_errors
from openenv_gym.serving.limits import (
    AUTH_TIMEOUT,
    MALFORMED_LOG_INTERVAL,
    MAX_PENDING_CONNECTIONS,
    MAX_REQUEST_BYTES,
    MAX_SESSIONS,
    PROTOCOLS,
    SESSION_IDLE_TIMEOUT,
    START_TIMEOUT,
    STOP_TIMEOUT,
)
from openenv_gym.serving.sessions import ServedEnv
from openenv_gym.shard.shard import FILES_BASE
from openenv_gym.version import __version__

__all__ = ["ServedURL", "Server", "serve", "served"]

_ROUTES = {"ors": ors_protocol.add_routes, "openenv": openenv_protocol.add_routes}
_SHUTDOWN_GRACE = 2.0  # seconds aiohttp gives requests still running when the app stops


class ServedURL(str):
    """The URL of a served env (a ``str``), carrying what a client sends with it.

    ``token``: the server's token (``None`` on a Unix socket); ``headers``: the header that carries
    it. Neither appears in ``str()`` or ``repr()``.
    """

    token: str | None

    def __new__(cls, url: str, token: str | None = None) -> ServedURL:
        made = super().__new__(cls, url)
        made.token = token
        return made

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def __repr__(self) -> str:
        return f"ServedURL({str(self)!r})"


def _sessions_on_demand(env_id: str, kwargs: dict[str, Any], max_sessions: int) -> dict[str, Any]:
    """A served env's sessions arrive one by one, not all at once as a vector env's resets do: a
    local server that allows a few sessions each (most OpenEnv envs allow one) starts its processes
    as sessions need them, not ``max_sessions`` of them up front (64 took 13 GiB and 153 s). The
    first workers are the ones the pool's size gives (``server_workers``); then ``expected_sessions``
    of 1 leaves the rest to be started when a session finds every worker full."""
    from openenv_gym.adapters.base import AdapterSpec, accepted_kwargs
    from openenv_gym.adapters.local_servers import default_workers
    from openenv_gym.registration import EXPECTED_SESSIONS, env_info

    if EXPECTED_SESSIONS in kwargs or "server_workers" in kwargs:
        return {}
    adapter = kwargs.get("adapter") or env_info(env_id)["kwargs"].get("adapter")
    try:
        target = AdapterSpec(str(adapter)).target() if adapter else None
    except (OpenEnvGymError, ImportError):
        return {}  # making the pool says what is wrong
    accepted = accepted_kwargs(target) if isinstance(target, type) else None  # a front door: its choice decides
    if not accepted or EXPECTED_SESSIONS not in accepted or "server_workers" not in accepted:
        return {}
    return {EXPECTED_SESSIONS: 1, "server_workers": default_workers(max_sessions)}


def _pool_kwargs(env_id: str, env_kwargs: dict[str, Any], backend: str, workers: int | None,
                 address: str | None) -> dict[str, Any]:
    """``gym.make_vec`` kwargs for the pool: ``workers`` processes run the sessions (Ray actors,
    or host processes: an isolated id's, or of this interpreter), ``address`` a Ray cluster's."""
    from openenv_gym.registration import env_info

    kwargs = dict(env_kwargs)
    options = dict(kwargs.pop("vector_options", None) or {})
    if backend == "ray":
        if workers is not None:
            options.setdefault("num_actors", workers)
        if address is not None:
            options.setdefault("address", address)
    elif address is not None:
        raise ConfigurationError("--address is the address of a Ray cluster: it needs --backend ray")
    elif workers is not None:
        registered = env_info(env_id)["kwargs"]
        hosted = any(kwargs.get(k, registered.get(k)) not in (None, False) for k in ("python", "isolate"))
        if not hosted:
            kwargs["python"] = sys.executable  # host processes of this interpreter
        options.setdefault("num_hosts", workers)
    if options:
        kwargs["vector_options"] = options
    return kwargs


class Server:
    """One id served over one protocol (see the module docstring). Start with :meth:`start`.

    Args:
        env_id: a registered id (``openenv/Arithmetic-v0``).
        protocol: ``"ors"`` or ``"openenv"``.
        host, port: where to listen (port 0: a free one); any host but loopback needs a token.
        uds: a Unix socket path to listen on instead (mode 0600; no token needed).
        max_sessions: sessions at once; one more is refused with the protocol's capacity error.
        workers: processes the sessions run in (Ray actors with ``backend="ray"``, else host
            processes); default: Ray's default, or this process.
        backend: ``"concurrent"`` or ``"ray"`` (``address``: a Ray cluster's; default a local one).
        token: what clients must send; default :data:`~openenv_gym.serving.limits.TOKEN_ENV`'s value,
            else a random one (printed once) on loopback.
        session_idle_timeout: seconds without a request after which a session is ended.
        auth_timeout: seconds a new connection has to pass the token check before it is closed
            (:data:`~openenv_gym.serving.limits.AUTH_TIMEOUT`).
        env_kwargs: the env's kwargs, as for ``gym.make`` (``step_timeout``, ``split``...).
    """

    def __init__(self, env_id: str, *, protocol: str = "ors", host: str = "127.0.0.1", port: int = 0,
                 uds: str | os.PathLike[str] | None = None, max_sessions: int = MAX_SESSIONS,
                 workers: int | None = None, backend: str = "concurrent", address: str | None = None,
                 token: str | None = None, session_idle_timeout: float | None = SESSION_IDLE_TIMEOUT,
                 auth_timeout: float = AUTH_TIMEOUT, **env_kwargs: Any):
        if protocol not in PROTOCOLS:
            raise ConfigurationError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
        for name, value in (("max_sessions", max_sessions), ("workers", workers)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"{name} must be a positive integer")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ConfigurationError("port must be an integer in 0..65535")
        if uds is not None and port:
            raise ConfigurationError("give a port or a Unix socket (uds), not both")
        if session_idle_timeout is not None and not session_idle_timeout > 0:
            raise ConfigurationError("session_idle_timeout must be a positive number of seconds")
        if isinstance(auth_timeout, bool) or not isinstance(auth_timeout, (int, float)) or not auth_timeout > 0:
            raise ConfigurationError("auth_timeout must be a positive number of seconds")
        # A server sized for N sessions takes a burst of N clients connecting at once: under load
        # their first requests wait unread for a while, unproven, and must not be cut off as idle.
        self.connections = ConnectionGuard(float(auth_timeout), max(MAX_PENDING_CONNECTIONS, max_sessions or 0))
        self._quiet = MalformedRequests(MALFORMED_LOG_INTERVAL)
        self._watch: asyncio.Task[None] | None = None
        self.env_id, self.protocol = env_id, protocol
        self.host, self.port = host, port
        self.uds = Path(uds).absolute() if uds is not None else None
        self.max_sessions, self.session_idle_timeout = max_sessions, session_idle_timeout
        self.access = Access.for_bind(None if self.uds is not None else host, token)
        self._pool_kwargs = _pool_kwargs(env_id, env_kwargs, backend, workers, address)
        self._pool_kwargs.update(_sessions_on_demand(env_id, self._pool_kwargs, max_sessions))
        self._backend = backend
        self.pool: SessionPool | None = None
        self.served: ServedEnv | None = None
        self.url: ServedURL | None = None
        self._runner: web.AppRunner | None = None

    # -- start ----------------------------------------------------------------------------------------------
    def start(self) -> ServedURL:
        """Build the pool, bind, and answer; the URL (with its token). Everything started is
        stopped again if this fails or is interrupted."""
        from openenv_gym.registration import check_id

        check_id(self.env_id)
        self._check_address()
        try:  # a connection per session, some more still unproven, beside the sessions' own files
            ensure_open_files(self.max_sessions + MAX_PENDING_CONNECTIONS + FILES_BASE,
                              f"serving {self.max_sessions} sessions")
        except OSError as exc:
            raise ConfigurationError(str(exc.strerror)) from None
        self.pool = SessionPool.make(self.env_id, self.max_sessions, backend=self._backend, **self._pool_kwargs)
        try:
            self.url = runtime.run_sync(self._astart(), START_TIMEOUT, what="binding the server", limit="START_TIMEOUT")
        except BaseException:
            self.stop()
            raise
        return self.url

    def _check_address(self) -> None:
        if self.uds is not None:
            if self.uds.exists():
                raise ConfigurationError(f"{self.uds} exists: remove it, or pick another --uds path")
            if not self.uds.parent.is_dir():
                raise ConfigurationError(f"the folder of --uds {self.uds} does not exist")

    async def _astart(self) -> ServedURL:
        assert self.pool is not None
        # The token check first; a request that passes it proves its connection (ConnectionGuard).
        app = web.Application(client_max_size=MAX_REQUEST_BYTES,
                              middlewares=[self.access.middleware, self.connections.middleware, json_errors])
        self.served = ServedEnv(self.env_id, self.pool, session_idle_timeout=self.session_idle_timeout)
        _ROUTES[self.protocol](app, self.served, __version__)
        # No access log, and malformed requests counted, not quoted: a request line or header could
        # hold the token.
        logging.getLogger("aiohttp.server").addFilter(self._quiet)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=_SHUTDOWN_GRACE)
        await runner.setup()
        self._runner = runner
        try:
            if self.uds is not None:
                site: web.BaseSite = web.UnixSite(runner, str(self.uds))
                old = os.umask(0o177)  # the socket is born 0600: nobody else may connect, not even briefly
                try:
                    await site.start()
                finally:
                    os.umask(old)
                self._watch = asyncio.get_running_loop().create_task(self.connections.watch(runner))
                return ServedURL(f"unix:{self.uds}")
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError as exc:
            where = self.uds if self.uds is not None else f"{self.host}:{self.port}"
            if exc.errno == errno.EADDRINUSE:
                raise ConfigurationError(f"{where} is in use: pick another --port (0: any free one)") from None
            raise ConfigurationError(f"cannot listen on {where}: {exc.strerror or exc}") from None
        self._watch = asyncio.get_running_loop().create_task(self.connections.watch(runner))
        host, port = runner.addresses[0][:2]
        self.port = port
        shown = f"[{host}]" if ":" in host else host
        return ServedURL(f"http://{shown}:{port}", self.access.token)

    # -- stop -----------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop answering, end every session, close the pool (its servers, processes, actors). Idempotent."""
        try:
            if self._runner is not None or self.served is not None:
                with contextlib.suppress(Exception):
                    runtime.run_sync(self._astop(), STOP_TIMEOUT, what="stopping the server", limit="STOP_TIMEOUT")
        finally:
            pool, self.pool = self.pool, None
            if pool is not None:
                pool.close()
            if self.uds is not None and self.url is not None:
                with contextlib.suppress(OSError):
                    self.uds.unlink()

    async def _astop(self) -> None:
        logging.getLogger("aiohttp.server").removeFilter(self._quiet)
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()
        runner, self._runner = self._runner, None
        if runner is not None:
            for site in list(runner.sites):
                await site.stop()  # no new connections while the sessions end
        if self.served is not None:
            await self.served.aclose()
        if runner is not None:
            await runner.cleanup()

    def __enter__(self) -> ServedURL:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def served(env_id: str, **options: Any) -> Iterator[ServedURL]:
    """``env_id`` served until the block ends; yields its URL (``.token``, ``.headers`` for clients).

    ``options``: :class:`Server`'s (``protocol``, ``max_sessions``...) and the env's kwargs::

        with openenv_gym.serving.served("openenv/Arithmetic-v0", protocol="openenv") as url:
            client = GenericEnvClient(base_url=url, headers=url.headers)
    """
    server = Server(env_id, **options)
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


def _prefer_uvloop() -> None:
    """Run the runtime loop (the server's and its sessions') on uvloop where it is installed: a
    served step's asyncio work (the app's, the env's own) costs less there, and at 16,384 ORS
    sessions it held more of them than asyncio's loop (the launcher's uvicorn at that scale is the
    other way round, see ``local_servers/serve.py``). Only a process that serves and has not started the loop yet."""
    try:
        import uvloop
    except ImportError:
        return
    runtime.RUNTIME.use_loop_factory(uvloop.new_event_loop)


def serve(env_id: str, *, out: TextIO | None = None, **options: Any) -> int:
    """Serve ``env_id`` until SIGINT (Ctrl-C) or SIGTERM; prints the URL once it answers. Returns 0.

    ``options``: :class:`Server`'s and the env's kwargs. Stopping ends every session and stops
    every process the server started.
    """
    out = out or sys.stdout
    _prefer_uvloop()
    server = Server(env_id, **options)
    stop = threading.Event()
    started = False

    def on_signal(signum: int, frame: Any) -> None:
        if started:
            stop.set()
        else:  # still starting: abandon the start (what started is stopped on the way out)
            raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        url = server.start()
        started = True
        tune_gc()  # a server process, as every server the package starts: its app and pool are loaded now
        for sig in previous:  # again: starting may have installed its own (ray.init does, for SIGTERM)
            signal.signal(sig, on_signal)
        print(f"serving {env_id} over {server.protocol} at {url} ({server.max_sessions} sessions)", file=out,
              flush=True)
        if server.access.generated:
            print(f"token: {server.access.token}  (clients send 'Authorization: Bearer <token>' or "
                  "'X-API-Key: <token>')", file=out, flush=True)
        print("press Ctrl-C to stop", file=out, flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("stopped", file=out, flush=True)
    return 0

