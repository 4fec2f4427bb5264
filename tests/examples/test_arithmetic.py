"""The bundled Arithmetic example, played through gym.make like a user would."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import openenv_gym  # noqa: F401


def call(name, args):
    return {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": name, "arguments": json.dumps(args)}}]}


@pytest.fixture(scope="module")
def env():
    env = gym.make("openenv/Arithmetic-v0")
    yield env
    env.close()


def test_splits_hold_at_least_a_thousand_deterministic_tasks(env):
    base = env.unwrapped
    assert {s.name: s.type for s in base.splits()} == {"train": "train", "test": "test"}
    assert base.num_tasks("train") >= 1000 and base.num_tasks("test") >= 100
    assert base.task("train", 17) == base.task("train", 17)
    assert base.task("train", 17) != base.task("train", 18)


def test_a_multi_step_episode_with_the_calculator_is_rewarded(env):
    obs, info = env.reset(seed=5)
    task = env.unwrapped.task(info["split"], info["index"])
    assert task["question"] in obs[0]["content"] and task["answer"] not in obs[0]["content"].split(task["question"])[1]
    assert {t["function"]["name"] for t in info["tools"]} == {"calculator", "submit"}
    obs, reward, terminated, _, _ = env.step(call("calculator", {"expression": task["question"]}))
    assert obs[0]["content"] == task["answer"] and reward == 0.0 and not terminated
    obs, reward, terminated, _, info = env.step(call("submit", {"answer": obs[0]["content"]}))
    assert reward == 1.0 and terminated
    assert task["answer"] not in json.dumps(obs)  # the answer never leaks into observations


def test_bad_calculator_input_is_an_observation(env):
    env.reset(seed=1)
    obs, reward, terminated, _, _ = env.step(call("calculator", {"expression": "__import__('os')"}))
    assert obs[0]["content"].startswith("error") and not terminated


def test_turn_limit_truncates(env):
    env.reset(seed=2)
    for _ in range(7):
        assert env.step(call("calculator", {"expression": "1+1"}))[3] is False
    _, _, terminated, truncated, _ = env.step(call("calculator", {"expression": "1+1"}))
    assert truncated and not terminated
