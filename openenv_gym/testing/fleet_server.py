"""A Fleet-compatible server for offline tests: orchestrator, instance managers and MCP in one process.

Run as a subprocess by :class:`openenv_gym.testing.fleet.FleetTestServer` (``python -m
openenv_gym.testing.fleet_server --port-file ...``) or in the foreground through ``python -m
openenv_gym.testing.fleet``. It binds 127.0.0.1 only. Everything the real service does over
several hosts is routed by path here, so fleet-python's real SDK (``Fleet`` and ``AsyncFleet``)
and the real ``mcp`` client run against it unchanged:

* ``/v1/...``: the orchestrator routes the SDK calls (create/list/get/delete instances,
  heartbeat, environments, account, runner token, verifier check/execute, tasks), behind
  ``Authorization: Bearer <api key>``. Errors are ``{"detail": ...}`` worded so that the SDK's
  substring classifier picks the right exception class; creates are deduplicated on
  ``X-Request-ID`` the way the SDK's duplicate-create recovery expects (409 + ``instance_id``).
* ``/{instance_id}/api/v1/env/...``: one instance manager per instance (reset, resources,
  health, SQLite describe/query) over that instance's own ``seed`` and ``current`` SQLite files.
  The root has a single path segment before ``/api/v1/env`` because that is the shape Fleet's
  router predicate expects (``fleet.runner_auth._RUNNER_PATH_RE``).
* ``/{instance_id}/mcp`` (API tools) and ``/{instance_id}/api/v1/mcp`` (API tools plus
  ``computer``): streamable-HTTP MCP, stateful (SSE, session ids) or stateless (JSON).
  One MCP server object per modality serves every instance: a context variable set before the
  request reaches the MCP session manager tells the tools which instance's database to use.
  Tasks that the session manager spawns copy the context of the request that spawned them, so
  a stateful session stays bound to the instance of the request that opened it.
* ``/_test/...``: control endpoints for the launcher (fault injection, instance listing,
  create delay, dropping MCP sessions). They are never written to the request log.

Every other request is logged as one JSON line (method, path, query, status, X-Request-ID,
JSON body) — never a header value, so neither the API key nor the runner token can leak there.
The API key itself arrives in the environment variable ``FLEET_TEST_SERVER_API_KEY`` (removed
from the environment once read), never on the command line, which every local user can read.

Written against mcp 1.x (``FastMCP``) and 2.x (``MCPServer``); only public APIs of either are
used, except the session table that ``drop_mcp_sessions`` clears. mcp 1.x's traceback for the
normal end of a session's SSE stream is filtered out of the log (:class:`SessionTeardownFilter`).

The example tasks and the key's variable come from :mod:`openenv_gym.testing.fleet_common`; this
module never imports the launcher (:mod:`openenv_gym.testing.fleet`), which imports it only to
run the server in the foreground.
"""

import argparse
import asyncio
import base64
import contextlib
import contextvars
import hashlib
import hmac
import io
import json
import logging
import os
import re
import secrets
import shutil
import socket
import sqlite3
import struct
import tempfile
import threading
import time
import uuid
import zipfile
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from openenv_gym.processes import die_with_parent
from openenv_gym.testing.fleet_common import API_KEY_ENV, DEFAULT_API_KEY, EXAMPLE_TASKS, take_api_key

try:  # mcp 2.x
    from mcp.server.mcpserver import Image
    from mcp.server.mcpserver import MCPServer as _MCPServerClass
    from mcp.server.mcpserver.exceptions import ToolError

    MCP_MAJOR = 2
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as _MCPServerClass
    from mcp.server.fastmcp import Image
    from mcp.server.fastmcp.exceptions import ToolError

    MCP_MAJOR = 1

RUNNER_TOKEN_HEADER = "x-runner-token"
MODALITIES = ("tool_use", "computer_use")

# env_key -> catalog entry; versions are spelled without the "v" the SDK prepends.
ENVIRONMENTS: dict[str, dict[str, Any]] = {
    "issues": {
        "name": "Issue tracker",
        "description": "A tiny issue tracker backed by SQLite (offline Fleet test environment).",
        "default_version": "1.0.0",
        "versions": {"1.0.0": "initial release", "1.1.0": "same tools, newer image"},
    }
}
DATA_SETS: dict[str, dict[str, Any]] = {"seed": {"default_version": "1.0", "versions": ["1.0"]}}
SEED_ISSUES = [
    (1, "Search returns stale results", "Results lag behind edits by several minutes.", "open"),
    (2, "Dark mode colors are off", "Buttons are unreadable in dark mode.", "open"),
]
ISSUES_SCHEMA = "CREATE TABLE issues (id INTEGER PRIMARY KEY, title TEXT, body TEXT, status TEXT)"

CURRENT_INSTANCE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "fleet_test_current_instance", default=None
)
_MCP_PATH = re.compile(r"^/(?P<instance_id>[^/_][^/]*)/(?P<sub>mcp|api/v1/mcp)/?$")
_MANAGER_PATH = re.compile(r"^/(?P<instance_id>[^/_][^/]*)/api/v1/env(/|$)")


def _now_iso(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, UTC).isoformat()


def _strip_v(version: str | None) -> str | None:
    return version[1:] if version and version[:1] in "vV" and version[1:2].isdigit() else version


class ApiError(Exception):
    """An error answered as ``{"detail": detail}`` with ``status``."""

    def __init__(self, status: int, detail: Any):
        super().__init__(str(detail))
        self.status, self.detail = status, detail


# --------------------------------------------------------------------------- state


