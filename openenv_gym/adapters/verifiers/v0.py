"""Legacy (v0) Verifiers environments, played with the library's own rollout loop (inverted control).

A v0 Verifiers environment (``verifiers<0.4``: ``load_environment(**env_args) -> vf.Environment``,
i.e. ``SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv``/``StatefulToolEnv`` and their subclasses)
owns its loop: ``Environment.run_rollout`` (``@final``) calls a model client, appends the reply,
runs ``env_response`` (tools, hints), checks the ``@vf.stop`` conditions, enforces
``timeout_seconds``, captures ``vf.Error`` into ``state["error"]``, runs the cleanup handlers and
scores the rollout with the rubric. Re-implementing that loop from the env's hooks would drift from
the library with every release, so this adapter does not: each episode runs the library's
``run_rollout`` as an asyncio task on the package's runtime loop, with a model client
(a :class:`verifiers.Client` subclass) whose ``get_response`` *publishes the request* as the
observation and *waits for the agent's action*, which it returns as the model's reply
(docs/backends.md, "Verifiers"). Everything the env does between two model calls is therefore
exactly what ``vf-eval`` would do, and the final reward is the rubric's own.

Mapping onto the Gymnasium contract (docs/architecture.md):

* tasks are dataset rows, as the library formats them (``Environment.get_dataset()`` and
  ``get_eval_dataset()``: ``prompt`` messages, ``answer``, ``info``, ``example_id``...): split
  ``train`` from ``dataset`` and ``eval`` (type ``test``; ``"test"`` is accepted as an alias)
  from ``eval_dataset``;
* reset: the first model request's messages (system + user...) as OpenAI-format dicts, and its
  ``tools`` as :class:`~openenv_gym.wire.ToolSpec` (``info["tools"]``);
* step: the action becomes a ``vf.Response`` (flat ``vf.ToolCall(id, name, arguments)``); the
  observation is what the library appended before its next model call (tool results, the env's
  user messages), reward ``0.0`` until the rollout ends, then ``RolloutOutput["reward"]`` with
  ``metrics`` and ``stop_condition`` (and ``error``) in ``info``;
* bad tool calls (invalid JSON, unknown tool, a raising tool) are answered by the library's own
  ``ToolEnv.env_response`` (its ``error_formatter``), so the agent sees the same tool message a
  model under ``vf-eval`` would see, and the episode goes on.

The environment object is built when the adapter is constructed (see
:class:`VerifiersV0Adapter` for why, and for signal handling); many episodes share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import itertools
import json
import math
import operator
import os
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import msgspec

from openenv_gym.actions import ParsedCall, Turn, unreadable_reply
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.adapters.modules import exec_file
from openenv_gym.adapters.verifiers.detect import SourceModule, resolve_source
from openenv_gym.adapters.verifiers.process import STATE, building_v0_env
from openenv_gym.errors import (
    BackendError,
    BackendTimeout,
    ConfigurationError,
    EpisodeNotStarted,
    ServerError,
    TaskNotFound,
)
from openenv_gym.runtime import INLINE_OFFLOADS
from openenv_gym.wire import Message, Opening, Outcome, Split, TaskRef, ToolSpec

__all__ = ["VerifiersV0Adapter", "VerifiersV0Episode", "TRUNCATING_STOPS"]

TRUNCATING_STOPS = frozenset({
    "max_turns_reached",
    "timeout_reached",
    "prompt_too_long",
    "max_total_completion_tokens_reached",
    "has_error",
})
"""Stop conditions that end an episode as ``truncated`` (a limit or a failure, not the task's own
end), except ``max_turns_reached`` of a ``SingleTurnEnv`` (one turn is its whole task). Every
other stop condition (``no_tools_called``, ``has_final_env_response``, an env's own ``@vf.stop``)
is ``terminated``. A rollout the library itself flags ``is_truncated`` (an overlong
response or prompt) is truncated too."""

ROW_CACHE = 4096
"""Dataset rows kept decoded per adapter (see :meth:`VerifiersV0Adapter.rollout_input`)."""

_SPLIT_ALIASES = {"test": "eval", "evaluation": "eval", "validation": "eval"}

_NO_V0_API = (
    "this is a legacy (v0) Verifiers environment; verifiers {version} installed has no v0 API: "
    "install 'verifiers<0.4' (0.3.1), or run it in a Ray actor whose runtime_env pins verifiers<0.4 "
    "(gym.make_vec(..., backend='ray', vector_options={{'runtime_env': {{'pip': ['verifiers==0.3.1']}}}}))"
)


# -- the library ------------------------------------------------------------------------------------

def _import_v0() -> Any:
    """``import verifiers`` with its legacy surface, or a ConfigurationError saying what to install."""
    try:
        import verifiers
    except ImportError as exc:
        raise ConfigurationError(
            f"Verifiers environments need the verifiers package: pip install 'verifiers<0.4' ({exc})"
        ) from None
    try:
        # In 0.2-0.3 these resolve lazily to verifiers.legacy; 0.4 removed them.
        for name in ("load_environment", "Environment", "MultiTurnEnv", "SingleTurnEnv", "Client"):
            getattr(verifiers, name)
    except (AttributeError, ImportError):
        version = ".".join(str(getattr(verifiers, "__version__", "?")).split(".")[:2])
        raise ConfigurationError(_NO_V0_API.format(version=version)) from None
    return verifiers


# What the library offloads with asyncio.to_thread in every rollout, all of it its own pure
# bookkeeping over the rollout's state (no user code, nothing that waits): parsing a reply's
# tokens, twice an episode, and the rollout's output. (module, qualified name), under both
# package layouts (``verifiers.utils`` before the legacy API moved to ``verifiers.legacy``).
_PURE_OFFLOADS = frozenset(
    (f"verifiers.{package}utils.{module}", name)
    for package in ("", "legacy.")
    for module, name in (("response_utils", "parse_response_tokens.<locals>._sync"),
                         ("save_utils", "state_to_output")))



def _pure_offload(fn: Callable[..., Any]) -> bool:
    """The rollout task's :data:`~openenv_gym.runtime.INLINE_OFFLOADS`: the library's own
    offloads in :data:`_PURE_OFFLOADS` run at once. Three thread hops an episode, each two
    wake-ups, cost on a shared 2-core machine more than everything of ours
    (benchmarks/verifiers_v0_bench.py)."""
    return (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)) in _PURE_OFFLOADS


_client_class: type | None = None


def _queue_client_class() -> type:
    """The ``vf.Client`` subclass whose model call is answered by the agent (built on first use,
    so importing this module does not import verifiers)."""
    global _client_class
    if _client_class is not None:
        return _client_class
    vf = _import_v0()
    client_base: Any = vf.Client  # verifiers ships no type information

    class AgentClient(client_base):
        """A model client that hands each request to its episode and returns the agent's reply.

        Only ``get_response`` matters: the base class's native-format pipeline (prompt and tool
        conversion, provider calls) is bypassed, so the abstract hooks are trivial.
        """

        def __init__(self, episode: VerifiersV0Episode):
            super().__init__(None)
            self.episode = episode

        def setup_client(self, config: Any) -> None:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(self, prompt: Any, model: str, sampling_args: Any,
                                      tools: Any = None, **kwargs: Any) -> Any:
            raise NotImplementedError("answered by get_response")

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

        async def get_response(self, prompt: Any, model: str, sampling_args: Any,
                               tools: Any = None, **kwargs: Any) -> Any:
            reply = asyncio.get_running_loop().create_future()
            self.episode._on_request(prompt, tools, sampling_args, kwargs.get("state"), reply)
            return await reply

    _client_class = AgentClient
    return AgentClient


_quiet_lock = threading.Lock()
_quiet_depth = 0
_quiet_restore = False


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Hide Hugging Face ``datasets`` progress bars while an environment builds its datasets.

    ``load_environment`` and the library's dataset formatting run ``Dataset.map`` on every make,
    which prints a "Map" bar per split: noise on each ``gym.make``, once per sub-env adapter.
    The bars are switched off for the duration and the user's setting is put back after.
    A user who sets ``HF_DATASETS_DISABLE_PROGRESS_BARS=0`` (datasets' own switch, which
    wins over code) keeps them. Counted, so that concurrent constructions (a vector env builds
    adapters in several threads) restore the setting once, when the last one finishes; the
    setting is process-wide, so another thread's ``map`` in that window is quiet too.
    """
    global _quiet_depth, _quiet_restore
    try:
        from datasets import config as hf_config
        from datasets import utils as hf_utils  # are_/disable_/enable_progress_bars
    except ImportError:  # no datasets: nothing prints
        yield
        return
    if hf_config.HF_DATASETS_DISABLE_PROGRESS_BARS is False:  # the user asked for them explicitly
        yield
        return
    with _quiet_lock:
        if _quiet_depth == 0:
            _quiet_restore = not hf_utils.are_progress_bars_disabled()
            if _quiet_restore:
                hf_utils.disable_progress_bars()
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0 and _quiet_restore:
                _quiet_restore = False
                hf_utils.enable_progress_bars()


