"""Fuzzed actions against the live bundled Arithmetic env: a single env and a ConcurrentVectorEnv.

What a trainer relies on: whatever the agent writes, ``step`` answers with a message the agent can
read; a malformed action earns reward 0 and the episode goes on (not terminated, not truncated,
no ``info["error"]``, in a vector env exactly as in a single env). Only a value that is not an
action at all raises, as ``InvalidAction``, and then nothing was sent. Bad ``reset`` options raise
``ConfigurationError`` before anything reaches the server.
"""

from __future__ import annotations

import json

import gymnasium as gym
import msgspec
import pytest
from bad_actions import NAMED_BAD, SAYS_WHAT_WAS_WRONG, Opaque, call, deep  # tests/bad_actions.py
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401
from openenv_gym.actions import check_call, parse_action
from openenv_gym.errors import ConfigurationError, InvalidAction
from openenv_gym.spaces import Messages
from openenv_gym.vector import ConcurrentVectorEnv
from openenv_gym.wire import ToolSpec

ARITH = "openenv/Arithmetic-v0"
NO_TURN_LIMIT = 10**6  # the fuzz plays hundreds of actions in one episode
LIVE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LIVE_VEC = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LOCAL_ANSWER_LIMIT = 1200  # what the package itself says about one bad action stays this short

# -- what agents (and careless trainers) write -------------------------------------------------------

any_text = (st.text(st.characters(blacklist_categories=()), max_size=20) | st.sampled_from(["", "4", "\ud800"])
            | st.just(5000).map(lambda n: "x" * n))


python_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | any_text | st.binary(max_size=4)
    | st.sets(st.integers(), max_size=2) | st.builds(Opaque)
    | st.sampled_from([10**30, 2**64, -(2**63) - 1, float("nan"), float("inf")]),
    lambda children: st.lists(children, max_size=3) | st.tuples(children)
    | st.dictionaries(any_text | st.integers() | st.none(), children, max_size=3),
    max_leaves=10,
)


@st.composite
def argument_strings(draw: st.DrawFn) -> str:
    value = draw(python_values.filter(lambda v: not isinstance(v, (bytes, set, Opaque))) | st.just({}))
    try:
        text = json.dumps(value, allow_nan=True, default=str)
    except (TypeError, ValueError):
        text = "{"
    how = draw(st.sampled_from(["as is", "cut", "deep", "big", "nan", "surrogate", "junk"]))
    if how == "cut":
        return text[: draw(st.integers(0, len(text)))]
    if how == "deep":
        n = draw(st.sampled_from([101, 1000, 100_000]))
        return '{"expression": ' + "[" * n + "]" * n + "}"
    if how == "big":
        return '{"expression": 1' + "0" * draw(st.sampled_from([30, 5000])) + "}"
    if how == "nan":
        return '{"expression": ' + draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400"])) + "}"
    if how == "surrogate":
        return draw(st.sampled_from(['{"expression": "\\ud800"}', '{"expression": "\udc00"}', '{"answer": "\\udfff"}']))
    if how == "junk":
        return draw(any_text)
    return text


names = st.sampled_from(["calculator", "submit", "nosuch", ""]) | any_text | st.integers() | st.none()
calls = st.fixed_dictionaries(
    {"function": st.fixed_dictionaries({"name": names}, optional={"arguments": argument_strings() | python_values})
     | python_values},
    optional={"id": st.none() | any_text | st.integers()},
)
messages = st.fixed_dictionaries({}, optional={
    "role": st.just("assistant") | python_values,
    "content": st.none() | any_text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": python_values}),
                                               max_size=2) | python_values,
    "tool_calls": st.lists(calls, min_size=1, max_size=3) | python_values,
})
actions = messages | any_text | python_values


# -- checks ------------------------------------------------------------------------------------------

TOOLS = {"calculator": ToolSpec("calculator", "", {"type": "object", "properties": {"expression": {"type": "string"}},
                                                  "required": ["expression"], "additionalProperties": False}),
         "submit": ToolSpec("submit", "", {"type": "object", "properties": {"answer": {"type": "string"}},
                                           "required": ["answer"], "additionalProperties": False})}


def is_action(value) -> bool:
    return value is None or isinstance(value, (str, dict, list, int, float))


def answered_locally(action) -> bool:
    """Whether the package itself must refuse this action (nothing reaches a tool)."""
    turn = parse_action(action)
    return turn.error is not None or not turn.calls or all(check_call(c, TOOLS) is not None for c in turn.calls)


def assert_bad_action_answered(obs, reward, terminated, truncated, info) -> None:
    assert reward == 0.0 and not terminated and not truncated
    assert "error" not in info
    said = " ".join(str(m.get("content")) for m in obs)
    assert any(phrase in said for phrase in SAYS_WHAT_WAS_WRONG), said[:300]
    assert len(said) <= LOCAL_ANSWER_LIMIT * max(1, len(obs))


def assert_observation(obs) -> None:
    assert obs and Messages().contains(obs)
    msgspec.json.encode(obs)  # observations always encode (a trainer logs them)


@pytest.fixture(scope="module")
def env():
    env = gym.make(ARITH, max_turns=NO_TURN_LIMIT)
    env.reset(seed=0)
    yield env
    env.close()


@pytest.fixture(scope="module")
def vec():
    envs = gym.make_vec(ARITH, num_envs=3, max_turns=NO_TURN_LIMIT)
    assert isinstance(envs.unwrapped, ConcurrentVectorEnv)
    envs.reset(seed=0)
    yield envs
    envs.close()


# -- single env --------------------------------------------------------------------------------------

