"""Fleet environments: instances provisioned by fleet-python, tools over MCP, reward from a verifier.

Fleet hosts an environment as an *instance*: the orchestrator creates it (``AsyncFleet.make``),
the agent acts through the MCP tools on the instance, and the task's verifier computes the reward
on the orchestrator (docs/backends.md, "Fleet"). This adapter maps that onto the Gymnasium contract:

* ``reset``: an instance for the task's env (a fresh one, or one kept from the previous episode
  and reset, see ``reuse_instance``), one persistent MCP session to the modality's endpoint, the
  task prompt as the opening message, and the MCP tools (filtered per modality) plus a local
  ``submit_final_answer`` tool;
* ``step``: tool calls go to MCP (errors, unknown tools and bad arguments come back as tool
  messages); ``submit_final_answer`` runs the verifier and ends the episode with its reward;
* ``close``: the instance is always deleted: on close, on errors, and at interpreter exit.

SDK pitfalls handled here (docs/backends.md, "Fleet"): only the async objects are used (``AsyncFleet``,
``AsyncEnv``, the async verifier), never mixed with the sync ones; both exception trees are
caught; one client per process; HTTP retries only for transient statuses (429/5xx, connection
errors) through the SDK's own transport, which keeps ``X-Request-ID`` across retries so a
create whose answer was lost is deduplicated by the server instead of leaking an instance; a
bad env key, version, API key or quota fails at once with Fleet's own message.

Verifier code is Python from the task. By default it is never executed in this process: the
source is shipped as a bundle and runs on the orchestrator. ``trust_verifier_code=True`` uses the
SDK's ``Task.verify_detailed_async``, which also ``exec``s the source here first.
"""

from __future__ import annotations

import ast
import asyncio
import atexit
import contextlib
import hashlib
import json
import os
import re
import threading
import weakref
from typing import Any

from openenv_gym import runtime
from openenv_gym.actions import ParsedCall, Turn, no_tool_call, refuse_call, tool_message, unreadable_reply, user_message
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.adapters.fleet.detect import (
    MODALITIES,
    SPLIT_TYPES,
    load_tasks,
    normalize_task,
    split_version,
    verifier_name,
)
from openenv_gym.adapters.fleet.mcp import MCPConnection, result_content, tool_spec
from openenv_gym.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    ConfigurationError,
    ProvisioningError,
    ServerError,
    TaskNotFound,
)
from openenv_gym.wire import Message, Opening, Outcome, Split, TaskRef, ToolSpec

__all__ = ["FleetAdapter", "load_tasks", "normalize_task", "SUBMIT_TOOL"]


SUBMIT_TOOL = ToolSpec(
    name="submit_final_answer",
    description="Submit your final answer and end the task. Call it once, when you are done.",
    parameters={"type": "object", "properties": {"answer": {"type": "string", "description": "the final answer"}},
                "required": ["answer"], "additionalProperties": False},
)

_ACCUMULATOR = r">>> {0} >>>\n(.+?)\n<<< {0} <<<"


def partial_credit(stdout: str | None) -> tuple[list[Any], list[Any]] | None:
    """The SUCCESS/ERROR accumulator lists a verifier printed, or ``None`` if it printed none."""
    if not stdout:
        return None
    found = []
    for name in ("SUCCESS_ACCUMULATOR", "ERROR_ACCUMULATOR"):
        match = re.search(_ACCUMULATOR.format(name), stdout, re.DOTALL)
        value: list[Any] = []
        if match:
            try:
                value = list(ast.literal_eval(match.group(1)))
            except (ValueError, SyntaxError, TypeError):
                value = []
        found.append((match is not None, value))
    if not (found[0][0] or found[1][0]):
        return None
    return found[0][1], found[1][1]


# -- errors --------------------------------------------------------------------------------------

def _fleet_errors() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """(fatal, timeout, every Fleet error) classes, from BOTH of the SDK's exception trees."""
    import fleet._async.exceptions as aexc
    import fleet.exceptions as sexc

    fatal_names = ("FleetAuthenticationError", "FleetBadRequestError", "FleetPermissionError",
                   "FleetInstanceLimitError", "FleetConfigurationError", "FleetConflictError")
    fatal = tuple(getattr(m, n) for m in (sexc, aexc) for n in fatal_names if hasattr(m, n))
    timeout = tuple(m.FleetTimeoutError for m in (sexc, aexc))
    every = tuple(m.FleetError for m in (sexc, aexc))
    return fatal, timeout, every