def _import_source(found: SourceModule) -> None:
    """Import the source's file as its module unless that exact file is already imported under the name.

    Its folder (a package's parent) must be an import root held in
    :data:`~openenv_gym.adapters.verifiers.process.STATE` (on ``sys.path`` for the module's own
    sibling imports, and undone when the adapter closes). Loading from the file (rather than by
    name through ``sys.path``) means the source given is the one used even when another folder
    on ``sys.path`` has a module of the same name; a same-named module from another file is
    replaced in ``sys.modules`` until then.
    """
    module, file, package = found.module, found.file, found.package
    existing = sys.modules.get(module)
    existing_file = getattr(existing, "__file__", None)  # None for a missing module too
    if existing_file and Path(existing_file).resolve() == file:
        return
    try:
        exec_file(module, file, package=package, what="Verifiers source")
    except ConfigurationError:
        raise
    except Exception as exc:
        raise ConfigurationError(f"could not import Verifiers source {str(file)!r}: {type(exc).__name__}: {exc}") from exc


def _rubrics(env: Any) -> Iterator[Any]:
    """Every rubric that scores ``env``: RubricGroup members and EnvGroup children included."""
    stack = [getattr(env, "rubric", None)]
    stack += [getattr(child, "rubric", None) for child in getattr(env, "envs", None) or ()]
    seen: set[int] = set()
    while stack:
        rubric = stack.pop()
        if rubric is None or id(rubric) in seen:
            continue
        seen.add(id(rubric))
        yield rubric
        stack.extend(getattr(rubric, "rubrics", None) or ())
        stack.extend(getattr(getattr(rubric, "env_map", None), "values", lambda: ())())


