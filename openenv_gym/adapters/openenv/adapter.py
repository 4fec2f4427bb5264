"""OpenEnv environments over OpenEnv's own WebSocket protocol.

An OpenEnv server hosts one environment instance per WebSocket at ``/ws``; ``reset`` starts an
episode on it and every ``step`` sends one action. This adapter speaks that protocol itself
(:mod:`openenv_gym.adapters.openenv.transport`), one connection per episode, and never the
stateless HTTP ``/reset`` ``/step`` (every request there builds a fresh environment). The mapping
onto the Gymnasium contract (docs/backends.md, OpenEnv):

* **MCP environments** (the action is ``CallToolAction``): the tools are the environment's MCP
  tools (``list_tools`` on the socket, once per environment instance, as OpenEnv's own
  ``MCPToolClient`` caches them), in OpenAI format; a tool call is
  ``{"type": "call_tool", "tool_name", "arguments"}``; its result, or its ``ToolError``, becomes a
  ``tool`` message.
* **Typed-action environments**: one tool, ``step``, whose parameters are the Action model's JSON
  schema from ``/schema`` without ``metadata``; the observation's fields other than ``reward``,
  ``done`` and ``metadata`` become the tool message (text as text, the rest as JSON).
* ``reward`` ``None`` counts 0 (``info["calls"][i]["reward"]`` keeps the ``None``, and an MCP
  tool's own value, a dict tool's dict, is its ``data`` and ``structured_content`` there, which
  ``serve`` hands back to OpenEnv's clients as OpenEnv's server does); ``done`` is ``terminated``
  (sticky: calls after it are not sent); ``max_turns`` truncates. The raw observation goes to ``info["observation"]``, its ``metadata``
  to ``info["metadata"]``: never to the agent (an imported ORS task's spec, answers included,
  is in there).
* An action the server rejects (``VALIDATION_ERROR``, ``INVALID_JSON``) is a message to the agent,
  and so is a step whose environment code raised (``EXECUTION_ERROR``, also ``info["error"]``):
  the episode goes on in the same session, as with OpenEnv's own client.
* ``CAPACITY_REACHED`` says how many sessions the server allows: a launched ``source`` places the
  session on another worker (starting one when all are full); a ``url`` server is retried with
  backoff for ``capacity_wait`` seconds, then :class:`~openenv_gym.errors.BackendUnavailable`
  says how to give it room.
* Tasks: a server with OpenEnv's task API (``/list_environments``, ``/{env}/splits``,
  ``num_tasks``, ``task``) gives the splits and tasks, and ``reset`` sends ``split`` and ``index``;
  without it there is one split, ``default``, whose task ``i`` is ``reset(seed=i)`` on the server,
  so a seeded Gymnasium reset gives a seeded server reset.

Connections are pooled per adapter: an episode takes an idle socket (its environment instance is
reset for the new episode, as OpenEnv's own client does) or opens one; a socket that dropped
between episodes is replaced; a socket whose request failed or was cancelled is closed, never
reused. A local ``source`` (an environment folder or an installed environment package) is served
privately by the same machinery as ORS sources (:mod:`openenv_gym.adapters.local_servers`), in
``server_workers`` processes and as many more as the server's session limit needs for the vector
env asking (``expected_sessions``, which ``gym.make_vec`` passes): each episode's socket goes to
the worker with the fewest episodes in flight (ties round-robin) among those with room, whose
environment instance it then holds to the end, and idle sockets are pooled per worker. With
``in_process=True`` a ``source``'s environment runs in this process instead
(:mod:`openenv_gym.adapters.openenv.inprocess`): the same calls, answered without a socket.
"""

from __future__ import annotations

import asyncio
import copy
import os
import sys
from pathlib import Path
from typing import Any

from openenv_gym import runtime
from openenv_gym.actions import Turn, no_tool_call, refuse_call, tool_message, unreadable_reply, user_message
from openenv_gym.adapters import local_servers
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.adapters.limits import DEFAULT_MAX_JSON_DEPTH, DEFAULT_MAX_RESPONSE_BYTES, Limits, positive
from openenv_gym.adapters.local_servers import Endpoint, Lease, ServerReport, Worker
from openenv_gym.adapters.local_servers.group import Server
from openenv_gym.adapters.openenv.inprocess import HereChannel, InProcessOpenEnv, load_parts
from openenv_gym.adapters.openenv.transport import (
    ActionRejected,
    CapacityReached,
    Channel,
    OpenEnvTransport,
    StepFailed,
    UnaskedReply,
    split_url,
)
from openenv_gym.errors import BackendError, BackendUnavailable, ConfigurationError, ServerError
from openenv_gym.wire import UNBOUNDED_TASKS, Message, Opening, Outcome, Split, TaskRef, ToolSpec, json_encode