@LIVE
@given(actions)
def test_fuzzed_actions_are_answered_and_the_episode_goes_on(env, action):
    if not is_action(action):
        event("not an action")
        with pytest.raises(InvalidAction):
            env.step(action)
        return
    local = answered_locally(action)
    event("answered by the package" if local else "reached a tool")
    obs, reward, terminated, truncated, info = env.step(action)
    assert_observation(obs)
    if local:
        assert_bad_action_answered(obs, reward, terminated, truncated, info)
    if terminated or truncated:  # a well-formed submit, drawn by chance
        env.reset()


def test_named_bad_actions_then_a_correct_answer(env):
    """Each bad action of issue 9 is answered, and the same episode can still be won."""
    opening, _ = env.reset(seed=3)
    expression = opening[0]["content"].split("Compute ", 1)[1].split(". ", 1)[0]
    for action in NAMED_BAD:
        obs, reward, terminated, truncated, info = env.step(action)
        assert_observation(obs)
        assert_bad_action_answered(obs, reward, terminated, truncated, info)
    obs, *_ = env.step(call("calculator", json.dumps({"expression": expression})))
    _, reward, terminated, *_ = env.step(call("submit", {"answer": obs[0]["content"]}))
    assert reward == 1.0 and terminated


@pytest.mark.parametrize("value", [{1, 2}, b"4", (1, 2), Opaque()], ids=["set", "bytes", "tuple", "object"])
def test_values_that_are_not_actions_raise_and_change_nothing(env, value):
    env.reset(seed=4)
    with pytest.raises(InvalidAction):
        env.step(value)
    obs, reward, terminated, truncated, info = env.step("hello")
    assert info["turn"] == 1 and not (terminated or truncated)  # the refused value was not a turn


# -- reset options -----------------------------------------------------------------------------------

def is_plain(value) -> bool:
    """Plain JSON as documented (tuples count as arrays), checked independently of the package."""
    if value is None or type(value) is bool:
        return True
    if type(value) is str:
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if type(value) is int:
        return -(2**63) <= value <= 2**64 - 1
    if type(value) is float:
        return value == value and abs(value) != float("inf")
    if type(value) in (list, tuple):
        return all(is_plain(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and is_plain(k) and is_plain(v) for k, v in value.items())
    return False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(python_values)
def test_reset_with_a_task_that_is_not_json_raises_configuration_error(env, value):
    spec = {"question": "What is 1+1?", "answer": "2", "extra": value}
    if is_plain(spec):
        return  # a plain task spec is the server's to judge
    with pytest.raises(ConfigurationError):
        env.reset(options={"task": spec})


BAD_OPTIONS = {
    "set in task": {"task": {"question": {1, 2}}}, "NaN in task": {"task": {"answer": float("nan")}},
    "lone surrogate in task": {"task": {"q": "\ud800"}}, "task nested 100,000 deep": {"task": {"q": deep(100_000)}},
    "object in task": {"task": {"q": Opaque()}}, "int key in task": {"task": {1: "x"}},
    "30-digit int in task": {"task": {"q": 10**30}}, "task is a number": {"task": 5},
    "task is a string": {"task": "What is 1+1?"}, "index is a string": {"index": "3"},
    "index is a float": {"index": 1.5}, "index is a bool": {"index": True}, "split is a number": {"split": 5},
    "unknown option": {"nope": 1}, "tuple key": {("a",): 1}, "options is a number": 5, "options is a string": "index",
}


@pytest.mark.parametrize("options", BAD_OPTIONS.values(), ids=BAD_OPTIONS.keys())
def test_bad_reset_options_raise_configuration_error_and_the_env_still_works(env, options):
    with pytest.raises(ConfigurationError):
        env.reset(options=options)
    obs, info = env.reset(options={"task": {"question": "What is 20+1?", "answer": "21"}})
    _, reward, terminated, *_ = env.step(call("submit", {"answer": "21"}))
    assert reward == 1.0 and terminated


# -- vector env --------------------------------------------------------------------------------------

_ENDED = [False, False, False]  # sub-envs that ended on the last step: NEXT_STEP resets them next


@LIVE_VEC
@given(st.lists(actions, min_size=3, max_size=3))
def test_fuzzed_actions_in_a_vector_env_are_answered_like_in_a_single_env(vec, batch):
    if not all(is_action(a) for a in batch):
        with pytest.raises(InvalidAction):
            vec.step(batch)
        batch = [a if is_action(a) else "hello" for a in batch]
    restarting = list(_ENDED)
    obs, rewards, terminated, truncated, infos = vec.step(batch)
    for i, action in enumerate(batch):
        assert_observation(obs[i])
        assert not truncated[i], infos.get("error")
        assert not infos.get("_error", [False] * 3)[i], infos.get("error")
        if not restarting[i] and answered_locally(action):
            info_i = {k: infos[k][i] for k in infos if not k.startswith("_") and infos[f"_{k}"][i]}
            assert_bad_action_answered(obs[i], rewards[i], terminated[i], truncated[i], info_i)
    _ENDED[:] = [bool(t) for t in terminated]


def test_a_value_that_is_not_an_action_raises_in_send_and_truncates_nothing(vec):
    vec.reset(seed=5)
    _ENDED[:] = [False, False, False]
    with pytest.raises(InvalidAction):
        vec.step(["hello", {1, 2}, "hello"])
    obs, rewards, terminated, truncated, infos = vec.step(["hello", NAMED_BAD[0], NAMED_BAD[-1]])
    assert not truncated.any() and not terminated.any() and "error" not in infos
    assert infos["turn"].tolist() == [1, 1, 1]

