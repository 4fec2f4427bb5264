"""Groups of sub-envs that play the same tasks: what GRPO, RLOO and pass@k need from a vector env.

With ``group_size=k`` the ``num_envs`` sub-envs form ``num_envs / k`` groups of consecutive ids
(group ``g`` is sub-envs ``g*k .. g*k+k-1``). The ``e``-th episode of every member of a group runs
the same task: each group has its own seeded stream of task seeds, and a member's ``e``-th episode
is reset with the ``e``-th seed of its group's stream (the seed picks the task as
``env.reset(seed=...)`` does). Members never wait for each other: a fast member simply draws
further ahead in its group's stream, which is kept until every member has used it.

An episode slot is used only when its episode starts: a reset that fails is retried on the same
slot, so "episode ``e``" means the same task for every member across autoresets, failures and
recreated sub-envs. ``reset(seed=s)`` restarts every stream from ``s``: the whole assignment is
reproducible.
"""

from __future__ import annotations

import numpy as np

from openenv_gym.errors import ConfigurationError

__all__ = ["Groups", "check_group_size"]


def check_group_size(num_envs: int, group_size: int | None) -> None:
    """Raise :class:`ConfigurationError` unless ``group_size`` divides ``num_envs``."""
    if group_size is None:
        return
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ConfigurationError(f"group_size must be a positive integer, not {group_size!r}")
    if num_envs % int(group_size):
        raise ConfigurationError(f"num_envs={num_envs} is not divisible by group_size={group_size}")


class Groups:
    """The task seeds of each group's episodes, and which episode slot each sub-env is on."""

    def __init__(self, num_envs: int, group_size: int):
        check_group_size(num_envs, group_size)
        self.size = int(group_size)
        self.num_groups = num_envs // self.size
        self.started = [0] * num_envs
        """Episode slots each sub-env has started (its next episode takes slot ``started[i]``)."""
        self.current = [-1] * num_envs
        """The slot of the episode each sub-env is playing (``-1``: none yet)."""
        self._streams: list[np.random.Generator] = []
        self._seeds: list[list[int]] = []
        self._first: list[int] = []  # the slot of each group's oldest kept seed
        self.reseed(None)

    def group(self, env_id: int) -> int:
        return env_id // self.size

    def reseed(self, seed: int | None) -> None:
        """Restart every group's stream (from ``seed``, or fresh entropy) and every slot count."""
        root = np.random.SeedSequence(seed)
        self._streams = [np.random.default_rng(s) for s in root.spawn(self.num_groups)]
        self._seeds = [[] for _ in range(self.num_groups)]
        self._first = [0] * self.num_groups
        self.started = [0] * len(self.started)
        self.current = [-1] * len(self.current)

    def next_seed(self, env_id: int) -> tuple[int, int]:
        """``(slot, seed)`` of the sub-env's next episode (not yet counted as started)."""
        g = self.group(env_id)
        slot, seeds = self.started[env_id], self._seeds[g]
        while self._first[g] + len(seeds) <= slot:
            seeds.append(int(self._streams[g].integers(2**31 - 1)))
        return slot, seeds[slot - self._first[g]]

    def begun(self, env_id: int, slot: int) -> None:
        """The episode of ``slot`` started on ``env_id``."""
        self.current[env_id] = slot
        self.started[env_id] = max(self.started[env_id], slot + 1)
        g = self.group(env_id)
        oldest = min(self.started[g * self.size:(g + 1) * self.size])
        if oldest > self._first[g]:  # every member is past these slots: forget their seeds
            del self._seeds[g][:oldest - self._first[g]]
            self._first[g] = oldest
