"""Served sessions: each client session of a protocol server is one slot of a session pool.

A protocol server (:mod:`openenv_gym.serving.ors`, :mod:`openenv_gym.serving.openenv`) speaks
its wire format; what a session *does* is here, once, for both:

* A session is a :class:`~openenv_gym.pool.Slot` leased from the :class:`~openenv_gym.pool.SessionPool`
  of the served id, so deadlines, recreation of a failed backend session, isolation (host
  processes) and Ray placement are the shard's. Starting an episode is ``slot.reset``, with the
  reset options ``gym.make`` takes (``split``, ``index``, ``task``) and its seeded task choice.
* A tool call becomes the assistant message a Gymnasium agent would write (one tool call), and
  :data:`RESPOND` becomes plain assistant text, so rewards, episode ends and the messages the
  agent reads are exactly what ``env.step`` gives. Every call is stepped, refused ones too (an
  unknown tool counts as a turn, as in Gymnasium); the outcome says when the env did not run it
  (:attr:`CallOutcome.refused`), which each protocol reports in its own way.
* Sessions are found by id, run one call at a time (a second waits), and end on the client's
  request, when idle for ``session_idle_timeout`` seconds (a client that went away), or at
  shutdown; ending one cancels its running call and gives its slot back (the backend episode is
  ended).

Everything here runs on the runtime loop (:func:`openenv_gym.runtime.get_loop`), where the pool
lives and where the protocol servers' handlers run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
from gymnasium.envs.registration import parse_env_id

from openenv_gym.actions import Turn, check_call, parse_action
from openenv_gym.errors import ConfigurationError, EpisodeNotStarted, TaskNotFound
from openenv_gym.pool import SessionPool, Slot
from openenv_gym.serving.content import message_items, text_of
from openenv_gym.serving.limits import END_TIMEOUT, SESSION_IDLE_TIMEOUT, TASK_RANGE_LIMIT
from openenv_gym.wire import UNBOUNDED_TASKS, Message, Split, ToolSpec

__all__ = ["ServedEnv", "Session", "CallOutcome", "RESPOND", "answers_in_text", "listed", "served_name"]

RESPOND = ToolSpec(
    "respond",
    "Reply to the environment with a plain-text message (your answer, or your next message in the "
    "conversation).",
    {"type": "object", "properties": {"content": {"type": "string", "description": "The message."}},
     "required": ["content"], "additionalProperties": False},
)
"""The tool a plain-text answer is sent with: its ``content`` is the assistant's message."""

_TEXT_ADAPTERS = ("openenv_gym.adapters.verifiers.adapter",)
"""Adapter modules whose agents may answer in plain text besides calling tools (a Verifiers
ToolEnv ends its rollout on a message without tool calls)."""


def listed(tools: list[ToolSpec], text_answers: bool) -> list[ToolSpec]:
    """The tools a session lists: the env's, and :data:`RESPOND` when text is an answer (the env
    has no tools, or its agents answer in text) and no tool of the env has its name."""
    if RESPOND.name not in {t.name for t in tools} and (text_answers or not tools):
        return [*tools, RESPOND]
    return list(tools)


def served_name(env_id: str) -> str:
    """The name an id is served under: the id's own name (``openenv/Arithmetic-v0``: ``Arithmetic``)."""
    _, name, _ = parse_env_id(env_id)
    return name


def answers_in_text(env_id: str) -> bool:
    """Whether ``env_id``'s agent may answer in plain text as well as with its tools, read from
    its registration (nothing is started): the ids of the Verifiers adapters."""
    from openenv_gym.registration import env_info

    entry = str(env_info(env_id)["kwargs"].get("adapter") or "")
    return entry.partition(":")[0].startswith(_TEXT_ADAPTERS)


# What each JSON Schema type takes, as the SDK servers' validation (pydantic, lax) takes it: a
# number given as "5" is coerced there, so only a value no coercion reads is refused here.
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int, float, str), "number": (int, float, str), "boolean": (bool, int, str),
    "array": (list,), "object": (dict,), "null": (type(None),)}


