"""Groups of sub-envs that play the same tasks: what GRPO, RLOO and pass@k need from a vector env.

With ``group_size=k`` the ``num_envs`` sub-envs form ``num_envs / k`` groups of consecutive ids
(group ``g`` is sub-envs ``g*k .. g*k+k-1``). The ``e``-th episode of every member of a group runs
the same task: a member's ``e``-th episode is reset with the seed ``root + g + e * num_groups``
(the seed picks the task as ``env.reset(seed=...)`` does: a draw from a generator seeded with it,
or, in a split that never ends, the task of that index), distinct for every group and episode.
Members never wait for each other: a fast member simply goes further ahead.

An episode slot is used only when its episode starts: a reset that fails is retried on the same
slot, so "episode ``e``" means the same task for every member across autoresets, failures and
recreated sub-envs. ``reset(seed=s)`` makes ``s`` the root: the whole assignment is reproducible.
"""

from __future__ import annotations

import numpy as np

from openenv_gym.errors import ConfigurationError
from openenv_gym.wire import UNBOUNDED_TASKS as SEEDS

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
        self._root = 0
        self.reseed(None)

    def group(self, env_id: int) -> int:
        return env_id // self.size

    def reseed(self, seed: int | None) -> None:
        """Restart every group's seeds (from ``seed``, or fresh entropy) and every slot count."""
        self._root = int(seed) if seed is not None else int(np.random.default_rng().integers(SEEDS))
        self.started = [0] * len(self.started)
        self.current = [-1] * len(self.current)

    def seed_of(self, group: int, slot: int) -> int:
        """The task seed of episode ``slot`` of ``group``: ``root + group + slot * num_groups``.

        Distinct for every (group, slot), so a split of ``n`` tasks is drawn from independently
        seeded streams, and a split that never ends (where a seed is the task's index) is walked
        with no task played by two groups.
        """
        return (self._root + group + slot * self.num_groups) % SEEDS

    def next_seed(self, env_id: int) -> tuple[int, int]:
        """``(slot, seed)`` of the sub-env's next episode (not yet counted as started)."""
        slot = self.started[env_id]
        return slot, self.seed_of(self.group(env_id), slot)

    def begun(self, env_id: int, slot: int) -> None:
        """The episode of ``slot`` started on ``env_id``."""
        self.current[env_id] = slot
        self.started[env_id] = max(self.started[env_id], slot + 1)
