"""examples/trl_env_factory.py: TRL's GRPOTrainer on openenv_gym envs through ``environment_factory``.

It needs TRL (the ``trl`` extra, in its own venv: ``.ci/trl.sh`` builds it and runs this file).
The first test runs the example as the README says. An untrained model never writes a valid tool
call or the right sum, so the others replace only the sampling of tokens with a script
(``GRPOTrainer._generate_single_turn``) that writes Qwen2.5 tool calls and answers, right in one
rollout of each group and wrong in the other: TRL's tool loop, its parsing, its reward sources,
the tokenizer and model, openenv_gym and the envs (the Arithmetic ORS server, the Verifiers sums
env) stay real. What must hold, on each path (tools, plain text, a mixture of both): a right
answer earns reward 1 and a wrong one 0, from exactly one reward source per rollout, and those
rewards move the weights.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")
import torch  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_env_factory.py"
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def example():
    spec = importlib.util.spec_from_file_location("trl_env_factory_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_runs_two_optimizer_steps_on_a_mixture_as_the_readme_says(tmp_path):
    figures = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--env", "mixture", "--steps", "2", "--json", str(figures)],
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(figures.read_text())
    steps = [log for log in run["log_history"] if "loss" in log]
    assert run["global_step"] == 2 and len(steps) == 2
    for step in steps:
        assert np.isfinite(step["loss"]) and step["step_time"] > 0
        # Each rollout is scored by its env's one source: the Arithmetic class's get_reward or env_reward.
        assert {"rewards/Arithmetic/mean", "rewards/env_reward/mean"} <= set(step)
        assert 0.0 <= step["reward"] <= 1.0
    printed = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(printed) == 2 and "done: 2 optimizer steps on mixture" in proc.stdout


def _scripted(trainer):
    """Qwen2.5-format completions in place of sampled ones: right in even rollouts, wrong in odd."""
    tok = trainer.processing_class
    end = tok.eos_token

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        ids = []
        for k, prompt in enumerate(prompt_ids):
            text = tok.decode(prompt)
            last = text.rsplit("<|im_start|>", 2)[-2]  # the turn before the assistant's
            result = re.search(r"<tool_response>\n(.*?)\n</tool_response>", last, re.S)
            if result is not None and result.group(1) not in ("Correct!", "Incorrect."):
                reply = ('<tool_call>\n{"name": "submit", "arguments": {"answer": "' + result.group(1)
                         + '"}}\n</tool_call>')
            elif result is not None:
                reply = "Done."
            elif (task := re.search(r"Compute (.+?)\. You may", last)) is not None:
                expression = task.group(1) + (" + 1" if k % 2 else "")  # a wrong rollout miscalculates
                reply = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + expression
                         + '"}}\n</tool_call>')
            elif (task := re.search(r"What is (\d+) \+ (\d+)\?", last)) is not None:
                reply = str(int(task.group(1)) + int(task.group(2)) + k % 2)
            else:
                raise AssertionError(f"unexpected prompt: {last!r}")
            ids.append(tok(reply + end, add_special_tokens=False).input_ids)
        return ids, None

    return generate


def _expected(completion):
    """1.0 if the scripted rollout ``completion`` (TRL's messages) answered right, else 0.0."""
    calls = [c["function"] for m in completion if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    if calls:  # Arithmetic: right unless the calculator was asked the wrong sum
        assert [c["name"] for c in calls] == ["calculator", "submit"], calls
        return 0.0 if calls[0]["arguments"]["expression"].endswith(" + 1") else 1.0
    return None  # Sums: judged from the prompt in the test


@pytest.mark.parametrize("env", ["arithmetic", "sums", "mixture"])
def test_right_answers_earn_one_wrong_ones_zero_and_the_rewards_move_the_weights(example, env, tmp_path):
    args = example.parser().parse_args(["--env", env, "--steps", "2", "--batch-size", "4", "--group-size", "2",
                                        "--max-completion-length", "160", "--learning-rate", "1e-3"])
    spec, model, tokenizer = example.build(args)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    scored = []
    with spec:
        trainer = example.trainer_for(spec, model, tokenizer, args, str(tmp_path))
        trainer._generate_single_turn = _scripted(trainer)
        calculate = trainer._calculate_rewards

        def recorded(inputs, prompts, completions, completion_ids_list):
            rewards = calculate(inputs, prompts, completions, completion_ids_list)
            scored.append((inputs, prompts, completions, rewards.cpu().numpy(), list(trainer.reward_func_names)))
            return rewards

        trainer._calculate_rewards = recorded
        trainer.train()

    assert trainer.state.global_step == 2 and len(scored) == 2
    seen = set()
    for inputs, prompts, completions, rewards, names in scored:
        for row, prompt, completion, per_source in zip(inputs, prompts, completions, rewards):
            expected = _expected(completion)
            if expected is None:
                question = re.search(r"What is (\d+) \+ (\d+)\?", prompt[-1]["content"])
                expected = 1.0 if completion[-1]["content"].strip() == str(int(question[1]) + int(question[2])) \
                    else 0.0
                source = "env_reward"
            else:
                source = "Arithmetic"
            scored_by = [n for n, r in zip(names, per_source) if not np.isnan(r)]
            assert scored_by == [source], (scored_by, names)  # one source per rollout: never counted twice
            assert per_source[names.index(source)] == expected
            seen.add((row.get("environment", env), expected))
    kinds = {"arithmetic": {"openenv/Arithmetic-v0"}, "sums": {"openenv/Sums-v0"},
             "mixture": {"openenv/Arithmetic-v0", "openenv/Sums-v0"}}[env]
    # Every rollout group had a right and a wrong answer, so every step had something to learn from.
    assert {r for _, r in seen} == {0.0, 1.0}
    assert {e for e, _ in seen} <= kinds | {env}
    steps = [log for log in trainer.state.log_history if "loss" in log]
    assert len(steps) == 2 and all(step["grad_norm"] > 0 and step["reward_std"] > 0 for step in steps)
    changed = [name for name, p in model.named_parameters() if not torch.equal(before[name], p.detach())]
    assert changed, "two optimizer steps with differing rewards left every weight unchanged"