@dataclass
class Instance:
    instance_id: str
    env_key: str
    version: str
    data_key: str
    data_version: str
    image_type: str | None
    region: str
    run_id: str | None
    env_variables: dict[str, Any] | None
    ttl_seconds: int | None
    heartbeat_interval: int | None
    base_url: str
    directory: Path
    request_id: str | None
    created_at: float = field(default_factory=time.time)
    status: str = "pending"
    terminated_at: float | None = None
    stop_reason: str | None = None
    last_heartbeat: float | None = None
    heartbeats: int = 0
    resets: int = 0

    @property
    def seed_db(self) -> Path:
        return self.directory / "seed.db"

    @property
    def current_db(self) -> Path:
        return self.directory / "current.db"

    @property
    def root(self) -> str:
        return f"{self.base_url}/{self.instance_id}/"

    def stop(self, reason: str) -> None:
        if self.status != "stopped":
            self.status, self.stop_reason, self.terminated_at = "stopped", reason, time.time()

    def expire(self) -> None:
        """Stop the instance if its TTL or heartbeat deadline passed (checked lazily on access)."""
        if self.status != "running":
            return
        now = time.time()
        if self.ttl_seconds and now > self.created_at + self.ttl_seconds:
            self.stop("ttl expired")
        elif self.heartbeat_interval and now > (self.last_heartbeat or self.created_at) + self.heartbeat_interval:
            self.stop("heartbeat missed")

    def response(self) -> dict[str, Any]:
        """The ``InstanceResponse`` JSON (every required ``InstanceURLs`` field present)."""
        root = self.root
        manager = root + "api/v1/env"
        return {
            "instance_id": self.instance_id,
            "env_key": self.env_key,
            "version": self.version,
            "status": self.status,
            "subdomain": self.instance_id,
            "created_at": _now_iso(self.created_at),
            "updated_at": _now_iso(self.terminated_at or self.last_heartbeat or self.created_at),
            "terminated_at": _now_iso(self.terminated_at) if self.terminated_at else None,
            "team_id": "team-fleet-test",
            "region": self.region,
            "env_variables": self.env_variables,
            "data_key": self.data_key,
            "data_version": self.data_version,
            "urls": {
                "root": root,
                "app": [root],
                "api": root + "api",
                "health": manager + "/health",
                "api_docs": root + "docs",
                "manager": {
                    "api": manager,
                    "docs": manager + "/docs",
                    "reset": manager + "/reset",
                    "diff": manager + "/diff",
                    "snapshot": manager + "/snapshot",
                    "execute_verifier_function": manager + "/execute_verifier_function",
                    "execute_verifier_function_with_upload": manager + "/execute_verifier_function_with_upload",
                },
            },
            "health": self.status == "running",
            "run_id": self.run_id,
            "profile_id": "profile-fleet-test",
            "heartbeat_interval": self.heartbeat_interval,
            "heartbeat_region": self.region if self.heartbeat_interval else None,
        }

    def summary(self) -> dict[str, Any]:
        """What the launcher's ``instances()`` returns: the record, flat."""
        return {
            "instance_id": self.instance_id,
            "env_key": self.env_key,
            "version": self.version,
            "status": self.status,
            "image_type": self.image_type,
            "data_key": self.data_key,
            "data_version": self.data_version,
            "region": self.region,
            "run_id": self.run_id,
            "env_variables": self.env_variables,
            "ttl_seconds": self.ttl_seconds,
            "heartbeat_interval": self.heartbeat_interval,
            "request_id": self.request_id,
            "created_at": _now_iso(self.created_at),
            "terminated_at": _now_iso(self.terminated_at) if self.terminated_at else None,
            "stop_reason": self.stop_reason,
            "heartbeats": self.heartbeats,
            "resets": self.resets,
        }


@dataclass
class FaultRule:
    path: re.Pattern[str]
    method: str | None
    times: int
    status: int = 503
    detail: Any = None
    lost: bool = False  # perform the request, then answer `status` instead of its real response

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and (self.method is None or self.method == method) and bool(self.path.search(path))


@dataclass
class ServerState:
    api_key: str
    state_dir: Path
    log_path: Path | None
    mcp_mode: str = "stateful"
    require_runner_token: bool = False
    create_delay: float = 0.0
    runner_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    instances: dict[str, Instance] = field(default_factory=dict)
    create_request_ids: dict[str, str] = field(default_factory=dict)  # X-Request-ID -> instance id
    bundles: dict[str, str] = field(default_factory=dict)  # sha256 -> verifier.py source
    faults: list[FaultRule] = field(default_factory=list)
    # MCP session id -> (instance id, modality), learnt from initialize responses.
    mcp_sessions: dict[str, tuple[str, str]] = field(default_factory=dict)
    dropped_sessions: set[str] = field(default_factory=set)
    verifier_lock: threading.Lock = field(default_factory=threading.Lock)
    _log_lock: threading.Lock = field(default_factory=threading.Lock)

    def take_fault(self, method: str, path: str) -> FaultRule | None:
        for rule in self.faults:
            if rule.matches(method, path):
                rule.times -= 1
                if rule.times <= 0:
                    self.faults.remove(rule)
                return rule
        return None

    def log(self, entry: dict[str, Any]) -> None:
        if self.log_path is None:
            return
        line = json.dumps(entry, default=str) + "\n"
        with self._log_lock, open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(line)  # one write per line: a reader never sees half of an entry it parses

    def instance(self, instance_id: str) -> Instance:
        inst = self.instances.get(instance_id)
        if inst is None:
            raise ApiError(404, f"Instance '{instance_id}' not found")
        inst.expire()
        return inst

    def running_instance(self, instance_id: str) -> Instance:
        inst = self.instance(instance_id)
        if inst.status != "running":
            raise ApiError(404, f"Instance '{instance_id}' not found (status {inst.status})")
        return inst


# --------------------------------------------------------------------------- SQLite


