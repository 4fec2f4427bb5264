"""Collecting episodes: a policy drives a vector env, first-ready batches, until N episodes are done.

LLM envs are uneven (one step 5 ms, the next 5 s), so the loop never waits for the slowest
sub-env: it sends actions, takes the first ``batch_size`` sub-envs to answer (``recv``), asks
the policy for their next actions in one batch, and sends again. The vector env runs in
SAME_STEP autoreset mode, so a finished sub-env's next episode starts in the same round trip
(send/recv and the autoreset modes: docs/architecture.md, "Vector envs").

Each finished episode can be written as one JSON line (task, messages, actions, rewards); the
summary reports episodes, mean reward, env-steps per second and step-latency percentiles.
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
from openenv_gym.vector.base import AgentVectorEnv, info_at

__all__ = ["RolloutSummary", "collect", "run"]


class RolloutSummary(msgspec.Struct):
    """What a rollout measured."""

    env_id: str
    episodes: int
    num_envs: int
    backend: str
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
            ("env", self.env_id), ("backend", f"{self.backend} x {self.num_envs} sub-envs"),
            ("episodes", self.episodes), ("env-steps", self.steps),
            ("mean reward", f"{self.mean_reward:.4f}"), ("reward > 0", f"{self.success_rate:.1%}"),
            ("steps/sec", f"{self.steps_per_sec:.1f}"), ("p50 step", f"{self.p50_step_ms:.2f} ms"),
            ("p99 step", f"{self.p99_step_ms:.2f} ms"), ("errors", self.errors),
            ("wall time", f"{self.seconds:.2f} s"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run(
    envs: AgentVectorEnv,
    policy: Policy,
    episodes: int,
    *,
    seed: int | None = 0,
    batch_size: int | None = None,
    on_episode: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = False,
    desc: str = "",
) -> tuple[list[float], list[float], int]:
    """Drive ``envs`` (SAME_STEP autoreset) with ``policy`` until ``episodes`` episodes end.

    Returns the episode returns, the per-step latencies (seconds, send to result) and the
    number of steps that reported ``info["error"]``.
    """
    n = envs.num_envs
    batch_size = batch_size or max(1, n // 4)
    obs, infos = envs.reset(seed=seed)
    records: dict[int, dict[str, Any]] = {}

    def begin(i: int, first: list[Any], info: dict[str, Any]) -> None:
        policy.reset(i, first, info)
        records[i] = {"task_id": info.get("task_id"), "split": info.get("split"), "index": info.get("index"),
                      "messages": list(first), "rewards": [], "errors": []}

    for i in range(n):
        begin(i, obs[i], info_at(infos, i))
    started, returns, latencies, errors = n, [], [], 0
    sent_at: dict[int, float] = {}

    def send(ids: list[int], observations: list[Any], step_infos: list[dict[str, Any]]) -> None:
        actions = policy.act_batch(ids, observations, step_infos)
        for i, action in zip(ids, actions):
            records[i]["messages"].append(action if isinstance(action, dict) else {"role": "assistant", "content": action})
        envs.send(actions, ids)
        now = time.perf_counter()
        for i in ids:
            sent_at[i] = now

    active = list(range(min(n, episodes)))
    send(active, [obs[i] for i in active], [info_at(infos, i) for i in active])
    bar = tqdm(total=episodes, disable=not progress, unit="ep", desc=desc, mininterval=0.5)
    try:
        while len(returns) < episodes:
            batch = envs.recv(batch_size)
            now = time.perf_counter()
            again, again_obs, again_infos = [], [], []
            for k, i in enumerate(batch.env_ids.tolist()):
                latencies.append(now - sent_at.pop(i))
                info = info_at(batch.infos, k)
                record = records[i]
                record["rewards"].append(float(batch.rewards[k]))
                if "error" in info:
                    errors += 1
                    record["errors"].append(info["error"])
                done = bool(batch.terminations[k] or batch.truncations[k])
                record["messages"].extend(info.get("final_obs", []) if done else batch.obs[k])
                if not done:
                    again.append(i), again_obs.append(batch.obs[k]), again_infos.append(info)
                    continue
                record.update(total_reward=sum(record["rewards"]), terminated=bool(batch.terminations[k]),
                              truncated=bool(batch.truncations[k]))
                returns.append(record["total_reward"])
                bar.update(1)
                if on_episode is not None:
                    on_episode(record)
                if started < episodes:  # SAME_STEP: batch.obs[k] is already the next episode's start
                    started += 1
                    begin(i, batch.obs[k], info)
                    again.append(i), again_obs.append(batch.obs[k]), again_infos.append(info)
            if len(returns) % 16 == 0 and returns:
                bar.set_postfix(mean_reward=f"{np.mean(returns):.3f}", refresh=False)
            if again:
                send(again, again_obs, again_infos)
    finally:
        bar.close()
    return returns[:episodes], latencies, errors


def collect(
    env_id: str,
    episodes: int,
    *,
    num_envs: int = 8,
    backend: str = "concurrent",
    policy: str | Policy = "random",
    seed: int = 0,
    batch_size: int | None = None,
    out: str | Path | None = None,
    progress: bool = True,
    make_kwargs: dict[str, Any] | None = None,
    vector_options: dict[str, Any] | None = None,
) -> RolloutSummary:
    """Collect ``episodes`` episodes of ``env_id`` over ``num_envs`` sub-envs and summarise them.

    Args:
        env_id: a registered id.
        episodes: how many episodes to finish.
        num_envs: sub-envs run at once (capped at ``episodes``).
        backend: ``"concurrent"`` or ``"ray"``.
        policy: ``"random"`` or a :class:`~openenv_gym.policies.Policy` (e.g. ``OpenAIPolicy``).
        seed: seeds the sub-envs' task choice and the random policy: a rollout is reproducible.
        batch_size: sub-envs per first-ready batch (default: a quarter of them).
        out: a JSONL file receiving one finished episode per line.
        progress: show a progress bar.
        make_kwargs: extra kwargs for ``gym.make_vec`` (e.g. ``split``, ``max_turns``).
        vector_options: backend options (``envs_per_client``, ``num_actors``, ``address``...).
    """
    num_envs = max(1, min(num_envs, episodes))
    envs = gym.make_vec(env_id, num_envs=num_envs, backend=backend, autoreset_mode="SameStep",
                        vector_options=vector_options, **(make_kwargs or {}))
    agent: Policy = RandomPolicy(seed=seed) if policy == "random" else policy  # type: ignore[assignment]
    encoder = msgspec.json.Encoder()
    sink = open(out, "wb") if out is not None else None

    def write(record: dict[str, Any]) -> None:
        if sink is not None:
            sink.write(encoder.encode(record) + b"\n")

    start = time.perf_counter()
    try:
        returns, latencies, errors = run(envs, agent, episodes, seed=seed, batch_size=batch_size,
                                         on_episode=write, progress=progress, desc=env_id)
    finally:
        envs.close()
        if sink is not None:
            sink.close()
        if agent is not policy:
            agent.close()
    seconds = time.perf_counter() - start
    lat_ms = np.array(latencies) * 1000 if latencies else np.zeros(1)
    return RolloutSummary(
        env_id=env_id, episodes=len(returns), num_envs=num_envs, backend=backend, steps=len(latencies),
        mean_reward=float(np.mean(returns)) if returns else 0.0,
        success_rate=float(np.mean([r > 0 for r in returns])) if returns else 0.0,
        seconds=seconds, steps_per_sec=len(latencies) / seconds if seconds else 0.0,
        p50_step_ms=float(np.percentile(lat_ms, 50)), p99_step_ms=float(np.percentile(lat_ms, 99)),
        errors=errors,
    )
