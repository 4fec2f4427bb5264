"""HostRunner: one env's episode played in an adapter host process (``gym.make(id, python=...)``).

:class:`~openenv_gym.env.AgentEnv` plays it as any :class:`~openenv_gym.runners.Runner`. The calls
are plain blocking requests made on the caller's thread
(:class:`~openenv_gym.hosts.blocking.BlockingHost`), since a single env waits for each answer
anyway and the runtime loop would only add a hop. Each reset and step is one
:class:`~openenv_gym.shard.ops.Op` to a one-sub-env :class:`~openenv_gym.shard.shard.Shard`, the
same request a vector env's shard gets. What differs from in-process is only where failures come
from:

* an error the host's session raised comes back by name and is raised here as the same class
  (:func:`~openenv_gym.errors.from_wire`), so ``TaskNotFound``, ``BackendTimeout``... are typed;
* the task index is drawn from the env's ``np_random`` here, as :class:`EnvSession` draws it (the
  task counts are asked of the host once per split), so the same ``reset(seed=...)`` picks the
  same task in-process or isolated;
* every call is bounded by ``step_timeout``; a step cut short (the timeout, Ctrl-C) is cancelled
  in the host too and leaves the episode needing ``reset``;
* a host that misses its deadline must answer a liveness check within
  :data:`~openenv_gym.shard.handle.PING_TIMEOUT` s; one that does not (stopped, frozen, its stream
  corrupted) is killed, as is a host whose stream breaks, and the next ``reset`` starts a new one:
  the same rule a vector env applies to its shards;
* the host dying mid-episode raises :class:`~openenv_gym.errors.HostDied` at once; the episode is
  lost (a step raises :class:`~openenv_gym.errors.EpisodeInterrupted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
from typing import Any

import msgspec
import numpy as np

from openenv_gym import runtime
from openenv_gym.actions import parse_action
from openenv_gym.adapters.base import AdapterSpec
from openenv_gym.errors import BackendTimeout, EpisodeInterrupted, HostDied, from_wire
from openenv_gym.hosts.blocking import BlockingHost
from openenv_gym.hosts.protocol import Kind
from openenv_gym.runners import Runner
from openenv_gym.session import StepResult, TaskCursor, check_steppable, pick_index
from openenv_gym.shard.handle import PING_TIMEOUT
from openenv_gym.shard.ops import Op, OpKind, Result, decode_results, encode_ops
from openenv_gym.shard.shard import ShardConfig, decode_tools
from openenv_gym.wire import Message, ToolSpec

__all__ = ["HostRunner"]
_RESTART_CLOSE = 1.0
_CLOSE_LATER = 30.0
_cancel_encoder = msgspec.msgpack.Encoder()


class HostRunner(Runner):
    """One env's session in a host process under ``python`` (see the module docstring)."""

    def __init__(self, python: str, adapter: AdapterSpec, *, split: str | None = None, max_turns: int | None = None):
        self.python = python
        self.adapter_spec = adapter
        self.split = split
        self.max_turns = max_turns
        self.tools: list[ToolSpec] = []
        self.last_messages: list[Message] = []
        self.started = self.done = self.interrupted = False
        self.lost: str | None = None
        self.replaced = 0
        """How many dead or hung hosts were replaced."""
        self._host: BlockingHost | None = None
        self._suspect = False  # the host missed a deadline: checked for life before its next request
        self._start_timeout: float | None = None
        self._req = 0
        self._counts: dict[str | None, int] = {}
        self._cursor = TaskCursor()  # the task walk of an endless split, kept here as the draw is

    def _new_host(self) -> BlockingHost:
        spec = self.adapter_spec
        config = ShardConfig(entry=spec.entry, adapter_kwargs=dict(spec.kwargs), env_ids=[0], split=self.split,
                             max_turns=self.max_turns, envs_per_client=1, replaced=self.replaced > 0)
        return BlockingHost(self.python, config)

    @property
    def pid(self) -> int | None:
        """The host process's id (``None`` before it starts)."""
        return None if self._host is None else self._host.pid

    def start(self, timeout: float | None) -> list[ToolSpec]:
        """Start the host and its adapter (within ``timeout``, the start limit); the tools."""
        self._start_timeout = timeout
        try:
            if self._host is None:
                self._host = self._new_host()
                self._host.open(timeout=120.0 if timeout is None else timeout)
            reply, _ = self._request(Kind.START, b"", timeout, "starting the environment", limit="start_timeout")
            return decode_tools(reply)
        except BaseException:
            self._drop_host()
            raise

    def _live_host(self) -> BlockingHost:
        """The host, replaced first if it died, or missed a deadline and fails a liveness check
        (its episode is gone)."""
        if self._suspect and self._host is not None:
            self._suspect = False
            self._host.check_alive(PING_TIMEOUT)
        if self._host is None or self._host.gone is not None:
            if self._host is not None:
                self.replaced += 1
            self._drop_host()
            self.start(self._start_timeout)
        assert self._host is not None
        return self._host

    def _drop_host(self) -> None:
        host, self._host = self._host, None
        if host is not None:
            with contextlib.suppress(BaseException):
                host.close(_RESTART_CLOSE)

    def _request(self, kind: Kind, body: bytes, timeout: float | None, what: str, limit: str = "step_timeout",
                 abandoned: Any = None) -> tuple[bytes, list[bytes]]:
        """One request to the host (replaced first if it is gone): ``(reply, streamed results)``."""
        host = self._host if kind is Kind.START else self._live_host()
        assert host is not None
        try:
            return host.request(kind, body, timeout=timeout, what=what, limit=limit, abandoned=abandoned)
        except BackendTimeout:
            self._suspect = True  # the caller gets its timeout now; the next call checks the host
            raise

    # -- the task API ------------------------------------------------------------------------------
    def task_api(self, name: str, args: tuple, timeout: float | None) -> Any:
        reply, _ = self._request(Kind.CALL, pickle.dumps((name, args, {}, None)), timeout, f"{name}()")
        return pickle.loads(reply)[0]

    # -- episodes ----------------------------------------------------------------------------------
    def _run(self, op: Op, what: str, timeout: float | None) -> Result:
        def cancel() -> None:  # given up (the timeout, Ctrl-C): the host stops the op too
            self.interrupted = True
            host = self._host
            if host is not None:
                host.notify(Kind.CANCEL, _cancel_encoder.encode([(op.env_id, op.req_id)]))

        try:
            reply, streamed = self._request(Kind.RUN, encode_ops([op]), timeout, what, abandoned=cancel)
        except HostDied as exc:
            self.lost = str(exc)
            raise
        results = [r for body in (*streamed, reply) if body for r in decode_results(body)]
        if not results:
            raise HostDied("the host answered no result (the op was cancelled there)")
        result = results[0]
        if result.error is not None:
            raise from_wire(result.error)
        return result

    def reset(self, rng: np.random.Generator, options: dict[str, Any] | None,
              timeout: float | None, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        self.started, self.lost, self.interrupted = True, None, False
        if seed is not None:
            self._cursor.seed(seed)
        self.done = True  # until the reset succeeds
        if options is None or (isinstance(options, dict) and set(options) <= {"split"}):
            split = (options or {}).get("split")  # else the host checks the options, or no draw
            if split not in self._counts:
                self._counts[split] = self.task_api("num_tasks", (split,), timeout)
            if self._counts[split] > 0:
                options = {**(options or {}), "index": pick_index(self._counts[split], rng, self._cursor)}
        self._req += 1
        result = self._run(Op(0, self._req, OpKind.RESET, options=options), "reset", timeout)
        self.done = False
        self.tools = [ToolSpec.from_openai(t) for t in result.info.get("tools", [])]
        self.last_messages = result.obs
        return list(result.obs), result.info

    def check_steppable(self) -> None:
        if self.started and self.lost is not None:
            raise EpisodeInterrupted(f"the episode was lost with its host process; call reset() ({self.lost[:200]})")
        check_steppable(self.started, self.done, self.interrupted)

    def step(self, action: Any, timeout: float | None) -> StepResult:
        self.check_steppable()
        turn = parse_action(action)  # InvalidAction here, as in-process
        self._req += 1
        result = self._run(Op(0, self._req, OpKind.STEP, turn=turn), "step", timeout)
        if result.terminated or result.truncated:
            self.done = True
        if "tools" in result.info:
            self.tools = [ToolSpec.from_openai(t) for t in result.info["tools"]]
        self.last_messages = result.obs
        return list(result.obs), result.reward, result.terminated, result.truncated, result.info

    def close(self, timeout: float) -> None:
        """Stop the host process (its env's episode and servers with it); bounded, never raises."""
        host, self._host = self._host, None
        if host is not None:
            with contextlib.suppress(BaseException):
                host.close(timeout)

    def close_later(self) -> None:
        async def close_elsewhere() -> None:  # a blocking close, on a worker thread of the runtime loop
            await asyncio.to_thread(self.close, _CLOSE_LATER)

        runtime.close_later(close_elsewhere())
