"""Spaces: any Unicode text fits, structure is checked, samples are valid actions."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from openenv_gym.spaces import AssistantAction, Messages, sample_json_schema
from openenv_gym.wire import ToolSpec


@given(st.text())
def test_any_unicode_text_is_a_valid_observation_and_action(text):
    assert Messages().contains([{"role": "user", "content": text}])
    assert AssistantAction().contains(text)


@pytest.mark.parametrize("bad", [
    "not a list", [{"content": "no role"}], [{"role": "robot", "content": "x"}],
    [{"role": "tool", "content": "x"}], [{"role": "user", "content": 5}],
])
def test_malformed_observations_are_not_contained(bad):
    assert not Messages().contains(bad)


@pytest.mark.parametrize("bad", [
    {"role": ["assistant"]}, {"role": {"x": 1}}, {"role": np.array(["assistant", "user"])},
    {"content": [{"type": "text", "text": 5}]}, {"content": [{"type": ["text"]}]}, {"content": ["hi"]},
    {"tool_calls": [{"function": {"name": 5}}]}, {"tool_calls": "oops"}, {1, 2}, b"hi", None, 5,
], ids=repr)
def test_contains_answers_false_for_malformed_actions_instead_of_raising(bad):
    # An unhashable role used to raise TypeError from `role in frozenset`; an array role, ValueError.
    assert not AssistantAction().contains(bad)
    message = {"role": "assistant", **bad} if isinstance(bad, dict) and "role" not in bad else bad
    assert not Messages().contains([message])


class Inner(BaseModel):
    tag: str = Field(min_length=2, max_length=5)
    weight: float = Field(ge=0, le=1)


class Args(BaseModel):
    name: str
    count: int = Field(ge=1, le=9)
    mode: str = Field(json_schema_extra={"enum": ["fast", "slow"]})
    flags: list[bool] = []
    inner: Inner
    maybe: int | None = None


@settings(max_examples=200)
@given(st.integers(0, 2**32 - 1))
def test_schema_samples_validate_against_the_pydantic_model(seed):
    rng = np.random.default_rng(seed)
    value = sample_json_schema(Args.model_json_schema(), rng)
    Args.model_validate(value)  # raises if the sample breaks the schema


def test_action_samples_are_contained_and_call_known_tools():
    tools = [ToolSpec("submit", "answer", Args.model_json_schema()), ToolSpec("hint")]
    space = AssistantAction(tools, seed=3)
    seen = set()
    for _ in range(200):
        action = space.sample()
        assert space.contains(action)
        if isinstance(action, dict):
            fn = action["tool_calls"][0]["function"]
            seen.add(fn["name"])
            if fn["name"] == "submit":
                Args.model_validate(json.loads(fn["arguments"]))
    assert seen == {"submit", "hint"}


def test_same_seed_same_samples():
    tools = [ToolSpec("submit", "", Args.model_json_schema())]
    a, b = AssistantAction(tools, seed=7), AssistantAction(tools, seed=7)
    assert [a.sample() for _ in range(20)] == [b.sample() for _ in range(20)]


def test_batching_as_gymnasium_does():
    batched = gym.vector.utils.batch_space(Messages(), 4)
    assert isinstance(batched, gym.spaces.Tuple) and len(batched) == 4


def test_a_sample_of_an_env_with_tools_is_a_tool_call_as_the_readme_says():
    import openenv_gym  # noqa: F401

    env = gym.make("openenv/Arithmetic-v0")
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        samples = [env.action_space.sample() for _ in range(500)]
    finally:
        env.close()
    assert all(isinstance(a, dict) and a["tool_calls"][0]["function"]["name"] in ("calculator", "submit")
               for a in samples)


def test_text_is_sampled_without_tools_or_when_asked_for():
    assert all(isinstance(AssistantAction(seed=s).sample(), str) for s in range(20))
    tools = [ToolSpec("hint")]
    space = AssistantAction(tools, text_probability=0.5, seed=1)
    assert {type(space.sample()) for _ in range(200)} == {str, dict}
    with pytest.raises(ValueError, match="between 0 and 1"):
        AssistantAction(tools, text_probability=1.5)


def test_the_random_policy_still_writes_some_text():
    from openenv_gym.policies import RandomPolicy

    policy = RandomPolicy(seed=0)
    info = {"tools": [{"type": "function", "function": {"name": "hint", "parameters": {"type": "object"}}}]}
    policy.reset(0, [], info)
    actions = [policy.act_batch([0], [[]], [info])[0] for _ in range(300)]
    texts = sum(isinstance(a, str) for a in actions)
    assert 10 < texts < 60  # about 10 %
