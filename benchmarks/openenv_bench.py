"""openenv/OpenEnv-v0 against OpenEnv's own client, on the same server and the same actions.

One OpenEnv server (the typed-action grid environment of ``tests/envs/openenv_grid_env``, built
with OpenEnv's ``create_app``) runs under uvicorn on 127.0.0.1; both sides play the same scripted
episodes on it: ``reset``, then RIGHT, RIGHT, DOWN, DOWN (the goal: ``done``).

* **single**: ``gym.make("openenv/OpenEnv-v0", url=...)`` vs OpenEnv's ``GenericEnvClient`` used
  synchronously (0.10.0 clients block when no event loop runs), env-steps/s.
* **vector**: ``gym.make_vec(..., num_envs=64)`` (ConcurrentVectorEnv, SAME_STEP autoreset, first-ready
  ``send``/``recv`` in batches of 16, as a trainer collecting rollouts drives it) vs 64
  ``GenericEnvClient``s used asynchronously and gathered on one event loop, env-steps/s.

The two sides alternate in rounds (the machine is shared and noisy); reported: the median of the
per-round ratios (ours / OpenEnv's) with their min and max, and each side's client CPU per env-step
(this process's CPU time, every thread, over the env-steps; the server's is the same for both: same
messages). CPU per step is the steadier figure on a shared machine: wall time also counts waiting
for a core.

    python benchmarks/openenv_bench.py [--episodes 100] [--vector-episodes 10] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym

import openenv_gym  # noqa: F401

ENVS = Path(__file__).resolve().parent.parent / "tests" / "envs"
MOVES = ["RIGHT", "RIGHT", "DOWN", "DOWN"]
NUM_ENVS = 64


class Meter:
    """Wall time and this process's CPU time (all threads) over a block of env-steps."""

    def __enter__(self) -> Meter:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def result(self, steps: int) -> tuple[float, float]:
        """(env-steps/s, client CPU microseconds per env-step)."""
        return steps / self.wall, self.cpu / steps * 1e6


def _call(move: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "step", "arguments": json.dumps({"move": move})}}]}


def start_server() -> tuple[subprocess.Popen, str]:
    from servers import free_port, wait_healthy

    port = free_port()
    env = dict(os.environ, MAX_CONCURRENT_ENVS=str(4 * NUM_ENVS), ENABLE_WEB_INTERFACE="false")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "openenv_grid_env.server.app:app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning"],
        cwd=str(ENVS), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return wait_healthy(proc, f"http://127.0.0.1:{port}", "OpenEnv")


# -- single env ------------------------------------------------------------------------------------
def gym_single(env: gym.Env, episodes: int) -> tuple[float, float]:
    steps = 0
    with Meter() as meter:
        for _ in range(episodes):
            env.reset()
            for move in MOVES:
                _, _, terminated, _, _ = env.step(_call(move))
                steps += 1
            assert terminated
    return meter.result(steps)


def openenv_single(client, episodes: int) -> tuple[float, float]:
    steps = 0
    with Meter() as meter:
        for _ in range(episodes):
            client.reset()
            for move in MOVES:
                result = client.step({"move": move})
                steps += 1
            assert result.done
    return meter.result(steps)


# -- 64 sub-envs -------------------------------------------------------------------------------------
def gym_vector(envs, episodes: int) -> tuple[float, float]:
    """Each sub-env plays ``episodes`` episodes; first-ready batches, as the OpenEnv side gathers
    64 independent loops (lockstep ``step`` would add a barrier the other side does not have)."""
    envs.reset()
    actions = [_call(m) for m in MOVES]
    turn = [0] * NUM_ENVS
    left = [episodes] * NUM_ENVS
    steps = 0
    with Meter() as meter:
        envs.send([actions[0]] * NUM_ENVS)
        active = NUM_ENVS
        while active:
            batch = envs.recv(min(16, active))
            ids, moves = [], []
            for k, i in enumerate(batch.env_ids.tolist()):
                steps += 1
                turn[i] += 1
                if batch.terminations[k] or batch.truncations[k]:
                    assert batch.terminations[k] and turn[i] == len(MOVES), "every episode reaches the goal"
                    turn[i], left[i] = 0, left[i] - 1
                    if left[i] == 0:
                        active -= 1
                        continue
                ids.append(i), moves.append(actions[turn[i]])
            if ids:
                envs.send(moves, ids)
    return meter.result(steps)


