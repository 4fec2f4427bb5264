"""ORS (Open Reward Standard) environments over raw HTTP.

One ORS session is one episode: ``POST /create`` binds a session to a task, ``GET /{env}/prompt``
gives the opening, every tool call is ``POST /{env}/call`` answered by an SSE stream, and
``POST /delete`` ends it. This adapter speaks that protocol over HTTP itself rather than through the SDK
clients, whose env routing, secrets and event-loop handling are broken (docs/backends.md). It
works against both server flavours (``ors-sdk`` and ``openreward``) and papers over their
differences:

* secrets go in the ``X-Secrets`` header (openreward) and, for ors-sdk servers only, in the body;
* ``env_name`` is always sent, so multi-env servers never fall back to their default env;
* ``finished`` is enforced here (ors-sdk servers keep running tools after it);
* a dropped ``/call`` stream is resumed by its ``task_id`` instead of running the tool twice;
* ``503`` + ``Retry-After`` (openreward still starting) is waited out; other failures raise typed
  errors from :mod:`openenv_gym.errors` within bounded time, each timeout naming its limit;
* a ``/ping`` keeps the session alive while a slow policy thinks (servers reap idle sessions).

The layers: :class:`ORSEpisode` holds the episode logic (turns, tool calls, ``finished``) and
talks only to the public methods of :class:`ORSAdapter`, which owns the server (remote ``url``, or
a local ``source`` served privately by :mod:`openenv_gym.adapters.ors_local`, in ``server_workers``
processes with each session routed to the one that created it), the session bookkeeping and the
lifecycle; every HTTP/SSE call and the translation of its failures live in
:mod:`openenv_gym.adapters.ors_transport`.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import functools
import os
import time
import uuid
from pathlib import Path
from typing import Any


from openenv_gym.actions import ParsedCall, Turn, tool_message, user_message, no_tool_call, refuse_call, unreadable_reply
from openenv_gym.adapters import ors_local
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.adapters.ors_transport import (
    Block as _Block,
    ListTools as _ListTools,
    MessageWire as _MessageWire,
    NotJSON,
    NumTasks as _NumTasks,
    ORSTransport,
    RunToolResult as _RunToolResult,
    SplitWire as _SplitWire,
    TaskWire as _TaskWire,
    TerminalTool as _TerminalTool,
    Timeouts,
    ToolOutput as _ToolOutput,
    encode,
)
from openenv_gym.errors import BackendError, BackendTimeout, BackendUnavailable, ConfigurationError, SourceNotFound
from openenv_gym.wire import Message, Opening, Outcome, Split, TaskRef, ToolSpec

__all__ = ["ORSAdapter", "ORSEpisode", "blocks_to_content"]

CLOSE_TIMEOUT = 1.0
"""Seconds ``aclose`` waits for the last sessions' ``/delete`` (a hung server must not hold it up;
a server that got the request finishes the teardown on its own, one that did not reaps the session)."""


def blocks_to_content(blocks: list[_Block]) -> str | list[dict[str, Any]]:
    """ORS blocks as OpenAI message content: plain text, or content parts when images are present."""
    if all(b.type == "text" for b in blocks):
        return "\n".join(b.text or "" for b in blocks)
    parts: list[dict[str, Any]] = []
    for b in blocks:
        if b.type == "image" and b.data is not None:
            url = f"data:{b.mimeType or 'image/png'};base64,{b.data}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append({"type": "text", "text": b.text if b.text is not None else encode(b, "a block").decode()})
    return parts


def _tool_specs(wire: _ListTools) -> list[ToolSpec]:
    return [ToolSpec(t.name, t.description, t.input_schema) for t in wire.tools]


class _State(enum.Enum):
    """Where an adapter is in its life (like httpx's ``ClientState``)."""

    NEW = "new"  # built; start() not called yet
    OPEN = "open"  # start() called: requests may go out, a dead local server is relaunched
    CLOSED = "closed"  # aclose() called: every entry point raises, nothing is launched again


class ORSAdapter(Adapter):
    """An ORS environment on a remote server (``url``) or a local source (``source``).

    Args:
        url: base URL of a running ORS server, ``http(s)://host[:port]``, or ``unix:<path>`` for
            one listening on a Unix socket.
        source: a local file or folder defining the Environment class (served in a subprocess).
        env_class: the class to serve from ``source`` (required when it defines several).
        module_file: the file under ``source`` that defines ``env_class`` (found statically if not given).
        env_name: the environment on the server (default: the server's first; sent explicitly).
        server_python: the interpreter that serves ``source`` (default: this one); only the
            server runs under it. ``gym.make(id, python=...)`` runs the whole adapter in a host
            process under another interpreter instead.
        listen: how a ``source`` server listens: ``"unix"`` (default), a Unix socket in a private
            0700 directory that only this user can reach; or ``"tcp"``, 127.0.0.1 on a free port,
            refusing any request without the server's random token (for clients that cannot use a
            socket; :meth:`connection` gives the URL and headers they need).
        secrets: passed to the environment at session creation, in the form each server flavour
            reads; redacted from ``env.spec`` and never logged.
        headers: extra HTTP headers for every request (e.g. an API key for a hosted server).
        connect_timeout, read_timeout: limits of one request: opening a connection, and each read
            (``read_timeout`` also bounds the wait for a pooled connection). Keep ``read_timeout`` above 10 s: servers send a
            keep-alive comment every 10 s while a tool runs.
        call_timeout: the most one tool call (with its resumes) may take.
        ping_interval: seconds of inactivity after which a session is pinged (servers reap
            sessions idle for 900 s).
        startup_timeout: seconds a local server may take to become healthy.
        resume_attempts: how often a dropped tool-call stream is resumed by its ``task_id``.
        server_workers: how many server processes serve a ``source`` (each session lives in one:
            a new episode goes to the worker with the fewest sessions in flight, ties
            round-robin, and stays there). Default: 1 for a single env; for a vector env one per
            8 sub-envs it runs, at most one per core (and 8); see
            :func:`~openenv_gym.adapters.ors_local.default_workers`. A CPU-bound tool needs more
            than one to use more than one core. Ignored with ``url=``.
        expected_sessions: how many episodes will run at once over this adapter's server
            (``gym.make_vec`` passes its ``num_envs``); it sets the default ``server_workers``.
    """

    kind = "ors"

    def __init__(
        self,
        *,
        url: str | None = None,
        source: str | os.PathLike | None = None,
        env_class: str | None = None,
        module_file: str | None = None,
        env_name: str | None = None,
        server_python: str | None = None,
        listen: str = "unix",
        secrets: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        call_timeout: float = 600.0,
        ping_interval: float = 120.0,
        startup_timeout: float = 120.0,
        resume_attempts: int = 3,
        server_workers: int | None = None,
        expected_sessions: int | None = None,
    ):
        super().__init__()
        if (url is None) == (source is None):
            raise ConfigurationError("give exactly one of url= (a running ORS server) or source= (a local file or folder)")
        if listen not in ors_local.LISTEN_MODES:
            raise ConfigurationError(f"listen must be one of {ors_local.LISTEN_MODES}, not {listen!r}")
        self.server_workers = ors_local.check_workers(server_workers)
        if expected_sessions is not None and (not isinstance(expected_sessions, int)
                                              or isinstance(expected_sessions, bool) or expected_sessions < 1):
            raise ConfigurationError("expected_sessions must be a positive integer")
        self.expected_sessions = expected_sessions
        self.url = url.rstrip("/") if url else None
        self.source = Path(source).resolve() if source is not None else None
        self.env_class = env_class
        self.module_file = module_file
        self.env_name = env_name.lower() if env_name else None
        self.python = server_python
        self.listen = listen
        self._secrets = dict(secrets or {})
        self._headers = dict(headers or {})
        self.timeouts = Timeouts(connect=connect_timeout, read=read_timeout)
        self.call_timeout = call_timeout
        self.ping_interval = ping_interval
        self.startup_timeout = startup_timeout
        self.resume_attempts = resume_attempts
        self.flavour = "ors"
        self.terminal_tool: _TerminalTool | None = None
        self._state = _State.NEW
        self._tools: list[ToolSpec] = []
        self._transport: ORSTransport | None = None  # a url= server's
        self._server: ors_local.ServerGroup | None = None  # a source's workers
        self._links: dict[ors_local.LocalServer, ORSTransport] = {}  # one transport per worker
        self._routes: dict[str, ors_local.LocalServer] = {}  # session id -> the worker that holds it
        self._secret_header: str | None = None
        self._active: dict[str, float] = {}  # session id -> monotonic time of its last request
        self._pinger: asyncio.Task[None] | None = None
        self._deleting: set[asyncio.Task[None]] = set()
        self._relaunch: asyncio.Lock | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` has been called; a closed adapter never opens again."""
        return self._state is _State.CLOSED

    def _check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise BackendUnavailable("the ORS adapter is closed")

    async def start(self) -> None:
        self._check_open()
        self._state = _State.OPEN
        if self._secrets:
            payload = {k: {"value": v} for k, v in self._secrets.items()}
            self._secret_header = base64.b64encode(encode(payload, "secrets")).decode()
        if self.source is not None:
            await self._launch()
        else:
            self._connect(self.url or "")
        await self._discover()

    def _connect(self, url: str) -> None:
        self._transport = ORSTransport(url, timeouts=self.timeouts, headers=self._headers)

    def _link(self, worker: ors_local.LocalServer) -> ORSTransport:
        """The transport to one worker of the local server (made on first use)."""
        transport = self._links.get(worker)
        if transport is None:
            transport = self._links[worker] = ORSTransport(
                worker.url, timeouts=self.timeouts, headers={**self._headers, **worker.auth_headers()}, local=True,
                exit_note=functools.partial(self._exit_note, worker),
            )
        return transport

    async def _launch(self) -> None:
        assert self.source is not None
        if not self.source.exists():
            raise SourceNotFound(f"ORS source {self.source} does not exist")
        if self.module_file is None and not (self.source.is_file() and self.env_class is not None):
            from openenv_gym.importers import detect

            found = detect(self.source, kind="ors", env_class=self.env_class)
            self.module_file, self.env_class = found.module_file, found.env_class
            self.env_name = self.env_name or found.env_name
        root = self.source if self.source.is_dir() else self.source.parent
        module_file = self.module_file or self.source.name
        workers = self.server_workers or ors_local.default_workers(self.expected_sessions)
        server = await ors_local.acquire(
            root, module_file, self.env_class, python=self.python, startup_timeout=self.startup_timeout,
            listen=self.listen, workers=workers,
        )
        if self._state is _State.CLOSED:  # closed while the server started: never leak it
            await asyncio.to_thread(ors_local.release, server)
            self._check_open()
        self._server = server

    async def _discover(self) -> None:
        envs = await self._transport_().request("GET", "/list_environments", decode=list[str])
        if self.env_name is None:
            if not envs:
                raise ConfigurationError("the ORS server lists no environments")
            self.env_name = envs[0]
        elif self.env_name not in envs:
            raise ConfigurationError(f"the ORS server has no environment {self.env_name!r}; it has {envs}")
        # /version exists only on openreward servers: that decides where secrets go.
        version = await self._transport_().request("GET", "/version", check=False)
        self.flavour = "openreward" if version.status_code == 200 else "ors"
        wire = await self._transport_().request("GET", f"/{self.env_name}/tools", decode=_ListTools)
        self._tools = _tool_specs(wire)
        self.terminal_tool = wire.terminal_tool

    def _transport_(self) -> ORSTransport:
        """The transport for requests outside a session (the first worker's, for a local source)."""
        self._check_open()
        if self._server is not None:
            return self._link(self._server.workers[0])
        if self._transport is None:
            raise BackendUnavailable("the ORS adapter is not started")
        return self._transport

    def _session_transport(self, sid: str) -> ORSTransport:
        """The transport to the worker that holds session ``sid``."""
        worker = self._routes.get(sid)
        if worker is None:
            return self._transport_()
        self._check_open()
        return self._link(worker)

    def _unroute(self, sid: str) -> ORSTransport | None:
        """Forget where ``sid`` lives (one session fewer on its worker); its transport, if known."""
        worker = self._routes.pop(sid, None)
        if worker is None:
            return self._transport
        ors_local.ServerGroup.done(worker)
        return self._links.get(worker)

    async def ensure_server(self) -> None:
        """Restart local server workers that died (the next episodes then run on fresh ones).

        Many sessions share an adapter and may find a worker dead at once: only the first
        restarts it, the others wait for it; sessions on the other workers go on. A closed
        adapter raises instead of launching.
        """
        self._check_open()
        if self.source is None:
            return  # a remote server is not ours to relaunch
        if self._relaunch is None:
            self._relaunch = asyncio.Lock()
        if self._server is not None and self._server.alive() and not self._relaunch.locked():
            return
        async with self._relaunch:
            self._check_open()
            if self._server is None:
                await self._launch()
            elif not self._server.alive():
                await self._server.heal()
            self._check_open()
            await self._drop_stale_links()

    async def _drop_stale_links(self) -> None:
        """Close the transports of workers that were replaced; their sessions died with them."""
        current = set(self._server.workers) if self._server is not None else set()
        for sid, worker in list(self._routes.items()):
            if worker not in current:
                self._active.pop(sid, None)
        stale = [w for w in self._links if w not in current]
        for worker in stale:
            await self._links.pop(worker).aclose()

    def server_pid(self) -> int | None:
        """PID of the local server process (the first worker's), if this adapter launched one."""
        return self._server.pid if self._server is not None else None

    def server_pids(self) -> list[int]:
        """PIDs of the local server's workers, in slot order (``[]`` with ``url=``)."""
        return self._server.pids() if self._server is not None else []

    def server_sessions(self) -> list[int]:
        """Sessions in flight on each worker, in slot order, over every adapter sharing them."""
        return self._server.sessions() if self._server is not None else []

    def connection(self) -> dict[str, Any]:
        """``url`` and ``headers`` another client needs to reach this adapter's server.

        For a local TCP server the headers hold its token: a secret, pass it on but never log it.
        ``gym.make("openenv/ORS-v0", **adapter.connection())`` connects to the same server; with
        several workers that is the first one (its sessions then all run there).
        """
        self._check_open()
        headers = dict(self._headers)
        if self._server is not None:
            headers.update(self._server.auth_headers())
            return {"url": self._server.url, "headers": headers}
        return {"url": self._transport_().url, "headers": headers}

    async def aclose(self) -> None:
        """Close for good: end the sessions (waiting at most :data:`CLOSE_TIMEOUT`), stop the server."""
        self._state = _State.CLOSED
        if self._pinger is not None:
            self._pinger.cancel()
            self._pinger = None
        for sid in {*self._active, *self._routes}:
            self._start_delete(sid)
        if self._deleting:
            _, pending = await asyncio.wait(set(self._deleting), timeout=CLOSE_TIMEOUT)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        for sid in list(self._routes):  # never started, or already gone: free the count for the others
            self._unroute(sid)
        links, self._links = list(self._links.values()), {}
        if self._transport is not None:
            links.append(self._transport)
            self._transport = None
        await asyncio.gather(*(t.aclose() for t in links), return_exceptions=True)
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(ors_local.release, server)

    def episode(self) -> ORSEpisode:
        return ORSEpisode(self)

    def info(self) -> dict[str, Any]:
        return {"backend": "ors", "env_name": self.env_name, "server_flavour": self.flavour}

    async def _exit_note(self, server: ors_local.LocalServer) -> str:
        """How a local server worker exited, if it did (for "cannot be reached" messages)."""
        # A killed server resets its connections before its exit is visible: give the kernel a
        # moment, so the error can say the process died and how.
        for _ in range(25):
            if not server.alive():
                return f"; the server process exited with code {server.process.returncode}"
            await asyncio.sleep(0.02)
        return ""

    # -- tasks and tools -------------------------------------------------------------------------
    async def tools(self) -> list[ToolSpec]:
        return list(self._tools)

    async def _fetch_splits(self) -> list[Split]:
        raw = await self._transport_().request("GET", f"/{self.env_name}/splits", decode=list[_SplitWire | str])
        return [Split(s, s if s in ("train", "validation", "test") else "validation") if isinstance(s, str)
                else Split(s.name, s.type) for s in raw]

    async def _fetch_num_tasks(self, split: str) -> int:
        body = {"split": split}
        wire = await self._transport_().request("POST", f"/{self.env_name}/num_tasks", body=body, decode=_NumTasks)
        return wire.num_tasks

    async def task(self, split: str, index: int) -> dict[str, Any]:
        body = {"split": split, "index": index}
        return (await self._transport_().request("POST", f"/{self.env_name}/task", body=body, decode=_TaskWire)).task

    # -- session calls (what ORSEpisode uses) ----------------------------------------------------
    def _create_body(self, task: TaskRef) -> dict[str, Any]:
        body: dict[str, Any] = {"env_name": self.env_name}
        if task.spec is not None:
            body["task_spec"] = task.spec
        else:
            body["split"], body["index"] = task.split, task.index
        if self._secrets and self.flavour == "ors":
            body["secrets"] = self._secrets  # ors-sdk reads the body; openreward answers 422 to it
        return body

    async def create_session(self, sid: str, task: TaskRef) -> None:
        """``POST /create``: bind session ``sid`` to ``task`` (retried only where it cannot have run).

        A task spec that cannot be JSON raises :class:`~openenv_gym.errors.ConfigurationError`.
        A local source's session goes to the worker :meth:`~ors_local.ServerGroup.pick` chooses,
        and every later request of ``sid`` goes there too.
        """
        if self._server is not None:
            self._check_open()
            worker = self._server.pick()
            self._routes[sid] = worker
            transport = self._link(worker)
        else:
            transport = self._transport_()
        headers = {"X-Secrets": self._secret_header} if self._secret_header else None
        try:
            await transport.request("POST", "/create", body=self._create_body(task), sid=sid, headers=headers,
                                    idempotent=False)
        except BaseException:
            self._unroute(sid)
            raise

    async def opening(self, sid: str) -> tuple[list[Message], list[ToolSpec]]:
        """The opening messages and the tools of session ``sid`` (prompt or messages, and task tools)."""
        transport = self._session_transport(sid)
        env = self.env_name
        if self.flavour == "openreward":
            prompt_req = transport.request("GET", f"/{env}/messages", sid=sid, decode=list[_MessageWire])
        else:
            prompt_req = transport.request("GET", f"/{env}/prompt", sid=sid, decode=list[_Block])
        prompt, task_tools = await asyncio.gather(
            prompt_req, transport.request("GET", f"/{env}/task_tools", sid=sid, decode=_ListTools)
        )
        if self.flavour == "openreward":
            messages: list[Message] = [{"role": m.role, "content": blocks_to_content(m.blocks)} for m in prompt]
        else:
            messages = [user_message(blocks_to_content(prompt))]
        return messages, _tool_specs(task_tools)

    async def call_tool(self, sid: str, name: str, arguments: dict[str, Any] | None) -> _RunToolResult | str:
        """Run a tool; returns the server's result, or the text of an SSE ``error`` event.

        A stream that drops after the server announced the call's ``task_id`` is resumed with
        that id (the server replays the result without running the tool again). Arguments that
        cannot be JSON raise :class:`~openenv_gym.adapters.ors_transport.NotJSON` before anything
        is sent. Timeouts say which limit fired: ``call_timeout`` for the call as a whole, or
        ``connect_timeout``/``read_timeout`` for one request.
        """
        transport = self._session_transport(sid)
        path = f"/{self.env_name}/call"
        try:
            async with asyncio.timeout(self.call_timeout) as deadline:
                return await transport.call_tool(path, sid, name, arguments, resume_attempts=self.resume_attempts)
        except TimeoutError:
            if deadline.expired():
                raise BackendTimeout(f"tool {name!r} did not finish within call_timeout={self.call_timeout} s") from None
            raise  # a limit of the transport fired: its own error already says which

    async def delete_session(self, sid: str) -> None:
        """``POST /delete``, best effort (a server that is gone or slow reaps the session itself)."""
        await self._delete(self._unroute(sid), sid)

    @staticmethod
    async def _delete(transport: ORSTransport | None, sid: str) -> None:
        if transport is not None and not transport.closed:
            await transport.delete_session(sid, timeout=5.0)

    # -- session keep-alive and teardown ---------------------------------------------------------
    def touch(self, sid: str) -> None:
        """Record activity on ``sid`` (servers reap sessions idle for 900 s)."""
        if self._state is _State.CLOSED:
            return
        self._active[sid] = time.monotonic()
        if self._pinger is None and self.ping_interval > 0:
            self._pinger = asyncio.get_running_loop().create_task(self._ping_loop())

    def end_session(self, sid: str) -> None:
        """Delete ``sid`` in the background: the step that ended the episode need not wait for it.

        :meth:`aclose` waits for pending deletes (at most :data:`CLOSE_TIMEOUT`). After close the
        server is gone or no longer ours to call, so nothing is sent.
        """
        self._active.pop(sid, None)
        if self._state is not _State.CLOSED:
            self._start_delete(sid)

    def _start_delete(self, sid: str) -> None:
        self._active.pop(sid, None)
        # Unrouted now, not when the task runs: the next episode's pick must see the session gone.
        task = asyncio.get_running_loop().create_task(self._delete(self._unroute(sid), sid))
        self._deleting.add(task)
        task.add_done_callback(self._deleting.discard)

    async def _ping_loop(self) -> None:
        # One task per adapter rather than per episode: 1,024 sessions cost one timer, not 1,024.
        interval = self.ping_interval
        while self._state is not _State.CLOSED:
            await asyncio.sleep(interval / 4)
            now = time.monotonic()
            for sid, last in list(self._active.items()):
                if now - last >= interval and sid in self._active:
                    self._active[sid] = now
                    try:
                        await self._session_transport(sid).request("POST", "/ping", sid=sid, check=False)
                    except BackendError:
                        pass  # the next real request reports the failure with its context


class ORSEpisode(Episode):
    """One ORS session; the episode logic, over :class:`ORSAdapter`'s public session calls."""

    def __init__(self, adapter: ORSAdapter):
        self.adapter = adapter
        self.sid: str | None = None
        self.finished = False
        self.tools: dict[str, ToolSpec] = {}

    async def start(self, task: TaskRef) -> Opening:
        adapter = self.adapter
        await adapter.ensure_server()
        sid = uuid.uuid4().hex
        await adapter.create_session(sid, task)
        self.sid = sid
        try:
            messages, tools = await adapter.opening(sid)
        except BaseException:
            await self.aclose()
            raise
        self.tools = {t.name: t for t in tools}
        adapter.touch(sid)
        return Opening(messages=messages, tools=tools, task_id=task.task_id, info={"session_id": sid})

    async def step(self, turn: Turn) -> Outcome:
        adapter = self.adapter
        if self.sid is None:
            raise BackendError("the episode has not started")
        if turn.error is not None:
            return Outcome([unreadable_reply(turn.error)])
        calls = turn.calls
        if not calls:
            terminal = adapter.terminal_tool
            if terminal is not None and terminal.name and turn.text is not None:
                # openreward's harness contract: a plain answer goes to the terminal tool.
                args = {terminal.arg: turn.text} if terminal.arg else {}
                calls = [ParsedCall("final", terminal.name, args)]
                tools = {**self.tools, terminal.name: ToolSpec(terminal.name)}
            else:
                names = ", ".join(sorted(self.tools))
                return no_tool_call(f"This environment is played through tool calls: call one of {names}.")
        else:
            tools = self.tools
        messages: list[Message] = []
        reward = 0.0
        results: list[dict[str, Any]] = []
        info: dict[str, Any] = {"calls": results}
        for call in calls:
            refused = refuse_call(call, tools, self.finished)
            if refused is not None:
                messages.append(refused[0])
                results.append(refused[1])
                continue
            adapter.touch(self.sid)
            try:
                result = await adapter.call_tool(self.sid, call.name, call.arguments)
            except NotJSON as exc:  # the agent's arguments: its to fix, the episode goes on
                problem = f"Error: {exc}."
                messages.append(tool_message(call.id, call.name, problem))
                results.append({"name": call.name, "ok": False, "reason": "invalid_call", "error": str(exc)})
                continue
            if isinstance(result, str):  # the tool raised on the server
                messages.append(tool_message(call.id, call.name, f"Error: the tool failed: {result}"))
                results.append({"name": call.name, "ok": False, "reason": "tool_failed", "error": result})
                info["error"] = {"type": "ToolFailed", "message": result, "tool": call.name}
                continue
            if not result.ok:
                messages.append(tool_message(call.id, call.name, f"Error: {result.error}"))
                results.append({"name": call.name, "ok": False, "reason": result.reason, "error": result.error})
                if result.reason == "episode_finished":
                    self.finished = True
                continue
            out = result.output or _ToolOutput()
            reward += out.reward or 0.0
            messages.append(tool_message(call.id, call.name, blocks_to_content(out.blocks)))
            results.append({"name": call.name, "ok": True, "reward": out.reward, "finished": out.finished,
                            "metadata": out.metadata})
            if out.finished:
                self.finished = True
        return Outcome(messages, reward=reward, terminated=self.finished, info=info)

    async def aclose(self) -> None:
        if self.sid is not None:
            sid, self.sid = self.sid, None
            self.adapter.end_session(sid)
