"""Keep-alive HTTP/1.1 connections to one plain-HTTP server, parsed by httptools.

Why not aiohttp here: an ORS request is small (a tool call is one POST answered by a short SSE
stream), and aiohttp's request machinery (its request and response objects, cookie jar, header
multidicts, a writer task per request, a timer per read) was the largest part of the client's
CPU at 64 concurrent sessions (``benchmarks/vector.py --only client``: 426 us per env-step on
aiohttp, 268 us on these connections). Here a request is one ``write`` of pre-rendered bytes
and the answer is parsed in C by httptools (llhttp, the parser uvicorn serves with) as it
arrives. :class:`~openenv_gym.adapters.ors.transport.ORSTransport` uses it for every request to
``http://`` and ``unix:`` servers reached without a proxy (every local server, and the usual
remote one on a cluster); TLS and proxies keep aiohttp.

What a server sends is bounded: the response head at :data:`HEAD_LIMIT` bytes, the unread body
at :data:`BUFFER` bytes (reading pauses until the caller takes it; the caller counts the whole
body against its own limit). A connection goes back to the pool only after a complete response
the server allows to keep alive; anything else (a cancel mid-response, a server that sends
bytes nobody asked for) closes it, so a reply can never be read as a later request's. A caller
that has what it needs before the response ends (a tool call's result) lets go of it with
:meth:`Response.release_at_end`: the connection comes back when the end does.

Every pool on a loop draws its connections from one budget, the process's open-files limit less
a reserve (:class:`_Budget`): thousands of sessions wait their turn for a connection rather than
run the process out of descriptors.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import time
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any, cast
from urllib.parse import quote, urlsplit

import httptools

__all__ = ["Pool", "Response", "Refused", "Dropped", "BadResponse", "usable"]

HEAD_LIMIT = 64 * 1024
"""Bytes the status line and headers of one response may take."""

BUFFER = 256 * 1024
"""Bytes of a response body held unread before the connection stops reading from the socket."""

IDLE_LIMIT = 2.0
"""Seconds a connection may sit idle and still be reused; an older one is closed instead.

A server closes idle connections after its keep-alive limit (uvicorn, which the ORS SDKs serve
with: 5 s). A request written as the server closes the connection is lost without an answer,
and a tool call that may have started is never retried blindly; staying well below the
server's limit means a reused connection is never one the server is closing."""

LOCAL_IDLE_LIMIT = 5.0
""":data:`IDLE_LIMIT` for a server this package launched, which keeps connections alive for 60 s
(``local_servers/serve.py``). With thousands of sessions a step's answer may wait seconds for the
trainer's next action; closing its connection meanwhile made every such step open a new one,
and the server's accept queue overflowed at 16,384 sessions."""


RESERVE = 0.1
"""The share of the open-files limit (at least 256) the connection budget leaves to everything
else in the process (logs, pipes, the interpreter's own, other clients' sockets) and to
connections just closed: a transport closes its socket on a later pass of the loop, so under
churn more descriptors are open than connections counted."""


class Refused(ConnectionError):
    """No connection could be opened: the request was not sent."""


class Dropped(ConnectionError):
    """The connection ended before the whole response arrived."""


class BadResponse(Exception):
    """The server's bytes are not an HTTP/1.1 response (or not one that was asked for)."""


def _head_too_large() -> BadResponse:
    return BadResponse(f"the response's headers are over {HEAD_LIMIT} bytes")


@functools.lru_cache(maxsize=1024)
def _quoted(path: str) -> str:
    # A client sends the same few paths (a tool call's is one per env) thousands of times a second.
    return quote(path, safe="/")


def usable(url: str) -> bool:
    """True for the URLs this module serves: ``unix:<path>`` and ``http://host[:port]``."""
    return url.startswith("unix:") or urlsplit(url).scheme == "http"


