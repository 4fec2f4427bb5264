"""Reading actions: every input gives a Turn, never an exception; problems are recorded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from openenv_gym.actions import ParsedCall, check_call, parse_action
from openenv_gym.wire import ToolSpec

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