def _translate(exc: BaseException, what: str) -> BaseException:
    """A typed openenv_gym error for an SDK failure, keeping Fleet's own message."""
    import httpx

    fatal, timeout, every = _fleet_errors()
    message = str(exc) or type(exc).__name__
    if isinstance(exc, fatal):
        return ProvisioningError(f"{what}: {type(exc).__name__}: {message}")
    if isinstance(exc, (timeout, httpx.TimeoutException, asyncio.TimeoutError)):
        return BackendTimeout(f"{what}: timed out: {message}")
    if isinstance(exc, (httpx.TransportError, ConnectionError)):
        return BackendUnavailable(f"{what}: {type(exc).__name__}: {message}")
    if isinstance(exc, every):
        return ServerError(f"{what}: {type(exc).__name__}: {message}")
    return exc


# -- the client and the instances ----------------------------------------------------------------

class FleetClients:
    """The process's ``AsyncFleet`` clients, one per set of settings: one HTTP pool for every adapter
    that uses the same account, not one per ``make``.

    The one owner of that state (:data:`CLIENTS`). Keys hold a digest of the API key, never the key;
    a forked child builds its own clients (an HTTP pool is bound to its parent's loop);
    :meth:`aclose` closes them all (for tests that start fresh).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[Any, ...], tuple[Any, Any]] = {}  # settings -> (client, its HTTP pool)

    def get(self, api_key: str, base_url: str | None, max_retries: int, backoff: float) -> Any:
        import httpx
        import httpx_retries
        from fleet import AsyncFleet

        key = (os.getpid(), base_url or "", hashlib.sha256(api_key.encode()).hexdigest(), max_retries, backoff)
        with self._lock:
            entry = self._clients.get(key)
            if entry is None:
                # The SDK's default retries 404 too (seconds lost on every bad route); transient only.
                policy = httpx_retries.Retry(total=max_retries, status_forcelist=[429, 500, 502, 503, 504],
                                             allowed_methods=["GET", "POST", "PATCH", "DELETE"],
                                             backoff_factor=backoff)
                transport = httpx_retries.RetryTransport(transport=httpx.AsyncHTTPTransport(retries=2), retry=policy)
                http = httpx.AsyncClient(timeout=300.0, transport=transport)
                entry = self._clients[key] = (AsyncFleet(api_key=api_key, base_url=base_url, httpx_client=http), http)
        return entry[0]

    async def aclose(self) -> None:
        """Close every client of this process (the next ``get`` builds anew)."""
        with self._lock:
            pools = [http for k, (_, http) in self._clients.items() if k[0] == os.getpid()]
            self._clients.clear()
        for http in pools:  # the HTTP pools are ours: made here, handed to each client
            with contextlib.suppress(Exception):
                await http.aclose()


CLIENTS = FleetClients()
"""This process's Fleet clients."""
_live: weakref.WeakSet[FleetAdapter] = weakref.WeakSet()


class _Instance:
    """One provisioned instance: the SDK's ``AsyncEnv``, its settings key and its heartbeat."""

    def __init__(self, env: Any, key: tuple[Any, ...], heartbeat: float | None):
        self.env = env
        self.key = key
        self.id: str = env.instance_id
        self.heartbeat_task: asyncio.Task[None] | None = None
        if heartbeat:
            self.heartbeat_task = asyncio.create_task(self._beat(heartbeat), name=f"fleet-heartbeat {self.id}")

    async def _beat(self, interval: float) -> None:
        # With heartbeat_interval set, Fleet stops an instance that misses a beat: beat twice as often.
        while True:
            await asyncio.sleep(interval / 2)
            try:
                await self.env.heartbeat()
            except Exception:
                pass  # a missed beat is retried next time; a dead instance shows up on the next call

    def mcp_url(self, modality: str) -> str:
        root = self.env.urls.root if self.env.urls is not None else None
        if not root:
            raise ServerError(f"instance {self.id} has no URLs: it cannot serve MCP")
        return root + MODALITIES[modality][1]

    async def delete(self) -> None:
        if self.heartbeat_task is not None:
            self.heartbeat_task.cancel()
        try:
            await asyncio.wait_for(self.env.close(), 60.0)
        except Exception:
            pass  # close() is best effort: the TTL ends an instance we could not reach


