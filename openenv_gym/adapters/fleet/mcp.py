"""The MCP client session shared by adapters whose tools live on an MCP server (Fleet today).

One :class:`MCPConnection` is one persistent streamable-HTTP MCP session: opened once per
episode and reused for every tool call, because a call on an open session costs a few ms where
connect + initialize + call + close costs 40-60 ms (measured on loopback; the reconnect rules are
in docs/backends.md, "MCP").

The ``mcp`` package's transport and ``ClientSession`` are anyio context managers that must be
entered and left by the same task, while our episodes are stepped from whichever task the runtime
gives each call. So a background *owner task* holds the contexts open and the calls go through
the session object, which any task of the loop may use.

Written for mcp 1.x and 2.x at once (docs/backends.md, "MCP"): the transport yields 2 or 3
streams, Python attribute names changed to snake_case in 2.x, so results are read by their wire
names (``model_dump(by_alias=True)``), which both versions emit the same way.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from openenv_gym import runtime
from openenv_gym.errors import BackendTimeout, BackendUnavailable
from openenv_gym.wire import ToolSpec

__all__ = ["MCPConnection", "tool_spec", "result_content"]


def _transient(exc: BaseException) -> bool:
    # An instance's MCP endpoint can lag its readiness: refused connections and 5xx at connect
    # time are worth another try; anything else (a 401, a bad URL) is not.
    import httpx

    if isinstance(exc, (httpx.TransportError, BackendUnavailable, ConnectionError)):
        return True
    response = getattr(exc, "response", None)
    return response is not None and getattr(response, "status_code", 0) >= 500


class MCPConnection:
    """A persistent MCP session to ``url`` (streamable HTTP), reconnecting when it breaks.

    Args:
        url: the MCP endpoint.
        headers: sent with every request (e.g. ``Authorization``); never logged.
        timeout: seconds one initialize, ``tools/list`` or ``tools/call`` may take.
        connect_attempts: connection tries (with backoff) before :class:`BackendUnavailable`.
    """

    def __init__(self, url: str, headers: dict[str, str] | None = None, *, timeout: float = 120.0,
                 connect_attempts: int = 6):
        self.url = url
        self._headers = dict(headers or {})
        self.timeout = timeout
        self.connect_attempts = connect_attempts
        self._session: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self.reconnects = 0

    @property
    def connected(self) -> bool:
        return self._session is not None and self._owner is not None and not self._owner.done()

    async def connect(self) -> None:
        """Open the session (idempotent), retrying while the endpoint is not up yet."""
        async with self._lock:
            if self.connected:
                return
            await self._close_owner()
            await runtime.retry(self._open, retry_if=_transient, attempts=self.connect_attempts,
                                backoff=runtime.Backoff(base=0.2, cap=3.0))

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[Any] = loop.create_future()
        self._stop = asyncio.Event()
        self._owner = asyncio.create_task(self._own(ready, self._stop), name=f"mcp-session {self.url}")
        try:
            self._session = await asyncio.wait_for(asyncio.shield(ready), self.timeout)
        except TimeoutError:
            await self._close_owner()
            raise BackendTimeout(f"the MCP endpoint {self.url} did not initialize within {self.timeout:g}s") from None
        except BaseException:
            await self._close_owner()
            raise

    async def _own(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        try:
            async with create_mcp_http_client(headers=self._headers) as http, \
                    streamable_http_client(self.url, http_client=http) as streams, \
                    ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                ready.set_result(session)
                await stop.wait()
        except BaseException as exc:  # the owner must never die silently: the waiter gets it
            if not ready.done():
                ready.set_exception(_unwrap(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _close_owner(self) -> None:
        owner, self._owner, self._session = self._owner, None, None
        if owner is None:
            return
        if self._stop is not None:
            self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(owner), 5.0)
        except BaseException:
            owner.cancel()
            await asyncio.gather(owner, return_exceptions=True)

    async def reconnect(self) -> None:
        """Drop the session and open a new one."""
        async with self._lock:
            await self._close_owner()
            self.reconnects += 1
        await self.connect()

    async def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        await self.connect()
        session = self._session
        try:
            return await asyncio.wait_for(getattr(session, op)(*args, **kwargs), self.timeout)
        except TimeoutError:
            raise BackendTimeout(f"MCP {op} on {self.url} took longer than {self.timeout:g}s") from None

    async def _with_reconnect(self, op: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self._call(op, *args, **kwargs)
        except BackendTimeout:
            raise  # the call may have run: repeating a tool call could apply it twice
        except Exception as exc:
            if not _session_lost(exc) and self.connected:
                raise
        # The server dropped the session (or the connection died) before answering: the call
        # never ran, so a new session may repeat it.
        await self.reconnect()
        try:
            return await self._call(op, *args, **kwargs)
        except Exception as exc:
            raise BackendUnavailable(f"MCP {op} on {self.url} failed after reconnecting: {_unwrap(exc)}") from exc

    async def list_tools(self) -> list[dict[str, Any]]:
        """Every tool of the server, as wire dicts (``name``, ``description``, ``inputSchema``)."""
        from mcp import types

        tools: list[dict[str, Any]] = []
        cursor = None
        while True:
            # ``params=`` is the one spelling both mcp 1.x and 2.x accept for a cursor.
            params = None if cursor is None else types.PaginatedRequestParams(cursor=cursor)
            result = await self._with_reconnect("list_tools", params=params)
            page = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            tools.extend(page.get("tools", []))
            cursor = page.get("nextCursor")
            if not cursor:
                return tools

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call a tool; the wire ``CallToolResult`` (``content``, ``structuredContent``, ``isError``)."""
        result = await self._with_reconnect("call_tool", name, arguments)
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)

    async def aclose(self) -> None:
        """End the session (the server is told, in stateful mode). Idempotent; never raises."""
        async with self._lock:
            try:
                await self._close_owner()
            except Exception:
                pass


