"""ConversationHistory over the real Arithmetic env (a local ORS server started once for the module).

What a trainer relies on: the observation is exactly the opening messages followed, per step, by
the agent's turn and that step's new messages (checked against what the inner env really
returned, over hypothesis-generated episodes); the agent's turns are normalised messages whose
tool-call ids pair with the answers; observations are independent lists; reset starts afresh.
"""

from __future__ import annotations

import copy
import json
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401  (registers openenv/Arithmetic-v0)
from openenv_gym.records import as_assistant_message
from openenv_gym.spaces import Messages
from openenv_gym.wire import AssistantMessage, FunctionCall, ToolCall
from openenv_gym.wrappers import ConversationHistory, TextToolCalls


class Recorder(gym.Wrapper):
    """Below ConversationHistory: keeps what the inner env observed at each reset and step."""

    def __init__(self, env):
        super().__init__(env)
        self.observed: list = []

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.observed = [copy.deepcopy(obs)]
        return obs, info

    def step(self, action):
        out = self.env.step(action)
        self.observed.append(copy.deepcopy(out[0]))
        return out


@pytest.fixture(scope="module")
def base():
    env = gym.make("openenv/Arithmetic-v0", max_turns=6)
    yield env
    env.close()


def call(name: str, args, id: str | None = None) -> dict:
    out = {"type": "function", "function": {"name": name, "arguments": args}}
    if id is not None:
        out["id"] = id
    return out


actions = st.one_of(
    st.text(max_size=30),
    st.builds(lambda e, i: {"role": "assistant", "content": None, "tool_calls": [call("calculator", {"expression": e}, i)]},
              st.sampled_from(["1 + 2", "7 * 6", "2 ** 10", "1 / 0", "(("]), st.none() | st.just("c9")),
    st.builds(lambda e: {"role": "assistant", "tool_calls": [call("calculator", json.dumps({"expression": e}))]},
              st.sampled_from(["3", "4 - 9"])),
    st.just({"role": "assistant", "tool_calls": [call("nope", "{}"), call("calculator", "{bad")]}),
    st.just({"role": "assistant", "content": "a", "tool_calls": [call("calculator", {"expression": "1"}),
                                                                 call("calculator", {"expression": "2"})]}),
    st.just({"role": "assistant", "tool_calls": [call("submit", {"answer": "0"})]}),
    st.just(AssistantMessage(tool_calls=[ToolCall(FunctionCall("calculator", {"expression": "5"}))])),
    st.none(),
)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), script=st.lists(actions, min_size=1, max_size=8))
def test_observation_is_the_concatenation_of_new_messages_and_actions(base, seed, script):
    recorder = Recorder(base)
    env = ConversationHistory(recorder)
    obs, info = env.reset(seed=seed)
    assert obs == recorder.observed[0] == info["new_messages"]
    expected = list(recorder.observed[0])
    for action in script:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["new_messages"] == recorder.observed[-1]
        expected += [as_assistant_message(action)] + recorder.observed[-1]
        assert obs == expected
        assert env.messages == expected
        assert Messages().contains(obs)
        if terminated or truncated:
            break


def test_agent_turns_are_normalised_messages_paired_with_their_answers(base):
    env = ConversationHistory(base)
    env.reset(seed=1)
    obs, *_ = env.step("thinking out loud")
    assert obs[1] == {"role": "assistant", "content": "thinking out loud"}
    action = {"role": "assistant", "content": None,
              "tool_calls": [call("calculator", {"expression": "2 + 2"}), call("calculator", '{"expression": "3"}')]}
    kept = copy.deepcopy(action)
    obs, *_ = env.step(action)
    assert action == kept  # the caller's message is not modified
    assistant = obs[-3]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_0", "call_1"]
    assert assistant["tool_calls"][0]["function"]["arguments"] == '{"expression": "2 + 2"}'
    assert [(m["tool_call_id"], m["content"]) for m in obs[-2:]] == [("call_0", "4"), ("call_1", "3")]


def test_each_observation_is_a_fresh_list(base):
    env = ConversationHistory(base)
    first, _ = env.reset(seed=2)
    first.append({"role": "user", "content": "injected"})
    second, *_ = env.step("hello")
    assert len(second) == 3 and second[-1]["content"] != "injected"
    assert len(first) == 2


def test_reset_starts_a_new_conversation(base):
    env = ConversationHistory(base)
    env.reset(seed=3)
    env.step("one")
    obs, info = env.reset(seed=4)
    assert len(obs) == 1 and obs == info["new_messages"] and env.messages == obs


def test_wrappers_below_that_rewrite_the_action_are_followed(base):
    env = ConversationHistory(TextToolCalls(base))
    env.reset(seed=5)
    obs, *_ = env.step('{"name": "calculator", "parameters": {"expression": "9 - 2"}}')
    assert obs[-2]["tool_calls"][0]["function"]["name"] == "calculator"
    assert obs[-1]["content"] == "7"


def test_stacked_histories_do_not_repeat_messages(base):
    env = ConversationHistory(ConversationHistory(base))
    env.reset(seed=6)
    obs, *_ = env.step("a")
    obs, *_ = env.step("b")
    assert [m["role"] for m in obs] == ["user", "assistant", "user", "assistant", "user"]


def test_check_env_passes(base):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*different from the unwrapped.*")
        check_env(ConversationHistory(base), skip_render_check=True)
