"""RayVectorEnv: shards of sub-envs hosted in async Ray actors, steps shipped as msgpack bytes.

Design:

* **Few actors, many sub-envs each.** An actor costs about 50 MiB and 0.4 s to start, and Ray
  carries only 1-2k calls/s on a small machine, while an LLM sub-env spends its time waiting on
  I/O. So sub-env ``i`` lives in actor ``i % num_actors`` (default: one actor per cluster CPU),
  and each actor is a :class:`~openenv_gym.shard.shard.Shard` (``ray.remote(Shard)``, the class
  :class:`~openenv_gym.vector.concurrent.ConcurrentVectorEnv` runs in the driver) running its
  sub-envs' episodes concurrently as coroutines on the actor's event loop over a few shared
  adapters (``envs_per_client`` sessions per adapter: one local server per actor, small
  connection pools). A ``send`` makes **one actor call per shard**, whatever the number of
  sub-envs in it; a lockstep ``step`` waits for those calls on the caller's thread
  (:meth:`RayHandle.wait_begun`).
* **Bytes, not objects.** Ops and results cross Ray as msgspec msgpack bytes
  (:func:`~openenv_gym.shard.ops.encode_ops` / ``encode_results``): Ray passes bytes through
  untouched, while pickling msgspec Structs costs several times a msgpack round trip. Rare
  control calls (``call``, ``set_attr``) use Ray's pickling, since their values are arbitrary.
* **Fault model.** An op that fails inside an actor (a server down, a timeout, a tool raising) is
  already a :class:`~openenv_gym.shard.ops.Result` with ``error`` set (:func:`run_op` never
  raises), and :class:`~openenv_gym.vector.base.AgentVectorEnv` truncates and recreates that
  sub-env. If the *actor* dies (killed, out of memory, its node lost) or stops answering (no
  answer to a liveness check after ``step_timeout`` + a few seconds), every op of the failed call
  gets a truncated ``Result`` with ``info["error"]``, and the actor is killed and replaced by a
  fresh shard for the same sub-env ids (:mod:`openenv_gym.vector.shards`); the other shards go on. The replacement knows it
  replaced a dead host: a sub-env of that shard whose next op is a step (its episode died with
  the old actor) is answered with the same truncated error instead of being stepped, and every
  sub-env is back to normal after its next reset. Episodes in a dead actor are lost, and so is
  the task-choice rng of its sub-envs (a replacement starts unseeded until the next seeded reset).
* Ray is optional (``pip install 'openenv-gym[ray]'``): only this module imports it. When no Ray
  runtime is initialised, the first env calls ``ray.init()`` (locally, bound to 127.0.0.1, or to
  ``address``) and the last such env to close calls ``ray.shutdown()``; a runtime the caller
  started is left alone (:class:`RayRuntime`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from gymnasium.vector import AutoresetMode

from openenv_gym.adapters.base import AdapterSpec
from openenv_gym.errors import ConfigurationError, HostDied
from openenv_gym.hosts.interpreter import Interpreter
from openenv_gym.hosts.proxy import ShardProxy
from openenv_gym.redact import RedactedSpec
from openenv_gym.session import STEP_TIMEOUT
from openenv_gym.shard.handle import EncodedHandle
from openenv_gym.shard.ops import Result, decode_results
from openenv_gym.shard.shard import Shard, ShardConfig, decode_tools
from openenv_gym.shard.wrapped import check_wrappers
from openenv_gym.vector.base import AgentVectorEnv, check_num_envs
from openenv_gym.vector.shards import START_TIMEOUT, Shards, default_layout, open_shards
from openenv_gym.wire import ToolSpec

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
"""What a local cluster started here runs with. On Linux a plain ``ray.init()`` binds every Ray
process to the node's network address; Ray's single-machine mode (its macOS and Windows default,
turned on by the first variable, which Ray reads once, at import) binds 127.0.0.1. The second
keeps usage reports from leaving the machine unasked."""


@contextlib.contextmanager
def scoped_environ(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set for the length of the block, then as it was."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


_SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_LOOPBACK_AT_IMPORT = os.environ.get(_SINGLE_MACHINE, None if "ray" in sys.modules else "0") == "0"
"""Whether Ray reads (or read, when it was imported before this module) the single-machine setting
at its import: a local cluster then binds loopback. A value the user set is respected."""
try:
    with scoped_environ({k: v for k, v in LOOPBACK_ENV.items() if k not in os.environ}):
        import ray
        import ray.exceptions as ray_errors
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ConfigurationError(
        "the 'ray' vector backend needs Ray: pip install 'openenv-gym[ray]'"
    ) from exc

__all__ = ["RayVectorEnv", "RayHandle", "RayRuntime", "RemoteShard", "RAY"]

# Failures of the actor itself (as opposed to an exception raised by its code): replace it.
_ACTOR_FAULTS: tuple[type[BaseException], ...] = (
    ray_errors.RayActorError,  # ActorDiedError, ActorUnavailableError
    ray_errors.WorkerCrashedError,
    ray_errors.OutOfMemoryError,
    ray_errors.ObjectLostError,
)


def _cause(exc: BaseException) -> BaseException:
    """The exception an actor method raised, out of Ray's ``RayTaskError`` wrapper."""
    cause = getattr(exc, "cause", None) if isinstance(exc, ray_errors.RayTaskError) else None
    return cause if isinstance(cause, BaseException) else exc


