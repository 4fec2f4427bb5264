"""The vector-env logic every backend shares: batching, autoreset, send/recv, error isolation.

:class:`AgentVectorEnv` implements Gymnasium's ``VectorEnv`` API (``reset`` with ``reset_mask``,
``step``, ``step_async``/``step_wait``, ``call``, ``get_attr``, ``set_attr``, ``close``) with
Gymnasium's exact autoreset semantics for NEXT_STEP, SAME_STEP and DISABLED, plus EnvPool-style
``send(actions, env_ids)`` / ``recv(batch_size)`` that return the first sub-envs to finish.

LLM environments are slow and uneven (5 ms one step, 5 s the next), so everything is a request
with an id: ``send`` records the id of each sub-env's request, results come back in any order,
and a result whose id is not the current one (it arrived after a timeout, a reset or a close) is
dropped, never returned for a newer request. A sub-env whose backend fails or times out reports
``info["error"]``, is truncated, and is recreated on its next request while the others go on.

Backends implement :meth:`_execute` (run a batch of ops, delivering each result) and the few
methods for sessions' attributes; :mod:`openenv_gym.vector.concurrent` runs ops on this
process's runtime loop, :mod:`openenv_gym.vector.ray` in Ray actors.
"""

from __future__ import annotations

import abc
import asyncio
import copy
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from openenv_gym import runtime
from openenv_gym.errors import BackendTimeout, ConfigurationError, EpisodeFinished
from openenv_gym.spaces import AssistantAction, Messages
from openenv_gym.vector.ops import Op, Result
from openenv_gym.wire import Message, ToolSpec

__all__ = ["AgentVectorEnv", "Batch", "info_at"]


class Batch(NamedTuple):
    """What :meth:`AgentVectorEnv.recv` returns: results of the sub-envs in ``env_ids``."""

    obs: tuple[list[Message], ...]
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    infos: dict[str, Any]
    env_ids: np.ndarray


