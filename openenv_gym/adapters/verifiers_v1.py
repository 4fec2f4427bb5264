"""Verifiers v1 tasksets as Gymnasium episodes, with the library's own agent loop (inverted control).

A Verifiers v1 environment (``verifiers.v1``, 0.2-0.4) is a ``vf.Taskset`` of ``vf.Task`` objects,
played by a *harness* program (``null``, ``bash``, ...) that runs in a *runtime* (a subprocess
here) and calls "the model" over HTTP through the library's interception server; the library
records every call in a ``vf.Trace`` and scores it with the task's ``@vf.reward`` functions. There
is no ``env.step`` to call: the library owns the loop (reference/verifiers.md §2a).

So this adapter turns the loop inside out. Each episode runs ``vf.Agent(...).run(task)`` as an
asyncio task on the package's runtime loop; every model call the harness makes is parked on a
queue and becomes an **observation**, and the agent's **action** is the answer to that call
(an OpenAI ``chat.completion``, or its SSE form, since the bundled chat programs stream).
Everything else stays the library's: limits, ``@stop`` hooks, interceptors, tool servers,
timeouts, error capture, scoring. The reward is the trace's reward, at the last step.

How the answer reaches the library (``transport``):

* ``"inject"`` (default when available): a subclass of the library's ``InterceptionServer`` whose
  ``_client(config)`` returns our queue-backed ``vf.Client`` (``get_response`` for buffered calls,
  ``relay`` for streamed ones). No extra HTTP hop, and the same code ran on 0.3.1 and 0.4.0.
  It depends on **private** names: ``verifiers.v1.interception.InterceptionServer._client``
  (and ``verifiers.v1.clients.client.RelayReply``); pin ``verifiers``.
* ``"http"``: no private hook: a small OpenAI-compatible server on 127.0.0.1 (JSON and SSE),
  named by ``AgentConfig.client = vf.EvalClientConfig(base_url=...)``; calls are routed by the
  ``X-Session-ID`` header (the trace id) that the library's eval client sends. Chosen
  automatically when ``_client`` is missing, or on request.

Both share one interception server (and one policy client) per adapter: the library multiplexes
many rollouts on one server, and each call names its rollout (the trace id), which is how the
answer reaches the right episode of a vector env.

Things a user must know (also in the class docstring):

* Policy time counts against the library's timeouts: ``TimeoutConfig.rollout`` (agent stage)
  runs while the harness waits for the model, i.e. for *your* ``step()``.
* The first reset can take seconds: ``uv sync --script`` of the harness program (fetched from
  PyPI once, then cached by uv), plus a ``python -m <toolset module>`` per tool server.
* ``uv`` must be on ``PATH``; if it is not but sits next to ``sys.executable`` (a venv's
  ``bin``), that directory is prepended to ``PATH`` of this process (the subprocess runtime
  passes ``os.environ`` on, minus variables containing ``API_KEY``).
* ``source=`` puts the package's parent directory on ``sys.path`` and, absolute, on
  ``PYTHONPATH`` (tool servers are spawned as ``python -m <module>``).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import sys
import time
import tomllib
import typing
from pathlib import Path
from typing import Any

from openenv_gym.actions import ParsedCall, Turn, check_call, tool_message, user_message
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    ServerError,
    SourceNotFound,
    TaskNotFound,
)
from openenv_gym.wire import Message, Opening, Outcome, Split, TaskRef, ToolSpec

__all__ = ["VerifiersV1Adapter", "VerifiersV1Episode", "check_source_compat"]

logger = logging.getLogger(__name__)

MIN_VERSION = "0.2"
"""The first release whose ``verifiers.v1`` has the Taskset/Agent/interception shape used here."""

REQUIRED_NAMES = (
    "Agent", "AgentConfig", "SubprocessConfig", "EvalClientConfig", "Taskset", "Task",
    "resolve_env_config", "load_environment", "default_harness_id",
)
"""Public ``verifiers.v1`` names the adapter itself uses; missing ones mean an incompatible v1."""

LIMIT_STOPS = frozenset({
    "max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "context_length",
    "compaction_failed",
})
"""Stop conditions that are limits (-> ``truncated``), besides ``<stage>_timeout``."""

_SPLIT_TYPES = {"train": "train", "test": "test", "validation": "validation", "val": "validation",
                "valid": "validation", "dev": "validation", "eval": "test"}

_POLICY_KEY_VAR = "OPENENV_GYM_V1_POLICY_KEY"
"""The env var the library reads for the endpoint's key: never set; the policy needs none, and a
non-Prime name keeps the library from consulting the Prime CLI config."""

_completion_ids = itertools.count(1)


# -- importing verifiers.v1 and gating on its version ------------------------------------------

def _import_v1() -> Any:
    """``verifiers.v1``, or a ConfigurationError saying what to install."""
    try:
        import verifiers
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ConfigurationError(
            "Verifiers v1 tasksets need the `verifiers` package with its v1 API "
            f"(verifiers>={MIN_VERSION}; 0.4.x is v1 only): pip install 'verifiers>=0.4' "
            f"({type(exc).__name__}: {exc})"
        ) from None
    version = getattr(verifiers, "__version__", "?")
    missing = [n for n in REQUIRED_NAMES if not hasattr(vf, n)]
    if missing:
        raise ConfigurationError(
            f"the installed verifiers {version} has an older, incompatible verifiers.v1 "
            f"(it lacks {', '.join(missing)}); install verifiers>={MIN_VERSION}, e.g. "
            "pip install -U 'verifiers>=0.4'"
        )
    return vf


def _installed_version() -> str:
    import verifiers

    return str(getattr(verifiers, "__version__", "?"))


def _v1_references(tree: ast.AST) -> dict[str, set[str]]:
    """``{module: {names}}`` a module takes from ``verifiers.v1`` (and its submodules).

    Resolves ``import verifiers.v1 as vf`` + ``vf.X``, ``from verifiers import v1`` + ``v1.X``,
    ``import verifiers.v1`` + ``verifiers.v1.X`` and ``from verifiers.v1[.sub] import X``.
    """
    refs: dict[str, set[str]] = {}
    aliases: dict[str, str] = {}  # local name -> module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "verifiers.v1" or a.name.startswith("verifiers.v1."):
                    if a.asname:
                        aliases[a.asname] = a.name
                    refs.setdefault(a.name, set())
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "verifiers":
                for a in node.names:
                    if a.name == "v1":
                        aliases[a.asname or "v1"] = "verifiers.v1"
            elif node.module == "verifiers.v1" or node.module.startswith("verifiers.v1."):
                refs.setdefault(node.module, set()).update(a.name for a in node.names if a.name != "*")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in aliases:
            refs.setdefault(aliases[value.id], set()).add(node.attr)
        elif (isinstance(value, ast.Attribute) and value.attr == "v1" and isinstance(value.value, ast.Name)
              and value.value.id == "verifiers"):
            refs.setdefault("verifiers.v1", set()).add(node.attr)
    return refs


def _source_files(root: Path, limit: int = 400) -> list[Path]:
    if root.is_file():
        return [root]
    skip = {".git", ".venv", "venv", "__pycache__", "node_modules", "build", "dist", ".tox"}
    files = []
    for path in sorted(root.rglob("*.py")):
        if not skip.intersection(path.relative_to(root).parts):
            files.append(path)
            if len(files) >= limit:
                break
    return files


def _required_spec(root: Path) -> str | None:
    """The ``verifiers`` requirement of the source's ``pyproject.toml`` (package dir or its parent)."""
    base = root if root.is_dir() else root.parent
    for candidate in (base / "pyproject.toml", base.parent / "pyproject.toml"):
        if not candidate.is_file():
            continue
        try:
            data = tomllib.loads(candidate.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            return None
        for dep in data.get("project", {}).get("dependencies", []) or []:
            if isinstance(dep, str) and dep.replace("_", "-").lower().split("[")[0].strip().startswith("verifiers"):
                return dep
        return None
    return None


def check_source_compat(source: str | os.PathLike, vf: Any | None = None) -> None:
    """Raise ConfigurationError when ``source`` needs a newer ``verifiers`` than the installed one.

    Static, never runs the source: its ``pyproject.toml`` requirement on ``verifiers`` (when
    ``packaging`` is importable) and every ``verifiers.v1`` name its modules use.
    """
    import importlib

    vf = vf if vf is not None else _import_v1()
    root = Path(source)
    version = _installed_version()
    spec = _required_spec(root)
    if spec is not None:
        try:
            from packaging.requirements import Requirement
            from packaging.version import Version

            req = Requirement(spec)
            if req.name.replace("_", "-").lower() == "verifiers" and req.specifier and \
                    not req.specifier.contains(Version(version), prereleases=True):
                raise ConfigurationError(
                    f"{root.name} requires {spec!r} but verifiers {version} is installed: "
                    f"pip install '{req.name}{req.specifier}'"
                )
        except ImportError:
            pass
        except ValueError as exc:  # an unparsable requirement or version: names decide below
            if isinstance(exc, ConfigurationError):
                raise
    missing: dict[str, set[str]] = {}
    for path in _source_files(root):
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for module_name, names in _v1_references(tree).items():
            try:
                module = vf if module_name == "verifiers.v1" else importlib.import_module(module_name)
            except ImportError:
                missing.setdefault(module_name, set()).add("(module)")
                continue
            for name in names:
                if not hasattr(module, name):
                    try:  # a submodule not imported by its package
                        importlib.import_module(f"{module_name}.{name}")
                    except ImportError:
                        missing.setdefault(module_name, set()).add(name)
    if missing:
        listed = "; ".join(f"{m}: {', '.join(sorted(n))}" for m, n in sorted(missing.items()))
        raise ConfigurationError(
            f"{root.name} uses Verifiers v1 names that the installed verifiers {version} lacks "
            f"({listed}); it needs a newer verifiers: pip install -U verifiers"
        )


def _translate_load_error(exc: BaseException, env_id: str) -> BaseException:
    """A ConfigurationError for a taskset that cannot be loaded, keeping the library's message."""
    message = f"{type(exc).__name__}: {exc}"
    missing_module = getattr(exc, "name", None) or ""
    if (isinstance(exc, ModuleNotFoundError) and missing_module.startswith("verifiers")) or (
            isinstance(exc, (AttributeError, ImportError)) and not isinstance(exc, ModuleNotFoundError)
            and "verifiers" in str(exc)):
        return ConfigurationError(
            f"taskset {env_id!r} needs a newer verifiers than the installed {_installed_version()} "
            f"({message}); pip install -U verifiers"
        )
    if isinstance(exc, ModuleNotFoundError):
        return ConfigurationError(
            f"taskset {env_id!r} cannot be imported ({message}); install its package, or pass "
            "source= (the package folder)"
        )
    if isinstance(exc, (AttributeError, TypeError, ValueError)):
        return ConfigurationError(f"taskset {env_id!r} cannot be loaded: {message}")
    return exc


# -- model calls: the queue between the library and the agent --------------------------------

class _Call:
    """One model call the harness made: its native request body, and the answer it awaits."""

    __slots__ = ("body", "future")

    def __init__(self, body: dict[str, Any], future: asyncio.Future[dict[str, Any]]):
        self.body = body
        self.future = future


class _Policy:
    """Routes the library's model calls to the episode whose rollout made them (by trace id)."""

    def __init__(self) -> None:
        self.routes: dict[str, VerifiersV1Episode] = {}

    async def answer(self, body: dict[str, Any], session_id: str | None) -> dict[str, Any]:
        """Park the call on its episode and return the agent's answer (a chat.completion dict)."""
        episode = self.routes.get(session_id or "")
        if episode is None:
            from verifiers.v1.errors import model_error

            # 409, not 5xx: the harness SDK must not retry a call whose episode is gone.
            raise model_error(f"no live openenv_gym episode for rollout {session_id!r}", status_code=409)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        episode._calls.put_nowait(_Call(body, future))
        return await future


def _chat_only(dialect: Any) -> None:
    if "/v1/chat/completions" not in getattr(dialect, "routes", ()):
        from verifiers.v1.errors import model_error

        raise model_error(
            f"openenv_gym answers only the chat-completions dialect; this harness speaks "
            f"{type(dialect).__name__} (use a chat harness such as null or bash)", status_code=400)


def _make_client_class() -> type:
    """The queue-backed ``vf.Client`` (built lazily: importing this module never imports verifiers)."""
    from verifiers.v1.clients import Client
    from verifiers.v1.clients.client import RelayReply

    class QueueClient(Client):
        """A model client whose every completion is the agent's next action."""

        def __init__(self, policy: _Policy):
            self.policy = policy

        async def get_response(self, dialect: Any, body: dict, sampling: Any, session_id: str | None = None,
                               turn: Any = None, headers: Any = None) -> Any:
            _chat_only(dialect)
            raw = await self.policy.answer(body, session_id)
            response = dialect.parse_response(dialect.validate_response(raw))
            response.raw = raw  # the interception server serializes this back to the harness
            return response

        async def relay(self, dialect: Any, body: dict, session_id: str | None = None,
                        headers: Any = None) -> Any:
            _chat_only(dialect)
            raw = await self.policy.answer(body, session_id)
            events = dialect.stream_events(raw)

            async def chunks() -> Any:
                for event in events:
                    yield event

            async def close() -> None:
                return None

            return RelayReply("text/event-stream", chunks(), close)

    return QueueClient


def _make_interception_class() -> type:
    from verifiers.v1.interception import InterceptionServer

    class InjectedInterception(InterceptionServer):
        """The library's interception server, with our client for every rollout it serves."""

        def __init__(self, client: Any, **kwargs: Any):
            super().__init__(**kwargs)
            self._injected = client

        def _client(self, config: Any) -> Any:  # private hook of InterceptionServer (0.3.x, 0.4.x)
            return self._injected

    return InjectedInterception


def _has_client_hook() -> bool:
    try:
        from verifiers.v1.interception import InterceptionServer
        from verifiers.v1.clients.client import RelayReply  # noqa: F401
    except ImportError:
        return False
    return callable(getattr(InterceptionServer, "_client", None))


class _PolicyHTTPServer:
    """The ``transport="http"`` path: an OpenAI-compatible endpoint on 127.0.0.1 (JSON and SSE)."""

    def __init__(self, policy: _Policy):
        self.policy = policy
        self.runner: Any = None
        self.base_url = ""

    async def start(self) -> None:
        from aiohttp import web
        from verifiers.v1.dialects.chat import ChatDialect

        dialect = ChatDialect()

        async def completions(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            try:
                raw = await self.policy.answer(body, request.headers.get("X-Session-ID"))
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
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()


# -- conversions ---------------------------------------------------------------------------------

def _tool_specs(raw: Any) -> list[ToolSpec]:
    specs = []
    for tool in raw or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name"):
            specs.append(ToolSpec(name=fn["name"], description=fn.get("description") or "",
                                  parameters=fn.get("parameters")))
    return specs


def _arguments(call: ParsedCall) -> str:
    """The arguments as the agent wrote them when it wrote a string (even invalid JSON: the
    harness answers that in its own words, and the trace records what the agent did)."""
    raw = getattr(call, "raw_arguments", None)
    return raw if raw is not None else json.dumps(call.arguments or {})


def _completion(text: str | None, calls: list[ParsedCall], model: Any) -> dict[str, Any]:
    """The agent's message as an OpenAI ``chat.completion`` (what a provider would have returned).

    Usage is reported as zero: the library's token budgets (``max_*_tokens``) therefore never
    fire for an external policy; use ``max_turns`` or the env's own turn limit instead.
    """
    message: dict[str, Any] = {"role": "assistant", "content": text if (text or not calls) else None}
    if text is None and not calls:
        message["content"] = ""
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c)}}
            for c in calls
        ]
    return {
        "id": f"chatcmpl-openenv-{next(_completion_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or "openenv-gym-policy",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _split_values(config: Any) -> tuple[list[str], str | None]:
    """(the split names a taskset config offers, the config's own split) from a ``split`` field."""
    fields = getattr(type(config), "model_fields", {})
    field = fields.get("split")
    if field is None:
        return [], None
    current = getattr(config, "split", None)
    annotation = field.annotation
    values: list[str] = []
    if typing.get_origin(annotation) is typing.Literal:
        values = [str(v) for v in typing.get_args(annotation)]
    elif current is not None:
        values = [str(current)]
    return values, (str(current) if current is not None else None)


def _runtime_config(vf: Any, runtime: Any) -> Any:
    if runtime is None or runtime == "subprocess":
        return vf.SubprocessConfig()
    if isinstance(runtime, str):
        if runtime == "docker":
            return vf.DockerConfig()
        raise ConfigurationError(
            f"runtime {runtime!r} is not supported here; use 'subprocess', 'docker', a dict "
            "{'type': ...} or a verifiers RuntimeConfig")
    if isinstance(runtime, dict):
        return vf.AgentConfig.model_validate({"runtime": runtime}).runtime
    return runtime  # a RuntimeConfig instance


def _ensure_uv() -> str | None:
    """Make ``uv`` findable for the runtime; returns the directory prepended to PATH, if any."""
    if shutil.which("uv"):
        return None
    bindir = Path(sys.executable).parent
    if (bindir / "uv").exists():
        os.environ["PATH"] = str(bindir) + os.pathsep + os.environ.get("PATH", "")
        return str(bindir)
    if (Path.home() / ".local" / "bin" / "uv").exists():
        return None  # where the library installs uv, and looks first (its setup prepends it to PATH)
    logger.warning("uv is not on PATH nor next to %s: the Verifiers runtime will try to install it "
                   "(pip --user, then astral.sh), which needs network; `pip install uv` avoids that",
                   sys.executable)
    return None


def _resolve_source(source: Path) -> tuple[Path, str]:
    """(the directory to import from, the taskset module name) for a source path.

    Accepts a package folder (``my_env/__init__.py``), a module file (``my_env.py``), or a
    project folder holding either under its own name (``my-env/my_env.py``,
    ``my-env/my_env/__init__.py``: the layout of ``prime env init`` projects).
    """
    source = source.resolve()
    if source.is_file():
        return source.parent, source.stem
    if (source / "__init__.py").is_file():
        return source.parent, source.name
    name = source.name.replace("-", "_")
    if (source / f"{name}.py").is_file() or (source / name / "__init__.py").is_file():
        return source, name
    raise ConfigurationError(
        f"cannot tell the taskset module in {str(source)!r}: expected a package (__init__.py), "
        f"{name}.py or {name}/__init__.py; or pass the module's path as source=")


def _add_import_root(parent: Path) -> None:
    """Make a source importable here and in the runtime's children (absolute PYTHONPATH)."""
    root = str(parent.resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in current:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *current])


