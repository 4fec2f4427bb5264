"""WebSocket and HTTP to one OpenEnv server, behind one error boundary.

The OpenEnv episode logic (:mod:`openenv_gym.adapters.openenv.adapter`) never imports websockets or
httpx: it asks an :class:`OpenEnvTransport` for a :class:`Channel` (one WebSocket to ``/ws``, which
the server backs with one environment instance) and sends messages on it, or for a JSON answer of
one of the server's HTTP routes (``/schema``, ``/metadata``, the task API, ``/mcp``). OpenEnv's own
``EnvClient`` is not used: importing it imports the whole server stack (seconds), and 0.3.0 pairs a
late reply with the next request (docs/backends.md).

Foreign exceptions are translated in one place, :meth:`OpenEnvTransport.translate` (used by the
:meth:`~OpenEnvTransport.errors` context and by a channel's request), most specific first::

    TimeoutError (a limit of ours)          -> BackendTimeout      names the limit that fired
    websockets InvalidStatus 401/403        -> ConfigurationError  the server refused our headers
    websockets InvalidStatus (other)        -> BackendUnavailable
    websockets ConnectionClosed, sent 1009  -> ServerError         a message over max_response_bytes
    websockets ConnectionClosed             -> BackendUnavailable  close code and reason
    websockets InvalidHandshake, InvalidURI -> BackendUnavailable / ConfigurationError
    wire.TooDeep                            -> ServerError         JSON deeper than max_json_depth
    msgspec.DecodeError, UnicodeDecodeError -> ServerError         an unreadable answer
    httpx.TimeoutException                  -> BackendTimeout
    httpx.HTTPError, OSError                -> BackendUnavailable  says if a local server exited

Error replies on the socket (``{"type": "error", "data": {"code", "message"}}``) are typed by
:func:`reply_error`: ``VALIDATION_ERROR`` and ``INVALID_JSON`` are :class:`ActionRejected` (the
episode turns them into a message for the agent), ``EXECUTION_ERROR`` is :class:`StepFailed` (the
environment's own code raised: the episode tells the agent, and the session goes on, as with
OpenEnv's own client), ``CAPACITY_REACHED`` is :class:`CapacityReached` (with the server's limit;
the adapter places the session elsewhere or retries), ``FACTORY_ERROR`` a
:class:`~openenv_gym.errors.ProvisioningError`, ``SESSION_ERROR`` a
:class:`~openenv_gym.errors.BackendUnavailable`, the rest :class:`~openenv_gym.errors.ServerError`.
A reply of any type but ``observation`` or ``error`` is a ``ServerError``.

A channel whose request failed midway (a timeout, a cancellation, a dropped connection, an
unreadable or unexpected reply) is closed at once and never used again: a late reply must not be
read as the answer to the next request. The protocol has no request ids, so a reply that nobody
asked for (a server that answers twice) is caught when it is already waiting as a request goes out
(:class:`_Reply`): :class:`UnaskedReply`, and the connection is closed.

What a server sends is bounded (:mod:`openenv_gym.adapters.limits`): a WebSocket message, or an
HTTP answer, over ``max_response_bytes`` and JSON nested more than ``max_json_depth`` levels are
``ServerError`` naming the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import msgspec

from openenv_gym import errors
from openenv_gym.adapters.limits import DEFAULT_LIMITS, Limits, too_deep, too_large
from openenv_gym.adapters.net.client import make_client
from openenv_gym.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    ConfigurationError,
    ProvisioningError,
    ServerError,
)
from openenv_gym.wire import TooDeep, clip, decode_within_depth

__all__ = ["OpenEnvTransport", "Channel", "ActionRejected", "StepFailed", "CapacityReached", "UnaskedReply",
           "reply_error", "split_url"]

_encoder = msgspec.json.Encoder()
_reply_decoder = msgspec.json.Decoder(dict[str, Any])
_any_decoder = msgspec.json.Decoder()
_MESSAGE_TOO_BIG = 1009  # the close code websockets sends when a message passes max_size


class ActionRejected(ServerError):
    """The server refused a message's content (``VALIDATION_ERROR``, ``INVALID_JSON``): the agent's to fix."""

    def __init__(self, message: str, code: str, errors: Any = None):
        super().__init__(message)
        self.code = code
        self.errors = errors


class StepFailed(ServerError):
    """The environment's own code raised during a step (``EXECUTION_ERROR``); the session goes on."""


