"""ORS (Open Reward Standard) environments over raw HTTP.

One ORS session is one episode: ``POST /create`` binds a session to a task, ``GET /{env}/prompt``
gives the opening, every tool call is ``POST /{env}/call`` answered by an SSE stream, and
``POST /delete`` ends it. This adapter speaks that protocol with httpx rather than through the SDK
clients, whose env routing, secrets and event-loop handling are broken in ways reference/ors.md
§6.3 lists. It works against both server flavours (``ors-sdk`` and ``openreward``) and papers over
their differences:

* secrets go in the ``X-Secrets`` header (openreward) and, for ors-sdk servers only, in the body;
* ``env_name`` is always sent, so multi-env servers never fall back to their default env;
* ``finished`` is enforced here (ors-sdk servers keep running tools after it);
* a dropped ``/call`` stream is resumed by its ``task_id`` instead of running the tool twice;
* ``503`` + ``Retry-After`` (openreward still starting) is waited out; other failures raise typed
  errors from :mod:`openenv_gym.errors` within bounded time;
* a ``/ping`` keeps the session alive while a slow policy thinks (servers reap idle sessions).

A remote server is given by ``url``; a local source by ``source`` (served by
:mod:`openenv_gym.adapters.ors_local`).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import ssl
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import msgspec

from openenv_gym import runtime
from openenv_gym.actions import Turn, check_call, tool_message, user_message
from openenv_gym.adapters import ors_local
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    ConfigurationError,
    ServerError,
    SourceNotFound,
    TaskNotFound,
)
from openenv_gym.sse import SSEDecoder
from openenv_gym.wire import Message, Opening, Outcome, Split, TaskRef, ToolSpec

__all__ = ["ORSAdapter", "ORSEpisode", "make_env", "blocks_to_content"]


# -- wire shapes of the ORS server (only what we read) ---------------------------------------------
class _Block(msgspec.Struct):
    type: str = "text"
    text: str | None = None
    data: str | None = None
    mimeType: str | None = None


class _ToolOutput(msgspec.Struct):
    blocks: list[_Block] = []
    metadata: Any = None
    reward: float | None = None
    finished: bool = False


class _RunToolResult(msgspec.Struct):
    ok: bool
    output: _ToolOutput | None = None
    error: str | None = None
    reason: str | None = None


class _ToolSpecWire(msgspec.Struct):
    name: str
    description: str = ""
    input_schema: dict[str, Any] | None = None


class _TerminalTool(msgspec.Struct):
    name: str
    arg: str | None = None
    description: str = ""


class _ListTools(msgspec.Struct):
    tools: list[_ToolSpecWire] = []
    terminal_tool: _TerminalTool | None = None


class _SplitWire(msgspec.Struct):
    name: str
    type: str = "validation"


class _MessageWire(msgspec.Struct):
    role: str
    blocks: list[_Block] = []


_decode_result = msgspec.json.Decoder(_RunToolResult).decode
_decode_tools = msgspec.json.Decoder(_ListTools).decode
_decode_blocks = msgspec.json.Decoder(list[_Block]).decode
_decode_messages = msgspec.json.Decoder(list[_MessageWire]).decode
_decode_splits = msgspec.json.Decoder(list[_SplitWire | str]).decode


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
            parts.append({"type": "text", "text": b.text if b.text is not None else msgspec.json.encode(b).decode()})
    return parts


def _tool_specs(wire: _ListTools) -> list[ToolSpec]:
    return [ToolSpec(t.name, t.description, t.input_schema) for t in wire.tools]


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        detail = response.text
    return detail if isinstance(detail, str) else json.dumps(detail)


class _Retry503(BackendError):
    def __init__(self, message: str, after: float | None):
        super().__init__(message)
        self.after = after


def _raise_for_status(response: httpx.Response, what: str) -> None:
    code = response.status_code
    if code < 400:
        return
    detail = _detail(response)
    message = f"{what}: HTTP {code}: {detail}"
    if code == 503:
        after = response.headers.get("retry-after")
        raise _Retry503(message, float(after) if after and after.replace(".", "", 1).isdigit() else None)
    if code >= 500:
        raise ServerError(message)
    if "Invalid split" in detail or "Invalid index" in detail:
        raise TaskNotFound(message)
    if code == 404 and "Active environment not found" in detail:
        raise BackendUnavailable(f"{message} (the server no longer has this session)")
    raise ConfigurationError(message)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Built once per process: each httpx client would otherwise build its own (~10 ms), which
    # dominates starting a vector env of 1,024 sub-envs over 128 clients.
    return ssl.create_default_context()


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, _Retry503))


def _retry_after(exc: BaseException) -> float | None:
    return exc.after if isinstance(exc, _Retry503) else None


class ORSAdapter(Adapter):
    """An ORS environment on a remote server (``url``) or a local source (``source``).

    Args:
        url: base URL of a running ORS server.
        source: a local file or folder defining the Environment class (served in a subprocess).
        env_class: the class to serve from ``source`` (required when it defines several).
        module_file: the file under ``source`` that defines ``env_class`` (found statically if not given).
        env_name: the environment on the server (default: the server's first; sent explicitly).
        python: the interpreter that serves ``source`` (default: this one).
        secrets: passed to the environment at session creation, in the form each server flavour
            reads; redacted from ``env.spec`` and never logged.
        headers: extra HTTP headers for every request (e.g. an API key for a hosted server).
        connect_timeout, read_timeout: httpx timeouts. Keep ``read_timeout`` above 10 s: servers
            send a keep-alive comment every 10 s while a tool runs.
        call_timeout: the most one tool call (with its resumes) may take.
        ping_interval: seconds of inactivity after which a session is pinged (servers reap
            sessions idle for 900 s).
        startup_timeout: seconds a local server may take to become healthy.
        resume_attempts: how often a dropped tool-call stream is resumed by its ``task_id``.
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
        python: str | None = None,
        secrets: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        call_timeout: float = 600.0,
        ping_interval: float = 120.0,
        startup_timeout: float = 120.0,
        resume_attempts: int = 3,
    ):
        super().__init__()
        if (url is None) == (source is None):
            raise ConfigurationError("give exactly one of url= (a running ORS server) or source= (a local file or folder)")
        self.url = url.rstrip("/") if url else None
        self.source = Path(source).resolve() if source is not None else None
        self.env_class = env_class
        self.module_file = module_file
        self.env_name = env_name.lower() if env_name else None
        self.python = python
        self._secrets = dict(secrets or {})
        self._headers = dict(headers or {})
        self.timeouts = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=read_timeout)
        self.call_timeout = call_timeout
        self.ping_interval = ping_interval
        self.startup_timeout = startup_timeout
        self.resume_attempts = resume_attempts
        self.flavour = "ors"
        self.terminal_tool: _TerminalTool | None = None
        self._tools: list[ToolSpec] = []
        self._client: httpx.AsyncClient | None = None
        self._server: ors_local.LocalServer | None = None
        self._secret_header: str | None = None
        self._active: dict[str, float] = {}  # session id -> monotonic time of its last request
        self._pinger: asyncio.Task[None] | None = None
        self._deleting: set[asyncio.Task[None]] = set()
        self._relaunch: asyncio.Lock | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        if self.source is not None:
            await self._launch()
        else:
            self._connect(self.url or "")
        await self._discover()

    def _connect(self, base_url: str) -> None:
        self._client = httpx.AsyncClient(
            base_url=base_url,
            verify=_ssl_context(),
            timeout=self.timeouts,
            headers=self._headers,
            limits=httpx.Limits(max_connections=16, max_keepalive_connections=16),
        )

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
        self._server = await ors_local.acquire(
            root, module_file, self.env_class, python=self.python, startup_timeout=self.startup_timeout
        )
        self._connect(self._server.url)

    async def _discover(self) -> None:
        envs = await self._get_json("/list_environments")
        if self.env_name is None:
            if not envs:
                raise ConfigurationError("the ORS server lists no environments")
            self.env_name = envs[0]
        elif self.env_name not in envs:
            raise ConfigurationError(f"the ORS server has no environment {self.env_name!r}; it has {envs}")
        # /version exists only on openreward servers: that decides where secrets go.
        version = await self._request("GET", "/version", check=False)
        self.flavour = "openreward" if version.status_code == 200 else "ors"
        wire = _decode_tools((await self._request("GET", f"/{self.env_name}/tools")).content)
        self._tools = _tool_specs(wire)
        self.terminal_tool = wire.terminal_tool
        if self._secrets:
            payload = {k: {"value": v} for k, v in self._secrets.items()}
            self._secret_header = base64.b64encode(json.dumps(payload).encode()).decode()

    async def ensure_server(self) -> None:
        """Relaunch a local server that died (the next episode then runs on a fresh one).

        Many sessions share an adapter and may find the server dead at once: only the first
        relaunches, the others wait for it.
        """
        if self.source is None:
            return  # a remote server is not ours to relaunch
        if self._relaunch is None:
            self._relaunch = asyncio.Lock()
        if self._server is not None and self._server.alive() and not self._relaunch.locked():
            return
        async with self._relaunch:
            if self._server is None or not self._server.alive():
                old, self._server = self._server, None
                if old is not None:
                    await asyncio.to_thread(ors_local.release, old)
                if self._client is not None:
                    await self._client.aclose()
                self._active.clear()  # those sessions died with the server
                await self._launch()

    def server_pid(self) -> int | None:
        """PID of the local server process, if this adapter launched one."""
        return self._server.pid if self._server is not None else None

    async def aclose(self) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
            self._pinger = None
        for sid in list(self._active):
            self.end_session(sid)
        if self._deleting:
            await asyncio.gather(*self._deleting, return_exceptions=True)
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(ors_local.release, server)

    def episode(self) -> ORSEpisode:
        return ORSEpisode(self)

    def info(self) -> dict[str, Any]:
        return {"backend": "ors", "env_name": self.env_name, "server_flavour": self.flavour}

    # -- HTTP ------------------------------------------------------------------------------------
    async def _unavailable(self, exc: BaseException) -> BackendUnavailable:
        where = self.url or (self._server.url if self._server else "?")
        message = f"the ORS server at {where} cannot be reached ({type(exc).__name__}: {exc})"
        if self._server is not None:
            # A killed server resets its connections before its exit is visible: give the
            # kernel a moment, so the error can say the process died and how.
            for _ in range(25):
                if not self._server.alive():
                    message += f"; the server process exited with code {self._server.process.returncode}"
                    break
                await asyncio.sleep(0.02)
        return BackendUnavailable(message)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        sid: str | None = None,
        check: bool = True,
        idempotent: bool = True,
    ) -> httpx.Response:
        if self._client is None:
            raise BackendUnavailable("the ORS adapter is closed")
        client = self._client
        headers = {"X-Session-ID": sid} if sid else None

        async def once() -> httpx.Response:
            response = await client.request(method, path, json=json_body, headers=headers)
            if check:
                _raise_for_status(response, f"{method} {path}")
            return response

        try:
            return await runtime.retry(
                once,
                retry_if=_transient if idempotent else (lambda e: isinstance(e, (httpx.ConnectError, _Retry503))),
                attempts=5,
                deadline=30.0,
                delay_for=_retry_after,
            )
        except _Retry503 as exc:
            raise BackendUnavailable(str(exc)) from None
        except httpx.TimeoutException as exc:
            raise BackendTimeout(f"{method} {path} timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise await self._unavailable(exc) from None

    async def _get_json(self, path: str) -> Any:
        return (await self._request("GET", path)).json()

    # -- tasks and tools -------------------------------------------------------------------------
    async def tools(self) -> list[ToolSpec]:
        return list(self._tools)

    async def _fetch_splits(self) -> list[Split]:
        raw = _decode_splits((await self._request("GET", f"/{self.env_name}/splits")).content)
        return [Split(s, s if s in ("train", "validation", "test") else "validation") if isinstance(s, str)
                else Split(s.name, s.type) for s in raw]

    async def _fetch_num_tasks(self, split: str) -> int:
        response = await self._request("POST", f"/{self.env_name}/num_tasks", json_body={"split": split})
        return int(response.json()["num_tasks"])

    async def task(self, split: str, index: int) -> dict[str, Any]:
        body = {"split": split, "index": index}
        return (await self._request("POST", f"/{self.env_name}/task", json_body=body)).json()["task"]

    # -- session calls ---------------------------------------------------------------------------
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
        if self._client is None:
            raise BackendUnavailable("the ORS adapter is closed")
        headers = {"X-Session-ID": sid}
        if self._secret_header:
            headers["X-Secrets"] = self._secret_header
        client, body = self._client, self._create_body(task)

        async def once() -> None:
            response = await client.post("/create", json=body, headers=headers)
            _raise_for_status(response, "POST /create")

        try:
            await runtime.retry(once, retry_if=lambda e: isinstance(e, (httpx.ConnectError, _Retry503)),
                                attempts=5, deadline=30.0, delay_for=_retry_after)
        except _Retry503 as exc:
            raise BackendUnavailable(str(exc)) from None
        except httpx.TimeoutException as exc:
            raise BackendTimeout(f"POST /create timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise await self._unavailable(exc) from None

    async def call_tool(self, sid: str, name: str, arguments: dict[str, Any] | None) -> _RunToolResult | str:
        """Run a tool; returns the server's result, or the text of an SSE ``error`` event.

        A stream that drops after the server announced the call's ``task_id`` is resumed with
        that id (the server replays the result without running the tool again).
        """
        try:
            async with asyncio.timeout(self.call_timeout):
                return await self._call_with_resume(sid, name, arguments)
        except TimeoutError:
            raise BackendTimeout(f"tool {name!r} did not finish within {self.call_timeout} s") from None

    async def _call_with_resume(self, sid: str, name: str, arguments: dict[str, Any] | None) -> _RunToolResult | str:
        if self._client is None:
            raise BackendUnavailable("the ORS adapter is closed")
        client = self._client
        path = f"/{self.env_name}/call"
        headers = {"X-Session-ID": sid, "Accept": "text/event-stream"}
        task_id: str | None = None
        outcome: _RunToolResult | str | None = None
        backoff = runtime.Backoff(base=0.2, cap=2.0)
        last_exc: BaseException | None = None
        for attempt in range(self.resume_attempts + 1):
            body: dict[str, Any] = {"name": name, "input": arguments or {}}
            if task_id is not None:
                body["task_id"] = task_id
            try:
                async with client.stream("POST", path, json=body, headers=headers) as response:
                    if response.status_code != 200:
                        await response.aread()
                        _raise_for_status(response, f"POST {path}")
                    decoder = SSEDecoder()
                    parts: list[str] = []
                    # Read to the end of the stream even after the result: a response closed
                    # early makes httpcore drop the connection, and a new one per call costs more
                    # than the whole rest of the step.
                    async for text in response.aiter_text():
                        for event in decoder.feed(text):
                            if event.event == "task_id":
                                task_id = event.data
                            elif event.event == "chunk":
                                parts.append(event.data)
                            elif event.event == "end" and outcome is None:
                                parts.append(event.data)
                                outcome = _decode_result("".join(parts))
                            elif event.event == "error" and outcome is None:
                                if "task_id" in body and event.data == "unknown task_id":
                                    raise BackendError(
                                        f"tool {name!r}: the stream dropped and the server no longer "
                                        "has the call's result (kept 60 s); it may or may not have run"
                                    )
                                outcome = event.data
                    for event in decoder.close():
                        if event.event == "end" and outcome is None:
                            parts.append(event.data)
                            outcome = _decode_result("".join(parts))
                    if outcome is not None:
                        return outcome
                    raise httpx.RemoteProtocolError("the tool-call stream ended before its result")
            except _Retry503 as exc:
                last_exc = exc
                await asyncio.sleep(exc.after if exc.after is not None else backoff.delay(attempt))
            except msgspec.DecodeError as exc:
                raise ServerError(f"tool {name!r}: the server sent an unreadable result ({exc})") from None
            except httpx.TimeoutException as exc:
                raise BackendTimeout(f"tool {name!r}: {type(exc).__name__} waiting for the server") from None
            except httpx.TransportError as exc:
                if outcome is not None:  # the result arrived; only the stream's tail was lost
                    return outcome
                # Before the server announced a task_id the tool may not have started; only a
                # refused connection proves that, so anything else is not retried blindly.
                if task_id is None and not isinstance(exc, httpx.ConnectError):
                    raise await self._unavailable(exc) from None
                last_exc = exc
                await asyncio.sleep(backoff.delay(attempt))
        raise await self._unavailable(last_exc or RuntimeError("no attempt made"))

    async def delete_session(self, sid: str) -> None:
        if self._client is None:
            return
        try:
            await self._client.post("/delete", headers={"X-Session-ID": sid}, timeout=5.0)
        except httpx.HTTPError:
            pass  # the server is gone or slow: its reaper ends the session after 900 s idle

    # -- session keep-alive and teardown ---------------------------------------------------------
    def touch(self, sid: str) -> None:
        """Record activity on ``sid`` (servers reap sessions idle for 900 s)."""
        self._active[sid] = time.monotonic()
        if self._pinger is None and self.ping_interval > 0:
            self._pinger = asyncio.get_running_loop().create_task(self._ping_loop())

    def end_session(self, sid: str) -> None:
        """Delete ``sid`` in the background: the step that ended the episode need not wait for it.

        :meth:`aclose` waits for every pending delete, so none is lost.
        """
        self._active.pop(sid, None)
        task = asyncio.get_running_loop().create_task(self.delete_session(sid))
        self._deleting.add(task)
        task.add_done_callback(self._deleting.discard)

    async def _ping_loop(self) -> None:
        # One task per adapter rather than per episode: 1,024 sessions cost one timer, not 1,024.
        interval = self.ping_interval
        while True:
            await asyncio.sleep(interval / 4)
            now = time.monotonic()
            for sid, last in list(self._active.items()):
                if now - last >= interval and sid in self._active:
                    self._active[sid] = now
                    try:
                        await self._request("POST", "/ping", sid=sid, check=False)
                    except BackendError:
                        pass  # the next real request reports the failure with its context


class ORSEpisode(Episode):
    """One ORS session."""

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
        env = adapter.env_name
        try:
            if adapter.flavour == "openreward":
                prompt_req = adapter._request("GET", f"/{env}/messages", sid=sid)
            else:
                prompt_req = adapter._request("GET", f"/{env}/prompt", sid=sid)
            prompt, task_tools = await asyncio.gather(
                prompt_req, adapter._request("GET", f"/{env}/task_tools", sid=sid)
            )
        except BaseException:
            await self.aclose()
            raise
        if adapter.flavour == "openreward":
            messages: list[Message] = [
                {"role": m.role, "content": blocks_to_content(m.blocks)} for m in _decode_messages(prompt.content)
            ]
        else:
            messages = [user_message(blocks_to_content(_decode_blocks(prompt.content)))]
        tools = _tool_specs(_decode_tools(task_tools.content))
        self.tools = {t.name: t for t in tools}
        adapter.touch(sid)
        if task.spec is not None:
            task_id = str(task.spec.get("id", "task_spec"))
        else:
            task_id = f"{task.split}/{task.index}"
        return Opening(messages=messages, tools=tools, task_id=task_id, info={"session_id": sid})

    async def step(self, turn: Turn) -> Outcome:
        adapter = self.adapter
        if self.sid is None:
            raise BackendError("the episode has not started")
        if turn.error is not None:
            return Outcome([user_message(f"Your last message could not be read: {turn.error}.")])
        calls = turn.calls
        if not calls:
            terminal = adapter.terminal_tool
            if terminal is not None and terminal.name and turn.text is not None:
                # openreward's harness contract: a plain answer goes to the terminal tool.
                from openenv_gym.actions import ParsedCall

                args = {terminal.arg: turn.text} if terminal.arg else {}
                calls = [ParsedCall("final", terminal.name, args)]
                tools = {**self.tools, terminal.name: ToolSpec(terminal.name)}
            else:
                names = ", ".join(sorted(self.tools))
                return Outcome([user_message(
                    "No tool call found in your message. This environment is played through tool "
                    f"calls: call one of {names}."
                )], info={"invalid_action": "no_tool_call"})
        else:
            tools = self.tools
        messages: list[Message] = []
        reward = 0.0
        results: list[dict[str, Any]] = []
        info: dict[str, Any] = {"calls": results}
        for call in calls:
            if self.finished:
                messages.append(tool_message(call.id, call.name, "Not run: the episode has already finished."))
                results.append({"name": call.name, "ok": False, "reason": "episode_finished"})
                continue
            problem = check_call(call, tools)
            if problem is not None:
                messages.append(tool_message(call.id, call.name, problem))
                results.append({"name": call.name, "ok": False, "reason": "invalid_call", "error": problem})
                continue
            adapter.touch(self.sid)
            result = await adapter.call_tool(self.sid, call.name, call.arguments)
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


def make_vec(num_envs: int = 1, **kwargs: Any):
    """Gymnasium vector entry point: ``gym.make_vec("openenv/X-v0", num_envs, backend=...)``.

    Takes ``gym.make``'s kwargs plus ``backend`` and ``vector_options``
    (see :func:`openenv_gym.vector.make_entry`).
    """
    from openenv_gym.vector import make_entry

    return make_entry("openenv_gym.adapters.ors:ORSAdapter", num_envs, **kwargs)


def make_env(
    *,
    url: str | None = None,
    source: str | os.PathLike | None = None,
    env_class: str | None = None,
    module_file: str | None = None,
    env_name: str | None = None,
    split: str | None = None,
    max_turns: int | None = None,
    render_mode: str | None = None,
    **adapter_kwargs: Any,
):
    """Gymnasium entry point of ``openenv/ORS-v0`` and of imported ORS sources."""
    from openenv_gym.env import AgentEnv

    adapter = ORSAdapter(url=url, source=source, env_class=env_class, module_file=module_file,
                         env_name=env_name, **adapter_kwargs)
    return AgentEnv(adapter, split=split, max_turns=max_turns, render_mode=render_mode)