def _library_exit(exc: BaseException) -> BaseException:
    """A library ``SystemExit`` (e.g. "not authenticated with prime") as an ordinary error.

    Raised inside a task on the shared runtime loop, a ``SystemExit`` would stop the loop
    itself and hang every env of the process.
    """
    return ConfigurationError(f"the Verifiers library exited: {exc}" if str(exc) else "the Verifiers library exited")


def _guarded(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _library_exit(exc) from None


async def _guarded_async(coro: Any) -> Any:
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _library_exit(exc) from None


@contextlib.asynccontextmanager
async def _no_shared() -> Any:
    yield {}


# -- the adapter -----------------------------------------------------------------------------------

class _SplitTasks:
    """One split's taskset and its materialized tasks."""

    def __init__(self, taskset: Any):
        self.taskset = taskset
        self.tasks: list[Any] | None = None


class VerifiersV1Adapter(Adapter):
    """A Verifiers v1 taskset, played with the library's own agent loop (inverted control).

    Each episode is ``vf.Agent(config).run(task)`` on the runtime loop. The observation at reset
    is the messages of the harness's first model request (``info["tools"]``: its ``tools``,
    ``info["trace_id"]``: the library's trace); each action answers the pending request, and the
    next observation is what the harness appended since (tool results, ...). At the end the
    reward is ``trace.reward`` (never ``None``), ``info`` holds ``rewards``, ``reward_weights``,
    ``metrics``, ``stop_condition``, ``num_turns``, ``ok`` and, when the trace failed, ``error``;
    ``terminated`` on a clean end (``agent_completed`` or a task ``@stop``), ``truncated`` on a
    limit (``max_turns``, token limits, ``context_length``, ``<stage>_timeout``) or a failure.

    Args:
        env_id: the taskset id as ``vf.resolve_env_config({"taskset": {"id": ...}})`` takes it
            (``owner/name@ver`` or a module name). Default: the name of ``source``.
        source: a taskset package folder, a module file, or a project folder holding
            ``<name>.py`` / ``<name>/__init__.py``: the directory it is imported from goes on
            ``sys.path`` and, absolute, on ``PYTHONPATH`` (tool servers run as
            ``python -m <module>``). Checked statically first: a source that uses
            ``verifiers.v1`` names the installed release lacks, or whose ``pyproject.toml``
            requires a newer ``verifiers``, is refused with a ConfigurationError.
        env_args: taskset config knobs (``--env.taskset.*``). A ``split`` knob typed as a
            ``Literal`` makes one split per value; without one there is a single ``train`` split.
        harness: harness id or config dict (``{"id": "bash", ...}``). Default: the harness the
            taskset package exports, else ``null`` (a plain chat loop that runs MCP tools).
        max_turns: the library's own turn limit (``AgentConfig.max_turns``): the rollout stops
            with ``stop_condition="max_turns"``, scored on the partial trace (-> truncated).
        timeouts: ``vf.TimeoutConfig`` fields in seconds: ``setup``, ``rollout``, ``finalize``,
            ``scoring``. **They count policy time**: the ``rollout`` (agent) stage starts with
            the harness program and runs while it waits for the model, i.e. for your
            ``step()``; a slow trainer ends the rollout: truncated, scored on what it did
            (verifiers 0.4 stops it as ``agent_timeout``; 0.3 records it as an error in
            ``info["error"]``). Unset stages take the task's own ``TaskData.timeout``, else no
            limit. Note ``AgentEnv(timeout=...)`` separately bounds one reset/step call.
        runtime: ``"subprocess"`` (default; the harness runs as a child process of this one),
            ``"docker"``, a dict ``{"type": ...}`` or a verifiers ``RuntimeConfig``.
        model: the model name the library records on traces.
        max_tasks: read at most this many tasks per split (required for infinite tasksets).
        transport: ``"auto"`` (``"inject"`` when the private ``InterceptionServer._client`` hook
            exists, else ``"http"``), ``"inject"`` or ``"http"``: see the module docstring.
        bad_arguments: tool calls whose arguments are not a JSON object: ``"forward"`` (default)
            sends them to the harness as written (the bundled chat programs answer them with an
            ``error: invalid JSON ...`` tool result and go on; unknown tools likewise), or
            ``"answer"``: the adapter answers them with a tool message and never forwards them
            (for a harness that would crash on them).

    Notes: the first reset may take seconds (``uv sync --script`` of the harness, cached after;
    each per-rollout tool server adds a ``python -m`` start). ``uv`` is looked up on ``PATH``,
    then next to ``sys.executable`` (that directory is then prepended to ``PATH``). The library's
    subprocess runtime drops every environment variable containing ``API_KEY`` from what the
    harness sees. Only the chat-completions dialect is answered (``null``, ``bash`` and other
    chat harnesses); multi-agent ``Env`` classes are refused. The answers report zero token
    usage, so the library's token budgets (``max_*_tokens``) never fire. Several model calls in
    flight at once (a harness with sub-agents) are served in arrival order, one per step.
    """

    kind = "verifiers-v1"

    def __init__(
        self,
        *,
        env_id: str | None = None,
        source: str | os.PathLike | None = None,
        env_args: dict[str, Any] | None = None,
        harness: str | dict[str, Any] | None = None,
        max_turns: int | None = None,
        timeouts: dict[str, float | None] | None = None,
        runtime: Any = "subprocess",
        model: str = "openenv-gym-policy",
        max_tasks: int | None = None,
        transport: str = "auto",
        bad_arguments: str = "forward",
    ):
        super().__init__()
        if env_id is None and source is None:
            raise ConfigurationError("VerifiersV1Adapter needs env_id (a taskset id) or source (its folder)")
        if max_turns is not None and max_turns < 1:
            raise ConfigurationError("max_turns must be a positive integer or None")
        if max_tasks is not None and max_tasks < 1:
            raise ConfigurationError("max_tasks must be a positive integer or None")
        if transport not in ("auto", "inject", "http"):
            raise ConfigurationError("transport must be 'auto', 'inject' or 'http'")
        if bad_arguments not in ("forward", "answer"):
            raise ConfigurationError("bad_arguments must be 'forward' or 'answer'")
        unknown = set(timeouts or {}) - {"setup", "rollout", "finalize", "scoring"}
        if unknown:
            raise ConfigurationError(
                f"unknown timeout stage(s) {sorted(unknown)}; use setup, rollout, finalize, scoring")
        self.source = Path(source).expanduser() if source is not None else None
        self._import_root: Path | None = None
        module = None
        if self.source is not None:
            if not self.source.exists():
                raise SourceNotFound(f"taskset source {str(self.source)!r} does not exist")
            self._import_root, module = _resolve_source(self.source)
        self.env_id = env_id or module or ""
        self.env_args = dict(env_args or {})
        self.harness = harness
        self.max_turns = max_turns
        self.timeouts = dict(timeouts or {})
        self.runtime_spec = runtime
        self.model = model
        self.max_tasks = max_tasks
        self.transport = transport
        self.bad_arguments = bad_arguments
        self.uv_path_added: str | None = None
        self._vf: Any = None
        self._env: Any = None
        self._splits_tasks: dict[str, _SplitTasks] = {}
        self._split_names: list[str] = []
        self._agent: Any = None
        self._shared: dict[str, Any] = {}
        self._policy = _Policy()
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._episodes: set[VerifiersV1Episode] = set()
        self._started = False
        self._closed = False
        self.harness_id: str | None = None
        self.transport_used: str | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        if self._closed:
            raise ConfigurationError("the adapter is closed")
        # Importing verifiers.v1 takes seconds and the taskset is user code: keep both off the
        # runtime loop, which other envs share.
        await asyncio.to_thread(_guarded, self._load)
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._stop = asyncio.Event()
        self._owner = loop.create_task(self._serve(ready), name=f"verifiers-v1 {self.env_id}")
        try:
            await ready
        except BaseException:
            self._stop.set()
            await asyncio.gather(self._owner, return_exceptions=True)
            raise
        self._started = True

    def _load(self) -> None:
        vf = self._vf = _import_v1()
        self.uv_path_added = _ensure_uv()
        if self.source is not None and self._import_root is not None:
            check_source_compat(self.source.resolve(), vf)
            _add_import_root(self._import_root)
        config_data: dict[str, Any] = {"taskset": {"id": self.env_id, **self.env_args}}
        try:
            env = vf.load_environment(vf.resolve_env_config(config_data))
        except ConfigurationError:
            raise
        except Exception as exc:
            raise _translate_load_error(exc, self.env_id) from exc
        if type(env).__name__ != "SingleAgentEnv":
            raise ConfigurationError(
                f"taskset {self.env_id!r} runs in the multi-agent env {type(env).__name__}; only "
                "single-agent tasksets can be driven by one external policy")
        self._env = env
        taskset = env.taskset
        values, current = _split_values(taskset.config)
        self._split_names = values or ["train"]
        for name in self._split_names:
            if current is None or name == current:
                ts = taskset
            else:
                ts = type(taskset)(taskset.config.model_copy(update={"split": name}))
            self._splits_tasks[name] = _SplitTasks(ts)
        # The configured split is read now: a taskset whose load() fails says so at construction.
        self._materialize(current if current in self._splits_tasks else self._split_names[0])
        self._agent_config = self._build_agent_config(vf)

    def _build_agent_config(self, vf: Any) -> Any:
        if self.harness is None:
            ident = vf.default_harness_id(self.env_id)
            harness: dict[str, Any] = {"id": "null" if ident == "bash" else ident}
        elif isinstance(self.harness, str):
            harness = {"id": self.harness}
        else:
            harness = dict(self.harness)
        self.harness_id = str(harness.get("id"))
        from verifiers.v1.configs.agent import TimeoutConfig

        try:
            return vf.AgentConfig(
                model=self.model,
                harness=harness,
                runtime=_runtime_config(vf, self.runtime_spec),
                max_turns=self.max_turns,
                timeout=TimeoutConfig(**self.timeouts),
            )
        except ConfigurationError:
            raise
        except Exception as exc:  # pydantic validation of harness / runtime / timeouts
            raise ConfigurationError(f"invalid agent settings for {self.env_id!r}: {exc}") from exc

    def _materialize(self, split: str) -> list[Any]:
        entry = self._splits_tasks[split]
        if entry.tasks is None:
            ts = entry.taskset
            if self.max_tasks is not None:
                ts = ts.take(self.max_tasks) if hasattr(ts, "take") else ts.head(self.max_tasks)
            elif getattr(ts, "INFINITE", False) and not getattr(ts, "bounded", False):
                raise ConfigurationError(
                    f"taskset {self.env_id!r} is infinite; pass max_tasks= to read a finite prefix")
            try:
                entry.tasks = list(ts)
            except ConfigurationError:
                raise
            except Exception as exc:
                raise ServerError(f"loading the tasks of {self.env_id!r} (split {split!r}) failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
        return entry.tasks

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        """Own the shared tool servers, the interception server and (http) the policy endpoint.

        One task enters and leaves them: the library's tool servers use anyio scopes that must be
        exited by the task that entered them.
        """
        vf, env = self._vf, self._env
        http: _PolicyHTTPServer | None = None
        try:
            from verifiers.v1.interception import InterceptionServer, requires_tunnel
            from verifiers.v1.runtimes import runtime_is_local

            from verifiers.v1.mcp import serve_shared

            harness_is_local = runtime_is_local(self._agent_config.runtime)
            taskset = env.taskset
            servers = taskset.toolsets(taskset.config)
            # serve_shared rather than Env.shared_tools(): the latter reads locality from the env
            # config's own agent seat (a remote Prime runtime by default), not from ours.
            async with (serve_shared(servers, harness_is_local=harness_is_local) if servers
                        else _no_shared()) as shared:
                task_cls = type(taskset).task_type()
                configs = [s.config for s in task_cls.toolsets(taskset.config.task)]
                kwargs = {
                    "requires_tunnel": requires_tunnel(harness_is_local, configs, shared.values()),
                    "state_service_secrets": tuple(s.state_secret for s in shared.values()
                                                   if getattr(s, "state_secret", None)),
                }
                transport = self.transport
                if transport == "auto":
                    transport = "inject" if _has_client_hook() else "http"
                if transport == "inject":
                    if not _has_client_hook():
                        raise ConfigurationError(
                            "this verifiers has no InterceptionServer._client hook; use transport='http'")
                    server = _make_interception_class()(_make_client_class()(self._policy), **kwargs)
                    client = vf.EvalClientConfig(base_url="http://127.0.0.1:9/v1", api_key_var=_POLICY_KEY_VAR)
                else:
                    http = _PolicyHTTPServer(self._policy)
                    await http.start()
                    server = InterceptionServer(**kwargs)
                    client = vf.EvalClientConfig(base_url=http.base_url, api_key_var=_POLICY_KEY_VAR)
                self.transport_used = transport
                async with server:
                    self._shared = dict(shared)
                    self._agent = vf.Agent(self._agent_config.model_copy(update={"client": client}),
                                           interception=server)
                    ready.set_result(None)
                    assert self._stop is not None
                    await self._stop.wait()
        except BaseException as exc:
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                exc = _library_exit(exc)
            if not ready.done():
                if isinstance(exc, Exception) and not isinstance(exc, ConfigurationError):
                    exc = BackendUnavailable(f"starting the Verifiers v1 servers failed: {type(exc).__name__}: {exc}")
                ready.set_exception(exc)
            elif not isinstance(exc, asyncio.CancelledError):
                logger.warning("verifiers v1 servers of %s stopped with %r", self.env_id, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._agent = None
            self._shared = {}
            if http is not None:
                await http.stop()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(e.aclose() for e in list(self._episodes)), return_exceptions=True)
        if self._stop is not None:
            self._stop.set()
        if self._owner is not None:
            owner, self._owner = self._owner, None
            done, _ = await asyncio.wait({owner}, timeout=60.0)
            if not done:
                owner.cancel()
                await asyncio.gather(owner, return_exceptions=True)

    def episode(self) -> VerifiersV1Episode:
        return VerifiersV1Episode(self)

    # -- tasks -------------------------------------------------------------------------------------
    async def tools(self) -> list[ToolSpec]:
        # Tools are the harness's (MCP servers plus built-ins such as bash): they are known only
        # from its first model call, so they arrive with each reset's info["tools"].
        return []

    async def _fetch_splits(self) -> list[Split]:
        return [Split(name=n, type=_SPLIT_TYPES.get(n.lower(), "validation" if len(self._split_names) > 1 else "train"))
                for n in self._split_names]

    async def _fetch_num_tasks(self, split: str) -> int:
        return len(await self._tasks(split))

    async def _tasks(self, split: str) -> list[Any]:
        if split not in self._splits_tasks:
            raise TaskNotFound(f"unknown split {split!r}; the splits are {self._split_names}")
        if self._splits_tasks[split].tasks is None:
            return await asyncio.to_thread(self._materialize, split)
        return self._splits_tasks[split].tasks or []

    async def task_object(self, split: str, index: int) -> Any:
        """The library's ``vf.Task`` at ``index`` of ``split``."""
        tasks = await self._tasks(split)
        if not 0 <= index < len(tasks):
            raise TaskNotFound(f"index {index} is outside split {split!r} (0..{len(tasks) - 1})")
        return tasks[index]

    async def task(self, split: str, index: int) -> dict[str, Any]:
        task = await self.task_object(split, index)
        data = task.data.model_dump(mode="json", exclude_none=True)
        data["type"] = type(task).__name__
        return data

    def task_from_spec(self, spec: dict[str, Any], split: str | None) -> Any:
        """A ``vf.Task`` from an explicit spec (the fields of the taskset's ``TaskData``)."""
        taskset = self._splits_tasks[split if split in self._splits_tasks else self._split_names[0]].taskset
        task_cls = type(taskset).task_type()
        data_cls = task_cls.data_type() if hasattr(task_cls, "data_type") else None
        if data_cls is None:
            tasks = self._splits_tasks[self._split_names[0]].tasks or []
            if not tasks:
                raise ConfigurationError("cannot tell this taskset's TaskData type")
            data_cls = type(tasks[0].data)
        spec = {k: v for k, v in spec.items() if k != "type"}
        try:
            return task_cls(data_cls.model_validate(spec), taskset.config.task)
        except Exception as exc:
            raise ConfigurationError(f"the task spec does not fit {data_cls.__name__}: {exc}") from exc

    def info(self) -> dict[str, Any]:
        return {"backend": self.kind, "taskset": self.env_id, "harness": self.harness_id,
                "transport": self.transport_used or self.transport}


class VerifiersV1Episode(Episode):
    """One rollout of one task: the library's ``Agent.run`` as a task, answered call by call."""

    def __init__(self, adapter: VerifiersV1Adapter):
        self.adapter = adapter
        self._calls: asyncio.Queue[_Call] = asyncio.Queue()
        self._run: asyncio.Task[Any] | None = None
        self._pending: _Call | None = None
        self._trace_ids: list[str] = []
        self._prev_len = 0
        self._prev_last: Any = None
        self._tools_raw: Any = None
        self._tools: dict[str, ToolSpec] = {}
        self.trace: Any = None
        self.finished = False

    def _on_trace(self, trace: Any) -> None:
        # Called by the library when the rollout's trace is minted, before any model call:
        # from here on, calls naming this trace id are this episode's.
        self._trace_ids.append(trace.id)
        self.adapter._policy.routes[trace.id] = self

    async def start(self, task: TaskRef) -> Opening:
        adapter = self.adapter
        if adapter._agent is None:
            raise BackendError("the Verifiers v1 adapter is not started (or is closed)")
        split = task.split or await adapter.default_split()
        if task.spec is not None:
            vtask = adapter.task_from_spec(task.spec, split)
        else:
            vtask = await adapter.task_object(split, task.index or 0)
        adapter._episodes.add(self)
        self._run = asyncio.get_running_loop().create_task(
            _guarded_async(adapter._agent.run(vtask, tools=adapter._shared or None, on_trace=self._on_trace)),
            name=f"verifiers-v1 rollout {adapter.env_id}")
        try:
            call = await self._next_call()
        except BaseException:
            await self.aclose()
            raise
        if call is None:
            trace = self._result()
            await self.aclose()
            error = self._error(trace)
            what = f"{error['type']}: {error['message']}" if error else f"stop condition {trace.stop_condition!r}"
            raise ServerError(f"the rollout of {adapter.env_id!r} ended before its first model call ({what})")
        self._pending = call
        messages = list(call.body.get("messages") or [])
        self._prev_len, self._prev_last = len(messages), (messages[-1] if messages else None)
        self._tools_raw = call.body.get("tools")
        tools = _tool_specs(self._tools_raw)
        self._tools = {t.name: t for t in tools}
        data = vtask.data
        task_id = (getattr(data, "id", None) or getattr(data, "name", None)
                   or (f"{split}:{task.index}" if task.index is not None else getattr(vtask, "key", "task")))
        return Opening(messages=messages, tools=tools, task_id=str(task_id),
                       info={"trace_id": self._trace_ids[-1] if self._trace_ids else None})

    async def _next_call(self) -> _Call | None:
        """The next model call of this rollout, or None when the rollout finished instead."""
        assert self._run is not None
        if not self._calls.empty():
            return self._calls.get_nowait()
        if self._run.done():
            return None
        getter = asyncio.ensure_future(self._calls.get())
        try:
            await asyncio.wait({getter, self._run}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        return None

    def _result(self) -> Any:
        assert self._run is not None and self._run.done()
        if self._run.cancelled():
            raise BackendError("the rollout was cancelled")
        exc = self._run.exception()
        if exc is not None:
            # Agent.run records rollout failures on the trace; an exception here is a bug or a
            # lifetime error of the library, raised to the trainer as a backend failure.
            raise ServerError(f"the Verifiers rollout raised {type(exc).__name__}: {exc}") from exc
        self.trace = self._run.result()
        return self.trace

    @staticmethod
    def _error(trace: Any) -> dict[str, Any] | None:
        errors = list(getattr(trace, "errors", None) or [])
        if not errors or getattr(trace, "ok", True):
            return None
        last = errors[-1]
        return {"type": getattr(last, "type", "Error"), "message": getattr(last, "message", str(last))}

    async def step(self, turn: Turn) -> Outcome:
        if self.finished or self._run is None:
            raise BackendError("the episode is not running")
        if self._run.done():
            return self._finish([])
        if turn.error is not None:
            return Outcome([user_message(f"Your last message could not be read: {turn.error}.")],
                           info={"invalid_action": "unreadable"})
        # Unparseable arguments: by default they go to the harness as written (the bundled chat
        # programs answer "error: invalid JSON ..." as the tool result and go on, and the trace
        # records what the agent did). With bad_arguments="answer" (for a harness that would
        # crash on them), or when the raw text is unknown, the adapter answers them itself and
        # they never reach the library; an action made only of such calls then leaves the model
        # call pending (it is not one of the library's turns).
        forward_raw = self.adapter.bad_arguments == "forward"
        good = [c for c in turn.calls
                if c.error is None or (forward_raw and getattr(c, "raw_arguments", None) is not None)]
        bad = [c for c in turn.calls if not any(c is g for g in good)]
        local: list[Message] = [tool_message(c.id, c.name, check_call(c, self._tools) or "") for c in bad]
        if bad and not good:
            return Outcome(local, info={"invalid_action": "bad_arguments", "forwarded": False})
        call, self._pending = self._pending, None
        if call is None:  # only after a failed step; the rollout cannot be answered any more
            raise BackendError("the episode has no pending model call")
        if not call.future.done():
            call.future.set_result(_completion(turn.text, good, call.body.get("model")))
        nxt = await self._next_call()
        if nxt is None:
            return self._finish(local)
        self._pending = nxt
        messages = list(nxt.body.get("messages") or [])
        info: dict[str, Any] = {}
        n = self._prev_len
        if len(messages) > n and (n == 0 or messages[n - 1] == self._prev_last):
            new = messages[n + 1:]  # after the last request's messages and the agent's reply
        else:  # the harness rewrote its context (compaction): show it whole
            new = messages
            info["context_reset"] = True
        self._prev_len, self._prev_last = len(messages), (messages[-1] if messages else None)
        names = {c.id: c.name for c in good}
        # Older chat programs (verifiers 0.3) leave ``name`` off tool results; the package's
        # observations always carry it (on a copy: the request's own list is the prefix that the
        # next request is checked against).
        new = [{**m, "name": names[m["tool_call_id"]]}
               if m.get("role") == "tool" and "name" not in m and m.get("tool_call_id") in names else m
               for m in new]
        tools = None
        if nxt.body.get("tools") != self._tools_raw:
            self._tools_raw = nxt.body.get("tools")
            tools = _tool_specs(self._tools_raw)
            self._tools = {t.name: t for t in tools}
        if bad:
            info["invalid_action"] = "bad_arguments"
        return Outcome(new + local, info=info, tools=tools)

    def _finish(self, messages: list[Message]) -> Outcome:
        self.finished = True
        trace = self._result()
        stop = trace.stop_condition
        error = self._error(trace)
        info: dict[str, Any] = {
            "stop_condition": stop,
            "rewards": {k: (float(v.score) if v is not None and v.score is not None else None)
                        for k, v in (trace.rewards or {}).items()},
            "reward_weights": {k: float(v.weight) for k, v in (trace.rewards or {}).items() if v is not None},
            "metrics": {k: (float(v) if v is not None else None) for k, v in (trace.metrics or {}).items()},
            "num_turns": trace.num_turns,
            "ok": bool(trace.ok),
        }
        if error is not None:
            info["error"] = error
        name = stop if isinstance(stop, str) else ""
        limited = name in LIMIT_STOPS or name.endswith("_timeout")
        failed = error is not None or not name or name == "error" or name.endswith("_error")
        truncated = limited or failed
        reward = trace.reward
        try:
            reward = float(reward) if reward is not None else 0.0
        except (TypeError, ValueError):
            reward = 0.0
        return Outcome(messages, reward=reward, terminated=not truncated, truncated=truncated, info=info)

    async def aclose(self) -> None:
        self.finished = True
        adapter = self.adapter
        adapter._episodes.discard(self)
        run, self._run = self._run, None
        if run is not None and not run.done():
            # Cancelling Agent.run aborts the rollout: the library kills the harness program and
            # the tool servers and stops the runtime (Rollout.abort, shielded from re-cancel).
            run.cancel()
            done, _ = await asyncio.wait({run}, timeout=60.0)
            if not done:
                logger.warning("the rollout of %s did not stop within 60 s", adapter.env_id)
        elif run is not None and run.done() and not run.cancelled():
            run.exception()  # retrieved: no "exception was never retrieved" noise
        for trace_id in self._trace_ids:
            if adapter._policy.routes.get(trace_id) is self:
                del adapter._policy.routes[trace_id]
        pending = [self._pending] if self._pending is not None else []
        self._pending = None
        while not self._calls.empty():
            pending.append(self._calls.get_nowait())
        for call in pending:
            if not call.future.done():
                call.future.cancel()
