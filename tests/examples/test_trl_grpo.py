"""examples/trl_grpo.py: TRL's GRPOTrainer on openenv/Arithmetic-v0 through its rollout_func hook.

It needs TRL (the ``trl`` extra, in its own venv: ``.ci/trl.sh`` builds it and runs this file).
The first test runs the example as a user does (tiny model built offline, two optimizer steps).
An untrained model never writes a valid tool call, so every reward there is 0, and so are the
advantages, the loss and the update: that run shows the data path and that the steps run, not
learning. The second replaces only the sampling of tokens with a script that writes Hermes tool
calls (half the submissions wrong): TRL, the trainer's tokenizer and model, openenv_gym and the
Arithmetic server stay real, and what must hold is that the environment's replies are masked, its
rewards are TRL's rewards and they move the weights.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")
import torch  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def example():
    spec = importlib.util.spec_from_file_location("trl_grpo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_runs_two_optimizer_steps_end_to_end_as_the_readme_says(tmp_path):
    figures = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "2", "--batch-size", "4", "--group-size", "2",
                           "--max-turns", "3", "--max-turn-tokens", "24", "--json", str(figures)],
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(figures.read_text())
    steps = [log for log in run["log_history"] if "loss" in log]
    assert run["global_step"] == 2 and len(steps) == 2 and run["rollouts"] == 2
    for step in steps:
        assert np.isfinite(step["loss"]) and step["step_time"] > 0
        assert 0.0 <= step["rewards/env_reward/mean"] <= 1.0
        # Only the model's tokens count: 3 turns of at most 24, never the env's replies.
        assert 0 < step["completions/mean_length"] <= 72
    printed = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(printed) == 2 and all("loss" in line and "reward" in line and "step_time" in line for line in printed)
    assert "done: 2 optimizer steps, 2 rollouts of 4 episodes" in proc.stdout


def test_tool_calls_reach_the_env_and_its_rewards_drive_the_update(example, tmp_path, monkeypatch):
    rng = random.Random(7)

    def scripted(trainer, prompts, max_new_tokens):
        """Hermes tool calls in place of sampled tokens: calculator, then submit (wrong half the time)."""
        tok = trainer.processing_class
        ids = []
        for prompt in prompts:
            last = tok.decode(prompt).split("<|im_start|>")[-2]
            if last.startswith("tool\n"):
                answer = int(last.removeprefix("tool\n").split("<|im_end|>")[0]) + (rng.random() < 0.5)
                text = f'<tool_call>{{"name": "submit", "arguments": {{"answer": "{answer}"}}}}</tool_call>'
            else:
                expression = re.search(r"Compute (.+?)\. ", last).group(1)
                text = ('Let me compute. <tool_call>{"name": "calculator", "arguments": '
                        f'{{"expression": "{expression}"}}}}</tool_call>')
            ids.append(tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id])
        return ids, [[-1.0] * len(i) for i in ids]

    outputs = []
    play = example.EnvRollout.__call__

    def recorded(self, prompts, trainer):
        out = play(self, prompts, trainer)
        outputs.append((trainer.processing_class, out))
        return out

    models = []
    build = example.tiny_model

    def kept(tokenizer):
        model = build(tokenizer)
        models.append((model, {name: p.detach().clone() for name, p in model.named_parameters()}))
        return model

    monkeypatch.setattr(example, "generate", scripted)
    monkeypatch.setattr(example.EnvRollout, "__call__", recorded)
    monkeypatch.setattr(example, "tiny_model", kept)
    figures = tmp_path / "run.json"
    example.main(["--steps", "2", "--batch-size", "8", "--group-size", "4", "--json", str(figures)])
    steps = [log for log in json.loads(figures.read_text())["log_history"] if "loss" in log]
    assert len(outputs) == len(steps) == 2

    for (tok, out), step in zip(outputs, steps):
        rewards = out["env_reward"]
        assert sorted(set(rewards)) <= [0.0, 1.0]
        assert step["rewards/env_reward/mean"] == pytest.approx(np.mean(rewards))
        assert step["completions/mean_length"] == pytest.approx(np.mean([sum(m) for m in out["env_mask"]]))
        assert all(len(set(out["task_id"][g:g + 4])) == 1 for g in range(0, 8, 4))  # a group is one task
        for ids, mask, reward in zip(out["completion_ids"], out["env_mask"], rewards):
            model = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True)
            env = tok.decode([t for t, m in zip(ids, mask) if not m])
            assert model.startswith("Let me compute. <tool_call>") and '"name": "submit"' in model
            assert re.fullmatch(r"\n<\|im_start\|>tool\n-?\d+<\|im_end\|>\n<\|im_start\|>assistant\n", env), env
            submitted = int(re.search(r'"answer": "(-?\d+)"', model).group(1))
            assert (submitted == int(re.search(r"tool\n(-?\d+)", env).group(1))) == (reward == 1.0)
    mixed = [step for step in steps if 0 < step["rewards/env_reward/mean"] < 1]
    assert mixed and all(step["grad_norm"] > 0 for step in mixed)
    # A gradient is not yet an update (a zero learning rate, a frozen model): the weights must move.
    (model, before), = models
    changed = [name for name, p in model.named_parameters() if not torch.equal(before[name], p.detach())]
    assert changed, "two optimizer steps with differing rewards left every weight unchanged"
