"""HostedSession: one env's episode played in an adapter host process (``gym.make(id, python=...)``).

:class:`~openenv_gym.env.AgentEnv` plays it as it plays an in-process
:class:`~openenv_gym.session.EnvSession`, with one difference of shape: these methods are plain
blocking calls made on the caller's thread (:class:`~openenv_gym.hosts.blocking.BlockingHost`),
since a single env waits for each answer anyway and the runtime loop would only add a hop. Each
reset and step is one :class:`~openenv_gym.vector.ops.Op` to a one-sub-env
:class:`~openenv_gym.hosts.shard.EnvHost`, the same request a vector env's host gets. What differs
from in-process is only where failures come from:

* an error the host's session raised comes back by name and is raised here as the same class
  (:func:`~openenv_gym.errors.from_wire`), so ``TaskNotFound``, ``BackendTimeout``... are typed;
* the task index is drawn from the env's ``np_random`` here, as :class:`EnvSession` draws it (the
  task counts are asked of the host once per split), so the same ``reset(seed=...)`` picks the
  same task in-process or isolated;
* every call is bounded by ``step_timeout``; a step cut short (the timeout, Ctrl-C) is cancelled
  in the host too and leaves the episode needing ``reset``;
* the host dying mid-episode raises :class:`~openenv_gym.errors.HostDied` at once; the episode is
  lost (a step raises :class:`~openenv_gym.errors.EpisodeInterrupted`) and the next ``reset``
  starts a new host.
"""

from __future__ import annotations

import contextlib
import pickle
from typing import Any

import msgspec
from gymnasium.utils import seeding

from openenv_gym.actions import parse_action
from openenv_gym.adapters.base import AdapterSpec
from openenv_gym.errors import EpisodeInterrupted, HostDied, from_wire
from openenv_gym.hosts.blocking import BlockingHost
from openenv_gym.hosts.shard import decode_tools
from openenv_gym.session import check_steppable
from openenv_gym.vector.ops import Op, Result, decode_results, encode_ops
from openenv_gym.wire import Message, Split, ToolSpec

__all__ = ["HostedSession"]

_CLOSE_TIMEOUT = 30.0
_RESTART_CLOSE = 1.0
_cancel_encoder = msgspec.msgpack.Encoder()


class HostedSession:
    """The :class:`~openenv_gym.session.EnvSession` surface :class:`~openenv_gym.env.AgentEnv` uses,
    as blocking calls, served by a host process under ``python``.

    ``step_timeout`` bounds each call (``None``: no bound); :class:`~openenv_gym.env.AgentEnv`
    sets it to its own.
    """

    def __init__(self, python: str, adapter: AdapterSpec, *, split: str | None = None, max_turns: int | None = None):
        self.python = python
        self.adapter_spec = adapter
        self.split = split
        self.max_turns = max_turns
        self.step_timeout: float | None = None
        self.np_random, _ = seeding.np_random()
        self.tools: list[ToolSpec] = []
        self.last_messages: list[Message] = []
        self.started = self.done = self.interrupted = False
        self.lost: str | None = None
        self._host: BlockingHost | None = None
        self._replaced = False
        self._req = 0
        self._counts: dict[str | None, int] = {}

    def _new_host(self) -> BlockingHost:
        spec = self.adapter_spec
        init = {"entry": spec.entry, "adapter_kwargs": dict(spec.kwargs), "env_ids": [0], "split": self.split,
                "max_turns": self.max_turns, "envs_per_client": 1, "step_timeout": None,
                "replaced": self._replaced}
        return BlockingHost(self.python, init)

    def start(self, timeout: float | None = None) -> list[ToolSpec]:
        """Start the host and its adapter (within ``timeout``); the tools every task offers."""
        try:
            if self._host is None:
                self._host = self._new_host()
                self._host.open()
            reply, _ = self._host.request("start", timeout=timeout, what="starting the environment",
                                          limit="the start limit")
            return decode_tools(reply)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        """The host process's id (``None`` before it starts)."""
        return None if self._host is None else self._host.pid

    def _live_host(self) -> BlockingHost:
        """The host, restarted first if it died (its episode is gone)."""
        if self._host is None or self._host.gone is not None:
            if self._host is not None:
                self._host.close(_RESTART_CLOSE)
            self._replaced = True
            self._host = None
            self.start(self.step_timeout)
        assert self._host is not None
        return self._host

    # -- the task API ------------------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> Any:
        reply, _ = self._live_host().request("call", pickle.dumps((name, args, {})), timeout=self.step_timeout,
                                             what=f"{name}()")
        return pickle.loads(reply)[0]

    def splits(self) -> list[Split]:
        return self._call("splits")

    def num_tasks(self, split: str | None = None) -> int:
        return self._call("num_tasks", split)

    def task(self, split: str, index: int) -> dict[str, Any]:
        return self._call("task", split, index)

    # -- episodes ----------------------------------------------------------------------------------
    def _run(self, op: Op, what: str) -> Result:
        host = self._live_host()

        def cancel() -> None:  # given up (the timeout, Ctrl-C): the host stops the op too
            self.interrupted = True
            host.notify("cancel", _cancel_encoder.encode([(op.env_id, op.req_id)]))

        try:
            reply, streamed = host.request("run", encode_ops([op]), timeout=self.step_timeout, what=what,
                                           abandoned=cancel)
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

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        self.started, self.lost, self.interrupted = True, None, False
        self.done = True  # until the reset succeeds
        if options is None or (isinstance(options, dict) and set(options) <= {"split"}):
            split = (options or {}).get("split")  # else the host checks the options, or no draw
            if split not in self._counts:
                self._counts[split] = self._call("num_tasks", split)
            if self._counts[split] > 0:
                options = {**(options or {}), "index": int(self.np_random.integers(self._counts[split]))}
        self._req += 1
        result = self._run(Op(0, self._req, "reset", options=options), "reset")
        self.done = False
        self.tools = [ToolSpec.from_openai(t) for t in result.info.get("tools", [])]
        self.last_messages = result.obs
        return list(result.obs), result.info

    def check_steppable(self) -> None:
        if self.started and self.lost is not None:
            raise EpisodeInterrupted(f"the episode was lost with its host process; call reset() ({self.lost[:200]})")
        check_steppable(self.started, self.done, self.interrupted)

    def step(self, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        self.check_steppable()
        turn = parse_action(action)  # InvalidAction here, as in-process
        self._req += 1
        result = self._run(Op(0, self._req, "step", turn=turn), "step")
        if result.terminated or result.truncated:
            self.done = True
        if "tools" in result.info:
            self.tools = [ToolSpec.from_openai(t) for t in result.info["tools"]]
        self.last_messages = result.obs
        return list(result.obs), result.reward, result.terminated, result.truncated, result.info

    def end(self) -> None:
        """End the running episode (the next reset starts another); the host stays."""
        self.started = False

    def close(self) -> None:
        """Stop the host process (its env's episode and servers with it); bounded, never raises."""
        host, self._host = self._host, None
        if host is not None:
            with contextlib.suppress(BaseException):
                host.close(_CLOSE_TIMEOUT)