async def openenv_vector(url: str, episodes: int) -> tuple[float, float]:
    from openenv.core.generic_client import GenericEnvClient

    clients = [GenericEnvClient(base_url=url) for _ in range(NUM_ENVS)]
    await asyncio.gather(*(c.connect() for c in clients))

    async def play(client) -> int:
        steps = 0
        for _ in range(episodes):
            await client.reset()
            for move in MOVES:
                result = await client.step({"move": move})
                steps += 1
            assert result.done
        return steps

    try:
        await asyncio.gather(*(c.reset() for c in clients))  # warm: every session exists
        with Meter() as meter:
            steps = sum(await asyncio.gather(*(play(c) for c in clients)))
        return meter.result(steps)
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def summary(name: str, ours: list[tuple[float, float]], theirs: list[tuple[float, float]]) -> dict:
    ratios = [a[0] / b[0] for a, b in zip(ours, theirs)]
    cpu_ratios = [b[1] / a[1] for a, b in zip(ours, theirs)]  # > 1: ours costs less CPU per step
    out = {"case": name, "ours_steps_per_s": statistics.median(r for r, _ in ours),
           "openenv_steps_per_s": statistics.median(r for r, _ in theirs),
           "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
           "ours_cpu_us_per_step": statistics.median(c for _, c in ours),
           "openenv_cpu_us_per_step": statistics.median(c for _, c in theirs),
           "cpu_ratio_median": statistics.median(cpu_ratios), "rounds": len(ratios), "ratios": ratios}
    print(f"{name:<8} openenv_gym {out['ours_steps_per_s']:8.1f} steps/s   OpenEnv client "
          f"{out['openenv_steps_per_s']:8.1f} steps/s   ratio median {out['ratio_median']:.2f} "
          f"(min {out['ratio_min']:.2f}, max {out['ratio_max']:.2f}, {len(ratios)} rounds)", flush=True)
    print(f"{'':<8} client CPU per env-step: openenv_gym {out['ours_cpu_us_per_step']:6.0f} us   OpenEnv client "
          f"{out['openenv_cpu_us_per_step']:6.0f} us   OpenEnv's / ours median {out['cpu_ratio_median']:.2f}",
          flush=True)
    return out


def run(rounds: int, episodes: int, vector_episodes: int) -> list[dict]:
    """Both cases, ``rounds`` alternating rounds each; returns one summary per case."""
    from openenv.core.generic_client import GenericEnvClient

    proc, url = start_server()
    results = []
    try:
        env = gym.make("openenv/OpenEnv-v0", url=url)
        client = GenericEnvClient(base_url=url)
        gym_single(env, 5), openenv_single(client, 5)  # warm-up
        ours, theirs = [], []
        for r in range(rounds):
            if r % 2 == 0:
                ours.append(gym_single(env, episodes)), theirs.append(openenv_single(client, episodes))
            else:
                theirs.append(openenv_single(client, episodes)), ours.append(gym_single(env, episodes))
        client.close()
        env.close()
        results.append(summary("single", ours, theirs))

        envs = gym.make_vec("openenv/OpenEnv-v0", num_envs=NUM_ENVS, url=url, autoreset_mode="SameStep")
        gym_vector(envs, 1)
        ours, theirs = [], []
        for r in range(rounds):
            if r % 2 == 0:
                ours.append(gym_vector(envs, vector_episodes))
                theirs.append(asyncio.run(openenv_vector(url, vector_episodes)))
            else:
                theirs.append(asyncio.run(openenv_vector(url, vector_episodes)))
                ours.append(gym_vector(envs, vector_episodes))
        envs.close()
        results.append(summary(f"vec{NUM_ENVS}", ours, theirs))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100, help="episodes per round, single env")
    parser.add_argument("--vector-episodes", type=int, default=10, help="episodes per sub-env per round")
    parser.add_argument("--reps", "--rounds", dest="rounds", type=int, default=5, help="rounds")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = run(args.rounds, args.episodes, args.vector_episodes)
    from figures import figure, write

    write(args.json, [figure(f"OpenEnv {r['case']}: openenv_gym vs OpenEnv's client", r["ratios"], target=1.0)
                      for r in results], results)


if __name__ == "__main__":
    main()
