"""Verifiers v1 tasksets as Gymnasium episodes, with the library's own agent loop (inverted control).

A Verifiers v1 environment (``verifiers.v1``, 0.2-0.4) is a ``vf.Taskset`` of ``vf.Task`` objects,
played by a *harness* program (``null``, ``bash``, ...) that runs in a *runtime* (a subprocess
here) and calls "the model" over HTTP through the library's interception server; the library
records every call in a ``vf.Trace`` and scores it with the task's ``@vf.reward`` functions. There
is no ``env.step`` to call: the library owns the loop (docs/backends.md, "Verifiers").

So this adapter turns the loop inside out. Each episode runs the taskset's ``vf.Env`` (its own
``run(task, agents)``: ``SingleAgentEnv`` runs its one agent on the task; a subclass may script
user turns between the agent's) as an asyncio task on the package's runtime loop, with a
``vf.Agent`` of ours in its one seat; every model call that agent's harness makes is parked on a
queue and becomes an **observation**, and the agent's **action** is the answer to that call
(an OpenAI ``chat.completion``, or its SSE form, since the bundled chat programs stream).
Everything else stays the library's: the env's scripted turns and when it ends the exchange,
limits, ``@stop`` hooks, interceptors, tool servers, timeouts, error capture, scoring. The
reward is the trace's reward, at the last step.

How the answer reaches the library (``transport``): ``"inject"`` (default when available) gives
the library's interception server our queue-backed client through its **private**
``InterceptionServer._client`` hook (pin ``verifiers``); ``"http"`` serves an OpenAI-compatible
endpoint on 127.0.0.1 instead, with no private hook (details in
:mod:`openenv_gym.adapters.verifiers.v1_servers`). Either way one interception server serves
every rollout of an adapter, and each call names its rollout (the trace id), which is how the
answer reaches the right episode of a vector env.

How the code is laid out, top-down:

* :class:`VerifiersV1Adapter` (here) loads the taskset, its env and its tasks, and owns one
  :class:`~openenv_gym.adapters.verifiers.v1_servers.RolloutServers` (the shared tool servers,
  the interception server and the policy endpoint, entered and left by one task) and one
  :class:`~openenv_gym.adapters.verifiers.v1_handoff.CallRouter`.
* :class:`VerifiersV1Episode` (here) runs one episode of the env as a task
  (:mod:`openenv_gym.adapters.verifiers.v1_env`: the env's hooks, our agent in its seat) and
  plays it through its :class:`~openenv_gym.adapters.verifiers.v1_handoff.Handoff`: the one
  object where the library's model call and the agent's action meet.
* :mod:`openenv_gym.adapters.verifiers.v1_compat` imports the library and refuses, statically,
  tasksets it cannot run.

Things a user must know (also in the class docstring):

* Policy time counts against the library's timeouts: ``TimeoutConfig.rollout`` (agent stage)
  runs while the harness waits for the model, i.e. for *your* ``step()``.
* The first reset can take seconds: ``uv sync --script`` of the harness program (fetched from
  PyPI once, then cached by uv), plus a ``python -m <toolset module>`` per tool server.
* ``uv`` must be on ``PATH``; if it is not but sits next to ``sys.executable`` (a venv's
  ``bin``), that directory is prepended to ``PATH`` of this process until ``close()`` (the
  subprocess runtime passes ``os.environ`` on, minus variables containing ``API_KEY``).
* ``source=`` puts the package's parent directory on ``sys.path`` and, absolute, on
  ``PYTHONPATH`` (tool servers are spawned as ``python -m <module>``) until ``close()``, which
  puts both (and ``sys.modules``, and ``PATH``) back as they were
  (:mod:`openenv_gym.adapters.verifiers.process`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shutil
import sys
import threading
import typing
import weakref
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from openenv_gym.actions import Turn, unreadable_reply
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.adapters.verifiers.detect import resolve_source
from openenv_gym.adapters.verifiers.process import PORT_FILES, STATE
from openenv_gym.adapters.verifiers.v1_calls import LIBRARY_TAIL, SeatCalls, trace_error, trace_outcome
from openenv_gym.adapters.verifiers.v1_compat import (
    check_source_compat,
    guarded,
    guarded_async,
    translate_load_error,
)
from openenv_gym.adapters.verifiers.v1_compat import import_v1 as _import_v1
from openenv_gym.adapters.verifiers.v1_env import (
    EpisodeResult,
    agent_seats,
    check_single_agent,
    scripts_its_own_turns,
)
from openenv_gym.adapters.verifiers.v1_handoff import CallRouter, Handoff
from openenv_gym.adapters.verifiers.v1_servers import RolloutServers
from openenv_gym.errors import BackendError, ConfigurationError, ServerError, TaskNotFound
from openenv_gym.pins import script_env
from openenv_gym.wire import UNBOUNDED_TASKS, Message, Opening, Outcome, Split, TaskRef, ToolSpec

__all__ = ["LIBRARY_TAIL", "VerifiersV1Adapter", "VerifiersV1Episode", "check_source_compat"]

logger = logging.getLogger(__name__)

_SPLIT_TYPES = {"train": "train", "test": "test", "validation": "validation", "val": "validation",
                "valid": "validation", "dev": "validation", "eval": "test"}


class VerifiersV1Adapter(Adapter):
    """A Verifiers v1 taskset, played with the library's own agent loop (inverted control).

    Each episode is the taskset's ``vf.Env`` playing the task on the runtime loop, with our
    agent in its one seat. The observation at reset is the messages of the harness's first model
    request (``info["tools"]``: its ``tools``, ``info["trace_id"]``: the library's trace); each
    action answers the pending request, and the next observation is what was appended since
    (tool results, the env's scripted user turns, images as OpenAI content parts). At the end the
    reward is ``trace.reward`` (never ``None``), ``info`` holds ``rewards``, ``reward_weights``,
    ``metrics``, ``stop_condition``, ``num_turns``, ``ok`` and, when the trace failed, ``error``;
    ``terminated`` on a clean end (``agent_completed``, a task ``@stop``, or ``user_closed``: the
    env ended the exchange), ``truncated`` on a limit (``max_turns``, token limits,
    ``context_length``, ``<stage>_timeout``) or a failure (of the trace, or of the env's own
    ``run()``/``finalize()``: ``info["error"]``).

    Args:
        env_id: the taskset id as ``vf.resolve_env_config({"taskset": {"id": ...}})`` takes it
            (``owner/name@ver`` or a module name). Default: the name of ``source``.
        source: a taskset package folder, a module file, or a project folder holding
            ``<name>.py`` / ``<name>/__init__.py`` (any layout that
            :func:`openenv_gym.adapters.verifiers.detect.resolve_source` accepts): the directory it is
            imported from goes on ``sys.path`` and, absolute, on ``PYTHONPATH`` until the adapter
            closes (tool servers run as
            ``python -m <module>``). Checked statically first: a source that uses
            ``verifiers.v1`` names the installed release lacks, or whose ``pyproject.toml``
            requires a newer ``verifiers``, is refused with a ConfigurationError.
        env_args: taskset config knobs (``--env.taskset.*``). A ``split`` knob typed as a
            ``Literal`` makes one split per value; without one there is a single ``train`` split.
        env_config: the env's own knobs (``--env.*``: the fields of its ``EnvConfig``, e.g.
            ``{"attempts": 1}``, or ``{"id": "best-of-n", "n": 1}`` to play the taskset in a
            built-in env). Its agent seat's settings are the adapter's (``harness``,
            ``max_turns``, ``timeouts``, ...), except a harness the seat pins.
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
            limit. Note ``step_timeout`` (of the env or vector env) separately bounds one reset/step call.
        runtime: ``"subprocess"`` (default; the harness runs as a child process of this one),
            ``"docker"``, a dict ``{"type": ...}`` or a verifiers ``RuntimeConfig``.
        model: the model name the library records on traces.
        max_tasks: read at most this many tasks per split. An infinite (``INFINITE``) taskset plays
            without it: ``num_tasks`` is :data:`~openenv_gym.wire.UNBOUNDED_TASKS`, task ``k``
            is the ``k``-th the taskset yields (read as far as asked, up to :data:`ENDLESS_READ`),
            and ``reset(seed=k)`` plays task ``k``.
        transport: ``"auto"`` (``"inject"`` when the private ``InterceptionServer._client`` hook
            exists, else ``"http"``), ``"inject"`` or ``"http"``: see the module docstring.
        bad_arguments: tool calls whose arguments are not a JSON object: ``"forward"`` (default)
            sends them to the harness as written (the bundled chat programs answer them with an
            ``error: invalid JSON ...`` tool result and go on; unknown tools likewise), or
            ``"answer"``: the adapter answers them with a tool message and never forwards them
            (for a harness that would crash on them).

    Notes: the first reset may take seconds (``uv sync --script`` of the harness, cached after;
    each per-rollout tool server adds a ``python -m`` start). ``uv`` is looked up on ``PATH``,
    then next to ``sys.executable`` (that directory is then prepended to ``PATH`` until close).
    The library's subprocess runtime drops every environment variable containing ``API_KEY``
    from what the harness sees. Only the chat-completions dialect is answered (``null``,
    ``bash`` and other chat harnesses). The taskset's own ``vf.Env`` plays each episode (a
    ``SingleAgentEnv`` subclass may script user turns between the agent's: they arrive as
    observations); an env with several agent seats is refused, and one that starts its seat a
    second time within an episode (best-of-n) fails that step. The answers report zero token
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
        env_config: dict[str, Any] | None = None,
        harness: str | dict[str, Any] | None = None,
        max_turns: int | None = None,
        timeouts: dict[str, float | None] | None = None,
        runtime: Any = "subprocess",
        model: str = "openenv-gym-policy",
        max_tasks: int | None = None,
        transport: str = "auto",
        bad_arguments: str = "forward",
        multiagent: bool = False,
        seat_runs: dict[str, int] | None = None,
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
            found = resolve_source(self.source, noun="taskset")
            self._import_root, module = found.root, found.module
        self.env_id = env_id or module or ""
        self.env_args = dict(env_args or {})
        self.env_config = dict(env_config or {})
        if "taskset" in self.env_config:
            raise ConfigurationError("env_config holds the env's own knobs; give the taskset's as env_args")
        self.harness = harness
        self.max_turns = max_turns
        self.timeouts = dict(timeouts or {})
        self.runtime_spec = runtime
        self.model = model
        self.max_tasks = max_tasks
        self.transport = transport
        self.bad_arguments = bad_arguments
        if not isinstance(multiagent, bool):
            raise ConfigurationError(f"multiagent must be True or False, not {multiagent!r}")
        self.multiagent = multiagent
        runs = dict(seat_runs or {})
        if not multiagent and runs:
            raise ConfigurationError("seat_runs is for games (openenv_gym.multiagent.aec_env / parallel_env)")
        for seat, n in runs.items():
            if not isinstance(seat, str) or isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1024:
                raise ConfigurationError(f"seat_runs maps a seat's name to how often it runs per game (1 to 1024), "
                                         f"not {seat!r}: {n!r}")
        self.seat_runs = runs
        self.seats: list[str] = []
        """The env's seats once loaded (its ``vf.AgentConfig`` fields, in declaration order)."""
        self.uv_path_added: str | None = None
        self.harness_id: str | None = None
        self.env_class: str | None = None
        """The taskset's ``vf.Env`` class once loaded (``SingleAgentEnv`` unless it ships its own)."""
        self.scripted = False
        """Whether that env's ``run()`` is its own (scripted user turns, ...), once loaded."""
        self.router = CallRouter()
        """Where the library's model calls go: each episode binds its rollout's trace id here."""
        self._vf: Any = None
        self._env: Any = None
        self._agent_configs: dict[str, Any] = {}
        self._splits_tasks: dict[str, _SplitTasks] = {}
        self._split_names: list[str] = []
        self._servers: RolloutServers | None = None
        self._episodes: set[VerifiersV1Episode] = set()
        self._started = False
        self._closed = False
        self._undo_stack: list[Callable[[], Any]] = []
        self._undo = weakref.finalize(self, self._undo_all, self._undo_stack)
        self._undo.atexit = False

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        if self._closed:
            raise ConfigurationError("the adapter is closed")
        # Importing verifiers.v1 takes seconds and the taskset is user code: keep both off the
        # runtime loop, which other envs share.
        await asyncio.to_thread(guarded, self._load)
        self._servers = RolloutServers(vf=self._vf, env=self._env, agent_configs=self._agent_configs,
                                       router=self.router, transport=self.transport, name=self.env_id)
        await self._servers.start()
        self._started = True

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.gather(*(e.aclose() for e in list(self._episodes)), return_exceptions=True)
            if self._servers is not None:
                await self._servers.stop()
        finally:
            self._undo()

    def _hold(self, do: Callable[[], Any], undo: Callable[[], Any]) -> None:
        """Make a process-wide change now, undone at :meth:`aclose` (or when this adapter is
        garbage, its close forgotten)."""
        do()
        self._undo_stack.append(undo)

    @staticmethod
    def _undo_all(stack: list[Callable[[], Any]]) -> None:
        while stack:
            stack.pop()()

    def episode(self) -> VerifiersV1Episode:
        if self.multiagent:
            raise ConfigurationError(f"{self.env_id!r} was made for games (multiagent=True): play it with "
                                     "openenv_gym.multiagent, or one seat of it with SinglePlayer")
        return VerifiersV1Episode(self)

    @property
    def rollout_tools(self) -> bool:
        """Whether each rollout starts tool servers of its own (once started)."""
        return self._servers is not None and self._servers.rollout_tools

    @property
    def transport_used(self) -> str | None:
        """The transport in use (``"inject"`` or ``"http"``) once started."""
        return self._servers.transport if self._servers is not None else None

    @property
    def shared_tools(self) -> dict[str, Any]:
        """The taskset's shared tool servers while started (what every rollout gets), else empty."""
        return self._servers.shared_tools if self._servers is not None else {}

    # -- what episodes use ---------------------------------------------------------------------
    @property
    def serving(self) -> bool:
        """Whether episodes can start: started, and not closed."""
        return self._servers is not None and self._servers.running

    def rollout(self, task: Any, on_trace: Callable[[Any], None]) -> Coroutine[Any, Any, EpisodeResult]:
        """A coroutine playing one episode of ``task``: the taskset's ``vf.Env`` with our agent in
        its seat (the shared tools included); ``on_trace(trace)`` runs when the seat's trace
        exists, before its first model call."""
        if self._servers is None:
            raise BackendError("the Verifiers v1 adapter is not started (or is closed)")
        return self._servers.run(task, on_trace)

    def register(self, episode: VerifiersV1Episode) -> None:
        """Track a started episode, so that :meth:`aclose` closes it."""
        self._episodes.add(episode)

    def unregister(self, episode: VerifiersV1Episode) -> None:
        """Stop tracking a closed episode."""
        self._episodes.discard(episode)

    # -- loading -------------------------------------------------------------------------------
    def _load(self) -> None:
        vf = self._vf = _import_v1()
        uv_dir = _uv_dir()
        if uv_dir is not None:
            self._hold(lambda: STATE.acquire_entry("PATH", uv_dir), lambda: STATE.release_entry("PATH", uv_dir))
            self.uv_path_added = uv_dir
        if self.source is not None and self._import_root is not None:
            check_source_compat(self.source.resolve(), vf)
            root = self._import_root
            self._hold(lambda: STATE.acquire(root, pythonpath=True), lambda: STATE.release(root, pythonpath=True))
        config_data: dict[str, Any] = {**self.env_config, "taskset": {"id": self.env_id, **self.env_args}}
        try:
            env = vf.load_environment(vf.resolve_env_config(config_data))
        except ConfigurationError:
            raise
        except Exception as exc:
            raise translate_load_error(exc, self.env_id) from exc
        if self.multiagent:
            self.seats = list(agent_seats(vf, env))
            unknown = set(self.seat_runs) - set(self.seats)
            if unknown:
                raise ConfigurationError(f"seat_runs names {sorted(unknown)}, which are not seats of "
                                         f"{type(env).__name__} (its seats: {self.seats})")
        else:
            self.seats = [check_single_agent(vf, env, self.env_id)]
        self.env_class = type(env).__name__
        self.scripted = scripts_its_own_turns(vf, env)
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
        self._agent_configs = {seat: self._build_agent_config(vf, getattr(env.config, seat)) for seat in self.seats}

    def _build_agent_config(self, vf: Any, seat: Any) -> Any:
        pinned = getattr(seat, "harness", None)  # the env's own seat may pin its harness
        if self.harness is None and pinned is not None:
            harness: dict[str, Any] = pinned.model_dump(exclude_none=True)
        elif self.harness is None:
            ident = vf.default_harness_id(self.env_id)
            harness = {"id": "null" if ident == "bash" else ident}
        elif isinstance(self.harness, str):
            harness = {"id": self.harness}
        else:
            harness = dict(self.harness)
        self.harness_id = str(harness.get("id"))
        from verifiers.v1.configs.agent import TimeoutConfig

        try:
            runtime = _runtime_config(vf, self.runtime_spec)
            return vf.AgentConfig(
                model=self.model,
                harness=_held_to_pins(harness, local=isinstance(runtime, vf.SubprocessConfig)),
                runtime=runtime,
                max_turns=self.max_turns,
                timeout=TimeoutConfig(**self.timeouts),
            )
        except ConfigurationError:
            raise
        except Exception as exc:  # pydantic validation of harness / runtime / timeouts
            raise ConfigurationError(f"invalid agent settings for {self.env_id!r}: {exc}") from exc

    def _materialize(self, split: str) -> list[Any]:
        """The split's tasks, read whole; an endless taskset's only as far as asked (:meth:`_SplitTasks.upto`)."""
        entry = self._splits_tasks[split]
        if entry.tasks is None:
            ts = entry.taskset
            if self.max_tasks is not None:
                ts = ts.take(self.max_tasks) if hasattr(ts, "take") else ts.head(self.max_tasks)
            elif entry.endless:
                entry.start(ts)
                entry.upto(0, self.env_id, split)  # its first task: a load() that fails says so now
                return entry.tasks or []
            try:
                entry.tasks = list(ts)
            except ConfigurationError:
                raise
            except Exception as exc:
                raise ServerError(f"loading the tasks of {self.env_id!r} (split {split!r}) failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
        return entry.tasks

    # -- tasks -------------------------------------------------------------------------------------
    async def tools(self) -> list[ToolSpec]:
        # Tools are the harness's (MCP servers plus built-ins such as bash): they are known only
        # from its first model call, so they arrive with each reset's info["tools"].
        return []

    async def _fetch_splits(self) -> list[Split]:
        return [Split(name=n, type=_SPLIT_TYPES.get(n.lower(), "validation" if len(self._split_names) > 1 else "train"))
                for n in self._split_names]

    async def _fetch_num_tasks(self, split: str) -> int:
        tasks = await self._tasks(split)
        return UNBOUNDED_TASKS if self._splits_tasks[split].endless and self.max_tasks is None else len(tasks)

    async def _tasks(self, split: str) -> list[Any]:
        if split not in self._splits_tasks:
            raise TaskNotFound(f"unknown split {split!r}; the splits are {self._split_names}")
        if self._splits_tasks[split].tasks is None:
            return await asyncio.to_thread(self._materialize, split)
        return self._splits_tasks[split].tasks or []

    async def task_object(self, split: str, index: int) -> Any:
        """The library's ``vf.Task`` at ``index`` of ``split``."""
        tasks = await self._tasks(split)
        entry = self._splits_tasks[split]
        if entry.endless and self.max_tasks is None:
            if index < len(tasks):
                return tasks[index]
            return await asyncio.to_thread(entry.upto, index, self.env_id, split)
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

    async def resolve_task(self, task: TaskRef) -> tuple[Any, str]:
        """The library's ``vf.Task`` for ``task`` (an index of a split, or a spec), and its id."""
        split = task.split or await self.default_split()
        if task.spec is not None:
            vtask = self.task_from_spec(task.spec, split)
        else:
            vtask = await self.task_object(split, task.index or 0)
        data = vtask.data
        task_id = (getattr(data, "id", None) or getattr(data, "name", None)
                   or (f"{split}:{task.index}" if task.index is not None else getattr(vtask, "key", "task")))
        return vtask, str(task_id)

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"backend": self.kind, "taskset": self.env_id, "harness": self.harness_id,
                "env": self.env_class, "transport": self.transport_used or self.transport}
        if self.multiagent:
            info["seats"] = list(self.seats)
        return info

    # -- games (several seats; openenv_gym.multiagent) --------------------------------------------
    def game(self) -> Any:
        """A new game of a multi-agent env (``multiagent=True``): every seat played by a caller."""
        if not self.multiagent:
            raise ConfigurationError("games need the adapter made with multiagent=True (openenv_gym.multiagent)")
        from openenv_gym.adapters.verifiers.v1_game import VerifiersV1Game

        return VerifiersV1Game(self)

    def play(self, task: Any, on_trace: Callable[[str, Any, int], None],
             on_busy: Callable[[str, int, bool], None]) -> Coroutine[Any, Any, EpisodeResult]:
        """A coroutine playing one game of ``task`` with an agent of ours in every seat (see
        :meth:`RolloutServers.play <openenv_gym.adapters.verifiers.v1_servers.RolloutServers.play>`)."""
        if self._servers is None:
            raise BackendError("the Verifiers v1 adapter is not started (or is closed)")
        return self._servers.play(task, on_trace, on_busy, self.seat_runs)

    def players(self) -> list[str]:
        """Every player a game may have, in seat order: each seat, or ``seat_k`` for each of its runs."""
        from openenv_gym.adapters.verifiers.v1_env import seat_name

        return [seat_name(seat, self.seat_runs.get(seat, 1), k)
                for seat in self.seats for k in range(self.seat_runs.get(seat, 1))]


