"""What ``import openenv_gym`` costs beside ``import gymnasium``, in fresh interpreters.

``import openenv_gym`` imports Gymnasium and registers every id: the bundled ones, the user's
catalog, entry points, and the installed Verifiers and OpenEnv packages. Scanning every installed
distribution's metadata is the slow part (about a second on a venv with 400 distributions), so
its result is cached under a fingerprint of the installed set: only the first import after an
install, upgrade or uninstall pays it. Target: a warm import costs at most 1.5 x ``import
gymnasium``.

Each repeat times, in alternating order, one fresh ``python -c "import gymnasium"`` and one
fresh ``python -c "import openenv_gym"`` (wall time of the import statement, measured inside the
child), with the discovery cache warm; the cold figure removes the cache first (a private cache
folder, so the user's own is never touched). This machine is shared and noisy: the ratio of one
run is what counts.

    python benchmarks/import_cost.py [--reps 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = "import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"


def timed_import(module: str, env: dict[str, str]) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD.format(module=module)], capture_output=True,
                          text=True, env=env, timeout=120, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--reps", type=int, default=15, help="fresh-process pairs per figure")
    parser.add_argument("--json", default=None, help="also write the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        env = {**os.environ, "OPENENV_GYM_CACHE": cache, "OPENENV_GYM_CATALOG": os.path.join(tmp, "catalog.json")}
        timed_import("openenv_gym", env)  # warms the discovery cache and the bytecode
        warm, cold, gym = [], [], []
        for rep in range(args.reps):
            pair = [("gymnasium", gym), ("openenv_gym", warm)]
            for module, into in (pair if rep % 2 else pair[::-1]):
                into.append(timed_import(module, env))
            shutil.rmtree(cache, ignore_errors=True)
            cold.append(timed_import("openenv_gym", env))
    warm_ratio = [w / g for w, g in zip(warm, gym, strict=True)]
    cold_ratio = [c / g for c, g in zip(cold, gym, strict=True)]
    for name, values in (("import gymnasium", gym), ("import openenv_gym (warm)", warm),
                         ("import openenv_gym (cold: first after an install)", cold)):
        print(f"{name:<50} {statistics.median(values) * 1000:7.0f} ms  "
              f"({min(values) * 1000:.0f}-{max(values) * 1000:.0f})")
    print(f"warm / gymnasium: {statistics.median(warm_ratio):.2f}x   cold / gymnasium: {statistics.median(cold_ratio):.2f}x")
    from figures import figure, write

    write(args.json, [
        figure("import openenv_gym vs import gymnasium, discovery cache warm", warm_ratio, target=1.5,
               higher_is_better=False),
        figure("import openenv_gym vs import gymnasium, first import after an install (cold cache)", cold_ratio,
               higher_is_better=False),
        figure("import gymnasium", [g * 1000 for g in gym], unit="ms", higher_is_better=False),
        figure("import openenv_gym, warm", [w * 1000 for w in warm], unit="ms", higher_is_better=False),
    ], {"gymnasium_s": gym, "warm_s": warm, "cold_s": cold})


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s in all, pid {os.getpid()})", file=sys.stderr)
