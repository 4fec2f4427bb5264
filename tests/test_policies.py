"""Policies: seeded random actions per env, and OpenAIPolicy against the OpenAI-compatible stub."""

from __future__ import annotations

import json

import gymnasium as gym
import httpx
import pytest
from pydantic import BaseModel, Field

import openenv_gym  # noqa: F401
from openenv_gym.errors import BackendUnavailable, ConfigurationError
from openenv_gym.policies import OpenAIPolicy, RandomPolicy, tools_from_info
from openenv_gym.testing.openai_stub import OpenAIStub
from openenv_gym.wire import ToolSpec


class Args(BaseModel):
    answer: str
    n: int = Field(ge=0, le=5)


INFO = {"tools": [ToolSpec("submit", "", Args.model_json_schema()).to_openai(), ToolSpec("hint").to_openai()]}
OBS = [{"role": "user", "content": "hi"}]


def test_random_policy_is_reproducible_per_env_whatever_the_batch_order():
    a, b = RandomPolicy(seed=3), RandomPolicy(seed=3)
    for p in (a, b):
        for i in range(3):
            p.reset(i, OBS, INFO)
    seq_a = [a.act_batch([0, 1, 2], [OBS] * 3, [{}] * 3) for _ in range(5)]
    seq_b = [[*reversed(b.act_batch([2, 1, 0], [OBS] * 3, [{}] * 3))] for _ in range(5)]
    assert seq_a == seq_b
    assert seq_a[0][0] != seq_a[0][1] or seq_a[1][0] != seq_a[1][1]  # envs draw different streams


def test_random_actions_call_known_tools_with_valid_arguments():
    policy = RandomPolicy(seed=0)
    policy.reset(0, OBS, INFO)
    names = set()
    for _ in range(100):
        (action,) = policy.act_batch([0], [OBS], [{}])
        if isinstance(action, dict):
            fn = action["tool_calls"][0]["function"]
            names.add(fn["name"])
            if fn["name"] == "submit":
                Args.model_validate(json.loads(fn["arguments"]))
    assert names == {"submit", "hint"}
    assert [t.name for t in tools_from_info(INFO)] == ["submit", "hint"]


def play(policy: OpenAIPolicy, env: gym.Env, seed: int) -> float:
    obs, info = env.reset(seed=seed)
    policy.reset(0, obs, info)
    total, done = 0.0, False
    while not done:
        (action,) = policy.act_batch([0], [obs], [info])
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        done = terminated or truncated
    return total


def test_openai_policy_solves_arithmetic_through_the_stub():
    env = gym.make("openenv/Arithmetic-v0")
    with OpenAIStub() as stub:
        policy = OpenAIPolicy(stub.url, "stub")
        try:
            assert [play(policy, env, s) for s in range(5)] == [1.0] * 5
        finally:
            policy.close()
            env.close()
    first, second = stub.requests[0], stub.requests[1]
    assert {t["function"]["name"] for t in first["tools"]} == {"calculator", "submit"}
    assert first["tools"][0]["type"] == "function" and first["model"] == "stub"
    # the second request carries the whole conversation: prompt, the call, and its result
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool"]
    assert second["messages"][2]["name"] == "calculator"
    assert policy.usage["completion_tokens"] > 0


def test_a_batch_is_requested_concurrently():
    with OpenAIStub() as stub:
        stub.delay = 0.3
        policy = OpenAIPolicy(stub.url, "stub")
        try:
            for i in range(4):
                policy.reset(i, OBS, {})
            actions = policy.act_batch([0, 1, 2, 3], [OBS] * 4, [{}] * 4)
        finally:
            policy.close()
    assert len(actions) == 4 and all(a["role"] == "assistant" for a in actions)
    assert stub.max_in_flight == 4


def test_transient_failures_are_retried_and_persistent_ones_are_typed():
    key = "sk-test-NEVER-SHOW-THIS"
    with OpenAIStub() as stub:
        policy = OpenAIPolicy(stub.url, "stub", api_key=key)
        try:
            policy.reset(0, OBS, {})
            stub.fail_next, stub.rate_limit_next = 1, 1
            (action,) = policy.act_batch([0], [OBS], [{}])
            assert action["content"] == "I have nothing to add." and len(stub.requests) == 3
            stub.fail_next = 100
            with pytest.raises(BackendUnavailable, match="injected failure") as info:
                policy.act_batch([0], [[{"role": "user", "content": "again"}]], [{}])
            assert key not in str(info.value) and key not in repr(policy)
        finally:
            policy.close()


def test_a_client_error_is_a_configuration_error():
    with OpenAIStub() as stub:
        policy = OpenAIPolicy(stub.url.replace("/v1", "/nope"), "stub")
        try:
            policy.reset(0, OBS, {})
            with pytest.raises(ConfigurationError, match="404"):
                policy.act_batch([0], [OBS], [{}])
        finally:
            policy.close()


def test_the_stub_streams_valid_chunks():
    with OpenAIStub() as stub:
        body = {"model": "stub", "stream": True, "tools": INFO["tools"] + [ToolSpec("calculator").to_openai()],
                "messages": [{"role": "user", "content": "Compute 2 + 3. Then submit."}]}
        text = httpx.post(f"{stub.url}/chat/completions", json=body).text
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    args = "".join(d["function"].get("arguments", "") for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", []))
    assert json.loads(args) == {"expression": "2 + 3"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