RemoteShard = ray.remote(max_restarts=0)(Shard)
"""The Ray actor class of :class:`~openenv_gym.shard.shard.Shard` (``RemoteShard.options(...).remote(config)``)."""
RemoteShardProxy = ray.remote(max_restarts=0)(ShardProxy)
"""The actor of an env that runs under another interpreter (``python=``, ``isolate=True``)."""


class RayHandle(EncodedHandle):
    """A shard in a Ray actor: ops and results cross Ray as msgpack bytes."""

    label = "Ray actor"

    def __init__(self, actor: Any, any_action: bool = False):
        super().__init__(any_action)
        self.actor = actor

    async def _await(self, ref: Any) -> Any:
        try:
            return await ref
        except ray_errors.RayTaskError as exc:
            # The actor's own code raised. Caught before the faults: Ray raises it as an instance
            # of the cause's class too.
            raise _cause(exc) from None
        except _ACTOR_FAULTS as exc:
            raise HostDied(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from exc

    async def start(self) -> list[ToolSpec]:
        return decode_tools(await self._await(self.actor.start_encoded.remote()))

    def begin(self, payload: bytes) -> Any:
        # Submitting from the caller's thread starts the actor's work without waiting for the
        # runtime loop to wake up and take the call.
        return self.actor.run_encoded.remote(payload)

    def wait_begun(self, begun: list[Any], limit: float) -> list[list[Result] | None]:
        deadline = time.monotonic() + limit
        pending = list(begun)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # In slices, so Ctrl-C is seen; the answers are fetched with the wait.
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(0.1, left))
        unfinished = set(pending)
        done = [ref for ref in begun if ref not in unfinished]
        try:
            answers = dict(zip(done, ray.get(done)))
        except Exception:  # noqa: BLE001 - one failed: fetch the others one by one
            answers = {}
            for ref in done:
                with contextlib.suppress(Exception):  # the loop's follow-up reports it (and replaces a dead actor)
                    answers[ref] = ray.get(ref)
        return [decode_results(answers[ref]) if ref in answers else None for ref in begun]

    async def run(self, payload: bytes, deliver: Callable[[Result], None], begun: Any = None) -> None:
        try:
            data = await self._await(begun if begun is not None else self.actor.run_encoded.remote(payload))
        except ray_errors.TaskCancelledError:
            return  # Ray cancelled the task (a cancel overtook it): no results
        for result in decode_results(data):
            deliver(result)

    def cancel(self, requests: list[tuple[int, int]]) -> None:
        ref = self.actor.cancel.remote(requests)
        asyncio.get_running_loop().create_task(_settle(ref))

    async def call(self, name: str, args: tuple, kwargs: dict, env_ids: list[int] | None = None) -> list[Any]:
        return await self._await(self.actor.call.remote(name, args, kwargs, env_ids))

    async def set_attr(self, name: str, values: list[Any]) -> None:
        await self._await(self.actor.set_attr.remote(name, values))

    async def pid(self) -> int:
        return await self._await(self.actor.pid.remote())

    async def close(self, timeout: float) -> None:
        if not ray.is_initialized():
            return  # Ray was shut down first (its own exit hook): the actors died with it
        try:
            async with asyncio.timeout(timeout):
                await self.actor.close.remote()  # ends episodes and stops the actor's servers
        except Exception:
            pass  # dead or hung: the kill below ends it (and its servers die with it)
        self.kill()
        # Wait until Ray reports the actor dead (its calls fail), so nothing outlives close().
        try:
            async with asyncio.timeout(timeout):
                while True:
                    await self.actor.pid.remote()
                    await asyncio.sleep(0.05)
        except Exception:
            pass

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)


