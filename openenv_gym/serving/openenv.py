"""OpenEnv's protocol (openenv 0.10) in front of a served env, which it presents as an MCP-tool env.

What OpenEnv's clients speak (``GenericEnvClient``, ``MCPToolClient``; docs/backends.md,
"Serving"):

* ``WS /ws``: one session per socket. Messages ``{"type": "reset", "data": {...}}`` (``seed``,
  ``split`` and ``index``, ``task_spec``, ``episode_id``; other keys are dropped, as an OpenEnv
  server drops the kwargs its env's ``reset`` does not take), ``{"type": "step", "data":
  {"type": "call_tool", "tool_name", "arguments"}}`` or ``{"type": "list_tools"}``, ``state``,
  ``close`` and ``mcp`` (JSON-RPC on the socket). Replies ``{"type": "observation", "data":
  {"observation", "reward", "done", "metadata"}}`` or ``{"type": "error", "data": {"message",
  "code"}}``. ``/ws?session_id=ID`` attaches the socket to a session made over HTTP MCP, as
  ``MCPToolClient`` does (its default, "production" mode).
* ``POST /mcp``: JSON-RPC 2.0: ``openenv/session/create`` and ``close``, ``tools/list``,
  ``tools/call`` (with ``session_id``; the result is the tool's result, as OpenEnv's own server
  gives it for an MCP environment, so ``MCPToolClient.call_tool`` returns what it returns there; a
  call the env does not run is a JSON-RPC error, which ``call_tool`` raises as ``RuntimeError``).
* ``GET /health``, ``/metadata``, ``/schema`` (the schemas of ``CallToolAction``,
  ``CallToolObservation``, ``Observation``, ``State``), and the task API
  (:mod:`openenv_gym.serving.tasks`).

The mapping: a reset's observation carries no fields of its own (the schema's ``Observation``);
its ``metadata`` holds ``prompt`` (the opening messages, roles kept), ``tools``, ``task_id``,
``split``, ``index`` and ``episode_id``, never the task spec. A call's observation is a
``CallToolObservation`` whose ``result`` is FastMCP's shape (``content`` items, ``data`` the text,
``is_error``); a call the env did not run has ``error`` instead (``tool_not_found``,
``invalid_args``, or ``execution_error`` after the episode ended). ``done`` is terminated or
truncated (OpenEnv has one flag; ``metadata`` says which). Capacity: a socket or session beyond
``max_sessions`` gets ``CAPACITY_REACHED`` (then the socket closes), as OpenEnv's servers answer.
The stateless HTTP ``/reset`` ``/step`` ``/state`` and the MCP WebSocket are not served: a
session lives on a socket.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import WSMsgType, web

from openenv_gym.errors import CapacityReached, ConfigurationError, OpenEnvGymError
from openenv_gym.serving.content import text_of
from openenv_gym.serving.http import Invalid, json_response
from openenv_gym.serving.limits import MAX_MESSAGE_BYTES
from openenv_gym.serving.openenv_schema import SCHEMAS
from openenv_gym.serving.sessions import CallOutcome, ServedEnv, Session
from openenv_gym.serving.tasks import add_task_routes
from openenv_gym.wire import ToolSpec, json_encode, loads_plain_json

__all__ = ["add_routes"]

# JSON-RPC 2.0 error codes (OpenEnv's JsonRpcErrorCode).
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR, SERVER_ERROR = (
    -32700, -32600, -32601, -32602, -32603, -32000)
_REFUSALS = {"not_found": "tool_not_found", "input_validation": "invalid_args", "episode_finished": "execution_error"}


class _Refused(Exception):
    """A WebSocket message that cannot be served: an ``error`` reply with ``code``; the socket stays."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def _tool_wire(tool: ToolSpec) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description,
            "input_schema": tool.parameters or {"type": "object", "properties": {}}}