def _wrong_types(arguments: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """Which argument has a JSON type its tool's schema does not allow (``expression`` given a
    number where a string is wanted), as the SDK servers' own validation refuses it; ``None`` if
    every typed top-level argument fits."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return None
    for key, value in arguments.items():
        spec = properties.get(key)
        wanted = spec.get("type") if isinstance(spec, dict) else None
        names = [wanted] if isinstance(wanted, str) else wanted if isinstance(wanted, list) else []
        if not names or not all(isinstance(n, str) and n in _JSON_TYPES for n in names):
            continue  # untyped, or a type this check does not know: the env decides
        kinds = tuple(t for n in names for t in _JSON_TYPES[n])
        if not isinstance(value, kinds):
            return f"argument {key!r} must be {' or '.join(names)}, not {type(value).__name__}"
    return None


class CallOutcome(msgspec.Struct):
    """What one tool call produced, protocol-neutral."""

    items: list[dict[str, Any]]
    """The content items of the env's new messages (:mod:`openenv_gym.serving.content`)."""
    reward: float | None = 0.0
    """The step's reward; ``None`` when the env reported none for the call (an OpenEnv tool
    without a reward, an ORS output with ``reward: null``), as the env's own server sends it."""
    terminated: bool = False
    truncated: bool = False
    turn: int = 0
    refused: str | None = None
    """Why the env did not run the call: ``not_found`` (no such tool), ``input_validation`` (bad
    arguments), ``episode_finished`` (the episode had ended; nothing was stepped)."""
    error: str | None = None
    """The refusal as the agent reads it, or the env's ``info["error"]`` message."""
    data: Any = None
    """The tool's own value where the env gave one beside its text (an OpenEnv MCP tool's
    ``data``: a dict tool's dict), else ``None``."""
    structured: Any = None
    """The tool's structured content where the env gave it (FastMCP's ``structured_content``)."""

    @property
    def finished(self) -> bool:
        return self.terminated or self.truncated

    def metadata(self) -> dict[str, Any]:
        """What the protocols send beside the content (never the task spec or the env's info)."""
        meta: dict[str, Any] = {"turn": self.turn, "terminated": self.terminated, "truncated": self.truncated}
        if self.error is not None:
            meta["error"] = self.error
        return meta


def _reported(reward: float, records: Any) -> float | None:
    """The step's reward as the env reported it: ``None`` when every call's record says the env
    gave none (Gymnasium's reward counted it 0), else ``reward``."""
    if reward == 0.0 and isinstance(records, list) and records and all(
            isinstance(r, dict) and "reward" in r and r["reward"] is None for r in records):
        return None
    return reward


class Session:
    """One client session: a leased slot, the episode it plays, and the tools it lists."""

    def __init__(self, served: ServedEnv, sid: str, slot: Slot):
        self.served, self.id, self.slot = served, sid, slot
        self.env_tools: dict[str, ToolSpec] = {t.name: t for t in served.pool.tools}
        self.started = False
        self.done = False
        self.turns = 0
        self.episode_id: str | None = None
        self.opening: list[Message] = []
        self.task_info: dict[str, Any] = {}
        self.last_active = time.monotonic()
        self.closed = False
        self.attached = False
        """A WebSocket is attached (OpenEnv): the session is that socket's while it is open."""
        self.on_end: Callable[[], Any] | None = None
        """Called when the session ends (an attached socket is closed by it)."""
        self._lock = asyncio.Lock()
        self._running: set[asyncio.Task[Any]] = set()

    # -- what the session offers -------------------------------------------------------------------
    @property
    def tools(self) -> list[ToolSpec]:
        """The tools the client may call (:func:`listed`)."""
        return listed(list(self.env_tools.values()), self.served.text_answers)

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def touch(self) -> None:
        self.last_active = time.monotonic()

    # -- the episode ----------------------------------------------------------------------------------
    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None,
                    episode_id: str | None = None) -> list[Message]:
        """Start an episode (as ``env.reset(seed, options)``); its opening messages."""
        async with self._hold():
            self.started = False
            obs, info = await self.slot.reset(seed, options)
            if isinstance(info.get("tools"), list):
                self.env_tools = {t.name: t for t in map(ToolSpec.from_openai, info["tools"])}
            self.started, self.done, self.turns = True, False, 0
            self.episode_id = episode_id or uuid.uuid4().hex
            self.opening = list(obs)
            self.task_info = {k: info.get(k) for k in ("task_id", "split", "index")}
            return self.opening

    async def call(self, name: str, arguments: dict[str, Any] | None) -> CallOutcome:
        """Run one tool call (or :data:`RESPOND`) as an env step; see :class:`CallOutcome`."""
        async with self._hold():
            if not self.started:
                raise EpisodeNotStarted("no episode is running: reset the session (ORS: create it) first")
            if self.done:
                return CallOutcome([], turn=self.turns, terminated=True, refused="episode_finished",
                                   error="the episode has finished; no further calls are run (reset to play again)")
            arguments = {} if arguments is None else arguments
            problem: tuple[str, str] | None = None
            turn: Turn | None = None
            if name == RESPOND.name and name not in self.env_tools:
                content = arguments.get("content") if isinstance(arguments, dict) else None
                if not isinstance(content, str) or set(arguments) - {"content"}:
                    return CallOutcome([], turn=self.turns, refused="input_validation",
                                       error="respond takes one argument, content: a string")
                action: Any = content
            else:
                call = {"name": name, "arguments": arguments}
                action = {"role": "assistant", "content": None,
                          "tool_calls": [{"id": f"call_{self.turns}", "type": "function", "function": call}]}
                turn = parse_action(action)
                problem = self._refusal(turn, name)
            obs, reward, terminated, truncated, info = await self.slot.step(action, turn)
            self.turns += 1
            self.done = terminated or truncated
            if isinstance(info.get("tools"), list):
                self.env_tools = {t.name: t for t in map(ToolSpec.from_openai, info["tools"])}
            error = info.get("error")
            records = info.get("calls")
            record = records[0] if isinstance(records, list) and len(records) == 1 and isinstance(records[0], dict) \
                else {}
            outcome = CallOutcome(message_items(obs), _reported(float(reward), records), bool(terminated),
                                  bool(truncated), self.turns,
                                  error=error.get("message") if isinstance(error, dict) else None,
                                  data=record.get("data"), structured=record.get("structured_content"))
            if problem is not None and not self.done:
                # The env answered the call without running it: the protocols' own refusal, in the
                # env's words (an ended episode is reported as such, never as a refusal).
                outcome.refused, outcome.error = problem[0], text_of(outcome.items) or problem[1]
            return outcome

    def _refusal(self, turn: Turn, name: str) -> tuple[str, str] | None:
        if turn.error is not None or not turn.calls:
            return "input_validation", turn.error or "the call could not be read"
        problem = check_call(turn.calls[0], self.env_tools)
        if problem is None:
            wrong = _wrong_types(turn.calls[0].arguments or {}, self.env_tools[name].parameters or {})
            return ("input_validation", f"Error: tool {name!r} was not run: {wrong}.") if wrong else None
        return ("not_found" if name not in self.env_tools else "input_validation"), problem

    def state(self) -> dict[str, Any]:
        """The OpenEnv ``state`` of the session: its episode id and step count."""
        return {"episode_id": self.episode_id, "step_count": self.turns}

    # -- running and ending ---------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _hold(self) -> Any:
        """One call at a time (a second waits its turn), never on an ended session."""
        if self.closed:
            raise EpisodeNotStarted("the session has ended")
        self.touch()
        task = asyncio.current_task()
        async with self._lock:
            if self.closed:
                raise EpisodeNotStarted("the session has ended")
            if task is not None:
                self._running.add(task)
            try:
                yield
            finally:
                self._running.discard(task)
                self.touch()

    def run(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """``coro`` as a task of this session: ending the session cancels it (a call that must
        outlive its request, as ORS's resumable tool calls do)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    async def _end(self) -> None:
        self.closed = True
        if self.on_end is not None:
            self.on_end()
        running = [t for t in self._running if t is not asyncio.current_task()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=END_TIMEOUT)
        await self.slot.release()


class ServedEnv:
    """One served id: its pool, its name, its sessions and its task API.

    Args:
        env_id: the id served (``openenv/Arithmetic-v0``).
        pool: the sessions' pool (this object closes nothing of it: the server does).
        session_idle_timeout: see :data:`SESSION_IDLE_TIMEOUT`.
        text_answers: the env's agents may answer in text besides their tools (default: from the
            id's registration, :func:`answers_in_text`).
    """

    def __init__(self, env_id: str, pool: SessionPool, *, session_idle_timeout: float | None = SESSION_IDLE_TIMEOUT,
                 text_answers: bool | None = None):
        if session_idle_timeout is not None and not session_idle_timeout > 0:
            raise ConfigurationError("session_idle_timeout must be a positive number of seconds, or None")
        self.env_id, self.pool = env_id, pool
        self.name = served_name(env_id)
        self.text_answers = answers_in_text(env_id) if text_answers is None else text_answers
        self.idle_timeout = session_idle_timeout
        self._sessions: dict[str, Session] = {}
        self._reaper: asyncio.Task[None] | None = None
        self.reaped = 0
        """Sessions ended for idleness."""

    @property
    def max_sessions(self) -> int:
        size = self.pool.size
        assert size is not None  # a served pool has a size (Server makes it with SessionPool.make)
        return size

    @property
    def active(self) -> int:
        return len(self._sessions)

    def tools(self) -> list[ToolSpec]:
        """The tools every task offers, as a session lists them before its first episode."""
        return listed(list(self.pool.tools), self.text_answers)

    # -- sessions ---------------------------------------------------------------------------------------
    def open(self, sid: str | None = None) -> Session:
        """A new session on a free slot (:class:`~openenv_gym.errors.CapacityReached` when all
        ``max_sessions`` are in use); ``sid``: the client's id for it (ORS), else one is made."""
        sid = sid or uuid.uuid4().hex
        if sid in self._sessions:
            raise ConfigurationError("Session already exists")
        session = Session(self, sid, self.pool.lease())
        self._sessions[sid] = session
        if self._reaper is None and self.idle_timeout is not None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        return session

    def get(self, sid: str | None) -> Session | None:
        """The live session ``sid`` (its idle time starts again), or ``None``."""
        session = self._sessions.get(sid) if sid else None
        if session is not None:
            session.touch()
        return session

    async def end(self, session: Session) -> None:
        """End ``session``: cancel its call, end its episode, give its slot back. Idempotent."""
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]
        if not session.closed:
            await session._end()

    async def _reap(self) -> None:
        assert self.idle_timeout is not None
        period = min(5.0, max(0.05, self.idle_timeout / 4))
        while True:
            await asyncio.sleep(period)
            cutoff = time.monotonic() - self.idle_timeout
            idle = [s for s in self._sessions.values() if s.last_active < cutoff and not s.busy]
            for session in idle:
                self.reaped += 1
                await self.end(session)

    async def aclose(self) -> None:
        """End every session (at shutdown)."""
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        sessions = list(self._sessions.values())
        await asyncio.gather(*(self.end(s) for s in sessions), return_exceptions=True)

    # -- the task API (the trainer's: specs may hold answers) --------------------------------------------
    async def splits(self) -> list[Split]:
        return await self.pool.splits()

    async def num_tasks(self, split: str) -> int:
        names = [s.name for s in await self.splits()]
        if split not in names:
            raise TaskNotFound(f"unknown split {split!r}; the splits are {names}")
        return await self.pool.num_tasks(split)

    async def task(self, split: str, index: int) -> dict[str, Any]:
        """The task spec at ``index`` (Python indexing: ``-1`` is the last)."""
        n = await self.num_tasks(split)
        resolved = index + n if index < 0 else index
        if not 0 <= resolved < n:
            raise TaskNotFound(f"index {index} is outside split {split!r} ({n} tasks)")
        return await self.pool.task(split, resolved)

    async def task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        """The task specs of ``split[start:stop]`` (slice semantics), at most :data:`TASK_RANGE_LIMIT`.

        A split that never ends (``num_tasks`` is :data:`~openenv_gym.wire.UNBOUNDED_TASKS`) has no
        end to count from: it takes a range from a start, ``0 <= start <= stop``."""
        count = await self.num_tasks(split)
        if count == UNBOUNDED_TASKS and (stop is None or stop < 0 or (start or 0) < 0):
            raise ConfigurationError(
                f"split {split!r} never ends (its num_tasks, {UNBOUNDED_TASKS:,}, stands for 'unbounded': task k is "
                "the env's reset with seed k): ask for a range with 0 <= start <= stop")
        indices = range(count)[start:stop]
        if len(indices) > TASK_RANGE_LIMIT:
            raise ConfigurationError(f"{len(indices)} tasks asked at once; at most TASK_RANGE_LIMIT="
                                     f"{TASK_RANGE_LIMIT} per request: ask for a range (task_range start/stop)")
        return list(await asyncio.gather(*(self.pool.task(split, i) for i in indices)))
