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

The layers: :class:`ORSEpisode` holds the episode logic (turns, tool calls, ``finished``) and its
session's own state (the session id, its lease on the server that holds it, the link there, the
time of its last request), and calls the public methods of :class:`ORSAdapter`, which speaks the
protocol. Where requests go (a remote ``url``, or a local ``source`` served privately in
``server_workers`` processes, each session routed to the one that created it) and the adapter's
lifecycle are an :class:`~openenv_gym.adapters.local_servers.Endpoint`; every HTTP/SSE call and
the translation of its failures live in :mod:`openenv_gym.adapters.ors.transport`. With
``in_process=True`` an ors-sdk source's class answers the same calls in this process
(:mod:`openenv_gym.adapters.ors.inprocess`), so the episode logic here is one code for both.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from openenv_gym import runtime
from openenv_gym.actions import ParsedCall, Turn, no_tool_call, refuse_call, tool_message, unreadable_reply, user_message
from openenv_gym.adapters import local_servers
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.adapters.limits import DEFAULT_MAX_JSON_DEPTH, DEFAULT_MAX_RESPONSE_BYTES, Limits, positive
from openenv_gym.adapters.local_servers import Endpoint, Lease, ServerReport, Worker
from openenv_gym.adapters.local_servers.group import Server
from openenv_gym.adapters.ors.inprocess import InProcessORS, load_class
from openenv_gym.adapters.ors.transport import (
    Block as _Block,
)
from openenv_gym.adapters.ors.transport import (
    ListTools as _ListTools,
)
from openenv_gym.adapters.ors.transport import (
    NotJSON,
    ORSTransport,
    Timeouts,
    encode,
)
from openenv_gym.adapters.ors.transport import (
    RunToolResult as _RunToolResult,
)
from openenv_gym.adapters.ors.transport import (
    TerminalTool as _TerminalTool,
)
from openenv_gym.adapters.ors.transport import (
    ToolOutput as _ToolOutput,
)
from openenv_gym.errors import BackendError, ConfigurationError, SourceNotFound
from openenv_gym.wire import Message, Opening, Outcome, Split, TaskRef, ToolSpec

__all__ = ["ORSAdapter", "ORSEpisode", "blocks_to_content"]

ORSLink = ORSTransport | InProcessORS
"""Where a session's calls go: a server over HTTP, or the env class run in this process (``in_process``)."""

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


