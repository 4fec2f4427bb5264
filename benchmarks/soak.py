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

Usage::

    python benchmarks/soak.py                       # 1,024 sub-envs for 10 minutes
    python benchmarks/soak.py --minutes 1 --num-envs 256 --json soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import openenv_gym  # noqa: F401  (registers the ids)
from openenv_gym.processes import descendants, rss_kib


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


def run(num_envs: int, seconds: float, warmup: float, every: float, batch: int) -> dict[str, Any]:
    # A private temp dir: what is left in it after close is ours, not another process's.
    private = tempfile.mkdtemp(prefix="soak-")
    os.environ["TMPDIR"], tempfile.tempdir = private, None
    tmp_before: set[str] = set()
    envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=num_envs)
    samples: list[dict[str, Any]] = []
    steps = errors = episodes = 0
    error_kinds: dict[str, int] = {}
    turns = [0] * num_envs
    try:
        obs, _ = envs.reset(seed=0)
        envs.send([_act(o, 0) for o in obs])
        start = time.monotonic()
        next_sample = start
        while time.monotonic() - start < seconds:
            b = envs.recv(batch_size=batch, timeout=120)
            steps += len(b.env_ids)
            actions = []
            for k, i in enumerate(b.env_ids.tolist()):
                if "error" in b.infos and b.infos.get("_error", [False] * len(b.env_ids))[k]:
                    errors += 1
                    kind = b.infos["error"]["type"][k]
                    error_kinds[kind] = error_kinds.get(kind, 0) + 1
                if b.terminations[k] or b.truncations[k]:
                    episodes += 1
                    turns[i] = 0  # NEXT_STEP: this action is ignored, the sub-env resets
                else:
                    turns[i] += 1
                actions.append(_act(b.obs[k], turns[i]))
            envs.send(actions, b.env_ids)
            if time.monotonic() >= next_sample:
                samples.append(sample())
                next_sample += every
        elapsed = time.monotonic() - start
    finally:
        before_close = descendants()
        envs.close()
    time.sleep(1.0)
    left = [p for p in before_close if p in descendants()]
    tmp_after = {p.name for p in Path(private).iterdir()} - tmp_before
    if not tmp_after:
        os.rmdir(private)
    warm = [s for s in samples if s["t"] - samples[0]["t"] >= warmup] or samples
    first, last = warm[0], samples[-1]
    growth = {k: (last[k] - first[k]) / first[k] if first[k] else 0.0
              for k in ("rss_mib", "children_rss_mib", "fds", "threads")}
    return {"num_envs": num_envs, "seconds": elapsed, "env_steps": steps, "env_steps_per_s": steps / elapsed,
            "episodes": episodes, "errors": errors, "error_kinds": error_kinds,
            "after_warmup": first, "last": last, "growth": growth,
            "leftover_processes": len(left), "leftover_temp_entries": sorted(tmp_after), "samples": samples}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=1024, help="concurrent sub-envs (default 1024)")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to run (default 10)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds before the baseline sample (default: a fifth of the run, at most 60)")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples (default 5)")
    parser.add_argument("--batch", type=int, default=None, help="recv batch size (default num_envs // 4)")
    parser.add_argument("--json", default=None, help="write every sample and the summary here")
    args = parser.parse_args(argv)
    seconds = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else min(60.0, seconds / 5)
    r = run(args.num_envs, seconds, warmup, args.sample, args.batch or max(1, args.num_envs // 4))
    g, a, z = r["growth"], r["after_warmup"], r["last"]
    print(f"soak: {r['num_envs']} sub-envs, {r['seconds']:.0f} s, {r['env_steps']} env-steps "
          f"({r['env_steps_per_s']:.0f}/s), {r['episodes']} episodes")
    print(f"  RSS          {a['rss_mib']:.1f} -> {z['rss_mib']:.1f} MiB ({g['rss_mib']:+.1%} after warm-up; target < 5 %)")
    print(f"  server RSS   {a['children_rss_mib']:.1f} -> {z['children_rss_mib']:.1f} MiB ({g['children_rss_mib']:+.1%})")
    print(f"  fds          {a['fds']} -> {z['fds']}   threads {a['threads']} -> {z['threads']}   "
          f"child processes {a['children']} -> {z['children']}")
    print(f"  errors       {r['errors']} {r['error_kinds'] or ''} (target 0)")
    print(f"  after close  {r['leftover_processes']} processes, {len(r['leftover_temp_entries'])} temp entries (target 0, 0)")
    from figures import figure, write

    note = f"{r['num_envs']} sub-envs for {r['seconds'] / 60:.0f} min"
    write(args.json, [
        figure("soak: RSS growth after warm-up", [100 * g["rss_mib"]], unit="%", target=5.0, higher_is_better=False,
               note=note),
        figure("soak: errors", [r["errors"]], unit="", target=0, higher_is_better=False, note=note),
        figure("soak: processes and temp entries left after close",
               [r["leftover_processes"] + len(r["leftover_temp_entries"])], unit="", target=0,
               higher_is_better=False, note=note),
    ], r)
    ok = g["rss_mib"] < 0.05 and r["errors"] == 0 and not r["leftover_processes"] and not r["leftover_temp_entries"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
