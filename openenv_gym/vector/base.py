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

What runs the sub-envs is the env's backend (:class:`VectorBackend`): the shards of one id
(:class:`~openenv_gym.vector.shards.Shards`, in this process, in host processes or in Ray actors),
or the parts of a mixture (:mod:`openenv_gym.mixture`). The backend gets ops and hands back
results; everything Gymnasium defines is here, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import enum
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from openenv_gym import runtime
from openenv_gym.actions import check_action_type
from openenv_gym.errors import (
    BackendTimeout,
    ConcurrentUse,
    ConfigurationError,
    EpisodeFinished,
    EpisodeNotStarted,
    inherited,
)
from openenv_gym.session import STEP_TIMEOUT
from openenv_gym.shard.ops import Op, OpKind, Result
from openenv_gym.spaces import AssistantAction, Messages
from openenv_gym.vector.groups import Groups
from openenv_gym.vector.infos import stack_infos
from openenv_gym.wire import Message, ToolSpec

__all__ = ["AgentVectorEnv", "Batch", "Phase", "SubEnv", "VectorBackend", "info_at", "check_num_envs"]

MAX_ENVS = 1 << 20
"""The most sub-envs one vector env may hold: far above what one machine can run, low enough that a
typo (``num_envs=10**12``) is an error rather than a process that allocates until it is killed."""

_CLOSE_TIMEOUT = 30.0
_CANCEL_TIMEOUT = 10.0


class Batch(NamedTuple):
    """What :meth:`AgentVectorEnv.recv` returns: results of the sub-envs in ``env_ids``."""

    obs: tuple[list[Message], ...]
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    infos: dict[str, Any]
    env_ids: np.ndarray


def check_num_envs(num_envs: Any) -> int:
    """``num_envs`` as an int, or :class:`ConfigurationError` (not a positive integer, or above
    :data:`MAX_ENVS`); numpy integers are accepted, as everywhere a count is."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)):
        raise ConfigurationError(f"num_envs must be a positive integer, not {type(num_envs).__name__}")
    if not 1 <= int(num_envs) <= MAX_ENVS:
        raise ConfigurationError(f"num_envs must be between 1 and {MAX_ENVS:,}, not {int(num_envs):,}")
    return int(num_envs)


class VectorBackend(Protocol):
    """What runs a vector env's sub-envs (see :class:`~openenv_gym.vector.shards.Shards`)."""

    deliver: Callable[[Result], None]
    """Takes every result, on the runtime loop (set by the vector env)."""

    def send(self, ops: list[Op]) -> None:
        """Start ``ops`` (one per sub-env), from the caller's thread; returns once they are out."""

    def run_here(self, op: Op) -> Coroutine[Any, Any, Result] | None:
        """``op`` (one sub-env's) as a coroutine the awaiting task runs itself, on the runtime
        loop, where its sub-env lives in this process and is free; else ``None`` (send it)."""

    def settle(self, all_needed: bool, limit: float | None) -> list[Result] | None:
        """Follow up calls :meth:`send` left to the caller's thread: if it waited for them
        (``all_needed``, up to ``limit`` s), the results that came in (the rest go to the loop),
        else ``None`` once they are all handed to the loop."""

    async def cancel(self, env_ids: Iterable[int]) -> None:
        """Stop waiting for these sub-envs' ops (their results would be dropped)."""

    async def call_one(self, env_id: int, name: str, args: tuple, kwargs: dict) -> Any:
        """Call (or read) ``name`` on one sub-env's session."""

    async def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        """Call (or read) ``name`` on every sub-env's session; one value per sub-env."""

    async def set_attr(self, name: str, values: Sequence[Any]) -> None:
        """Set ``name`` on every sub-env's session."""

    async def aclose(self) -> None:
        """Release every session, adapter, process or actor."""

    def release(self) -> None:
        """Release what outlives the backend (Ray's runtime), from the closing thread, last."""


