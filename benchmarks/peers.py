"""openenv_gym against each wrapped system's own client, on the same server and the same actions.

One table, every row a ratio of env-steps/s (ours / theirs, > 1: we are faster) with its median
and min-max over rounds in which the sides alternate (the machine is shared and noisy):

* **ORS**: the bundled Arithmetic environment served by ``ors-sdk`` on 127.0.0.1 (TCP: the SDK
  clients cannot use a Unix socket). Each episode: a session on ``("train", i)``, the prompt, the
  tool list, ``calculator`` on the question, ``submit`` the result. Ours is
  ``gym.make("openenv/ORS-v0", url=...)``; theirs are the ``ors-sdk`` client (``ors.client.ORS``)
  and the ``openreward`` SDK client (``OpenReward().environments.get(...)``), both used
  synchronously as their READMEs show. Target >= 1.0 each.
* **OpenEnv**: ``benchmarks/openenv_bench.py``'s two cases (a single env against OpenEnv's sync
  client; 64 sub-envs against 64 async clients gathered on one loop). Target >= 1.0 each.
* **Verifiers**: ``benchmarks/verifiers_v0_bench.py``: the library's own ``run_rollout`` against
  the adapter's episode (target >= 0.95) and against ``AgentEnv.step`` (target >= 0.90).

    python benchmarks/peers.py [--reps 5] [--episodes 60] [--only ors,openenv,verifiers] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from figures import figure, write
from servers import free_port, wait_healthy

from openenv_gym.testing import procs

os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")  # no PyPI check from the SDK client


def _question(prompt: str) -> str:
    return prompt.split("Compute ", 1)[1].split(". ", 1)[0]


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def start_arithmetic() -> tuple[subprocess.Popen, str]:
    """The bundled Arithmetic env under ``ors-sdk``'s own server, on a free 127.0.0.1 port."""
    import openenv_gym.examples.arithmetic as arithmetic

    port = free_port()
    proc = subprocess.Popen([sys.executable, arithmetic.__file__, str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return wait_healthy(proc, f"http://127.0.0.1:{port}", "Arithmetic")


# -- ORS: one scripted episode per task index, on each side ------------------------------------------
def ours_ors(env: Any, indices: range) -> float:
    steps, start = 0, time.perf_counter()
    for i in indices:
        obs, _ = env.reset(options={"split": "train", "index": i})
        obs, *_ = env.step(_call("calculator", {"expression": _question(obs[0]["content"])}))
        _, reward, terminated, _, _ = env.step(_call("submit", {"answer": obs[0]["content"]}))
        assert terminated and reward == 1.0
        steps += 2
    return steps / (time.perf_counter() - start)


def sdk_episodes(env: Any, indices: range) -> float:
    """The same episodes through an SDK's ``environment.session(...)`` (both SDKs share this shape)."""
    steps, start = 0, time.perf_counter()
    for i in indices:
        with env.session(split="train", index=i) as s:
            question = _question(s.get_prompt()[0].text)
            s.list_tools()
            value = s.call_tool("calculator", {"expression": question}).blocks[0].text
            out = s.call_tool("submit", {"answer": value})
            assert out.finished and out.reward == 1.0
        steps += 2
    return steps / (time.perf_counter() - start)


def bench_ors(reps: int, episodes: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import gymnasium as gym
    from openreward import OpenReward
    from ors.client import ORS

    import openenv_gym  # noqa: F401

    proc, url = start_arithmetic()
    try:
        env = gym.make("openenv/ORS-v0", url=url, env_name="arithmetic")
        ors_client = ORS(base_url=url)
        or_client = OpenReward(api_key="local")
        sides: dict[str, Callable[[range], float]] = {
            "openenv_gym": lambda idx: ours_ors(env, idx),
            "ors-sdk client": lambda idx: sdk_episodes(ors_client.environment("arithmetic"), idx),
            "openreward client": lambda idx: sdk_episodes(
                or_client.environments.get(name="arithmetic", base_url=url), idx),
        }
        try:
            for run in sides.values():
                run(range(5))  # warm every path up
            rates: dict[str, list[float]] = {k: [] for k in sides}
            for r in range(reps):
                idx = range(100 + r * episodes, 100 + (r + 1) * episodes)
                for name in (sides if r % 2 == 0 else reversed(list(sides))):
                    rates[name].append(sides[name](idx))
                print("  ORS round " + str(r) + ": " + "   ".join(f"{k} {v[-1]:7.1f}" for k, v in rates.items())
                      + " env-steps/s", flush=True)
        finally:
            or_client.close()
            ors_client.close()
            env.close()
    finally:
        procs.terminate(proc)
    ours = rates["openenv_gym"]
    figures = [figure(f"ORS single env vs the {name}", [a / b for a, b in zip(ours, theirs)], target=1.0)
               for name, theirs in rates.items() if name != "openenv_gym"]
    return figures, rates


# -- OpenEnv and Verifiers: the dedicated benchmarks, run here for one table ------------------------
def bench_openenv(reps: int, episodes: int) -> tuple[list[dict[str, Any]], Any]:
    import openenv_bench

    # Rounds of a few tenths of a second swung by +-30 % on this shared machine: five times longer.
    out = openenv_bench.run(rounds=reps, episodes=5 * episodes, vector_episodes=max(2, 5 * episodes // 12))
    figures = [figure(f"OpenEnv {r['case']} vs OpenEnv's own client", r["ratios"], target=1.0) for r in out]
    return figures, out


def bench_verifiers(reps: int, episodes: int) -> tuple[list[dict[str, Any]], Any]:
    import verifiers_v0_bench

    # Three times the rounds, of about half a second per side each: the per-round ratios of one
    # run spread over +-10 % on this shared machine (noise of seconds, whatever the round's
    # length), so the median needs many rounds more than long ones.
    out = verifiers_v0_bench.bench_v0(3 * reps, max(8 * episodes, 500))
    rounds = out["rounds"]
    return [
        figure("Verifiers: adapter episode vs the library's own rollout", [r["episode_ratio"] for r in rounds],
               target=0.95),
        figure("Verifiers: AgentEnv.step vs the library's own rollout", [r["gym_ratio"] for r in rounds],
               target=0.90),
    ], out


def table(figures: list[dict[str, Any]]) -> str:
    rows = ["| peer | median | min-max | target |", "|---|---|---|---|"]
    for f in figures:
        target = "" if f["target"] is None else f">= {f['target']:g}" + (" met" if f["met"] else " MISSED")
        rows.append(f"| {f['name']} | {f['median']:.2f}x | {f['min']:.2f}-{f['max']:.2f} | {target} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="rounds (sides alternate)")
    parser.add_argument("--episodes", type=int, default=60, help="episodes per side per round")
    parser.add_argument("--only", default="ors,openenv,verifiers")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    only = args.only.split(",")
    figures: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    for name, bench in (("ors", bench_ors), ("openenv", bench_openenv), ("verifiers", bench_verifiers)):
        if name in only:
            got, details[name] = bench(args.reps, args.episodes)
            figures += got
    print(table(figures))
    write(args.json, figures, details)


if __name__ == "__main__":
    main()