__all__ = ["OpenEnvAdapter", "OpenEnvEpisode", "observation_content", "tool_result_content",
           "DEFAULT_SPLIT", "SEEDS", "DEFAULT_MAX_CONCURRENT_ENVS"]

DEFAULT_SPLIT = "default"
"""The one split of a server without the task API."""

SEEDS = UNBOUNDED_TASKS
"""Tasks in :data:`DEFAULT_SPLIT` (unbounded): task ``i`` is the server's ``reset(seed=i)``."""

DEFAULT_MAX_CONCURRENT_ENVS = 256
"""``MAX_CONCURRENT_ENVS`` of each process of a launched ``source`` unless ``max_concurrent_envs``
says otherwise (environments that read it allow that many sessions per process; more processes
start when a vector env needs more)."""

_RESERVED = frozenset(("reward", "done", "metadata"))

OpenEnvLink = OpenEnvTransport | InProcessOpenEnv
"""Where an episode's messages go: a server's WebSocket, or the environment run in this process (``in_process``)."""
AnyChannel = Channel | HereChannel
"""One session: a WebSocket to ``/ws``, or an environment instance here."""


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


class OpenEnvAdapter(ServerReport, Adapter):
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
        max_concurrent_envs: ``MAX_CONCURRENT_ENVS`` for each process of a launched ``source``;
            environments that read it (and support concurrent sessions) accept that many
            sockets per process. Default :data:`DEFAULT_MAX_CONCURRENT_ENVS`.
        expected_sessions: how many episodes will run at once over this adapter's server:
            ``gym.make_vec`` passes its ``num_envs``. A launched ``source`` starts enough server
            processes for them once it knows how many sessions one process allows (the app's own
            setting, or the limit its first refusal states): a single-session environment
            (most of OpenEnv's own) gets one process per sub-env. Ignored with ``url=``, where
            the error says how to size that server.
        server_workers: how many server processes serve a ``source`` at first, each allowing its
            own sessions (an episode's WebSocket lives in one: it goes to the worker with the
            fewest episodes in flight, ties round-robin). Default: 1 for a single env; for a
            vector env one per 8 sub-envs it runs, at most one per core (and 8); see
            :func:`~openenv_gym.adapters.local_servers.default_workers`. More are started when
            the server's session limit needs them. Ignored with ``url=``.
        connect_timeout: seconds to open a connection.
        read_timeout: seconds to wait for one reply (a reset, a step); on expiry the socket is
            closed and :class:`~openenv_gym.errors.BackendTimeout` names this limit.
        capacity_wait: seconds to keep retrying a server at capacity that cannot be given
            another process (a ``url=``) before giving up.
        startup_timeout: seconds a local server may take to become healthy.
        max_response_bytes: the most bytes one WebSocket message or HTTP answer of the server
            may hold; a bigger one closes the connection and raises
            :class:`~openenv_gym.errors.ServerError` naming this limit.
        max_json_depth: how deep arrays and objects may nest in the server's JSON; deeper is a
            :class:`~openenv_gym.errors.ServerError` naming this limit.
        manifest: the environment's ``openenv.yaml`` fields, as discovery read them (shown in
            ``info`` and by ``openenv-gym info``; nothing else depends on them).
        in_process: run a ``source``'s environment in this process: the class its app gave
            ``create_app``, driven as OpenEnv's server drives it, with no server and no socket
            (:mod:`~openenv_gym.adapters.openenv.inprocess`). Cheaper per step; nothing of a
            process boundary protects this process from the environment's code.
    """

    kind = "openenv"
    idle_pass = 1.0  # a WebSocket's pings (a server's come every 20 s or so) answered within a second

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
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
        manifest: dict[str, Any] | None = None,
        in_process: bool = False,
    ):
        super().__init__()
        if (url is None) == (source is None):
            raise ConfigurationError(
                "give exactly one of url= (a running OpenEnv server) or source= (an environment folder "
                "or installed environment package)")
        local_servers.check_in_process(in_process, url, server_python)
        if listen not in local_servers.LISTEN_MODES:
            raise ConfigurationError(f"listen must be one of {local_servers.LISTEN_MODES}, not {listen!r}")
        self.max_concurrent_envs = positive("max_concurrent_envs", max_concurrent_envs, optional=True)
        self.expected_sessions = positive("expected_sessions", expected_sessions, optional=True)
        self.server_workers = local_servers.check_workers(server_workers)
        self.limits = Limits(positive("max_response_bytes", max_response_bytes),
                             positive("max_json_depth", max_json_depth))
        if headers is not None and not (isinstance(headers, dict)
                                        and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
            raise ConfigurationError("headers must be a dict of strings")
        self.url = url
        self.source = os.fspath(source) if source is not None else None
        # A server given by URL is all sockets of this adapter's own, which a single env can
        # drive from the caller's thread (a launched source shares its processes across envs,
        # on the runtime loop).
        self.caller_thread = source is None
        self.env_name = env_name
        self.python = server_python
        self.listen = listen
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.capacity_wait = capacity_wait
        self.startup_timeout = startup_timeout
        self._headers = dict(headers or {})
        self.manifest = dict(manifest or {})
        self.in_process = in_process
        self._here: InProcessOpenEnv | None = None
        self.endpoint: Endpoint[OpenEnvLink] = Endpoint("OpenEnv", self._link)
        self._idle: dict[Server, list[AnyChannel]] = {}  # sockets between episodes, per server
        self.mcp = False
        self.task_api = False
        self.name: str | None = None
        self._tools: list[ToolSpec] = []

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def sessions_limit(self) -> int | None:
        """Sessions one server process allows, once known (the app's setting, or a refusal's)."""
        return self.endpoint.capacity

    @property
    def open_files_per_session(self) -> float:  # type: ignore[override]
        # A WebSocket per session; a source's may be served by a process of its own per session,
        # whose pipes count here too.
        return 0.0 if self.in_process else 1.0 if self.source is None else 2.0

    async def start(self) -> None:
        self.endpoint.check_open()
        if self.source is not None and self.in_process:
            from openenv_gym.adapters.openenv.detect import resolve_source

            found = resolve_source(self.source)
            self._here = InProcessOpenEnv(load_parts(str(Path(found.root).resolve()), found.app),
                                          self.max_concurrent_envs)
            self.endpoint.open_here(self._here.url)
            self.env_name = self.env_name or found.name
        elif self.source is not None:
            await self._launch()
        else:
            split_url(self.url or "")  # a malformed URL is a ConfigurationError before anything else
            self.endpoint.open_remote(self.url or "")
        await self._discover()

    async def _launch(self) -> None:
        from openenv_gym.adapters.openenv.detect import resolve_source

        assert self.source is not None
        found = resolve_source(self.source)
        limit = self.max_concurrent_envs or DEFAULT_MAX_CONCURRENT_ENVS
        launch = local_servers.Launch(
            Path(found.root).resolve(), found.app, found.name, self.python or sys.executable, self.listen,
            app=found.app, env={"MAX_CONCURRENT_ENVS": str(limit), "ENABLE_WEB_INTERFACE": "false"},
            startup_timeout=self.startup_timeout, label="OpenEnv server")
        workers = self.server_workers or local_servers.default_workers(self.expected_sessions)
        await self.endpoint.open_local(launch, workers=workers, expected_sessions=self.expected_sessions)
        self.env_name = self.env_name or found.name

    def _link(self, server: Server) -> OpenEnvLink:
        """The transport to one server (a remote URL, or a worker of the local server), or the env here."""
        if self._here is not None:
            return self._here
        return OpenEnvTransport(
            server.url, headers={**self._headers, **server.auth_headers()}, connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout, local=isinstance(server, Worker), exit_note=server.exit_note,
            limits=self.limits)

    async def _discover(self) -> None:
        transport = self.endpoint.link()
        schema = await transport.schema()
        action = (schema or {}).get("action") or {}
        props = action.get("properties") or {}
        self.mcp = "tool_name" in props and "arguments" in props
        meta = await transport.metadata() or {}
        self.name = str(meta.get("name") or "") or None
        envs = await transport.environments()
        if isinstance(envs, list) and envs:
            names = [str(e) for e in envs]
            if self.env_name is None or self.env_name.lower() not in [n.lower() for n in names]:
                if self.env_name is not None and self.url is not None:
                    raise ConfigurationError(f"the OpenEnv server has no environment {self.env_name!r}; it has {names}")
                self.env_name = names[0]
            splits = await transport.splits(self.env_name, probe=True)
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

    async def ensure_server(self) -> None:
        """Restart local server workers that died; only the first of many concurrent resets does it.

        Episodes on the other workers go on; idle sockets to a replaced worker are dropped.
        """
        for server in await self.endpoint.ensure():
            for channel in self._idle.pop(server, []):
                channel.abort()

    async def aclose(self) -> None:
        self.endpoint.shut()
        idle = [c for channels in self._idle.values() for c in channels]
        self._idle = {}
        await asyncio.gather(*(c.aclose() for c in idle), return_exceptions=True)
        await self.endpoint.aclose()

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
        raw = await self.endpoint.link().splits(self._env())
        return [_split(s) for s in raw or []]

    async def _fetch_num_tasks(self, split: str) -> int:
        if not self.task_api:
            return SEEDS
        wire = await self.endpoint.link().num_tasks(self._env(), split)
        try:
            return int(wire["num_tasks"])
        except (KeyError, TypeError, ValueError):
            raise ServerError(f"POST /{self.env_name}/num_tasks: unexpected answer") from None

    async def task(self, split: str, index: int) -> dict[str, Any]:
        if not self.task_api:
            await self.num_tasks(split)  # an unknown split is TaskNotFound
            return {"seed": int(index)}
        wire = await self.endpoint.link().task(self._env(), split, index)
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
    def give_back(self, channel: AnyChannel) -> None:
        """Keep a healthy socket for the next episode (its environment instance is reset then).

        An idle socket keeps its server session (and so its lease, no longer busy); any other
        is closed, which gives the session back. An environment run here is pooled the same
        way: building one costs milliseconds (a thread, its MCP session) where reusing one
        costs nothing (closing idle ones cost the next 64 clients a third of their rate). Each
        idle one keeps its MCP session's tasks, which cost nothing while the runtime loop has
        a main task for anyio to find (without one, anyio scanned every task of the loop on
        each worker-thread call: 63 idle instances cost the one remaining client 10-15 % per step).
        """
        lease: Lease | None = channel.lease
        servers = self.endpoint.servers
        if (not self.endpoint.closed and channel.usable and lease is not None and lease.held
                and servers is not None and lease.server in servers.workers):
            lease.busy = False
            self._idle.setdefault(lease.server, []).append(channel)
        else:
            channel.abort()

    def _idle_servers(self) -> list[Server]:
        """The servers holding an idle socket of ours; those of a server that left the group (an
        idle worker stopped, see ``IDLE_WORKER_TIMEOUT``) are dropped on the way."""
        servers = self.endpoint.servers
        live = servers.workers if servers is not None else ()
        for server in [s for s in self._idle if s not in live]:
            for channel in self._idle.pop(server):
                channel.abort()
        return [s for s, idle in self._idle.items() if idle]

    async def open_session(self, data: dict[str, Any]) -> tuple[AnyChannel, dict[str, Any]]:
        """A socket whose environment was just reset with ``data``, and the reset's reply.

        The server is the one :meth:`Endpoint.place <openenv_gym.adapters.local_servers.Endpoint.place>`
        picks (least loaded, with room for a session). An idle socket there is reused; one that
        dropped meanwhile is replaced by a new one. A new socket refused for capacity teaches the
        endpoint the server's limit: a launched source then places the session on another
        worker (starting one if all are full); a server at a URL is retried with backoff for
        ``capacity_wait`` seconds, then :class:`~openenv_gym.errors.BackendUnavailable` says how
        to give it room.
        """
        endpoint = self.endpoint
        message = {"type": "reset", "data": data}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.capacity_wait
        backoff = runtime.Backoff(base=0.05, cap=1.0)
        attempt = 0
        while True:
            server = await endpoint.place(self._idle_servers())
            idle = self._idle.get(server)
            if idle:
                channel = idle.pop()
                if not channel.usable:
                    channel.abort()
                    continue
                channel.lease.busy = True
                try:
                    return channel, await self._reset(channel, message)
                except (BackendUnavailable, UnaskedReply):
                    channel.abort()  # dropped while idle (a restarted server, a proxy's idle timeout)
                    continue
                except BaseException:
                    self.give_back(channel)
                    raise
            lease = Lease(server)
            try:
                channel = await endpoint.link(server).open_channel(on_close=lease.release)
            except BaseException:
                lease.release()
                raise
            channel.lease = lease
            try:
                reply = await self._reset(channel, message)
            except CapacityReached as exc:
                capacity = endpoint.learn(lease, exc.max_sessions)
                channel.abort()
                if endpoint.can_grow and capacity is not None and server.held >= capacity:
                    continue  # full by our own count: the next place() uses, or starts, another worker
                if loop.time() >= deadline:
                    raise BackendUnavailable(self._capacity_advice(exc, capacity)) from None
                await asyncio.sleep(min(backoff.delay(attempt), max(0.0, deadline - loop.time())))
                attempt += 1
                continue
            except BaseException:
                channel.abort()
                raise
            lease.confirm()
            return channel, reply

    def _env(self) -> str:
        """The environment's name in task-API routes."""
        return self.env_name or self.name or ""

    def _capacity_advice(self, exc: CapacityReached, capacity: int | None) -> str:
        """What to do about a server that stays at capacity (the message of the error raised)."""
        servers = self.endpoint.servers
        held = sum(s.held for s in servers.workers) if servers is not None else 0
        allows = f"allows {capacity} session(s) at once" if capacity else "is at its session limit"
        want = f" ({self.expected_sessions} for this vector env)" if (self.expected_sessions or 1) > 1 else ""
        if self.source is None:
            how = (f"start it with room for every session you run at once{want}: create_app(..., "
                   "max_concurrent_envs=N) with the environment setting SUPPORTS_CONCURRENT_SESSIONS = True, or "
                   "MAX_CONCURRENT_ENVS=N for environments that read it; or pass source= (the environment's "
                   "folder or package) instead of url= to have enough server processes started for you; "
                   "or run fewer envs at once")
        elif self._here is not None and not self._here.parts.concurrent:
            how = ("the environment does not declare SUPPORTS_CONCURRENT_SESSIONS, so in_process=True runs one "
                   "session of it at a time: leave in_process off to have a server process started per session")
        else:
            how = "close the envs you no longer use, or run fewer at once"
        return (f"{exc} after retrying for capacity_wait={self.capacity_wait} s: the server {allows}, and all "
                f"are in use ({held} by this env's adapter); {how}")

    async def _reset(self, channel: AnyChannel, message: dict[str, Any]) -> dict[str, Any]:
        try:
            return await channel.request(message, "reset", self.read_timeout)
        except ActionRejected as exc:
            channel.abort()
            raise ConfigurationError(f"the server rejected the reset: {exc}") from None

    async def tools_of(self, channel: AnyChannel) -> list[ToolSpec]:
        """The MCP tools of ``channel``'s environment instance, listed once per instance and kept
        for the episodes it plays after, as OpenEnv's own ``MCPToolClient`` keeps them
        (``list_tools(use_cache=True)``): listing costs an MCP round trip per episode otherwise."""
        if channel.tools is None:
            channel.tools = await self.list_tools(channel)
        return list(channel.tools)

    async def list_tools(self, channel: AnyChannel) -> list[ToolSpec]:
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
        self.channel: AnyChannel | None = None
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
            tools = await adapter.tools_of(channel) if adapter.mcp else await adapter.tools()
        except BaseException:
            await self.aclose()
            raise
        self.tools = {t.name: t for t in tools}
        raw = data.get("observation")
        observation: dict[str, Any] = raw if isinstance(raw, dict) else {}
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
            except StepFailed as exc:  # the env's own code raised; the server keeps the session
                messages.append(tool_message(call.id, call.name, f"Error: the tool failed: {exc}"))
                calls.append({"name": call.name, "ok": False, "reason": "tool_failed", "error": str(exc)})
                info["error"] = {"type": "ToolFailed", "message": str(exc), "tool": call.name}
                continue
            raw = data.get("observation")
            observation: dict[str, Any] = raw if isinstance(raw, dict) else {}
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
            result = observation.get("result") if adapter.mcp else None
            if isinstance(result, dict):
                # The tool's own value (a dict tool's dict), which the message's text flattens.
                for key in ("data", "structured_content"):
                    if result.get(key) is not None:
                        record[key] = result[key]
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
