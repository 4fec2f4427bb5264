"""An OpenEnv environment run in this process, answering the OpenEnv adapter's calls directly.

``gym.make(id, in_process=True)`` for an OpenEnv ``source`` imports the environment's app module
here instead of serving it with uvicorn in a subprocess. :class:`InProcessOpenEnv` then answers
the calls the adapter makes of :class:`~openenv_gym.adapters.openenv.transport.OpenEnvTransport`
(``schema``, ``metadata``, the task API, ``open_channel``) and a :class:`HereChannel` answers a
channel's ``request`` with the ``data`` an OpenEnv server's WebSocket reply would hold, so the
episode logic is the same code either way. Why: every step over a local server is a loopback
WebSocket round trip, framed, validated and JSON-coded on both sides; an env served again by
``openenv-gym serve`` would pay that twice.

What it runs is what ``create_app`` was given: the app module (``server/app.py``) is read for its
``create_app(env, action_cls, observation_cls, env_name=...)`` call (or ``create_fastapi_app``),
and those arguments are evaluated in the imported module's namespace, so ``EchoEnvironment`` or
``functools.partial(Env, level=2)`` there is the same object here. A session is driven as
OpenEnv 0.10's ``/ws`` handler drives it, through OpenEnv's public API only: the factory builds
the environment in the session's own thread, its ``mcp_session()`` is held open for the session's
life (entered and left in one task of its own), ``reset``/``step`` run in that thread unless the
class overrides ``reset_async``/``step_async`` (then on the runtime loop), with the reset keys its
signature takes; the action is read by ``deserialize_action`` and the observation written by
``serialize_observation``, then made plain JSON data (a copy: nothing the environment holds is
shared with the agent). A bad action is :class:`~.ActionRejected` (``VALIDATION_ERROR``), a step
whose code raised :class:`~.StepFailed` (``EXECUTION_ERROR``), as the server answers them.

What differs from a server, and why it is opt-in: the env's code runs in this process (nothing of
a process boundary protects the caller from it), and the limits on what a server may send do not
apply to an object handed over in memory. Sessions at once: any number for a class declaring
``SUPPORTS_CONCURRENT_SESSIONS`` (``max_concurrent_envs`` bounds them if given), else one, as
OpenEnv's server allows; more are refused with ``CAPACITY_REACHED``'s error, which the adapter
waits on as it does for a server. A source whose top-level package is already loaded from another
folder is refused: two apps cannot share one name in ``sys.modules``.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import functools
import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from openenv_gym.adapters.openenv.transport import ActionRejected, StepFailed, reply_error
from openenv_gym.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    ConfigurationError,
    ProvisioningError,
    ServerError,
    TaskNotFound,
)
from openenv_gym.runtime import Deadlines, Worker

__all__ = ["AppParts", "HereChannel", "InProcessOpenEnv", "load_parts"]

_CREATORS = ("create_app", "create_fastapi_app")
_POSITIONAL = ("env", "action_cls", "observation_cls")
_CLOSE_LIMIT = 5.0  # seconds a session's teardown (MCP session exit, env.close) may take


@dataclass(eq=False)
class AppParts:
    """What an app module gave ``create_app``: the environment factory and its models (one per
    app per process, :func:`load_parts`)."""

    factory: Callable[[], Any]
    action_cls: Any  # pydantic models: their JSON schemas are the server's /schema
    observation_cls: Any
    env_name: str
    concurrent: bool
    """The class declares ``SUPPORTS_CONCURRENT_SESSIONS`` (read off an instance for a factory)."""
    live: int = 0
    """Its instances open in this process, every adapter's: one at most if not ``concurrent``."""


def _creator_call(tree: ast.AST) -> ast.Call | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in _CREATORS:
                return node
    return None


def _import(root: str, module_name: str) -> Any:
    top = module_name.split(".")[0]
    loaded = sys.modules.get(top)
    if loaded is not None:
        where = [Path(p).resolve() for p in (getattr(loaded, "__path__", None) or [getattr(loaded, "__file__", "") or ""]) if p]
        if not any(p.is_relative_to(Path(root).resolve()) for p in where):
            raise ConfigurationError(
                f"in_process=True: a package named {top!r} from another folder is already loaded in this process; "
                "this source's app cannot be imported beside it (leave in_process off to serve it in its own process)")
    sys.path.insert(0, root)  # the app's own imports (`from server.x import`) resolve under its root
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigurationError(
            f"in_process=True: importing {module_name} failed ({type(exc).__name__}: {exc})") from exc
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(root)


