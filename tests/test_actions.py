"""Reading actions: every action gives a Turn whose problems are recorded; only values that are not
actions at all raise InvalidAction."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openenv_gym.actions import MAX_NAME_LENGTH, ParsedCall, Turn, check_action_type, check_call, parse_action
from openenv_gym.errors import InvalidAction, OpenEnvGymError
from openenv_gym.wire import AssistantMessage, ToolSpec

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)


@given(json_values)
def test_any_json_value_parses_without_raising(value):
    turn = parse_action(value)
    assert isinstance(turn.calls, list)


@given(st.text())
def test_any_argument_string_is_accepted_or_explained(raw):
    turn = parse_action({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": raw}}]})
    (call,) = turn.calls
    assert (call.arguments is None) == (call.error is not None)


def test_openai_message_with_dict_arguments_and_missing_ids():
    turn = parse_action({"role": "assistant", "content": [{"type": "text", "text": "hi"}],
                         "tool_calls": [{"function": {"name": "a", "arguments": {"x": 1}}},
                                        {"id": "k", "function": {"name": "b"}}]})
    assert turn.text == "hi"
    assert [(c.id, c.name, c.arguments) for c in turn.calls] == [("call_0", "a", {"x": 1}), ("k", "b", {})]


def test_check_call_explains_each_problem():
    tools = {"submit": ToolSpec("submit", "", {"type": "object", "properties": {"answer": {"type": "string"}},
                                              "required": ["answer"], "additionalProperties": False})}
    assert "unknown tool 'x'" in check_call(ParsedCall("1", "x", {}), tools)
    assert "missing required" in check_call(ParsedCall("1", "submit", {}), tools)
    assert "unexpected argument" in check_call(ParsedCall("1", "submit", {"answer": "1", "y": 2}), tools)
    assert "not valid JSON" in check_call(parse_action({"tool_calls": [
        {"function": {"name": "submit", "arguments": "{"}}]}).calls[0], tools)
    assert check_call(ParsedCall("1", "submit", {"answer": "1"}), tools) is None


# -- issue 9: every action is answered or refused with a typed error ---------------------------------

def test_only_values_that_are_not_actions_raise_and_as_invalid_action():
    for action in ("text", {}, {"tool_calls": "oops"}, AssistantMessage(), None, 5, 1.5, True, [1]):
        check_action_type(action)  # no exception: each is answered with a message
        assert isinstance(parse_action(action), Turn)
    for value in ({1}, b"x", (1,), object(), 1j):
        with pytest.raises(InvalidAction) as caught:
            check_action_type(value)
        assert isinstance(caught.value, OpenEnvGymError) and isinstance(caught.value, TypeError)
        with pytest.raises(InvalidAction):
            parse_action(value)


def test_dict_arguments_become_a_plain_copy():
    arguments = {"xs": (1, 2), "nested": {"k": [True, None, 1.5]}}
    (call,) = parse_action({"tool_calls": [{"function": {"name": "f", "arguments": arguments}}]}).calls
    assert call.arguments == {"xs": [1, 2], "nested": {"k": [True, None, 1.5]}} and call.error is None
    arguments["nested"]["k"].append("later")  # the trainer's object is not shared with the Turn
    assert call.arguments["nested"]["k"] == [True, None, 1.5]


def test_messages_quote_little_of_what_the_agent_wrote():
    tools = {"submit": ToolSpec("submit", "", {"type": "object", "properties": {"answer": {"type": "string"}},
                                              "additionalProperties": False})}
    unknown = check_call(ParsedCall("1", "y" * MAX_NAME_LENGTH, {}), tools)
    assert "unknown tool" in unknown and len(unknown) < 200
    extra = check_call(ParsedCall("1", "submit", {"answer": "1", **{f"k{i}": 1 for i in range(1000)}, "z" * 10**6: 1}), tools)
    assert "and 991 more" in extra and len(extra) < 300
    turn = parse_action({"tool_calls": [{"function": {"name": "\ud800" + "x" * 10**6}}]})
    assert "characters long" in turn.error and len(turn.error) < 300
    turn.error.encode("utf-8")  # the echo of a lone surrogate is escaped, so the message encodes