def _check_rubric(env: Any, vf: Any) -> None:
    """Refuse, at construction, rubrics that cannot score one episode on its own."""
    group: list[str] = []
    for rubric in _rubrics(env):
        is_group = getattr(rubric, "_is_group_func", None)
        for func in getattr(rubric, "funcs", None) or ():
            try:
                if is_group is not None and is_group(func):
                    group.append(getattr(func, "__name__", repr(func)))
            except (TypeError, ValueError):  # no signature to inspect: the library treats it as individual
                pass
    if group:
        raise ConfigurationError(
            f"group reward functions ({', '.join(group)}) are not supported per episode: they score a "
            "group of rollouts together (Rubric.score_group, plural parameters such as 'completions' or "
            "a list return) and a Gymnasium episode is one rollout; make them per-rollout reward "
            "functions, or score groups of finished episodes yourself")
    if not getattr(env, "score_rollouts", True):
        return
    for rubric in _rubrics(env):
        # The base Rubric.score_rollout asserts at least one reward function: a rubric without
        # any would fail every rollout at the very end, so say so now.
        if (type(rubric).score_rollout is vf.Rubric.score_rollout and not getattr(rubric, "rubrics", None)
                and not getattr(rubric, "funcs", None)):
            raise ConfigurationError(
                f"the environment's {type(rubric).__name__} has no reward functions; Verifiers cannot "
                "score a rollout with it (Rubric.score_rollout needs at least one)")


# -- messages ----------------------------------------------------------------------------------------