def _write_seed_db(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(ISSUES_SCHEMA)
        conn.executemany("INSERT INTO issues (id, title, body, status) VALUES (?, ?, ?, ?)", SEED_ISSUES)


def _connect(path: Path, read_only: bool = False) -> sqlite3.Connection:
    if read_only:
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    return sqlite3.connect(path)


def _run_query(path: Path, query: str, args: list[Any] | None, read_only: bool) -> dict[str, Any]:
    """The instance manager's ``QueryResponse``: SQL errors are a 200 with ``success: false``."""
    try:
        with contextlib.closing(_connect(path, read_only)) as conn:
            cursor = conn.execute(query, args or [])
            rows = cursor.fetchall()
            columns = [d[0] for d in cursor.description] if cursor.description else None
            conn.commit()
            return {
                "success": True,
                "columns": columns,
                "rows": [list(r) for r in rows] if columns else None,
                "rows_affected": cursor.rowcount if cursor.rowcount >= 0 else 0,
                "last_insert_id": cursor.lastrowid,
                "error": None,
                "message": "Query executed successfully",
            }
    except sqlite3.Error as exc:
        return {
            "success": False, "columns": None, "rows": None, "rows_affected": None, "last_insert_id": None,
            "error": str(exc), "message": f"Query failed: {exc}",
        }


def _describe(path: Path, name: str) -> dict[str, Any]:
    with contextlib.closing(_connect(path, read_only=True)) as conn:
        tables = []
        for table, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        ):
            columns = [
                {"name": c[1], "type": c[2], "notnull": bool(c[3]), "default_value": c[4], "primary_key": c[5] > 0}
                for c in conn.execute(f'PRAGMA table_info("{table}")')
            ]
            tables.append({"name": table, "sql": sql, "columns": columns})
    return {"success": True, "resource_name": name, "tables": tables, "error": None, "message": "Schema retrieved"}


def _issue_row(row: sqlite3.Row) -> dict[str, Any]:
    return {"id": row["id"], "title": row["title"], "body": row["body"], "status": row["status"]}


# --------------------------------------------------------------------------- MCP


def _png(width: int, height: int, pixel: Callable[[int, int], tuple[int, int, int]]) -> bytes:
    """A valid RGB PNG built with zlib and struct only (no imaging library needed)."""
    raw = b"".join(b"\x00" + bytes(c for x in range(width) for c in pixel(x, y)) for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def screenshot_png(open_issues: int, cursor: tuple[int, int] = (0, 0)) -> bytes:
    """A 64x48 'screen': one dark bar per open issue and a red cursor block."""
    width, height = 64, 48
    cx, cy = cursor[0] % width, cursor[1] % height

    def pixel(x: int, y: int) -> tuple[int, int, int]:
        if abs(x - cx) <= 1 and abs(y - cy) <= 1:
            return (220, 30, 30)
        row = y // 6
        if row < min(open_issues, 8) and 4 <= x < 60 and y % 6 < 4:
            return (40, 60, 120)
        return (235, 235, 235)

    return _png(width, height, pixel)


def log_text(lines: int) -> str:
    """A long deterministic log, one ~80-character line per entry (for truncation tests)."""
    out = []
    for i in range(1, lines + 1):
        line = (
            f"{i:05d} INFO  worker-{i % 7} processed batch {i * 37 % 1000:03d} "
            f"in {(i * 13) % 97 + 3:2d} ms; queue depth {(i * 7) % 41:2d}"
        )
        out.append(line.ljust(79, "."))
    return "\n".join(out)


def _register_tools(server: Any, state: ServerState, with_computer: bool) -> None:
    """The issue-tracker tools; each acts on the database of the instance the request is for.

    Tools are ``async`` on purpose: a sync tool may run in a worker thread (mcp 2.x), and the
    instance id travels in a context variable that only the event loop's tasks are sure to see.
    """

    def current_db() -> Path:
        instance_id = CURRENT_INSTANCE.get()
        inst = state.instances.get(instance_id or "")
        if inst is None or inst.status != "running":
            raise ToolError(f"instance {instance_id!r} is not running")
        return inst.current_db

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(current_db())
        conn.row_factory = sqlite3.Row
        return conn

    @server.tool()
    async def create_issue(title: str, body: str = "") -> dict:
        """Create an issue with the given title and body; returns the new row."""
        with contextlib.closing(connect()) as conn, conn:
            cursor = conn.execute("INSERT INTO issues (title, body, status) VALUES (?, ?, 'open')", (title, body))
            row = conn.execute("SELECT * FROM issues WHERE id = ?", (cursor.lastrowid,)).fetchone()
        return _issue_row(row)

    @server.tool()
    async def list_issues(status: str = "open") -> list[dict]:
        """List issues with the given status ("open", "closed" or "all")."""
        with contextlib.closing(connect()) as conn:
            if status == "all":
                rows = conn.execute("SELECT * FROM issues ORDER BY id").fetchall()
            else:
                rows = conn.execute("SELECT * FROM issues WHERE status = ? ORDER BY id", (status,)).fetchall()
        return [_issue_row(r) for r in rows]

    @server.tool()
    async def close_issue(issue_id: int) -> str:
        """Close the issue with the given id."""
        with contextlib.closing(connect()) as conn, conn:
            row = conn.execute("SELECT status FROM issues WHERE id = ?", (issue_id,)).fetchone()
            if row is None:
                raise ToolError(f"Issue {issue_id} does not exist")
            if row["status"] == "closed":
                return f"Issue {issue_id} was already closed"
            conn.execute("UPDATE issues SET status = 'closed' WHERE id = ?", (issue_id,))
        return f"Closed issue {issue_id}"

    @server.tool()
    async def read_log(lines: int = 500) -> str:
        """Read the last `lines` lines of the service log (long output)."""
        current_db()  # an unknown instance is an error here too
        return log_text(max(1, min(int(lines), 10_000)))

    @server.tool()
    async def count_issues() -> int:
        """Count all issues, whatever their status."""
        with contextlib.closing(connect()) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM issues").fetchone()[0])

    if not with_computer:
        return

    @server.tool()
    async def computer(action: str, x: int = 0, y: int = 0, text: str = "") -> Image:
        """Operate the issue tracker's screen: action is screenshot, click, type or key; returns a screenshot."""
        if action not in ("screenshot", "click", "type", "key", "move"):
            raise ToolError(f"Unknown computer action {action!r}: use screenshot, click, move, type or key")
        with contextlib.closing(connect()) as conn:
            open_issues = int(conn.execute("SELECT COUNT(*) FROM issues WHERE status = 'open'").fetchone()[0])
        return Image(data=screenshot_png(open_issues, (x, y)), format="png")


class SessionTeardownFilter(logging.Filter):
    """Drops mcp 1.x's traceback for an SSE stream that a session's teardown closed; nothing else.

    When a client ends a stateful session (``DELETE``, as the mcp client does on exit) or the
    server drops it, the transport's ``terminate()`` closes the memory stream that the session's
    SSE writer task is reading, and mcp 1.x logs the resulting ``anyio.ClosedResourceError``
    with ``logger.exception`` ("Error in standalone SSE writer", a full traceback per session).
    mcp 2.x treats that exception in those writers as the normal end of the stream (it passes,
    or logs at DEBUG). This filter does the same for 1.x: it drops exactly those two messages
    when they carry that exception type, so every other error, including any other exception
    in the same writers, is still logged.
    """

    LOGGER = "mcp.server.streamable_http"
    MESSAGES = frozenset({"Error in standalone SSE writer", "Error in SSE writer"})

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, anyio.ClosedResourceError) and record.getMessage() in self.MESSAGES)

    @classmethod
    def install(cls) -> None:
        """Add the filter to mcp's streamable-HTTP logger (once per process)."""
        logger = logging.getLogger(cls.LOGGER)
        if not any(isinstance(f, cls) for f in logger.filters):
            logger.addFilter(cls())