class Phase(enum.Enum):
    """Where a sub-env's episode stands, as the driver knows it; it decides the next request."""

    NEW = "new"
    """Never reset: stepping it is the caller's mistake (:class:`EpisodeNotStarted`)."""
    RUNNING = "running"
    """An episode runs: the next request steps it."""
    ENDED = "ended"
    """The episode terminated or was truncated: autoreset decides what the next request does."""
    BROKEN = "broken"
    """The backend failed or the request was abandoned: the next request recreates the sub-env's
    session and resets it, reporting why with its result."""


class SubEnv:
    """The driver's record of one sub-env: its phase, its request in flight, its unread result.

    Each transition is one method, so the reset-or-step decision reads one field.
    """

    __slots__ = ("phase", "request", "result", "note", "obs", "slot", "slot_if_ended")

    def __init__(self) -> None:
        self.phase = Phase.NEW
        self.request: int | None = None
        """The id of the request in flight; a result with another id is late and dropped."""
        self.result: Result | None = None
        """The answer to ``request``, arrived but not yet returned by ``recv``/``step``."""
        self.note: dict[str, Any] | None = None
        """An ``info`` entry (the error that broke it) to report with the next reset's result."""
        self.obs: list[Message] = []
        self.slot: int | None = None
        """With groups: the episode slot the request in flight starts (a reset always, a SAME_STEP
        step only if its episode ends: ``slot_if_ended``)."""
        self.slot_if_ended = False

    @property
    def busy(self) -> bool:
        """A request is in flight or its result has not been collected."""
        return self.request is not None or self.result is not None

    def sent(self, req_id: int) -> None:
        self.request, self.result = req_id, None

    def answered(self, result: Result) -> bool:
        """Take ``result`` if it answers the request in flight; False if it is late."""
        if self.request != result.req_id:
            return False
        self.request, self.result = None, result
        return True

    def unread(self) -> Result:
        """The result that arrived (a sub-env listed as ready has one)."""
        assert self.result is not None
        return self.result

    def collected(self) -> Result:
        result, self.result = self.result, None
        assert result is not None
        return result

    def absorb(self, result: Result, autoreset: AutoresetMode, reset: bool) -> None:
        """Move to the phase ``result`` leaves the sub-env in."""
        self.obs = result.obs
        if result.error is not None:
            self.phase = Phase.BROKEN
        elif reset or autoreset == AutoresetMode.SAME_STEP:
            self.phase = Phase.RUNNING
        else:
            self.phase = Phase.ENDED if (result.terminated or result.truncated) else Phase.RUNNING

    def abandon(self, note: dict[str, Any]) -> None:
        """Forget the request in flight (it got no answer in time, or was interrupted)."""
        self.request = self.result = None
        self.phase, self.note = Phase.BROKEN, note

    def take_note(self) -> dict[str, Any] | None:
        note, self.note = self.note, None
        return note


