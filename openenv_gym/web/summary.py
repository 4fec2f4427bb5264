"""The figures at the top of the viewer: episodes, rewards, groups (mean@k, pass@k), per env.

Computed once per load from the list columns of :class:`~openenv_gym.web.rollouts.Rollouts`,
so the page and the tests read the same numbers. mean@k and pass@k follow
:mod:`openenv_gym.rollout`: the mean of the groups' mean rewards, and the share of groups with at
least one reward above 0, over the groups a file holds (a rollout run with ``drop_equal`` wrote
only the groups with signal, so its file's figures differ from the run's summary).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np

from openenv_gym.web.rollouts import Rollouts

__all__ = ["summarize", "histogram", "group_keys"]

HISTOGRAM_BINS = 20
DISTINCT_BARS = 12
"""Up to this many distinct rewards get one bar each (0/1 rewards: two bars, not twenty)."""


def histogram(rewards: np.ndarray) -> dict[str, Any]:
    """Bars of the reward distribution: ``labels`` and ``counts`` (empty for no episodes)."""
    if rewards.size == 0:
        return {"labels": [], "counts": []}
    values, counts = np.unique(rewards, return_counts=True)
    if values.size <= DISTINCT_BARS:
        return {"labels": [_num(v) for v in values], "counts": counts.tolist()}
    counts, edges = np.histogram(rewards, bins=HISTOGRAM_BINS)
    return {"labels": [f"{_num(a)} to {_num(b)}" for a, b in zip(edges[:-1], edges[1:])], "counts": counts.tolist()}


def _num(x: float) -> str:
    return f"{float(x):.4g}"


def group_keys(rollouts: Rollouts) -> list[tuple[int, int, int] | None]:
    """Each episode's group: ``(file, group, group_episode)``, the episodes that played one task
    together (``None`` outside grouped collection). The file is part of the key because group
    numbers restart in every rollout."""
    c = rollouts.columns
    return [None if g is None or e is None else (f, g, e)
            for f, g, e in zip(c["file"], c["group"], c["group_episode"])]


def summarize(rollouts: Rollouts) -> dict[str, Any]:
    """Episodes, mean reward, share of rewards above 0, ends, errors; groups (``k``, mean@k,
    pass@k) where there are groups; the reward histogram; one row per env."""
    c = rollouts.columns
    rewards = np.asarray(c["reward"], dtype=np.float64)
    turns = np.asarray(c["turns"], dtype=np.int64)
    errors = np.asarray(c["errors"], dtype=np.int64)
    terminated = np.asarray(c["terminated"], dtype=bool)
    truncated = np.asarray(c["truncated"], dtype=bool)
    out: dict[str, Any] = {
        "episodes": int(rewards.size),
        "mean_reward": float(rewards.mean()) if rewards.size else None,
        "success": float((rewards > 0).mean()) if rewards.size else None,
        "terminated": int(terminated.sum()),
        "truncated": int(truncated.sum()),
        "with_errors": int((errors > 0).sum()),
        "histogram": histogram(rewards),
        "groups": _groups(rollouts, rewards),
        "envs": [],
    }
    codes = np.asarray(c["env"], dtype=np.int64)
    for code, name in enumerate(rollouts.envs):
        mask = codes == code
        out["envs"].append({
            "env": name, "episodes": int(mask.sum()), "mean_reward": float(rewards[mask].mean()),
            "success": float((rewards[mask] > 0).mean()), "mean_turns": float(turns[mask].mean()),
            "with_errors": int((errors[mask] > 0).sum()), "terminated": int(terminated[mask].sum()),
            "truncated": int(truncated[mask].sum()),
        })
    return out


def _groups(rollouts: Rollouts, rewards: np.ndarray) -> dict[str, Any] | None:
    members: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for key, reward in zip(group_keys(rollouts), rewards.tolist()):
        if key is not None:
            members[key].append(reward)
    if not members:
        return None
    sizes = Counter(len(m) for m in members.values())
    return {
        "count": len(members),
        "k": sizes.most_common(1)[0][0],
        "sizes": sorted(sizes),
        "mean_at_k": float(np.mean([np.mean(m) for m in members.values()])),
        "pass_at_k": float(np.mean([any(r > 0 for r in m) for m in members.values()])),
    }
