"""The ORS protocol (Open Reward Standard) in front of a served env, on aiohttp.

What the ``ors-sdk`` and ``openreward`` clients speak (docs/backends.md, "Serving"), with the
served env named by its id's name in lower case, as ORS servers name theirs:

* Discovery: ``GET /health``, ``/version`` (so clients see the ``openreward`` flavour: role-tagged
  ``/messages``, calls refused after ``finished``), ``/{env}/tools`` and the task API
  (:mod:`openenv_gym.serving.tasks`). Every ``/{env}/...`` route also answers at its bare path,
  which is where the openreward client sends them (an SDK server redirects those to its first
  environment).
* Sessions: ``POST /create_session`` (an SSE stream minting an id), ``POST /create`` (lease a
  session and start its episode on ``split``/``index`` or ``task_spec``: the reset),
  ``GET /{env}/prompt`` and ``/messages`` (the opening), ``/task_tools``, ``POST /{env}/call``
  (one tool call, answered as an SSE stream: ``task_id``, then ``chunk``s of at most ``SSE_CHUNK``
  characters and ``end``, or ``error`` when the env failed; a ``: ping`` comment every
  ``SSE_PING_INTERVAL`` seconds while it runs), ``POST /ping``, ``/delete`` (end the session),
  ``/delete_session``. The limits named here are in :mod:`openenv_gym.serving.limits`.
* A call runs as a task of its session, so a client whose stream broke re-posts with its
  ``task_id`` and gets the same result without running the tool twice (the latest call of each
  session, kept ``CALL_LINGER`` seconds after it ends).
* Errors are the SDK servers' shapes (:mod:`openenv_gym.serving.http`): ``{"detail": ...}`` with
  400 (also a ``task_spec`` the env failed to start an episode on), 404 (an unknown session or
  environment), 422, 503 with ``Retry-After`` when every session
  is in use (``max_sessions``), 500. A tool call the env did not run is ``{"ok": false, "error",
  "reason"}`` (``not_found``, ``input_validation``, ``episode_finished``). Per-session secrets
  (``X-Secrets``, a body's ``secrets``) are accepted and ignored: the served env was built with
  its own.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid
from typing import Any

import msgspec
from aiohttp import web

from openenv_gym.errors import ServerError
from openenv_gym.serving.content import ROLES, items, ors_blocks
from openenv_gym.serving.http import Invalid, detail, for_env, guard, json_response, read_body
from openenv_gym.serving.limits import CALL_LINGER, SSE_CHUNK, SSE_PING_INTERVAL
from openenv_gym.serving.sessions import CallOutcome, ServedEnv, Session
from openenv_gym.serving.tasks import add_task_routes
from openenv_gym.wire import ToolSpec, json_encode

__all__ = ["add_routes"]

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no"}


class _Create(msgspec.Struct, forbid_unknown_fields=True):
    env_name: str | None = None
    task_spec: dict[str, Any] | None = None
    split: str | None = None
    index: int | None = None
    secrets: dict[str, Any] | None = None  # ors-sdk's field: never read, never logged
    toolset_name: str | None = None


class _Call(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    input: dict[str, Any] | None = None
    task_id: str | None = None


def _tools_wire(tools: list[ToolSpec]) -> dict[str, Any]:
    return {"tools": [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools],
            "terminal_tool": None, "supports_score_group": False, "message_block_types": ["text", "image"]}


def _event(name: str, data: str) -> bytes:
    lines = "".join(f"data: {line}\r\n" for line in data.split("\n"))
    return f"event: {name}\r\n{lines}\r\n".encode()


def _payload(outcome: CallOutcome) -> dict[str, Any]:
    if outcome.refused is not None:
        return {"ok": False, "error": outcome.error, "reason": outcome.refused}
    return {"ok": True, "output": {"blocks": ors_blocks(outcome.items), "metadata": outcome.metadata(),
                                   "reward": outcome.reward, "finished": outcome.finished}}


MAX_SESSION_ID = 256
"""Longest ``X-Session-ID`` accepted (the SDK clients send a 36-character UUID)."""


def _session_id(request: web.Request) -> str | web.Response:
    """The request's ``X-Session-ID``, or the 400 that refuses it: absent, longer than
    :data:`MAX_SESSION_ID`, or not printable ASCII (an id is echoed in replies and logs)."""
    sid = request.headers.get("X-Session-ID")
    if not sid:
        return detail(400, "X-Session-ID header is required")
    if len(sid) > MAX_SESSION_ID or not (sid.isascii() and sid.isprintable()) or " " in sid:
        return detail(400, f"X-Session-ID must be printable ASCII without spaces, at most {MAX_SESSION_ID} characters")
    return sid


class _ORS:
    """The session routes' handlers over one :class:`ServedEnv`."""

    def __init__(self, served: ServedEnv, version: str):
        self.served, self.version = served, version
        self.name = served.name.lower()
        self._calls: dict[str, asyncio.Task[dict[str, Any]]] = {}  # task_id -> the call
        self._latest: dict[str, str] = {}  # session id -> its latest call's task_id

    def _session(self, request: web.Request) -> Session | web.Response:
        sid = _session_id(request)
        if isinstance(sid, web.Response):
            return sid
        session = self.served.get(sid)
        if session is None:
            return detail(404, "Active environment not found")
        return session

    # -- discovery ----------------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def version_(self, request: web.Request) -> web.Response:
        return json_response({"version": self.version, "build_sha": None})

    async def tools(self, request: web.Request) -> web.Response:
        return json_response(_tools_wire(self.served.tools()))

    # -- sessions -------------------------------------------------------------------------------------------
    async def create_session(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        await response.write_eof(_event("task_id", str(uuid.uuid4())) + _event("end", ""))
        return response

    async def create(self, request: web.Request) -> web.Response:
        sid = _session_id(request)
        if isinstance(sid, web.Response):
            return sid  # refused before a slot is leased
        body = await read_body(request, _Create)
        if body.env_name is not None and body.env_name.lower() != self.name:
            return detail(404, f"unknown environment {body.env_name!r}")
        if (body.split is None) != (body.index is None) or (body.task_spec is None) == (body.split is None):
            raise Invalid("Provide either task_spec or both split and index, not both/neither")
        if body.task_spec is not None:
            options: dict[str, Any] = {"task": body.task_spec}
        else:
            assert body.split is not None and body.index is not None
            index = body.index
            if index < 0:  # Python indexing, as the SDK servers' list-backed tasks give
                index += await self.served.num_tasks(body.split)
            options = {"split": body.split, "index": index}
        session = self.served.open(sid)
        try:
            await session.reset(options=options)
        except BaseException as exc:
            await self.served.end(session)
            # The env failed on a task spec the caller wrote (a field it needs is missing): the
            # caller's to fix, not the server's failure. A backend that is down or slow stays 5xx.
            if body.task_spec is not None and isinstance(exc, ServerError):
                return detail(400, f"the env could not start an episode on this task_spec: {exc}")
            raise
        reply = json_response({"sid": sid})
        try:  # a session whose caller never learns it was made would hold its slot until reaped
            await reply.prepare(request)
            await reply.write_eof()
        except BaseException:
            await self.served.end(session)
            raise
        return reply

    async def prompt(self, request: web.Request) -> web.Response:
        session = self._session(request)
        if isinstance(session, web.Response):
            return session
        return json_response([b for m in session.opening for b in ors_blocks(items(m.get("content")))])

    async def messages(self, request: web.Request) -> web.Response:
        session = self._session(request)
        if isinstance(session, web.Response):
            return session
        return json_response([
            {"role": m.get("role") if m.get("role") in ROLES else "user",
             "blocks": ors_blocks(items(m.get("content"))), "detail": None} for m in session.opening])

    async def task_tools(self, request: web.Request) -> web.Response:
        session = self._session(request)
        if isinstance(session, web.Response):
            return session
        return json_response(_tools_wire(session.tools))

    async def score_group(self, request: web.Request) -> web.Response:
        return detail(404, f"Environment {self.name!r} does not implement score_group")

    async def ping(self, request: web.Request) -> web.Response:
        session = self._session(request)
        return session if isinstance(session, web.Response) else json_response({"status": "ok"})

    async def delete(self, request: web.Request) -> web.Response:
        sid = _session_id(request)
        if isinstance(sid, web.Response):
            return sid
        session = self.served.get(sid)
        if session is not None:
            self._forget(session.id)
            await self.served.end(session)
        return json_response({"sid": sid})

    async def delete_session(self, request: web.Request) -> web.Response:
        # The SDK servers' /delete_session only forgets the id /create_session minted.
        return json_response({"sid": request.headers.get("X-Session-ID")})

    # -- tool calls -----------------------------------------------------------------------------------------
    async def call(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        if isinstance(session, web.Response):
            return session
        body = await read_body(request, _Call)
        response = web.StreamResponse(headers=_SSE_HEADERS)
        if body.task_id is not None:  # a resume: the same call's result, never a second run
            # Only the session that made the call may read its result: task ids travel in streams
            # and logs, and another session's result may hold its answer.
            owned = self._latest.get(session.id) == body.task_id
            task = self._calls.get(body.task_id) if owned else None
            await response.prepare(request)
            if task is None:
                await response.write_eof(_event("error", "unknown task_id"))
            else:
                await self._stream(response, body.task_id, task, announce=False)
            return response
        task_id = uuid.uuid4().hex
        task = session.run(self._run_call(session, body.name, body.input))
        self._remember(session.id, task_id, task)
        await response.prepare(request)
        await self._stream(response, task_id, task)
        return response

    @staticmethod
    async def _run_call(session: Session, name: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
        return _payload(await session.call(name, arguments))

    @staticmethod
    async def _stream(response: web.StreamResponse, task_id: str, task: asyncio.Task[dict[str, Any]],
                      announce: bool = True) -> None:
        try:
            if announce:
                await response.write(_event("task_id", task_id))
            while not task.done():
                await asyncio.wait([task], timeout=SSE_PING_INTERVAL)
                if not task.done():
                    await response.write(f": ping - {datetime.datetime.now(datetime.UTC)}\r\n\r\n".encode())
            if task.cancelled():
                out = _event("error", "the call was cancelled: its session ended")
            elif (exc := task.exception()) is not None:
                out = _event("error", str(exc) or type(exc).__name__)
            else:
                data = json_encode(task.result()).decode()
                pieces = [data[i:i + SSE_CHUNK] for i in range(0, len(data), SSE_CHUNK)] or [""]
                out = b"".join(_event("chunk", p) for p in pieces[:-1]) + _event("end", pieces[-1])
            await response.write_eof(out)  # the result and the stream's end in one segment
        except (ConnectionError, RuntimeError):
            pass  # the client went away; the call goes on, and its result waits for a resume

    def _remember(self, sid: str, task_id: str, task: asyncio.Task[dict[str, Any]]) -> None:
        """Keep ``task`` for resumes: the latest call of each session, ``CALL_LINGER`` s after it ends."""
        old = self._latest.get(sid)
        if old is not None:
            self._calls.pop(old, None)
        self._latest[sid], self._calls[task_id] = task_id, task
        loop = asyncio.get_running_loop()

        def expire() -> None:
            if self._calls.get(task_id) is task:
                del self._calls[task_id]
            if self._latest.get(sid) == task_id:
                del self._latest[sid]

        def done(_: asyncio.Task[Any]) -> None:
            if not task.cancelled():
                task.exception()  # read here: a failure whose client left is not "never retrieved"
            loop.call_later(CALL_LINGER, expire)

        task.add_done_callback(done)

    def _forget(self, sid: str) -> None:
        task_id = self._latest.pop(sid, None)
        if task_id is not None:
            self._calls.pop(task_id, None)


def add_routes(app: web.Application, served: ServedEnv, version: str) -> None:
    """Add the ORS routes of ``served`` to ``app``."""
    ors = _ORS(served, version)
    r = app.router
    r.add_get("/health", ors.health)
    r.add_get("/version", ors.version_)
    for path, handler in (("/create_session", ors.create_session), ("/create", ors.create), ("/ping", ors.ping),
                          ("/delete", ors.delete), ("/delete_session", ors.delete_session)):
        r.add_post(path, guard(handler))
    add_task_routes(app, served, ors.name, bare=True)
    for method, what, handler in (("GET", "tools", ors.tools), ("GET", "prompt", ors.prompt),
                                  ("GET", "messages", ors.messages), ("GET", "task_tools", ors.task_tools),
                                  ("POST", "call", ors.call), ("POST", "score_group", ors.score_group)):
        checked = for_env(ors.name, handler)
        r.add_route(method, f"/{what}", checked)
        r.add_route(method, "/{env}/" + what, checked)