async def _settle(ref: Any) -> None:
    """Await a ref whose value nobody needs (so Ray does not report its error as unhandled)."""
    try:
        await ref
    except Exception:
        pass


_TRIM = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
"""A local Ray started here starts no idle workers ahead of need (one per CPU otherwise, ~45 MiB
each): the actors are the only workers it runs."""


_AUTH_NOTICE = "Token authentication is enabled for this Ray cluster"


class _DropMessage(logging.Filter):
    """Drops the log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


class RayRuntime:
    """This process's use of a Ray runtime: started here when none runs, shut down by its last user.

    A runtime the caller started (``ray.init()`` before the first env) is used as it is and never
    shut down here. One instance per process (:data:`RAY`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        """Envs using a runtime this object started (0: none, or the caller's own)."""

    def acquire(self, address: str | None) -> bool:
        """Make sure Ray is initialised; True if this object started it (so :meth:`release` is owed)."""
        with self._lock:
            if ray.is_initialized():
                if self._users > 0:
                    self._users += 1
                    return True
                return False
            if address is None:
                self._start_local()
            else:
                ray.init(address=address)
            self._users = 1
            return True

    def _start_local(self) -> None:
        if not _LOOPBACK_AT_IMPORT:
            raise ConfigurationError(
                "ray was imported before openenv_gym's Ray backend without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, so "
                "a local cluster started now would listen on the machine's network address; import "
                "openenv_gym.vector.ray first, set that variable before importing ray, start Ray yourself "
                "(ray.init()) or pass vector_options={'address': ...}")
        # Ray turns token authentication on for a new local cluster (good) and warns about it on
        # every start (noise, since the user chose nothing): keep the auth, drop the warning. The
        # warning is told by its text at the handlers it reaches (Ray's own logger's and the
        # root's), so no module of Ray's is named.
        quiet = _DropMessage(_AUTH_NOTICE)
        handlers = [*logging.getLogger("ray").handlers, *logging.getLogger().handlers]
        for handler in handlers:
            handler.addFilter(quiet)
        try:
            with scoped_environ({k: v for k, v in LOOPBACK_ENV.items() if k not in os.environ}):
                # the processes ray.init starts inherit it
                ray.init(include_dashboard=False, _system_config=_TRIM)
        finally:
            for handler in handlers:
                handler.removeFilter(quiet)

    def release(self) -> None:
        """One user fewer; the last one shuts down the runtime this object started."""
        with self._lock:
            self._users -= 1
            if self._users <= 0:
                self._users = 0
                if ray.is_initialized():
                    ray.shutdown()

    @property
    def users(self) -> int:
        return self._users


RAY = RayRuntime()
"""This process's :class:`RayRuntime`."""


def _check_resources(options: dict[str, Any]) -> None:
    """Refuse at once custom resources no node of the cluster offers (Ray would wait for them forever).

    An actor asking for ``resources={"gpu_box": 1}`` is placed only on a node started with that
    resource (``ray start --resources='{"gpu_box": 4}'``); a name no node has is almost always a
    typo, and Ray leaves such an actor pending without an error.
    """
    wanted = options.get("resources") or {}
    if not isinstance(wanted, dict):
        raise ConfigurationError("actor_options['resources'] must be a dict of resource name -> amount")
    have = ray.cluster_resources()
    missing = {name: amount for name, amount in wanted.items() if have.get(name, 0) < amount}
    if missing:
        offered = sorted(k for k in have if not k.startswith("node:") and k not in ("memory", "object_store_memory"))
        raise ConfigurationError(
            f"no node of the Ray cluster offers {missing} (the cluster's resources: {', '.join(offered)}); "
            "a node offers a custom resource when started with `ray start --resources='{\"NAME\": N}'`"
        )


class RayVectorEnv(RedactedSpec, AgentVectorEnv):
    """Sub-envs hosted in a few async Ray actors (:class:`~openenv_gym.shard.shard.Shard`), many per actor.

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
        actor_options: more ``RemoteShard.options(...)`` (default ``num_cpus=0``: the actors wait
            on I/O; set ``num_cpus``/``resources``/``scheduling_strategy`` to place them).
        envs_per_client: sub-envs per adapter inside an actor (one connection pool each).
        max_in_flight: bound on concurrent backend operations per actor (``None``: no bound).
        autoreset_mode, step_timeout: see :class:`~openenv_gym.vector.base.AgentVectorEnv`. An
            actor still busy ``step_timeout`` + a few seconds into a call must answer a liveness
            check, or it is killed and replaced.
        start_timeout: seconds the actors may take to start (placement, adapters, servers).
        python: run each actor's shard in a host process under this interpreter (set by
            ``python=``/``isolate=True``; an ``isolate`` venv is built on the node of each actor).
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
        max_in_flight: int | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = STEP_TIMEOUT,
        start_timeout: float = START_TIMEOUT,
        env_wrappers: Sequence[Any] | None = None,
        python: str | Interpreter | None = None,
    ):
        num_envs = check_num_envs(num_envs)
        wrappers = check_wrappers(env_wrappers)
        interpreter = Interpreter(path=python) if isinstance(python, str) else python
        if num_actors is not None and num_actors < 1:
            raise ConfigurationError("num_actors must be at least 1")
        autoreset_mode = AutoresetMode(autoreset_mode)  # fail before any actor starts
        # The actors already spread the sub-envs over the CPUs: each actor's local source gets one
        # server process unless server_workers says otherwise (see local_servers.group.default_workers).
        if "server_workers" not in adapter.kwargs and "server_workers" in (adapter.accepted_here() or ()):
            adapter = AdapterSpec(adapter.entry, {**adapter.kwargs, "server_workers": 1})
        owns_ray = RAY.acquire(address)
        try:
            if num_actors is None:
                num_actors = max(1, int(ray.cluster_resources().get("CPU", 1)))
            options = {"num_cpus": 0, **(actor_options or {})}
            _check_resources(options)
            if runtime_env is not None:
                options["runtime_env"] = runtime_env
        except BaseException:
            if owns_ray:
                RAY.release()
            raise
        layout = default_layout(num_envs, num_actors)

        def new_handle(k: int, replaced: bool) -> RayHandle:
            config = ShardConfig(entry=adapter.entry, adapter_kwargs=dict(adapter.kwargs), env_ids=layout[k],
                                 num_envs=num_envs,
                                 split=split, max_turns=max_turns, envs_per_client=envs_per_client,
                                 step_timeout=step_timeout, max_in_flight=max_in_flight, replaced=replaced,
                                 env_wrappers=wrappers)
            if interpreter is None:
                return RayHandle(RemoteShard.options(**options).remote(config), bool(wrappers))
            return RayHandle(RemoteShardProxy.options(**options).remote(interpreter, config), bool(wrappers))

        self._options = options
        shards = Shards(layout, new_handle, step_timeout=step_timeout, start_timeout=start_timeout,
                        release=RAY.release if owns_ray else None,
                        start_hint=f" (is the cluster short of the resources asked for by actor_options={options}?)")
        tools = open_shards(shards)
        self._shards = shards
        super().__init__(num_envs, tools, shards, autoreset_mode=autoreset_mode, step_timeout=step_timeout,
                         any_action=bool(wrappers))

    @property
    def num_actors(self) -> int:
        return len(self._shards.layout)

    @property
    def actors(self) -> list[Any]:
        """The current shard actor handles, one per shard (a replaced actor's slot changes)."""
        return [h.actor for h in self._shards.handles]  # type: ignore[attr-defined]

    @property
    def replaced_actors(self) -> int:
        """How many dead or hung actors were replaced."""
        return self._shards.replaced
