"""HTTP and SSE to one ORS server, behind one error boundary.

The ORS episode logic (:mod:`openenv_gym.adapters.ors.adapter`) never touches the HTTP client: it asks an
:class:`ORSTransport` to send a request, fetch and decode an answer, or run a tool call (an SSE
stream, resumed by its ``task_id`` when it drops). Bodies are encoded with one reused msgspec
encoder; answers are decoded into the wire structs below, which hold only what the adapter reads.

The clients under it were chosen by measurement (``benchmarks/vector.py --only client``). Every
request to a plain-HTTP server without a proxy (``http://`` or ``unix:``; every local server)
runs on :mod:`openenv_gym.adapters.net.http1`'s own keep-alive connections: aiohttp's request
machinery was the largest part of the client's CPU at 64 concurrent sessions. Requests over TLS
or a proxy run on aiohttp: at 64 concurrent
sessions httpx spent several times aiohttp's client CPU per env-step, most of it in httpcore's
pool scanning every connection for each request and in anyio's per-request cancel scopes. Other,
colder paths (health checks, OpenEnv's HTTP endpoints, policies) keep httpx through
:func:`openenv_gym.adapters.net.client.make_client`.

Foreign exceptions are translated in one place, :meth:`ORSTransport.errors`, most specific first::

    _Retry503 (503 until retries ran out)  -> BackendUnavailable
    wire.TooDeep                           -> ServerError         JSON deeper than max_json_depth
    msgspec.DecodeError, UnicodeDecodeError -> ServerError        an unreadable answer
    aiohttp.ConnectionTimeoutError         -> BackendTimeout      connect_timeout (or no free connection)
    aiohttp.ServerTimeoutError, TimeoutError -> BackendTimeout    read_timeout
    aiohttp.ClientPayloadError             -> ServerError         a body that cannot be decoded
    http1.BadResponse                      -> ServerError         bytes that are not an HTTP/1.1 answer
    aiohttp.ClientError, OSError (the rest) -> BackendUnavailable says if a local server exited
    RuntimeError from a closed client      -> BackendUnavailable  "... is closed"

What a server may send is bounded (:class:`~openenv_gym.adapters.limits.Limits`): every answer is read counting its bytes as
they arrive and refused past ``max_response_bytes`` (a tool-call stream as a whole, pings
included), and its JSON is refused past ``max_json_depth`` levels; both errors name the limit. A
tool-call stream is an SSE stream or a ``ServerError``, and its result is returned as soon as it
arrives: a server that keeps the stream open after the ``end`` event (with pings, or silently)
gets :data:`END_GRACE` seconds to close it (:data:`DETACHED_END_GRACE` on openenv_gym's own
connections, where the step does not wait for it), then the connection is dropped.

HTTP statuses become errors in :func:`raise_for_status` (5xx ``ServerError``, ``Invalid split`` /
``Invalid index`` ``TaskNotFound``, a lost session ``BackendUnavailable``, other 4xx
``ConfigurationError``), and a body that cannot be JSON raises :class:`NotJSON` before anything is
sent. Errors the code raises on purpose (all from :mod:`openenv_gym.errors`) pass through.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import functools
import netrc
import os
import urllib.request
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple, TypeVar, cast
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp
import msgspec

from openenv_gym import runtime
from openenv_gym.adapters.limits import DEFAULT_LIMITS, Limits, too_deep, too_large
from openenv_gym.adapters.net import http1
from openenv_gym.adapters.net.client import ssl_context
from openenv_gym.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    ConfigurationError,
    ServerError,
    TaskNotFound,
)
from openenv_gym.sse import SSEDecoder
from openenv_gym.wire import TooDeep, decode_within_depth

__all__ = [
    "ORSTransport",
    "Timeouts",
    "Reply",
    "NotJSON",
    "raise_for_status",
    "Block",
    "ToolOutput",
    "RunToolResult",
    "ToolSpecWire",
    "TerminalTool",
    "ListTools",
    "SplitWire",
    "MessageWire",
    "NumTasks",
    "TaskWire",
]

T = TypeVar("T")


# -- wire shapes of the ORS server (only what we read) ---------------------------------------------
class Block(msgspec.Struct):
    type: str = "text"
    text: str | None = None
    data: str | None = None
    mimeType: str | None = None


class ToolOutput(msgspec.Struct):
    blocks: list[Block] = []
    metadata: Any = None
    reward: float | None = None
    finished: bool = False


class RunToolResult(msgspec.Struct):
    ok: bool
    output: ToolOutput | None = None
    error: str | None = None
    reason: str | None = None


class ToolSpecWire(msgspec.Struct):
    name: str
    description: str = ""
    input_schema: dict[str, Any] | None = None


class TerminalTool(msgspec.Struct):
    name: str
    arg: str | None = None
    description: str = ""


class ListTools(msgspec.Struct):
    tools: list[ToolSpecWire] = []
    terminal_tool: TerminalTool | None = None


class SplitWire(msgspec.Struct):
    name: str
    type: str = "validation"


class MessageWire(msgspec.Struct):
    role: str
    blocks: list[Block] = []


class NumTasks(msgspec.Struct):
    num_tasks: int


class TaskWire(msgspec.Struct):
    task: dict[str, Any]


@functools.cache
def _decoder(type_: Any) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(type_)


_result_decoder = _decoder(RunToolResult)
_any_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()

END_GRACE = 0.5
"""Seconds a tool-call stream may stay open after its result (the ``end`` or ``error`` event)
before the connection is dropped, where the step waits for it (aiohttp's connections). A server
closes it at once; one that keeps it open (pings after the result) must not hold the step up.
Waiting briefly keeps the connection for reuse."""

DETACHED_END_GRACE = 2.0
"""The same where the step does not wait for the stream's end (openenv_gym's own connections,
:meth:`~openenv_gym.adapters.net.http1.Response.release_at_end`): the connection is reused once
the end arrives, and the pool's next request waits for that rather than open another. A server
busy with thousands of sessions writes the end up to a second or two after the result, and a
connection dropped for that is replaced by a new one that waits behind its accept queue."""


class NotJSON(ConfigurationError):
    """A request body (tool arguments, a task spec, secrets) that cannot be encoded as JSON."""


def encode(body: Any, what: str) -> bytes:
    """``body`` as JSON bytes; :class:`NotJSON` (never a bare TypeError/ValueError) if it cannot be."""
    try:
        return _encoder.encode(body)
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
        # ValueError covers UnicodeEncodeError (lone surrogates) and integers too long to print.
        raise NotJSON(f"{what} cannot be sent as JSON ({type(exc).__name__}: {exc})") from None


# -- HTTP statuses ----------------------------------------------------------------------------------
class Timeouts(NamedTuple):
    """The limits of one request: ``connect`` to open a connection, ``read`` for each read."""

    connect: float
    read: float


class Reply(NamedTuple):
    """A whole HTTP response: status, headers and body (read before the connection is reused)."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def _detail(reply: Reply) -> str:
    """The ``detail`` of a FastAPI error, or the start of the body (never more than 500 characters)."""
    try:
        detail = decode_within_depth(_any_decoder, reply.content, 32)
        detail = detail.get("detail", detail) if isinstance(detail, dict) else detail
        text = detail if isinstance(detail, str) else _encoder.encode(detail).decode()
    except (msgspec.DecodeError, msgspec.EncodeError, TypeError, ValueError):
        text = reply.text
    return text if len(text) <= 500 else text[:500] + "..."


