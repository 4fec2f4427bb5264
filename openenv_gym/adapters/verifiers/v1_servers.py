"""The servers every rollout of a Verifiers v1 adapter shares, owned by one task.

:class:`RolloutServers` starts and stops, together, the taskset's shared tool servers, the
library's interception server (where the harness sends its model calls) and, for
``transport="http"``, the local OpenAI-compatible policy endpoint; and it plays each episode
with the taskset's ``vf.Env``, whose one seat is an agent bound to them
(:mod:`openenv_gym.adapters.verifiers.v1_env`). One asyncio task enters and leaves them all, because
the library's tool servers use anyio cancel scopes that must be exited by the task that entered
them; nothing else about that task shows outside this class.

How the agent's answer reaches the interception server (``transport``):

* ``"inject"``: a subclass of the library's ``InterceptionServer`` whose ``_client(config)``
  returns a queue-backed ``vf.Client`` (``get_response`` for buffered calls, ``relay`` for
  streamed ones). No extra HTTP hop. It depends on **private** names of the library:
  ``verifiers.v1.interception.InterceptionServer._client`` and
  ``verifiers.v1.clients.client.RelayReply``.
* ``"http"``: no private hook: :class:`PolicyHTTPServer` on 127.0.0.1 (JSON and SSE), named by
  ``AgentConfig.client = vf.EvalClientConfig(base_url=..., headers={POLICY_KEY_HEADER: key})``;
  calls are routed by the ``X-Session-ID`` header (the trace id) that the library's eval client
  sends, and refused (401) without the server's key: any local user can reach a loopback port.

Either way each call goes to :meth:`CallRouter.answer
<openenv_gym.adapters.verifiers.v1_handoff.CallRouter.answer>`, which hands it to its episode.
Nothing here imports ``verifiers`` until a server starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from openenv_gym.adapters.verifiers.process import PORT_FILES
from openenv_gym.adapters.verifiers.v1_compat import episode_record, library_exit
from openenv_gym.adapters.verifiers.v1_env import EpisodeResult, play_episode, seat_agent_class
from openenv_gym.adapters.verifiers.v1_handoff import CallRouter
from openenv_gym.errors import BackendError, BackendUnavailable, ConfigurationError
from openenv_gym.tokens import Guard, new_token

__all__ = ["PolicyHTTPServer", "RolloutServers", "has_client_hook", "injected_interception_class",
           "queue_client_class"]

logger = logging.getLogger(__name__)

POLICY_KEY_VAR = "OPENENV_GYM_V1_POLICY_KEY"
"""The env var the library reads for the endpoint's key: never set; the policy needs none, and a
non-Prime name keeps the library from consulting the Prime CLI config."""

POLICY_KEY_HEADER = "X-OpenEnv-Gym-Policy-Key"
"""The header carrying :class:`PolicyHTTPServer`'s key. A header of our own, not
``Authorization``: the library's eval client sets that from ``api_key_var`` (an env var, which
child processes would inherit), and sends ``EvalClientConfig.headers`` on every request."""

STOP_TIMEOUT = 60.0
"""Seconds :meth:`RolloutServers.stop` waits for the servers to shut down before cancelling."""


class RolloutServers:
    """The shared servers of one adapter, and the episodes played on them: :meth:`start`,
    :meth:`run`, :meth:`stop`.

    Args:
        vf: the ``verifiers.v1`` module.
        env: the loaded single-agent ``vf.Env`` (its taskset says which tool servers to share;
            its ``run()`` plays each episode).
        agent_configs: the ``vf.AgentConfig`` of each seat we play, by name (its ``client`` is replaced).
        router: where the model calls go.
        transport: ``"auto"``, ``"inject"`` or ``"http"`` (see the module docstring).
        name: for the owner task's name and log messages.
    """

    def __init__(self, *, vf: Any, env: Any, agent_configs: dict[str, Any], router: CallRouter, transport: str,
                 name: str):
        self._vf, self._env, self._agent_configs = vf, env, agent_configs
        self._router = router
        self._requested = transport
        self._name = name
        self._seat: Callable[..., Any] | None = None
        self._shared: dict[str, Any] = {}
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self.transport: str | None = None
        """The transport in use (``"inject"`` or ``"http"``) once started."""
        self.rollout_tools = False
        """Whether the taskset's tasks start tool servers of their own (per rollout), once started."""

    @property
    def running(self) -> bool:
        """Whether rollouts can run (started, not stopped)."""
        return self._seat is not None

    @property
    def shared_tools(self) -> dict[str, Any]:
        """The taskset's shared tool servers while running (name -> the library's handle), else empty."""
        return self._shared

    async def start(self) -> None:
        """Start the servers in their owner task; returns once they serve, raises if they cannot.

        Errors: :class:`ConfigurationError` as raised (a missing hook for ``"inject"``, ...),
        anything else as :class:`BackendUnavailable`.
        """
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._stop = asyncio.Event()
        self._owner = loop.create_task(self._own(ready), name=f"verifiers-v1 {self._name}")
        try:
            await ready
        except BaseException:
            self._stop.set()
            await asyncio.gather(self._owner, return_exceptions=True)
            raise

    def run(self, task: Any, on_trace: Callable[[Any], None]) -> Coroutine[Any, Any, EpisodeResult]:
        """One episode of ``task``: the env's own ``run()`` with our agent in its seat (a coroutine;
        the caller awaits it). ``on_trace`` is called with the seat's trace before its first model call.
        """
        seat = self._seat
        if seat is None:
            raise BackendError("the Verifiers v1 adapter is not started (or is closed)")
        env = self._env
        return play_episode(self._vf, env, task,
                            lambda name, result: seat(name, result, lambda trace, _k: on_trace(trace)),
                            lambda _task, traces: episode_record(self._vf, env.config.env_id, traces))

    def play(self, task: Any, on_trace: Callable[[str, Any, int], None], on_busy: Callable[[str, int, bool], None],
             runs: dict[str, int]) -> Coroutine[Any, Any, EpisodeResult]:
        """One game of ``task``: the env's own ``run()`` with an agent of ours in every seat (a
        coroutine). ``on_trace(seat, trace, k)`` when run ``k`` of a seat mints its trace,
        ``on_busy(seat, k, busy)`` as that run starts and ends asking (see
        :mod:`~openenv_gym.adapters.verifiers.v1_env`); ``runs``: how often each seat may run."""
        seat = self._seat
        if seat is None:
            raise BackendError("the Verifiers v1 adapter is not started (or is closed)")
        env = self._env

        def make(name: str, result: EpisodeResult) -> Any:
            return seat(name, result, lambda trace, k: on_trace(name, trace, k), runs=runs.get(name, 1),
                        on_busy=lambda k, busy: on_busy(name, k, busy))

        return play_episode(self._vf, env, task, make,
                            lambda _task, traces: episode_record(self._vf, env.config.env_id, traces), single=False)

    async def stop(self) -> None:
        """Stop the servers (waiting up to :data:`STOP_TIMEOUT`, then cancelling). Idempotent."""
        if self._stop is not None:
            self._stop.set()
        if self._owner is not None:
            owner, self._owner = self._owner, None
            done, _ = await asyncio.wait({owner}, timeout=STOP_TIMEOUT)
            if not done:
                owner.cancel()
                await asyncio.gather(owner, return_exceptions=True)

    async def _own(self, ready: asyncio.Future[None]) -> None:
        """The owner task: enter every server, signal ``ready``, wait for :meth:`stop`, leave them."""
        vf, env = self._vf, self._env
        http: PolicyHTTPServer | None = None
        try:
            from verifiers.v1.interception import InterceptionServer, requires_tunnel
            from verifiers.v1.mcp import serve_shared
            from verifiers.v1.runtimes import runtime_is_local

            harness_is_local = all(runtime_is_local(c.runtime) for c in self._agent_configs.values())
            taskset = env.taskset
            servers = taskset.toolsets(taskset.config)
            # serve_shared rather than Env.shared_tools(): the latter reads locality from the env
            # config's own agent seat (a remote Prime runtime by default), not from ours.
            async with (serve_shared(servers, harness_is_local=harness_is_local) if servers
                        else _no_shared()) as shared:
                if servers:
                    await asyncio.to_thread(PORT_FILES.note)
                task_cls = type(taskset).task_type()
                configs = [s.config for s in task_cls.toolsets(taskset.config.task)]
                self.rollout_tools = bool(configs)
                kwargs = {
                    "requires_tunnel": requires_tunnel(harness_is_local, configs, shared.values()),
                    "state_service_secrets": tuple(s.state_secret for s in shared.values()
                                                   if getattr(s, "state_secret", None)),
                }
                transport = self._requested
                if transport == "auto":
                    transport = "inject" if has_client_hook() else "http"
                if transport == "inject":
                    if not has_client_hook():
                        raise ConfigurationError(
                            "this verifiers has no InterceptionServer._client hook; use transport='http'")
                    server = injected_interception_class()(queue_client_class()(self._router), **kwargs)
                    client = vf.EvalClientConfig(base_url="http://127.0.0.1:9/v1", api_key_var=POLICY_KEY_VAR)
                else:
                    http = PolicyHTTPServer(self._router)
                    await http.start()
                    server = InterceptionServer(**kwargs)
                    client = vf.EvalClientConfig(base_url=http.base_url, api_key_var=POLICY_KEY_VAR,
                                                 headers={POLICY_KEY_HEADER: http.key})
                self.transport = transport
                async with server:
                    self._shared = shared = dict(shared)
                    seat_configs = {name: config.model_copy(update={"client": client})
                                    for name, config in self._agent_configs.items()}
                    seat_class = seat_agent_class(vf)

                    def seat(name: str, result: EpisodeResult, on_trace: Callable[[Any, int], None],
                             **kwargs: Any) -> Any:
                        return seat_class(seat_configs[name], interception=server, shared_tools=shared,
                                          task_cls=task_cls, on_trace=on_trace, result=result, name=name, **kwargs)

                    self._seat = seat
                    ready.set_result(None)
                    assert self._stop is not None
                    await self._stop.wait()
        except BaseException as exc:
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                exc = library_exit(exc)
            if not ready.done():
                if isinstance(exc, Exception) and not isinstance(exc, ConfigurationError):
                    exc = BackendUnavailable(f"starting the Verifiers v1 servers failed: {type(exc).__name__}: {exc}")
                ready.set_exception(exc)
            elif not isinstance(exc, asyncio.CancelledError):
                logger.warning("verifiers v1 servers of %s stopped with %r", self._name, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._seat = None
            self._shared = {}
            if http is not None:
                await http.stop()
            PORT_FILES.sweep()


@contextlib.asynccontextmanager
async def _no_shared() -> AsyncIterator[dict[str, Any]]:
    yield {}


# -- the two transports ------------------------------------------------------------------------------

def has_client_hook() -> bool:
    """Whether the installed library has the private hook ``transport="inject"`` needs."""
    try:
        from verifiers.v1.clients.client import RelayReply  # noqa: F401
        from verifiers.v1.interception import InterceptionServer
    except ImportError:
        return False
    return callable(getattr(InterceptionServer, "_client", None))


def _chat_only(dialect: Any) -> None:
    if "/v1/chat/completions" not in getattr(dialect, "routes", ()):
        from verifiers.v1.errors import model_error

        raise model_error(
            f"openenv_gym answers only the chat-completions dialect; this harness speaks "
            f"{type(dialect).__name__} (use a chat harness such as null or bash)", status_code=400)


def queue_client_class() -> type:
    """The ``vf.Client`` whose every completion is the agent's answer (built lazily: importing this
    module never imports verifiers)."""
    from verifiers.v1.clients import Client
    from verifiers.v1.clients.client import RelayReply

    class QueueClient(Client):
        """A model client whose every completion is the agent's next action."""

        def __init__(self, router: CallRouter):
            self.router = router

        async def get_response(self, dialect: Any, body: dict, sampling: Any, session_id: str | None = None,
                               turn: Any = None, headers: Any = None) -> Any:
            _chat_only(dialect)
            raw = await self.router.answer(body, session_id)
            response = dialect.parse_response(dialect.validate_response(raw))
            response.raw = raw  # the interception server serializes this back to the harness
            return response

        async def relay(self, dialect: Any, body: dict, session_id: str | None = None,
                        headers: Any = None) -> Any:
            _chat_only(dialect)
            raw = await self.router.answer(body, session_id)
            events = dialect.stream_events(raw)

            async def chunks() -> Any:
                for event in events:
                    yield event

            async def close() -> None:
                return None

            return RelayReply("text/event-stream", chunks(), close)

    return QueueClient


def injected_interception_class() -> type:
    """The library's ``InterceptionServer`` with one given client for every rollout it serves."""
    from verifiers.v1.interception import InterceptionServer

    class InjectedInterception(InterceptionServer):
        """The library's interception server, with our client for every rollout it serves."""

        def __init__(self, client: Any, **kwargs: Any):
            super().__init__(**kwargs)
            self._injected = client

        def _client(self, config: Any) -> Any:  # private hook of InterceptionServer (0.3.x, 0.4.x)
            return self._injected

    return InjectedInterception


class PolicyHTTPServer:
    """The ``transport="http"`` path: an OpenAI-compatible endpoint on 127.0.0.1 (JSON and SSE).

    Every local user can connect to a loopback port, so a request must carry :attr:`key` (made
    per server, compared in constant time) in :data:`POLICY_KEY_HEADER`; without it the answer is
    401 and no episode sees the call.
    """

    def __init__(self, router: CallRouter):
        self.router = router
        self.runner: Any = None
        self.base_url = ""
        self.key = new_token()

    async def start(self) -> None:
        from aiohttp import web
        from verifiers.v1.dialects.chat import ChatDialect

        dialect = ChatDialect()

        async def completions(request: web.Request) -> web.StreamResponse:
            if not Guard(self.key).matches(request.headers.get(POLICY_KEY_HEADER)):
                return web.json_response({"error": {"message": "this endpoint needs its key"}}, status=401)
            body = await request.json()
            try:
                raw = await self.router.answer(body, request.headers.get("X-Session-ID"))
            except Exception as exc:  # noqa: BLE001 - reported to the harness as an API error
                return web.json_response({"error": {"message": str(exc)}},
                                         status=getattr(exc, "status_code", None) or 500)
            if not body.get("stream"):
                return web.json_response(raw)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            for event in dialect.stream_events(raw):
                await response.write(event)
            await response.write_eof()
            return response

        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/chat/completions", completions)
        app.router.add_post("/chat/completions", completions)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        # Bound here, so the port is read from our own socket. IPPROTO_TCP: asyncio sets
        # TCP_NODELAY only on such sockets (else Nagle + delayed ACK add ~40 ms per answer).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self.runner, sock).start()
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"

    async def stop(self) -> None:
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()
