"""Rollouts over vector envs, the rollout and bench commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import openenv_gym  # noqa: F401
from openenv_gym.rollout import collect


def test_collect_finishes_exactly_n_episodes_and_writes_them(tmp_path):
    out = tmp_path / "episodes.jsonl"
    summary = collect("openenv/Arithmetic-v0", 24, num_envs=6, seed=1, out=out, progress=False)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary.episodes == len(lines) == 24
    assert summary.steps == sum(len(r["rewards"]) for r in lines)
    for record in lines:
        assert record["messages"][0]["role"] == "user" and "Compute" in record["messages"][0]["content"]
        assert record["messages"][1]["role"] == "assistant"
        assert record["total_reward"] == sum(record["rewards"])
        assert record["terminated"] or record["truncated"]
        assert len(record["rewards"]) <= 8  # Arithmetic truncates after 8 turns
    assert summary.errors == 0 and summary.steps_per_sec > 0


def test_collect_with_one_sub_env_is_reproducible(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    collect("openenv/Arithmetic-v0", 6, num_envs=1, seed=5, out=a, progress=False)
    collect("openenv/Arithmetic-v0", 6, num_envs=1, seed=5, out=b, progress=False)
    assert a.read_text() == b.read_text()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "openenv_gym.cli", *args], capture_output=True, text=True,
                          timeout=300, env=os.environ.copy())


def test_rollout_command_with_an_openai_compatible_server(tmp_path):
    from openenv_gym.testing.openai_stub import OpenAIStub

    with OpenAIStub() as stub:
        done = _cli("rollout", "openenv/Arithmetic-v0", "--episodes", "12", "--num-envs", "4", "--policy", "openai",
                    "--base-url", stub.url, "--model", "stub", "--quiet", "--out", str(tmp_path / "o.jsonl"))
    assert done.returncode == 0, done.stderr
    assert "mean reward  1.0000" in done.stdout  # the stub solves arithmetic with the calculator
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 12


def test_bench_command_prints_a_table_and_writes_a_plot(tmp_path):
    plot, data = tmp_path / "bench.png", tmp_path / "bench.json"
    done = _cli("bench", "openenv/Arithmetic-v0", "--num-envs", "1,2", "--backend", "concurrent,sync",
                "--rounds", "3", "--plot", str(plot), "--json", str(data))
    assert done.returncode == 0, done.stderr
    assert "concurrent" in done.stdout and "sync" in done.stdout and "failed" not in done.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(data.read_text())
    assert {(r["backend"], r["num_envs"]) for r in rows} == {("concurrent", 1), ("sync", 1), ("concurrent", 2), ("sync", 2)}
    assert all(r["steps_per_sec"] > 0 for r in rows)
