"""ConcurrentVectorEnv: every sub-env's episode runs concurrently on this process's runtime loop.

The best fit for remote, I/O-bound backends (ORS servers, Fleet): 1,024 sub-envs cost 1,024
coroutines, not 1,024 processes. The sub-envs live in one :class:`~openenv_gym.shard.shard.Shard`
in this process, reached through a :class:`~openenv_gym.shard.handle.LocalHandle`: ops and results
pass as objects, nothing is encoded. The shard shares a few adapters among its sessions
(``envs_per_client`` sessions per adapter: one local server, and a few aiohttp connection pools).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gymnasium.vector import AutoresetMode

from openenv_gym.adapters.base import AdapterSpec
from openenv_gym.processes import tune_gc_for
from openenv_gym.redact import RedactedSpec
from openenv_gym.session import STEP_TIMEOUT
from openenv_gym.shard.handle import LocalHandle
from openenv_gym.shard.shard import Shard, ShardConfig
from openenv_gym.shard.wrapped import check_wrappers
from openenv_gym.vector.base import AgentVectorEnv, check_num_envs
from openenv_gym.vector.shards import START_TIMEOUT, Shards, open_shards

__all__ = ["ConcurrentVectorEnv"]


class ConcurrentVectorEnv(RedactedSpec, AgentVectorEnv):
    """Sub-envs as concurrent sessions over a few shared adapters, on the runtime loop.

    Args:
        num_envs: how many sub-envs.
        adapter: how to build an adapter (several are built, each shared by many sub-envs).
        split: the default split of every sub-env.
        max_turns: truncate each episode after this many agent actions.
        envs_per_client: sub-envs per adapter (each adapter has its own connection pool).
        max_in_flight: bound on concurrent backend operations (``None``: no bound).
        env_wrappers: Gymnasium wrappers (callables ``env -> env``) stacked on every sub-env, as
            on a single env (:mod:`openenv_gym.shard.wrapped`).
        autoreset_mode, step_timeout: see :class:`~openenv_gym.vector.base.AgentVectorEnv`.
        start_timeout: seconds the adapters may take to start (a local source launches a server).

    From :data:`~openenv_gym.processes.TUNE_GC_AT` sub-envs on, the process's garbage collector
    runs less often (:func:`~openenv_gym.processes.tune_gc_for`, unless its thresholds were set
    already).
    """

    def __init__(
        self,
        num_envs: int,
        adapter: AdapterSpec,
        *,
        split: str | None = None,
        max_turns: int | None = None,
        envs_per_client: int = 8,
        max_in_flight: int | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = STEP_TIMEOUT,
        start_timeout: float = START_TIMEOUT,
        env_wrappers: Sequence[Callable[[Any], Any]] | None = None,
    ):
        num_envs = check_num_envs(num_envs)
        autoreset_mode = AutoresetMode(autoreset_mode)  # fail before any server or client starts
        wrappers = check_wrappers(env_wrappers)
        config = ShardConfig(entry=adapter.entry, adapter_kwargs=dict(adapter.kwargs), env_ids=list(range(num_envs)), num_envs=num_envs,
                             split=split, max_turns=max_turns, envs_per_client=envs_per_client,
                             step_timeout=step_timeout, max_in_flight=max_in_flight, env_wrappers=wrappers)
        tune_gc_for(num_envs)  # thousands of sessions in this process: see processes.tune_gc_for
        self.shard = Shard(config)
        """The one shard of every sub-env, in this process."""
        shards = Shards([config.env_ids], lambda k, replaced: LocalHandle(self.shard),
                        step_timeout=step_timeout, start_timeout=start_timeout)
        tools = open_shards(shards)
        super().__init__(num_envs, tools, shards, autoreset_mode=autoreset_mode, step_timeout=step_timeout,
                         any_action=bool(wrappers))

    @property
    def adapters(self) -> list[Any]:
        """The adapters the sub-envs share (for diagnostics: a local source's server pids)."""
        return self.shard.adapters