def build_mcp_managers(state: ServerState) -> dict[str, Any]:
    """One streamable-HTTP session manager per modality, configured for ``state.mcp_mode``."""
    SessionTeardownFilter.install()
    stateless = state.mcp_mode == "stateless"
    # mcp enables DNS-rebinding protection for loopback servers; keep it, and accept every
    # loopback spelling a client may put in the Host header.
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )
    managers = {}
    for modality in MODALITIES:
        name = f"fleet-test-issues-{modality}"
        if MCP_MAJOR >= 2:
            server = _MCPServerClass(name, log_level="WARNING")  # it configures root logging, INFO by default
            _register_tools(server, state, with_computer=modality == "computer_use")
            server.streamable_http_app(stateless_http=stateless, json_response=stateless, transport_security=security)
        else:
            server = _MCPServerClass(  # log_level: FastMCP configures root logging, INFO by default
                name, stateless_http=stateless, json_response=stateless, transport_security=security,
                log_level="WARNING",
            )
            _register_tools(server, state, with_computer=modality == "computer_use")
            server.streamable_http_app()  # creates the session manager
        managers[modality] = server.session_manager
    return managers


async def drop_sessions(state: ServerState, managers: dict[str, Any]) -> int:
    """Forget every open MCP session: later requests carrying one of their ids get 404."""
    dropped = set(state.mcp_sessions)
    for manager in managers.values():
        table = getattr(manager, "_server_instances", {})  # private, same name in mcp 1.x and 2.x
        for session_id in list(table):
            transport = table.pop(session_id)
            getattr(manager, "_session_owners", {}).pop(session_id, None)
            dropped.add(session_id)
            with contextlib.suppress(Exception):
                await transport.terminate()
    state.dropped_sessions |= dropped
    state.mcp_sessions.clear()
    return len(dropped)


# --------------------------------------------------------------------------- verifiers


def _error_dict(error: str | None) -> dict[str, str] | None:
    """The local executor's ``"Type: message\\ntraceback"`` string as the API's error dict."""
    if not error:
        return None
    first, _, tb = error.partition("\n")
    type_name, sep, message = first.partition(": ")
    if not sep or not type_name.isidentifier():
        type_name, message = "RuntimeError", first
    return {"type": type_name, "message": message, "traceback": tb}


def _json_safe(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _verifier_source(bundle: bytes) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(bundle)) as zf:
            return zf.read("verifier.py").decode("utf-8")
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"Invalid verifier bundle: {exc}") from None


def _final_answer(body: dict[str, Any]) -> Any:
    """``final_answer`` from the cloudpickled ``args`` payload, else the first positional arg.

    Unpickling runs code chosen by the client. That is acceptable only because this server
    binds 127.0.0.1 and serves tests; a real service would need a sandbox.
    """
    payload = body.get("args")
    if payload:
        import cloudpickle  # fleet-python depends on it

        data = cloudpickle.loads(base64.b64decode(payload))
        kwargs = data.get("kwargs") or {}
        if "final_answer" in kwargs:
            return kwargs["final_answer"]
        positional = list(data.get("args") or ())[1:-1]  # drop the env placeholder and the {"env"} dict
        return positional[0] if positional else None
    args_array = body.get("args_array") or []
    return args_array[0] if len(args_array) > 1 else None


def _run_verifier(state: ServerState, code: str, inst: Instance, final_answer: Any) -> dict[str, Any]:
    from fleet.verifiers.local_executor import execute_verifier_local

    # The executor swaps sys.stdout process-wide: one verifier at a time.
    with state.verifier_lock:
        return execute_verifier_local(code, str(inst.seed_db), str(inst.current_db), final_answer)


# --------------------------------------------------------------------------- HTTP app


