"""An ors-sdk environment class run in this process, answering the ORS adapter's calls directly.

``gym.make(id, in_process=True)`` (for an id whose ``source`` is an ors-sdk ``Environment``) loads
the class here instead of serving it in a subprocess. :class:`InProcessORS` then answers the calls
the adapter makes of :class:`~openenv_gym.adapters.ors.transport.ORSTransport` (``tools``,
``create``, ``prompt``, ``call_tool``, ...) with the same wire structs, so the episode logic is the
same code either way. Why: every tool call over a local server is a loopback HTTP round trip and
an SSE stream, both sides of which cost more than most tools; an env served again by
``openenv-gym serve`` would pay that twice.

The class is driven as ors-sdk's own ``Server`` drives it, through the SDK's public surface only:
the class's ``list_tools``, ``list_splits``, ``num_tasks`` and ``get_task``; an instance's
``setup``, ``get_prompt``, ``list_task_tools`` and ``teardown``; and the ``@tool`` methods those
tool lists name (on the instance or on an instance of one of its ``toolsets``), whose pydantic
parameter model validates the input. The answers keep the server's texts: an unknown tool is
``'x' is not a valid tool``, a bad input ``Tool input validation error: ...``, a tool that raises
gives its exception's text (the server's SSE ``error`` event), a bad split or index is
:class:`~openenv_gym.errors.TaskNotFound`.

What differs from a server, and why it is opt-in: the env's code runs in this process, on the
runtime loop (as the SDK's ``Server`` runs it on its own loop: a tool that blocks holds up every
session of the loop, here every env of the process). Nothing of a process boundary protects the
caller from it, and the limits on what a server may send (``max_response_bytes``,
``max_json_depth``) do not apply to an object handed over in memory. openreward environments keep
their server: their SDK's per-session locks and terminal tools live behind private methods.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib
import inspect
import logging
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from openenv_gym.adapters.modules import exec_file
from openenv_gym.adapters.ors.transport import (
    Block,
    ListTools,
    MessageWire,
    RunToolResult,
    SplitWire,
    ToolOutput,
    ToolSpecWire,
    encode,
)
from openenv_gym.errors import BackendUnavailable, ConfigurationError, ServerError, TaskNotFound

__all__ = ["InProcessORS", "load_class"]

log = logging.getLogger(__name__)

TEARDOWN_TIMEOUT = 5.0
"""Seconds a session's async ``teardown`` may take at close before it is cancelled (a server that
hangs there is left to reap the session; here nothing else would end it)."""


@functools.cache
def load_class(root: str, module_file: str, class_name: str) -> type:
    """The class ``class_name`` of ``module_file`` under ``root``, imported once per process.

    A file inside packages (``__init__.py`` all the way down) is imported by its dotted name, so
    that its relative imports work; a loose file under a name of its own (two sources may both
    have an ``env.py``). Either way the source's folder is on ``sys.path`` while it is imported,
    for its imports of its own modules, and taken off again after.
    """
    base = Path(root)
    parts = Path(module_file).with_suffix("").parts
    in_package = len(parts) > 1 and all((base.joinpath(*parts[:i]) / "__init__.py").exists() for i in range(1, len(parts)))
    path = (base / module_file).resolve()
    folder = str(base if in_package else path.parent)
    sys.path.insert(0, folder)
    try:
        if in_package:
            module = importlib.import_module(".".join(parts))
        else:
            name = f"_openenv_gym_source_{parts[-1]}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
            module = sys.modules.get(name) or exec_file(name, path, what="ORS source")
    finally:
        sys.path.remove(folder)
    found = getattr(module, class_name, None)
    if not isinstance(found, type):
        raise ConfigurationError(f"{module_file} defines no class {class_name!r}")
    return found


def _json_copy(value: Any, what: str) -> Any:
    """``value`` as JSON would carry it (a fresh copy; lists for tuples); :class:`NotJSON` if it cannot be."""
    return msgspec.json.decode(encode(value, what))


def _blocks(blocks: Any) -> list[Block]:
    return [Block(type=b.type, text=getattr(b, "text", None), data=getattr(b, "data", None),
                  mimeType=getattr(b, "mimeType", None)) for b in blocks]


def _tool_list(listed: Any) -> list[ToolSpecWire]:
    return [ToolSpecWire(t.name, t.description, msgspec.to_builtins(t.input_schema) if t.input_schema else None)
            for t in listed.tools]


class _Tool(typing.NamedTuple):
    """A ``@tool`` method as the server calls it: bound, with its parameter model (or none)."""

    fn: Callable[..., Any]
    model: type | None


def _tool(fn: Callable[..., Any], output: type, model_base: type) -> _Tool | None:
    """``fn`` with the pydantic model of its one parameter, or ``None`` if it is not a tool by the
    SDK's rule (no parameter, or one pydantic model; annotated to return ``ToolOutput``)."""
    function = getattr(fn, "__func__", None)
    is_tool, model = _shape(fn if function is None else function, function is not None, output, model_base)
    return _Tool(fn, model) if is_tool else None