@functools.cache
def load_parts(root: str, app_spec: str) -> AppParts:
    """The factory and models ``create_app`` was given in the app module ``app_spec``
    (``module:attr``, importable under ``root``); imported once per process."""
    module_name = app_spec.partition(":")[0]
    module = _import(root, module_name)
    file = getattr(module, "__file__", None)
    try:
        tree = ast.parse(Path(file).read_bytes(), filename=file) if file else None
    except (OSError, SyntaxError):
        tree = None
    call = _creator_call(tree) if tree is not None else None
    if call is None:
        raise ConfigurationError(
            f"in_process=True: {module_name} has no create_app(...) call to read the environment from; "
            "leave in_process off to serve its app as it is")
    given: dict[str, ast.expr] = dict(zip(_POSITIONAL, call.args))
    given.update({k.arg: k.value for k in call.keywords if k.arg})
    missing = [k for k in _POSITIONAL if k not in given]
    if missing:
        raise ConfigurationError(f"in_process=True: the create_app call in {module_name} does not give {missing}")
    values: dict[str, Any] = {}
    for key in (*_POSITIONAL, "env_name"):
        if key in given:
            try:
                values[key] = eval(compile(ast.Expression(given[key]), file or module_name, "eval"), vars(module))
            except Exception as exc:
                raise ConfigurationError(
                    f"in_process=True: {key}= of the create_app call in {module_name} cannot be evaluated in the "
                    f"module ({type(exc).__name__}: {exc}); leave in_process off to serve its app as it is") from None
    factory = values["env"]
    if not callable(factory):
        raise ConfigurationError(f"in_process=True: the environment given to create_app in {module_name} is not callable")
    cls = factory.func if isinstance(factory, functools.partial) else factory
    if inspect.isclass(cls):
        concurrent = bool(getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False))
        default_name = cls.__name__
    else:
        probe = factory()
        try:
            concurrent = bool(getattr(probe, "SUPPORTS_CONCURRENT_SESSIONS", False))
        finally:
            probe.close()
        default_name = getattr(cls, "__name__", "environment")
    return AppParts(factory, values["action_cls"], values["observation_cls"],
                    str(values.get("env_name") or default_name), concurrent)


def _plain(value: Any) -> Any:
    """``value`` as the JSON a server's reply would carry, decoded: plain dicts, lists and scalars,
    a copy of everything (pydantic models and other types as pydantic writes them)."""
    from pydantic_core import to_jsonable_python

    return msgspec.json.decode(msgspec.json.encode(value, enc_hook=to_jsonable_python))


def _rejected(exc: Any) -> Exception:
    """A pydantic ``ValidationError`` of the action as the server's ``VALIDATION_ERROR`` reads."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    return reply_error({"message": "Invalid message", "code": "VALIDATION_ERROR", "errors": _plain(errors)}, "step")


def _at_capacity(active: int, limit: int) -> Exception:
    """The server's ``CAPACITY_REACHED`` answer to a reset."""
    return reply_error({"message": f"Server at capacity: {active}/{limit} sessions active", "code": "CAPACITY_REACHED",
                        "max_sessions": limit}, "reset")


@functools.cache
def _overrides(cls: Any, name: str) -> bool:
    """``cls`` has its own ``name`` (``reset_async``, ``step_async``): the server awaits it on its loop."""
    from openenv.core.env_server.interfaces import Environment

    return getattr(cls, name, None) is not getattr(Environment, name)