def _openai_message(message: Any) -> Message:
    """A library message (pydantic, or a raw dict an env returned) as an OpenAI-format dict."""
    if isinstance(message, dict):
        out = {k: v for k, v in message.items() if v is not None}
    else:
        out = message.model_dump(exclude_none=True)
    calls = out.get("tool_calls")
    if calls:
        # v0 keeps tool calls flat ({id, name, arguments}); OpenAI nests them under "function".
        out["tool_calls"] = [
            c if "function" in c else
            {"id": c.get("id"), "type": "function", "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
            for c in calls
        ]
    return out


def _tool_spec(tool: Any) -> ToolSpec:
    if isinstance(tool, dict):
        return ToolSpec(name=tool["name"], description=tool.get("description") or "",
                        parameters=tool.get("parameters"))
    return ToolSpec(name=tool.name, description=tool.description or "", parameters=tool.parameters)


class _ToolCache:
    """ToolSpecs for the library's tool lists, converted once per set of tools.

    The library gives every episode of a ToolEnv a list of its own (``state["tool_defs"]``) that
    holds the env's same ``vf.Tool`` objects, so a list holding the same objects as the last one
    is not converted again (nor its schemas JSON-encoded); each reset decodes fresh schemas from
    the cached bytes, because what a reset returns must not alias what another reset returned
    (Gymnasium's checker tests this), and decoding is several times cheaper than ``copy.deepcopy``.
    """

    def __init__(self) -> None:
        self._tools: tuple[Any, ...] = ()
        self._encoded: list[tuple[str, str, bytes]] = []

    def specs(self, tools: Any) -> list[ToolSpec]:
        tools = tuple(tools or ())
        known = self._tools
        if len(tools) != len(known) or not all(map(operator.is_, tools, known)):
            encoded = [(spec.name, spec.description, msgspec.json.encode(spec.parameters))
                       for spec in map(_tool_spec, tools)]
            self._tools, self._encoded = tools, encoded  # one assignment pair: no torn reads on one loop
        return [ToolSpec(name=name, description=description, parameters=msgspec.json.decode(params))
                for name, description, params in self._encoded]


def _raw_arguments(call: ParsedCall) -> str:
    """The arguments string to hand the library for ``call``.

    The agent's own string when it wrote one, so that bad JSON reaches ``ToolEnv`` as written and
    the library answers with its own error message; a dict is encoded (what the library does
    itself for dict arguments).
    """
    if call.raw_arguments is not None:
        return call.raw_arguments
    return json.dumps(call.arguments) if call.arguments is not None else ""


# -- adapter -----------------------------------------------------------------------------------------

class VerifiersV0Adapter(Adapter):
    """A legacy (v0) Verifiers environment as an openenv_gym backend.

    Args:
        env_id: the environment's importable module or package name (``"vf_arith"``, or
            ``"owner/vf-arith"``: ``vf.load_environment`` keeps the last part and maps ``-`` to
            ``_``).
        source: a module file (``my_env.py``), a package folder, or a project folder (the
            upstream layout ``my-env/my_env.py``, or ``my-env/my_env/__init__.py``): any layout
            :func:`openenv_gym.adapters.verifiers.detect.resolve_source` accepts. Its folder (or the
            package's parent) is put on ``sys.path`` unless already there, the module name
            comes from the path, and the module is imported from that file (replacing a
            same-named module from elsewhere in ``sys.modules``), until :meth:`aclose`.
            ``env_id``, if also given, is what ``vf.load_environment`` gets (and records as
            ``env.env_id``); it must name the same module.
        env_args: keyword arguments for the module's ``load_environment``.
        timeout_seconds: overrides the env's ``timeout_seconds`` (``None``: keep the env's;
            ``math.inf``: no limit). See "Timeouts" below.
        max_turns: overrides the env's ``max_turns`` (the library's own limit: the rollout stops
            with ``stop_condition="max_turns_reached"``, is scored by the rubric and ends
            ``truncated``). Prefer it to ``AgentEnv(max_turns=...)``, which ends the episode
            without letting the library score it (reward 0.0).
        rollout_timeout: seconds the library may take between receiving an action and asking
            for the next one (tool calls, ``env_response``, scoring): policy time excluded. On
            expiry the rollout is cancelled and the step raises
            :class:`~openenv_gym.errors.BackendTimeout`. ``None``: no limit.
        model: the model name the library records in ``state["model"]``.
        sampling_args: merged over the env's ``sampling_args`` (as ``Environment.generate``
            does); the library passes them with every model call, and ``info["request"]``
            reports them.

    **Construction happens here, in the calling thread, any thread.** ``Environment.__post_init__``
    installs SIGINT/SIGTERM handlers and an ``atexit`` teardown: off the main thread that raises,
    in the main thread it replaces the process's handlers. The adapter builds the env inside
    :func:`~openenv_gym.adapters.verifiers.process.building_v0_env`, which records those calls
    for the building thread instead, so construction works in any thread (a vector env builds
    its adapters on the runtime loop's thread; a Ray actor runs methods in worker threads) and
    no handler of the process changes (Ctrl-C keeps raising ``KeyboardInterrupt`` in a gym
    script). The env's teardown is registered with ``atexit`` until :meth:`aclose` runs it. A
    ``source`` folder is importable (``sys.path``, ``sys.modules``) until :meth:`aclose`, then
    put back as it was. Load errors (import errors, ``vf.MissingKeyError``, exceptions in
    ``load_environment``) raise :class:`~openenv_gym.errors.ConfigurationError` with the
    library's message.

    **Timeouts: policy time counts.** The library's ``timeout_seconds`` wraps the *whole* rollout
    in ``asyncio.wait_for``, including the time the agent takes to answer each request (here,
    the time between an observation and the next ``step``). A slow policy therefore times out
    exactly as a slow model would under ``vf-eval``: the library cancels the pending model call,
    scores what exists and records ``stop_condition="timeout_reached"``; the next ``step`` returns
    that result (``truncated=True``) and its action is not used. Raise ``timeout_seconds`` (or
    pass ``math.inf``) when the policy is slow; use ``rollout_timeout`` to bound only the env's
    own time.

    **Scoring.** Rubrics are scored per rollout (``Rubric.score_rollout``). Group reward
    functions (plural parameters like ``completions``/``states``, or a ``list`` return) need a
    group of rollouts and are refused at construction with a ConfigurationError; advantages
    (``score_group``) are the trainer's job.

    Many episodes (a vector env's sub-envs) share one adapter and one loaded env; each episode
    has its own client and state, as in the library's own concurrent ``generate``.

    Hugging Face ``datasets`` progress bars ("Map", one per split) are hidden while the env and
    its datasets are built; ``HF_DATASETS_DISABLE_PROGRESS_BARS=0`` keeps them.
    """

    kind = "verifiers_v0"
    caller_thread = True  # the library's loop runs only while a step waits for it

    def __init__(
        self,
        *,
        env_id: str | None = None,
        source: str | os.PathLike | None = None,
        env_args: dict[str, Any] | None = None,
        timeout_seconds: float | None = None,
        max_turns: int | None = None,
        rollout_timeout: float | None = None,
        model: str = "external-policy",
        sampling_args: dict[str, Any] | None = None,
    ):
        super().__init__()
        if env_id is None and source is None:
            raise ConfigurationError("VerifiersV0Adapter needs env_id (an importable module) or source (a path)")
        if max_turns is not None and (not isinstance(max_turns, int) or max_turns < 1):
            raise ConfigurationError("max_turns must be a positive integer or None")
        if timeout_seconds is not None and not timeout_seconds > 0:
            raise ConfigurationError("timeout_seconds must be positive (math.inf: no limit) or None")
        if rollout_timeout is not None and not rollout_timeout > 0:
            raise ConfigurationError("rollout_timeout must be positive or None")
        vf = _import_v0()
        self._vf = vf
        # Looked up once: each ``vf.X`` goes through the package's lazy ``__getattr__`` (an
        # import_module call), three of them a step otherwise.
        self._reply_models = (vf.ToolCall, vf.ResponseMessage, vf.Response)
        found = resolve_source(source) if source is not None else None
        load_id = env_id if env_id is not None else found.module  # type: ignore[union-attr]
        if found is not None and env_id is not None:
            named = env_id.replace("-", "_").split("/")[-1]  # vf's env_module_name
            if named != found.module:
                raise ConfigurationError(
                    f"env_id {env_id!r} names module {named!r} but source {str(source)!r} holds {found.module!r}")
        self.env_args = dict(env_args or {})
        root = STATE.acquire(found.root) if found is not None else None
        try:
            with building_v0_env(sys.modules.get(vf.Environment.__module__)) as built, _quiet_datasets():
                if found is not None:
                    _import_source(found)
                try:
                    env = vf.load_environment(load_id, **self.env_args)
                except Exception as exc:
                    # vf wraps import errors in ValueError and the rest in RuntimeError, with its message.
                    raise ConfigurationError(f"could not load Verifiers environment {load_id!r}: {exc}") from exc
            if not isinstance(env, vf.Environment):
                raise ConfigurationError(
                    f"load_environment of {load_id!r} returned {type(env).__name__}, not a verifiers Environment")
            _check_rubric(env, vf)
        except BaseException:
            if root is not None:
                STATE.release(root)
            raise
        # The library wants the env's teardown at exit: registered until aclose() runs it. The
        # import root is held until aclose(), or until this adapter is garbage (close forgotten).
        built.register_exit_hooks()
        self._built = built
        self._release_root = weakref.finalize(self, STATE.release, root) if root is not None else None
        if self._release_root is not None:
            self._release_root.atexit = False
        self._apply_limits(env, timeout_seconds, max_turns)
        self.env = env
        self.env_id = load_id
        self.model = model
        merged = dict(getattr(env, "sampling_args", None) or {})
        merged.update(sampling_args or {})
        self.sampling_args = merged
        self.rollout_timeout = rollout_timeout
        # A SingleTurnEnv is max_turns=1 by construction: its max_turns_reached is the task's end.
        children = getattr(env, "envs", None) or ()
        self._single_turn = isinstance(env, vf.SingleTurnEnv) or (
            bool(children) and all(isinstance(c, vf.SingleTurnEnv) for c in children))
        self._datasets: dict[str, Any] = {}
        self._rows: dict[tuple[str, int], dict[str, Any]] = {}
        self._tool_cache = _ToolCache()
        self._reply_prefix = f"openenv-{uuid.uuid4().hex[:16]}"  # reply ids unique across adapters
        self._episode_ids = itertools.count()
        self._episodes: set[VerifiersV0Episode] = set()
        self._closed = False
        self._torn_down = False

    @staticmethod
    def _apply_limits(env: Any, timeout_seconds: float | None, max_turns: int | None) -> None:
        targets = [env, *(getattr(env, "envs", None) or ())]  # EnvGroup: its children run the rollouts
        if timeout_seconds is not None:
            value = None if math.isinf(timeout_seconds) else float(timeout_seconds)
            for target in targets:
                if hasattr(target, "timeout_seconds"):
                    target.timeout_seconds = value
        if max_turns is not None:
            for target in targets:
                if hasattr(target, "max_turns"):
                    target.max_turns = max_turns

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        # Dataset builders may be slow (downloads, maps): off the loop.
        train, eval_ = await asyncio.to_thread(self._build_datasets)
        if train is not None:
            self._datasets["train"] = train
        if eval_ is not None:
            self._datasets["eval"] = eval_
        if not self._datasets:
            raise ConfigurationError(f"Verifiers environment {self.env_id!r} has neither dataset nor eval_dataset")

    def _build_datasets(self) -> tuple[Any, Any]:
        try:
            with _quiet_datasets():
                return self.env.build_dataset(), self.env.build_eval_dataset()
        except Exception as exc:
            raise ConfigurationError(f"building the datasets of {self.env_id!r} failed: {exc}") from exc

    async def aclose(self) -> None:
        """Cancel every running episode, then run the env's teardown handlers. Idempotent."""
        self._closed = True
        episodes, self._episodes = list(self._episodes), set()
        await asyncio.gather(*(e.aclose() for e in episodes), return_exceptions=True)
        if not self._torn_down:
            self._torn_down = True
            try:
                await asyncio.wait_for(self.env._teardown(), 60.0)
            except Exception:
                pass  # a failing teardown must not keep the env from closing
            finally:
                self._built.unregister_exit_hooks()
                if self._release_root is not None:
                    self._release_root()

    def episode(self) -> Episode:
        return VerifiersV0Episode(self)

    def info(self) -> dict[str, Any]:
        return {"backend": self.kind, "env_id": self.env_id}

    # -- tools and tasks ---------------------------------------------------------------------------
    async def tools(self) -> list[ToolSpec]:
        return self._tool_cache.specs(getattr(self.env, "tool_defs", None) or [])

    async def _fetch_splits(self) -> list[Split]:
        return [Split(name=name, type="train" if name == "train" else "test") for name in self._datasets]

    async def _fetch_num_tasks(self, split: str) -> int:
        return len(self._datasets[split])

    def _split(self, split: str) -> str:
        return split if split in self._datasets else _SPLIT_ALIASES.get(split, split)

    async def num_tasks(self, split: str) -> int:
        return await super().num_tasks(self._split(split))

    async def task(self, split: str, index: int) -> dict[str, Any]:
        """The formatted dataset row (``prompt``, ``answer``, ``info``, ``example_id``...)."""
        name = self._split(split)
        dataset = self._datasets.get(name)
        if dataset is None:
            raise TaskNotFound(f"unknown split {split!r}; the splits are {list(self._datasets)}")
        if not 0 <= index < len(dataset):
            raise TaskNotFound(f"split {split!r} has no task {index}")
        return dataset[int(index)]

    async def rollout_input(self, split: str, index: int) -> dict[str, Any]:
        """The row an episode plays. Rows are cached (up to ``ROW_CACHE`` of them): reading one
        from an Arrow dataset costs more than a step of a simple env, and the library deep-copies
        its input in ``init_state``, so sharing a cached row between episodes is safe."""
        key = (self._split(split), int(index))
        row = self._rows.get(key)
        if row is None:
            row = await self.task(split, index)
            if len(self._rows) >= ROW_CACHE:
                self._rows.pop(next(iter(self._rows)))
            self._rows[key] = row
        return row

    def row_from_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A rollout input from an explicit task, formatted as the library formats dataset rows:
        ``question`` becomes ``[system_prompt?, *few_shot, user]``; the env's system prompt is
        prepended to a ``prompt`` that lacks one."""
        row = dict(spec)
        env = self.env
        prompt = row.get("prompt")
        if prompt is None:
            question = row.get("question")
            if not isinstance(question, str):
                raise ConfigurationError("a Verifiers task needs 'prompt' (chat messages) or 'question' (text)")
            messages: list[Any] = []
            if env.system_prompt:
                messages.append({"role": "system", "content": env.system_prompt})
            messages.extend(env.few_shot or ())
            messages.append({"role": "user", "content": question})
            row["prompt"] = messages
        elif isinstance(prompt, list) and env.system_prompt is not None:
            first = prompt[0] if prompt else None
            role = first.get("role") if isinstance(first, dict) else getattr(first, "role", None)
            if role != "system":
                row["prompt"] = [{"role": "system", "content": env.system_prompt}, *prompt]
        row.setdefault("example_id", -1)
        row.pop("env_id", None)  # the library drops it from datasets too
        return row


class VerifiersV0Episode(Episode):
    """One rollout of the library's loop, paused at every model call until the agent acts."""

    def __init__(self, adapter: VerifiersV0Adapter):
        self.adapter = adapter
        self.task_id = ""
        self._task: asyncio.Task[Any] | None = None
        # The next model call, or None when the rollout ended first.
        self._request: asyncio.Future[tuple[Any, Any, Any, Any] | None] | None = None
        self._reply: asyncio.Future[Any] | None = None  # the pending model call awaits this
        self._prompt: list[Any] = []  # the library's last request (its own list; never copied)
        self._tools: Any = None
        self._sampling_args: Any = None
        self._state: Any = None
        self._closed = False
        self._reply_id = f"{adapter._reply_prefix}-{next(adapter._episode_ids)}"  # replies: this, then a count
        self._replies = 0

    # -- called by the client, inside the rollout task ------------------------------------------
    def _on_request(self, prompt: Any, tools: Any, sampling_args: Any, state: Any, reply: asyncio.Future[Any]) -> None:
        request = self._request
        if request is None or request.done():
            # v0's loop calls the model one turn at a time; anything else cannot map to step().
            raise self.adapter._vf.Error("concurrent model calls within one rollout are not supported")
        self._reply = reply
        request.set_result((prompt, tools, sampling_args, state))

    # -- Episode -----------------------------------------------------------------------------------
    async def start(self, task: TaskRef) -> Opening:
        adapter = self.adapter
        if adapter._closed:
            raise BackendError("the Verifiers adapter is closed")
        if task.spec is not None:
            row = adapter.row_from_spec(task.spec)
            split = task.split or "task"
        else:
            split = task.split or await adapter.default_split()
            row = await adapter.rollout_input(split, task.index or 0)
        self.task_id = f"{split}/{row.get('example_id', task.index)}"
        loop = asyncio.get_running_loop()
        self._request = loop.create_future()
        client = _queue_client_class()(self)
        context = contextvars.copy_context()
        context.run(INLINE_OFFLOADS.set, _pure_offload)
        self._task = loop.create_task(
            self._rollout(adapter.env.run_rollout(row, client, adapter.model, dict(adapter.sampling_args))),
            name=f"verifiers-v0 rollout {self.task_id}", context=context,
        )
        self._task.add_done_callback(self._on_rollout_done)  # a rollout cancelled before it ran
        adapter._episodes.add(self)
        try:
            request = await self._next_request()
            if request is None:
                output = self._output()
                raise ServerError(
                    f"the Verifiers rollout of {self.task_id} ended before its first model call "
                    f"(stop_condition={output.get('stop_condition')!r}, error={_error_info(output)})")
        except BaseException:
            await asyncio.shield(self.aclose())
            raise
        prompt, tools, sampling_args, self._state = request
        self._prompt, self._tools, self._sampling_args = prompt, tools, sampling_args
        info = {"request": _request_info(sampling_args), "example_id": row.get("example_id")}
        return Opening(messages=[_openai_message(m) for m in prompt],
                       tools=adapter._tool_cache.specs(tools), task_id=self.task_id, info=info)

    async def step(self, turn: Turn) -> Outcome:
        if self._task is None or self._closed:
            raise EpisodeNotStarted("the episode is not running")
        if turn.error is not None:
            # Not a message at all: nothing the library could record as a model reply.
            return Outcome([unreadable_reply(turn.error)],
                           info={"invalid_action": "unreadable"})
        if self._task.done():  # the library ended the rollout meanwhile (timeout_seconds)
            return self._finish()
        reply, self._reply = self._reply, None
        if reply is None:
            raise BackendError("the Verifiers rollout is not waiting for a model reply")
        self._request = asyncio.get_running_loop().create_future()
        if not reply.done():  # cancelled if the library timed the call out just now
            reply.set_result(self._response(turn))
        try:
            request = await self._next_request()
        except BaseException:
            await asyncio.shield(self.aclose())
            raise
        if request is None:
            return self._finish()
        prompt, tools, sampling_args, self._state = request
        previous, self._prompt = self._prompt, prompt
        info: dict[str, Any] = {}
        n = len(previous)
        # The library builds each request as previous + [reply] + env_response (the same message
        # objects), so the new messages are the tail; an env that rewrites its context
        # (a custom get_prompt_messages) gets the whole prompt, flagged.
        if len(prompt) > n and n > 0 and prompt[n - 1] is previous[n - 1]:
            messages = [_openai_message(m) for m in prompt[n + 1:]]
        else:
            messages = [_openai_message(m) for m in prompt]
            info["prompt_rewritten"] = True
        changed: list[ToolSpec] | None = None
        if tools is not self._tools:  # the library passes the same list every turn unless it changed
            old = [_tool_spec(t) for t in self._tools or ()]
            new = self.adapter._tool_cache.specs(tools)
            if new != old:
                changed = new
            self._tools = tools
        if sampling_args is not self._sampling_args and sampling_args != self._sampling_args:
            info["request"] = _request_info(sampling_args)
        self._sampling_args = sampling_args
        return Outcome(messages, info=info, tools=changed)

    async def aclose(self) -> None:
        """Cancel the rollout if it is still running and wait for it to unwind. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.adapter._episodes.discard(self)
        task, self._task = self._task, None
        # The library's state holds the client, which holds this episode: a cycle that only the
        # collector would free, with the whole rollout in it (every step's collections walked it).
        self._reply = self._request = self._state = None
        if task is None:
            return
        if not task.done():
            task.cancel()
            # The library's cleanup handlers run while the task unwinds; bound the wait.
            await asyncio.wait({task}, timeout=30.0)
            if not task.done():
                _orphans.add(task)  # keep a reference: never "Task was destroyed but it is pending"
                task.add_done_callback(_orphans.discard)
                return
        if not task.cancelled():
            task.exception()  # mark it retrieved

    # -- internals -----------------------------------------------------------------------------------
    async def _next_request(self) -> tuple[Any, Any, Any, Any] | None:
        """Wait for the library's next model call (its request) or the end of the rollout (None).

        The rollout task's done-callback resolves the pending request with None, so one future
        covers both (cheaper per step than ``asyncio.wait`` on two)."""
        request = self._request
        assert request is not None
        timeout = self.adapter.rollout_timeout
        if timeout is None:
            return await request
        try:
            return await asyncio.wait_for(request, timeout)
        except TimeoutError:
            raise BackendTimeout(
                f"the Verifiers environment took more than {timeout} s to answer an action (rollout_timeout)") from None

    async def _rollout(self, run: Coroutine[Any, Any, Any]) -> Any:
        """The library's rollout, telling the episode it ended as its last act (a done-callback
        would be run one pass of the loop later, and the episode woken one pass after that)."""
        try:
            return await run
        finally:
            self._on_rollout_done(None)

    def _on_rollout_done(self, task: asyncio.Task[Any] | None) -> None:
        request = self._request
        if request is not None and not request.done():
            request.set_result(None)

    def _response(self, turn: Turn) -> Any:
        tool_call, response_message, response = self.adapter._reply_models
        # The validating constructors: for these models pydantic's compiled validators are
        # cheaper than model_construct's Python-level field loop (benchmarks/verifiers_v0_bench.py).
        calls = [tool_call(id=c.id, name=c.name, arguments=_raw_arguments(c)) for c in turn.calls]
        message = response_message(
            content=turn.text, tool_calls=calls or None, finish_reason="tool_calls" if calls else "stop",
            is_truncated=False)
        self._replies += 1
        return response(id=f"{self._reply_id}-{self._replies}", created=int(time.time()),
                        model=self.adapter.model, usage=None, message=message)

    def _output(self) -> dict[str, Any]:
        task = self._task
        assert task is not None and task.done()
        if task.cancelled():
            raise BackendError("the Verifiers rollout was cancelled")
        exc = task.exception()
        if exc is not None:
            # vf.Error is captured by the library into state["error"]; anything else escaping
            # run_rollout is a bug in the environment (or the library), not the agent's doing.
            raise ServerError(f"the Verifiers rollout of {self.task_id} failed: {type(exc).__name__}: {exc}") from exc
        return task.result()

    def _finish(self) -> Outcome:
        output = self._output()
        messages: list[Message] = []
        final = self._state.get("final_env_response") if self._state is not None else None
        if final:
            messages = [_openai_message(m) for m in final]
        reward = output.get("reward")
        stop = output.get("stop_condition")
        truncated = bool(output.get("is_truncated")) or (
            stop in TRUNCATING_STOPS and not (stop == "max_turns_reached" and self.adapter._single_turn))
        info: dict[str, Any] = {"metrics": dict(output.get("metrics") or {}), "stop_condition": stop}
        error = _error_info(output)
        if error is not None:
            info["error"] = error
        if reward is None:  # never a None reward; say why instead
            info.setdefault("error", {"type": "NoReward", "message": "the rubric produced no reward"})
        return Outcome(messages, reward=float(reward or 0.0), terminated=not truncated, truncated=truncated, info=info)


_orphans: set[asyncio.Task[Any]] = set()


def _error_info(output: dict[str, Any]) -> dict[str, str] | None:
    error = output.get("error")
    if not error:
        return None
    if isinstance(error, dict):
        return {"type": str(error.get("error") or "Error"), "message": str(error.get("message") or "")}
    return {"type": type(error).__name__, "message": str(error)}


_SCALARS = (str, int, float, bool, type(None))


def _request_info(sampling_args: Any) -> dict[str, Any]:
    # Small (sampling parameters only, never the prompt); copied because the library shares it,
    # deeply only when a value could be changed in place.
    args = dict(sampling_args or {})
    if not all(isinstance(v, _SCALARS) for v in args.values()):
        args = copy.deepcopy(args)
    return {"sampling_args": args}

