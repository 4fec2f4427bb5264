"""Run every benchmark and write one table: the figures docs/performance.md shows, reproducible by anyone.

Each benchmark runs in its own process with ``--json``; every figure it reports is the median of
its repeats with their min and max, next to its target. The table (markdown) and everything
behind it (JSON) are written with the machine they ran on, so a figure is never typed by hand::

    python benchmarks/run_all.py                      # every benchmark, default repeats
    python benchmarks/run_all.py --only peers,vector  # some of them
    python benchmarks/run_all.py --quick              # fewer repeats and shorter runs (a smoke run)

Writes ``benchmarks/results.md`` and ``benchmarks/results.json`` (``--out`` to change), and each
benchmark's own output to ``<out>.logs/<name>.log``. A ``--quick`` run writes
``benchmarks/results/quick.md`` and ``.json`` instead (git ignores that folder) and never the
committed results: its figures are a smoke test, not measurements. A benchmark that fails or
needs a missing extra gets a row saying so; the others still run.

docs/performance.md holds the committed table, ``benchmarks/results.md`` pasted whole under "The
table"; the README copies a few headline rows of it, verbatim (``tests/test_readme.py`` checks that
each is in docs/performance.md). Nothing here writes either page: after a run of the committed
results, paste the new table there.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
COMMITTED = HERE / "results"  # the stem of the results docs/performance.md pastes
QUICK = HERE / "results" / "quick"  # where a --quick run writes (an ignored folder)

# name, script, arguments, arguments with --quick, needs (importable modules), timeout (s)
BENCHES: list[tuple[str, str, list[str], list[str], list[str], float]] = [
    ("overhead", "overhead.py", ["--reps", "5", "--episodes", "200"], ["--reps", "2", "--episodes", "40"], [], 1200),
    ("vector", "vector.py", ["--reps", "3", "--seconds", "6"], ["--reps", "1", "--seconds", "2"], [], 2400),
    ("peers", "peers.py", ["--reps", "5", "--episodes", "60"], ["--reps", "2", "--episodes", "20"],
     ["ors", "openreward", "openenv", "verifiers"], 2400),
    ("server_workers", "server_workers.py", ["--reps", "3"], ["--reps", "1"], [], 1800),
    ("ray", "ray_bench.py", ["--reps", "3"], ["--reps", "1"], ["ray"], 2400),
    ("uds_vs_tcp", "uds_vs_tcp.py", ["--reps", "5"], ["--reps", "1", "--episodes", "30", "--seconds", "1"], [], 1200),
    ("verifiers_v1", "verifiers_v1_bench.py", ["--reps", "3"], ["--reps", "1", "--episodes", "2"], ["verifiers"], 1800),
    ("import_cost", "import_cost.py", ["--reps", "15"], ["--reps", "3"], [], 600),
    ("catalog", "catalog_load.py", ["--sizes", "1000,10000", "--reps", "3"], ["--sizes", "1000", "--reps", "1"], [], 1200),
    ("wrappers", "wrappers_cost.py", ["--reps", "5"], ["--reps", "1"], [], 900),
    ("grouped", "grouped.py", ["--reps", "3"], ["--reps", "1"], [], 1200),
    ("isolation", "isolation.py", ["--reps", "3"], ["--reps", "1", "--seconds", "1"], ["ors", "openreward"], 1800),
    ("view", "view_bench.py", ["--reps", "3"], ["--reps", "1", "--episodes", "10000", "--no-html"], ["playwright"], 1800),
    ("soak", "soak.py", ["--num-envs", "1024", "--minutes", "5"], ["--num-envs", "128", "--minutes", "0.5"], [], 1500),
    # Runs itself under the TRL venv (.ci/trl.sh builds .venv-trl): the main venv has no TRL.
    ("trl_spec", "trl_spec.py", ["--reps", "7"], ["--reps", "2", "--calls", "5", "--tasks", "8"], [], 1200),
    ("serve", "serve_bench.py", ["--rounds", "9", "--seconds", "3"], ["--rounds", "1", "--seconds", "2"],
     ["ors", "openenv", "websockets"], 1800),
    ("multiagent", "multiagent_bench.py", ["--rounds", "3"], ["--rounds", "1", "--games", "8", "--hands", "8"],
     ["verifiers", "pettingzoo"], 3600),
]

PACKAGES = ["gymnasium", "numpy", "msgspec", "aiohttp", "httptools", "httpx", "ray", "ors-sdk", "openreward", "openenv",
            "verifiers", "mcp", "websockets", "pettingzoo"]


def machine() -> dict[str, Any]:
    """What the figures ran on (no host names, users or paths)."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor()
    try:
        mem = int(next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split()[1])
        mem_gib = round(mem / 2**20, 1)
    except (OSError, StopIteration):
        mem_gib = None
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu, "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": mem_gib, "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(), "packages": versions, "commit": commit,
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def _missing(modules: list[str]) -> list[str]:
    import importlib.util

    return [m for m in modules if importlib.util.find_spec(m) is None]


