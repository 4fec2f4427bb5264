"""HostedSession: one env's episode played in an adapter host process (``gym.make(id, python=...)``).

:class:`~openenv_gym.env.AgentEnv` drives it exactly as it drives an in-process
:class:`~openenv_gym.session.EnvSession`; underneath, each reset and step is one
:class:`~openenv_gym.vector.ops.Op` to a one-sub-env :class:`~openenv_gym.hosts.shard.EnvHost`,
the same request a vector env's host gets. What differs is only where failures come from:

* an error the host's session raised comes back by name and is raised here as the same class
  (:func:`~openenv_gym.errors.from_wire`), so ``TaskNotFound``, ``BackendTimeout``... are typed;
* the task index is drawn from the env's ``np_random`` here, as :class:`EnvSession` draws it (the
  task counts are asked of the host once per split), so the same ``reset(seed=...)`` picks the
  same task in-process or isolated;
* the host dying mid-episode raises :class:`~openenv_gym.errors.HostDied` at once; the episode is
  lost (a step raises :class:`~openenv_gym.errors.EpisodeInterrupted`) and the next ``reset``
  starts a new host.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gymnasium.utils import seeding

from openenv_gym.actions import parse_action
from openenv_gym.adapters.base import AdapterSpec
from openenv_gym.errors import EpisodeInterrupted, HostDied, from_wire
from openenv_gym.hosts.process import ProcessHandle
from openenv_gym.session import check_steppable
from openenv_gym.vector.ops import Op, Result
from openenv_gym.wire import Message, Split, ToolSpec

__all__ = ["HostedSession"]

_CLOSE_TIMEOUT = 30.0


class HostedSession:
    """The :class:`~openenv_gym.session.EnvSession` surface :class:`~openenv_gym.env.AgentEnv` uses,
    served by a host process under ``python``."""

    def __init__(self, python: str, adapter: AdapterSpec, *, split: str | None = None, max_turns: int | None = None):
        self.python = python
        self.adapter_spec = adapter
        self.split = split
        self.max_turns = max_turns
        self.np_random, _ = seeding.np_random()
        self.tools: list[ToolSpec] = []
        self.last_messages: list[Message] = []
        self.started = self.done = self.interrupted = False
        self.lost: str | None = None
        self._handle: ProcessHandle | None = None
        self._replaced = False
        self._req = 0
        self._counts: dict[str | None, int] = {}

    def _new_handle(self) -> ProcessHandle:
        spec = self.adapter_spec
        init = {"entry": spec.entry, "adapter_kwargs": dict(spec.kwargs), "env_ids": [0], "split": self.split,
                "max_turns": self.max_turns, "envs_per_client": 1, "step_timeout": None,
                "replaced": self._replaced}
        return ProcessHandle(self.python, init)

    async def start(self) -> list[ToolSpec]:
        """Start the host and its adapter; the tools every task offers."""
        if self._handle is None:
            self._handle = self._new_handle()
        try:
            return await self._handle.start()
        except BaseException:
            await self.close()
            raise

    @property
    def pid(self) -> int | None:
        """The host process's id (``None`` before it starts)."""
        return None if self._handle is None else self._handle.process.pid

    # -- the task API ------------------------------------------------------------------------------
    async def _call(self, name: str, *args: Any) -> Any:
        if self._handle is None or self._handle.process.gone is not None:
            await self._restart()
        assert self._handle is not None
        return (await self._handle.call(name, args, {}))[0]

    async def splits(self) -> list[Split]:
        return await self._call("splits")

    async def num_tasks(self, split: str | None = None) -> int:
        return await self._call("num_tasks", split)

    async def task(self, split: str, index: int) -> dict[str, Any]:
        return await self._call("task", split, index)

    # -- episodes ----------------------------------------------------------------------------------
    async def _restart(self) -> None:
        """A new host in place of one that died (its episode is gone)."""
        if self._handle is not None:
            await self._handle.close(1.0)
        self._replaced = True
        self._handle = self._new_handle()
        await self._handle.start()

    async def _run(self, op: Op) -> Result:
        if self._handle is None or self._handle.process.gone is not None:
            await self._restart()
        handle = self._handle
        assert handle is not None
        results: list[Result] = []
        try:
            await handle.run([op], results.append)
        except asyncio.CancelledError:
            handle.cancel([(op.env_id, op.req_id)])  # the host stops the op too
            raise
        except HostDied as exc:
            self.lost = str(exc)
            raise
        if not results:
            raise HostDied("the host answered no result (the op was cancelled there)")
        result = results[0]
        if result.error is not None:
            raise from_wire(result.error)
        return result

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        self.started, self.lost, self.interrupted = True, None, False
        self.done = True  # until the reset succeeds
        if options is None or (isinstance(options, dict) and set(options) <= {"split"}):
            split = (options or {}).get("split")  # else the host checks the options, or no draw
            if split not in self._counts:
                self._counts[split] = await self._call("num_tasks", split)
            if self._counts[split] > 0:
                options = {**(options or {}), "index": int(self.np_random.integers(self._counts[split]))}
        self._req += 1
        result = await self._run(Op(0, self._req, "reset", options=options))
        self.done = False
        self.tools = [ToolSpec.from_openai(t) for t in result.info.get("tools", [])]
        self.last_messages = result.obs
        return list(result.obs), result.info

    def check_steppable(self) -> None:
        if self.started and self.lost is not None:
            raise EpisodeInterrupted(f"the episode was lost with its host process; call reset() ({self.lost[:200]})")
        check_steppable(self.started, self.done, self.interrupted)

    async def step(self, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        self.check_steppable()
        turn = parse_action(action)  # InvalidAction here, as in-process
        self._req += 1
        try:
            result = await self._run(Op(0, self._req, "step", turn=turn))
        except asyncio.CancelledError:
            self.interrupted = True
            raise
        if result.terminated or result.truncated:
            self.done = True
        if "tools" in result.info:
            self.tools = [ToolSpec.from_openai(t) for t in result.info["tools"]]
        self.last_messages = result.obs
        return list(result.obs), result.reward, result.terminated, result.truncated, result.info

    async def aclose(self) -> None:
        """End the running episode (the next reset starts another); the host stays."""
        self.started = False

    async def close(self) -> None:
        """Stop the host process (its env's episode and servers with it); bounded, never raises."""
        handle, self._handle = self._handle, None
        if handle is not None:
            await handle.close(_CLOSE_TIMEOUT)