class FleetAdapter(Adapter):
    """Fleet environments through fleet-python and MCP.

    Args:
        env_key, version, data_key, data_version: the environment to provision (defaults for
            tasks that do not name their own; ``"env:1.2.0"`` also works).
        tasks: a Fleet task file (JSON) or a list of task dicts; their ``split`` keys make the
            splits (default ``train``).
        task: a single task dict (an alternative to ``tasks``).
        prompt: the opening message when there are no tasks (an env without a verifier: reward 0).
        modality: ``tool_use`` (the instance's API tools) or ``computer_use`` (the ``computer``
            tool of the MCP image); a task's ``task_modality`` overrides it.
        api_key, base_url: default to ``FLEET_API_KEY`` / ``FLEET_BASE_URL``; never stored in the
            spec or logged.
        ttl_seconds, heartbeat_interval, region, run_id, env_variables: passed to ``make``.
        reuse_instance: keep an episode's instance for the next episode of the same env (reset
            through the instance manager, seconds cheaper than a create); ``False``: a new
            instance every episode.
        trust_verifier_code: run verifiers through the SDK path that also executes the code in
            this process (only for task files you trust); default: remote execution only.
        partial_credit: when the verifier prints SUCCESS/ERROR accumulators and fails, the
            reward is the share of passed checks instead of 0.
        max_retries, retry_backoff: transport retries of transient HTTP failures.
        create_timeout: seconds a create may take (the SDK's default is 15 minutes).
        mcp_timeout: seconds one MCP call may take.
        system_prompt: an optional system message before the task prompt.
    """

    kind = "fleet"

    def __init__(
        self,
        *,
        env_key: str | None = None,
        version: str | None = None,
        data_key: str | None = None,
        data_version: str | None = None,
        tasks: str | os.PathLike | list[dict[str, Any]] | None = None,
        task: dict[str, Any] | None = None,
        prompt: str | None = None,
        modality: str = "tool_use",
        api_key: str | None = None,
        base_url: str | None = None,
        ttl_seconds: int | None = None,
        heartbeat_interval: int | None = None,
        region: str | None = None,
        run_id: str | None = None,
        env_variables: dict[str, Any] | None = None,
        reuse_instance: bool = True,
        trust_verifier_code: bool = False,
        partial_credit: bool = True,
        max_retries: int = 3,
        retry_backoff: float = 0.5,
        create_timeout: float = 900.0,
        mcp_timeout: float = 120.0,
        system_prompt: str | None = None,
    ):
        super().__init__()
        if modality not in MODALITIES:
            raise ConfigurationError(f"modality must be one of {sorted(MODALITIES)}, not {modality!r}")
        key = api_key or os.environ.get("FLEET_API_KEY")
        if not key:
            raise ConfigurationError("a Fleet API key is needed: pass api_key= or set FLEET_API_KEY")
        self._api_key: str = key
        self.base_url = (base_url or os.environ.get("FLEET_BASE_URL") or None)
        if self.base_url:
            self.base_url = self.base_url.rstrip("/")  # the SDK concatenates paths onto it
        env_key, version = split_version(env_key, version)
        data_key, data_version = split_version(data_key, data_version)
        if tasks is not None and task is not None:
            raise ConfigurationError("pass tasks= or task=, not both")
        if tasks is not None:
            self._tasks = load_tasks(tasks)
        elif task is not None:
            self._tasks = [normalize_task(task)]
        else:
            if not env_key:
                raise ConfigurationError("Fleet-v0 needs env_key=, a task= or a tasks= file")
            self._tasks = [normalize_task({"key": env_key, "prompt": prompt or ""})]
        for t in self._tasks:
            t["env_key"] = t["env_key"] or env_key
            t["version"] = t["version"] or version
            t["data_key"] = t["data_key"] or data_key
            t["data_version"] = t["data_version"] or data_version
            t["modality"] = t["modality"] or modality
            t["env_variables"] = {**(env_variables or {}), **t["env_variables"]}
            if not t["env_key"]:
                raise ConfigurationError(f"task {t['key']!r} names no environment: pass env_key=")
        self.modality = modality
        self.options: dict[str, Any] = {"ttl_seconds": ttl_seconds, "heartbeat_interval": heartbeat_interval,
                                        "region": region, "run_id": run_id}
        self.reuse_instance = reuse_instance
        self.trust_verifier_code = trust_verifier_code
        self.partial_credit = partial_credit
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.create_timeout = create_timeout
        self.mcp_timeout = mcp_timeout
        self.system_prompt = system_prompt
        self._fleet: Any = None
        self._idle: list[_Instance] = []
        self._busy: set[_Instance] = set()
        self._closed = False
        self._verifiers: dict[str, Any] = {}

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            import fleet  # noqa: F401
            import mcp  # noqa: F401
        except ImportError as exc:
            raise ConfigurationError(f"Fleet environments need the fleet extra: pip install 'openenv-gym[fleet]' ({exc})") from None
        self._fleet = CLIENTS.get(self._api_key, self.base_url, self.max_retries, self.retry_backoff)
        _live.add(self)

    async def aclose(self) -> None:
        """Delete every instance this adapter holds (idle or in use). Idempotent."""
        self._closed = True
        instances, self._idle = [*self._idle, *self._busy], []
        self._busy.clear()
        await asyncio.gather(*(i.delete() for i in instances), return_exceptions=True)
        _live.discard(self)

    def episode(self) -> Episode:
        return FleetEpisode(self)

    def info(self) -> dict[str, Any]:
        return {"backend": self.kind, "modality": self.modality}

    # -- tasks -----------------------------------------------------------------------------------
    async def tools(self) -> list[ToolSpec]:
        # The tools live on an instance; listing them here would provision one just to look.
        # Episodes report the real list at reset (info["tools"]).
        return [SUBMIT_TOOL]

    async def _fetch_splits(self) -> list[Split]:
        names = list(dict.fromkeys(t["split"] for t in self._tasks))
        return [Split(name=n, type=SPLIT_TYPES.get(n, "validation")) for n in names]

    async def _fetch_num_tasks(self, split: str) -> int:
        return sum(1 for t in self._tasks if t["split"] == split)

    async def task(self, split: str, index: int) -> dict[str, Any]:
        tasks = [t for t in self._tasks if t["split"] == split]
        if not 0 <= index < len(tasks):
            raise TaskNotFound(f"split {split!r} has no task {index}")
        return dict(tasks[index])

    # -- instances -------------------------------------------------------------------------------
    @staticmethod
    def _instance_key(task: dict[str, Any]) -> tuple[Any, ...]:
        return (task["env_key"], task["version"], task["data_key"], task["data_version"], task["modality"],
                json.dumps(task["env_variables"], sort_keys=True))

    async def acquire(self, task: dict[str, Any]) -> tuple[_Instance, bool]:
        """An instance for ``task``: a kept one, reset, or a new one. Returns (instance, reused)."""
        if self._closed:
            raise BackendError("the Fleet adapter is closed")
        key = self._instance_key(task)
        while self.reuse_instance:
            kept = next((i for i in self._idle if i.key == key), None)
            if kept is None:
                break
            self._idle.remove(kept)
            try:
                await asyncio.wait_for(kept.env.reset(), 120.0)
            except Exception:
                await kept.delete()  # a kept instance that cannot reset is replaced
                continue
            self._busy.add(kept)
            return kept, True
        env_key = task["env_key"] + (f":{task['version']}" if task["version"] else "")
        data_key = None
        if task["data_key"]:
            data_key = task["data_key"] + (f":{task['data_version']}" if task["data_version"] else "")
        try:
            env = await self._fleet.make(
                env_key, data_key=data_key, image_type=MODALITIES[task["modality"]][0],
                env_variables=task["env_variables"] or None, timeout=self.create_timeout,
                max_wait_seconds=max(1, int(self.create_timeout) - 30), **self.options)
        except Exception as exc:
            raise _translate(exc, f"creating a {env_key!r} instance failed") from exc
        instance = _Instance(env, key, self.options["heartbeat_interval"])
        self._busy.add(instance)
        if self._closed:  # closed while the create was in flight
            await self.release(instance, keep=False)
            raise BackendError("the Fleet adapter is closed")
        return instance, False

    async def release(self, instance: _Instance, *, keep: bool) -> None:
        """Give an instance back: kept for reuse (if configured and healthy) or deleted."""
        self._busy.discard(instance)
        if keep and self.reuse_instance and not self._closed:
            self._idle.append(instance)
        else:
            await instance.delete()

    # -- reward ----------------------------------------------------------------------------------
    async def verify(self, instance: _Instance, task: dict[str, Any], final_answer: str | None) -> tuple[float, dict[str, Any]]:
        """Run the task's verifier on the instance; (reward, info about the run)."""
        source = task["verifier_func"]
        if not source:
            return 0.0, {"verifier": "none"}
        try:
            if self.trust_verifier_code:
                from fleet import Task

                response = await Task(key=task["key"], prompt=task["prompt"], env_id=task["env_key"],
                                      version=task["version"], verifier_func=source
                                      ).verify_detailed_async(instance.env, final_answer=final_answer)
            else:
                response = await self._remote_verifier(task).remote_with_response(instance.env, final_answer=final_answer)
        except Exception as exc:
            raise _translate(exc, f"running the verifier of task {task['key']!r} failed") from exc
        data = response.model_dump() if hasattr(response, "model_dump") else dict(response)
        stdout = data.get("stdout")
        run = {"success": bool(data.get("success")), "result": data.get("result"),
               "execution_time_ms": data.get("execution_time_ms"), "stdout": stdout}
        if not data.get("success"):
            error = data.get("error") or {}
            if not isinstance(error, dict):
                error = {"message": str(error)}
            run["error"] = {"type": error.get("type") or "VerifierError", "message": error.get("message") or "the verifier failed"}
            return 0.0, run
        result = data.get("result")
        if isinstance(result, dict):
            result = result.get("score", 0.0)
        try:
            score = 1.0 if result is None else float(result)
        except (TypeError, ValueError):
            run["error"] = {"type": "VerifierError", "message": f"the verifier returned {result!r}, not a number"}
            return 0.0, run
        credit = partial_credit(stdout)
        if credit is not None:
            passed, failed = credit
            run["checks_passed"], run["checks_failed"] = len(passed), len(failed)
            if self.partial_credit and score < 1.0 and passed:
                score = max(score, len(passed) / (len(passed) + len(failed)))
                run["partial_credit"] = True
        return score, run

    def _remote_verifier(self, task: dict[str, Any]) -> Any:
        """The SDK's verifier object for ``task``, built from the raw source without running it."""
        cached = self._verifiers.get(task["key"])
        if cached is not None and cached[0] == task["verifier_func"]:
            return cached[1]
        from fleet._async.verifiers.verifier import AsyncVerifierFunction

        name = verifier_name(task["verifier_func"])

        def placeholder(env: Any, *args: Any, **kwargs: Any) -> None:  # never called: runs remotely
            raise RuntimeError("remote-only verifier")

        placeholder.__name__ = placeholder.__qualname__ = name
        verifier = AsyncVerifierFunction(placeholder, key=task["key"], raw_code=task["verifier_func"])
        self._verifiers[task["key"]] = (task["verifier_func"], verifier)
        return verifier

    @property
    def mcp_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"}


