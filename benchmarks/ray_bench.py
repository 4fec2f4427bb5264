"""Ray section of ``benchmarks/vector.py`` (kept apart because it needs ``ray``).

At 64 sub-envs on one shared Arithmetic ORS server (so only the vectorization differs):

* env-steps/sec of RayVectorEnv (``num_actors`` async actors, many sub-envs each) against
  Gymnasium's AsyncVectorEnv (64 worker processes, ``shared_memory=False``); target >= 1.0;
* memory as PSS: everything each side runs (driver, workers, and for Ray its head processes
  too), measured while both are up; target: Ray <= 1/4 of AsyncVectorEnv;
* the p50 latency one RayVectorEnv step adds over a raw Ray actor call doing the same session
  step (one sub-env); target <= 0.5 ms.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

CALC = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\": \"6 * 7\"}"}}]}


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def _ray_pids(exclude: set[int]) -> list[int]:
    """Processes of the local Ray cluster (head services, agents, workers), minus ``exclude``.

    Matched by Ray's own process titles and entry points: a plain ``b"/ray/"`` test would also
    catch forkserver workers, whose command line carries ``sys.path`` (which Ray extends).
    """
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmd = fh.read()
            except OSError:
                continue
            pid = int(entry)
            if pid == os.getpid() or pid in exclude:
                continue
            if cmd.startswith(b"ray::") or any(m in cmd for m in (b"ray/core/src/ray/", b"ray/dashboard/",
                                                                     b"ray/autoscaler/", b"ray/_private/")):
                pids.append(pid)
    return pids


def _lockstep(envs: Any, rounds: int) -> float:
    n = envs.num_envs
    envs.reset(seed=0)
    envs.step([CALC] * n)  # warm-up
    start = time.perf_counter()
    for _ in range(rounds):
        envs.step([CALC] * n)
    return rounds * n / (time.perf_counter() - start)


def bench_ray(reps: int, seconds: float, num_envs: int = 64, num_actors: int | None = None) -> dict[str, Any]:
    import gymnasium as gym
    import ray

    import openenv_gym  # noqa: F401
    from openenv_gym.bench import _children

    server = gym.make("openenv/Arithmetic-v0")
    url = server.unwrapped.adapter._server.url
    kwargs = {"url": url, "env_name": "arithmetic", "max_turns": 8}
    rounds = max(5, int(seconds * 10))
    try:
        ray_envs = gym.make_vec("openenv/ORS-v0", num_envs=num_envs, backend="ray",
                                vector_options={"num_actors": num_actors}, **kwargs)
        n_actors = ray_envs.unwrapped.num_actors
        async_envs = gym.make_vec("openenv/ORS-v0", num_envs=num_envs, vectorization_mode="async",
                                  vector_kwargs={"shared_memory": False}, **kwargs)
        # fork shares the parent's pages (cheap PSS, but unsafe with threads in the parent, which
        # openenv_gym and Ray both have); forkserver is the safe choice and Python 3.14's default.
        safe_envs = gym.make_vec("openenv/ORS-v0", num_envs=num_envs, vectorization_mode="async",
                                 vector_kwargs={"shared_memory": False, "context": "forkserver"}, **kwargs)
        try:
            ray_rate, async_rate, safe_rate = [], [], []
            for r in range(reps):
                ray_rate.append(_lockstep(ray_envs, rounds))
                async_rate.append(_lockstep(async_envs, rounds))
                safe_rate.append(_lockstep(safe_envs, rounds))
                print(f"  ray rep {r}: RayVectorEnv {ray_rate[-1]:8.1f}   AsyncVectorEnv fork {async_rate[-1]:8.1f}   "
                      f"forkserver {safe_rate[-1]:8.1f} env-steps/s")

            def tree_pss(pids: set[int]) -> float:
                pids = pids | {c for p in list(pids) for c in _children(p)}
                return sum(_pss_kib(p) for p in pids) / 1024

            async_pids = {p.pid for p in async_envs.processes}
            safe_pids = {p.pid for p in safe_envs.processes}
            async_pss = tree_pss(async_pids)
            safe_pss = tree_pss(safe_pids)
            all_ray = set(_ray_pids(async_pids | safe_pids))
            ray_pss = tree_pss(all_ray)
            actor_pss = tree_pss({p for p in all_ray if b"ray::EnvHost" in open(f"/proc/{p}/cmdline", "rb").read()})
        finally:
            safe_envs.close()
            async_envs.close()
            ray_envs.close()

        # latency: one sub-env, RayVectorEnv step against a raw actor call doing the same step
        one = gym.make_vec("openenv/ORS-v0", num_envs=1, backend="ray", vector_options={"num_actors": 1}, **kwargs)
        try:
            from openenv_gym.vector.ray import _acquire_ray, _release_ray

            owned = _acquire_ray(None)

            @ray.remote(num_cpus=0)
            class Raw:
                async def start(self) -> None:
                    from openenv_gym.adapters.ors import ORSAdapter
                    from openenv_gym.session import EnvSession

                    self.adapter = ORSAdapter(url=url, env_name="arithmetic")
                    await self.adapter.start()
                    self.session = EnvSession(self.adapter, max_turns=10**9)
                    await self.session.reset(0)

                async def step(self, action: dict) -> tuple:
                    return await self.session.step(action)

            raw = Raw.remote()
            ray.get(raw.start.remote())
            one.reset(seed=0)
            ours, base = [], []
            for _ in range(50):  # warm-up
                one.step([CALC])
                ray.get(raw.step.remote(CALC))
            one.set_attr("max_turns", 10**9)
            one.reset(seed=0)
            for _ in range(400):
                t0 = time.perf_counter()
                one.step([CALC])
                ours.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                ray.get(raw.step.remote(CALC))
                base.append(time.perf_counter() - t0)
            ray.kill(raw)
        finally:
            one.close()
            if owned:
                _release_ray()
    finally:
        server.close()
    result = {
        "ray_steps_per_sec": statistics.median(ray_rate), "async_steps_per_sec": statistics.median(async_rate),
        "forkserver_steps_per_sec": statistics.median(safe_rate),
        "speed_ratio": statistics.median(a / b for a, b in zip(ray_rate, async_rate)),
        "speed_ratio_forkserver": statistics.median(a / b for a, b in zip(ray_rate, safe_rate)),
        "ray_pss_mib": ray_pss, "ray_actor_pss_mib": actor_pss, "async_pss_mib": async_pss,
        "forkserver_pss_mib": safe_pss, "memory_ratio": ray_pss / async_pss,
        "memory_ratio_actors_only": actor_pss / async_pss, "num_actors": n_actors,
        "memory_ratio_forkserver": ray_pss / safe_pss,
        "p50_ms_vector_step": statistics.median(ours) * 1000, "p50_ms_raw_actor_call": statistics.median(base) * 1000,
    }
    result["added_p50_ms"] = result["p50_ms_vector_step"] - result["p50_ms_raw_actor_call"]
    print(f"ray: {result['speed_ratio']:.2f}x AsyncVectorEnv (fork) and {result['speed_ratio_forkserver']:.2f}x "
          f"(forkserver) env-steps/s (target >= 1.0)")
    print(f"ray ({n_actors} actors): PSS {ray_pss:.0f} MiB (actors {actor_pss:.0f}, the rest Ray's head) vs "
          f"AsyncVectorEnv fork {async_pss:.0f} MiB = {result['memory_ratio']:.2f} (actors alone "
          f"{result['memory_ratio_actors_only']:.2f}), forkserver {safe_pss:.0f} MiB = "
          f"{result['memory_ratio_forkserver']:.2f} (target <= 0.25)")
    print(f"ray: added p50 latency {result['added_p50_ms']:.2f} ms over a raw actor call (target <= 0.5)")
    return result
