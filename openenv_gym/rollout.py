"""Collecting episodes: a policy drives an env until N episodes are done.

Writes each episode as one JSON line (messages, actions, rewards, task) when asked, and returns a
summary with episodes, mean reward, env-steps per second and step-latency percentiles.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import msgspec
import numpy as np
from tqdm import tqdm

from openenv_gym.policies import Policy, RandomPolicy

__all__ = ["RolloutSummary", "collect"]


class RolloutSummary(msgspec.Struct):
    """What a rollout measured."""

    env_id: str
    episodes: int
    steps: int
    mean_reward: float
    success_rate: float
    seconds: float
    steps_per_sec: float
    p50_step_ms: float
    p99_step_ms: float
    errors: int

    def table(self) -> str:
        rows = [
            ("env", self.env_id), ("episodes", self.episodes), ("env-steps", self.steps),
            ("mean reward", f"{self.mean_reward:.4f}"), ("reward > 0", f"{self.success_rate:.1%}"),
            ("steps/sec", f"{self.steps_per_sec:.1f}"), ("p50 step", f"{self.p50_step_ms:.2f} ms"),
            ("p99 step", f"{self.p99_step_ms:.2f} ms"), ("errors", self.errors),
            ("wall time", f"{self.seconds:.2f} s"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def collect(
    env_id: str,
    episodes: int,
    *,
    policy: str | Callable[[gym.Env], Policy] = "random",
    seed: int = 0,
    out: str | Path | None = None,
    progress: bool = True,
    make_kwargs: dict[str, Any] | None = None,
) -> RolloutSummary:
    """Run ``episodes`` episodes of ``env_id`` with ``policy`` and summarise them.

    Args:
        env_id: a registered id.
        episodes: how many episodes to finish.
        policy: ``"random"`` or a factory taking the env and returning a :class:`Policy`.
        seed: seeds the first reset (later resets continue the env's ``np_random`` stream) and
            the policy, so a rollout is reproducible.
        out: a JSONL file to write one episode per line to.
        progress: show a progress bar.
        make_kwargs: extra kwargs for ``gym.make``.
    """
    env = gym.make(env_id, **(make_kwargs or {}))
    if policy == "random":
        agent: Policy = RandomPolicy(env.unwrapped.action_space, seed=seed)
    elif callable(policy):
        agent = policy(env)
    else:
        raise ValueError(f"unknown policy {policy!r}")
    encoder = msgspec.json.Encoder()
    sink = open(out, "wb") if out is not None else None
    latencies: list[float] = []
    returns: list[float] = []
    errors = 0
    start = time.perf_counter()
    try:
        bar = tqdm(total=episodes, disable=not progress, unit="ep", desc=env_id, mininterval=0.5)
        for n in range(episodes):
            obs, info = env.reset(seed=seed if n == 0 else None)
            agent.reset(obs, info)
            record: dict[str, Any] = {"task_id": info.get("task_id"), "split": info.get("split"),
                                      "index": info.get("index"), "messages": list(obs), "rewards": []}
            total, done = 0.0, False
            while not done:
                action = agent.act(obs, info)
                t0 = time.perf_counter()
                obs, reward, terminated, truncated, info = env.step(action)
                latencies.append(time.perf_counter() - t0)
                errors += "error" in info
                total += float(reward)
                done = terminated or truncated
                record["messages"].append(action if isinstance(action, dict) else {"role": "assistant", "content": action})
                record["messages"].extend(obs)
                record["rewards"].append(float(reward))
            record.update(total_reward=total, terminated=bool(terminated), truncated=bool(truncated))
            returns.append(total)
            if sink is not None:
                sink.write(encoder.encode(record) + b"\n")
            bar.update(1)
            bar.set_postfix(mean_reward=f"{np.mean(returns):.3f}")
        bar.close()
    finally:
        env.close()
        if sink is not None:
            sink.close()
    seconds = time.perf_counter() - start
    lat_ms = np.array(latencies) * 1000 if latencies else np.zeros(1)
    return RolloutSummary(
        env_id=env_id, episodes=episodes, steps=len(latencies),
        mean_reward=float(np.mean(returns)) if returns else 0.0,
        success_rate=float(np.mean([r > 0 for r in returns])) if returns else 0.0,
        seconds=seconds, steps_per_sec=len(latencies) / seconds if seconds else 0.0,
        p50_step_ms=float(np.percentile(lat_ms, 50)), p99_step_ms=float(np.percentile(lat_ms, 99)),
        errors=errors,
    )