@functools.cache
def _parameters(cls: Any, name: str) -> frozenset[str] | None:
    """The keyword names method ``name`` of ``cls`` takes; ``None`` if it takes ``**kwargs``."""
    params = inspect.signature(getattr(cls, name)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(params) - {"self"}


def _accepted(env: Any, name: str, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that ``env``'s method ``name`` takes, as the server filters a reset's."""
    taken = _parameters(env.__class__, name)
    return {k: v for k, v in data.items() if k != "self" and (taken is None or k in taken)}


class InProcessOpenEnv:
    """The OpenEnv server routes the adapter asks, answered by the environment in this process.

    Args:
        parts: what the app module gave ``create_app`` (:func:`load_parts`).
        max_sessions: the most sessions at once (``max_concurrent_envs``); ``None``: no bound for
            a concurrent-safe class, one otherwise.
    """

    local = True

    def __init__(self, parts: AppParts, max_sessions: int | None = None):
        self.parts = parts
        self.url = f"in-process:{parts.env_name}"
        self.max_sessions = max_sessions if parts.concurrent else 1  # (and one in the whole process)
        self.closed = False
        self.sessions = 0
        self.deadlines = Deadlines()  # read_timeout of every session's requests, for one timer
        self._teardowns: set[asyncio.Task[None]] = set()

    def shown_url(self) -> str:
        return self.url

    async def aclose(self) -> None:
        """Mark the link closed and wait (bounded) for the sessions being torn down."""
        self.closed = True
        self.deadlines.cancel()
        if self._teardowns:
            await asyncio.wait(set(self._teardowns), timeout=_CLOSE_LIMIT)

    # -- the routes ------------------------------------------------------------------------------
    async def schema(self) -> Any:
        p = self.parts
        return _plain({"action": p.action_cls.model_json_schema(), "observation": p.observation_cls.model_json_schema(),
                       "reset_observation": p.observation_cls.model_json_schema()})

    async def metadata(self) -> Any:
        return _plain(await self._with_env(lambda env: env.get_metadata()))

    async def environments(self) -> Any:
        return [self.parts.env_name]

    async def splits(self, env: str, *, probe: bool = False) -> Any:
        try:
            return [_split(s) for s in await self._task_method(env, "list_splits")]
        except NotImplementedError:
            if probe:
                return None
            raise ConfigurationError(f"{self.parts.env_name}: list_splits is not supported by this environment") from None

    async def num_tasks(self, env: str, split: str) -> Any:
        return {"num_tasks": await self._task_method(env, "num_tasks", split)}

    async def task(self, env: str, split: str, index: int) -> Any:
        return {"task": _plain(await self._task_method(env, "get_task", split, index))}

    async def _task_method(self, env_name: str, name: str, *args: Any) -> Any:
        if env_name.lower() != self.parts.env_name.lower():
            raise ConfigurationError(f"unknown environment {env_name!r}")

        async def call(env: Any) -> Any:
            method = getattr(env, name, None)
            if not callable(method):
                raise NotImplementedError(name)
            value = method(*args)
            return await value if inspect.isawaitable(value) else value

        try:
            return await self._with_env(call)
        except NotImplementedError:
            raise
        except IndexError:
            raise TaskNotFound(f"{name}{args}: invalid task index") from None
        except Exception as exc:  # what the server answers with HTTP 500
            raise ServerError(f"{name}{args}: {type(exc).__name__}: {exc}") from None

    async def _with_env(self, use: Callable[[Any], Any]) -> Any:
        """``use`` of a fresh environment (built in a thread, as the server builds one per route), then closed."""
        env = await asyncio.to_thread(self.parts.factory)
        try:
            value = use(env)
            return await value if inspect.isawaitable(value) else value
        finally:
            await asyncio.to_thread(env.close)

    # -- sessions --------------------------------------------------------------------------------
    async def open_channel(self, on_close: Callable[[], None] | None = None) -> HereChannel:
        if self.closed:
            raise BackendUnavailable(f"the OpenEnv environment {self.url} is closed")
        return HereChannel(self, on_close)

    def _teardown(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._teardowns.add(task)
        task.add_done_callback(self._teardowns.discard)


def _split(raw: Any) -> Any:
    if hasattr(raw, "model_dump"):
        return _plain(raw)
    if isinstance(raw, str):
        return {"name": raw, "type": raw if raw in ("train", "validation", "test") else "validation"}
    return _plain(raw) if isinstance(raw, dict) else {"name": str(raw), "type": "validation"}


class HereChannel:
    """One session of the environment in this process: what one WebSocket to ``/ws`` is to a server.

    The environment is built on the first request (so a refusal for capacity comes as a
    server's does, as the answer to the reset) in the session's own thread, and its MCP session
    is held by a task of the channel's own, which also ends it: an MCP client's task scopes must
    be entered and left by one task.
    """

    def __init__(self, link: InProcessOpenEnv, on_close: Callable[[], None] | None):
        self._link = link
        self._on_close = on_close
        self._env: Any = None
        self._worker: Worker | None = None
        self._holder: asyncio.Task[None] | None = None
        self._release: asyncio.Event | None = None
        self._counted = False
        self.broken = False
        self.timed_out = False
        self.replies = 0
        self.lease: Any = None
        self.tools: Any = None
        """The MCP tools listed on this session (the adapter's cache: see ``OpenEnvAdapter.tools_of``)."""

    @property
    def usable(self) -> bool:
        return not self.broken and not self._link.closed

    async def request(self, message: dict[str, Any], what: str, timeout: float | None) -> dict[str, Any]:
        """The ``data`` of the observation a server's ``/ws`` would reply to ``message``."""
        if self.broken:
            raise BackendUnavailable(f"{what}: the session was closed after an earlier failure")
        try:
            data = await self._link.deadlines.within(self._answer(message), timeout, what, "read_timeout")
        except (ActionRejected, StepFailed):
            self.replies += 1
            raise
        except BackendTimeout:
            self.timed_out = True
            self.abort()
            raise
        except BaseException:
            self.abort()
            raise
        self.replies += 1
        return data

    async def _answer(self, message: dict[str, Any]) -> dict[str, Any]:
        from openenv.core.env_server.serialization import deserialize_action, serialize_observation
        from pydantic import ValidationError

        if self._env is None:
            await self._open()
        env, kind, data = self._env, message.get("type"), message.get("data")
        if not isinstance(data, dict):
            raise reply_error({"message": "Invalid message: data must be an object", "code": "VALIDATION_ERROR"},
                              str(kind))
        try:
            if kind == "reset":
                if _overrides(env.__class__, "reset_async"):
                    observation = await env.reset_async(**_accepted(env, "reset_async", data))
                else:
                    observation = await self._in_thread(env.reset, **_accepted(env, "reset", data))
            elif kind == "step":
                try:
                    action = deserialize_action(data, self._link.parts.action_cls)
                except ValidationError as exc:
                    raise _rejected(exc) from None
                if _overrides(env.__class__, "step_async"):
                    observation = await env.step_async(action)
                else:
                    observation = await self._in_thread(env.step, action)
            else:
                raise reply_error({"message": f"Unknown message type: {kind}", "code": "UNKNOWN_TYPE"}, str(kind))
            return _plain(serialize_observation(observation))
        except (BackendError, asyncio.CancelledError):
            raise
        except ValidationError as exc:
            raise _rejected(exc) from None
        except Exception as exc:
            raise reply_error({"message": str(exc), "code": "EXECUTION_ERROR"}, "step") from None

    async def _in_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        assert self._worker is not None
        return await self._worker.run(fn, *args, **kwargs)

    async def _open(self) -> None:
        link, parts = self._link, self._link.parts
        if not parts.concurrent and parts.live >= 1:  # the process is its server: one instance in it
            raise _at_capacity(parts.live, 1)
        if link.max_sessions is not None and link.sessions >= link.max_sessions:
            raise _at_capacity(link.sessions, link.max_sessions)
        link.sessions += 1
        parts.live += 1
        self._counted = True
        # A daemon thread: a step that never returns must not keep the process from exiting
        worker = self._worker = Worker("openenv-session")
        try:
            # Thread.start() blocks until the thread runs: from the loop, every other session
            # would wait (3 ms a start on 2 busy cores).
            await asyncio.to_thread(worker.start)
            env = await worker.run(link.parts.factory)
        except Exception as exc:
            raise ProvisioningError(f"the environment factory {getattr(link.parts.factory, '__name__', '')!r} "
                                    f"failed: {type(exc).__name__}: {exc}") from None
        self._env = env
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._release = asyncio.Event()
        self._holder = asyncio.get_running_loop().create_task(self._hold(env, opened, self._release))
        await asyncio.shield(opened)

    async def _hold(self, env: Any, opened: asyncio.Future[None], release: asyncio.Event) -> None:
        """The session's MCP session, open from the first request until the channel closes."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                factory = getattr(env, "mcp_session", None)
                if callable(factory):
                    await stack.enter_async_context(factory())
                opened.set_result(None)
                await release.wait()
        except BaseException as exc:
            if not opened.done():
                opened.set_exception(BackendUnavailable(f"the environment's MCP session failed to open: {exc}"))
            if not isinstance(exc, Exception):
                raise

    def abort(self) -> None:
        """End the session now: its MCP session and environment are closed in the background (bounded)."""
        self.broken = True
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()
        if self._counted:
            self._counted = False
            self._link.sessions -= 1
            self._link.parts.live -= 1
        env, self._env = self._env, None
        holder, self._holder = self._holder, None
        worker, self._worker = self._worker, None
        if self._release is not None:
            self._release.set()
        if env is not None or worker is not None:
            self._link._teardown(self._end(env, holder, worker))

    @staticmethod
    async def _end(env: Any, holder: asyncio.Task[None] | None, worker: Worker | None) -> None:
        try:
            async with asyncio.timeout(_CLOSE_LIMIT):
                if holder is not None:
                    await asyncio.wait([holder])
                if env is not None and worker is not None:
                    if worker.busy:  # still in a call that timed out or was cancelled: close after
                        worker.submit(env.close)  # it, if it ever returns, and do not wait for that
                    else:
                        await worker.run(env.close)
        except Exception:
            if holder is not None:
                holder.cancel()
        finally:
            if worker is not None:
                worker.shutdown()

    async def aclose(self, timeout: float = 1.0) -> None:
        """End the session (never raises)."""
        self.abort()
