"""Soak: many concurrent sub-envs for a long time, watching for leaks, errors and leftovers.

Drives ``openenv/Arithmetic-v0`` with :class:`~openenv_gym.vector.ConcurrentVectorEnv`
(first-ready ``send``/``recv``, a scripted policy that uses the calculator, then submits a right
or a wrong answer, so episodes end and autoreset all the time). Every ``--sample`` seconds it
records this process's RSS, open file descriptors, threads and live descendant processes
(the local server included). It prints:

* growth after warm-up: the last sample against the first one taken after ``--warmup`` seconds
  (target: RSS under 5 %, fds and threads flat);
* errors: ``info["error"]`` entries seen (target 0);
* leftovers after ``close()``: descendant processes still alive and ``openenv-gym`` temp entries
  still present (target 0 and 0).

Then the same again with every sub-env recording its episodes (``env_wrappers=[partial(
RecordEpisodes, path=...)]``, all to one path, rotating by size with ``--max-bytes``): besides the
figures above, every episode that ended must be in the files afterwards (target: 0 lost records,
0 ``record_error`` entries) and no file may outgrow ``--max-bytes``.

Usage::

    python benchmarks/soak.py                       # 1,024 sub-envs for 10 minutes, then 10 recording
    python benchmarks/soak.py --minutes 1 --num-envs 256 --recorder-minutes 0 --json soak.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym

import openenv_gym  # noqa: F401  (registers the ids)
from openenv_gym.processes import descendants, rss_kib
from openenv_gym.records import iter_records
from openenv_gym.wrappers import RecordEpisodes


def sample() -> dict[str, Any]:
    kids = descendants()
    rss = rss_kib(os.getpid())
    kids_rss = sum(rss_kib(pid) for pid in kids)
    return {"t": time.monotonic(), "rss_mib": rss / 1024, "children_rss_mib": kids_rss / 1024,
            "fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count(),
            "children": len(kids)}


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _act(obs: list[dict[str, Any]], turn: int) -> dict[str, Any]:
    if turn == 0:
        text = next((m["content"] for m in obs if m.get("role") == "user"), "")
        expr = re.search(r"[-+*/() 0-9]+[0-9)]", text if isinstance(text, str) else "")
        return _call("calculator", {"expression": expr.group(0).strip() if expr else "1+1"})
    last = obs[-1].get("content", "") if obs else ""
    answer = str(last).strip() if turn % 2 else "wrong"
    return _call("submit", {"answer": answer})


def count_records(path: Path, max_bytes: int) -> dict[str, int]:
    """Records in ``path`` and its rotated backups, files over ``max_bytes`` (beyond a single
    line), and lines that are not whole records."""
    files = [path, *path.parent.glob(path.name + ".*")]
    records = oversized = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for f in files:
            records += sum(1 for _ in iter_records(f))
            size = f.stat().st_size
            if size > max_bytes and f.read_bytes().count(b"\n") > 1:
                oversized += 1
        damaged = [str(w.message) for w in caught]
    return {"files": len(files), "records": records, "oversized_files": oversized, "damaged_lines": len(damaged)}


def run(num_envs: int, seconds: float, warmup: float, every: float, batch: int,
        max_bytes: int | None = None) -> dict[str, Any]:
    """One soak; with ``max_bytes``, every sub-env records its episodes to one path rotating at it."""
    # A private temp dir: what is left in it after close is ours, not another process's.
    outer = os.environ.get("TMPDIR")
    private = tempfile.mkdtemp(prefix="soak-")
    os.environ["TMPDIR"], tempfile.tempdir = private, None
    tmp_before: set[str] = set()
    records_dir = Path(tempfile.mkdtemp(prefix="soak-records-", dir=os.path.dirname(private))) if max_bytes else None
    wrappers = None if records_dir is None else [
        functools.partial(RecordEpisodes, path=records_dir / "episodes.jsonl", max_bytes=max_bytes, backups=100_000)]
    envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=num_envs, env_wrappers=wrappers)
    samples: list[dict[str, Any]] = []
    counts = {"steps": 0, "errors": 0, "episodes": 0, "record_errors": 0}
    error_kinds: dict[str, int] = {}
    turns = [0] * num_envs

    def take(b: Any) -> list[dict[str, Any]]:
        """Count what a batch says; the next action of each of its sub-envs."""
        counts["steps"] += len(b.env_ids)
        actions = []
        for k, i in enumerate(b.env_ids.tolist()):
            if "error" in b.infos and b.infos.get("_error", [False] * len(b.env_ids))[k]:
                counts["errors"] += 1
                kind = b.infos["error"]["type"][k]
                error_kinds[kind] = error_kinds.get(kind, 0) + 1
            if "record_error" in b.infos and b.infos.get("_record_error", [True] * len(b.env_ids))[k]:
                counts["record_errors"] += 1
            if b.terminations[k] or b.truncations[k]:
                counts["episodes"] += 1
                turns[i] = 0  # NEXT_STEP: this action is ignored, the sub-env resets
            else:
                turns[i] += 1
            actions.append(_act(b.obs[k], turns[i]))
        return actions

    try:
        obs, _ = envs.reset(seed=0)
        envs.send([_act(o, 0) for o in obs])
        start = time.monotonic()
        next_sample = start
        while time.monotonic() - start < seconds:
            b = envs.recv(batch_size=batch, timeout=120)
            envs.send(take(b), b.env_ids)
            if time.monotonic() >= next_sample:
                samples.append(sample())
                next_sample += every
        take(envs.recv(batch_size=num_envs, timeout=120))  # every step in flight, so each ended episode is counted
        elapsed = time.monotonic() - start
    finally:
        before_close = descendants()
        envs.close()
    time.sleep(1.0)
    left = [p for p in before_close if p in descendants()]
    tmp_after = {p.name for p in Path(private).iterdir()} - tmp_before
    if not tmp_after:
        os.rmdir(private)
    if outer is None:  # the next run makes a private dir of its own beside this one
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = outer
    tempfile.tempdir = None
    warm = [s for s in samples if s["t"] - samples[0]["t"] >= warmup] or samples
    first, last = warm[0], samples[-1]
    growth = {k: (last[k] - first[k]) / first[k] if first[k] else 0.0
              for k in ("rss_mib", "children_rss_mib", "fds", "threads")}
    steps, episodes, errors, record_errors = (counts[k] for k in ("steps", "episodes", "errors", "record_errors"))
    result = {"num_envs": num_envs, "seconds": elapsed, "env_steps": steps, "env_steps_per_s": steps / elapsed,
              "episodes": episodes, "errors": errors, "error_kinds": error_kinds,
              "after_warmup": first, "last": last, "growth": growth,
              "leftover_processes": len(left), "leftover_temp_entries": sorted(tmp_after), "samples": samples}
    if records_dir is not None:
        assert max_bytes is not None
        try:
            found = count_records(records_dir / "episodes.jsonl", max_bytes)
        finally:
            shutil.rmtree(records_dir, ignore_errors=True)
        result.update(found, record_errors=record_errors, max_bytes=max_bytes,
                      lost_records=episodes - found["records"])
    return result


def report(r: dict[str, Any]) -> None:
    g, a, z = r["growth"], r["after_warmup"], r["last"]
    print(f"soak: {r['num_envs']} sub-envs, {r['seconds']:.0f} s, {r['env_steps']} env-steps "
          f"({r['env_steps_per_s']:.0f}/s), {r['episodes']} episodes")
    print(f"  RSS          {a['rss_mib']:.1f} -> {z['rss_mib']:.1f} MiB ({g['rss_mib']:+.1%} after warm-up; target < 5 %)")
    print(f"  server RSS   {a['children_rss_mib']:.1f} -> {z['children_rss_mib']:.1f} MiB ({g['children_rss_mib']:+.1%})")
    print(f"  fds          {a['fds']} -> {z['fds']}   threads {a['threads']} -> {z['threads']}   "
          f"child processes {a['children']} -> {z['children']}")
    print(f"  errors       {r['errors']} {r['error_kinds'] or ''} (target 0)")
    print(f"  after close  {r['leftover_processes']} processes, {len(r['leftover_temp_entries'])} temp entries (target 0, 0)")
    if "records" in r:
        print(f"  records      {r['records']} in {r['files']} files for {r['episodes']} episodes: {r['lost_records']} lost, "
              f"{r['record_errors']} record errors, {r['damaged_lines']} damaged lines, {r['oversized_files']} files "
              f"over max_bytes={r['max_bytes']} (target 0 each)")


def ok(r: dict[str, Any]) -> bool:
    good = r["growth"]["rss_mib"] < 0.05 and r["errors"] == 0 and not r["leftover_processes"] \
        and not r["leftover_temp_entries"]
    if "records" in r:
        good = good and r["lost_records"] == 0 and r["record_errors"] == 0 and r["damaged_lines"] == 0 \
            and r["oversized_files"] == 0
    return good


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=1024, help="concurrent sub-envs (default 1024)")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to run (default 10; 0 skips it)")
    parser.add_argument("--recorder-minutes", type=float, default=None,
                        help="how long the recording run lasts (default: --minutes; 0 skips it)")
    parser.add_argument("--max-bytes", type=int, default=8 * 2**20,
                        help="the recording run's rotation size (default 8 MiB)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds before the baseline sample (default: a fifth of the run, at most 60)")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples (default 5)")
    parser.add_argument("--batch", type=int, default=None, help="recv batch size (default num_envs // 4)")
    parser.add_argument("--json", default=None, help="write every sample and the summary here")
    args = parser.parse_args(argv)
    batch = args.batch or max(1, args.num_envs // 4)

    def soak(minutes: float, max_bytes: int | None = None) -> dict[str, Any]:
        seconds = minutes * 60
        warmup = args.warmup if args.warmup is not None else min(60.0, seconds / 5)
        return run(args.num_envs, seconds, warmup, args.sample, batch, max_bytes)

    r = rec = None
    if args.minutes > 0:
        r = soak(args.minutes)
        report(r)
    recorder_minutes = args.minutes if args.recorder_minutes is None else args.recorder_minutes
    if recorder_minutes > 0:
        rec = soak(recorder_minutes, args.max_bytes)
        print("with RecordEpisodes on every sub-env, one path, rotating:")
        report(rec)
    from figures import figure, write

    def figures_of(run: dict[str, Any], what: str) -> list[dict[str, Any]]:
        note = f"{run['num_envs']} sub-envs for {run['seconds'] / 60:.0f} min{what}"
        found = [
            figure("soak: RSS growth after warm-up", [100 * run["growth"]["rss_mib"]], unit="%", target=5.0,
                   higher_is_better=False, note=note),
            figure("soak: errors", [run["errors"]], unit="", target=0, higher_is_better=False, note=note),
            figure("soak: processes and temp entries left after close",
                   [run["leftover_processes"] + len(run["leftover_temp_entries"])], unit="", target=0,
                   higher_is_better=False, note=note),
        ]
        if "records" in run:
            found.append(figure("soak: episodes not found in the record files", [run["lost_records"]], unit="",
                                target=0, higher_is_better=False,
                                note=f"{note}; {run['records']} records in {run['files']} files"))
        return found

    recording = f", RecordEpisodes on each, one path rotating at {args.max_bytes // 2**20} MiB"
    write(args.json, (figures_of(r, "") if r else []) + (figures_of(rec, recording) if rec else []),
          {"plain": r, "recording": rec})
    return 0 if all(ok(x) for x in (r, rec) if x is not None) else 1


if __name__ == "__main__":
    sys.exit(main())