def run_one(name: str, script: str, args: list[str], timeout: float, logs: Path) -> dict[str, Any]:
    """Run one benchmark in its own process; its figures, or why there are none."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        log = logs / f"{name}.log"
        start = time.monotonic()
        with open(log, "w") as fh:
            try:
                proc = subprocess.run([sys.executable, str(HERE / script), *args, "--json", str(out)], cwd=HERE,
                                      stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = None
        seconds = time.monotonic() - start
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        if code != 0 or not out.exists():
            why = f"timed out after {timeout:.0f} s" if code is None else f"exit {code}: {' / '.join(tail)[-300:]}"
            return {"name": name, "ok": False, "error": why, "seconds": seconds, "figures": []}
        data = json.loads(out.read_text())
        return {"name": name, "ok": True, "seconds": seconds, "figures": data.get("figures", []),
                "details": data.get("details")}


def _fmt(x: float, unit: str) -> str:
    if unit == "x":
        return f"{x:.2f}x"
    if abs(x) >= 100:
        return f"{x:,.0f} {unit}".strip()
    return f"{x:.3g} {unit}".strip()


def provenance(runs: list[dict[str, Any]], info: dict[str, Any]) -> str:
    """Which rows come from an earlier run than ``info``'s (``--update``), by run."""
    earlier: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        when = run.get("measured") or {}
        if when and (when.get("date"), when.get("commit")) != (info["date"], info["commit"]):
            earlier.setdefault((when["date"], when["commit"]), []).append(run["name"])
    return "".join(f" Rows of {', '.join(names)} are from the run of {date} (commit {commit})."
                   for (date, commit), names in sorted(earlier.items()))


def spread(f: dict[str, Any]) -> str:
    """The min-max column: the spread of the repeats, or "one run" for a single measurement."""
    if f.get("reps", 0) < 2:
        return "one run"
    return f"{_fmt(f['min'], f['unit'])} - {_fmt(f['max'], f['unit'])}"


def markdown(runs: list[dict[str, Any]], info: dict[str, Any], command: str) -> str:
    pk = ", ".join(f"{k} {v}" for k, v in info["packages"].items())
    minutes = sum(r.get("seconds", 0.0) for r in runs) / 60
    lines = [
        f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores, {info['memory_gib']} GiB), "
        f"{info['os']}, Python {info['python']}; commit {info['commit']}; {pk}.",
        f"Command: `{command}`; the benchmarks ran {minutes:.0f} min in all. Each figure: median of the repeats "
        "(min-max; \"one run\" for a figure measured once); ratios are ours / the baseline measured in the same "
        "run." + provenance(runs, info),
        "",
        "| benchmark | figure | median | min-max | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        if not run["ok"]:
            lines.append(f"| {run['name']} | (did not run: {run['error']}) | | | | |")
            continue
        for f in run["figures"]:
            target = "" if f.get("target") is None else (">= " if f.get("higher_is_better", True) else "<= ") + \
                _fmt(f["target"], f["unit"])
            met = "" if f.get("met") is None else ("yes" if f["met"] else "**no**")
            name = f["name"] + (f" ({f['note']})" if f.get("note") else "")
            median = _fmt(f["median"], f["unit"])
            if f.get("met") is False and f.get("target") is not None and median == _fmt(f["target"], f["unit"]):
                median = f"{f['median']:.4f}".rstrip("0") + (f["unit"] if f["unit"] == "x" else f" {f['unit']}")
            lines.append(f"| {run['name']} | {name} | {median} | {spread(f)} | {target} | {met} |")
    return "\n".join(lines) + "\n"


