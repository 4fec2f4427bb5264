"""ProcessVectorEnv: sub-envs in adapter host processes under another interpreter.

What ``gym.make_vec(id, n, python=PATH)`` (or ``isolate=True``) builds on the default backend: the
sub-envs are split into ``num_hosts`` shards, each a :class:`~openenv_gym.shard.shard.Shard` in its
own host process (:mod:`openenv_gym.hosts.process`) under that interpreter, so the env runs with
its own dependencies while the trainer sees one vector env. Results stream back as each sub-env
finishes, so ``recv`` keeps the first-ready order; sharding, dead-host replacement and
cancellation are :class:`~openenv_gym.vector.shards.Shards`'.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from gymnasium.vector import AutoresetMode

from openenv_gym.adapters.base import AdapterSpec
from openenv_gym.errors import ConfigurationError
from openenv_gym.hosts.interpreter import Interpreter
from openenv_gym.hosts.process import ProcessHandle
from openenv_gym.redact import RedactedSpec
from openenv_gym.session import STEP_TIMEOUT
from openenv_gym.shard.shard import ShardConfig
from openenv_gym.shard.wrapped import check_wrappers
from openenv_gym.vector.base import AgentVectorEnv, check_num_envs
from openenv_gym.vector.shards import START_TIMEOUT, Shards, default_layout, open_shards

__all__ = ["ProcessVectorEnv", "default_hosts"]

ENVS_PER_HOST = 32
"""Sub-envs per host process by default: a host's client work then stays well below one core."""


def default_hosts(num_envs: int) -> int:
    """One host per :data:`ENVS_PER_HOST` sub-envs, at least one, at most one per core."""
    return max(1, min(os.cpu_count() or 1, -(-num_envs // ENVS_PER_HOST)))


class ProcessVectorEnv(RedactedSpec, AgentVectorEnv):
    """Sub-envs sharded over host processes running ``python``.

    Args:
        num_envs: how many sub-envs.
        adapter: how to build an adapter; each host builds its own under ``python``.
        python: the interpreter of the hosts (a venv's ``bin/python`` with openenv-gym installed), or
            an :class:`~openenv_gym.hosts.interpreter.Interpreter` (``isolate=True``) to resolve.
        num_hosts: host processes (default :func:`default_hosts`). Sub-env ``i`` lives in host
            ``i % num_hosts``.
        envs_per_client: sub-envs per adapter inside a host.
        max_in_flight: bound on concurrent backend operations per host (``None``: no bound).
        env_wrappers: Gymnasium wrappers stacked on every sub-env inside its host (they must be
            picklable: classes or ``functools.partial`` of them, not lambdas).
        split, max_turns, autoreset_mode, step_timeout, start_timeout: as for every vector env. A
            host still busy ``step_timeout`` + a few seconds into a call must answer a liveness
            check, or it is killed and replaced.
    """

    def __init__(
        self,
        num_envs: int,
        adapter: AdapterSpec,
        *,
        python: str | Interpreter,
        split: str | None = None,
        max_turns: int | None = None,
        num_hosts: int | None = None,
        envs_per_client: int = 8,
        max_in_flight: int | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = STEP_TIMEOUT,
        start_timeout: float = START_TIMEOUT,
        env_wrappers: Sequence[Any] | None = None,
    ):
        num_envs = check_num_envs(num_envs)
        if num_hosts is not None and num_hosts < 1:
            raise ConfigurationError("num_hosts must be at least 1")
        autoreset_mode = AutoresetMode(autoreset_mode)
        wrappers = check_wrappers(env_wrappers)
        # The hosts already spread the sub-envs over the cores: one server per host's local source.
        accepts = adapter.accepted_here()
        if "server_workers" not in adapter.kwargs and accepts is not None and "server_workers" in accepts:
            adapter = AdapterSpec(adapter.entry, {**adapter.kwargs, "server_workers": 1})
        self.python = python.resolve() if isinstance(python, Interpreter) else python
        layout = default_layout(num_envs, num_hosts or default_hosts(num_envs))

        def new_handle(k: int, replaced: bool) -> ProcessHandle:
            config = ShardConfig(entry=adapter.entry, adapter_kwargs=dict(adapter.kwargs), env_ids=layout[k],
                                 num_envs=num_envs,
                                 split=split, max_turns=max_turns, envs_per_client=envs_per_client,
                                 step_timeout=step_timeout, max_in_flight=max_in_flight, replaced=replaced,
                                 env_wrappers=wrappers)
            return ProcessHandle(self.python, config, init_timeout=start_timeout)

        shards = Shards(layout, new_handle, step_timeout=step_timeout, start_timeout=start_timeout)
        tools = open_shards(shards)
        self._shards = shards
        super().__init__(num_envs, tools, shards, autoreset_mode=autoreset_mode, step_timeout=step_timeout,
                         any_action=bool(wrappers))

    @property
    def num_hosts(self) -> int:
        return len(self._shards.layout)

    @property
    def pids(self) -> list[int | None]:
        """The host processes' ids, one per shard (a replaced host's changes)."""
        return [h.process.pid for h in self._shards.handles]  # type: ignore[attr-defined]

    @property
    def replaced_hosts(self) -> int:
        """How many dead or hung hosts were replaced."""
        return self._shards.replaced
