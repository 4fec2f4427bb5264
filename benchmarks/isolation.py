"""Isolation: envs in adapter host processes (their own venv) against the same envs in-process.

Three figures, each the median (min-max) of per-round ratios, the sides alternating per round:

* isolated Arithmetic vs in-process, one env (``gym.make``): env-steps/s, both envs open and
  stepped in alternating chunks of 50 (target >= 0.90);
* the same at 64 sub-envs (``gym.make_vec``, lockstep steps): env-steps/s (target >= 0.90);
* a mixture of three isolated envs at 96 sub-envs (32 each: the bundled Arithmetic, an ors-sdk
  env and an openreward env, each in its own venv) against the mean of each of them alone at 96
  isolated sub-envs (target >= 0.8: mixing costs no throughput).

Every action is a scripted tool call, so the figures measure the envs, not a policy. ``isolate=True``
builds each env's venv once (minutes; cached after); ``--python PATH`` runs the hosts under that
interpreter instead (no build: e.g. ``--python .venv/bin/python`` for a quick look).

    python benchmarks/isolation.py [--reps 3] [--seconds 3] [--python PATH] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gymnasium as gym  # noqa: E402
from figures import figure, write  # noqa: E402

import openenv_gym  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARITH = "openenv/Arithmetic-v0"
PROBES = {  # two more ORS envs, one per SDK, with a cheap tool
    "ors-sdk": dict(source=str(ROOT / "tests" / "envs" / "ors_probe.py"), env_class="Probe"),
    "openreward": dict(source=str(ROOT / "tests" / "envs" / "openreward_probe.py"), env_class="Probe"),
}


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": name, "arguments": json.dumps(args)}}]}


CALC = call("calculator", {"expression": "2+3"})
HINT = call("hint", {})


def single_rates(host: dict[str, Any], seconds: float, chunk: int = 50) -> tuple[float, float]:
    """Env-steps/s of one isolated env and one in-process env, measured in alternating chunks.

    Both envs stay open and take turns, ``chunk`` steps at a time, so a change in the machine's
    load (it is shared) falls on both sides alike instead of on whichever ran second.
    """
    envs = {"isolated": gym.make(ARITH, max_turns=10**6, **host), "in_process": gym.make(ARITH, max_turns=10**6)}
    try:
        for env in envs.values():
            env.reset(seed=0)
            for _ in range(20):
                env.step(CALC)
        spent = {side: 0.0 for side in envs}
        steps, turn, start = 0, 0, time.perf_counter()
        while time.perf_counter() - start < 2 * seconds:
            order = list(envs) if turn % 2 == 0 else list(reversed(envs))
            for side in order:
                t = time.perf_counter()
                for _ in range(chunk):
                    envs[side].step(CALC)
                spent[side] += time.perf_counter() - t
            steps += chunk
            turn += 1
        return steps / spent["isolated"], steps / spent["in_process"]
    finally:
        for env in envs.values():
            env.close()


def vec_rate(envs: Any, actions: list[Any], seconds: float) -> float:
    envs.reset(seed=0)
    for _ in range(5):
        envs.step(actions)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(actions)
        steps += len(actions)
    return steps / (time.perf_counter() - start)


def make_vec(name: str, n: int, host: dict[str, Any], extra: dict[str, Any] | None = None) -> Any:
    return gym.make_vec(name, num_envs=n, max_turns=10**6, **host, **(extra or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per side per round")
    parser.add_argument("--python", default=None, help="host interpreter (default: isolate=True, the envs' own venvs)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    host: dict[str, Any] = {"python": args.python} if args.python else {"isolate": True}
    print(f"hosts: {args.python or 'isolate=True (each env in its own venv)'}", flush=True)
    t0 = time.perf_counter()
    gym.make(ARITH, **host).close()  # builds (or finds) the venv before anything is timed
    for probe in PROBES.values():
        gym.make("openenv/ORS-v0", **probe, **host).close()
    print(f"venvs ready in {time.perf_counter() - t0:.1f} s", flush=True)

    rows: list[dict[str, float]] = []
    for r in range(args.reps):
        row: dict[str, float] = {}
        sides = [("isolated", host), ("in_process", {})]
        if r % 2:
            sides.reverse()
        row["single_isolated"], row["single_in_process"] = single_rates(host, args.seconds)
        for side, kw in sides:
            envs = make_vec(ARITH, 64, kw)
            try:
                row[f"vec64_{side}"] = vec_rate(envs, [CALC] * 64, args.seconds)
            finally:
                envs.close()
        alone = []
        for name, extra, action in ((ARITH, {}, CALC), *(("openenv/ORS-v0", p, HINT) for p in PROBES.values())):
            envs = make_vec(name, 96, host, extra)
            try:
                alone.append(vec_rate(envs, [action] * 96, args.seconds))
            finally:
                envs.close()
        mix = _mixture(host)
        try:
            row["mixture96"] = vec_rate(mix, [CALC] * 32 + [HINT] * 64, args.seconds)
        finally:
            mix.close()
        row["alone96_mean"] = sum(alone) / len(alone)
        row["single_ratio"] = row["single_isolated"] / row["single_in_process"]
        row["vec64_ratio"] = row["vec64_isolated"] / row["vec64_in_process"]
        row["mixture_ratio"] = row["mixture96"] / row["alone96_mean"]
        rows.append(row)
        print(f"round {r}: single {row['single_isolated']:.0f} vs {row['single_in_process']:.0f} ({row['single_ratio']:.3f})"
              f"  vec64 {row['vec64_isolated']:.0f} vs {row['vec64_in_process']:.0f} ({row['vec64_ratio']:.3f})"
              f"  mixture96 {row['mixture96']:.0f} vs alone mean {row['alone96_mean']:.0f} ({row['mixture_ratio']:.3f})"
              " env-steps/s", flush=True)
    figs = [
        figure("isolated Arithmetic vs in-process, 1 env, env-steps/s", [r["single_ratio"] for r in rows], target=0.90),
        figure("isolated Arithmetic vs in-process, 64 sub-envs, env-steps/s", [r["vec64_ratio"] for r in rows],
               target=0.90),
        figure("mixture of 3 isolated envs at 96 sub-envs vs mean of each alone at 96", [r["mixture_ratio"] for r in rows],
               target=0.80),
    ]
    for f in figs:
        print(f"{f['name']}: {f['median']:.3f} ({f['min']:.3f}-{f['max']:.3f})  target >= {f['target']}")
    write(args.json, figs, rows)


def _mixture(host: dict[str, Any]) -> Any:
    """Arithmetic, the ors-sdk probe and the openreward probe, 32 sub-envs each, each isolated.

    The two probes are one registered id with different sources, so each gets an id of its own here
    (as `openenv-gym import --isolated` would give them).
    """
    for sdk, probe in PROBES.items():
        gym.register(f"openenv/bench-{sdk}-v0", entry_point="openenv_gym.registration:make_env",
                     vector_entry_point="openenv_gym.registration:make_vec",
                     kwargs={"adapter": "openenv_gym.adapters.ors.adapter:ORSAdapter", **probe})
    return openenv_gym.make_mixture({ARITH: 32, "openenv/bench-ors-sdk-v0": 32, "openenv/bench-openreward-v0": 32},
                                    max_turns=10**6, **host)


if __name__ == "__main__":
    main()