def _observation(outcome: CallOutcome, tool_name: str) -> dict[str, Any]:
    """A call's outcome as a serialized ``CallToolObservation``: ``observation``, ``reward``,
    ``done``, ``metadata``."""
    meta = outcome.metadata()
    if outcome.refused is not None:
        error: dict[str, Any] | None = {"error_type": _REFUSALS[outcome.refused], "message": outcome.error}
        result = None
    else:
        error = None
        result = {"content": outcome.items, "structured_content": outcome.structured,
                  "data": _value(outcome), "is_error": False}
    return {"observation": {"tool_name": tool_name, "result": result, "error": error, "metadata": meta},
            "reward": outcome.reward, "done": outcome.finished or outcome.refused == "episode_finished",
            "metadata": meta}


def _value(outcome: CallOutcome) -> Any:
    """The tool's result as OpenEnv's server gives it: the tool's own value where the env gave
    one (a dict tool's dict), else its text."""
    return outcome.data if outcome.data is not None else text_of(outcome.items)


def _error(message: str, code: str, **extra: Any) -> str:
    return json_encode({"type": "error", "data": {"message": message, "code": code, **extra}}).decode()


def _is_request(value: Any) -> bool:
    """Whether ``value`` is a JSON-RPC 2.0 request: ``jsonrpc``, ``method``, and optional object
    ``params`` and string or integer ``id``, nothing else."""
    if not isinstance(value, dict) or set(value) - {"jsonrpc", "method", "params", "id"}:
        return False
    rid = value.get("id")
    return (value.get("jsonrpc") == "2.0" and isinstance(value.get("method"), str)
            and isinstance(value.get("params", {}), dict)
            and (rid is None or (isinstance(rid, (str, int)) and not isinstance(rid, bool))))


def _rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message, "data": data}}