def _unwrap(exc: BaseException) -> BaseException:
    """The first real error inside anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _session_lost(exc: BaseException) -> bool:
    exc = _unwrap(exc)
    text = str(exc).lower()
    if any(s in text for s in ("session terminated", "session not found", "404", "connection closed",
                               "closedresource", "endofstream")):
        return True
    import anyio
    import httpx

    return isinstance(exc, (anyio.ClosedResourceError, anyio.EndOfStream, anyio.BrokenResourceError,
                            httpx.TransportError, ConnectionError))


def tool_spec(tool: dict[str, Any]) -> ToolSpec:
    """An MCP tool (wire dict) as a :class:`ToolSpec` (its ``inputSchema`` is the JSON schema)."""
    schema = dict(tool.get("inputSchema") or {"type": "object", "properties": {}})
    schema.pop("title", None)  # a pydantic artefact that only costs prompt tokens
    return ToolSpec(name=tool["name"], description=tool.get("description") or "", parameters=schema)


def _image_part(data: str, mime: str) -> dict[str, Any]:
    url = data if data.startswith("data:") else f"data:{mime};base64,{data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _text_parts(text: str) -> list[dict[str, Any]]:
    # Computer-use tools on Fleet send screenshots as a text item holding JSON with a
    # ``base64_image`` data URL (docs/backends.md, "Fleet"): show the image, keep the rest as text.
    if '"base64_image"' in text:
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict) and "base64_image" in value:
            image = value.pop("base64_image")
            parts = [{"type": "text", "text": json.dumps(value)}] if value else []
            if isinstance(image, str) and image:
                parts.append(_image_part(image, "image/png"))
            return parts
    return [{"type": "text", "text": text}]


def result_content(result: dict[str, Any]) -> tuple[str | list[dict[str, Any]], bool]:
    """The content of the ``tool`` message answering an MCP call, and whether it is an error.

    Text stays a plain string (what most chat templates expect); images make it a list of
    OpenAI content parts with data URLs; structured content stands in when there is no text.
    """
    parts: list[dict[str, Any]] = []
    for item in result.get("content") or ():
        kind = item.get("type")
        if kind == "text":
            parts.extend(_text_parts(item.get("text", "")))
        elif kind == "image":
            parts.append(_image_part(item.get("data", ""), item.get("mimeType", "image/png")))
        elif kind == "resource":
            resource = item.get("resource") or {}
            if "text" in resource:
                parts.append({"type": "text", "text": resource["text"]})
            elif "blob" in resource and str(resource.get("mimeType", "")).startswith("image/"):
                parts.append(_image_part(resource["blob"], resource["mimeType"]))
            else:
                parts.append({"type": "text", "text": f"[resource {resource.get('uri', '')}]"})
        elif kind == "resource_link":
            parts.append({"type": "text", "text": f"[resource {item.get('uri', '')}]"})
        elif kind == "audio":
            size = len(base64.b64decode(item.get("data", "") or b""))
            parts.append({"type": "text", "text": f"[audio {item.get('mimeType', '')}, {size} bytes]"})
    if not parts and "structuredContent" in result:
        parts.append({"type": "text", "text": json.dumps(result["structuredContent"])})
    is_error = bool(result.get("isError"))
    if all(p["type"] == "text" for p in parts):
        text = "\n".join(p["text"] for p in parts)
        if is_error and not text.lower().startswith("error"):
            text = f"Error: {text}" if text else "Error: the tool failed without a message."
        return text, is_error
    return parts, is_error
