"""examples/grpo_loop.py, run as a user runs it (a subprocess against the bundled stub): what it
prints and writes must be the training data a GRPO step needs, with the numbers that must hold."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "grpo_loop.py"


def run_loop(tmp_path: Path, *args: str) -> tuple[str, dict, list[dict]]:
    out, figures = tmp_path / "samples.jsonl", tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out), "--json", str(figures)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    return proc.stdout, json.loads(figures.read_text()), samples


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    # 8 sub-envs for 3 groups of 4 per iteration: sub-envs play several episodes each.
    return run_loop(tmp_path_factory.mktemp("mixed"), "--iterations", "2", "--groups", "3", "--group-size", "4",
                    "--num-envs", "8", "--miss", "0.5", "--seed", "3")


def test_each_iteration_plays_whole_groups_and_prints_its_figures(mixed):
    stdout, figures, samples = mixed
    assert figures["group_size"] == 4 and len(figures["iterations"]) == 2
    for it in figures["iterations"]:
        assert it["episodes"] == 12 and it["groups"] == 3 and it["dropped_groups"] == 0 and it["errors"] == 0
        assert it["samples"] == it["assistant_turns"] >= 2 * it["episodes"]  # calculator, then submit
        assert it["prefix_breaks"] == 0
        line = next(ln for ln in stdout.splitlines() if ln.startswith(f"iter {it['iteration']}:"))
        assert f"mean reward {it['mean_reward']:.3f}" in line and f"pass@4 {it['pass@4']:.3f}" in line
        assert f"{it['samples']} samples ({it['tokens']} tokens)" in line
    assert f"done: 2 iterations, {len(samples)} training samples" in stdout
    assert len(samples) == sum(it["samples"] for it in figures["iterations"])


def test_advantages_are_group_normalised_rewards(mixed):
    _, figures, samples = mixed
    episodes = {s["episode"]: s for s in samples}
    groups: dict[str, list[dict]] = defaultdict(list)
    for episode in episodes.values():
        groups[episode["group"]].append(episode)
    assert len(groups) == 6 and all(len(members) == 4 for members in groups.values())
    mixed_groups = 0
    for members in groups.values():
        assert len({m["task_id"] for m in members}) == 1  # a group is one task
        r = np.array([m["reward"] for m in members])
        expected = (r - r.mean()) / (r.std() + 1e-6)
        np.testing.assert_allclose([m["advantage"] for m in members], expected, atol=1e-9)
        assert abs(sum(m["advantage"] for m in members)) < 1e-6
        if r.min() != r.max():
            mixed_groups += 1
            assert all((m["advantage"] > 0) == (m["reward"] == 1.0) for m in members)
    assert mixed_groups >= 1  # with half the submissions wrong, some group has signal
    for it in figures["iterations"]:
        rewards = [e["reward"] for e in episodes.values() if e["episode"].startswith(f"{it['iteration']}:")]
        assert it["mean_reward"] == pytest.approx(np.mean(rewards))
        by_group = defaultdict(list)
        for e in episodes.values():
            if e["episode"].startswith(f"{it['iteration']}:"):
                by_group[e["group"]].append(e["reward"])
        assert it["pass@4"] == pytest.approx(np.mean([max(g) > 0 for g in by_group.values()]))


def test_samples_carry_the_tokens_the_model_saw_and_produced(mixed):
    _, _, samples = mixed
    by_episode: dict[str, list[dict]] = defaultdict(list)
    for s in samples:
        by_episode[s["episode"]].append(s)
        assert len(s["logprobs"]) == len(s["completion_ids"]) > 0
        assert "Compute " in bytes(s["prompt_ids"]).decode()  # the stub's ids are UTF-8 bytes
    for turns in by_episode.values():
        assert len({t["advantage"] for t in turns}) == 1
        for before, after in zip(turns, turns[1:]):  # each prompt extends the last prompt + completion
            seen = before["prompt_ids"] + before["completion_ids"]
            assert after["prompt_ids"][:len(seen)] == seen
        last = bytes(turns[-1]["completion_ids"]).decode()
        assert '"name": "submit"' in last


def test_drop_equal_reports_groups_without_signal_and_feeds_nothing_from_them(tmp_path):
    stdout, figures, samples = run_loop(tmp_path, "--iterations", "1", "--groups", "2", "--group-size", "2",
                                        "--miss", "0", "--drop-equal")
    (it,) = figures["iterations"]
    assert it["groups"] == 2 and it["dropped_groups"] == 2 and it["mean_reward"] == 1.0
    assert it["samples"] == 0 and samples == []
    assert "2 groups (2 dropped)" in stdout
