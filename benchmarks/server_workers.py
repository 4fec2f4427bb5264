"""Local sources that scale with cores: env-steps/s with ``server_workers=K`` vs one worker, same run.

A local source used to be served by one Python process, so a CPU-bound tool capped every vector
env on it at one core. This measures what ``server_workers`` buys on such an environment:
``tests/envs/cpu_burn.py``, whose ``burn`` tool spends ``--burn-ms`` milliseconds of CPU in the
server (a sync tool, which blocks the server's event loop as a real CPU-bound tool does).

Two ``gym.make_vec("openenv/ORS-v0", num_envs=--num-envs)`` ConcurrentVectorEnvs of that source
run side by side, one with ``server_workers=1`` and one with ``--workers``; every sub-env calls
``burn`` on every step, in lockstep (``envs.step``). Each round measures both for ``--seconds``,
alternating which goes first; the figure is the per-round ratio of env-steps/s (K / 1), its
median and min-max over ``--reps`` rounds. The machine may be shared: each round also records
the cores busy with other processes meanwhile (``other_cores``), read from ``/proc``.

    python benchmarks/server_workers.py [--reps 5] [--seconds 4] [--num-envs 32] [--workers 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import openenv_gym  # noqa: F401  (registers the ids)

SOURCE = Path(__file__).resolve().parent.parent / "tests" / "envs" / "cpu_burn.py"
TARGET = 1.6
_HZ = os.sysconf("SC_CLK_TCK")


def _burn(ms: float) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "b", "type": "function", "function": {"name": "burn", "arguments": json.dumps({"ms": ms})}}]}


def _machine_busy() -> float:
    """Seconds of CPU the whole machine has spent busy (all cores, from ``/proc/stat``)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _HZ


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _HZ
    except (OSError, IndexError, ValueError):
        return 0.0


def _servers(envs: gym.vector.VectorEnv) -> float:
    return sum(_cpu(p) for p in envs.adapters[0].server_pids())


def measure(envs: gym.vector.VectorEnv, seconds: float, ms: float) -> dict[str, float]:
    """Lockstep ``burn`` steps for ``seconds``: env-steps/s, CPU per env-step (this process, the
    servers) and the cores other processes used meanwhile."""
    n = envs.num_envs
    actions = [_burn(ms)] * n
    steps = 0
    busy0, client0, servers0 = _machine_busy(), time.process_time(), _servers(envs)
    start = time.perf_counter()
    while True:
        obs, _, _, _, infos = envs.step(actions)
        steps += n
        if "error" in infos:
            raise RuntimeError(f"a step failed: {infos['error']}")
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    client, servers = time.process_time() - client0, _servers(envs) - servers0
    other = (_machine_busy() - busy0) - client - servers
    pids = {int(o[0]["content"].split()[0]) for o in obs}
    assert pids <= set(envs.adapters[0].server_pids()), "every answer comes from one of the env's workers"
    return {"steps_per_s": steps / elapsed, "other_cores": max(0.0, other / elapsed), "workers_used": len(pids),
            "client_ms_per_step": 1000 * client / steps, "server_ms_per_step": 1000 * servers / steps}


def main() -> None:
    from figures import figure, write

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", "--rounds", dest="reps", type=int, default=5, help="rounds (each measures both)")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per side per round")
    parser.add_argument("--num-envs", type=int, default=32, help="sub-envs of each vector env")
    parser.add_argument("--workers", type=int, default=2, help="server_workers compared against 1")
    parser.add_argument("--burn-ms", type=float, default=5.0, help="CPU milliseconds the tool uses per step")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    k = args.workers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"server_workers: {args.num_envs} sub-envs, burn {args.burn_ms} ms of CPU per step, {cores} cores, "
          f"{args.reps} rounds of {args.seconds} s per side")
    sides: dict[int, Any] = {}
    try:
        for workers in (1, k):
            sides[workers] = gym.make_vec("openenv/ORS-v0", num_envs=args.num_envs, source=str(SOURCE),
                                          env_class="CpuBurn", server_workers=workers)
            sides[workers].reset(seed=0)
            assert len(sides[workers].adapters[0].server_pids()) == workers
        for workers in (1, k):  # warm every path up
            measure(sides[workers], 0.5, args.burn_ms)
        rows = []
        for r in range(args.reps):
            order = (1, k) if r % 2 == 0 else (k, 1)
            got = {w: measure(sides[w], args.seconds, args.burn_ms) for w in order}
            row = {"one": got[1]["steps_per_s"], "k": got[k]["steps_per_s"],
                   "ratio": got[k]["steps_per_s"] / got[1]["steps_per_s"],
                   "other_cores": max(got[1]["other_cores"], got[k]["other_cores"]),
                   "workers_used": got[k]["workers_used"], "cpu_ms_per_step": {
                       side: {"client": got[w]["client_ms_per_step"], "server": got[w]["server_ms_per_step"]}
                       for side, w in (("one", 1), ("k", k))}}
            rows.append(row)
            cpu = row["cpu_ms_per_step"]
            print(f"round {r}: 1 worker {row['one']:6.1f}  {k} workers {row['k']:6.1f} env-steps/s  "
                  f"ratio {row['ratio']:.2f}  (CPU ms per step client/server: {cpu['one']['client']:.2f}/"
                  f"{cpu['one']['server']:.2f} and {cpu['k']['client']:.2f}/{cpu['k']['server']:.2f}; "
                  f"other processes busy: {row['other_cores']:.2f} cores)")
    finally:
        for envs in sides.values():
            envs.close()
    figures = [
        figure(f"server_workers={k} vs 1: env-steps/s, {args.num_envs} sub-envs, {args.burn_ms:g} ms CPU tool",
               [r["ratio"] for r in rows], target=TARGET,
               note=f"{cores} cores; other processes busy up to {max(r['other_cores'] for r in rows):.2f} cores"),
        figure("env-steps/s with server_workers=1", [r["one"] for r in rows], unit="steps/s"),
        figure(f"env-steps/s with server_workers={k}", [r["k"] for r in rows], unit="steps/s"),
    ]
    for f in figures:
        target = f"  (target >= {f['target']}: {'met' if f['met'] else 'missed'})" if f["target"] else ""
        print(f"{f['name']}: {f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f}){target}")
    write(args.json, figures, {"rounds": rows, "num_envs": args.num_envs, "seconds": args.seconds,
                               "burn_ms": args.burn_ms, "workers": k, "cores": cores})


if __name__ == "__main__":
    main()