@functools.lru_cache(maxsize=1024)
def _shape(function: Callable[..., Any], bound: bool, output: type, model_base: type) -> tuple[bool, type | None]:
    """Whether a function is a tool, and its parameter model (``None``: it takes none); read once
    per function (``get_type_hints`` costs more than the call itself).

    The parameters are the SDK's: those of the unwrapped function without one named ``self``; a
    method that no decorator wrapped is read bound, without its first parameter whatever its name.
    """
    real = inspect.unwrap(function)
    try:
        params = list(inspect.signature(real).parameters.values())
        hints = typing.get_type_hints(real, include_extras=True)
    except (TypeError, ValueError, NameError):
        return False, None
    if bound and real is function and params:
        params = params[1:]
    params = [p for p in params if p.name != "self"]
    if hints.get("return") is not output or len(params) > 1:
        return False, None
    if not params:
        return True, None
    model = hints.get(params[0].name)
    return (True, model) if isinstance(model, type) and issubclass(model, model_base) else (False, None)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class _Session:
    """One live environment instance and the tools its session may call."""

    __slots__ = ("env", "tools", "toolsets")

    def __init__(self, env: Any):
        self.env = env
        self.tools: dict[str, _Tool] | None = None  # found when first listed or called
        self.toolsets: list[Any] | None = None


