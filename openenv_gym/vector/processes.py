"""ProcessVectorEnv: sub-envs in adapter host processes under another interpreter.

What ``gym.make_vec(id, n, python=PATH)`` (or ``isolate=True``) builds on the default backend: the
sub-envs are split into ``num_hosts`` shards, each an :class:`~openenv_gym.hosts.shard.EnvHost` in
its own host process (:mod:`openenv_gym.hosts.process`) under that interpreter, so the env runs
with its own dependencies while the trainer sees one vector env. Results stream back as each
sub-env finishes, so ``recv`` keeps the first-ready order; sharding, dead-host replacement and
cancellation are :class:`~openenv_gym.vector.hosted.HostedVectorEnv`'s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from gymnasium.vector import AutoresetMode

from openenv_gym import runtime
from openenv_gym.adapters.base import AdapterSpec
from openenv_gym.errors import ConfigurationError
from openenv_gym.hosts.handle import Handle
from openenv_gym.hosts.interpreter import Interpreter
from openenv_gym.hosts.process import ProcessHandle
from openenv_gym.redact import RedactedSpec
from openenv_gym.session import STEP_TIMEOUT
from openenv_gym.vector.hosted import START_TIMEOUT, HostedVectorEnv, default_shards
from openenv_gym.vector.wrapped import check_wrappers

__all__ = ["ProcessVectorEnv", "default_hosts"]

ENVS_PER_HOST = 32
"""Sub-envs per host process by default: a host's client work then stays well below one core."""


def default_hosts(num_envs: int) -> int:
    """One host per :data:`ENVS_PER_HOST` sub-envs, at least one, at most one per core."""
    return max(1, min(os.cpu_count() or 1, -(-num_envs // ENVS_PER_HOST)))


class ProcessVectorEnv(RedactedSpec, HostedVectorEnv):
    """Sub-envs sharded over host processes running ``python``.

    Args:
        num_envs: how many sub-envs.
        adapter: how to build an adapter; each host builds its own under ``python``.
        python: the interpreter of the hosts (a venv's ``bin/python`` with openenv-gym installed), or
            an :class:`~openenv_gym.hosts.interpreter.Interpreter` (``isolate=True``) to resolve.
        num_hosts: host processes (default :func:`default_hosts`). Sub-env ``i`` lives in host
            ``i % num_hosts``.
        envs_per_client: sub-envs per adapter inside a host.
        env_wrappers: Gymnasium wrappers stacked on every sub-env inside its host (they must be
            picklable: classes or ``functools.partial`` of them, not lambdas).
        split, max_turns, autoreset_mode, step_timeout: as for every vector env.
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
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = STEP_TIMEOUT,
        env_wrappers: Sequence[Any] | None = None,
    ):
        if num_envs < 1:
            raise ConfigurationError("num_envs must be at least 1")
        if num_hosts is not None and num_hosts < 1:
            raise ConfigurationError("num_hosts must be at least 1")
        autoreset_mode = AutoresetMode(autoreset_mode)
        self._env_wrappers = check_wrappers(env_wrappers)
        # The hosts already spread the sub-envs over the cores: one server per host's local source.
        accepts = adapter.accepted_here()
        if "server_workers" not in adapter.kwargs and accepts is not None and "server_workers" in accepts:
            adapter = AdapterSpec(adapter.entry, {**adapter.kwargs, "server_workers": 1})
        self._spec_adapter = adapter
        self.python = python.resolve() if isinstance(python, Interpreter) else python
        self._split, self._max_turns = split, max_turns
        self._envs_per_client = envs_per_client
        self._init_hosts(step_timeout)
        self._shards = default_shards(num_envs, num_hosts or default_hosts(num_envs))
        try:
            tools = runtime.run_sync(self._start_hosts(), START_TIMEOUT + 60.0)
        except BaseException:
            try:
                runtime.run_sync(self._aclose_backend(), 120.0)
            except Exception:
                pass
            raise
        super().__init__(num_envs, tools, autoreset_mode=autoreset_mode, step_timeout=step_timeout)
        self._any_action = bool(self._env_wrappers)

    @property
    def pids(self) -> list[int | None]:
        """The host processes' ids, one per shard (a replaced host's changes)."""
        return [h.process.pid for h in self._handles]  # type: ignore[attr-defined]

    def _new_handle(self, shard: int, replaced: bool = False) -> Handle:
        spec = self._spec_adapter
        return ProcessHandle(self.python, {
            "entry": spec.entry, "adapter_kwargs": dict(spec.kwargs), "env_ids": self._shards[shard],
            "split": self._split, "max_turns": self._max_turns, "envs_per_client": self._envs_per_client,
            "step_timeout": self._step_timeout, "replaced": replaced, "env_wrappers": self._env_wrappers or None,
        })

