"""RayVectorEnv: shards of sub-envs hosted in async Ray actors, steps shipped as msgpack bytes.

Design:

* **Few actors, many sub-envs each.** An actor costs about 50 MiB and 0.4 s to start, and Ray
  carries only 1-2k calls/s on a small machine, while an LLM sub-env spends its time waiting on
  I/O. So sub-env ``i`` lives in actor ``i % num_actors`` (default: one actor per cluster CPU),
  and each :class:`EnvHost` runs its sub-envs' episodes concurrently as coroutines on its own
  event loop over a few shared adapters (``envs_per_client`` sessions per adapter: one local
  server per actor, small connection pools), exactly as :class:`ConcurrentVectorEnv` does in the
  driver. A ``send`` makes **one actor call per shard**, whatever the number of sub-envs in it.
* **Bytes, not objects.** Ops and results cross Ray as msgspec msgpack bytes
  (:func:`~openenv_gym.vector.ops.encode_ops` / ``encode_results``): Ray passes bytes through
  untouched, while pickling msgspec Structs costs several times a msgpack round trip. Rare
  control calls (``call``, ``set_attr``) use Ray's pickling, since their values are arbitrary.
* **Fault model.** An op that fails inside an actor (a server down, a timeout, a tool raising) is
  already a :class:`~openenv_gym.vector.ops.Result` with ``error`` set (:func:`run_op` never
  raises), and :class:`~openenv_gym.vector.base.AgentVectorEnv` truncates and recreates that
  sub-env. If the *actor* dies (killed, out of memory, its node lost) or stops answering (a call
  takes longer than ``3 * step_timeout + 30`` s), every op of the failed call gets a truncated
  ``Result`` with ``info["error"]``, and the actor is killed and replaced by a fresh
  :class:`EnvHost` for the same sub-env ids; the other shards go on. The replacement knows it
  replaced a dead host: a sub-env of that shard whose next op is a step (its episode died with
  the old actor) is answered with the same truncated error instead of being stepped, and every
  sub-env is back to normal after its next reset. Episodes in a dead actor are lost, and so is
  the task-choice rng of its sub-envs (a replacement starts unseeded until the next seeded reset).
* Ray is optional (``pip install 'openenv-gym[ray]'``): only this module imports it. When no Ray
  runtime is initialised, the first env calls ``ray.init()`` (locally, or to ``address``) and
  the last such env to close calls ``ray.shutdown()``; a runtime the caller started is left alone.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import numpy as np
from gymnasium.vector import AutoresetMode

from openenv_gym import runtime
from openenv_gym.actions import parse_action
from openenv_gym.adapters.base import Adapter, AdapterSpec, accepted_kwargs
from openenv_gym.errors import BackendTimeout, ConfigurationError
from openenv_gym.redact import RedactedSpec
from openenv_gym.session import STEP_TIMEOUT, EnvSession
from openenv_gym.vector.base import AgentVectorEnv
from openenv_gym.vector.ops import (
    Op, Result, call_each, decode_ops, decode_results, encode_ops, encode_results, run_op,
)
from openenv_gym.vector.wrapped import SubEnvWrappers, check_wrappers
from openenv_gym.wire import ToolSpec

try:
    import ray
    import ray.exceptions as ray_errors
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ConfigurationError(
        "the 'ray' vector backend needs Ray: pip install 'openenv-gym[ray]'"
    ) from exc

__all__ = ["RayVectorEnv", "EnvHost", "RemoteEnvHost"]

_tools_encoder = msgspec.msgpack.Encoder()
_tools_decoder = msgspec.msgpack.Decoder(list[ToolSpec])

# Failures of the actor itself (as opposed to an exception raised by its code): replace it.
_ACTOR_FAULTS: tuple[type[BaseException], ...] = (
    ray_errors.RayActorError,  # ActorDiedError, ActorUnavailableError
    ray_errors.WorkerCrashedError,
    ray_errors.OutOfMemoryError,
    ray_errors.ObjectLostError,
)
_START_TIMEOUT = 600.0
"""Seconds the actors of a new env may take to start (actor creation plus the adapters' start)."""
_CLOSE_TIMEOUT = 30.0
_TIMEOUT_MARGIN = 30.0


def _error(exc: BaseException, message: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": type(exc).__name__, "message": message or str(exc)}
    if isinstance(exc, ConfigurationError):
        error["user"] = True
    return error


def _failed(op: Op, error: dict[str, Any]) -> Result:
    """The answer to ``op`` when it could not run: truncated, no observation, ``info["error"]``."""
    return Result(op.env_id, op.req_id, [], 0.0, False, True, {"error": error}, error=error)


def _cause(exc: BaseException) -> BaseException:
    """The exception an actor method raised, out of Ray's ``RayTaskError`` wrapper."""
    cause = getattr(exc, "cause", None) if isinstance(exc, ray_errors.RayTaskError) else None
    return cause if isinstance(cause, BaseException) else exc


def _first_line(exc: BaseException, limit: int = 500) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


# -- the actor -------------------------------------------------------------------------------------
class EnvHost:
    """An async Ray actor hosting a shard of sub-envs: one :class:`EnvSession` per sub-env id,
    over ``ceil(len(env_ids) / envs_per_client)`` adapters built from the adapter recipe.

    Every method is a coroutine on the actor's event loop (Ray runs many at once), so the
    sub-envs' ops run concurrently; nothing here uses openenv_gym's runtime thread. The driver
    runs it as :data:`RemoteEnvHost` (``ray.remote(EnvHost)``); the plain class stays importable
    by name so that Ray ships it by reference rather than pickling its code and module globals.
    """

    def __init__(
        self,
        entry: str,
        adapter_kwargs: dict[str, Any],
        env_ids: list[int],
        split: str | None,
        max_turns: int | None,
        envs_per_client: int,
        step_timeout: float | None,
        replaced: bool = False,
        env_wrappers: list[Any] | None = None,
    ):
        self._spec = AdapterSpec(entry, adapter_kwargs)
        self._wrapped = SubEnvWrappers(env_wrappers, len(env_ids)) if env_wrappers else None
        self._ids = list(env_ids)
        self._local = {i: k for k, i in enumerate(self._ids)}
        self._split, self._max_turns = split, max_turns
        self._num_adapters = max(1, math.ceil(len(self._ids) / max(1, envs_per_client)))
        self._step_timeout = step_timeout
        self._adapters: list[Adapter] = []
        self._sessions: dict[int, EnvSession] = {}
        self._tools: list[ToolSpec] = []
        self._starting: asyncio.Task[None] | None = None
        self._started = False
        self._tasks: dict[int, tuple[int, asyncio.Task[Result]]] = {}  # env id -> (req id, task)
        # Sub-envs whose episode died with the host this one replaces.
        self._lost: set[int] = set(self._ids) if replaced else set()

    # -- start -----------------------------------------------------------------------------------
    async def _ensure_started(self) -> None:
        if self._started:
            return
        task = self._starting
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._starting = asyncio.get_running_loop().create_task(self._start())
        await asyncio.shield(task)

    async def _start(self) -> None:
        adapters = [self._spec.build() for _ in range(self._num_adapters)]
        # Start one first: a local source launches its server once, and the rest share it.
        try:
            await adapters[0].start()
            await asyncio.gather(*(a.start() for a in adapters[1:]))
            tools = await adapters[0].tools()
        except BaseException:
            await asyncio.gather(*(a.aclose() for a in adapters), return_exceptions=True)
            raise
        self._adapters, self._tools = adapters, list(tools)
        self._sessions = {i: self._session(k) for k, i in enumerate(self._ids)}
        self._started = True

    def _session(self, local_index: int) -> EnvSession:
        adapter = self._adapters[local_index % len(self._adapters)]
        return EnvSession(adapter, split=self._split, max_turns=self._max_turns)

    async def start(self) -> bytes:
        """Build and start the adapters and sessions; returns the tools (msgpack bytes)."""
        await self._ensure_started()
        return _tools_encoder.encode(self._tools)

    async def tools(self) -> bytes:
        """The tools every task offers (msgpack-encoded ``list[ToolSpec]``)."""
        return await self.start()

    async def pid(self) -> int:
        """The actor's process id (for diagnostics and tests)."""
        return os.getpid()

    # -- ops -------------------------------------------------------------------------------------
    async def run(self, data: bytes) -> bytes:
        """Run a batch of ops (msgpack ``list[Op]``) concurrently; returns msgpack ``list[Result]``.

        Ops cancelled meanwhile (:meth:`cancel`) are left out of the answer.
        """
        ops = decode_ops(data)
        await self._ensure_started()
        loop = asyncio.get_running_loop()
        tasks = []
        for op in ops:
            task = loop.create_task(self._run_one(op))
            self._tasks[op.env_id] = (op.req_id, task)
            tasks.append(task)
        try:
            done = await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise
        finally:
            for op, task in zip(ops, tasks):
                if self._tasks.get(op.env_id, (None, None))[1] is task:
                    del self._tasks[op.env_id]
        results = [r for r in done if isinstance(r, Result)]
        try:
            return encode_results(results)
        except (TypeError, ValueError, msgspec.EncodeError):
            return encode_results([self._encodable(r) for r in results])

    @staticmethod
    def _encodable(result: Result) -> Result:
        try:
            encode_results([result])
            return result
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            error = {"type": "EncodeError", "message": f"the sub-env's result cannot be sent through Ray: {exc}"}
            return Result(result.env_id, result.req_id, [], 0.0, False, True, {"error": error}, error=error)

    async def _run_one(self, op: Op) -> Result:
        try:
            session = self._sessions.get(op.env_id)
            if session is None:
                return _failed(op, {"type": "ConfigurationError", "message": f"sub-env {op.env_id} is not hosted here"})
            if op.recreate:
                new = self._session(self._local[op.env_id])
                new.np_random = session.np_random  # a recreated sub-env keeps its seeded task stream
                self._sessions[op.env_id] = new
                try:
                    if self._step_timeout is None:
                        await session.aclose()
                    else:
                        async with asyncio.timeout(self._step_timeout):
                            await session.aclose()
                except Exception:
                    pass  # the old episode's backend is the thing that failed
                session = new
            elif op.env_id in self._lost and op.kind != "reset":
                self._lost.discard(op.env_id)
                return _failed(op, {"type": "ActorDiedError",
                                    "message": "the Ray actor hosting this sub-env died and was replaced; "
                                               "its episode was lost"})
            self._lost.discard(op.env_id)
            wrapped = None if self._wrapped is None else (
                self._wrapped, self._wrapped.stack(op.env_id, session, self._tools))
            return await run_op(session, op, self._step_timeout, wrapped)
        except Exception as exc:  # a bug rather than a backend failure: still only this sub-env
            return _failed(op, _error(exc))

    async def cancel(self, requests: list[tuple[int, int]]) -> None:
        """Cancel the in-flight ops ``(env_id, req_id)``; a newer op of the same sub-env runs on."""
        tasks = []
        for env_id, req_id in requests:
            entry = self._tasks.get(env_id)
            if entry is not None and entry[0] == req_id:
                del self._tasks[env_id]
                entry[1].cancel()
                tasks.append(entry[1])
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- attributes ------------------------------------------------------------------------------
    async def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        """Call (or read) ``name`` on each hosted session, in the order of this host's env ids."""
        await self._ensure_started()
        return await call_each((self._sessions[i] for i in self._ids), name, args, kwargs)

    async def set_attr(self, name: str, values: list[Any]) -> None:
        """Set ``name`` on each hosted session (``values`` in the order of this host's env ids)."""
        await self._ensure_started()
        for i, value in zip(self._ids, values):
            setattr(self._sessions[i], name, value)

    # -- close -----------------------------------------------------------------------------------
    async def close(self) -> None:
        """Cancel every op, end every episode, close the adapters (stopping their servers)."""
        tasks = [task for _, task in self._tasks.values()]
        self._tasks.clear()
        if self._starting is not None and not self._starting.done():
            tasks.append(self._starting)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._wrapped is not None:
            self._wrapped.close()  # wrappers flush what they write (RecordEpisodes)
        sessions, self._sessions = list(self._sessions.values()), {}
        adapters, self._adapters = self._adapters, []
        self._started = False
        await asyncio.gather(*(s.aclose() for s in sessions), return_exceptions=True)
        await asyncio.gather(*(a.aclose() for a in adapters), return_exceptions=True)


RemoteEnvHost = ray.remote(max_restarts=0)(EnvHost)
"""The Ray actor class of :class:`EnvHost` (``RemoteEnvHost.options(...).remote(...)``)."""


# -- the driver's Ray runtime ----------------------------------------------------------------------
_ray_lock = threading.Lock()
_ray_users = 0
"""Envs using a Ray runtime that this module initialised (0: none, or the caller's own)."""


def _loopback_only() -> None:
    """Make a local cluster this module starts bind 127.0.0.1, not the machine's own address.

    On Linux a plain ``ray.init()`` binds every Ray process to the node's network address. Ray's
    single-node mode (the one it uses on macOS and Windows) binds loopback: the flag is read at
    import, so it is set both in the environment (for the processes Ray starts) and on the
    already imported constants (for this driver). A cluster given by ``address=`` is not touched.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no report leaves the machine unasked
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


_TRIM = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
"""A local Ray started here starts no idle workers ahead of need (one per CPU otherwise, ~45 MiB
each): the actors are the only workers it runs."""


def _acquire_ray(address: str | None) -> bool:
    """Make sure Ray is initialised; True if this module initialised it (and must shut it down)."""
    global _ray_users
    with _ray_lock:
        if ray.is_initialized():
            if _ray_users > 0:
                _ray_users += 1
                return True
            return False
        if address is None:
            _loopback_only()
            # Ray turns token authentication on for a new local cluster (good) and warns about it
            # on every start (noise, since the user chose nothing): keep the auth, drop the warning.
            auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
            level = auth_log.level
            auth_log.setLevel(logging.ERROR)
            try:
                ray.init(include_dashboard=False, _system_config=_TRIM)
            finally:
                auth_log.setLevel(level)
        else:
            ray.init(address=address)
        _ray_users = 1
        return True


def _release_ray() -> None:
    global _ray_users
    with _ray_lock:
        _ray_users -= 1
        if _ray_users <= 0:
            _ray_users = 0
            if ray.is_initialized():
                ray.shutdown()


class _Call:
    """One ``EnvHost.run`` call in flight: the shard, the actor handle it went to, its ops."""

    __slots__ = ("shard", "actor", "ops", "ref", "task")

    def __init__(self, shard: int, actor: Any, ops: list[Op], ref: Any):
        self.shard, self.actor, self.ops, self.ref = shard, actor, ops, ref
        self.task: asyncio.Task[None] | None = None


class RayVectorEnv(RedactedSpec, AgentVectorEnv):
    """Sub-envs hosted in a few async Ray actors (:class:`EnvHost`), many sub-envs per actor.

    Args:
        num_envs: how many sub-envs.
        adapter: how to build an adapter; each actor builds its own from this recipe, so its
            kwargs must make sense where the actor runs (a local ``source`` path must exist on
            that node; ``runtime_env`` can ship it).
        split: the default split of every sub-env.
        max_turns: truncate each episode after this many agent actions.
        num_actors: how many actors (default: ``min(num_envs, cluster CPUs)``). Sub-env ``i``
            lives in actor ``i % num_actors``.
        address: the Ray cluster to join when Ray is not initialised yet (``None``: start a
            local one); ignored if this process already called ``ray.init()``.
        runtime_env: the actors' Ray ``runtime_env`` (e.g. dependencies the driver lacks).
        actor_options: more ``RemoteEnvHost.options(...)`` (default ``num_cpus=0``: the actors wait
            on I/O; set ``num_cpus``/``resources``/``scheduling_strategy`` to place them).
        envs_per_client: sub-envs per adapter inside an actor (one connection pool each).
        autoreset_mode, step_timeout: see :class:`~openenv_gym.vector.base.AgentVectorEnv`.
            ``step_timeout`` also bounds a whole actor call (``3 * step_timeout + 30`` s): an
            actor that overruns it is considered hung, and is killed and replaced.
    """

    def __init__(
        self,
        num_envs: int,
        adapter: AdapterSpec,
        *,
        split: str | None = None,
        max_turns: int | None = None,
        num_actors: int | None = None,
        address: str | None = None,
        runtime_env: dict[str, Any] | None = None,
        actor_options: dict[str, Any] | None = None,
        envs_per_client: int = 8,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = STEP_TIMEOUT,
        env_wrappers: Sequence[Any] | None = None,
    ):
        if num_envs < 1:
            raise ConfigurationError("num_envs must be at least 1")
        self._env_wrappers = check_wrappers(env_wrappers)
        if num_actors is not None and num_actors < 1:
            raise ConfigurationError("num_actors must be at least 1")
        autoreset_mode = AutoresetMode(autoreset_mode)  # fail before any actor starts
        # The actors already spread the sub-envs over the CPUs: each actor's local source gets one
        # server process unless server_workers says otherwise (see ors_local.default_workers).
        if "server_workers" not in adapter.kwargs and "server_workers" in (accepted_kwargs(adapter.target()) or ()):
            adapter = AdapterSpec(adapter.entry, {**adapter.kwargs, "server_workers": 1})
        self._spec_adapter = adapter
        self._split, self._max_turns = split, max_turns
        self._envs_per_client = envs_per_client
        self._step_timeout = step_timeout
        self._call_timeout = None if step_timeout is None else 3 * step_timeout + _TIMEOUT_MARGIN
        self._owns_ray = _acquire_ray(address)
        self._actors: list[Any] = []
        try:
            if num_actors is None:
                num_actors = max(1, int(ray.cluster_resources().get("CPU", 1)))
            n_actors = min(num_envs, num_actors)
            self._shards = [list(range(k, num_envs, n_actors)) for k in range(n_actors)]
            self._options = {"num_cpus": 0, **(actor_options or {})}
            if runtime_env is not None:
                self._options["runtime_env"] = runtime_env
            self._calls: set[_Call] = set()
            self._in_flight: dict[int, _Call] = {}
            self._starts: dict[int, asyncio.Task[Any]] = {}  # id(actor handle) -> its start
            self._background: set[asyncio.Task[Any]] = set()
            self.replaced_actors = 0
            """How many dead or hung actors were replaced."""
            tools = runtime.run_sync(self._start(), _START_TIMEOUT + 60.0)
        except BaseException:
            if self._actors:
                try:
                    runtime.run_sync(self._aclose_backend(), 120.0)
                except Exception:
                    pass
            if self._owns_ray:
                _release_ray()
            raise
        super().__init__(num_envs, tools, autoreset_mode=autoreset_mode, step_timeout=step_timeout)
        self._any_action = bool(self._env_wrappers)  # a wrapper decides what an action may be

    @property
    def num_actors(self) -> int:
        return len(self._shards)

    @property
    def actors(self) -> list[Any]:
        """The current ``EnvHost`` actor handles, one per shard (a replaced actor's slot changes)."""
        return list(self._actors)

    def _new_actor(self, shard: int, replaced: bool = False) -> Any:
        spec = self._spec_adapter
        return RemoteEnvHost.options(**self._options).remote(
            spec.entry, dict(spec.kwargs), self._shards[shard], self._split, self._max_turns,
            self._envs_per_client, self._step_timeout, replaced, self._env_wrappers or None,
        )

    async def _start(self) -> list[ToolSpec]:
        self._actors = [self._new_actor(k) for k in range(len(self._shards))]
        refs = [actor.start.remote() for actor in self._actors]
        try:
            async with asyncio.timeout(_START_TIMEOUT):
                encoded = await asyncio.gather(*refs)
        except ray_errors.RayTaskError as exc:  # first: it may also be a TimeoutError
            raise _cause(exc) from None
        except TimeoutError:
            raise BackendTimeout(
                f"the Ray actors did not start within {_START_TIMEOUT} s (is the cluster short of "
                f"the resources asked for by actor_options={self._options}?)"
            ) from None
        return _tools_decoder.decode(encoded[0])

    # -- ops ---------------------------------------------------------------------------------------
    async def _execute(self, ops: list[Op]) -> None:
        groups: dict[int, list[Op]] = {}
        n_actors = len(self._shards)
        for op in ops:
            if op.action is not None and not self._env_wrappers:
                # Parsed here, because a raw action may hold what msgpack cannot carry (a lone
                # surrogate, a huge int, deep nesting); a parsed turn always encodes, and its
                # problems reach the agent as messages, as in a single env. Under sub-env
                # wrappers the action is theirs to read (text to parse, token ids), so it goes
                # as it is, arrays as lists.
                op.turn, op.action = parse_action(op.action), None
            elif isinstance(op.action, np.ndarray):
                op.action = op.action.tolist()
            groups.setdefault(op.env_id % n_actors, []).append(op)
        loop = asyncio.get_running_loop()
        for shard, shard_ops in groups.items():
            try:
                data = encode_ops(shard_ops)
            except (TypeError, ValueError, msgspec.EncodeError):
                shard_ops = self._drop_unencodable(shard_ops)
                if not shard_ops:
                    continue
                data = encode_ops(shard_ops)
            actor = self._actors[shard]
            call = _Call(shard, actor, shard_ops, actor.run.remote(data))
            call.task = loop.create_task(self._await_call(call))
            self._calls.add(call)
            for op in shard_ops:
                self._in_flight[op.env_id] = call

    def _drop_unencodable(self, ops: list[Op]) -> list[Op]:
        """Answer the ops that cannot be encoded (e.g. an action holding an arbitrary object)."""
        ok = []
        for op in ops:
            try:
                encode_ops([op])
                ok.append(op)
            except (TypeError, ValueError, msgspec.EncodeError) as exc:
                self._deliver(_failed(op, {"type": "EncodeError",
                                           "message": f"the op cannot be sent through Ray: {exc}"}))
        return ok

    async def _await_call(self, call: _Call) -> None:
        try:
            start = self._starts.get(id(call.actor))
            if start is not None and not start.done():
                # A replacement may take long to start (it launches servers): the call's deadline
                # counts from when it is up. A failed start shows up on the call itself.
                await asyncio.wait([start], timeout=_START_TIMEOUT)
            if self._call_timeout is None:
                data = await call.ref
            else:
                async with asyncio.timeout(self._call_timeout):
                    data = await call.ref
            results = decode_results(data)
        except asyncio.CancelledError:
            raise
        except ray_errors.TaskCancelledError:
            return
        except ray_errors.RayTaskError as exc:
            # The actor's own code raised (e.g. its adapters failed to start). Caught before
            # TimeoutError: Ray raises it as an instance of the cause's class too.
            cause = _cause(exc)
            self._fail(call, _error(cause, _first_line(cause)))
            return
        except TimeoutError:
            message = (f"the Ray actor hosting sub-envs {self._shards[call.shard]} did not answer within "
                       f"{self._call_timeout} s; it was replaced")
            self._replace(call.shard, call.actor)
            self._fail(call, {"type": "BackendTimeout", "message": message})
            return
        except _ACTOR_FAULTS as exc:
            message = (f"the Ray actor hosting sub-envs {self._shards[call.shard]} failed and was replaced "
                       f"({_first_line(exc)})")
            self._replace(call.shard, call.actor)
            self._fail(call, _error(exc, message))
            return
        except Exception as exc:  # anything else Ray raises: report it, keep the actor
            self._fail(call, _error(exc, _first_line(exc)))
            return
        finally:
            self._calls.discard(call)
            for op in call.ops:
                if self._in_flight.get(op.env_id) is call:
                    del self._in_flight[op.env_id]
        for result in results:
            self._deliver(result)

    def _fail(self, call: _Call, error: dict[str, Any]) -> None:
        for op in call.ops:
            self._deliver(_failed(op, error))

    def _replace(self, shard: int, dead: Any) -> None:
        """Swap a dead or hung actor for a fresh one hosting the same sub-env ids (once per death)."""
        if shard >= len(self._actors) or self._actors[shard] is not dead:
            return  # already replaced (several calls failed on the same actor), or closing
        actor = self._new_actor(shard, replaced=True)
        self._actors[shard] = actor
        self.replaced_actors += 1
        self._starts.pop(id(dead), None)
        try:
            ray.kill(dead, no_restart=True)
        except Exception:
            pass
        start = asyncio.get_running_loop().create_task(self._settle(actor.start.remote()))
        self._starts[id(actor)] = start
        start.add_done_callback(lambda t, key=id(actor): self._starts.pop(key) if self._starts.get(key) is t else None)

    async def _settle(self, ref: Any) -> None:
        """Await a ref whose value nobody needs (so Ray does not report its error as unhandled)."""
        try:
            await ref
        except Exception:
            pass

    def _spawn(self, ref: Any) -> None:
        task = asyncio.get_running_loop().create_task(self._settle(ref))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cancel(self, env_ids: Iterable[int]) -> None:
        by_actor: dict[int, tuple[Any, list[tuple[int, int]]]] = {}
        for i in env_ids:
            call = self._in_flight.pop(i, None)
            if call is None:
                continue
            req = next(op.req_id for op in call.ops if op.env_id == i)
            by_actor.setdefault(id(call.actor), (call.actor, []))[1].append((i, req))
        for actor, requests in by_actor.values():
            # One cheap message per actor; its answer is not awaited. Ops are matched by request
            # id there, so a cancel overtaken by the sub-env's next op never cancels that op.
            self._spawn(actor.cancel.remote(requests))

    # -- attributes --------------------------------------------------------------------------------
    async def _gather(self, refs: list[Any]) -> list[Any]:
        try:
            if self._call_timeout is None:
                return await asyncio.gather(*refs)
            async with asyncio.timeout(self._call_timeout):
                return await asyncio.gather(*refs)
        except ray_errors.RayTaskError as exc:
            raise _cause(exc) from None
        except TimeoutError:
            raise BackendTimeout(f"the Ray actors did not answer within {self._call_timeout} s") from None

    async def _call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        outs = await self._gather([actor.call.remote(name, args, kwargs) for actor in self._actors])
        values: list[Any] = [None] * self.num_envs
        for shard, out in zip(self._shards, outs):
            for i, value in zip(shard, out):
                values[i] = value
        return values

    async def _set_attr(self, name: str, values: list[Any]) -> None:
        await self._gather([actor.set_attr.remote(name, [values[i] for i in shard])
                            for actor, shard in zip(self._actors, self._shards)])

    # -- close -------------------------------------------------------------------------------------
    async def _aclose_backend(self) -> None:
        tasks = [c.task for c in self._calls if c.task is not None]
        tasks += [*self._background, *self._starts.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._calls.clear()
        self._in_flight.clear()
        actors, self._actors = self._actors, []
        if not ray.is_initialized():
            return  # Ray was shut down first (its own exit hook): the actors died with it
        await asyncio.gather(*(self._close_actor(a) for a in actors))

    async def _close_actor(self, actor: Any) -> None:
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT):
                await actor.close.remote()  # ends episodes and stops the actor's servers
        except Exception:
            pass  # dead or hung: the kill below ends it (and its servers die with it)
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass
        # Wait until Ray reports the actor dead (its calls fail), so nothing outlives close().
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT):
                while True:
                    await actor.pid.remote()
                    await asyncio.sleep(0.05)
        except Exception:
            pass

    def _release(self) -> None:
        """Shut Ray down if this env started it (and is its last user)."""
        if self._owns_ray:
            self._owns_ray = False
            _release_ray()
