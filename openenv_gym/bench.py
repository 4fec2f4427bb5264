"""``openenv-gym bench``: env-steps/sec over a grid of sub-env counts and vector backends.

Every configuration plays the same thing, lockstep ``step()`` with random actions (tool calls
with schema-valid arguments) from the same seed, so the backends are comparable within one run:
openenv_gym's ``concurrent`` and ``ray`` vector envs against Gymnasium's own ``sync`` and
``async`` (``shared_memory=False``) vectorizers. This machine is shared and noisy: read the
numbers as ratios between rows of one run, not as absolute speeds. Memory is the PSS of every
process the configuration uses (this one, its children, and Ray's workers).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import msgspec

from openenv_gym.errors import ConfigurationError
from openenv_gym.policies import RandomPolicy
from openenv_gym.processes import descendants
from openenv_gym.vector.base import check_num_envs, info_at

__all__ = ["BenchRow", "bench", "BACKENDS", "table", "plot", "require_plotting"]

BACKENDS = ("concurrent", "ray", "sync", "async")


class BenchRow(msgspec.Struct):
    """One configuration's figures."""

    backend: str
    num_envs: int
    steps: int
    seconds: float
    steps_per_sec: float
    pss_mib: float
    error: str | None = None
    skipped: str | None = None
    """Why the configuration was not measured (its backend's extra is not installed)."""


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _ray_workers() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if b"ray::Shard" in fh.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def process_tree_pss_mib(include_ray: bool = False) -> float:
    """PSS (MiB) of this process, its descendants and, if asked, Ray's shard workers."""
    pids = {os.getpid(), *descendants(os.getpid())}
    if include_ray:
        for pid in _ray_workers():
            pids.update({pid, *descendants(pid)})
    return sum(_pss_kib(p) for p in pids) / 1024


def _make(env_id: str, backend: str, num_envs: int, kwargs: dict[str, Any]) -> Any:
    if backend in ("concurrent", "ray"):
        return gym.make_vec(env_id, num_envs=num_envs, backend=backend, **kwargs)
    vector_kwargs = {"shared_memory": False} if backend == "async" else {}
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=backend, vector_kwargs=vector_kwargs, **kwargs)


def _measure(env_id: str, backend: str, num_envs: int, rounds: int, seed: int, kwargs: dict[str, Any]) -> BenchRow:
    envs = _make(env_id, backend, num_envs, kwargs)
    policy = None
    try:
        policy = RandomPolicy(seed=seed)
        obs, infos = envs.reset(seed=seed)
        ids = list(range(num_envs))
        for i in ids:
            policy.reset(i, obs[i], info_at(infos, i))
        start = time.perf_counter()
        for _ in range(rounds):
            actions = policy.act_batch(ids, list(obs), [info_at(infos, i) for i in ids])
            obs, _, terminated, truncated, infos = envs.step(actions)
            for i in ids:
                if "tools" in infos and infos.get("_tools", [False] * num_envs)[i]:
                    policy.reset(i, obs[i], info_at(infos, i))
        seconds = time.perf_counter() - start
        pss = process_tree_pss_mib(include_ray=backend == "ray")
    finally:
        envs.close()
        if policy is not None:
            policy.close()
        gc.collect()
    steps = rounds * num_envs
    return BenchRow(backend, num_envs, steps, seconds, steps / seconds, pss)


def bench(
    env_id: str,
    num_envs: Sequence[int] = (1, 8, 64),
    backends: Sequence[str] = ("concurrent", "sync", "async"),
    *,
    rounds: int = 20,
    seed: int = 0,
    make_kwargs: dict[str, Any] | None = None,
) -> list[BenchRow]:
    """Measure every (backend, num_envs) pair; a failing configuration is reported, not fatal.

    Sizes are checked first, as ``gym.make_vec`` checks ``num_envs``; a Ray row without Ray
    installed is skipped with the reason, not measured as a failure.
    """
    for n in num_envs:
        check_num_envs(n)
    rows = []
    for n in num_envs:
        for backend in backends:
            if backend == "ray" and importlib.util.find_spec("ray") is None:
                rows.append(BenchRow(backend, n, 0, 0.0, 0.0, 0.0, skipped="ray is not installed: pip install -e '.[ray]'"))
                continue
            try:
                rows.append(_measure(env_id, backend, n, rounds, seed, dict(make_kwargs or {})))
            except Exception as exc:  # e.g. ray not installed: report and go on with the rest
                rows.append(BenchRow(backend, n, 0, 0.0, 0.0, 0.0, error=f"{type(exc).__name__}: {exc}"))
    return rows


def table(rows: list[BenchRow]) -> str:
    """The rows as a text table, with each row's speed relative to ``sync`` at the same size."""
    sync = {r.num_envs: r.steps_per_sec for r in rows if r.backend == "sync" and not r.error}
    lines = [f"{'backend':<11} {'num_envs':>8} {'steps/sec':>10} {'x sync':>7} {'PSS MiB':>8}"]
    for r in rows:
        if r.error or r.skipped:
            lines.append(f"{r.backend:<11} {r.num_envs:>8}  " + (f"failed: {r.error}" if r.error else f"skipped: {r.skipped}"))
            continue
        ratio = f"{r.steps_per_sec / sync[r.num_envs]:.2f}" if sync.get(r.num_envs) else "-"
        lines.append(f"{r.backend:<11} {r.num_envs:>8} {r.steps_per_sec:>10.1f} {ratio:>7} {r.pss_mib:>8.0f}")
    return "\n".join(lines)


def require_plotting() -> None:
    """Raise :class:`ConfigurationError` saying what to install if :func:`plot` cannot run.

    Called before a benchmark starts, so a missing extra costs no run.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigurationError("plotting needs matplotlib, which the bench extra brings: pip install -e '.[bench]' "
                                 "(from a checkout; pip install 'openenv-gym[bench]' from an index)") from None


def plot(rows: list[BenchRow], path: str | Path, title: str = "") -> None:
    """Write a PNG: env-steps/sec against num_envs, one line per backend (needs matplotlib)."""
    require_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for backend in dict.fromkeys(r.backend for r in rows):
        points = sorted((r.num_envs, r.steps_per_sec) for r in rows if r.backend == backend and not (r.error or r.skipped))
        if points:
            ax.plot(*zip(*points), marker="o", label=backend)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sub-envs")
    ax.set_ylabel("env-steps / sec")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