class FleetTestApp:
    """The routes, bound to one :class:`ServerState`; ``asgi`` is the app uvicorn serves."""

    def __init__(self, state: ServerState):
        self.state = state
        self.managers = build_mcp_managers(state)
        self.seed_template = state.state_dir / "_seed-1.0.db"
        state.state_dir.mkdir(parents=True, exist_ok=True)
        _write_seed_db(self.seed_template)
        self.routes = Starlette(
            routes=self._routes(),
            lifespan=self._lifespan,
            exception_handlers={ApiError: self._api_error, HTTPException: self._http_error},
        )

    # ---- plumbing

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for manager in self.managers.values():
                await stack.enter_async_context(manager.run())
            yield

    async def _api_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    def _routes(self) -> list[Route]:
        return [
            Route("/v1/env/", self.list_envs, methods=["GET"]),
            Route("/v1/env/instances", self.create_instance, methods=["POST"]),
            Route("/v1/env/instances", self.list_instances, methods=["GET"]),
            Route("/v1/env/instances/batch", self.delete_batch, methods=["DELETE"]),
            Route("/v1/env/instances/{instance_id}", self.get_instance, methods=["GET"]),
            Route("/v1/env/instances/{instance_id}", self.delete_instance, methods=["DELETE"]),
            Route("/v1/env/instances/{instance_id}/heartbeat", self.heartbeat, methods=["POST"]),
            Route("/v1/env/runs", self.list_runs, methods=["GET"]),
            Route("/v1/env/{env_key}", self.get_env, methods=["GET"]),
            Route("/v1/regions", self.regions, methods=["GET"]),
            Route("/v1/account", self.account, methods=["GET"]),
            Route("/v1/runner-auth/token", self.runner_token, methods=["GET"]),
            Route("/v1/tasks", self.tasks, methods=["GET"]),
            Route("/v1/verifiers/check", self.verifiers_check, methods=["GET"]),
            Route("/v1/verifiers/execute", self.verifiers_execute, methods=["POST"]),
            Route("/_test/health", self.test_health, methods=["GET"]),
            Route("/_test/instances", self.test_instances, methods=["GET"]),
            Route("/_test/inject", self.test_inject, methods=["POST"]),
            Route("/_test/clear-faults", self.test_clear_faults, methods=["POST"]),
            Route("/_test/config", self.test_config, methods=["POST"]),
            Route("/_test/drop-mcp-sessions", self.test_drop_sessions, methods=["POST"]),
            Route("/{instance_id}/api/v1/env/reset", self.reset, methods=["POST"]),
            Route("/{instance_id}/api/v1/env/resources", self.resources, methods=["GET"]),
            Route("/{instance_id}/api/v1/env/health", self.health, methods=["GET"]),
            Route("/{instance_id}/api/v1/env/resources/sqlite/{name}/describe", self.describe, methods=["GET"]),
            Route("/{instance_id}/api/v1/env/resources/sqlite/{name}/query", self.query, methods=["POST"]),
        ]

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Log, inject faults, check auth, then hand the request to MCP or the routes."""
        if scope["type"] != "http":
            await self.routes(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if path.startswith("/_test/"):
            if not self._authorized(headers):
                await JSONResponse({"detail": "Invalid API key"}, status_code=401)(scope, receive, send)
                return
            await self.routes(scope, receive, send)
            return

        body, receive = await _buffer_body(receive)
        entry: dict[str, Any] = {
            "time": time.time(),
            "method": method,
            "path": path,
            "query": scope.get("query_string", b"").decode("latin-1"),
            "status": None,
            "request_id": headers.get("x-request-id"),
            "runner_token_sent": RUNNER_TOKEN_HEADER in headers,
            "json": _parse_json(body),
        }

        async def logged_send(message: Message) -> None:
            if message["type"] == "http.response.start" and entry["status"] is None:
                entry["status"] = message["status"]
                self.state.log(entry)  # before the body goes out: a client that got it sees the entry
            await send(message)

        rule = self.state.take_fault(method, path)
        if rule is None:
            await self._dispatch(scope, receive, logged_send, path, headers)
        else:
            entry["injected"] = True
            await self._answer_fault(rule, scope, receive, logged_send, entry, headers)

    async def _answer_fault(
        self, rule: FaultRule, scope: Scope, receive: Receive, send: Send, entry: dict[str, Any],
        headers: dict[str, str],
    ) -> None:
        """An injected status instead of the route; a "lost" rule runs the route first, unseen."""
        default = f"Injected fault: HTTP {rule.status}"
        if rule.lost:
            real_status: list[int] = []

            async def discard(message: Message) -> None:
                if message["type"] == "http.response.start":
                    real_status.append(message["status"])

            await self._dispatch(scope, receive, discard, scope["path"], headers)
            entry["lost_status"] = real_status[0] if real_status else None
            default = "Service temporarily unavailable (response lost)"
        detail = rule.detail if rule.detail is not None else default
        await JSONResponse({"detail": detail}, status_code=rule.status)(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send, path: str, headers: dict[str, str]) -> None:
        if path.startswith("/v1/") and not self._authorized(headers):
            await JSONResponse({"detail": "Invalid API key"}, status_code=401)(scope, receive, send)
            return
        if self.state.require_runner_token and _MANAGER_PATH.match(path):
            # Like Fleet's gated router: a missing or wrong token looks like a missing route.
            token = headers.get(RUNNER_TOKEN_HEADER, "")
            if not hmac.compare_digest(token.encode(), self.state.runner_token.encode()):
                await JSONResponse({"detail": "Not Found"}, status_code=404)(scope, receive, send)
                return
        if mcp_match := _MCP_PATH.match(path):
            await self._mcp(scope, receive, send, mcp_match["instance_id"], mcp_match["sub"], headers)
            return
        await self.routes(scope, receive, send)

    def _authorized(self, headers: dict[str, str]) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        # The scheme is case-insensitive (RFC 9110); the key itself is compared exactly.
        return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), self.state.api_key.encode())

    async def _mcp(
        self, scope: Scope, receive: Receive, send: Send, instance_id: str, sub: str, headers: dict[str, str]
    ) -> None:
        modality = "tool_use" if sub == "mcp" else "computer_use"
        inst = self.state.instances.get(instance_id)
        if inst is not None:
            inst.expire()
        if inst is None or inst.status != "running":
            await JSONResponse({"detail": f"Instance '{instance_id}' not found"}, status_code=404)(scope, receive, send)
            return
        session_id = headers.get("mcp-session-id")
        if session_id is not None and (
            session_id in self.state.dropped_sessions
            or self.state.mcp_sessions.get(session_id, (instance_id, modality)) != (instance_id, modality)
        ):
            body = {"jsonrpc": "2.0", "id": "server-error", "error": {"code": -32600, "message": "Session not found"}}
            await JSONResponse(body, status_code=404)(scope, receive, send)
            return

        async def remember_session(message: Message) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers", []):
                    if key.lower() == b"mcp-session-id":
                        self.state.mcp_sessions.setdefault(value.decode("latin-1"), (instance_id, modality))
            await send(message)

        CURRENT_INSTANCE.set(instance_id)
        await self.managers[modality].handle_request(scope, receive, remember_session)

    # ---- orchestrator

    async def list_envs(self, request: Request) -> Response:
        return JSONResponse([_env_json(k) for k in ENVIRONMENTS])

    async def get_env(self, request: Request) -> Response:
        key = request.path_params["env_key"]
        if key not in ENVIRONMENTS:
            raise ApiError(404, f"Environment '{key}' not found")
        return JSONResponse(_env_json(key))

    async def regions(self, request: Request) -> Response:
        return JSONResponse(["us-west-1"])

    async def account(self, request: Request) -> Response:
        for inst in self.state.instances.values():
            inst.expire()
        running = sum(1 for i in self.state.instances.values() if i.status == "running")
        return JSONResponse({
            "team_id": "team-fleet-test", "team_name": "Fleet test server", "instance_limit": 1000,
            "instance_count": running, "profile_id": "profile-fleet-test", "profile_name": "tests",
        })

    async def runner_token(self, request: Request) -> Response:
        return JSONResponse({"token": self.state.runner_token})

    async def tasks(self, request: Request) -> Response:
        env_key = request.query_params.get("env_key")
        keys = request.query_params.getlist("task_keys")
        chosen = [
            t for t in EXAMPLE_TASKS if (not env_key or t["env_id"] == env_key) and (not keys or t["key"] in keys)
        ]
        return JSONResponse({"tasks": [_task_response(t) for t in chosen], "total": len(chosen)})

    async def create_instance(self, request: Request) -> Response:
        body = await _json_body(request)
        request_id = request.headers.get("x-request-id")
        if request_id and request_id in self.state.create_request_ids:
            instance_id = self.state.create_request_ids[request_id]
            raise ApiError(409, {
                "error": "duplicate_request_id", "instance_id": instance_id,
                "message": f"Request '{request_id}' already created instance '{instance_id}'",
            })
        env_key, version, data_key, data_version = _validate_create(body)
        instance_id = f"i{uuid.uuid4().hex[:12]}"
        inst = Instance(
            instance_id=instance_id, env_key=env_key, version=version, data_key=data_key, data_version=data_version,
            image_type=body.get("image_type"), region=body.get("region") or "us-west-1", run_id=body.get("run_id"),
            env_variables=body.get("env_variables"), ttl_seconds=body.get("ttl_seconds"),
            heartbeat_interval=body.get("heartbeat_interval"), base_url=str(request.base_url).rstrip("/"),
            directory=self.state.state_dir / instance_id, request_id=request_id,
        )
        # Registered before the (possibly slow) provisioning, as Fleet binds the id at insert:
        # a retried POST meanwhile gets 409 and the SDK polls the pending instance.
        self.state.instances[instance_id] = inst
        if request_id:
            self.state.create_request_ids[request_id] = instance_id
        inst.directory.mkdir(parents=True)
        shutil.copyfile(self.seed_template, inst.seed_db)
        shutil.copyfile(self.seed_template, inst.current_db)
        if self.state.create_delay > 0:
            await asyncio.sleep(self.state.create_delay)
        if inst.status == "pending":
            inst.status = "running"
            inst.created_at = time.time()  # TTL and heartbeat deadlines count from readiness
        return JSONResponse(inst.response())

    async def list_instances(self, request: Request) -> Response:
        q = request.query_params
        out = []
        for inst in self.state.instances.values():
            inst.expire()
            if q.get("status") and inst.status != q["status"]:
                continue
            if q.get("run_id") and inst.run_id != q["run_id"]:
                continue
            if q.get("region") and inst.region != q["region"]:
                continue
            out.append(inst.response())
        return JSONResponse(out)

    async def get_instance(self, request: Request) -> Response:
        return JSONResponse(self.state.instance(request.path_params["instance_id"]).response())

    async def delete_instance(self, request: Request) -> Response:
        inst = self.state.instance(request.path_params["instance_id"])
        inst.stop("deleted")
        return JSONResponse(inst.response())

    async def delete_batch(self, request: Request) -> Response:
        run_id, profile_id = request.query_params.get("run_id"), request.query_params.get("profile_id")
        if not run_id and not profile_id:
            raise ApiError(400, "Provide run_id or profile_id")
        stopped = []
        for inst in self.state.instances.values():
            inst.expire()
            if inst.status == "running" and (profile_id or inst.run_id == run_id):
                inst.stop("deleted (batch)")
                stopped.append(inst.response())
        return JSONResponse(stopped)

    async def heartbeat(self, request: Request) -> Response:
        inst = self.state.instance(request.path_params["instance_id"])
        if inst.status != "running":
            raise ApiError(400, f"Instance '{inst.instance_id}' is {inst.status}")
        inst.last_heartbeat, inst.heartbeats = time.time(), inst.heartbeats + 1
        deadline = inst.last_heartbeat + inst.heartbeat_interval if inst.heartbeat_interval else None
        return JSONResponse({
            "success": True, "instance_id": inst.instance_id, "last_heartbeat": _now_iso(inst.last_heartbeat),
            "deadline_timestamp": deadline, "interval_seconds": inst.heartbeat_interval,
        })

    async def list_runs(self, request: Request) -> Response:
        runs: dict[str, list[Instance]] = {}
        for inst in self.state.instances.values():
            if inst.run_id:
                runs.setdefault(inst.run_id, []).append(inst)
        return JSONResponse([
            {
                "run_id": run_id, "running_count": sum(i.status == "running" for i in insts),
                "total_count": len(insts), "first_created_at": _now_iso(min(i.created_at for i in insts)),
                "last_created_at": _now_iso(max(i.created_at for i in insts)), "profile_id": "profile-fleet-test",
            }
            for run_id, insts in runs.items()
        ])

    # ---- verifiers

    async def verifiers_check(self, request: Request) -> Response:
        sha = request.query_params.get("sha256", "")
        if sha in self.state.bundles:
            return JSONResponse({"success": True, "key": sha[:12], "version": 1, "created_at": _now_iso()})
        return JSONResponse({"success": False})

    async def verifiers_execute(self, request: Request) -> Response:
        body = await _json_body(request)
        sha = body.get("sha256")
        cache_hit = False
        if body.get("bundle"):
            bundle = base64.b64decode(body["bundle"])
            sha = sha or hashlib.sha256(bundle).hexdigest()
            cache_hit = sha in self.state.bundles
            self.state.bundles.setdefault(sha, _verifier_source(bundle))
        elif sha in self.state.bundles:
            cache_hit = True
        else:
            raise ApiError(404, f"Verifier bundle not found for sha256 '{sha}'")

        args_array = body.get("args_array") or []
        env_ref = args_array[-1] if args_array and isinstance(args_array[-1], dict) else {}
        instance_id = env_ref.get("env")
        started = time.monotonic()
        inst = self.state.instances.get(instance_id or "")
        if inst is not None:
            inst.expire()
        if inst is None or inst.status != "running":
            state = "not found" if inst is None else inst.status
            outcome: dict[str, Any] = {
                "success": False, "result": None, "stdout": "",
                "error": f"ValueError: Instance '{instance_id}' is {state}; verify before closing it",
            }
        else:
            try:
                outcome = await asyncio.wait_for(
                    asyncio.to_thread(_run_verifier, self.state, self.state.bundles[sha], inst, _final_answer(body)),
                    timeout=float(body.get("timeout") or 60),
                )
            except TimeoutError:
                outcome = {"success": False, "result": None, "stdout": "", "error": "TimeoutError: verifier timed out"}
        return JSONResponse({
            "key": body.get("key"),
            "version": 1,
            "success": bool(outcome["success"]),
            "result": _json_safe(outcome["result"]),
            "error": _error_dict(outcome["error"]),
            "stdout": outcome.get("stdout") or "",
            "execution_time_ms": int((time.monotonic() - started) * 1000),
            "verifier_id": f"verifier-{sha[:12]}",
            "execution_id": uuid.uuid4().hex,
            "bundle_cache_hit": cache_hit,
            "created_at": _now_iso(),
        })

    # ---- instance manager

    def _db_path(self, request: Request) -> tuple[Instance, Path]:
        inst = self.state.running_instance(request.path_params["instance_id"])
        name = request.path_params["name"]
        if name not in ("seed", "current"):
            raise ApiError(404, f"Resource '{name}' not found")
        return inst, inst.seed_db if name == "seed" else inst.current_db

    async def reset(self, request: Request) -> Response:
        inst = self.state.running_instance(request.path_params["instance_id"])
        shutil.copyfile(inst.seed_db, inst.current_db)
        inst.resets += 1
        return JSONResponse({"success": True, "message": f"Instance {inst.instance_id} reset to seed data"})

    async def resources(self, request: Request) -> Response:
        self.state.running_instance(request.path_params["instance_id"])
        return JSONResponse([
            {"name": "seed", "type": "sqlite", "mode": "ro", "label": "Seed data (read-only)"},
            {"name": "current", "type": "sqlite", "mode": "rw", "label": "Current state"},
        ])

    async def health(self, request: Request) -> Response:
        self.state.running_instance(request.path_params["instance_id"])
        return JSONResponse({"status": "healthy", "timestamp": _now_iso(), "service": "fleet-test-instance"})

    async def describe(self, request: Request) -> Response:
        _, path = self._db_path(request)
        return JSONResponse(_describe(path, request.path_params["name"]))

    async def query(self, request: Request) -> Response:
        _, path = self._db_path(request)
        body = await _json_body(request)
        read_only = bool(body.get("read_only", True)) or request.path_params["name"] == "seed"
        return JSONResponse(_run_query(path, body.get("query", ""), body.get("args"), read_only))

    # ---- control (/_test)

    async def test_health(self, request: Request) -> Response:
        return JSONResponse({"ok": True, "pid": os.getpid(), "mcp_major": MCP_MAJOR})

    async def test_instances(self, request: Request) -> Response:
        for inst in self.state.instances.values():
            inst.expire()
        return JSONResponse([i.summary() for i in self.state.instances.values()])

    async def test_inject(self, request: Request) -> Response:
        body = await _json_body(request)
        try:
            pattern = re.compile(body["path"])
        except (KeyError, re.error) as exc:
            raise ApiError(400, f"bad path regex: {exc}") from None
        method = (body.get("method") or "").upper() or None
        times = int(body.get("times", 1))
        if times <= 0:  # cancel what is still pending for this pattern (and method, if given)
            self.state.faults = [
                f for f in self.state.faults
                if f.path.pattern != pattern.pattern or (method is not None and f.method != method)
            ]
        else:
            self.state.faults.append(FaultRule(
                path=pattern, method=method, times=times, status=int(body.get("status", 503)),
                detail=body.get("detail"), lost=bool(body.get("lost", False)),
            ))
        return JSONResponse({"ok": True, "pending_faults": len(self.state.faults)})

    async def test_clear_faults(self, request: Request) -> Response:
        self.state.faults.clear()
        return JSONResponse({"ok": True})

    async def test_config(self, request: Request) -> Response:
        body = await _json_body(request)
        if "create_delay" in body:
            self.state.create_delay = float(body["create_delay"])
        return JSONResponse({"ok": True, "create_delay": self.state.create_delay})

    async def test_drop_sessions(self, request: Request) -> Response:
        return JSONResponse({"dropped": await drop_sessions(self.state, self.managers)})


def _env_json(key: str) -> dict[str, Any]:
    entry = ENVIRONMENTS[key]
    return {"env_key": key, "name": entry["name"], "description": entry["description"],
            "default_version": entry["default_version"], "versions": entry["versions"]}


def _task_response(task: dict[str, Any]) -> dict[str, Any]:
    return {
        "key": task["key"], "prompt": task["prompt"], "team_id": "team-fleet-test",
        "environment_id": task["env_id"], "created_at": _now_iso(0), "verifier_func": task["verifier_func"],
        "version": task["version"], "data_id": task["data_id"], "data_version": task["data_version"],
        "env_variables": {}, "metadata": {"split": task["split"], "task_modality": task["task_modality"]},
    }


def _validate_create(body: dict[str, Any]) -> tuple[str, str, str, str]:
    """(env_key, version, data_key, data_version), or a 400 the SDK maps to the right class."""
    env_key = body.get("env_key") or ""
    if env_key not in ENVIRONMENTS:
        # "environment" + "not found" -> FleetEnvironmentNotFoundError
        raise ApiError(400, f"Environment '{env_key}' not found")
    raw_version = body.get("env_version")
    version = _strip_v(raw_version) or ENVIRONMENTS[env_key]["default_version"]
    if version not in ENVIRONMENTS[env_key]["versions"]:
        # "version" + "not found" without the word "environment" (checked first by the SDK)
        # -> FleetVersionNotFoundError(version=<1st quoted>, env_key=<2nd quoted>)
        raise ApiError(400, f"Version '{raw_version}' not found for env_key '{env_key}'")
    data_key = body.get("data_key") or "seed"
    if data_key not in DATA_SETS:
        raise ApiError(400, f"Data key '{data_key}' does not exist")
    data_version = _strip_v(body.get("data_version")) or DATA_SETS[data_key]["default_version"]
    if data_version not in DATA_SETS[data_key]["versions"]:
        raise ApiError(400, f"Data snapshot '{data_key}:{body.get('data_version')}' does not exist")
    return env_key, version, data_key, data_version


async def _buffer_body(receive: Receive) -> tuple[bytes, Receive]:
    """Read the whole request body, and a ``receive`` that replays it before going live."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise ApiError(400, "Request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object")
    return body