class AgentVectorEnv(gym.vector.VectorEnv, abc.ABC):
    """Many chat sub-envs behind one Gymnasium ``VectorEnv``.

    Args:
        num_envs: how many sub-envs.
        tools: the tools every task offers (for the action space).
        autoreset_mode: NEXT_STEP (default), SAME_STEP or DISABLED, as in Gymnasium.
        step_timeout: seconds one sub-env's reset or step may take before it is truncated with
            ``info["error"]`` and recreated (``None``: no limit).
    """

    def __init__(
        self,
        num_envs: int,
        tools: Sequence[ToolSpec],
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = None,
    ):
        if num_envs < 1:
            raise ConfigurationError("num_envs must be at least 1")
        self.num_envs = num_envs
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {"autoreset_mode": self.autoreset_mode, "render_modes": []}
        self.step_timeout = step_timeout
        self.single_observation_space = Messages()
        self.single_action_space = AssistantAction(tools)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.closed = False
        self.late_results = 0
        """Results dropped because they answered a request that was no longer current."""
        self._obs: list[list[Message]] = [[] for _ in range(num_envs)]
        self._done = np.zeros(num_envs, dtype=np.bool_)
        self._needs_reset = np.zeros(num_envs, dtype=np.bool_)
        self._recreate = np.zeros(num_envs, dtype=np.bool_)
        self._notes: dict[int, dict[str, Any]] = {}
        self._pending: dict[int, int] = {}
        self._ready: dict[int, Result] = {}
        self._arrived: asyncio.Event | None = None
        self._want = 1  # results the waiter needs before it is worth waking
        self._next_req = 0
        self._step_actions: Any = None

    # -- what a backend implements -------------------------------------------------------------
    @abc.abstractmethod
    async def _execute(self, ops: list[Op]) -> None:
        """Start running ``ops`` (one per sub-env) and return; deliver each result to
        :meth:`_deliver` as it completes. An op with ``recreate`` set asks for a fresh sub-env
        before it runs (its predecessor failed)."""

    @abc.abstractmethod
    async def _cancel(self, env_ids: Iterable[int]) -> None:
        """Stop waiting for these sub-envs' in-flight ops (their results would be dropped)."""

    @abc.abstractmethod
    async def _call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        """Call (or read) ``name`` on every sub-env's session; one value per sub-env."""

    @abc.abstractmethod
    async def _set_attr(self, name: str, values: list[Any]) -> None:
        """Set ``name`` on every sub-env's session."""

    @abc.abstractmethod
    async def _aclose_backend(self) -> None:
        """Release every session, adapter, process or actor."""

    # -- requests and results --------------------------------------------------------------------
    def _new_op(self, env_id: int, kind: str, **fields: Any) -> Op:
        self._next_req += 1
        op = Op(env_id, self._next_req, kind, **fields)
        self._pending[env_id] = op.req_id
        self._ready.pop(env_id, None)
        return op

    def _deliver(self, result: Result) -> None:
        """Accept a result if it answers the sub-env's current request; drop it otherwise."""
        if self._pending.get(result.env_id) != result.req_id:
            self.late_results += 1
            return
        del self._pending[result.env_id]
        self._ready[result.env_id] = result
        # Wake the waiter only when it can finish: waking it per result would rescan the
        # ready set each time, quadratic in the batch size (256-result batches at 1,024 envs).
        if self._arrived is not None and len(self._ready) >= self._want:
            self._arrived.set()

    def _absorb(self, result: Result, reset: bool) -> None:
        i = result.env_id
        self._obs[i] = result.obs
        if result.error is not None:
            self._needs_reset[i] = self._recreate[i] = True
            self._done[i] = True
        elif reset or self.autoreset_mode == AutoresetMode.SAME_STEP:
            self._done[i] = False
        else:
            self._done[i] = result.terminated or result.truncated

    async def _wait(self, env_ids: set[int] | None, count: int, timeout: float | None) -> list[Result]:
        """Wait until ``count`` results are ready (from ``env_ids`` if given); first-ready order."""
        if self._arrived is None:
            self._arrived = asyncio.Event()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            ready = list(self._ready) if env_ids is None else [i for i in self._ready if i in env_ids]
            if len(ready) >= count:
                return [self._ready.pop(i) for i in ready[:count]]
            self._arrived.clear()
            self._want = len(self._ready) + (count - len(ready))
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise BackendTimeout(f"{len(ready)} of {count} sub-env results arrived within {timeout} s")
            try:
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()
            except TimeoutError:
                pass
            finally:
                self._want = 1

    # -- Gymnasium VectorEnv API -----------------------------------------------------------------
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[list[Message], ...], dict[str, Any]]:
        """Reset every sub-env, or those in ``options["reset_mask"]`` (a bool array of shape (n,)).

        ``seed``: ``None``, an int (sub-env ``i`` gets ``seed + i``) or one seed per sub-env.
        Other options go to every sub-env's reset (``split``, ``index``, ``task``).
        """
        self._check_open()
        n = self.num_envs
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"If seeds are passed as a list the length must match num_envs={n} but got length={len(seeds)}.")
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if mask is None:
            mask = np.ones(n, dtype=np.bool_)
        elif not isinstance(mask, np.ndarray) or mask.shape != (n,) or mask.dtype != np.bool_ or not mask.any():
            raise ValueError(f"options['reset_mask'] must be a bool numpy array of shape ({n},) with at least one True")
        env_ids = [i for i in range(n) if mask[i]]
        return runtime.run_sync(self._areset(env_ids, seeds, options or None))

    async def _areset(self, env_ids: list[int], seeds: list[int | None], options: dict[str, Any] | None):
        stale = [i for i in env_ids if i in self._pending]
        if stale:
            for i in stale:
                del self._pending[i]
            await self._cancel(stale)
        ops = []
        for i in env_ids:
            ops.append(self._new_op(i, "reset", seed=seeds[i], options=options, note=self._notes.pop(i, None),
                                    **({"recreate": True} if self._recreate[i] else {})))
            self._recreate[i] = False
            self._needs_reset[i] = False
        await self._execute(ops)
        results = await self._wait(set(env_ids), len(env_ids), None)
        infos: dict[str, Any] = {}
        for result in sorted(results, key=lambda r: r.env_id):
            self._absorb(result, reset=True)
            if result.error is not None and result.error.get("user"):
                raise ConfigurationError(f"sub-env {result.env_id}: {result.error['message']}")
            infos = self._add_info(infos, result.info, result.env_id)
        return tuple(copy.copy(o) for o in self._obs), infos

    def step(self, actions: Sequence[Any]) -> tuple[tuple[list[Message], ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-env with its action; Gymnasium's batched 5-tuple."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Sequence[Any]) -> None:
        """Send one action per sub-env; collect the results with :meth:`step_wait`."""
        self.send(actions)

    def step_wait(self, timeout: float | None = None) -> tuple[tuple[list[Message], ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for every sub-env's result of the last :meth:`step_async`.

        On ``timeout`` raises :class:`~openenv_gym.errors.BackendTimeout`; the sub-envs that had
        not answered are reset (and recreated) on their next request, with ``info["error"]``
        saying why, and their late results are dropped.
        """
        results = sorted(self._recv_results(None, timeout), key=lambda r: r.env_id)
        if len(results) != self.num_envs:
            raise ConfigurationError("step_wait() needs a step_async() to every sub-env")
        infos: dict[str, Any] = {}
        for result in results:
            self._absorb(result, reset=False)
            infos = self._add_info(infos, result.info, result.env_id)
        return (
            tuple(r.obs for r in results),
            np.array([r.reward for r in results], dtype=np.float64),
            np.array([r.terminated for r in results], dtype=np.bool_),
            np.array([r.truncated for r in results], dtype=np.bool_),
            infos,
        )

    def send(self, actions: Sequence[Any], env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Send actions to sub-envs (all of them when ``env_ids`` is None), without waiting.

        A sub-env that ended is autoreset as ``metadata["autoreset_mode"]`` says: NEXT_STEP resets
        it on this request (the action is ignored), SAME_STEP resets it in the same request as
        the final step, DISABLED refuses (reset it with ``reset_mask``).
        """
        self._check_open()
        ids = list(range(self.num_envs)) if env_ids is None else [int(i) for i in env_ids]
        actions = list(actions)
        if len(actions) != len(ids):
            raise ValueError(f"got {len(actions)} actions for {len(ids)} sub-envs")
        if len(set(ids)) != len(ids):
            raise ValueError("env_ids must not repeat")
        ops = []
        for i, action in zip(ids, actions):
            if not 0 <= i < self.num_envs:
                raise ValueError(f"env id {i} is outside 0..{self.num_envs - 1}")
            if i in self._pending:
                raise ConfigurationError(f"sub-env {i} already has a request in flight; recv() it first")
            if self.autoreset_mode == AutoresetMode.DISABLED and self._done[i]:
                raise EpisodeFinished(f"sub-env {i} has ended and autoreset is disabled; reset it with "
                                      "options={'reset_mask': mask}")
            if self._needs_reset[i] or (self.autoreset_mode == AutoresetMode.NEXT_STEP and self._done[i]):
                extra = {"recreate": True} if self._recreate[i] else {}
                ops.append(self._new_op(i, "reset", note=self._notes.pop(i, None), **extra))
                self._needs_reset[i] = self._recreate[i] = False
            else:
                kind = "step_reset" if self.autoreset_mode == AutoresetMode.SAME_STEP else "step"
                ops.append(self._new_op(i, kind, action=action))
        runtime.run_sync(self._execute(ops))

    def recv(self, batch_size: int | None = None, timeout: float | None = None) -> Batch:
        """Return the first ``batch_size`` sub-envs to finish (default: all in flight), with ids.

        Waits for ``batch_size`` results; raises :class:`~openenv_gym.errors.BackendTimeout` if
        they do not arrive within ``timeout`` (waiting for all in flight, the missing sub-envs
        are then reset on their next request; with a smaller batch they stay in flight).
        """
        results = self._recv_results(batch_size, timeout)
        infos: dict[str, Any] = {}
        for k, result in enumerate(results):
            self._absorb(result, reset=False)
            infos = self._add_info(infos, result.info, k)
        infos = _trim(infos, len(results))  # Gymnasium sizes info arrays by num_envs
        return Batch(
            tuple(r.obs for r in results),
            np.array([r.reward for r in results], dtype=np.float64),
            np.array([r.terminated for r in results], dtype=np.bool_),
            np.array([r.truncated for r in results], dtype=np.bool_),
            infos,
            np.array([r.env_id for r in results], dtype=np.int64),
        )

    def _recv_results(self, batch_size: int | None, timeout: float | None) -> list[Result]:
        self._check_open()
        in_flight = len(self._pending) + len(self._ready)
        count = in_flight if batch_size is None else min(batch_size, in_flight)
        if count == 0:
            raise ConfigurationError("recv() with no request in flight; send() first")
        try:
            return runtime.run_sync(self._wait(None, count, timeout))
        except BackendTimeout:
            if batch_size is None or batch_size >= in_flight:
                self._abandon(list(self._pending), timeout)
            raise

    def _abandon(self, env_ids: list[int], timeout: float | None) -> None:
        for i in env_ids:
            self._pending.pop(i, None)
            self._needs_reset[i] = self._recreate[i] = True
            self._notes[i] = {"error": {"type": "BackendTimeout",
                                        "message": f"the previous request got no answer within {timeout} s; "
                                                   "the sub-env was reset"}}
        runtime.run_sync(self._cancel(env_ids))

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name`` on every sub-env's session (or read it, if not callable)."""
        self._check_open()
        return tuple(runtime.run_sync(self._call(name, args, kwargs)))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Read ``name`` from every sub-env's session."""
        return self.call(name)

    def set_attr(self, name: str, values: Any | list[Any] | tuple[Any, ...]) -> None:
        """Set ``name`` on every sub-env's session: one value each, or one value for all."""
        self._check_open()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"values must have length num_envs={self.num_envs}, got {len(values)}")
        runtime.run_sync(self._set_attr(name, list(values)))

    def close_extras(self, **kwargs: Any) -> None:
        """Stop every in-flight request and release the backend (no process or actor is left)."""
        pending = list(self._pending)
        self._pending.clear()
        runtime.run_sync(self._shutdown(pending), 120.0)

    async def _shutdown(self, pending: list[int]) -> None:
        if pending:
            await self._cancel(pending)
        await self._aclose_backend()

    def _check_open(self) -> None:
        if self.closed:
            raise ConfigurationError("the vector env is closed")

    def __del__(self) -> None:
        try:
            if not getattr(self, "closed", True):
                self.close()
        except Exception:
            pass



def _trim(infos: dict[str, Any], n: int) -> dict[str, Any]:
    return {k: (_trim(v, n) if isinstance(v, dict) else v[:n]) for k, v in infos.items()}


def info_at(infos: dict[str, Any], k: int) -> dict[str, Any]:
    """Entry ``k`` of a batched info dict, as the sub-env's own dict (``_key`` masks honoured)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[k]:
            continue
        if isinstance(value, dict):
            out[key] = info_at(value, k)
        else:
            item = value[k]
            out[key] = item.item() if isinstance(item, np.generic) else item
    return out