class VerifiersV1Episode(Episode):
    """One episode of one task: the env's ``run()`` as a task, its seat's model calls answered one by one.

    The rollout's model calls reach this episode through its :class:`Handoff` (bound to the
    rollout's trace id on the adapter's router): :meth:`start` returns the first call's
    messages, each :meth:`step` answers the pending call and returns what the next one added,
    and the rollout's end (no next call) is the last step, scored by the library.
    """

    def __init__(self, adapter: VerifiersV1Adapter):
        self.adapter = adapter
        self._handoff = Handoff()
        self._run: asyncio.Task[Any] | None = None
        self._trace_ids: list[str] = []
        self._calls = SeatCalls(adapter.bad_arguments)
        self.trace: Any = None
        self.finished = False

    async def start(self, task: TaskRef) -> Opening:
        adapter = self.adapter
        if not adapter.serving:
            raise BackendError("the Verifiers v1 adapter is not started (or is closed)")
        vtask, task_id = await adapter.resolve_task(task)
        rollout = adapter.rollout(vtask, on_trace=self._on_trace)
        adapter.register(self)
        self._run = asyncio.get_running_loop().create_task(
            guarded_async(rollout), name=f"verifiers-v1 rollout {adapter.env_id}")
        try:
            call = await self._handoff.next_call(self._run)
        except BaseException:
            await self.aclose()
            raise
        if call is None:
            try:
                trace, error = self._result()
            finally:
                await self.aclose()
            error = error or trace_error(trace)
            what = f"{error['type']}: {error['message']}" if error else f"stop condition {trace.stop_condition!r}"
            raise ServerError(f"the rollout of {adapter.env_id!r} ended before its first model call: {what}")
        if adapter.rollout_tools:  # its tool servers are up and their ports read by now
            await asyncio.to_thread(PORT_FILES.note)
        messages, tools = self._calls.opening(call)
        return Opening(messages=messages, tools=tools, task_id=task_id,
                       info={"trace_id": self._trace_ids[-1] if self._trace_ids else None})

    async def step(self, turn: Turn) -> Outcome:
        if self.finished or self._run is None:
            raise BackendError("the episode is not running")
        if self._run.done():
            return self._finish([])
        if turn.error is not None:
            return Outcome([unreadable_reply(turn.error)],
                           info={"invalid_action": "unreadable"})
        local, answered = self._calls.answer(turn, self._handoff.take)
        if not answered:
            return Outcome(local, info={"invalid_action": "bad_arguments", "forwarded": False})
        nxt = await self._handoff.next_call(self._run)
        if nxt is None:
            return self._finish(local)
        new, info, tools = self._calls.added(nxt)
        if local:
            info["invalid_action"] = "bad_arguments"
        return Outcome(new + local, info=info, tools=tools)

    async def aclose(self) -> None:
        self.finished = True
        adapter = self.adapter
        adapter.unregister(self)
        run, self._run = self._run, None
        if run is not None and not run.done():
            # Cancelling the episode cancels the seat's Agent.run / interaction, which aborts the
            # rollout: the library kills the harness program and the tool servers and stops the
            # runtime (Rollout.abort, shielded from re-cancel).
            run.cancel()
            done, _ = await asyncio.wait({run}, timeout=60.0)
            if not done:
                logger.warning("the rollout of %s did not stop within 60 s", adapter.env_id)
        elif run is not None and run.done() and not run.cancelled():
            run.exception()  # retrieved: no "exception was never retrieved" noise
        for trace_id in self._trace_ids:
            adapter.router.unbind(trace_id, self._handoff)
        self._handoff.close()
        if adapter.rollout_tools:
            PORT_FILES.sweep()  # the port files of tool servers that have exited, this rollout's included

    # -- internals -------------------------------------------------------------------------------
    def _on_trace(self, trace: Any) -> None:
        # Called by the library when the rollout's trace is minted, before any model call:
        # from here on, calls naming this trace id are this episode's.
        self._trace_ids.append(trace.id)
        self.adapter.router.bind(trace.id, self._handoff)

    def _result(self) -> tuple[Any, dict[str, str] | None]:
        """(the seat's trace, the env's own failure) of the finished episode."""
        assert self._run is not None and self._run.done()
        if self._run.cancelled():
            raise BackendError("the rollout was cancelled")
        exc = self._run.exception()
        if isinstance(exc, ConfigurationError):
            raise exc  # the env does what one Gymnasium episode cannot (a second rollout)
        if exc is not None:
            # Rollout failures are recorded on the trace, the env's hook failures on the result;
            # an exception here is a bug or a lifetime error of the library, raised to the
            # trainer as a backend failure.
            raise ServerError(f"the Verifiers rollout raised {type(exc).__name__}: {exc}") from exc
        result: EpisodeResult = self._run.result()
        if not result.traces:
            raise ServerError(f"the Verifiers episode of {self.adapter.env_id!r} produced no trace"
                              + (f" ({result.error['type']}: {result.error['message']})" if result.error else ""))
        self.trace = result.traces[-1]
        return self.trace, result.error

    def _finish(self, messages: list[Message]) -> Outcome:
        self.finished = True
        trace, env_error = self._result()
        reward, terminated, truncated, info = trace_outcome(trace, env_error)
        return Outcome(messages, reward=reward, terminated=terminated, truncated=truncated, info=info)