class ORSAdapter(ServerReport, Adapter):
    """An ORS environment on a remote server (``url``) or a local source (``source``).

    Args:
        url: base URL of a running ORS server, ``http(s)://host[:port]``, or ``unix:<path>`` for
            one listening on a Unix socket.
        source: a local file or folder defining the Environment class (served in a subprocess,
            or run in this process with ``in_process``).
        in_process: run an ors-sdk class from ``source`` in this process, on the runtime loop,
            instead of serving it in a subprocess (:mod:`~openenv_gym.adapters.ors.inprocess`):
            no HTTP round trip per call, but no process boundary either (a tool that blocks holds
            up the loop, as it holds up the SDK's own server). Not with ``url=``.
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
            (``read_timeout`` is the longest a server may stay silent, in an answer or a tool-call
            stream, and also bounds the wait for a pooled connection). Keep ``read_timeout`` above
            10 s: servers send a keep-alive comment every 10 s while a tool runs.
        call_timeout: the most one tool call (with its resumes) may take.
        ping_interval: seconds of inactivity after which a session is pinged (servers reap
            sessions idle for 900 s).
        startup_timeout: seconds a local server may take to become healthy.
        resume_attempts: how often a dropped tool-call stream is resumed by its ``task_id``.
        server_workers: how many server processes serve a ``source`` at first (each session
            lives in one: a new episode goes to the worker with the fewest sessions in flight,
            ties round-robin, and stays there). Default: 1 for a single env; for a vector env one
            per 8 sub-envs it runs, at most one per core (and 8); see
            :func:`~openenv_gym.adapters.local_servers.default_workers`. A CPU-bound tool needs
            more than one to use more than one core. Ignored with ``url=``.
        expected_sessions: how many episodes will run at once over this adapter's server
            (``gym.make_vec`` passes its ``num_envs``); it sets the default ``server_workers``.
        max_response_bytes: the most bytes one answer of the server may hold (a tool-call
            stream as a whole); a bigger one is cut off unread and raises
            :class:`~openenv_gym.errors.ServerError` naming this limit.
        max_json_depth: how deep arrays and objects may nest in the server's JSON; deeper is a
            :class:`~openenv_gym.errors.ServerError` naming this limit.
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
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
        in_process: bool = False,
    ):
        super().__init__()
        if (url is None) == (source is None):
            raise ConfigurationError("give exactly one of url= (a running ORS server) or source= (a local file or folder)")
        local_servers.check_in_process(in_process, url, server_python)
        if listen not in local_servers.LISTEN_MODES:
            raise ConfigurationError(f"listen must be one of {local_servers.LISTEN_MODES}, not {listen!r}")
        self.server_workers = local_servers.check_workers(server_workers)
        self.expected_sessions = positive("expected_sessions", expected_sessions, optional=True)
        self.limits = Limits(positive("max_response_bytes", max_response_bytes),
                             positive("max_json_depth", max_json_depth))
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
        self.in_process = in_process
        self._here: InProcessORS | None = None
        self.flavour = "ors"
        self.terminal_tool: _TerminalTool | None = None
        self.endpoint: Endpoint[ORSLink] = Endpoint("ORS", self._link)
        self._tools: list[ToolSpec] = []
        self._secret_header: str | None = None
        self._live: set[ORSEpisode] = set()  # episodes holding a session: pinged, deleted at close
        self._pinger: asyncio.Task[None] | None = None
        self._deleting: set[asyncio.Task[None]] = set()
        self._deadlines = runtime.Deadlines()  # call_timeout of every tool call, for one timer

    @property
    def open_files_per_session(self) -> float:  # type: ignore[override]
        # A session holds a pooled keep-alive connection only while a request is in flight (idle
        # ones close within http1.IDLE_LIMIT); in process it holds none.
        return 0.0 if self.in_process else 1.0

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        self.endpoint.check_open()
        if self._secrets:
            payload = {k: {"value": v} for k, v in self._secrets.items()}
            self._secret_header = base64.b64encode(encode(payload, "secrets")).decode()
        if self.source is not None and self.in_process:
            self._here = InProcessORS(load_class(*self._locate()))
            self.endpoint.open_here(self._here.url)
        elif self.source is not None:
            await self._launch()
        else:
            self.endpoint.open_remote(self.url or "")
        await self._discover()

    def _link(self, server: Server) -> ORSLink:
        """The transport to one server (a remote URL, or a worker of the local server), or the env here."""
        if self._here is not None:
            return self._here
        local = isinstance(server, Worker)
        return ORSTransport(server.url, timeouts=self.timeouts, headers={**self._headers, **server.auth_headers()},
                            local=local, exit_note=server.exit_note, limits=self.limits)

    def _locate(self) -> tuple[str, str, str]:
        """The source's root folder, the file under it that defines the class, and the class (detected if not given)."""
        assert self.source is not None
        if not self.source.exists():
            raise SourceNotFound(f"ORS source {self.source} does not exist")
        if self.module_file is None and not (self.source.is_file() and self.env_class is not None):
            from openenv_gym.importers import detect

            found = detect(self.source, kind="ors", env_class=self.env_class)
            self.module_file, self.env_class = found.module_file, found.env_class
            self.env_name = self.env_name or found.env_name
        root = self.source if self.source.is_dir() else self.source.parent
        return str(root), self.module_file or self.source.name, self.env_class or ""

    async def _launch(self) -> None:
        root, module_file, env_class = self._locate()
        launch = local_servers.Launch(Path(root), module_file, env_class, self.python or sys.executable, self.listen,
                                      startup_timeout=self.startup_timeout, label="ORS server")
        workers = self.server_workers or local_servers.default_workers(self.expected_sessions)
        await self.endpoint.open_local(launch, workers=workers, expected_sessions=self.expected_sessions)

    async def _discover(self) -> None:
        link = self.endpoint.link()
        envs = await link.environments()
        if self.env_name is None:
            if not envs:
                raise ConfigurationError("the ORS server lists no environments")
            self.env_name = envs[0]
        elif self.env_name not in envs:
            raise ConfigurationError(f"the ORS server has no environment {self.env_name!r}; it has {envs}")
        # /version exists only on openreward servers: that decides where secrets go.
        self.flavour = "openreward" if await link.is_openreward() else "ors"
        wire = await link.tools(self.env_name)
        self._tools = _tool_specs(wire)
        self.terminal_tool = wire.terminal_tool

    async def aclose(self) -> None:
        """Close for good: end the sessions (waiting at most :data:`CLOSE_TIMEOUT`), stop the server."""
        self.endpoint.shut()
        self._deadlines.cancel()
        if self._pinger is not None:
            self._pinger.cancel()
            self._pinger = None
        for episode in list(self._live):
            self._start_delete(episode)
        if self._deleting:
            _, pending = await asyncio.wait(set(self._deleting), timeout=CLOSE_TIMEOUT)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await self.endpoint.aclose()

    def episode(self) -> ORSEpisode:
        return ORSEpisode(self)

    def info(self) -> dict[str, Any]:
        return {"backend": "ors", "env_name": self.env_name, "server_flavour": self.flavour}

    # -- tasks and tools -------------------------------------------------------------------------
    async def tools(self) -> list[ToolSpec]:
        return list(self._tools)

    async def _fetch_splits(self) -> list[Split]:
        raw = await self.endpoint.link().splits(self._env())
        return [Split(s, s if s in ("train", "validation", "test") else "validation") if isinstance(s, str)
                else Split(s.name, s.type) for s in raw]

    async def _fetch_num_tasks(self, split: str) -> int:
        return await self.endpoint.link().num_tasks(self._env(), split)

    async def task(self, split: str, index: int) -> dict[str, Any]:
        return await self.endpoint.link().task(self._env(), split, index)

    def _env(self) -> str:
        if self.env_name is None:
            raise BackendError("the ORS adapter is not started")
        return self.env_name

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

    async def create_session(self, sid: str, task: TaskRef) -> Lease:
        """``POST /create``: bind session ``sid`` to ``task`` (retried only where it cannot have run).

        Returns the session's lease: the server it lives on (for a local source the worker
        :meth:`Endpoint.lease <openenv_gym.adapters.local_servers.Endpoint.lease>` chose), where
        every later request of ``sid`` goes. A task spec that cannot be JSON raises
        :class:`~openenv_gym.errors.ConfigurationError`.
        """
        endpoint = self.endpoint
        lease = await endpoint.lease()
        with contextlib.ExitStack() as undo:
            undo.enter_context(lease)  # given back unless the session was created
            headers = {"X-Secrets": self._secret_header} if self._secret_header else None
            await endpoint.link(lease.server).create(sid, self._create_body(task), headers)
            undo.pop_all()
        return lease

    async def opening(self, link: ORSLink, sid: str) -> tuple[list[Message], list[ToolSpec]]:
        """The opening messages and the tools of session ``sid`` (prompt or messages, and task tools)."""
        env = self._env()
        messages: list[Message]
        # A server of our own answers in well under a millisecond: asking twice at once saves less
        # than a second connection per session costs (16,384 resets would hold 32,768).
        together = self.source is None or self.in_process
        if self.flavour == "openreward":
            wire, task_tools = await _both(lambda: link.messages(env, sid), lambda: link.task_tools(env, sid), together)
            messages = [{"role": m.role, "content": blocks_to_content(m.blocks)} for m in wire]
        else:
            prompt, task_tools = await _both(lambda: link.prompt(env, sid), lambda: link.task_tools(env, sid), together)
            messages = [user_message(blocks_to_content(prompt))]
        return messages, _tool_specs(task_tools)

    async def call_tool(self, link: ORSLink, sid: str, name: str,
                        arguments: dict[str, Any] | None) -> _RunToolResult | str:
        """Run a tool; returns the server's result, or the text of an SSE ``error`` event.

        A stream that drops after the server announced the call's ``task_id`` is resumed with
        that id (the server replays the result without running the tool again). Arguments that
        cannot be JSON raise :class:`~openenv_gym.adapters.ors.transport.NotJSON` before anything
        is sent. Timeouts say which limit fired: ``call_timeout`` for the call as a whole, or
        ``connect_timeout``/``read_timeout`` for one request.
        """
        self.endpoint.check_open()
        # One shared timer for every call of the adapter's sessions, not one per call; a limit of
        # the transport that fires (read_timeout) keeps its own message.
        return await self._deadlines.within(
            link.call_tool(self._env(), sid, name, arguments, resume_attempts=self.resume_attempts),
            self.call_timeout, f"tool {name!r}", "call_timeout")

    # -- session keep-alive and teardown ---------------------------------------------------------
    def touch(self, episode: ORSEpisode) -> None:
        """Record activity on ``episode``'s session (servers reap sessions idle for 900 s)."""
        if self.endpoint.closed:
            return
        episode.last_active = time.monotonic()
        self._live.add(episode)
        if self._pinger is None and self.ping_interval > 0 and self._here is None:
            self._pinger = asyncio.get_running_loop().create_task(self._ping_loop())

    def end_session(self, episode: ORSEpisode) -> None:
        """Delete ``episode``'s session in the background: the step that ended it need not wait.

        :meth:`aclose` waits for pending deletes (at most :data:`CLOSE_TIMEOUT`). After close the
        server is gone or no longer ours to call, so nothing is sent.
        """
        if self.endpoint.closed:
            self._live.discard(episode)
            if episode.lease is not None:
                episode.lease.release()
            return
        self._start_delete(episode)

    def _start_delete(self, episode: ORSEpisode) -> None:
        self._live.discard(episode)
        sid, link, lease = episode.sid, episode.link, episode.lease
        if lease is not None:
            lease.release()  # now, not when the delete runs: the next episode's choice must see it gone
        if sid is None or link is None:
            return
        task = asyncio.get_running_loop().create_task(link.delete_session(sid, timeout=5.0))
        self._deleting.add(task)
        task.add_done_callback(self._deleting.discard)

    async def _ping_loop(self) -> None:
        # One task per adapter rather than per episode: 1,024 sessions cost one timer, not 1,024.
        interval = self.ping_interval
        while not self.endpoint.closed:
            await asyncio.sleep(interval / 4)
            now = time.monotonic()
            for episode in list(self._live):
                link, sid = episode.link, episode.sid
                if now - episode.last_active >= interval and episode in self._live and link is not None and sid:
                    episode.last_active = now
                    try:
                        await link.ping(sid)
                    except BackendError:
                        pass  # the next real request reports the failure with its context