class FleetEpisode(Episode):
    """One task on one instance, with one MCP session."""

    def __init__(self, adapter: FleetAdapter):
        self.adapter = adapter
        self.instance: _Instance | None = None
        self.mcp: MCPConnection | None = None
        self.task: dict[str, Any] = {}
        self.tools: dict[str, ToolSpec] = {}
        self.finished = False
        self.healthy = True

    async def start(self, task: TaskRef) -> Opening:
        adapter = self.adapter
        if task.spec is not None:
            spec = normalize_task(task.spec)
            for key in ("env_key", "version", "data_key", "data_version", "modality"):
                spec[key] = spec[key] or (adapter._tasks[0][key] if adapter._tasks else None)
            if not spec["env_key"]:
                raise ConfigurationError("the task names no environment (env_key)")
            spec["modality"] = spec["modality"] or adapter.modality
        else:
            spec = await adapter.task(task.split or await adapter.default_split(), task.index or 0)
        self.task = spec
        self.instance, reused = await adapter.acquire(spec)
        try:
            self.mcp = MCPConnection(self.instance.mcp_url(spec["modality"]), adapter.mcp_headers,
                                     timeout=adapter.mcp_timeout)
            await self.mcp.connect()
            tools = [tool_spec(t) for t in await self.mcp.list_tools()]
        except BaseException as exc:
            self.healthy = False
            await self.aclose()
            if not isinstance(exc, Exception):
                raise exc  # cancellation, interrupts: as they are
            raise _translate(exc, "opening the instance's MCP session failed") from exc
        if spec["modality"] == "computer_use":
            tools = [t for t in tools if t.name == "computer"]
        else:
            tools = [t for t in tools if t.name != "computer"]
        tools = [t for t in tools if t.name != SUBMIT_TOOL.name] + [SUBMIT_TOOL]
        self.tools = {t.name: t for t in tools}
        messages: list[Message] = []
        if adapter.system_prompt:
            messages.append({"role": "system", "content": adapter.system_prompt})
        messages.append(user_message(spec["prompt"]))
        info = {"instance_id": self.instance.id, "instance_reused": reused, "env_key": spec["env_key"],
                "modality": spec["modality"]}
        return Opening(messages=messages, tools=tools, task_id=spec["key"], info=info)

    async def step(self, turn: Turn) -> Outcome:
        if self.instance is None or self.mcp is None:
            raise BackendError("the episode has no instance (it has not started, or it failed and was closed)")
        try:
            return await self._step(turn)
        except BaseException:
            # The episode cannot go on; its instance must not outlive it (nor go back to the pool).
            self.healthy = False
            await asyncio.shield(self.aclose())
            raise

    async def _step(self, turn: Turn) -> Outcome:
        assert self.mcp is not None
        if turn.error is not None:
            return Outcome([unreadable_reply(turn.error)])
        if not turn.calls:
            return no_tool_call(f"Act through the tools, and call {SUBMIT_TOOL.name} with your answer when you are done.")
        messages: list[Message] = []
        results: list[dict[str, Any]] = []
        info: dict[str, Any] = {"calls": results}
        reward = 0.0
        for call in turn.calls:
            refused = refuse_call(call, self.tools, self.finished)
            if refused is not None:
                messages.append(refused[0])
                results.append(refused[1])
                continue
            if call.name == SUBMIT_TOOL.name:
                reward, run = await self._submit(call)
                info["verifier"] = run
                if "error" in run:
                    info["error"] = run["error"]
                messages.append(tool_message(call.id, call.name, "Answer submitted."))
                results.append({"name": call.name, "ok": True, "reward": reward})
                continue
            try:
                result = await self.mcp.call_tool(call.name, call.arguments or {})
            except Exception as exc:
                raise _translate(exc, f"the MCP call {call.name!r} failed") from exc
            content, is_error = result_content(result)
            messages.append(tool_message(call.id, call.name, content))
            results.append({"name": call.name, "ok": not is_error})
        return Outcome(messages, reward=reward, terminated=self.finished, info=info)

    async def _submit(self, call: ParsedCall) -> tuple[float, dict[str, Any]]:
        assert self.instance is not None
        answer = (call.arguments or {}).get("answer")
        answer = answer if isinstance(answer, str) or answer is None else json.dumps(answer)
        self.finished = True
        return await self.adapter.verify(self.instance, self.task, answer)

    async def aclose(self) -> None:
        mcp, self.mcp = self.mcp, None
        if mcp is not None:
            await mcp.aclose()
        instance, self.instance = self.instance, None
        if instance is not None:
            await self.adapter.release(instance, keep=self.healthy)


def _delete_leftovers() -> None:
    """At interpreter exit, delete the instances of adapters nobody closed."""
    adapters = list(_live)
    if not adapters:
        return

    async def close_all() -> None:
        await asyncio.gather(*(a.aclose() for a in adapters), return_exceptions=True)

    try:
        runtime.run_sync(close_all(), 60.0)
    except Exception:
        pass


atexit.register(_delete_leftovers)