def _parse_json(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


# --------------------------------------------------------------------------- process


def _bind(port: int) -> socket.socket:
    # IPPROTO_TCP so asyncio sets TCP_NODELAY (else Nagle + delayed ACK add ~40 ms per response).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    # Listen now, not when uvicorn starts: a client told the port early waits in the backlog
    # instead of being refused while the app is still starting.
    sock.listen(1024)
    return sock


@dataclass
class ServerOptions:
    api_key: str
    port: int = 0
    mcp_mode: str = "stateful"
    require_runner_token: bool = False
    create_delay: float = 0.0
    state_dir: Path | None = None  # None: a temp dir this process creates and removes
    log_file: Path | None = None
    port_file: Path | None = None
    remove_on_exit: Path | None = None  # the launcher's work dir: gone even if the launcher died


def serve(options: ServerOptions, on_ready: Callable[[int, ServerState], None] | None = None) -> None:
    """Run the server until SIGTERM/SIGINT (blocking)."""
    import uvicorn

    if options.mcp_mode not in ("stateful", "stateless"):
        raise SystemExit(f"mcp_mode must be 'stateful' or 'stateless', not {options.mcp_mode!r}")
    owns_state_dir = options.state_dir is None
    state_dir = Path(tempfile.mkdtemp(prefix="fleet-test-state-")) if options.state_dir is None else Path(options.state_dir)
    state = ServerState(
        api_key=options.api_key, state_dir=state_dir, log_path=options.log_file, mcp_mode=options.mcp_mode,
        require_runner_token=options.require_runner_token, create_delay=options.create_delay,
    )
    app = FleetTestApp(state)
    inner_lifespan = app.routes.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(starlette_app: Starlette) -> AsyncIterator[None]:
        try:
            async with inner_lifespan(starlette_app):
                yield
        finally:
            # Here, not in a `finally` around uvicorn.run: uvicorn re-raises SIGTERM after shutdown.
            if owns_state_dir:
                shutil.rmtree(state_dir, ignore_errors=True)
            if options.remove_on_exit is not None:
                shutil.rmtree(options.remove_on_exit, ignore_errors=True)

    app.routes.router.lifespan_context = lifespan

    sock = _bind(options.port)
    port = sock.getsockname()[1]
    if options.port_file is not None:
        tmp = Path(f"{options.port_file}.tmp")
        tmp.write_text(str(port))
        os.replace(tmp, options.port_file)  # atomic: the launcher never reads half a number
    if on_ready is not None:
        on_ready(port, state)
    config = uvicorn.Config(
        app.asgi, host="127.0.0.1", port=port, lifespan="on", interface="asgi3", access_log=False, log_level="warning",
        timeout_keep_alive=60, timeout_graceful_shutdown=2,  # open MCP SSE streams must not block exit
    )
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Fleet-compatible test server (127.0.0.1 only).",
        epilog=f"The API key is read from ${API_KEY_ENV} (default {DEFAULT_API_KEY!r}), never from argv.",
    )
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (see --port-file)")
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--log-file", type=Path, help="JSONL request log")
    parser.add_argument("--state-dir", type=Path, help="where instance databases live (default: a temp dir)")
    parser.add_argument("--mcp-mode", choices=["stateful", "stateless"], default="stateful")
    parser.add_argument("--require-runner-token", action="store_true")
    parser.add_argument("--create-delay", type=float, default=0.0)
    parser.add_argument("--parent-pid", type=int, help="exit when this process (our parent) dies")
    parser.add_argument("--remove-on-exit", type=Path, help="a directory to delete at shutdown")
    args = parser.parse_args(argv)

    if args.parent_pid:
        die_with_parent(args.parent_pid)
    # From the environment, not argv (which `ps` shows to every local user), and taken out of it
    # so that verifier code running in this process cannot read it.
    api_key = take_api_key()
    serve(ServerOptions(
        api_key=api_key, port=args.port, mcp_mode=args.mcp_mode, require_runner_token=args.require_runner_token,
        create_delay=args.create_delay, state_dir=args.state_dir, log_file=args.log_file, port_file=args.port_file,
        remove_on_exit=args.remove_on_exit,
    ))


if __name__ == "__main__":
    main()
