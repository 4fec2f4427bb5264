"""OpenEnv environments over OpenEnv's own WebSocket protocol.

An OpenEnv server hosts one environment instance per WebSocket at ``/ws``; ``reset`` starts an
episode on it and every ``step`` sends one action. This adapter speaks that protocol itself
(:mod:`openenv_gym.adapters.openenv_transport`), one connection per episode, and never the
stateless HTTP ``/reset`` ``/step`` (every request there builds a fresh environment). The mapping
onto the Gymnasium contract (docs/backends.md, OpenEnv):

* **MCP environments** (the action is ``CallToolAction``): the tools are the environment's MCP
  tools (``list_tools`` on the episode's socket), in OpenAI format; a tool call is
  ``{"type": "call_tool", "tool_name", "arguments"}``; its result, or its ``ToolError``, becomes a
  ``tool`` message.
* **Typed-action environments**: one tool, ``step``, whose parameters are the Action model's JSON
  schema from ``/schema`` without ``metadata``; the observation's fields other than ``reward``,
  ``done`` and ``metadata`` become the tool message (text as text, the rest as JSON).
* ``reward`` ``None`` counts 0; ``done`` is ``terminated`` (sticky: calls after it are not sent);
  ``max_turns`` truncates. The raw observation goes to ``info["observation"]``, its ``metadata``
  to ``info["metadata"]``: never to the agent (an imported ORS task's spec, answers included,
  is in there).
* An action the server rejects (``VALIDATION_ERROR``, ``INVALID_JSON``) is a message to the agent;
  the episode goes on. ``CAPACITY_REACHED`` is retried with backoff for ``capacity_wait`` seconds,
  then raised as :class:`~openenv_gym.errors.BackendUnavailable` saying how to raise the limit.
* Tasks: a server with OpenEnv's task API (``/list_environments``, ``/{env}/splits``,
  ``num_tasks``, ``task``) gives the splits and tasks, and ``reset`` sends ``split`` and ``index``;
  without it there is one split, ``default``, whose task ``i`` is ``reset(seed=i)`` on the server,
  so a seeded Gymnasium reset gives a seeded server reset.

Connections are pooled per adapter: an episode takes an idle socket (its environment instance is
reset for the new episode, as OpenEnv's own client does) or opens one; a socket that dropped
between episodes is replaced; a socket whose request failed or was cancelled is closed, never
reused. A local ``source`` (an environment folder or an installed environment package) is served
privately by the same machinery as ORS sources (:mod:`openenv_gym.adapters.ors_local`), with
``MAX_CONCURRENT_ENVS`` high enough for the vector env asking (``expected_sessions``, which
``gym.make_vec`` passes), in ``server_workers`` processes: each episode's socket goes to the
worker with the fewest episodes in flight (ties round-robin), whose environment instance it
then holds to the end, and idle sockets are pooled per worker.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import functools
import os
from typing import Any

from openenv_gym import runtime
from openenv_gym.actions import Turn, tool_message, user_message, no_tool_call, refuse_call, unreadable_reply
from openenv_gym.adapters import ors_local
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.adapters.openenv_transport import (
    ActionRejected,
    CapacityReached,
    Channel,
    OpenEnvTransport,
)
from openenv_gym.errors import BackendError, BackendUnavailable, ConfigurationError, ServerError
from openenv_gym.wire import Message, Opening, Outcome, Split, TaskRef, ToolSpec, json_encode

__all__ = ["OpenEnvAdapter", "OpenEnvEpisode", "observation_content", "tool_result_content",
           "DEFAULT_SPLIT", "SEEDS", "DEFAULT_MAX_CONCURRENT_ENVS"]

DEFAULT_SPLIT = "default"
"""The one split of a server without the task API."""

SEEDS = 2**31 - 1
"""Tasks in :data:`DEFAULT_SPLIT`: task ``i`` is the server's ``reset(seed=i)``."""