class CapacityReached(errors.CapacityReached):
    """The server already runs its ``max_concurrent_envs`` sessions (``CAPACITY_REACHED``): the
    package's own :class:`~openenv_gym.errors.CapacityReached`, with the limit the server stated
    (``max_sessions``; ``None`` if it did not)."""

    def __init__(self, message: str, max_sessions: int | None = None):
        super().__init__(message)
        self.max_sessions = max_sessions


class UnaskedReply(ServerError):
    """A reply was waiting before the request went out: the server answered an earlier one twice."""


def _describe_errors(errors: Any) -> str:
    """Pydantic's ``errors()`` list as ``field: message`` lines (input values left out: they are the agent's)."""
    if not isinstance(errors, list):
        return ""
    lines = []
    for err in errors[:10]:
        if not isinstance(err, dict):
            continue
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("data",))
        lines.append(f"{loc or '(action)'}: {err.get('msg', '')}")
    return "; ".join(lines)


def reply_error(data: Any, what: str) -> BackendError:
    """The typed error an OpenEnv ``error`` reply stands for."""
    data = data if isinstance(data, dict) else {}
    code = str(data.get("code", "")).upper()
    message = str(data.get("message", "")) or "no message"
    if code in ("VALIDATION_ERROR", "INVALID_JSON"):
        detail = _describe_errors(data.get("errors"))
        return ActionRejected(f"{message}: {detail}" if detail else message, code, data.get("errors"))
    if code == "EXECUTION_ERROR":
        return StepFailed(message)
    if code == "CAPACITY_REACHED":
        limit = data.get("max_sessions")
        limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1 else None
        return CapacityReached(f"{what}: the server is at capacity ({message})", limit)
    if code == "FACTORY_ERROR":
        return ProvisioningError(f"{what}: the server could not create an environment ({message})")
    if code == "SESSION_ERROR":
        return BackendUnavailable(f"{what}: the server's session failed ({message})")
    return ServerError(f"{what}: {code or 'error'}: {message}")


def split_url(url: str) -> tuple[str, str]:
    """``(http base URL, WebSocket URL)`` of a server given as http(s)://, ws(s):// or ``unix:<path>``.

    ``http://h:p`` gives ``("http://h:p", "ws://h:p/ws")``; ``ws://h:p/ws`` the same; a path
    prefix (a server behind a reverse proxy) is kept. A Unix socket keeps its ``unix:`` URL for
    HTTP and uses ``ws://localhost/ws`` as the WebSocket's request line.
    """
    if url.startswith("unix:"):
        return url, "ws://localhost/ws"
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    http_scheme = {"http": "http", "ws": "http", "https": "https", "wss": "https"}.get(scheme)
    if http_scheme is None or not parts.netloc:
        raise ConfigurationError(f"url must be http(s)://, ws(s):// or unix:<path>, not {url[:80]!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/ws"):
        path = path[: -len("/ws")]
    base = urlunsplit((http_scheme, parts.netloc, path, "", ""))
    ws = urlunsplit(("wss" if http_scheme == "https" else "ws", parts.netloc, path + "/ws", parts.query, ""))
    return base, ws


class _Reply:
    """``await _Reply(ws)``: the next message, and whether it was already waiting when asked for.

    Awaited right after a request is sent (nothing in between yields to the event loop), a
    message that is already queued cannot be the answer: the server could not have answered yet,
    so it is a reply to an earlier request, sent twice. websockets has no public count of queued
    messages, so this drives its ``recv`` coroutine by hand (the coroutine protocol, as
    ``yield from`` would): a queued message makes it return at once, without suspending;
    otherwise it is awaited as usual, every resumption and cancellation forwarded to it. This
    costs about what ``await ws.recv()`` does, where a separate poll would cost a ``recv``
    started and cancelled on every step.
    """

    __slots__ = ("_coro",)

    def __init__(self, ws: Any):
        self._coro = ws.recv(decode=False)

    def __await__(self) -> Generator[Any, Any, tuple[bytes, bool]]:
        coro = self._coro
        try:
            waiting = coro.send(None)
        except StopIteration as done:
            return done.value, True
        while True:
            try:
                try:
                    sent = yield waiting
                except BaseException as exc:  # a cancellation, forwarded as asyncio would
                    waiting = coro.throw(exc)
                else:
                    waiting = coro.send(sent)
            except StopIteration as done:
                return done.value, False


