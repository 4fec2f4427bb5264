"""Unix socket vs TCP for local ORS servers: env-steps/s of the bundled Arithmetic env, same run.

Local sources are served on a Unix socket in a private directory by default (``listen="unix"``);
``listen="tcp"`` binds 127.0.0.1 and checks a bearer token on every request. This measures both
through the adapter on two servers of the same source, started side by side:

* **single**: one ``gym.make("openenv/Arithmetic-v0", listen=...)`` env playing scripted episodes
  one after the other (reset, ``calculator`` with the question, ``submit`` the result);
* **concurrent**: ``--sessions`` episodes at once on the runtime loop, spread over adapters of
  ``--per-client`` sessions each (one connection pool per adapter, as the concurrent vector env
  shards them), each session playing the same scripted episodes for ``--seconds``.

The machine is shared and noisy, so the modes alternate within each round (the order flips every
round) and the figures reported are per-round ratios, with their median and min-max over the
rounds: env-steps/s unix / tcp (>= 1.0: the socket is not slower), and, because wall-clock rates
on a loaded machine swing by tens of percent between identical runs, also the CPU time one
env-step costs (this process plus the server process) tcp / unix (>= 1.0: the socket is not
costlier), which contention disturbs much less.

    python benchmarks/uds_vs_tcp.py [--episodes 150] [--seconds 3] [--sessions 32] [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import time
from pathlib import Path

import gymnasium as gym

import openenv_gym
from openenv_gym import runtime
from openenv_gym.actions import ParsedCall, Turn
from openenv_gym.adapters.ors.adapter import ORSAdapter
from openenv_gym.wire import TaskRef

SOURCE = Path(openenv_gym.__file__).parent / "examples" / "arithmetic.py"
MODES = ("unix", "tcp")


def _call(name: str, args: dict) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _question(prompt: str) -> str:
    return prompt.split("Compute ", 1)[1].split(". ", 1)[0]


# -- single episode loop (the sync Gymnasium surface) ------------------------------------------------
def run_single(env: gym.Env, episodes: int, offset: int) -> tuple[int, float]:
    steps = 0
    start = time.perf_counter()
    for n in range(episodes):
        obs, _ = env.reset(options={"split": "train", "index": (offset + n) % 2000})
        obs, *_ = env.step(_call("calculator", {"expression": _question(obs[0]["content"])}))
        _, reward, terminated, _, _ = env.step(_call("submit", {"answer": obs[0]["content"]}))
        assert reward == 1.0 and terminated, "every scripted episode must be solved"
        steps += 2
    return steps, time.perf_counter() - start


# -- concurrent sessions (the async core, as a vector env drives it) --------------------------------
async def _episode(adapter: ORSAdapter, index: int) -> None:
    episode = adapter.episode()
    opening = await episode.start(TaskRef("train", index % 2000))
    try:
        question = _question(opening.messages[0]["content"])
        out = await episode.step(Turn(None, [ParsedCall("c", "calculator", {"expression": question})]))
        out = await episode.step(Turn(None, [ParsedCall("s", "submit", {"answer": out.messages[0]["content"]})]))
        assert out.reward == 1.0 and out.terminated, "every scripted episode must be solved"
    finally:
        await episode.aclose()


async def _concurrent(adapters: list[ORSAdapter], sessions: int, per_client: int, seconds: float,
                      offset: int) -> tuple[int, float]:
    steps = 0
    stop = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal steps
        adapter = adapters[(i // per_client) % len(adapters)]
        index = offset + i
        while time.perf_counter() < stop:
            await _episode(adapter, index)
            steps += 2
            index += sessions

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(sessions)))
    return steps, time.perf_counter() - start


def run_concurrent(adapters: list[ORSAdapter], sessions: int, per_client: int, seconds: float,
                   offset: int) -> tuple[int, float]:
    return runtime.run_sync(_concurrent(adapters, sessions, per_client, seconds, offset), seconds + 120)


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def measured(run, server_pid: int) -> tuple[float, float]:
    """``(env-steps/s, CPU microseconds per env-step of this process plus the server)`` of ``run()``,
    which returns ``(steps, seconds)``."""
    cpu0, srv0 = time.process_time(), _cpu_seconds(server_pid)
    steps, seconds = run()
    cpu = time.process_time() - cpu0 + _cpu_seconds(server_pid) - srv0
    return steps / seconds, cpu / steps * 1e6


async def _each(coros: list) -> list:
    return await asyncio.gather(*coros, return_exceptions=True)


def _summary(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f}  min-max {min(values):.3f}-{max(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=150, help="episodes per mode per round, single loop")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per mode per round, concurrent")
    parser.add_argument("--sessions", type=int, default=32, help="concurrent sessions")
    parser.add_argument("--per-client", type=int, default=8, help="sessions per adapter (connection pool)")
    parser.add_argument("--reps", "--rounds", dest="rounds", type=int, default=7, help="rounds")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    envs = {mode: gym.make("openenv/Arithmetic-v0", listen=mode) for mode in MODES}
    n_adapters = max(1, math.ceil(args.sessions / args.per_client))
    adapters = {mode: [ORSAdapter(source=str(SOURCE), env_class="Arithmetic", listen=mode) for _ in range(n_adapters)]
                for mode in MODES}
    rows = []
    server = {}
    try:
        for mode in MODES:
            for result in runtime.run_sync(_each([a.start() for a in adapters[mode]]), 300):
                if isinstance(result, BaseException):
                    raise result
            pids = {envs[mode].unwrapped.adapter.server_pid()} | {a.server_pid() for a in adapters[mode]}
            assert len(pids) == 1, "the env and the adapters of one mode must share its server"
            server[mode] = pids.pop()
            url = envs[mode].unwrapped.adapter.connection()["url"]
            print(f"{mode:4s} server pid {server[mode]}, {url.split(':', 1)[0]} address")
            run_single(envs[mode], 20, 0)  # warm up both paths
            run_concurrent(adapters[mode], args.sessions, args.per_client, 0.5, 0)
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            offset = 100 + r * max(args.episodes, 1000)
            single = {m: measured(lambda m=m, offset=offset: run_single(envs[m], args.episodes, offset), server[m])
                      for m in order}
            conc = {m: measured(lambda m=m, offset=offset: run_concurrent(adapters[m], args.sessions, args.per_client,
                                                                          args.seconds, offset),
                                server[m]) for m in order}
            row = {
                "single": {m: {"steps_per_sec": v[0], "cpu_us_per_step": v[1]} for m, v in single.items()},
                "concurrent": {m: {"steps_per_sec": v[0], "cpu_us_per_step": v[1]} for m, v in conc.items()},
                "rate_ratio_single": single["unix"][0] / single["tcp"][0],
                "rate_ratio_concurrent": conc["unix"][0] / conc["tcp"][0],
                "cpu_ratio_single": single["tcp"][1] / single["unix"][1],
                "cpu_ratio_concurrent": conc["tcp"][1] / conc["unix"][1],
            }
            rows.append(row)
            print(f"round {r}: single unix {single['unix'][0]:6.1f} tcp {single['tcp'][0]:6.1f} env-steps/s "
                  f"(x{row['rate_ratio_single']:.3f}), cpu/step unix {single['unix'][1]:5.0f} tcp {single['tcp'][1]:5.0f} us "
                  f"(x{row['cpu_ratio_single']:.3f}) | {args.sessions} concurrent unix {conc['unix'][0]:6.1f} "
                  f"tcp {conc['tcp'][0]:6.1f} env-steps/s (x{row['rate_ratio_concurrent']:.3f}), cpu/step unix "
                  f"{conc['unix'][1]:5.0f} tcp {conc['tcp'][1]:5.0f} us (x{row['cpu_ratio_concurrent']:.3f})")
    finally:
        for mode in MODES:
            runtime.run_sync(_each([a.aclose() for a in adapters[mode]]), 60)
            envs[mode].close()
    summary = {}
    for kind in ("single", "concurrent"):
        for m in MODES:
            summary[f"{kind}_{m}_steps_per_sec"] = statistics.median(r[kind][m]["steps_per_sec"] for r in rows)
            summary[f"{kind}_{m}_cpu_us_per_step"] = statistics.median(r[kind][m]["cpu_us_per_step"] for r in rows)
        summary[f"rate_ratio_{kind}"] = statistics.median(r[f"rate_ratio_{kind}"] for r in rows)
        summary[f"cpu_ratio_{kind}"] = statistics.median(r[f"cpu_ratio_{kind}"] for r in rows)
        label = "single loop  " if kind == "single" else f"{args.sessions} concurrent"
        print(f"{label}  env-steps/s unix/tcp: {_summary([r[f'rate_ratio_{kind}'] for r in rows])}"
              f"   (median unix {summary[f'{kind}_unix_steps_per_sec']:.1f}, tcp {summary[f'{kind}_tcp_steps_per_sec']:.1f})")
        print(f"{label}  cpu/step    tcp/unix: {_summary([r[f'cpu_ratio_{kind}'] for r in rows])}"
              f"   (median unix {summary[f'{kind}_unix_cpu_us_per_step']:.0f} us, tcp {summary[f'{kind}_tcp_cpu_us_per_step']:.0f} us)")
    from figures import figure, write

    write(args.json, [
        figure("Unix socket vs TCP, single env, env-steps/s", [r["rate_ratio_single"] for r in rows], target=1.0),
        figure(f"Unix socket vs TCP, {args.sessions} concurrent, env-steps/s", [r["rate_ratio_concurrent"] for r in rows],
               target=1.0),
    ], {"rounds": rows, "summary": summary, "args": {k: v for k, v in vars(args).items() if k != "json"}})

if __name__ == "__main__":
    main()