class AgentVectorEnv(gym.vector.VectorEnv):
    """Many chat sub-envs behind one Gymnasium ``VectorEnv``.

    Args:
        num_envs: how many sub-envs.
        tools: the tools every task offers (for the action space).
        backend: what runs the sub-envs (started already); this env closes it.
        autoreset_mode: NEXT_STEP (default), SAME_STEP or DISABLED, as in Gymnasium.
        step_timeout: seconds one sub-env's reset or step may take before it is truncated with
            ``info["error"]`` and recreated (default :data:`~openenv_gym.session.STEP_TIMEOUT`;
            ``None``: no limit).

    A vector env serves one caller at a time (a second thread gets
    :class:`~openenv_gym.errors.ConcurrentUse`); a forgotten :meth:`close` is done at interpreter
    exit within a few seconds.
    """

    def __init__(
        self,
        num_envs: int,
        tools: Sequence[ToolSpec],
        backend: VectorBackend,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = STEP_TIMEOUT,
        any_action: bool = False,
    ):
        num_envs = check_num_envs(num_envs)
        self.num_envs = num_envs
        self._owner = os.getpid()  # a forked child must never touch this env's sessions
        self._backend = backend
        backend.deliver = self._deliver
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
        self._subs = [SubEnv() for _ in range(num_envs)]
        self._arrivals: dict[int, None] = {}  # sub-envs with an uncollected result, in arrival order
        self._arrived: asyncio.Event | None = None
        self._want = 1  # results the waiter needs before it is worth waking
        self._next_req = 0
        self._groups: Groups | None = None
        self._any_action = any_action  # sub-env wrappers decide what an action may be (token ids, ...)
        self._busy = threading.Lock()
        runtime.track(self)

    # -- requests and results --------------------------------------------------------------------
    def _new_op(self, env_id: int, kind: OpKind, **fields: Any) -> Op:
        self._next_req += 1
        op = Op(env_id, self._next_req, kind, **fields)
        self._subs[env_id].sent(op.req_id)
        self._arrivals.pop(env_id, None)
        return op

    def _reset_op(self, env_id: int, **fields: Any) -> Op:
        """A reset request, recreating the sub-env first if it broke."""
        sub = self._subs[env_id]
        if sub.phase is Phase.BROKEN:
            fields["recreate"] = True
        if self._groups is not None:  # the group's task for this member's next episode
            sub.slot, fields["seed"] = self._groups.next_seed(env_id)
            sub.slot_if_ended = False
        return self._new_op(env_id, OpKind.RESET, note=sub.take_note(), **fields)

    def _step_op(self, env_id: int, action: Any) -> Op:
        if self.autoreset_mode != AutoresetMode.SAME_STEP:
            return self._new_op(env_id, OpKind.STEP, action=action)
        fields: dict[str, Any] = {}
        if self._groups is not None:
            sub = self._subs[env_id]
            sub.slot, fields["next_seed"] = self._groups.next_seed(env_id)
            sub.slot_if_ended = True
        return self._new_op(env_id, OpKind.STEP_RESET, action=action, **fields)

    def _absorb(self, result: Result, reset: bool) -> None:
        """Move the sub-env to the phase ``result`` leaves it in; with groups, count the episode
        it started and say which group and episode slot it belongs to."""
        sub = self._subs[result.env_id]
        sub.absorb(result, self.autoreset_mode, reset)
        groups = self._groups
        if groups is None:
            return
        slot = sub.slot
        if slot is not None and result.error is None and (
                not sub.slot_if_ended or result.terminated or result.truncated):  # it started an episode
            groups.begun(result.env_id, slot)
        sub.slot = None
        result.info["group"] = groups.group(result.env_id)
        result.info["group_episode"] = groups.current[result.env_id]

    @property
    def backend(self) -> VectorBackend:
        """What runs the sub-envs (a mixture or a session pool drives it directly)."""
        return self._backend

    @property
    def group_size(self) -> int | None:
        """Sub-envs per group of shared tasks (``None``: no groups); see :meth:`use_groups`."""
        return None if self._groups is None else self._groups.size

    def use_groups(self, group_size: int | None) -> None:
        """Make groups of ``group_size`` consecutive sub-envs play the same tasks (None: no groups).

        See :mod:`openenv_gym.vector.groups`; ``gym.make_vec(..., group_size=k)`` calls this.
        Takes effect from the next :meth:`reset`.
        """
        self._groups = None if group_size is None else Groups(self.num_envs, group_size)

    def _accept(self, result: Result) -> bool:
        """Take a result if it answers the sub-env's current request (False: it is late, dropped)."""
        if not self._subs[result.env_id].answered(result):
            self.late_results += 1
            return False
        self._arrivals[result.env_id] = None
        return True

    def _deliver(self, result: Result) -> None:
        """:meth:`_accept` ``result`` on the loop, waking the waiter if it can now finish."""
        # Wake the waiter only when it can finish: waking it per result would rescan the
        # ready set each time, quadratic in the batch size (256-result batches at 1,024 envs).
        if self._accept(result) and self._arrived is not None and len(self._arrivals) >= self._want:
            self._arrived.set()

    async def _wait(self, env_ids: set[int] | None, count: int, timeout: float | None,
                    deadline: float | None = None) -> list[int]:
        """Wait until ``count`` results are ready (from ``env_ids`` if given); their ids, first-ready
        first. The results stay in place until :meth:`_collect` takes them.

        ``deadline``: the ``time.monotonic()`` by which to give up (default: ``timeout`` s from
        now); ``timeout`` names the limit in the error.
        """
        if self._arrived is None:
            self._arrived = asyncio.Event()
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + timeout
        while True:
            ready = list(self._arrivals) if env_ids is None else [i for i in self._arrivals if i in env_ids]
            if len(ready) >= count:
                return ready[:count]
            self._arrived.clear()
            self._want = len(self._arrivals) + (count - len(ready))
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise BackendTimeout(f"{len(ready)} of {count} sub-env results arrived within the recv "
                                     f"timeout={timeout} s")
            try:
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()
            except TimeoutError:
                pass
            finally:
                self._want = 1

    def _collect(self, env_ids: list[int]) -> None:
        """Mark these results as returned to the caller (the last thing a recv does, so an
        interrupt landing before it loses nothing: the next recv returns them again)."""
        for i in env_ids:
            self._arrivals.pop(i, None)
            self._subs[i].collected()

    def _requested(self) -> list[int]:
        return [i for i, sub in enumerate(self._subs) if sub.request is not None]

    def _abandon(self, env_ids: list[int], why: type[BaseException], message: str) -> None:
        """Give up on these sub-envs' requests (``why``: a timeout, or an interruption): they are
        recreated and reset on their next one."""
        if not env_ids:
            return
        note = {"error": {"type": why.__name__, "message": message}}
        for i in env_ids:
            self._subs[i].abandon(dict(note))
            self._arrivals.pop(i, None)
        runtime.run_sync(self._backend.cancel(env_ids), _CANCEL_TIMEOUT)

    @contextlib.contextmanager
    def _one_caller(self, what: str) -> Iterator[None]:
        self._check_open()
        if not self._busy.acquire(blocking=False):
            raise ConcurrentUse(f"{what}() was called while another call on this vector env is running "
                                "(from another thread?); a vector env serves one caller at a time")
        try:
            yield
        finally:
            self._busy.release()

    # -- Gymnasium VectorEnv API -----------------------------------------------------------------
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[list[Message], ...], dict[str, Any]]:
        """Reset every sub-env, or those in ``options["reset_mask"]``, and return their openings.

        Args:
            seed: ``None``, an int (sub-env ``i`` gets ``seed + i``) or one seed per sub-env; a
                seed reseeds the sub-env's task choice, so the same seed gives the same tasks.
            options: ``reset_mask`` (a bool array of shape ``(num_envs,)``: reset only those) and
                per-episode options given to every reset sub-env (``split``, ``index``, ``task``).

        Returns:
            ``(observations, infos)``: one message list per sub-env (a sub-env outside the mask
            keeps its last observation), and Gymnasium-style batched infos with ``_key`` masks.

        A bad option (an unknown split, a task index out of range) raises
        :class:`~openenv_gym.errors.ConfigurationError`; a backend failure does not raise but
        shows in that sub-env's ``infos["error"]``.

        >>> envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=4)  # doctest: +SKIP
        >>> obs, infos = envs.reset(seed=0)                             # doctest: +SKIP
        >>> obs[0][0]["role"], infos["task_id"][0]                      # doctest: +SKIP
        ('user', 'train/...')
        """
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
        if mask is not None:
            _check_mask(mask, n)
        if self._groups is not None:
            if seed is not None and not isinstance(seed, (int, np.integer)):
                raise ValueError("with group_size, seed must be an int or None: a group's members share one "
                                 "seeded stream of tasks")
            if seed is not None and mask is not None:
                raise ValueError("with group_size, reset(seed=...) restarts every group's stream of tasks, so it "
                                 "cannot go with a reset_mask (the other members would leave their group's "
                                 "stream); reset every sub-env to reseed, or leave out the seed")
            if seed is not None:
                self._groups.reseed(int(seed))
        env_ids = list(range(n)) if mask is None else [i for i in range(n) if mask[i]]
        with self._one_caller("reset"):
            try:
                return self._reset_now(env_ids, seeds, options or None)
            except BaseException:
                # Interrupted (Ctrl-C): the resets still in flight are abandoned, not left to
                # answer a later recv() that never asked for them.
                self._abandon([i for i in env_ids if self._subs[i].request is not None], KeyboardInterrupt,
                              "a reset() was interrupted; the sub-env was reset again")
                raise

    def _reset_now(self, env_ids: list[int], seeds: list[int | None], options: dict[str, Any] | None):
        stale = [i for i in env_ids if self._subs[i].busy]
        if stale:
            for i in stale:
                self._subs[i].request = self._subs[i].result = None
                self._arrivals.pop(i, None)
            runtime.run_sync(self._backend.cancel(stale), _CANCEL_TIMEOUT)
        ops = [self._reset_op(i, seed=seeds[i], options=options) for i in env_ids]
        self._backend.send(ops)
        ready = self._results(set(env_ids), len(env_ids), None)
        results = [self._subs[i].unread() for i in ready]
        self._collect(ready)
        results.sort(key=lambda r: r.env_id)
        for result in results:
            self._absorb(result, reset=True)
            if result.error is not None and result.error.get("user"):
                raise ConfigurationError(f"sub-env {result.env_id}: {result.error['message']}")
        infos = stack_infos([r.info for r in results], [r.env_id for r in results], self.num_envs)
        return tuple(copy.copy(sub.obs) for sub in self._subs), infos

    def step(self, actions: Sequence[Any]) -> tuple[tuple[list[Message], ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-env with its action and wait for all of them.

        Args:
            actions: one action per sub-env: assistant text or an OpenAI assistant message dict
                (with ``tool_calls``). A malformed action is not an error: the sub-env's agent
                gets a message saying what was wrong, as in a single env.

        Returns:
            Gymnasium's batched 5-tuple ``(observations, rewards, terminations, truncations,
            infos)``. A sub-env whose backend failed or exceeded ``step_timeout`` is truncated
            with ``infos["error"]`` and recreated on its next request; the others go on.
            Ended sub-envs autoreset as ``metadata["autoreset_mode"]`` says.

        Raises:
            InvalidAction: an action that is not an action at all (say a set or bytes);
                nothing is sent then.
        """
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Sequence[Any]) -> None:
        """Send one action per sub-env; collect the results with :meth:`step_wait`."""
        self.send(actions)

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[tuple[list[Message], ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for every sub-env's result of the last :meth:`step_async`.

        On ``timeout`` raises :class:`~openenv_gym.errors.BackendTimeout`; the sub-envs that had
        not answered are reset (and recreated) on their next request, with ``info["error"]``
        saying why, and their late results are dropped.
        """
        with self._one_caller("step_wait"):
            ready = sorted(self._recv_ready(None, timeout))
            if len(ready) != self.num_envs:
                raise ConfigurationError("step_wait() needs a step_async() to every sub-env")
            results = [self._subs[i].unread() for i in ready]
            for result in results:
                self._absorb(result, reset=False)
            infos = stack_infos([r.info for r in results], ready, self.num_envs)
            out = (
                tuple(r.obs for r in results),
                np.array([r.reward for r in results], dtype=np.float64),
                np.array([r.terminated for r in results], dtype=np.bool_),
                np.array([r.truncated for r in results], dtype=np.bool_),
                infos,
            )
            self._collect(ready)
            return out

    def send(self, actions: Sequence[Any], env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Send actions to sub-envs without waiting (EnvPool style); collect with :meth:`recv`.

        Args:
            actions: one action per id in ``env_ids``.
            env_ids: the sub-envs to send to (default: all of them); none may have a request in
                flight (a result not yet collected is dropped for the new request).

        A sub-env that ended is autoreset as ``metadata["autoreset_mode"]`` says: NEXT_STEP resets
        it on this request (the action is ignored), SAME_STEP resets it in the same request as
        the final step, DISABLED refuses (reset it with ``reset_mask``). A sub-env that broke is
        recreated and reset on this request, whatever the mode.

        Raises:
            InvalidAction: an action that is not an action at all; nothing is sent then.
        """
        with self._one_caller("send"):
            ids = list(range(self.num_envs)) if env_ids is None else [int(i) for i in env_ids]
            actions = list(actions)
            if len(actions) != len(ids):
                raise ValueError(f"got {len(actions)} actions for {len(ids)} sub-envs")
            if len(set(ids)) != len(ids):
                raise ValueError("env_ids must not repeat")
            for i, action in zip(ids, actions):
                if not 0 <= i < self.num_envs:
                    raise ValueError(f"env id {i} is outside 0..{self.num_envs - 1}")
                sub = self._subs[i]
                if sub.request is not None:  # an uncollected result is superseded, as in step_wait
                    raise ConfigurationError(f"sub-env {i} already has a request in flight; recv() it first")
                if sub.phase is Phase.NEW:
                    raise EpisodeNotStarted(f"sub-env {i} was never reset; call reset() first")
                if self.autoreset_mode == AutoresetMode.DISABLED and sub.phase in (Phase.ENDED, Phase.BROKEN):
                    raise EpisodeFinished(f"sub-env {i} has ended and autoreset is disabled; reset it with "
                                          "options={'reset_mask': mask}")
                if not self._any_action:
                    check_action_type(action)
            ops = []
            for i, action in zip(ids, actions):
                phase = self._subs[i].phase
                if phase is Phase.BROKEN or (phase is Phase.ENDED and self.autoreset_mode == AutoresetMode.NEXT_STEP):
                    ops.append(self._reset_op(i))
                else:
                    ops.append(self._step_op(i, action))
            try:
                self._backend.send(ops)
            except BaseException:
                self._abandon([op.env_id for op in ops if self._subs[op.env_id].request == op.req_id],
                              KeyboardInterrupt,
                              "a send() was interrupted before its request went out; the sub-env was reset")
                raise

    def recv(self, batch_size: int | None = None, timeout: float | None = None) -> Batch:
        """Return the first ``batch_size`` sub-envs to finish, with their ids (EnvPool style).

        Args:
            batch_size: how many results to wait for (default: every request in flight).
            timeout: seconds to wait (``None``: until they arrive).

        Returns:
            A :class:`Batch`: observations, rewards, terminations, truncations and infos of the
            sub-envs in ``env_ids``, in the order they finished.

        Raises:
            BackendTimeout: fewer than ``batch_size`` results arrived within ``timeout``. When
                waiting for all in flight, the missing sub-envs are then reset on their next
                request; with a smaller batch they stay in flight. An interrupted ``recv``
                (Ctrl-C) loses nothing: the results arrive for the next one.
        """
        with self._one_caller("recv"):
            ready = self._recv_ready(batch_size, timeout)
            results = [self._subs[i].unread() for i in ready]
            for result in results:
                self._absorb(result, reset=False)
            # Sized by the batch: info k is the k-th result's (Gymnasium's would be num_envs long)
            infos = stack_infos([r.info for r in results], range(len(results)), len(results))
            batch = Batch(
                tuple(r.obs for r in results),
                np.array([r.reward for r in results], dtype=np.float64),
                np.array([r.terminated for r in results], dtype=np.bool_),
                np.array([r.truncated for r in results], dtype=np.bool_),
                infos,
                np.array([r.env_id for r in results], dtype=np.int64),
            )
            self._collect(ready)
            return batch

    def _recv_ready(self, batch_size: int | None, timeout: float | None) -> list[int]:
        in_flight = sum(sub.busy for sub in self._subs)
        count = in_flight if batch_size is None else min(batch_size, in_flight)
        if count == 0:
            raise ConfigurationError("recv() with no request in flight; send() first")
        try:
            return self._results(None, count, timeout, all_needed=count == in_flight)
        except BackendTimeout:
            if batch_size is None or batch_size >= in_flight:
                self._abandon(self._requested(), BackendTimeout, f"the previous request got no answer within "
                                                                 f"the recv timeout={timeout} s; the sub-env was reset")
            raise

    def _results(self, env_ids: set[int] | None, count: int, timeout: float | None,
                 all_needed: bool = False) -> list[int]:
        """Wait for ``count`` results (from ``env_ids`` if given); their ids, first-ready first.

        ``all_needed``: every request in flight is waited for, so calls the backend started on
        this thread may be waited for here, with no hop to the loop (a lockstep step)."""
        # One budget for both waits: ``timeout`` bounds the whole call, not each half of it.
        deadline = None if timeout is None else time.monotonic() + timeout
        if all_needed or (env_ids is not None and count == len(self._requested())):
            here = self._backend.settle(True, timeout)
            if here is not None:  # answers the caller's thread fetched: the loop never sees them
                for result in here:
                    self._accept(result)
        else:
            self._backend.settle(False, None)
        ready = list(self._arrivals) if env_ids is None else [i for i in self._arrivals if i in env_ids]
        if len(ready) >= count:
            return ready[:count]
        return runtime.run_sync(self._wait(env_ids, count, timeout, deadline))

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name`` on every sub-env's session (or read it, if not callable)."""
        with self._one_caller("call"):
            return tuple(runtime.run_sync(self._backend.call(name, args, kwargs)))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Read ``name`` from every sub-env's session."""
        return self.call(name)

    def set_attr(self, name: str, values: Any | list[Any] | tuple[Any, ...]) -> None:
        """Set ``name`` on every sub-env's session: one value each, or one value for all."""
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"values must have length num_envs={self.num_envs}, got {len(values)}")
        with self._one_caller("set_attr"):
            runtime.run_sync(self._backend.set_attr(name, list(values)))

    def close_extras(self, **kwargs: Any) -> None:
        """Stop every in-flight request and release the backend (no process or actor is left).

        Bounded: a backend that does not answer is abandoned after :data:`_CLOSE_TIMEOUT` s
        (adapters bound their own teardown much tighter).
        """
        runtime.untrack(self)
        if os.getpid() != self._owner:  # a forked child's copy releases nothing of the parent's
            return
        try:
            runtime.run_sync(self._shutdown(), _CLOSE_TIMEOUT)
        finally:
            self._backend.release()

    async def _shutdown(self) -> None:
        pending = self._requested()
        for sub in self._subs:
            sub.request = sub.result = None
        self._arrivals.clear()
        if pending:
            await self._backend.cancel(pending)
        await self._backend.aclose()

    def _check_open(self) -> None:
        if self.closed:
            raise ConfigurationError("the vector env is closed")
        if os.getpid() != self._owner:
            raise inherited("vector env", self._owner)

    def __del__(self) -> None:
        # Never block here: this may run in any thread, or during finalisation (when the exit
        # hook has closed, or will close, what is left).
        if not getattr(self, "closed", True) and hasattr(self, "_owner"):  # not a half-built one
            self.closed = True
            runtime.untrack(self)
            if os.getpid() == self._owner:
                runtime.close_later(self._shutdown())


def _check_mask(mask: Any, n: int) -> None:
    """Gymnasium's checks of ``options["reset_mask"]``, with its exception types."""
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (n,):
        raise ValueError(f"`options['reset_mask']` must have shape `({n},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError(f"`options['reset_mask']` must contain a boolean array with at least one True value, got reset_mask={mask}")


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