class Channel:
    """One WebSocket to ``/ws``: one environment instance on the server, one request at a time.

    Args:
        transport: the transport that opened it (its error boundary and limits).
        ws: the websockets connection.
        on_close: called once when the channel is closed or dropped (the adapter gives back the
            server session it counted for it).
    """

    def __init__(self, transport: OpenEnvTransport, ws: Any, on_close: Callable[[], None] | None = None):
        from websockets.exceptions import ConnectionClosed

        self._transport = transport
        self._ws = ws
        self._closed_error = ConnectionClosed
        self._loop = asyncio.get_running_loop()
        self._on_close = on_close
        self._depth = transport.limits.json_depth
        self.broken = False
        self.timed_out = False
        self.replies = 0
        self.lease: Any = None
        """Set by whoever placed this socket on its server (the adapter: its lease there)."""
        self.tools: Any = None
        """The MCP tools listed on this session (the adapter's cache: see ``OpenEnvAdapter.tools_of``)."""

    @property
    def usable(self) -> bool:
        """Open, and no request ever failed on it (so no stray reply can be waiting)."""
        return not self.broken and self._ws.state.name == "OPEN"

    async def request(self, message: dict[str, Any], what: str, timeout: float | None) -> dict[str, Any]:
        """Send ``message`` and return the ``data`` of its ``observation`` reply.

        An ``error`` reply raises its typed error (:func:`reply_error`); the channel stays usable
        after :class:`ActionRejected` and :class:`StepFailed` (the server goes on with the
        session) and is closed after any other failure, a reply of another type included.
        """
        if self.broken:
            raise BackendUnavailable(f"{what}: the connection was closed after an earlier failure")
        payload = _encoder.encode(message)
        ws = self._ws
        # The hot path of every step, kept lean (it was most of the adapter's CPU per step): a
        # plain try rather than the errors() context manager, and the read limit as one timer
        # that drops the socket (its pending recv then fails) rather than an asyncio.timeout.
        timer = self._loop.call_later(timeout, self._expire) if timeout is not None else None
        try:
            try:
                await ws.send(payload, text=True)
            except self._closed_error:
                # A server refusing a session (CAPACITY_REACHED, FACTORY_ERROR) sends its error
                # and closes at once: the error is still queued, and recv returns it first.
                if self.timed_out:
                    raise
            raw, queued = await _Reply(ws)
            # Queued before the first request, it is the server's refusal of the session
            # (CAPACITY_REACHED comes unasked, at once): the answer. Later, a stray reply.
            if queued and self.replies:
                raise UnaskedReply(
                    f"{what}: the server sent a reply that no request asked for (it answered an earlier "
                    f"request twice): {clip(raw.decode('utf-8', 'replace'), 80)}; the connection was closed")
            reply = decode_within_depth(_reply_decoder, raw, self._depth)
        except BaseException as exc:
            self.abort()
            if not isinstance(exc, Exception):
                raise  # a cancellation: the socket is closed, the caller goes on cancelling
            error = await self._transport.translate(TimeoutError() if self.timed_out else exc, what, timeout)
            if error is exc:
                raise
            raise error from None
        finally:
            if timer is not None:
                timer.cancel()
        self.replies += 1
        kind = reply.get("type")
        if kind == "observation":
            data = reply.get("data")
            return data if isinstance(data, dict) else {}
        if kind == "error":
            error = reply_error(reply.get("data"), what)
            if not isinstance(error, (ActionRejected, StepFailed)):
                self.abort()
            raise error
        self.abort()
        raise ServerError(f"{what}: the server sent a reply of type {clip(str(kind), 40)}, not an observation "
                          "(another protocol, or version skew); the connection was closed")

    def _expire(self) -> None:
        """The read limit passed: drop the connection, so the pending request fails as a timeout."""
        self.timed_out = True
        self.abort()

    def _closed(self) -> None:
        self.broken = True
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def abort(self) -> None:
        """Drop the connection now, without a closing handshake (it may be hung)."""
        self._closed()
        transport = getattr(self._ws, "transport", None)
        if transport is not None:
            transport.abort()

    async def aclose(self, timeout: float = 1.0) -> None:
        """Say goodbye (``{"type": "close"}``) and close; never raises, never waits past ``timeout``."""
        if self.broken:
            return self.abort()
        self._closed()
        try:
            async with asyncio.timeout(timeout):
                with contextlib.suppress(Exception):
                    await self._ws.send('{"type":"close"}')
                await self._ws.close()
        except (TimeoutError, Exception):
            self.abort()


