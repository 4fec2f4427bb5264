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
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gymnasium.vector import AutoresetMode

from openenv_gym import runtime
from openenv_gym.adapters.base import AdapterSpec
from openenv_gym.errors import ConfigurationError, HostDied
from openenv_gym.hosts.handle import Handle
from openenv_gym.hosts.interpreter import Interpreter
from openenv_gym.hosts.proxy import IsolatedEnvHost
from openenv_gym.hosts.shard import EnvHost, decode_tools
from openenv_gym.redact import RedactedSpec
from openenv_gym.session import STEP_TIMEOUT
from openenv_gym.vector.hosted import START_TIMEOUT as _START_TIMEOUT, HostedVectorEnv, default_shards
from openenv_gym.vector.ops import Result, decode_results
from openenv_gym.vector.wrapped import check_wrappers
from openenv_gym.wire import ToolSpec

try:
    import ray
    import ray.exceptions as ray_errors
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ConfigurationError(
        "the 'ray' vector backend needs Ray: pip install 'openenv-gym[ray]'"
    ) from exc

__all__ = ["RayVectorEnv", "EnvHost", "RemoteEnvHost", "RayHandle"]

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


RemoteEnvHost = ray.remote(max_restarts=0)(EnvHost)
"""The Ray actor class of :class:`~openenv_gym.hosts.shard.EnvHost` (``RemoteEnvHost.options(...).remote(...)``)."""
RemoteIsolatedEnvHost = ray.remote(max_restarts=0)(IsolatedEnvHost)
"""The actor of an env that runs under another interpreter (``python=``, ``isolate=True``)."""


class RayHandle(Handle):
    """A shard in an :class:`EnvHost` Ray actor: ops and results cross Ray as msgpack bytes."""

    label = "Ray actor"

    def __init__(self, actor: Any):
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
        return decode_tools(await self._await(self.actor.start.remote()))

    def begin(self, data: bytes) -> Any:
        # Submitting from the caller's thread starts the actor's work without waiting for the
        # runtime loop to wake up and take the call; only awaiting the answer needs the loop.
        return self.actor.run.remote(data)

    async def run(self, data: bytes, deliver: Callable[[Result], None], begun: Any = None) -> None:
        try:
            data = await self._await(begun if begun is not None else self.actor.run.remote(data))
        except ray_errors.TaskCancelledError:
            return  # Ray cancelled the task (a cancel overtook it): no results
        for result in decode_results(data):
            deliver(result)

    def cancel(self, requests: list[tuple[int, int]]) -> None:
        ref = self.actor.cancel.remote(requests)
        asyncio.get_running_loop().create_task(_settle(ref))

    async def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        return await self._await(self.actor.call.remote(name, args, kwargs))

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


def _release_ray() -> None:
    global _ray_users
    with _ray_lock:
        _ray_users -= 1
        if _ray_users <= 0:
            _ray_users = 0
            if ray.is_initialized():
                ray.shutdown()


class RayVectorEnv(RedactedSpec, HostedVectorEnv):
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
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = STEP_TIMEOUT,
        env_wrappers: Sequence[Any] | None = None,
        python: str | Interpreter | None = None,
    ):
        if num_envs < 1:
            raise ConfigurationError("num_envs must be at least 1")
        self._env_wrappers = check_wrappers(env_wrappers)
        self._interpreter = Interpreter(path=python) if isinstance(python, str) else python
        if num_actors is not None and num_actors < 1:
            raise ConfigurationError("num_actors must be at least 1")
        autoreset_mode = AutoresetMode(autoreset_mode)  # fail before any actor starts
        # The actors already spread the sub-envs over the CPUs: each actor's local source gets one
        # server process unless server_workers says otherwise (see ors_local.default_workers).
        if "server_workers" not in adapter.kwargs and "server_workers" in (adapter.accepted_here() or ()):
            adapter = AdapterSpec(adapter.entry, {**adapter.kwargs, "server_workers": 1})
        self._spec_adapter = adapter
        self._split, self._max_turns = split, max_turns
        self._envs_per_client = envs_per_client
        self._init_hosts(step_timeout)
        self._owns_ray = _acquire_ray(address)
        try:
            if num_actors is None:
                num_actors = max(1, int(ray.cluster_resources().get("CPU", 1)))
            self._shards = default_shards(num_envs, num_actors)
            self._options = {"num_cpus": 0, **(actor_options or {})}
            _check_resources(self._options)
            if runtime_env is not None:
                self._options["runtime_env"] = runtime_env
            tools = runtime.run_sync(self._start_hosts(), _START_TIMEOUT + 60.0)
        except BaseException:
            if self._handles:
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
        return [h.actor for h in self._handles]  # type: ignore[attr-defined]

    @property
    def replaced_actors(self) -> int:
        """How many dead or hung actors were replaced."""
        return self.replaced_hosts

    def _new_handle(self, shard: int, replaced: bool = False) -> Handle:
        spec = self._spec_adapter
        args = (spec.entry, dict(spec.kwargs), self._shards[shard], self._split, self._max_turns,
                self._envs_per_client, self._step_timeout, replaced, self._env_wrappers or None)
        if self._interpreter is None:
            return RayHandle(RemoteEnvHost.options(**self._options).remote(*args))
        init = dict(zip(("entry", "adapter_kwargs", "env_ids", "split", "max_turns", "envs_per_client",
                         "step_timeout", "replaced", "env_wrappers"), args))
        return RayHandle(RemoteIsolatedEnvHost.options(**self._options).remote(self._interpreter, init))

    def _start_hint(self) -> str:
        return f" (is the cluster short of the resources asked for by actor_options={self._options}?)"

    def _wait_begun(self, begun: list[Any], limit: float) -> list[bytes] | None:
        deadline = time.monotonic() + limit
        pending = list(begun)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # In slices, so Ctrl-C is seen; the answers are fetched with the wait.
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(0.1, left))
        try:
            return ray.get(begun)
        except Exception:  # noqa: BLE001 - the loop's call reports it (a dead actor is replaced there)
            return None

    def _release(self) -> None:
        """Shut Ray down if this env started it (and is its last user)."""
        if self._owns_ray:
            self._owns_ray = False
            _release_ray()