DEFAULT_MAX_CONCURRENT_ENVS = 256
"""The least ``MAX_CONCURRENT_ENVS`` a launched ``source`` gets (unless ``max_concurrent_envs`` says
otherwise); a vector env of more sub-envs gets a server sized for it (``expected_sessions``)."""

# Servers this process launched, per (root, app, python, listen, workers), with the
# MAX_CONCURRENT_ENVS each was started with: an adapter shares a running one that allows the
# sessions it expects.
_launched: dict[tuple[str, ...], list[tuple[int, ors_local.ServerGroup]]] = {}

_RESERVED = frozenset(("reward", "done", "metadata"))


# -- what the agent sees -----------------------------------------------------------------------------
def _json(value: Any) -> str:
    try:
        return json_encode(value).decode()
    except Exception:
        return repr(value)


def observation_content(observation: dict[str, Any]) -> str:
    """A typed observation as message text: its fields but ``reward``/``done``/``metadata``.

    Empty fields (``None``, ``""``) are left out. A single text field is the text itself;
    otherwise one ``name: value`` line per field, text as text and anything else as JSON.
    """
    fields = [(k, v) for k, v in observation.items() if k not in _RESERVED and v is not None and v != ""]
    if len(fields) == 1 and isinstance(fields[0][1], str):
        return fields[0][1]
    # An int's JSON is its str(): the common case (coordinates, counts) skips the encoder.
    return "\n".join(f"{k}: {v if isinstance(v, str) else str(v) if type(v) is int else _json(v)}"
                     for k, v in fields)


def _blocks_content(blocks: list[Any]) -> str | list[dict[str, Any]]:
    """MCP content items (or ORS blocks) as OpenAI message content: text, or parts with images."""
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if not isinstance(block, dict):
            parts.append({"type": "text", "text": _json(block)})
        elif block.get("type") == "image" and isinstance(block.get("data"), str):
            mime = block.get("mimeType") or block.get("mime_type") or "image/png"
            parts.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{block['data']}"}})
        elif block.get("type") == "text" or "text" in block:
            parts.append({"type": "text", "text": str(block.get("text") or "")})
        else:
            parts.append({"type": "text", "text": _json(block)})
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def tool_result_content(observation: dict[str, Any]) -> tuple[str | list[dict[str, Any]], str | None]:
    """A ``CallToolObservation`` as tool-message content, and the error text if the call failed.

    ``error`` (a ``ToolError``) wins; a FastMCP ``CallToolResult`` gives its content items (its
    ``data`` or structured content when it has none), an ORS-style result its ``blocks``; anything
    else is shown as JSON.
    """
    error = observation.get("error")
    if error:
        message = error.get("message", error) if isinstance(error, dict) else error
        kind = error.get("error_type") if isinstance(error, dict) else None
        text = f"Error: {message}" if not kind else f"Error ({kind}): {message}"
        return text, str(message)
    result = observation.get("result")
    if result is None:
        return "", None
    if isinstance(result, str):
        return result, None
    if isinstance(result, dict):
        failed = bool(result.get("is_error") or result.get("isError"))
        content: str | list[dict[str, Any]]
        if isinstance(result.get("content"), list) and result["content"]:
            content = _blocks_content(result["content"])
        elif isinstance(result.get("blocks"), list):
            content = _blocks_content(result["blocks"])
        elif "data" in result or "structured_content" in result or "structuredContent" in result:
            data = result.get("data", result.get("structured_content", result.get("structuredContent")))
            content = data if isinstance(data, str) else _json(data)
        else:
            content = _json(result)
        if failed:
            text = content if isinstance(content, str) else _json(content)
            return f"Error: {text}", text
        return content, None
    return _json(result), None