class _Retry503(BackendError):
    """A 503 (openreward's "still starting"), with the server's ``Retry-After`` if it sent one."""

    def __init__(self, message: str, after: float | None):
        super().__init__(message)
        self.after = after


def raise_for_status(reply: Reply, what: str) -> None:
    """Raise the typed error an HTTP error status means; return for 1xx-3xx."""
    code = reply.status_code
    if code < 400:
        return
    detail = _detail(reply)
    message = f"{what}: HTTP {code}: {detail}"
    if code == 503:
        after = reply.headers.get("retry-after")
        raise _Retry503(message, float(after) if after and after.replace(".", "", 1).isdigit() else None)
    if code >= 500:
        raise ServerError(message)
    if "Invalid split" in detail or "Invalid index" in detail:
        raise TaskNotFound(message)
    if code == 404 and "Active environment not found" in detail:
        raise BackendUnavailable(f"{message} (the server no longer has this session)")
    raise ConfigurationError(message)


class _StreamEnded(aiohttp.ClientPayloadError):
    """A tool-call stream that ended before its result (a dropped stream, retried by task_id)."""


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, http1.Refused, _Retry503))


def _refused(exc: BaseException) -> bool:
    # For requests that must not run twice: only a refused connection or a 503 proves they did not.
    return isinstance(exc, (aiohttp.ClientConnectorError, http1.Refused, _Retry503))