class InProcessORS:
    """The ORS calls of :class:`~openenv_gym.adapters.ors.adapter.ORSAdapter`, answered by ``env_class`` here.

    One instance per adapter; sessions are instances of the class, keyed by the adapter's session
    id. :meth:`aclose` tears down the ones still open.
    """

    def __init__(self, env_class: type):
        import ors  # the extra that ors sources need; imported only when one runs here

        if not (isinstance(env_class, type) and issubclass(env_class, ors.Environment)):
            raise ConfigurationError(
                f"in_process=True runs ors-sdk environments (subclasses of ors.Environment); {env_class.__name__} "
                "is not one: leave in_process off to serve it in its own process")
        from pydantic import BaseModel, ValidationError

        self.env_class = env_class
        self._model_base = BaseModel
        self.url = f"in-process:{env_class.__name__}"
        self.closed = False
        self._output_type = ors.ToolOutput
        self._invalid = ValidationError
        self._sessions: dict[str, _Session] = {}
        self._name = env_class.name().lower()

    async def aclose(self) -> None:
        self.closed = True
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await self._teardown(session, TEARDOWN_TIMEOUT)

    # -- the class -----------------------------------------------------------------------------
    async def environments(self) -> list[str]:
        return [self._name]

    async def is_openreward(self) -> bool:
        return False

    async def tools(self, env: str) -> ListTools:
        return ListTools(_tool_list(self.env_class.list_tools()))

    async def splits(self, env: str) -> list[SplitWire | str]:
        return [s if isinstance(s, str) else SplitWire(s.name, s.type) for s in self.env_class.list_splits()]

    def _check_split(self, split: str) -> None:
        names = [s if isinstance(s, str) else s.name for s in self.env_class.list_splits()]
        if split not in names:
            raise TaskNotFound(f"Invalid split {split!r}; the environment has {names}")

    async def num_tasks(self, env: str, split: str) -> int:
        self._check_split(split)
        return int(await self.env_class.num_tasks(split))

    async def task(self, env: str, split: str, index: int) -> dict[str, Any]:
        self._check_split(split)
        try:
            task = await self.env_class.get_task(split, index)
        except IndexError:
            raise TaskNotFound(f"Invalid index {index} of split {split!r}") from None
        return _json_copy(task, "a task")

    # -- sessions ------------------------------------------------------------------------------
    async def create(self, sid: str, body: dict[str, Any], headers: dict[str, str] | None) -> None:
        """Make the session's instance and run its ``setup`` (a failure is a :class:`ServerError`)."""
        self._check_open()
        spec = body.get("task_spec")
        # A copy, as the JSON a server would have read: the env must not share (or change) the caller's.
        spec = _json_copy(spec, "the task spec") if spec is not None else await self.task(
            self._name, body["split"], body["index"])
        try:
            env = self.env_class(task_spec=spec, secrets=dict(body.get("secrets") or {}))
            await _maybe_await(env.setup())
        except Exception as exc:
            raise ServerError(f"the environment's setup failed: {type(exc).__name__}: {exc}") from exc
        self._sessions[sid] = _Session(env)

    def _session(self, sid: str) -> _Session:
        self._check_open()
        session = self._sessions.get(sid)
        if session is None:
            raise BackendUnavailable(f"the session {sid} is not open in {self.url}")
        return session

    async def prompt(self, env: str, sid: str) -> list[Block]:
        session = self._session(sid)
        try:
            return _blocks(await _maybe_await(session.env.get_prompt()))
        except Exception as exc:
            raise ServerError(f"the environment's get_prompt failed: {type(exc).__name__}: {exc}") from exc

    async def messages(self, env: str, sid: str) -> list[MessageWire]:
        raise ConfigurationError("an ors-sdk environment has no /messages (an openreward route)")

    async def task_tools(self, env: str, sid: str) -> ListTools:
        """The session's tools: the class's and the instance's task tools (as ``/task_tools`` lists them)."""
        return ListTools(self._listed(self._session(sid)))

    def _listed(self, session: _Session) -> list[ToolSpecWire]:
        try:
            task_tools = session.env.list_task_tools()
        except Exception as exc:
            raise ServerError(f"the environment's list_task_tools failed: {type(exc).__name__}: {exc}") from exc
        listed = [*_tool_list(self.env_class.list_tools()), *_tool_list(task_tools)]
        session.tools = {spec.name: tool for spec in listed if (tool := self._find(session, spec.name)) is not None}
        return listed

    def _find(self, session: _Session, name: str) -> _Tool | None:
        """The method behind a listed tool: the instance's own, else the first toolset's that has it."""
        fn = getattr(session.env, name, None)
        if not callable(fn):
            if session.toolsets is None:
                session.toolsets = []
                for toolset in getattr(self.env_class, "toolsets", ()) or ():
                    try:
                        session.toolsets.append(toolset(session.env))
                    except TypeError:
                        session.toolsets.append(toolset())
            fn = next((f for t in session.toolsets if callable(f := getattr(t, name, None))), None)
        return _tool(fn, self._output_type, self._model_base) if fn is not None else None

    async def call_tool(self, env: str, sid: str, name: str, arguments: dict[str, Any] | None, *,
                        resume_attempts: int = 0) -> RunToolResult | str:
        """Run a tool; returns its result, or the text of the error a server would stream."""
        session = self._session(sid)
        if session.tools is None:
            self._listed(session)
        assert session.tools is not None
        tool = session.tools.get(name)
        if tool is None:
            return RunToolResult(ok=False, error=f"{name!r} is not a valid tool")
        try:
            if tool.model is None:
                out = await _maybe_await(tool.fn())
            else:
                try:
                    model_input = tool.model(**(arguments or {}))
                except self._invalid as exc:
                    return RunToolResult(ok=False, error=f"Tool input validation error: {exc.errors()}")
                out = await _maybe_await(tool.fn(model_input))
        except Exception as exc:  # noqa: BLE001 - the tool's failure is the episode's to see, as over a server
            return str(exc)
        if not isinstance(out, self._output_type):
            return f"{name!r} returned {type(out).__name__}; expected ToolOutput"
        metadata = out.metadata
        return RunToolResult(ok=True, output=ToolOutput(
            _blocks(out.blocks), msgspec.to_builtins(metadata) if metadata is not None else None,
            None if out.reward is None else float(out.reward), bool(out.finished)))

    async def delete_session(self, sid: str, timeout: float) -> None:
        session = self._sessions.pop(sid, None)
        if session is not None:
            await self._teardown(session, timeout)

    async def ping(self, sid: str) -> None:
        """Nothing to keep alive: a session here lives until it is deleted."""

    async def _teardown(self, session: _Session, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                await _maybe_await(session.env.teardown())
        except Exception as exc:  # noqa: BLE001 - as the SDK server does: the episode is over, say so in the log
            log.warning("teardown of %s failed: %s: %s", self.env_class.__name__, type(exc).__name__, exc)

    def _check_open(self) -> None:
        if self.closed:
            raise BackendUnavailable(f"{self.url} is closed")