class _OpenEnv:
    """The routes' handlers over one :class:`ServedEnv`."""

    def __init__(self, served: ServedEnv, version: str):
        self.served, self.version = served, version
        self._closes: set[asyncio.Task[Any]] = set()

    def _closing(self, ws: web.WebSocketResponse) -> None:
        """Close ``ws`` soon (its session ended: idle, or closed over HTTP), keeping the task alive."""
        task = asyncio.get_running_loop().create_task(ws.close(code=1001, message=b"session ended"))
        self._closes.add(task)
        task.add_done_callback(self._closes.discard)

    def _capacity(self) -> str:
        return f"Server at capacity: {self.served.active}/{self.served.max_sessions} sessions active"

    # -- HTTP ---------------------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return json_response({"status": "healthy"})

    async def metadata(self, request: web.Request) -> web.Response:
        return json_response({"name": self.served.name, "description": f"{self.served.env_id}, served by openenv_gym",
                              "readme_content": None, "version": self.version, "author": None,
                              "documentation_url": None})

    async def schema(self, request: web.Request) -> web.Response:
        return json_response(SCHEMAS)

    async def mcp(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            value, why = loads_plain_json(raw.decode("utf-8"))
        except UnicodeDecodeError:
            value, why = None, "not UTF-8"
        if why is not None:
            return json_response(_rpc_error(None, PARSE_ERROR, "Parse error"))
        return json_response(await self._rpc(value, None))

    # -- JSON-RPC (HTTP /mcp, and "mcp" messages on a socket) ---------------------------------------------
    async def _rpc(self, request: Any, bound: Session | None) -> dict[str, Any]:
        if not _is_request(request):
            rid = request.get("id") if isinstance(request, dict) and isinstance(request.get("id"), (str, int)) else None
            return _rpc_error(rid, INVALID_REQUEST, "Invalid request: a JSON-RPC 2.0 request object is expected")
        rid, method, params = request.get("id"), request["method"], request.get("params") or {}
        try:
            result = await self._method(method, params, bound)
        except _RpcFailure as exc:
            return _rpc_error(rid, exc.code, str(exc), exc.data)
        except OpenEnvGymError as exc:
            return _rpc_error(rid, INTERNAL_ERROR, str(exc))
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    def _find(self, params: dict[str, Any], bound: Session | None) -> Session | None:
        sid = params.get("session_id")
        if sid is None:
            return bound
        session = self.served.get(sid) if isinstance(sid, str) else None
        if session is None:
            raise _RpcFailure(INVALID_PARAMS, f"Unknown session_id: {str(sid)[:80]}")
        return session

    async def _method(self, method: str, params: dict[str, Any], bound: Session | None) -> Any:
        if method == "openenv/session/create":
            if bound is not None:
                return {"session_id": bound.id}
            try:
                return {"session_id": self.served.open().id}
            except CapacityReached:
                raise _RpcFailure(SERVER_ERROR, self._capacity(), {
                    "active_sessions": self.served.active, "max_sessions": self.served.max_sessions}) from None
        if method == "openenv/session/close":
            sid = params.get("session_id")
            if not sid:
                raise _RpcFailure(INVALID_PARAMS, "Invalid params - 'session_id' is required")
            if bound is not None and sid == bound.id:
                raise _RpcFailure(INVALID_REQUEST, "Cannot close active WebSocket-managed session via MCP method")
            session = self._find(params, None)
            assert session is not None
            await self.served.end(session)
            return {"session_id": session.id, "closed": True}
        if method == "tools/list":
            session = self._find(params, bound)
            tools = session.tools if session is not None else self.served.tools()
            return {"tools": [_tool_wire(t) for t in tools]}
        if method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments", {})
            if not name or not isinstance(name, str):
                raise _RpcFailure(INVALID_PARAMS, "Missing 'name' in params")
            if not isinstance(arguments, dict):
                raise _RpcFailure(INVALID_PARAMS, "'arguments' must be an object")
            session = self._find(params, bound)
            if session is None:
                raise _RpcFailure(INVALID_PARAMS, "tools/call needs a session: pass session_id (openenv/session/create "
                                                  "makes one), then reset it over /ws?session_id=...")
            # As OpenEnv's own server answers it for an MCP env: the tool's result itself, and a
            # call it cannot run is a JSON-RPC error (MCPToolClient.call_tool raises on it).
            outcome = await session.call(name, arguments)
            if outcome.refused == "not_found":
                raise _RpcFailure(INVALID_PARAMS, f"Tool not found: {name[:80]}")
            if outcome.refused is not None:
                raise _RpcFailure(INVALID_PARAMS if outcome.refused == "input_validation" else INTERNAL_ERROR,
                                  outcome.error or outcome.refused)
            return _value(outcome)
        raise _RpcFailure(METHOD_NOT_FOUND, f"Method not found: {method[:80]}")

    # -- the WebSocket -------------------------------------------------------------------------------------
    async def ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES)
        await ws.prepare(request)
        sid = request.query.get("session_id")
        owned = sid is None
        session: Session | None = None
        try:
            if sid is None:  # owned
                try:
                    session = self.served.open()
                except CapacityReached:
                    await ws.send_str(_error(self._capacity(), "CAPACITY_REACHED", active_sessions=self.served.active,
                                             max_sessions=self.served.max_sessions))
                    return ws
            else:
                session = self.served.get(sid)
                if session is None or session.attached:
                    why = f"Unknown session_id: {sid[:80]}" if session is None else \
                        f"Session {sid[:80]} already has an attached WebSocket"
                    session = None
                    await ws.send_str(_error(why, "SESSION_ERROR"))
                    return ws
            session.attached = True
            session.on_end = lambda: self._closing(ws)
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    text = msg.data
                elif msg.type == WSMsgType.BINARY:
                    try:
                        text = msg.data.decode("utf-8")
                    except UnicodeDecodeError:
                        await ws.send_str(_error("Invalid JSON: the message is not UTF-8", "INVALID_JSON"))
                        continue
                else:
                    break
                reply = await self._message(session, text)
                if reply is None:
                    break
                await ws.send_str(reply)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if session is not None:
                session.attached, session.on_end = False, None
                if owned:
                    await self.served.end(session)
            await ws.close()
        return ws

    async def _message(self, session: Session, text: str) -> str | None:
        """The reply to one socket message (``None``: the client closed the session)."""
        message, why = loads_plain_json(text)
        if why is not None:
            return _error(f"Invalid JSON: {why}", "INVALID_JSON")
        if not isinstance(message, dict):
            return _error("Invalid message: a JSON object with a type is expected", "VALIDATION_ERROR")
        kind = message.get("type")
        try:
            if kind == "reset":
                return await self._reset(session, message.get("data") if message.get("data") is not None else {})
            if kind == "step":
                return await self._step(session, message.get("data"))
            if kind == "state":
                return json_encode({"type": "state", "data": session.state()}).decode()
            if kind == "close":
                return None
            if kind == "mcp":
                return json_encode({"type": "mcp", "data": await self._rpc(message.get("data"), session)}).decode()
        except _Refused as exc:
            return _error(str(exc), exc.code)
        except (ConfigurationError, Invalid) as exc:  # the caller's mistake (a bad split or index)
            return _error(str(exc), "VALIDATION_ERROR")
        except OpenEnvGymError as exc:  # the env failed, or no episode runs: the session goes on
            return _error(str(exc), "EXECUTION_ERROR")
        return _error(f"Unknown message type: {str(kind)[:40]}", "UNKNOWN_TYPE")

    async def _reset(self, session: Session, data: Any) -> str:
        if not isinstance(data, dict):
            raise _Refused("Invalid message: reset data must be an object", "VALIDATION_ERROR")
        seed = data.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise _Refused("Invalid message: seed must be a non-negative integer", "VALIDATION_ERROR")
        options: dict[str, Any] = {}
        for key in ("split", "index"):
            if data.get(key) is not None:
                options[key] = data[key]
        task = data.get("task_spec", data.get("task"))
        if task is not None:
            options["task"] = task
        episode_id = data.get("episode_id")
        opening = await session.reset(seed, options, episode_id if isinstance(episode_id, str) else None)
        meta = {"prompt": opening, "tools": [_tool_wire(t) for t in session.tools], **session.task_info,
                "episode_id": session.episode_id}
        return json_encode({"type": "observation", "data": {
            "observation": {"metadata": meta}, "reward": None, "done": False, "metadata": meta}}).decode()

    async def _step(self, session: Session, action: Any) -> str:
        if not isinstance(action, dict):
            raise _Refused("Invalid message: step data must be an action object", "VALIDATION_ERROR")
        kind = action.get("type")
        if kind == "list_tools" and set(action) <= {"type", "metadata"}:
            data: dict[str, Any] = {"observation": {"tools": [_tool_wire(t) for t in session.tools], "metadata": {}},
                                    "reward": None, "done": False}
        elif kind == "call_tool" and set(action) <= {"type", "tool_name", "arguments", "metadata"}:
            name, arguments = action.get("tool_name"), action.get("arguments", {})
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise _Refused("Invalid message: call_tool needs tool_name (a string) and arguments (an object)",
                               "VALIDATION_ERROR")
            data = _observation(await session.call(name, arguments), name)
        else:
            raise _Refused('Invalid message: this environment takes {"type": "call_tool", "tool_name", "arguments"} '
                           'or {"type": "list_tools"}', "VALIDATION_ERROR")
        return json_encode({"type": "observation", "data": data}).decode()


class _RpcFailure(Exception):
    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code, self.data = code, data


def add_routes(app: web.Application, served: ServedEnv, version: str) -> None:
    """Add the OpenEnv routes of ``served`` to ``app``."""
    oe = _OpenEnv(served, version)
    app.router.add_get("/health", oe.health)
    app.router.add_get("/metadata", oe.metadata)
    app.router.add_get("/schema", oe.schema)
    app.router.add_post("/mcp", oe.mcp)
    app.router.add_get("/ws", oe.ws)
    add_task_routes(app, served, served.name)