class OpenEnvTransport:
    """WebSockets and HTTP requests to one OpenEnv server, every failure a typed error.

    Args:
        url: ``http(s)://``, ``ws(s)://`` or ``unix:<socket path>``.
        headers: sent on every request and handshake (an API key, a local server's token): never
            in messages.
        connect_timeout: seconds to open a connection (TCP, TLS and the WebSocket handshake).
        local: a server this process launched (no proxies from the environment).
        exit_note: for a local server, a coroutine saying how its process exited (or ``""``).
        limits: what one answer may hold (default: :data:`~openenv_gym.adapters.limits.DEFAULT_LIMITS`).
    """

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float | None = 300.0,
        local: bool = False,
        exit_note: Callable[[], Awaitable[str]] | None = None,
        limits: Limits | None = None,
    ):
        self.url = url
        self.limits = limits or DEFAULT_LIMITS
        self.http_url, self.ws_url = split_url(url)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.local = local
        self.closed = False
        self._headers = dict(headers or {})
        self._exit_note = exit_note
        self._http = make_client(self.http_url, timeout=httpx.Timeout(connect_timeout, read=read_timeout),
                                 headers=self._headers, local=local)

    def shown_url(self) -> str:
        """The server's address for messages (a query string, which may hold a key, left out)."""
        return self.http_url

    async def aclose(self) -> None:
        self.closed = True
        await self._http.aclose()

    # -- the one error boundary --------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def errors(self, what: str, *, read_limit: float | None = None) -> AsyncIterator[None]:
        """Translate every foreign exception raised inside into an :mod:`openenv_gym.errors` error."""
        try:
            yield
        except Exception as exc:
            error = await self.translate(exc, what, read_limit)
            if error is exc:
                raise
            raise error from None

    async def translate(self, exc: Exception, what: str, read_limit: float | None) -> Exception:
        """The :mod:`openenv_gym.errors` error ``exc`` stands for (``exc`` itself if it is ours or unknown)."""
        from websockets import exceptions as wse

        if isinstance(exc, BackendError):
            return exc
        if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
            return BackendTimeout(
                f"{what}: no answer from the OpenEnv server within read_timeout={read_limit} s "
                "(the connection was closed)")
        if isinstance(exc, wse.InvalidStatus):
            status = exc.response.status_code
            if status in (401, 403):
                return ConfigurationError(
                    f"{what}: the OpenEnv server at {self.shown_url()} refused the connection "
                    f"(HTTP {status}); check headers=")
            return BackendUnavailable(
                f"{what}: the OpenEnv server at {self.shown_url()} refused the WebSocket (HTTP {status})")
        if isinstance(exc, wse.ConnectionClosed) and exc.sent is not None and exc.sent.code == _MESSAGE_TOO_BIG \
                and exc.rcvd is None:
            return too_large(what, self.limits.response_bytes, " (a WebSocket message; the connection was closed)")
        if isinstance(exc, wse.ConnectionClosed):
            reason = f"code {exc.rcvd.code}" + (f": {exc.rcvd.reason}" if exc.rcvd and exc.rcvd.reason else "") \
                if exc.rcvd else "no close frame"
            return await self._unreachable(f"the connection closed ({reason})")
        if isinstance(exc, wse.InvalidURI):
            return ConfigurationError(f"{what}: not a WebSocket URL ({exc})")
        if isinstance(exc, wse.InvalidHandshake):
            return BackendUnavailable(f"{what}: the WebSocket handshake failed ({type(exc).__name__}: {exc})")
        if isinstance(exc, TooDeep):
            return too_deep(what, self.limits.json_depth)
        if isinstance(exc, (msgspec.DecodeError, UnicodeDecodeError)):
            return ServerError(f"{what}: the server sent an unreadable answer ({exc})")
        if isinstance(exc, httpx.TimeoutException):
            return BackendTimeout(f"{what}: no answer within read_timeout={read_limit} s ({type(exc).__name__})")
        if isinstance(exc, (httpx.HTTPError, OSError)):
            return await self._unreachable(f"{type(exc).__name__}: {exc}")
        if isinstance(exc, RuntimeError) and self.closed and not isinstance(exc, RecursionError):
            return BackendUnavailable(f"the connection to the OpenEnv server at {self.shown_url()} is closed")
        return exc

    async def _unreachable(self, why: str) -> BackendUnavailable:
        if self.closed:
            return BackendUnavailable(f"the connection to the OpenEnv server at {self.shown_url()} is closed")
        message = f"the OpenEnv server at {self.shown_url()} cannot be reached ({why})"
        if self._exit_note is not None:
            message += await self._exit_note()
        return BackendUnavailable(message)

    # -- WebSocket -----------------------------------------------------------------------------------
    async def open_channel(self, on_close: Callable[[], None] | None = None) -> Channel:
        """A new WebSocket to ``/ws`` (a new environment instance on the server); see :class:`Channel`."""
        from websockets.asyncio.client import connect, unix_connect

        if self.closed:
            raise BackendUnavailable(f"the connection to the OpenEnv server at {self.shown_url()} is closed")
        options: dict[str, Any] = dict(
            additional_headers=self._headers or None, open_timeout=self.connect_timeout,
            max_size=self.limits.response_bytes, compression=None, close_timeout=1.0, user_agent_header=None,
        )
        async with self.errors("connect", read_limit=self.connect_timeout):
            try:
                if self.url.startswith("unix:"):
                    ws = await unix_connect(self.url[len("unix:"):], self.ws_url, **options)
                else:
                    ws = await connect(self.ws_url, proxy=None if self.local else True, **options)
            except TimeoutError:
                raise BackendTimeout(
                    f"could not connect to the OpenEnv server at {self.shown_url()} within "
                    f"connect_timeout={self.connect_timeout} s") from None
        return Channel(self, ws, on_close)

    # -- the routes the adapter asks ---------------------------------------------------------------
    # Named here, as ORSTransport names ORS's, so an environment run in this process
    # (openenv_inprocess.InProcessOpenEnv) answers the same calls and the episode logic is one code.
    async def schema(self) -> Any:
        """``GET /schema``: the action, observation and state JSON schemas."""
        return await self.get_json("GET", "/schema")

    async def metadata(self) -> Any:
        """``GET /metadata`` (``None`` on a server without it)."""
        return await self.get_json("GET", "/metadata", missing=(404,))

    async def environments(self) -> Any:
        """``GET /list_environments`` of the task API (``None`` on a server without it)."""
        return await self.get_json("GET", "/list_environments", missing=(404, 405))

    async def splits(self, env: str, *, probe: bool = False) -> Any:
        """``GET /{env}/splits``; with ``probe``, ``None`` if the server has no task API."""
        return await self.get_json("GET", f"/{env}/splits", missing=(404, 405, 501) if probe else ())

    async def num_tasks(self, env: str, split: str) -> Any:
        """``POST /{env}/num_tasks``."""
        return await self.get_json("POST", f"/{env}/num_tasks", {"split": split})

    async def task(self, env: str, split: str, index: int) -> Any:
        """``POST /{env}/task``."""
        return await self.get_json("POST", f"/{env}/task", {"split": split, "index": index})

    # -- HTTP ----------------------------------------------------------------------------------------
    async def get_json(self, method: str, path: str, body: Any = None, *,
                       missing: tuple[int, ...] = ()) -> Any:
        """The JSON answer of an HTTP route; ``None`` for a status in ``missing`` (a route the server lacks).

        400 is :class:`~openenv_gym.errors.TaskNotFound` for task routes (an index out of range),
        other 4xx :class:`~openenv_gym.errors.ConfigurationError`, 5xx
        :class:`~openenv_gym.errors.ServerError`.
        """
        from openenv_gym.errors import TaskNotFound

        what = f"{method} {path}"
        async with self.errors(what, read_limit=self.read_timeout):
            content = _encoder.encode(body) if body is not None else None
            request = self._http.build_request(
                method, path, content=content,
                headers={"Content-Type": "application/json"} if content is not None else None)
            response = await self._http.send(request, stream=True)
            try:
                status = response.status_code
                if status in missing:
                    return None
                raw = await self._read(response, what)
            finally:
                await response.aclose()
            if status >= 400:
                detail = _detail(raw)
                if status >= 500:
                    raise ServerError(f"{what}: HTTP {status}: {detail}")
                if status in (401, 403):
                    raise ConfigurationError(
                        f"{what}: the OpenEnv server refused the request (HTTP {status}: {detail}); check headers=")
                if status == 400 and "index" in detail.lower():
                    raise TaskNotFound(f"{what}: {detail}")
                raise ConfigurationError(f"{what}: HTTP {status}: {detail}")
            return decode_within_depth(_any_decoder, raw, self.limits.json_depth)

    async def _read(self, response: httpx.Response, what: str) -> bytes:
        """The body, counted as it arrives (decompressed): past ``max_response_bytes`` it is dropped."""
        limit = self.limits.response_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise too_large(what, limit)
            chunks.append(chunk)
        return b"".join(chunks)


def _detail(raw: bytes) -> str:
    """A FastAPI error's ``detail``, or the start of the body (at most 500 characters)."""
    try:
        detail = decode_within_depth(_any_decoder, raw, 32)
        detail = detail.get("detail", detail) if isinstance(detail, dict) else detail
        text = detail if isinstance(detail, str) else _encoder.encode(detail).decode()
    except (msgspec.DecodeError, msgspec.EncodeError, TypeError, ValueError):
        text = raw[:500].decode("utf-8", "replace")
    return text[:500]