A = TypeVar("A")
B = TypeVar("B")


async def _both(first: Callable[[], Awaitable[A]], second: Callable[[], Awaitable[B]],
                together: bool) -> tuple[A, B]:
    """Both answers: at once (two requests in flight), or one after the other (one connection)."""
    if together:
        return await asyncio.gather(first(), second())
    return await first(), await second()


class ORSEpisode(Episode):
    """One ORS session; the episode logic, over :class:`ORSAdapter`'s public session calls."""

    def __init__(self, adapter: ORSAdapter):
        self.adapter = adapter
        self.sid: str | None = None
        self.lease: Lease | None = None
        """The session's place: the server it lives on (every request of the session goes there)."""
        self.link: ORSLink | None = None
        self.last_active = 0.0
        """Monotonic time of the session's last request (the adapter pings it when idle)."""
        self.finished = False
        self.tools: dict[str, ToolSpec] = {}

    async def start(self, task: TaskRef) -> Opening:
        adapter = self.adapter
        await adapter.endpoint.ensure()
        sid = uuid.uuid4().hex
        self.lease = await adapter.create_session(sid, task)
        self.sid, self.link = sid, adapter.endpoint.link(self.lease.server)
        try:
            messages, tools = await adapter.opening(self.link, sid)
        except BaseException:
            await self.aclose()
            raise
        self.tools = {t.name: t for t in tools}
        adapter.touch(self)
        return Opening(messages=messages, tools=tools, task_id=task.task_id, info={"session_id": sid})

    async def step(self, turn: Turn) -> Outcome:
        adapter = self.adapter
        if self.sid is None or self.link is None:
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
            adapter.touch(self)
            try:
                result = await adapter.call_tool(self.link, self.sid, call.name, call.arguments)
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
        if self.lease is not None:
            self.adapter.end_session(self)
            self.sid = self.link = self.lease = None