def _retry_after(exc: BaseException) -> float | None:
    return exc.after if isinstance(exc, _Retry503) else None


# -- the transport ----------------------------------------------------------------------------------
_JSON = {"Content-Type": "application/json"}
_SSE = {"Accept": "text/event-stream", "Content-Type": "application/json"}


def _basic(login: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()


class FromEnvironment(NamedTuple):
    """What aiohttp's ``trust_env`` would read for a server, read once (:func:`from_environment`)."""

    headers: dict[str, str]
    """``Authorization`` from ``.netrc`` and a plain-HTTP proxy's ``Proxy-Authorization``, for every request."""
    request: dict[str, Any]
    """``proxy`` and ``proxy_headers``, for every request."""


def from_environment(url: str, headers: Mapping[str, str] | None) -> FromEnvironment:
    """What aiohttp's ``trust_env`` reads for ``url``, read once: the proxy of its scheme
    (``HTTP(S)_PROXY``, unless ``NO_PROXY`` bypasses the host; credentials in its URL become
    ``Proxy-Authorization``) and the host's ``.netrc`` credentials (``NETRC`` or ``~/.netrc``; not
    when the headers authorize already). Why: with ``trust_env`` aiohttp looks both up on every
    request, each in a worker thread: two thread-pool round trips per tool call.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    extra: dict[str, str] = {}
    request: dict[str, Any] = {}
    if host and not urllib.request.proxy_bypass(host):
        proxy = urllib.request.getproxies().get(parts.scheme)
        if proxy:
            found = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            request["proxy"] = urlunsplit(found._replace(netloc=found.netloc.rpartition("@")[2]))
            if found.username is not None:
                credentials = _basic(unquote(found.username), unquote(found.password or ""))
                # A plain-HTTP request goes to the proxy as it is, its headers with it; an HTTPS one
                # is tunnelled, and the proxy sees only the CONNECT request's headers.
                if parts.scheme == "https":
                    request["proxy_headers"] = {"Proxy-Authorization": credentials}
                else:
                    extra["Proxy-Authorization"] = credentials
    if host and not any(k.lower() == "authorization" for k in (headers or {})):
        path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
        try:
            login = netrc.netrc(path).authenticators(host)
        except (OSError, netrc.NetrcParseError):
            login = None
        if login is not None and login[0]:
            extra["Authorization"] = _basic(login[0], login[2] or "")
    return FromEnvironment(extra, request)


def _client_timeout(t: Timeouts) -> aiohttp.ClientTimeout:
    # ``connect`` also bounds the wait for a free pooled connection (as httpx's pool timeout did).
    return aiohttp.ClientTimeout(total=None, connect=t.connect + t.read, sock_connect=t.connect, sock_read=t.read)


class _ErrorBoundary:
    """:meth:`ORSTransport.errors`: a class rather than ``contextlib.asynccontextmanager``, whose
    generator per use costs more than the rest of a tool call's own work."""

    __slots__ = ("_link", "_what", "_task")

    def __init__(self, link: ORSTransport, what: str):
        self._link, self._what = link, what
        self._task: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> None:
        task = self._task = asyncio.current_task()
        if task is not None:
            self._link._inflight.add(task)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        task = self._task
        try:
            translated = None if exc is None else await self._link._translate(exc, self._what, task)
            if translated is not None:  # otherwise ``exc`` propagates as it is
                raise translated from None
        finally:
            if task is not None:
                self._link._inflight.discard(task)


class ORSTransport:
    """Requests and tool-call streams to one ORS server, every failure a typed error.

    One aiohttp session per transport, made on the runtime loop (where every call must run).

    Args:
        url: ``http(s)://...`` or ``unix:<socket path>``.
        timeouts: connect and read limits of one request.
        headers: sent with every request (API keys, a local server's token): never in messages.
        local: the server is one this process launched (no proxies from the environment).
        exit_note: for a local server, a coroutine saying how its process exited (or ``""``),
            appended to "cannot be reached" messages.
        max_connections: the size of the connection pool.
        limits: what one answer may hold (default: :data:`~openenv_gym.adapters.limits.DEFAULT_LIMITS`).
    """

    def __init__(
        self,
        url: str,
        *,
        timeouts: Timeouts,
        headers: dict[str, str] | None = None,
        local: bool = False,
        exit_note: Callable[[], Awaitable[str]] | None = None,
        max_connections: int = 16,
        limits: Limits | None = None,
    ):
        self.url = url
        self.timeouts = timeouts
        self.limits = limits or DEFAULT_LIMITS
        self.closed = False
        self._exit_note = exit_note
        # Calls in flight, ended by aclose(): aiohttp may leave a request waiting on a response
        # the closed session will never deliver (a reset racing close() from another thread hung).
        self._inflight: set[asyncio.Task[Any]] = set()
        self._ended_by_close: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        # read_timeout and END_GRACE of every tool-call stream, for the price of one timer
        self._deadlines = runtime.Deadlines()
        self._stream_timeout = aiohttp.ClientTimeout(total=None, connect=timeouts.connect + timeouts.read,
                                                     sock_connect=timeouts.connect, sock_read=None)
        self._base = "http://ors" if url.startswith("unix:") else url.rstrip("/")
        environment = FromEnvironment({}, {}) if local or url.startswith("unix:") else from_environment(self._base, headers)
        self._options = environment.request
        # Plain HTTP without a proxy: http1's own connections for every request (aiohttp's
        # request machinery costs more client CPU than the rest of a step); aiohttp otherwise.
        # Only one of the two is built: 16,384 sub-envs hold 2,048 transports or more.
        self._plain = (http1.Pool(url, {**(headers or {}), **environment.headers}, max_connections,
                                  http1.LOCAL_IDLE_LIMIT if local else http1.IDLE_LIMIT)
                       if http1.usable(url) and not self._options else None)
        self._client: aiohttp.ClientSession | None = None
        if self._plain is None:
            connector: aiohttp.BaseConnector
            if url.startswith("unix:"):
                path = url[len("unix:"):]
                connector = aiohttp.UnixConnector(path=path[2:] if path.startswith("//") else path, limit=max_connections)
            else:
                connector = aiohttp.TCPConnector(limit=max_connections, ssl=ssl_context())
            self._client = aiohttp.ClientSession(
                connector=connector, timeout=_client_timeout(timeouts),
                headers={**(headers or {}), **environment.headers}, auto_decompress=True)

    async def aclose(self) -> None:
        self.closed = True
        self._deadlines.cancel()
        current = asyncio.current_task()
        for task in list(self._inflight):
            if task is not current and not task.done():
                self._ended_by_close.add(task)
                task.cancel()
        if self._plain is not None:
            self._plain.close()
        if self._client is not None:
            await self._client.close()

    # -- the one error boundary --------------------------------------------------------------------
    def errors(self, what: str) -> _ErrorBoundary:
        """``async with`` it: every foreign exception raised inside becomes an
        :mod:`openenv_gym.errors` error, and the task counts as a call in flight (:meth:`aclose`
        ends those)."""
        return _ErrorBoundary(self, what)

    async def _translate(self, exc: BaseException, what: str, task: asyncio.Task[Any] | None) -> BaseException | None:
        """The :mod:`openenv_gym.errors` error for ``exc``, raised while doing ``what``; ``None``
        when ``exc`` is to propagate as it is (a cancel, the package's own errors, a bug)."""
        if isinstance(exc, asyncio.CancelledError):
            # Ended by aclose() (and by nothing else): the caller sees the closed connection.
            if task is not None and task in self._ended_by_close:
                self._ended_by_close.discard(task)
                if task.uncancel() == 0:
                    return BackendUnavailable(self._closed_text())
            return None
        if isinstance(exc, _Retry503):
            return BackendUnavailable(str(exc))
        if isinstance(exc, TooDeep):
            return too_deep(what, self.limits.json_depth)
        if isinstance(exc, (msgspec.DecodeError, UnicodeDecodeError)):  # msgspec: bad UTF-8 is not a DecodeError
            return ServerError(f"{what}: the server sent an unreadable answer ({exc})")
        if isinstance(exc, BackendError):
            return None
        if isinstance(exc, (aiohttp.ServerTimeoutError, TimeoutError)):
            return BackendTimeout(f"{what}: {self._timeout_text(exc)}")
        if isinstance(exc, _StreamEnded):
            return await self._unreachable(exc)
        if isinstance(exc, aiohttp.ClientPayloadError):
            return ServerError(f"{what}: the server sent an undecodable body ({exc})")
        if isinstance(exc, http1.BadResponse):
            return ServerError(f"{what}: {exc}")
        if isinstance(exc, (aiohttp.ClientError, OSError)):
            return await self._unreachable(exc)
        if isinstance(exc, RuntimeError) and self.closed and not isinstance(exc, RecursionError):
            return BackendUnavailable(self._closed_text())
        return None

    def _timeout_text(self, exc: BaseException) -> str:
        t = self.timeouts
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return (f"could not connect within connect_timeout={t.connect} s, or no free connection within "
                    f"read_timeout={t.read} s (ConnectionTimeoutError)")
        return f"no response within read_timeout={t.read} s ({type(exc).__name__})"

    async def _unreachable(self, exc: BaseException) -> BackendUnavailable:
        if self.closed:
            return BackendUnavailable(self._closed_text())
        message = f"the ORS server at {self.url} cannot be reached ({type(exc).__name__}: {exc})"
        if self._exit_note is not None:
            message += await self._exit_note()
        return BackendUnavailable(message)

    def _closed_text(self) -> str:
        return f"the connection to the ORS server at {self.url} is closed"

    # -- requests ----------------------------------------------------------------------------------
    async def _read(self, response: aiohttp.ClientResponse | http1.Response, what: str) -> bytes:
        """The whole body, counted as it arrives: over ``max_response_bytes`` it is never read whole."""
        limit = self.limits.response_bytes
        length = response.content_length
        if length is not None and "content-encoding" not in response.headers:
            if length > limit:  # aiohttp reads exactly Content-Length bytes: known before reading
                raise too_large(what, limit, f" (Content-Length {length})")
            return await response.read()
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise too_large(what, limit)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _send(self, method: str, path: str, content: bytes | None, headers: dict[str, str] | None,
                    check: bool, timeout: float | None) -> Reply:
        if self.closed:
            raise BackendUnavailable(self._closed_text())
        if self._plain is not None:
            what = f"{method} {path}"
            exchange = self._exchange(method, path, content, headers, what)
            if timeout is None:  # connect_timeout and read_timeout, as aiohttp's session bounds them
                reply = await self._waited(exchange, what, self.timeouts.connect + self.timeouts.read)
            else:
                reply = await self._deadlines.within(exchange, timeout, what, "its timeout")
            if check:
                raise_for_status(reply, what)
            return reply
        # aiohttp reads timeout=None as "no limit at all": pass one only to override the session's.
        limits: dict[str, Any] = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
        assert self._client is not None  # built whenever _plain is not
        async with self._client.request(method, self._base + path, data=content, headers=headers, **self._options,
                                        **limits) as response:
            reply = Reply(response.status, response.headers, await self._read(response, f"{method} {path}"))
        if check:
            raise_for_status(reply, f"{method} {path}")
        return reply

    async def _exchange(self, method: str, path: str, content: bytes | None, headers: dict[str, str] | None,
                        what: str) -> Reply:
        """One request on the plain-HTTP pool, its answer read whole."""
        assert self._plain is not None
        lines = ""
        for name, value in (headers or {}).items():
            if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
                raise ConfigurationError(f"{what}: an HTTP header may not contain a line break")
            lines += f"{name}: {value}\r\n"
        async with await self._plain.request(method, path, content, lines) as response:
            return Reply(response.status, response.headers, await self._read(response, what))

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        sid: str | None = None,
        headers: dict[str, str] | None = None,
        check: bool = True,
        idempotent: bool = True,
        decode: Any = None,
    ) -> Any:
        """Send a request (JSON ``body``, ``X-Session-ID: sid``), retrying only transient failures.

        Returns the :class:`Reply`, or with ``decode=<type>`` its body decoded as that type. A
        request that is not ``idempotent`` is retried only where it provably did not reach the server.
        """
        what = f"{method} {path}"
        content = encode(body, f"the body of {what}") if body is not None else None
        all_headers = dict(_JSON) if content is not None else {}
        if sid:
            all_headers["X-Session-ID"] = sid
        if headers:
            all_headers.update(headers)

        async def once() -> Reply:
            return await self._send(method, path, content, all_headers or None, check, None)

        async with self.errors(what):
            reply = await runtime.retry(
                once, retry_if=_transient if idempotent else _refused, attempts=5, deadline=30.0,
                delay_for=_retry_after,
            )
            return reply if decode is None else decode_within_depth(_decoder(decode), reply.content,
                                                                    self.limits.json_depth)

    async def delete_session(self, sid: str, timeout: float) -> None:
        """``POST /delete``, best effort: a server that is gone or slow reaps the session itself."""
        try:
            await self._send("POST", "/delete", None, {"X-Session-ID": sid}, False, timeout)
        except (aiohttp.ClientError, OSError, TimeoutError, BackendError, RuntimeError, http1.BadResponse):
            pass  # the server's reaper ends the session after 900 s idle

    # -- the ORS routes the adapter uses (an env run in this process answers the same calls:
    # -- openenv_gym.adapters.ors.inprocess) --------------------------------------------------------
    async def environments(self) -> list[str]:
        return await self.request("GET", "/list_environments", decode=list[str])

    async def is_openreward(self) -> bool:
        """True for an openreward server (only it has ``/version``): that decides where secrets go."""
        return (await self.request("GET", "/version", check=False)).status_code == 200

    async def tools(self, env: str) -> ListTools:
        return await self.request("GET", f"/{env}/tools", decode=ListTools)

    async def splits(self, env: str) -> list[SplitWire | str]:
        return await self.request("GET", f"/{env}/splits", decode=list[SplitWire | str])

    async def num_tasks(self, env: str, split: str) -> int:
        return (await self.request("POST", f"/{env}/num_tasks", body={"split": split}, decode=NumTasks)).num_tasks

    async def task(self, env: str, split: str, index: int) -> dict[str, Any]:
        return (await self.request("POST", f"/{env}/task", body={"split": split, "index": index}, decode=TaskWire)).task

    async def create(self, sid: str, body: dict[str, Any], headers: dict[str, str] | None) -> None:
        """``POST /create`` (retried only where it cannot have run)."""
        await self.request("POST", "/create", body=body, sid=sid, headers=headers, idempotent=False)

    async def prompt(self, env: str, sid: str) -> list[Block]:
        return await self.request("GET", f"/{env}/prompt", sid=sid, decode=list[Block])

    async def messages(self, env: str, sid: str) -> list[MessageWire]:
        return await self.request("GET", f"/{env}/messages", sid=sid, decode=list[MessageWire])

    async def task_tools(self, env: str, sid: str) -> ListTools:
        return await self.request("GET", f"/{env}/task_tools", sid=sid, decode=ListTools)

    async def ping(self, sid: str) -> None:
        await self.request("POST", "/ping", sid=sid, check=False)

    async def call_tool(
        self, env: str, sid: str, name: str, arguments: dict[str, Any] | None, *, resume_attempts: int
    ) -> RunToolResult | str:
        """Run a tool; returns the server's result, or the text of an SSE ``error`` event.

        A stream that drops after the server announced the call's ``task_id`` is resumed with
        that id (the server replays the result without running the tool again). Raises
        :class:`NotJSON` before sending anything if ``arguments`` cannot be JSON.
        """
        path = f"/{env}/call"
        if "\r" in sid or "\n" in sid:
            raise ConfigurationError("a session id may not contain a line break")
        headers = {"X-Session-ID": sid, **_SSE}
        lines = f"X-Session-ID: {sid}\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\n"
        plain = self._plain
        task_id: str | None = None
        outcome: RunToolResult | str | None = None
        backoff = runtime.Backoff(base=0.2, cap=2.0)
        last_exc: BaseException | None = None
        body: dict[str, Any] = {"name": name, "input": arguments or {}}
        what = f"tool {name!r}"
        content = encode(body, f"the arguments of tool {name!r}")
        async with self.errors(what):
            for attempt in range(resume_attempts + 1):
                if task_id is not None:
                    body["task_id"] = task_id
                    content = _encoder.encode(body)  # encodable: the same body was, plus a str
                try:
                    if self.closed:
                        raise BackendUnavailable(self._closed_text())
                    # read_timeout bounds every wait on the server, on the transport's shared
                    # deadlines rather than aiohttp's sock_read timer, which is re-armed on every
                    # chunk (a step's timers cost more than the rest of its client-side work)
                    response: aiohttp.ClientResponse | http1.Response = await self._waited(
                        plain.request("POST", path, content, lines) if plain is not None else
                        cast(aiohttp.ClientSession, self._client).post(self._base + path, data=content, headers=headers,
                                          timeout=self._stream_timeout, **self._options),
                        what, self.timeouts.connect + self.timeouts.read)
                    async with response:
                        if response.status != 200:
                            raise_for_status(Reply(response.status, response.headers,
                                                   await self._waited(self._read(response, f"POST {path}"), what)),
                                             f"POST {path}")
                        kind = response.headers.get("content-type", "")
                        if not kind.lower().startswith("text/event-stream"):
                            start = (await self._waited(response.content.read(200), what)).decode("utf-8", "replace")
                            raise ServerError(
                                f"POST {path}: the server answered a tool call with "
                                f"{kind.split(';')[0].strip() or 'no content type'} "
                                f"instead of an event stream (text/event-stream): {start!r}")
                        decoder = SSEDecoder()
                        text = codecs.getincrementaldecoder("utf-8")()
                        parts: list[str] = []
                        limit = self.limits.response_bytes
                        received = 0
                        stream = response.content
                        while chunk := await self._waited(stream.readany(), what):
                            received += len(chunk)
                            if received > limit:
                                raise too_large(f"tool {name!r}", limit)
                            for event in decoder.feed(text.decode(chunk)):
                                if event.event == "task_id":
                                    task_id = event.data
                                elif event.event == "chunk":
                                    parts.append(event.data)
                                elif event.event == "end" and outcome is None:
                                    parts.append(event.data)
                                    outcome = self._result("".join(parts))
                                elif event.event == "error" and outcome is None:
                                    if "task_id" in body and event.data == "unknown task_id":
                                        raise BackendError(
                                            f"tool {name!r}: the stream dropped and the server no longer "
                                            "has the call's result (kept 60 s); it may or may not have run"
                                        )
                                    outcome = event.data
                            if outcome is not None:
                                break
                        if outcome is None:  # the stream ended: a last event may lack its blank line
                            for event in decoder.feed(text.decode(b"", final=True)) + decoder.close():
                                if event.event == "end" and outcome is None:
                                    parts.append(event.data)
                                    outcome = self._result("".join(parts))
                            if outcome is None:
                                raise _StreamEnded("the tool-call stream ended before its result")
                        elif isinstance(response, http1.Response):
                            response.release_at_end(DETACHED_END_GRACE)  # the step need not wait for the end
                        elif not stream.at_eof():
                            await self._finish(response)
                        return outcome
                except _Retry503 as exc:
                    last_exc = exc
                    await asyncio.sleep(exc.after if exc.after is not None else backoff.delay(attempt))
                except (aiohttp.ServerTimeoutError, TimeoutError):
                    raise
                except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, http1.Refused, http1.Dropped) as exc:
                    if outcome is not None:  # the result arrived; only the stream's tail was lost
                        return outcome
                    # Before the server announced a task_id the tool may not have started; only a
                    # refused connection proves that, so anything else is not retried blindly.
                    if task_id is None and not isinstance(exc, (aiohttp.ClientConnectorError, http1.Refused)):
                        raise
                    last_exc = exc
                    await asyncio.sleep(backoff.delay(attempt))
            raise last_exc or _StreamEnded("no attempt made")

    async def _waited(self, awaitable: Awaitable[T], what: str, limit: float | None = None) -> T:
        """``awaitable``, a wait on the server, cut off after ``limit`` (default: ``read_timeout``)."""
        seconds = self.timeouts.read if limit is None else limit
        try:
            return await self._deadlines.within(awaitable, seconds, what)
        except BackendTimeout:
            raise BackendTimeout(f"{what}: no response within read_timeout={self.timeouts.read} s") from None

    def _result(self, data: str) -> RunToolResult:
        return decode_within_depth(_result_decoder, data, self.limits.json_depth)

    async def _finish(self, response: aiohttp.ClientResponse | http1.Response) -> None:
        """Wait briefly for a tool-call stream to end after its result; drop the connection otherwise.

        The end of the stream usually arrives with the result. Reading it lets the connection be
        reused (a new one per call costs more than the rest of the step); a server that keeps
        the stream open, or sends more, is cut off after :data:`END_GRACE` seconds.
        """
        try:
            # The transport's shared deadlines, not a timer of this call's own: the end of nearly
            # every tool call's stream is awaited here.
            rest = await self._deadlines.within(response.content.readany(), END_GRACE, "the stream's end", "END_GRACE")
            if rest or not response.content.at_eof():
                response.close()
        except (BackendTimeout, aiohttp.ClientError, OSError, http1.BadResponse):
            response.close()
