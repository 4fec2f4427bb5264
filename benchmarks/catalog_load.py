"""How long ``import openenv_gym`` spends registering a large user catalog.

Every ``import openenv_gym`` reads the catalog and registers each entry as a Gymnasium id, so a
catalog that grew to thousands of entries (a sweep importing one env per job) must not make the
import slow: loading has to stay linear in the number of entries (issue: 8,000 entries took 5.5 s
and 80,000 over 300 s when each registration scanned the whole Gymnasium registry).

Each size runs in a fresh interpreter: ``import openenv_gym`` with an empty catalog, then
``register_catalog()`` on the large one is timed. Prints entries, median seconds (min-max over
the repeats) and microseconds per entry; a flat per-entry column means linear loading. This
machine is shared and noisy: compare the rows of one run, not absolute numbers.

    python benchmarks/catalog_load.py [--sizes 1000,10000,80000] [--reps 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import os, sys, time, warnings
warnings.simplefilter("ignore")
os.environ["OPENENV_GYM_CATALOG"] = sys.argv[1]  # empty: the import itself registers nothing
import openenv_gym
from openenv_gym.registration import register_catalog
os.environ["OPENENV_GYM_CATALOG"] = sys.argv[2]
start = time.perf_counter()
ids = register_catalog()
seconds = time.perf_counter() - start
assert len(ids) == int(sys.argv[3]), (len(ids), sys.argv[3])
print(seconds)
"""


def write_catalog(path: Path, n: int) -> None:
    """A catalog of ``n`` ORS entries (the same shape ``openenv-gym import`` writes)."""
    entries = {
        f"env{i}": {"name": f"env{i}", "kind": "ors", "source": f"/src/env{i}.py", "env_class": "Env",
                    "env_name": "env", "module_file": f"env{i}.py", "sdk": "ors",
                    "added_at": "2025-01-01T00:00:00+00:00", "options": {"max_turns": 8}}
        for i in range(n)
    }
    path.write_text(json.dumps({"version": 1, "entries": entries}))


def time_load(empty: Path, catalog: Path, n: int, timeout: float) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD, str(empty), str(catalog), str(n)],
                          capture_output=True, text=True, timeout=timeout, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated catalog sizes (80000 takes a while)")
    parser.add_argument("--reps", type=int, default=3, help="fresh-process repeats per size")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one load may take before giving up")
    parser.add_argument("--json", default=None, help="also write the rows as JSON")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.json"
        print(f"{'entries':>8} {'median s':>9} {'min-max s':>15} {'us/entry':>9}")
        for n in sizes:
            catalog = Path(tmp) / f"catalog-{n}.json"
            write_catalog(catalog, n)
            times = [time_load(empty, catalog, n, args.timeout) for _ in range(args.reps)]
            med = statistics.median(times)
            rows.append({"entries": n, "median_s": med, "min_s": min(times), "max_s": max(times),
                         "us_per_entry": med / n * 1e6, "times": times})
            print(f"{n:>8} {med:>9.3f} {min(times):>7.3f}-{max(times):<7.3f} {med / n * 1e6:>9.1f}", flush=True)
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        growth = last["median_s"] / first["median_s"]
        print(f"{last['entries'] / first['entries']:.0f}x the entries took {growth:.1f}x the time "
              "(linear: about the same factor)")
    from figures import figure, write

    figures = [figure(f"catalog load, {r['entries']:,} entries", r["times"], unit="s", higher_is_better=False)
               for r in rows]
    write(args.json, figures, rows)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s in all, pid {os.getpid()})", file=sys.stderr)
