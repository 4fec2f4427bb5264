"""Grouped collection (GRPO groups) against ungrouped collection, env-steps/s in the same run.

``rollout.collect`` on the bundled Arithmetic env with 64 sub-envs and a seeded random policy,
with ``group_size=8`` (every 8 sub-envs share their e-th tasks; records wait for their group and
get advantages) and without. The sides alternate over ``--reps`` rounds; the figure is the median
of the per-round ratios grouped / ungrouped with its min-max (target >= 0.95: groups cost no
throughput, since members never wait for each other).

    python benchmarks/grouped.py [--reps 3] [--episodes 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from figures import figure, write  # noqa: E402

import openenv_gym  # noqa: E402,F401
from openenv_gym.rollout import collect  # noqa: E402

NUM_ENVS, GROUP = 64, 8


def rate(episodes: int, group_size: int | None, seed: int) -> float:
    summary = collect("openenv/Arithmetic-v0", episodes, num_envs=NUM_ENVS, group_size=group_size, seed=seed,
                      progress=False)
    assert summary.episodes == episodes and summary.errors == 0
    return summary.steps_per_sec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=1024, help="episodes per side per round (a multiple of 8)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rate(128, GROUP, 0), rate(128, None, 0)  # warm-up: imports, the server, the pools
    rows = []
    for r in range(args.reps):
        sides = [("grouped", GROUP), ("ungrouped", None)]
        if r % 2:
            sides.reverse()
        got = {name: rate(args.episodes, k, seed=r) for name, k in sides}
        rows.append({**got, "ratio": got["grouped"] / got["ungrouped"]})
        print(f"round {r}: grouped (k={GROUP}) {got['grouped']:7.1f}  ungrouped {got['ungrouped']:7.1f} env-steps/s  "
              f"ratio {rows[-1]['ratio']:.3f}", flush=True)
    f = figure(f"grouped collection (64 sub-envs, k={GROUP}) vs ungrouped, env-steps/s", [r["ratio"] for r in rows],
               target=0.95)
    print(f"{f['name']}: {f['median']:.3f} ({f['min']:.3f}-{f['max']:.3f})  target >= 0.95")
    write(args.json, [f], rows)


if __name__ == "__main__":
    main()
