"""Fill the disk under RecordEpisodes for real, then free it; print what happened as one JSON line.

Run by test_record_files.py in a process of its own, because the limits it sets are per process:

    python full_disk.py rlimit DIR   a file size limit (RLIMIT_FSIZE) just above the file: EFBIG
    python full_disk.py tmpfs DIR    DIR is a small tmpfs, filled up by a file beside: ENOSPC

Episodes are played over the real Arithmetic env (a calculator call, then a wrong submission)
until recording one fails, then two more after the space is freed again. What is printed is every
step's result as the caller saw it, the ``record_error`` entries, the warnings, and what
``read_records`` reads back at the end.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import warnings

import gymnasium as gym

import openenv_gym  # noqa: F401  (registers openenv/Arithmetic-v0)
from openenv_gym.records import read_records
from openenv_gym.wrappers import RecordEpisodes


def call(name: str, **args: str) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": name, "arguments": json.dumps(args)}}]}


def fill(filler: str) -> None:
    """Write ``filler`` until the file system is full."""
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def main(mode: str, folder: str) -> None:
    path = os.path.join(folder, "episodes.jsonl")
    filler = os.path.join(folder, "filler")
    env = RecordEpisodes(gym.make("openenv/Arithmetic-v0"), path)
    steps, errors, written = [], [], 0

    def episode(seed: int) -> None:
        nonlocal written
        env.reset(seed=seed)
        for action in (call("calculator", expression="6*7"), call("submit", answer="-1")):
            obs, reward, terminated, truncated, info = env.step(action)
            steps.append({"obs": obs, "reward": reward, "terminated": terminated, "truncated": truncated})
            if "record_error" in info:
                errors.append(info["record_error"])
        written = env.episodes

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        episode(0)
        if mode == "rlimit":  # room for two and a half more records: the next but two is torn
            record = os.path.getsize(path)
            soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (record * 3 + record // 2, hard))
        else:
            fill(filler)
        seed = 1
        while not errors and seed < 50:
            episode(seed)
            seed += 1
        before_freeing = read_records(path)
        full_size, ends_whole = os.path.getsize(path), open(path, "rb").read().endswith(b"\n")
        if mode == "rlimit":
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, hard))
        else:
            os.remove(filler)
        for more in range(2):
            episode(100 + more)
        records = read_records(path)
    env.close()
    print(json.dumps({
        "steps": steps, "record_errors": errors, "episodes": seed + 2, "written": written,
        "records_before_freeing": len(before_freeing), "size_when_full": full_size, "ends_whole": ends_whole,
        "records": [r.seed for r in records], "warnings": [str(w.message) for w in caught],
    }))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