# -- helpers ---------------------------------------------------------------------------------------

ENDLESS_READ = 1_000_000
"""How far into an endless (``INFINITE``) taskset a task index may reach: task ``k`` of a generator
costs ``k`` draws and is kept once read, so an index past this is a ``TaskNotFound`` that says so
(``max_tasks=`` reads a finite prefix instead)."""


class _SplitTasks:
    """One split's taskset and its tasks: all of them, or of an endless taskset those read so far."""

    def __init__(self, taskset: Any):
        self.taskset = taskset
        self.tasks: list[Any] | None = None
        self.endless = bool(getattr(taskset, "INFINITE", False)) and not getattr(taskset, "bounded", False)
        self._source: Any = None
        self._lock = threading.Lock()

    def start(self, taskset: Any) -> None:
        """Read an endless taskset lazily from now on (``tasks`` grows as indices are asked for)."""
        self.tasks, self._source = [], iter(taskset)

    def upto(self, index: int, env_id: str, split: str) -> Any:
        """Task ``index`` of an endless taskset, reading the generator up to it (in a worker thread)."""
        if not 0 <= index < ENDLESS_READ:
            raise TaskNotFound(f"index {index} of the endless taskset {env_id!r} is past ENDLESS_READ={ENDLESS_READ:,} "
                               "(task k costs k draws of its generator); use a smaller seed or index, or max_tasks=")
        with self._lock:  # sub-envs of a vector env ask at once; the generator is read by one
            assert self.tasks is not None
            try:
                while len(self.tasks) <= index:
                    self.tasks.append(next(self._source))
            except StopIteration:
                raise TaskNotFound(f"the taskset {env_id!r} (split {split!r}) declares INFINITE but ended "
                                   f"after {len(self.tasks)} tasks") from None
            except ConfigurationError:
                raise
            except Exception as exc:
                raise ServerError(f"loading the tasks of {env_id!r} (split {split!r}) failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
            return self.tasks[index]


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


def _held_to_pins(harness: dict[str, Any], local: bool) -> dict[str, Any]:
    """A built-in harness's config with the tested set's resolution settings in its program's env.

    The library's own harness programs (``null``, ``bash``, ...) are PEP 723 scripts with unpinned
    dependencies that ``uv sync --script`` resolves on first use: :func:`openenv_gym.pins.script_env`
    dates that resolution to the tested set. ``HarnessConfig.env`` is the library's public way in
    (the runtime passes it to the ``uv`` command and the program); what the user's config sets
    there wins. A harness a taskset ships pins its own script, so it is left as it is. Off the
    host (``local=False``) the constraints file's path means nothing, so only the date goes.
    """
    ident = str(harness.get("id", "")).replace("-", "_")
    try:
        builtin = importlib.util.find_spec(f"verifiers.v1.harnesses.{ident}") is not None
    except (ImportError, ValueError):
        builtin = False
    pins = script_env() if builtin else {}
    if not local:
        pins.pop("PIP_CONSTRAINT", None)
    if not pins:
        return harness
    return {**harness, "env": {**pins, **dict(harness.get("env") or {})}}


def _uv_dir() -> str | None:
    """The directory to put on ``PATH`` so that the runtime finds ``uv``, if any is needed."""
    if shutil.which("uv"):
        return None
    bindir = Path(sys.executable).parent
    if (bindir / "uv").exists():
        return str(bindir)
    if (Path.home() / ".local" / "bin" / "uv").exists():
        return None  # where the library installs uv, and looks first (its setup prepends it to PATH)
    logger.warning("uv is not on PATH nor next to %s: the Verifiers runtime will try to install it "
                   "(pip --user, then astral.sh), which needs network; `pip install uv` avoids that",
                   sys.executable)
    return None