def _opening_messages(observation: dict[str, Any], metadata: dict[str, Any]) -> list[Message]:
    """The reset observation as messages: a wrapper's ``prompt`` if it has one, else its fields.

    Environments imported by ``openenv import`` put the prompt (and the task spec, answers
    included) into ``metadata``: only the prompt is shown.
    """
    prompt = metadata.get("prompt")
    if isinstance(prompt, str) and prompt:
        return [user_message(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(m, dict) and "role" in m for m in prompt):
            return [{"role": str(m["role"]), "content": m.get("content") or ""} for m in prompt]
        return [user_message(_blocks_content(prompt))]
    text = observation_content(observation)
    return [user_message(text)] if text else []


def _reward(value: Any) -> float:
    if value is None:
        return 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ServerError(f"the server sent a reward that is not a number: {str(value)[:40]!r}") from None


def _clean_schema(schema: Any) -> dict[str, Any]:
    """A tool's JSON schema without pydantic's ``title`` (it only costs prompt tokens)."""
    if not isinstance(schema, dict):
        return {"type": "object", "properties": {}}
    schema = dict(schema)
    schema.pop("title", None)
    return schema


def step_tool(action_schema: dict[str, Any], description: str = "") -> ToolSpec:
    """The one tool of a typed-action environment: ``step``, over the Action schema without ``metadata``."""
    schema = copy.deepcopy(action_schema) if isinstance(action_schema, dict) else {}
    doc = schema.pop("description", "") or ""
    schema.pop("title", None)
    props = dict(schema.get("properties") or {})
    props.pop("metadata", None)
    schema["properties"] = props
    schema["type"] = "object"
    if "required" in schema:
        schema["required"] = [r for r in schema["required"] if r != "metadata"]
    text = description or doc or "Take one action in the environment."
    return ToolSpec("step", text.strip(), schema)


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class OpenEnvAdapter(Adapter):
    """An OpenEnv environment on a running server (``url``) or a local ``source``.

    Args:
        url: a running server, ``http(s)://host[:port]`` or ``ws(s)://host[:port][/ws]``
            (a Docker container or a Hugging Face Space: ``https://<owner>-<space>.hf.space``).
        source: an OpenEnv environment folder (``openenv.yaml``, ``server/app.py``), or the module
            name of an installed environment package (``echo_env``), served for you privately.
        headers: HTTP headers for every request and handshake (an API key): redacted from
            ``env.spec``, never logged.
        env_name: the environment name for the task API (default: the server's first).
        server_python: the interpreter that serves ``source`` (default: this one); only the
            server runs under it. ``gym.make(id, python=...)`` runs the whole adapter in a host
            process under another interpreter instead.
        listen: how a ``source`` server listens: ``"unix"`` (default; a socket in a private
            directory) or ``"tcp"`` (127.0.0.1 with a random token).
        max_concurrent_envs: ``MAX_CONCURRENT_ENVS`` for a launched ``source``; environments that
            read it (and support concurrent sessions) accept that many sockets. Default: enough
            for ``expected_sessions``, at least :data:`DEFAULT_MAX_CONCURRENT_ENVS`.
        expected_sessions: how many episodes will run at once over this adapter's server:
            ``gym.make_vec`` passes its ``num_envs``. A launched ``source`` then allows at least
            that many sessions: this adapter shares a running server of the same source that
            does, and otherwise gets its own, sized for it (a server in use is never restarted
            under its other users' episodes). Ignored with ``url=`` (size that server yourself).
        server_workers: how many server processes serve a ``source``, each allowing
            ``MAX_CONCURRENT_ENVS`` sessions (an episode's WebSocket lives in one: it goes to the
            worker with the fewest episodes in flight, ties round-robin). Default: 1 for a single
            env; for a vector env one per 8 sub-envs it runs, at most one per core (and 8); see
            :func:`~openenv_gym.adapters.ors_local.default_workers`. A CPU-bound environment
            needs more than one to use more than one core. Ignored with ``url=``.
        connect_timeout: seconds to open a connection.
        read_timeout: seconds to wait for one reply (a reset, a step); on expiry the socket is
            closed and :class:`~openenv_gym.errors.BackendTimeout` names this limit.
        capacity_wait: seconds to keep retrying a server at capacity before giving up.
        startup_timeout: seconds a local server may take to become healthy.
        manifest: the environment's ``openenv.yaml`` fields, as discovery read them (shown in
            ``info`` and by ``openenv-gym info``; nothing else depends on them).
    """

    kind = "openenv"

    def __init__(
        self,
        *,
        url: str | None = None,
        source: str | os.PathLike | None = None,
        headers: dict[str, str] | None = None,
        env_name: str | None = None,
        server_python: str | None = None,
        listen: str = "unix",
        max_concurrent_envs: int | None = None,
        expected_sessions: int | None = None,
        server_workers: int | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float | None = 300.0,
        capacity_wait: float = 10.0,
        startup_timeout: float = 180.0,
        manifest: dict[str, Any] | None = None,
    ):
        super().__init__()
        if (url is None) == (source is None):
            raise ConfigurationError(
                "give exactly one of url= (a running OpenEnv server) or source= (an environment folder "
                "or installed environment package)")
        if listen not in ors_local.LISTEN_MODES:
            raise ConfigurationError(f"listen must be one of {ors_local.LISTEN_MODES}, not {listen!r}")
        for key, value in (("max_concurrent_envs", max_concurrent_envs), ("expected_sessions", expected_sessions)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigurationError(f"{key} must be a positive integer")
        if (source is not None and max_concurrent_envs is not None and expected_sessions is not None
                and max_concurrent_envs < expected_sessions):
            raise ConfigurationError(
                f"max_concurrent_envs={max_concurrent_envs} is fewer than the {expected_sessions} sub-envs "
                "that will run at once; raise it, or leave it out to size the server for them")
        self.server_workers = ors_local.check_workers(server_workers)
        if headers is not None and not (isinstance(headers, dict)
                                        and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
            raise ConfigurationError("headers must be a dict of strings")
        self.url = url
        self.source = os.fspath(source) if source is not None else None
        self.env_name = env_name
        self.python = server_python
        self.listen = listen
        self.max_concurrent_envs = max_concurrent_envs
        self.expected_sessions = expected_sessions
        self.sessions_limit: int | None = None
        """``MAX_CONCURRENT_ENVS`` of the launched server this adapter uses (``None`` with ``url=``)."""
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.capacity_wait = capacity_wait
        self.startup_timeout = startup_timeout
        self._headers = dict(headers or {})
        self.manifest = dict(manifest or {})
        self._state = _State.NEW
        self._transport: OpenEnvTransport | None = None  # a url= server's
        self._server: ors_local.ServerGroup | None = None  # a source's workers
        self._links: dict[ors_local.LocalServer, OpenEnvTransport] = {}  # one transport per worker
        self._relaunch: asyncio.Lock | None = None
        self._idle: dict[ors_local.LocalServer | None, list[Channel]] = {}  # per worker (None: url=)
        self.mcp = False
        self.task_api = False
        self.name: str | None = None
        self._tools: list[ToolSpec] = []

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._state is _State.CLOSED

    def _check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise BackendUnavailable("the OpenEnv adapter is closed")

    async def start(self) -> None:
        self._check_open()
        self._state = _State.OPEN
        if self.source is not None:
            await self._launch()
        else:
            self._transport = OpenEnvTransport(
                self.url or "", headers=self._headers, connect_timeout=self.connect_timeout,
                read_timeout=self.read_timeout)
        await self._discover()

    async def _launch(self) -> None:
        from openenv_gym.importers.openenv import resolve_source

        assert self.source is not None
        found = resolve_source(self.source)
        workers = self.server_workers or ors_local.default_workers(self.expected_sessions)
        base = (found.root, found.app, self.python or "", self.listen, str(workers))
        sessions = self._sessions_for(base)
        server = await ors_local.acquire(
            found.root, found.app, found.name, python=self.python, startup_timeout=self.startup_timeout,
            listen=self.listen, app=found.app, label="OpenEnv server", workers=workers,
            env={"MAX_CONCURRENT_ENVS": str(sessions), "ENABLE_WEB_INTERFACE": "false"},
        )
        if self._state is _State.CLOSED:  # closed while the server started: never leak it
            await asyncio.to_thread(ors_local.release, server)
            self._check_open()
        launched = _launched.setdefault(base, [])
        if not any(s is server for _, s in launched):
            launched.append((sessions, server))
        self._server, self.sessions_limit = server, sessions
        self.env_name = self.env_name or found.name

    def _link(self, worker: ors_local.LocalServer) -> OpenEnvTransport:
        """The transport to one worker of the local server (made on first use)."""
        transport = self._links.get(worker)
        if transport is None:
            transport = self._links[worker] = OpenEnvTransport(
                worker.url, headers={**self._headers, **worker.auth_headers()}, connect_timeout=self.connect_timeout,
                read_timeout=self.read_timeout, local=True, exit_note=functools.partial(self._exit_note, worker))
        return transport

    def _sessions_for(self, base: tuple[str, ...]) -> int:
        """``MAX_CONCURRENT_ENVS`` to launch (or find) this adapter's server with.

        An explicit ``max_concurrent_envs`` is used as given. Otherwise the largest running server
        of this source that allows ``expected_sessions`` is shared; if none does, a new one is sized
        ``max(DEFAULT_MAX_CONCURRENT_ENVS, expected_sessions)``. A smaller server already in use
        keeps running for its users: restarting it would end their episodes. The limit counts
        the sessions of all a server's users together (sub-envs of vector envs sharing it, single
        envs): more at once than that is ``CAPACITY_REACHED``, whose error says how to raise it.
        """
        if self.max_concurrent_envs is not None:
            return self.max_concurrent_envs
        need = self.expected_sessions or 1
        running = [(limit, s) for limit, s in _launched.get(base, []) if s.users > 0 and not s.closed]
        _launched[base] = running
        fits = [limit for limit, _ in running if limit >= need]
        return max(fits) if fits else max(DEFAULT_MAX_CONCURRENT_ENVS, need)

    async def _discover(self) -> None:
        transport = self._transport_()
        schema = await transport.get_json("GET", "/schema")
        action = (schema or {}).get("action") or {}
        props = action.get("properties") or {}
        self.mcp = "tool_name" in props and "arguments" in props
        meta = await transport.get_json("GET", "/metadata", missing=(404,)) or {}
        self.name = str(meta.get("name") or "") or None
        envs = await transport.get_json("GET", "/list_environments", missing=(404, 405))
        if isinstance(envs, list) and envs:
            names = [str(e) for e in envs]
            if self.env_name is None or self.env_name.lower() not in [n.lower() for n in names]:
                if self.env_name is not None and self.url is not None:
                    raise ConfigurationError(f"the OpenEnv server has no environment {self.env_name!r}; it has {names}")
                self.env_name = names[0]
            splits = await transport.get_json("GET", f"/{self.env_name}/splits", missing=(404, 405, 501))
            if splits is not None:
                self.task_api = True
                self._splits = [_split(s) for s in splits]
        if self.mcp:
            channel, _ = await self.open_session(await self._probe_reset_data())
            try:
                self._tools = await self.list_tools(channel)
            except BaseException:
                await channel.aclose()
                raise
            self.give_back(channel)
        else:
            description = str(meta.get("description") or "")
            generic = description == f"{self.name} environment"  # OpenEnv's default says nothing
            self._tools = [step_tool(action, "" if generic else description)]

    async def _probe_reset_data(self) -> dict[str, Any]:
        if self.task_api:
            split = await self.default_split()
            return {"split": split, "index": 0}
        return {"seed": 0}

    def _transport_(self) -> OpenEnvTransport:
        """The transport for HTTP routes (the first worker's, for a local source)."""
        self._check_open()
        if self._server is not None:
            return self._link(self._server.workers[0])
        if self._transport is None:
            raise BackendUnavailable("the OpenEnv adapter is not started")
        return self._transport

    async def ensure_server(self) -> None:
        """Restart local server workers that died; only the first of many concurrent resets does it.

        Episodes on the other workers go on; sockets to a replaced worker are dropped.
        """
        self._check_open()
        if self.source is None:
            return
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
            current = set(self._server.workers) if self._server is not None else set()
            for worker in [w for w in self._idle if w not in current]:
                for channel in self._idle.pop(worker):
                    channel.abort()
            for worker in [w for w in self._links if w not in current]:
                await self._links.pop(worker).aclose()

    def server_died(self) -> bool:
        """True if this adapter launched a local server one of whose workers is no longer running."""
        return self._server is not None and not self._server.alive()

    def server_pid(self) -> int | None:
        """PID of the local server process (the first worker's), if this adapter launched one."""
        return self._server.pid if self._server is not None else None

    def server_pids(self) -> list[int]:
        """PIDs of the local server's workers, in slot order (``[]`` with ``url=``)."""
        return self._server.pids() if self._server is not None else []

    def server_sessions(self) -> list[int]:
        """Episodes in flight on each worker, in slot order, over every adapter sharing them."""
        return self._server.sessions() if self._server is not None else []

    def connection(self) -> dict[str, Any]:
        """``url`` and ``headers`` another client needs to reach this adapter's server (headers are secret).

        With several workers that is the first one.
        """
        self._check_open()
        headers = dict(self._headers)
        if self._server is not None:
            headers.update(self._server.auth_headers())
            return {"url": self._server.url, "headers": headers}
        return {"url": self._transport_().url, "headers": headers}

    async def _exit_note(self, server: ors_local.LocalServer) -> str:
        for _ in range(25):
            if not server.alive():
                return f"; the server process exited with code {server.process.returncode}"
            await asyncio.sleep(0.02)
        return ""

    async def aclose(self) -> None:
        self._state = _State.CLOSED
        idle = [c for channels in self._idle.values() for c in channels]
        self._idle = {}
        await asyncio.gather(*(c.aclose() for c in idle), return_exceptions=True)
        links, self._links = list(self._links.values()), {}
        if self._transport is not None:
            links.append(self._transport)
            self._transport = None
        await asyncio.gather(*(t.aclose() for t in links), return_exceptions=True)
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(ors_local.release, server)

    def episode(self) -> OpenEnvEpisode:
        return OpenEnvEpisode(self)

    def info(self) -> dict[str, Any]:
        info = {"backend": "openenv", "env_name": self.env_name or self.name,
                "action_kind": "mcp" if self.mcp else "typed"}
        if self.manifest.get("version"):
            info["env_version"] = self.manifest["version"]
        return info

    # -- tasks and tools -------------------------------------------------------------------------
    async def tools(self) -> list[ToolSpec]:
        return list(self._tools)

    async def _fetch_splits(self) -> list[Split]:
        if not self.task_api:
            return [Split(DEFAULT_SPLIT, "train")]
        raw = await self._transport_().get_json("GET", f"/{self.env_name}/splits")
        return [_split(s) for s in raw or []]

    async def _fetch_num_tasks(self, split: str) -> int:
        if not self.task_api:
            return SEEDS
        wire = await self._transport_().get_json("POST", f"/{self.env_name}/num_tasks", {"split": split})
        try:
            return int(wire["num_tasks"])
        except (KeyError, TypeError, ValueError):
            raise ServerError(f"POST /{self.env_name}/num_tasks: unexpected answer") from None

    async def task(self, split: str, index: int) -> dict[str, Any]:
        if not self.task_api:
            await self.num_tasks(split)  # an unknown split is TaskNotFound
            return {"seed": int(index)}
        wire = await self._transport_().get_json("POST", f"/{self.env_name}/task", {"split": split, "index": index})
        task = (wire or {}).get("task")
        return task if isinstance(task, dict) else {"task": task}

    def reset_data(self, task: TaskRef) -> dict[str, Any]:
        """What ``reset`` sends for ``task``: split and index (task API), a spec, or a seed."""
        if task.spec is not None:
            return {"task_spec": task.spec} if self.task_api else dict(task.spec)
        if self.task_api:
            return {"split": task.split, "index": task.index}
        return {"seed": int(task.index or 0)}

    # -- sockets ---------------------------------------------------------------------------------
    def give_back(self, channel: Channel) -> None:
        """Keep a healthy socket for the next episode (its environment instance is reset then)."""
        worker, channel.route = channel.route, None
        if worker is not None:
            ors_local.ServerGroup.done(worker)
        server = self._server
        if self._state is _State.OPEN and channel.usable and (worker is None or (
                server is not None and worker in server.workers)):
            self._idle.setdefault(worker, []).append(channel)
        else:
            channel.abort()

    async def open_session(self, data: dict[str, Any]) -> tuple[Channel, dict[str, Any]]:
        """A socket whose environment was just reset with ``data``, and the reset's reply.

        A local source's episode goes to the worker :meth:`~ors_local.ServerGroup.pick` chooses
        (and counts there until :meth:`give_back`). An idle socket of that worker is tried
        first; one that dropped meanwhile is replaced by a new one. A new socket refused for
        capacity is retried with backoff for ``capacity_wait`` seconds.
        """
        if self._server is None:
            return await self._open_on(None, self._transport_(), data)
        self._check_open()
        worker = self._server.pick()
        try:
            channel, reply = await self._open_on(worker, self._link(worker), data)
        except BaseException:
            ors_local.ServerGroup.done(worker)
            raise
        channel.route = worker
        return channel, reply

    async def _open_on(self, worker: ors_local.LocalServer | None, transport: OpenEnvTransport,
                       data: dict[str, Any]) -> tuple[Channel, dict[str, Any]]:
        message = {"type": "reset", "data": data}
        idle = self._idle.get(worker)
        while idle:
            channel = idle.pop()
            if not channel.usable:
                channel.abort()
                continue
            try:
                return channel, await self._reset(channel, message)
            except BackendUnavailable:
                continue  # dropped while idle (a restarted server, a proxy's idle timeout)

        async def fresh() -> tuple[Channel, dict[str, Any]]:
            channel = await transport.open_channel()
            try:
                return channel, await self._reset(channel, message)
            except BaseException:
                channel.abort()
                raise

        try:
            return await runtime.retry(
                fresh, retry_if=lambda exc: isinstance(exc, CapacityReached), attempts=1000,
                deadline=self.capacity_wait, backoff=runtime.Backoff(base=0.05, cap=1.0))
        except CapacityReached as exc:
            how = ("pass max_concurrent_envs= (it sets MAX_CONCURRENT_ENVS for the launched server; the "
                   "environment must read it and set SUPPORTS_CONCURRENT_SESSIONS=True)"
                   if self.source is not None else
                   "start the server with a higher limit (create_app(..., max_concurrent_envs=N), or "
                   "MAX_CONCURRENT_ENVS=N for environments that read it)")
            raise BackendUnavailable(
                f"{exc} after retrying for capacity_wait={self.capacity_wait} s; to run more episodes at "
                f"once, {how}, or use fewer sub-envs") from None

    async def _reset(self, channel: Channel, message: dict[str, Any]) -> dict[str, Any]:
        try:
            return await channel.request(message, "reset", self.read_timeout)
        except ActionRejected as exc:
            channel.abort()
            raise ConfigurationError(f"the server rejected the reset: {exc}") from None

    async def list_tools(self, channel: Channel) -> list[ToolSpec]:
        """The tools an MCP environment lists on ``channel`` (their JSON schemas as given)."""
        data = await channel.request({"type": "step", "data": {"type": "list_tools"}}, "list_tools",
                                     self.read_timeout)
        obs = data.get("observation") or {}
        tools = []
        for tool in obs.get("tools") or []:
            if isinstance(tool, dict) and tool.get("name"):
                schema = tool.get("input_schema", tool.get("inputSchema"))
                tools.append(ToolSpec(str(tool["name"]), str(tool.get("description") or ""), _clean_schema(schema)))
        return tools


def _split(raw: Any) -> Split:
    if isinstance(raw, dict):
        return Split(str(raw.get("name")), str(raw.get("type") or "validation"))
    name = str(raw)
    return Split(name, name if name in ("train", "validation", "test") else "validation")


class OpenEnvEpisode(Episode):
    """One episode on one socket (one environment instance of the server)."""

    def __init__(self, adapter: OpenEnvAdapter):
        self.adapter = adapter
        self.channel: Channel | None = None
        self.done = False
        self.tools: dict[str, ToolSpec] = {}

    async def start(self, task: TaskRef) -> Opening:
        adapter = self.adapter
        await adapter.ensure_server()
        try:
            channel, data = await adapter.open_session(adapter.reset_data(task))
        except BackendUnavailable:
            if not adapter.server_died():
                raise
            # It died just now (its exit was not yet visible to ensure_server): relaunch once.
            await adapter.ensure_server()
            channel, data = await adapter.open_session(adapter.reset_data(task))
        self.channel = channel
        try:
            tools = await adapter.list_tools(channel) if adapter.mcp else await adapter.tools()
        except BaseException:
            await self.aclose()
            raise
        self.tools = {t.name: t for t in tools}
        observation = data.get("observation") if isinstance(data.get("observation"), dict) else {}
        metadata = data.get("metadata") or observation.get("metadata") or {}
        self.done = bool(data.get("done"))
        info = {"observation": observation, "metadata": metadata}
        return Opening(messages=_opening_messages(observation, metadata), tools=tools, task_id=task.task_id,
                       info=info)

    async def step(self, turn: Turn) -> Outcome:
        adapter = self.adapter
        channel = self.channel
        if channel is None:
            raise BackendError("the episode has not started")
        if turn.error is not None:
            return Outcome([unreadable_reply(turn.error)])
        if not turn.calls:
            names = ", ".join(sorted(self.tools))
            return no_tool_call(f"This environment is played through tool calls: call one of {names}.")
        messages: list[Message] = []
        reward = 0.0
        calls: list[dict[str, Any]] = []
        info: dict[str, Any] = {"calls": calls}
        for call in turn.calls:
            refused = refuse_call(call, self.tools, self.done)
            if refused is not None:
                messages.append(refused[0])
                calls.append(refused[1])
                continue
            if adapter.mcp:
                action = {"type": "call_tool", "tool_name": call.name, "arguments": call.arguments or {}}
            else:
                action = dict(call.arguments or {})
            try:
                data = await channel.request({"type": "step", "data": action}, f"step ({call.name})",
                                             adapter.read_timeout)
            except ActionRejected as exc:
                text = f"Error: the environment rejected the action: {exc}"
                messages.append(tool_message(call.id, call.name, text))
                calls.append({"name": call.name, "ok": False, "reason": "rejected", "error": str(exc)})
                continue
            observation = data.get("observation") if isinstance(data.get("observation"), dict) else {}
            metadata = data.get("metadata") or observation.get("metadata") or {}
            step_reward = _reward(data.get("reward", observation.get("reward")))
            reward += step_reward
            if adapter.mcp:
                content, error = tool_result_content(observation)
            else:
                content, error = observation_content(observation), None
            messages.append(tool_message(call.id, call.name, content))
            record: dict[str, Any] = {"name": call.name, "ok": error is None, "reward": data.get("reward"),
                                      "done": bool(data.get("done"))}
            if error is not None:
                record["error"] = error
                info["error"] = {"type": "ToolError", "message": error, "tool": call.name}
            calls.append(record)
            info["observation"], info["metadata"] = observation, metadata
            if data.get("done"):
                self.done = True
        return Outcome(messages, reward=reward, terminated=self.done, info=info)

    async def aclose(self) -> None:
        if self.channel is not None:
            channel, self.channel = self.channel, None
            self.adapter.give_back(channel)