class Response(asyncio.Protocol):
    """One connection, and the response to the request it is running.

    The pool hands it out by :meth:`Pool.request` once the response's headers are in; the caller
    reads the body with :meth:`readany` and ends with ``async with`` (or :meth:`release`), which
    returns the connection to the pool or closes it.
    """

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._head = 0  # bytes received while the head was incomplete
        self._head_parsed = 0  # bytes of the headers parsed
        self._paused = False
        self._expecting = False  # a request was sent and its response has not ended
        self._keep = False
        self.closed = False
        self.error: BaseException | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        """The response's headers, names in lower case."""
        self.complete = False
        self.has_head = False
        self.budget: _Budget | None = None
        """The budget its place was taken from (:class:`_Budget`), once connected."""
        self.ending_until = 0.0
        """While the caller has let go of a response that has not ended (:meth:`release_at_end`),
        when it is dropped if it still has not (``time.monotonic()``); 0 otherwise."""
        self.idle_since = 0.0
        """When the connection last went back to the pool (``time.monotonic()``)."""

    # -- the connection's events (asyncio.Protocol and httptools' callbacks) -----------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # not isinstance-checked: uvloop's transports (Ray actors run on uvloop) are not asyncio's classes
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.has_head:  # counted here too: a header that never ends never reaches on_header
            if self._head > HEAD_LIMIT:
                self._fail(_head_too_large())
                return
            self._head += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            self._fail(cause if isinstance(cause, BadResponse) else
                       BadResponse(f"the server's answer is not HTTP/1.1 ({exc})"))
            return
        if self._buffered > BUFFER and not self._paused and not self.closed:
            self._paused = True
            assert self._transport is not None
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        if self.has_head and not self.complete and self._ends_at_eof():
            self.on_message_complete()  # a body without a length ends with the connection
            self._keep = False
        self._fail(Dropped("the server closed the connection before the response ended"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed and isinstance(exc, OSError) and exc.errno == errno.ENOTCONN:
            # A Unix socket's connect "succeeds" without a connection when the server's accept queue
            # is full, and the first write fails so: no byte reached the server.
            self._fail(Refused(f"the server's accept queue is full ({type(exc).__name__}: {exc})"))
        elif not self.closed:
            self._fail(Dropped("the connection was lost before the response ended"
                               + (f" ({type(exc).__name__}: {exc})" if exc else "")))

    def _ends_at_eof(self) -> bool:
        return "content-length" not in self.headers and "chunked" not in self.headers.get("transfer-encoding", "")

    def on_message_begin(self) -> None:
        if not self._expecting:  # a response nobody asked for: this connection can't be trusted
            self._fail(BadResponse("the server sent a response that was not asked for"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_parsed += len(name) + len(value) + 4
        if self._head_parsed > HEAD_LIMIT:
            raise _head_too_large()  # httptools stops and raises it as the cause of its own error
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._keep = self._parser.should_keep_alive()
        self.has_head = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.ending_until:  # more after what its reader took: the connection can't be trusted
            self._close()
            return
        self._chunks.append(body)
        self._buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete, self._expecting = True, False
        if self.ending_until:
            self.ending_until = 0.0
            self._pool._ending_live -= 1
            self.release()
        self._wake()

    # -- the caller's side -------------------------------------------------------------------------
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None and not (self.complete and isinstance(error, Dropped)):
            self.error = error
        self._close()
        self._wake()

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.ending_until:
                self.ending_until = 0.0
                self._pool._ending_live -= 1
            if self._transport is not None:
                self._transport.close()
            self._pool._gone(self)

    async def _wait(self) -> None:
        if self.error is not None:
            raise self.error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _send(self, data: bytes) -> None:
        self.status, self.headers, self.complete, self.has_head = 0, {}, False, False
        self._chunks.clear()
        self._buffered = self._head = self._head_parsed = 0
        self._expecting = True
        assert self._transport is not None
        self._transport.write(data)

    @property
    def content(self) -> Response:
        """The body as a stream (``response.content.readany()``, as aiohttp's responses have it)."""
        return self

    @property
    def content_length(self) -> int | None:
        length = self.headers.get("content-length")
        return int(length) if length is not None and length.isdigit() else None

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last read, waiting for some; ``b""`` at its end."""
        while not self._chunks:
            if self.complete:
                return b""
            await self._wait()
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and not self.closed:
            self._paused = False
            assert self._transport is not None
            self._transport.resume_reading()
        return data

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes of the body (all of it for ``n < 0``)."""
        parts: list[bytes] = []
        size = 0
        while n < 0 or size < n:
            chunk = await self.readany()
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        data = b"".join(parts)
        return data if n < 0 else data[:n]

    async def iter_any(self) -> Any:
        while chunk := await self.readany():
            yield chunk

    def at_eof(self) -> bool:
        return self.complete and not self._chunks

    def close(self) -> None:
        """Drop the connection (the response is not wanted, or was not read to its end)."""
        self._close()

    def release(self) -> None:
        """Return the connection to the pool if its response ended and the server keeps it open."""
        if self.closed or self.ending_until:
            return
        if self.complete and not self._chunks and self._keep and self.error is None and not self._pool.closed:
            self._pool._put_idle(self)
        else:
            self._close()

    def release_at_end(self, grace: float) -> None:
        """Let go of a response its reader is done with before it has ended (a tool call's result
        is in; the stream's end follows): the connection goes back to the pool when the end
        arrives, or is dropped if it has not within ``grace`` seconds or more body comes. Nobody
        waits for the end: under load a server writes it well after the result, and a step that
        waited for it, or a connection dropped for it, cost the step seconds (a new connection
        waits behind a busy server's accept queue). A later :meth:`release` leaves it to that."""
        if self.closed or self.complete or self._chunks or self.error is not None:
            return  # ended (or unusable) already: release() decides now
        self.ending_until = time.monotonic() + grace
        self._pool._ending_add(self)

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if kind is None:
            self.release()
        else:
            self._close()


_pools: weakref.WeakSet[Pool] = weakref.WeakSet()
"""Every pool that has connected, for :func:`_shed_idle`."""


class _Turns:
    """Requests waiting their turn for a connection, first come first served: one is woken per
    place that frees up, and one that gives up after it was woken passes its turn on."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self._waiters)

    def wake_first(self, every: bool = False) -> None:
        """Wake the first waiter still waiting (``every``: all of them)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                if not every:
                    return

    def wake_all(self) -> None:
        self.wake_first(every=True)

    async def wait(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.wake_first()  # it was woken for a turn it will not take: pass it on
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)


class _Budget:
    """The connections every pool on one loop may hold at once: the process's open-files limit
    less :data:`RESERVE`.

    At 16,384 sessions nearly every session has a request in flight, each on a connection of its
    own, and the pools' idle and not yet accepted connections come on top: the process ran out of
    descriptors, closed idle connections everywhere to recover, and their sessions' new
    connections queued behind the busy servers' full accept queues for up to 30 s. With a budget
    a request that would pass it closes the oldest idle connection of another pool, or waits its
    turn (first come, first served) for one to close; nothing runs out.
    """

    def __init__(self) -> None:
        self.open = 0
        self.waiters = _Turns()
        self._limit = 0

    def full(self) -> bool:
        if self.open < self._limit:
            return False
        import resource  # read again when it matters: a vector env raises the soft limit as it starts

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._limit = 1 << 30 if soft == resource.RLIM_INFINITY else max(16, soft - max(256, int(soft * RESERVE)))
        return self.open >= self._limit

    def release(self) -> None:
        self.open -= 1
        self.waiters.wake_first()


_budgets: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Budget] = weakref.WeakKeyDictionary()


def _budget(loop: asyncio.AbstractEventLoop) -> _Budget:
    budget = _budgets.get(loop)
    if budget is None:
        budget = _budgets[loop] = _Budget()
    return budget


def _pools_on(loop: asyncio.AbstractEventLoop) -> list[Pool]:
    """The pools that connect on ``loop`` (a snapshot: closing connections may drop pools)."""
    return [pool for pool in list(_pools) if pool._loop is loop]


def _close_oldest_idle(loop: asyncio.AbstractEventLoop) -> bool:
    """Close the connection idle longest in any pool on ``loop``; False if none is idle."""
    oldest: Response | None = None
    for pool in _pools_on(loop):
        if pool._idle and (oldest is None or pool._idle[0].idle_since < oldest.idle_since):
            oldest = pool._idle[0]
    if oldest is None:
        return False
    oldest._pool._idle.remove(oldest)
    oldest._close()
    return True


def _shed_idle(loop: asyncio.AbstractEventLoop) -> int:
    """Close the idle connections of every pool on ``loop``; how many were closed.

    Called when this process has run out of descriptors: an idle keep-alive connection is a
    cache, and one pool's idle connections cannot serve another's requests (a vector env holds a
    pool per adapter and server). During the reset of 16,384 sessions, those of sessions that had
    moved on briefly pushed the process past 20,000 descriptors.
    """
    closed = 0
    for pool in _pools_on(loop):
        while pool._idle:
            pool._idle.pop().close()
            closed += 1
    return closed


class Pool:
    """Up to ``max_connections`` keep-alive connections to the server at ``url``.

    Args:
        url: ``http://host[:port]`` or ``unix:<socket path>``.
        headers: sent with every request (a local server's token, API keys).
        max_connections: connections open at once; further requests wait for a free one.
        idle_limit: seconds an idle connection is kept for reuse (below the server's keep-alive).
    """

    def __init__(self, url: str, headers: Mapping[str, str], max_connections: int,
                 idle_limit: float = IDLE_LIMIT) -> None:
        if url.startswith("unix:"):
            path = url[len("unix:"):]
            self._unix: str | None = path[2:] if path.startswith("//") else path
            host, self._address = "ors", ("", 0)
        else:
            parts = urlsplit(url)
            self._unix = None
            self._address = (parts.hostname or "127.0.0.1", parts.port or 80)
            host = parts.netloc.rpartition("@")[2]
        lines = [f"Host: {host}", "Accept-Encoding: identity"] + [f"{k}: {v}" for k, v in headers.items()]
        for line in lines:
            if "\r" in line or "\n" in line:
                raise ValueError("an HTTP header may not contain a line break")
        self._common = "".join(line + "\r\n" for line in lines)
        self._max = max_connections
        self._idle_limit = idle_limit
        self._open = 0
        self._idle: list[Response] = []
        self._ending: deque[tuple[float, Response]] = deque()  # let go of before their end, oldest first
        self._ending_live = 0  # of those, still ending
        self._waiters = _Turns()
        self._all: set[Response] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_at = 0.0  # when the sweeper is due (time.monotonic())
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it connects on, once it has
        self.closed = False

    async def request(self, method: str, path: str, body: bytes | None, extra: str) -> Response:
        """Send ``method path`` with ``body`` (``None``: none, as for a GET) and the header lines
        ``extra`` (each ending in CRLF, none holding another line break: the caller's to check);
        returns once the response's headers are in.

        Raises :class:`Refused` (nothing was sent), :class:`Dropped` or :class:`BadResponse`.
        """
        length = "" if body is None and method == "GET" else f"Content-Length: {len(body or b'')}\r\n"
        head = f"{method} {_quoted(path)} HTTP/1.1\r\n{self._common}{extra}{length}\r\n".encode("latin-1")
        conn = await self._acquire()
        try:
            conn._send(head + body if body else head)
            while not conn.has_head:
                await conn._wait()
        except BaseException:
            conn._close()
            raise
        return conn

    async def _acquire(self) -> Response:
        while True:
            if self.closed:
                raise Dropped("the connection pool is closed")
            self._sweep()  # the expired are the oldest: what is left may be reused
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
            # A connection whose response is ending comes back in a moment: a request waits for it
            # rather than opening another (a new connection waits behind a busy server's accept queue).
            if self._open < self._max and len(self._waiters) >= self._ending_live:
                loop = asyncio.get_running_loop()
                budget = _budget(loop)
                if budget.full() and not _close_oldest_idle(loop):
                    await budget.waiters.wait()
                    continue  # a connection may have come back to this pool meanwhile
                budget.open += 1
                self._open += 1
                try:
                    return await self._connect(budget)
                except BaseException:
                    self._open -= 1
                    budget.release()
                    self._hand_over()
                    raise
            await self._waiters.wait()

    async def _connect(self, budget: _Budget) -> Response:
        loop = asyncio.get_running_loop()
        self._loop = loop
        _pools.add(self)
        conn = Response(self)
        for attempt in (0, 1):
            try:
                if self._unix is not None:
                    await loop.create_unix_connection(lambda: conn, self._unix)
                else:
                    await loop.create_connection(lambda: conn, *self._address)
                break
            except OSError as exc:
                if attempt == 0 and exc.errno in (errno.EMFILE, errno.ENFILE) and _shed_idle(loop):
                    for _ in range(3):  # a transport closes its socket on a later pass of the loop
                        await asyncio.sleep(0)
                    continue
                raise Refused(f"cannot connect ({type(exc).__name__}: {exc})") from exc
        if self.closed or conn.closed:
            conn._close()
            raise Dropped("the connection pool is closed" if self.closed else "the connection was lost at once")
        self._all.add(conn)
        conn.budget = budget  # given back when the connection goes (_gone)
        return conn

    def _put_idle(self, conn: Response) -> None:
        """Keep ``conn`` for reuse, and close those idle past the pool's limit (the oldest are
        first): reuse takes the newest, so after a burst the rest would otherwise stay open, a
        socket here and one in the server each, until the server's own keep-alive limit."""
        if not self._waiters and conn.budget is not None and conn.budget.waiters:
            conn._close()  # another pool's request waits for a place: this pool has no use for it now
            return
        conn.idle_since = time.monotonic()
        self._sweep()
        self._idle.append(conn)
        self._sweep_by(conn.idle_since + self._idle_limit)
        self._hand_over()

    def _ending_add(self, conn: Response) -> None:
        self._ending_live += 1
        self._ending.append((conn.ending_until, conn))
        self._sweep_by(conn.ending_until)

    def _sweep_by(self, at: float) -> None:
        """Have the pool's timer run by ``at`` (``time.monotonic()``): one timer, the earliest due."""
        if self._sweeper is not None and self._sweep_at <= at:
            return
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._sweep_at = at
        self._sweeper = asyncio.get_running_loop().call_later(max(0.0, at - time.monotonic()), self._swept)

    def _sweep(self) -> None:
        now = time.monotonic()
        oldest = now - self._idle_limit
        idle = self._idle
        while idle and (idle[0].closed or idle[0].idle_since < oldest):
            idle.pop(0).close()
        ending = self._ending
        while ending and (ending[0][0] <= now or ending[0][1].ending_until != ending[0][0]):
            until, conn = ending.popleft()
            if conn.ending_until == until:  # still not ended (an entry of an earlier request is stale)
                conn._close()

    def _swept(self) -> None:
        # One timer per pool while it holds idle or ending connections: a pool none of whose
        # sessions calls again (its server is another's now, or the burst of a reset is over)
        # closes them too, instead of keeping a socket here and one in the server until the
        # server's limit.
        self._sweeper = None
        self._sweep()
        if (self._idle or self._ending) and not self.closed:
            now = time.monotonic()
            due = [self._idle[0].idle_since + self._idle_limit] if self._idle else []
            due += [self._ending[0][0]] if self._ending else []
            self._sweep_by(max(now + 0.05, min(due)))

    def _hand_over(self) -> None:
        """Wake the first waiter for a connection (one went idle, or a place in the pool freed up)."""
        self._waiters.wake_first()

    def _gone(self, conn: Response) -> None:
        if conn in self._all:
            self._all.discard(conn)
            self._open -= 1
            if conn.budget is not None:
                conn.budget.release()
            self._hand_over()

    def close(self) -> None:
        """Close every connection, in use or idle; requests in flight get :class:`Dropped`."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._all):
            conn._close()
        self._idle.clear()
        self._ending.clear()
        self._waiters.wake_all()