def merged(old: dict[str, Any], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``runs`` in place of the same benchmarks' runs of the earlier results ``old``; each kept run
    keeps the date and commit it was measured at."""
    fresh = {r["name"] for r in runs}
    order = [b[0] for b in BENCHES]
    kept = []
    for run in old["runs"]:
        if run["name"] in fresh:
            continue
        if "measured" not in run:  # written before runs carried their own
            before = old["machine"].get("earlier_run") or {}
            source = before if run["name"] in before.get("kept", ()) else old["machine"]
            run = {**run, "measured": {"date": source["date"], "commit": source["commit"]}}
        kept.append(run)
    return sorted(kept + runs, key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated benchmark names: " + ",".join(b[0] for b in BENCHES))
    parser.add_argument("--quick", action="store_true", help="fewer repeats, shorter runs")
    parser.add_argument("--out", default=None,
                        help="output stem (.md and .json are added; default: benchmarks/results, "
                             "or benchmarks/results/quick with --quick)")
    parser.add_argument("--update", action="store_true",
                        help="keep the other benchmarks' rows of an earlier run's JSON (re-run some, keep one table)")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    if only and (unknown := only - {b[0] for b in BENCHES}):
        parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")
    out = Path(args.out) if args.out else QUICK if args.quick else COMMITTED
    if args.quick and out.resolve() == COMMITTED:
        parser.error("a --quick run never writes the committed benchmarks/results.md and .json; "
                     "leave out --out (it writes benchmarks/results/quick.*) or give another stem")
    logs = Path(str(out) + ".logs")
    logs.mkdir(parents=True, exist_ok=True)
    info = machine()
    runs = []
    for name, script, full, quick, needs, timeout in BENCHES:
        if only is not None and name not in only:
            continue
        if not (HERE / script).exists():
            runs.append({"name": name, "ok": False, "error": f"{script} is missing", "figures": []})
            continue
        if missing := _missing(needs):
            runs.append({"name": name, "ok": False, "error": f"needs {', '.join(missing)}", "figures": []})
            continue
        print(f"== {name}: {script} {' '.join(quick if args.quick else full)}", flush=True)
        run = run_one(name, script, quick if args.quick else full, timeout, logs)
        run["measured"] = {"date": info["date"], "commit": info["commit"]}
        runs.append(run)
        for f in run["figures"]:
            print(f"   {f['name']}: {_fmt(f['median'], f['unit'])} ({spread(f)})"
                  + ("" if f.get("met") is None else f"  met={f['met']}"), flush=True)
        if not run["ok"]:
            print(f"   did not run: {run['error']}", flush=True)
    command = "python benchmarks/run_all.py" + (" --quick" if args.quick else "") + \
        (f" --only {args.only}" if args.only else "")
    earlier = Path(str(out) + ".json")
    if args.update and earlier.exists():
        old = json.loads(earlier.read_text())
        runs = merged(old, runs)
        command = f"{old['command']}; then {command} --update"
    table = markdown(runs, info, command)
    Path(str(out) + ".md").write_text(table)
    Path(str(out) + ".json").write_text(json.dumps({"machine": info, "command": command, "runs": runs}, indent=2,
                                                   default=str))
    print()
    print(table)
    print(f"written to {out}.md and {out}.json")
    if out.resolve() == COMMITTED:
        print(f"docs/performance.md shows this table: paste {out}.md there whole (the README's headline rows "
              "are copied from it)")


if __name__ == "__main__":
    main()
