"""examples/serve_openenv_rollout.py, run as a user runs it: a Verifiers env served over OpenEnv's
protocol and played by OpenEnv's client in a TRL-style rollout function, offline (the stub model)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers")
pytest.importorskip("openenv")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "serve_openenv_rollout.py"


def test_the_rollout_function_returns_trl_samples_with_the_envs_rewards():
    # A stub that is usually wrong: episodes of one to three turns, and both rewards.
    done = subprocess.run([sys.executable, str(SCRIPT), "--prompts", "12", "--miss", "0.9", "--seed", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"train/(\d+): reward ([\d.]+) in (\d) turn\(s\), (\d+) prompt tokens, (\d+) completion tokens "
                      r"\((\d+) the model's\)", done.stdout)
    assert [int(r[0]) for r in rows] == list(range(12))
    rewards = [float(r[1]) for r in rows]
    assert set(rewards) == {0.0, 1.0}
    for _, reward, turns, prompt, completion, model in rows:
        turns, completion, model = int(turns), int(completion), int(model)
        assert int(prompt) > 0 and 0 < model <= completion
        assert (model < completion) == (turns > 1)  # the env's replies sit between turns, masked out
        assert float(reward) == 1.0 or turns == 3  # a failed episode used every turn
    mean = sum(rewards) / len(rewards)
    assert f"batch: 12 samples, mean reward {mean:.3f}" in done.stdout
