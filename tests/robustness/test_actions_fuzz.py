"""Fuzzing the action parser: whatever a model (or a trainer) passes, 0 untyped exceptions.

The contract under test (openenv_gym/actions.py): ``parse_action`` returns a Turn for every str,
dict, AssistantMessage or other JSON value, and raises only ``InvalidAction`` (ours and a
``TypeError``) for values that are not actions at all. Every Turn is sendable as it is: each
adapter's encoder (httpx's ``json=``, ``json.dumps``, msgspec JSON and msgpack) accepts it, its
arguments are plain JSON within the documented limits, and what it says to the agent is short.
"""

from __future__ import annotations

import json
import math
import sys

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from openenv_gym.actions import MAX_NAME_LENGTH, ParsedCall, Turn, check_action_type, check_call, parse_action
from openenv_gym.errors import InvalidAction, OpenEnvGymError
from openenv_gym.wire import JSON_INT_MAX, JSON_INT_MIN, MAX_JSON_DEPTH, AssistantMessage, FunctionCall, ToolCall, ToolSpec

# Thousands of examples in all, yet the file runs in about 20 s: no deadline (the machine is shared).
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=_SLOW_OK)
MANY = settings(max_examples=700, deadline=None, suppress_health_check=_SLOW_OK)
SOME = settings(max_examples=400, deadline=None, suppress_health_check=_SLOW_OK)
MESSAGE_LIMIT = 400  # what the agent is told about one problem stays this short

TOOLS = {
    "calculator": ToolSpec("calculator", "", {"type": "object", "properties": {"expression": {"type": "string"}},
                                              "required": ["expression"], "additionalProperties": False}),
    "submit": ToolSpec("submit", "", {"type": "object", "properties": {"answer": {"type": "string"}},
                                      "required": ["answer"]}),
}

# -- strategies --------------------------------------------------------------------------------------

any_char = st.characters(blacklist_categories=())  # surrogates included
any_text = st.text(any_char, max_size=30) | st.sampled_from(["", "\ud800", "a\udfffb", "\x00", "x" * 300])
huge_ints = (st.integers() | st.sampled_from([2**63, 2**64, -(2**63) - 1])
             | st.sampled_from([30, 4299, -5000]).map(lambda n: 10 ** abs(n) * (1 if n > 0 else -1)))
weird_floats = st.floats(allow_nan=True, allow_infinity=True)


class Opaque:
    """An object no JSON encoder knows."""


class BadDict(dict):
    """A dict subclass whose own methods fail, as a careless trainer's wrapper might."""

    def __eq__(self, other):
        raise RuntimeError("no comparing")

    __hash__ = None  # type: ignore[assignment]


python_leaves = (
    st.none() | st.booleans() | huge_ints | weird_floats | any_text | st.binary(max_size=8)
    | st.builds(Opaque) | st.sets(st.integers(), max_size=3) | st.frozensets(st.text(max_size=3), max_size=2)
    | st.complex_numbers(allow_nan=True) | st.just(Ellipsis)
)
python_keys = any_text | st.integers() | st.none() | st.booleans() | st.tuples(st.integers()) | weird_floats
python_values = st.recursive(
    python_leaves,
    lambda children: (
        st.lists(children, max_size=4) | st.tuples(children, children)
        | st.dictionaries(python_keys, children, max_size=4)
        | st.dictionaries(st.text(max_size=4), children, max_size=3).map(BadDict)
    ),
    max_leaves=20,
)

json_leaves = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | weird_floats | st.text(max_size=10)
json_values = st.recursive(
    json_leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=15,
)


@st.composite
def json_ish_strings(draw: st.DrawFn) -> str:
    """Strings that are JSON, nearly JSON (cut, spliced, Python-flavoured) or not JSON at all."""
    base = json.dumps(draw(json_values), allow_nan=True, ensure_ascii=draw(st.booleans()))
    how = draw(st.sampled_from(["as is", "object", "cut", "splice", "nan", "deep", "escape", "raw"]))
    if how == "object":
        return json.dumps({"x": draw(json_values)}, allow_nan=True)
    if how == "cut":
        return base[: draw(st.integers(0, len(base)))]
    if how == "splice":
        at = draw(st.integers(0, len(base)))
        return base[:at] + draw(st.text(any_char, max_size=5)) + base[at:]
    if how == "nan":
        return '{"x": ' + draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "1" + "0" * 30])) + "}"
    if how == "deep":
        n = draw(st.sampled_from([MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 900, 5000]))
        return '{"x": ' + "[" * n + "]" * n + "}"
    if how == "escape":
        return '{"x": "' + draw(st.sampled_from(["\\ud800", "\\udc00x", "\\ud83d\\ude00", "\\u0000", "\\x", "\\"])) + '"}'
    if how == "raw":
        return draw(st.text(any_char, max_size=40))
    return base


TOOL_NAMES = st.sampled_from(["calculator", "submit", "nosuch", ""]) | any_text


def call_dicts(names=TOOL_NAMES):
    arguments = st.none() | json_ish_strings() | python_values | st.dictionaries(any_text, python_values, max_size=3)
    function = st.fixed_dictionaries({"name": names}, optional={"arguments": arguments})
    return st.fixed_dictionaries(
        {"function": function | python_values},
        optional={"id": st.none() | any_text | st.integers(), "type": st.just("function") | python_values},
    )


content_parts = st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "refusal"]) | python_values},
                          optional={"text": python_values | any_text})
    | python_values,
    max_size=3,
)
assistant_messages = st.fixed_dictionaries(
    {},
    optional={
        "role": st.just("assistant") | python_values,
        "content": st.none() | any_text | content_parts | python_values,
        "tool_calls": st.none() | st.lists(call_dicts() | python_values, max_size=3) | python_values,
        "reasoning_content": python_values,
    },
)
struct_messages = st.builds(
    AssistantMessage,
    content=st.none() | any_text | content_parts | python_values,
    tool_calls=st.none() | st.lists(st.builds(ToolCall, st.builds(FunctionCall, any_text, python_values | json_ish_strings()),
                                              id=st.none() | any_text), max_size=2) | python_values,
)
anything = python_values | any_text | assistant_messages | struct_messages | json_values


# -- the properties ----------------------------------------------------------------------------------

def is_action_type(value) -> bool:
    return value is None or isinstance(value, (str, dict, AssistantMessage, list, int, float))


def plain(value, depth: int = 1) -> bool:
    """Exactly the plain JSON the docs promise (exact builtin types, within the limits)."""
    if value is None or type(value) in (bool, str):
        return type(value) is not str or _unicode_ok(value)
    if type(value) is int:
        return JSON_INT_MIN <= value <= JSON_INT_MAX
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is list:
        return depth <= MAX_JSON_DEPTH and all(plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return depth <= MAX_JSON_DEPTH and all(
            type(k) is str and _unicode_ok(k) and plain(v, depth + 1) for k, v in value.items())
    return False


def _unicode_ok(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def assert_sendable(turn: Turn) -> None:
    """What every adapter downstream does with a Turn must work."""
    assert isinstance(turn, Turn)
    msgspec.json.encode(turn)
    msgspec.msgpack.encode(turn)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(turn), type=Turn) == turn
    for text in (turn.text, turn.error):
        assert text is None or (type(text) is str and _unicode_ok(text))
    if turn.error is not None:
        assert len(turn.error) <= MESSAGE_LIMIT and turn.calls == []
    for call in turn.calls:
        assert isinstance(call, ParsedCall)
        assert type(call.id) is str and type(call.name) is str
        assert len(call.id) <= MAX_NAME_LENGTH and len(call.name) <= MAX_NAME_LENGTH
        assert _unicode_ok(call.id) and _unicode_ok(call.name)
        assert (call.arguments is None) == (call.error is not None)
        if call.arguments is not None:
            assert type(call.arguments) is dict and plain(call.arguments)
            # httpx's json= body encoding (what the ORS adapter sends), and what MCP and Verifiers do.
            json.dumps({"name": call.name, "input": call.arguments}, ensure_ascii=False,
                       separators=(",", ":"), allow_nan=False).encode("utf-8")
        else:
            assert len(call.error) <= MESSAGE_LIMIT and _unicode_ok(call.error)
        if call.raw_arguments is not None:
            assert _unicode_ok(call.raw_arguments)
        answer = check_call(call, TOOLS)
        assert answer is None or (len(answer) <= 2 * MESSAGE_LIMIT and _unicode_ok(answer))


def parse_or_refuse(value) -> Turn | None:
    """parse_action's two outcomes: a Turn, or InvalidAction for exactly the non-action types."""
    if is_action_type(value):
        check_action_type(value)  # must not raise
        turn = parse_action(value)
        assert_sendable(turn)
        return turn
    with pytest.raises(InvalidAction):
        check_action_type(value)
    with pytest.raises(InvalidAction):
        parse_action(value)
    return None


@FUZZ
@given(anything)
def test_any_value_gives_a_sendable_turn_or_invalid_action(value):
    parse_or_refuse(value)


@MANY
@given(assistant_messages)
def test_any_assistant_message_dict_gives_a_sendable_turn(message):
    parse_or_refuse(message)


# -- the expected reading of a call, from the documented rules (not from the parser) ----------------

class NotPlain(Exception):
    """A value that is not plain JSON as the module docs define it."""


def as_plain(value, depth: int = 1):
    """``value`` as plain JSON builtins (tuples as lists, subclasses as their base), or NotPlain:
    str keys, valid Unicode, finite floats, 64-bit integers, at most MAX_JSON_DEPTH levels."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if not _unicode_ok(value):
            raise NotPlain
        return str(value)
    if isinstance(value, int):
        if not JSON_INT_MIN <= value <= JSON_INT_MAX:
            raise NotPlain
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotPlain
        return float(value)
    if isinstance(value, (list, tuple, dict)) and depth > MAX_JSON_DEPTH:
        raise NotPlain
    if isinstance(value, (list, tuple)):
        return [as_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        out = {}
        for key, sub in value.items():
            if not isinstance(key, str) or not _unicode_ok(key):
                raise NotPlain
            out[str(key)] = as_plain(sub, depth + 1)
        return out
    raise NotPlain


def expected_arguments(raw):
    """The arguments a call with ``raw`` arguments must get: a dict, or None (the call has an error)."""
    if raw is None or (isinstance(raw, str) and not raw):
        return {}
    if isinstance(raw, str):
        if not _unicode_ok(raw):
            return None
        try:
            value = json.loads(raw, parse_constant=_refuse)  # strict JSON: no NaN or Infinity
            return as_plain(value) if isinstance(value, dict) else None
        except (ValueError, RecursionError, NotPlain):
            return None
    if isinstance(raw, dict):
        try:
            return as_plain(raw)
        except NotPlain:
            return None
    return None  # a number, a list, a set...: not an object


def readable_name(value) -> bool:
    return isinstance(value, str) and len(value) <= MAX_NAME_LENGTH and _unicode_ok(value)


def expected_call(n: int, raw):
    """``(id, name, arguments or None)`` the n-th call must be read as, or None if it makes the
    whole message unreadable (not an object, no function object, a bad name or id)."""
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict) or not readable_name(function.get("name")):
        return None
    call_id = raw.get("id")
    if call_id is None or (isinstance(call_id, str) and not call_id):
        call_id = f"call_{n}"
    elif not readable_name(call_id):
        return None
    return call_id, function["name"], expected_arguments(function.get("arguments"))


@MANY
@given(st.lists(call_dicts(), min_size=1, max_size=3))
def test_each_tool_call_is_parsed_or_explained(calls):
    """Each call is read exactly as the documented rules say: its id, name and arguments, or an
    error for arguments that are not a plain JSON object; a bad name or id makes the message
    unreadable, and the message says which call."""
    turn = parse_or_refuse({"role": "assistant", "tool_calls": calls})
    expected = [expected_call(n, raw) for n, raw in enumerate(calls)]
    if None in expected:
        first = expected.index(None)
        event("unreadable message")
        assert turn.error is not None and turn.calls == [], turn
        assert f"tool call {first}" in turn.error, turn.error
        return
    assert turn.error is None, turn.error
    assert len(turn.calls) == len(calls)
    for call, (call_id, name, arguments) in zip(turn.calls, expected):
        event("call with arguments" if arguments is not None else "call with an error")
        assert (call.id, call.name) == (call_id, name)
        assert call.arguments == arguments, (call.arguments, call.error)
        assert (call.error is None) == (arguments is not None)
        # What the agent is told: the call's own error first, else the tool list's verdict.
        said = check_call(call, TOOLS)
        if call.error is not None:
            assert said is not None and call.error in said
        elif name not in TOOLS:
            assert said is not None and "unknown tool" in said


@SOME
@given(json_ish_strings())
def test_argument_strings_agree_with_strict_json(raw):
    """A string's arguments are accepted exactly when they are a strict-JSON object in the limits."""
    (call,) = parse_action({"tool_calls": [{"function": {"name": "f", "arguments": raw}}]}).calls
    try:
        expected = json.loads(raw, parse_constant=_refuse)
        strict = isinstance(expected, dict) and plain(expected) and _unicode_ok(raw)
    except (ValueError, RecursionError):
        strict = False
    if raw == "":
        strict, expected = True, {}
    assert (call.error is None) == strict, (raw[:80], call.error)
    if strict:
        assert call.arguments == expected


def _refuse(name):
    raise ValueError(name)


@SOME
@given(python_values)
def test_dict_arguments_are_kept_exactly_when_plain(value):
    (call,) = parse_action({"tool_calls": [{"function": {"name": "f", "arguments": {"v": value}}}]}).calls
    assert_sendable(Turn(None, [call]))
    try:
        expected = as_plain({"v": value})
    except NotPlain:
        expected = None
    if expected is None:
        assert call.error is not None and call.arguments is None
    else:
        assert call.error is None and call.arguments == expected
        assert json.loads(json.dumps(call.arguments)) == call.arguments  # plain builtins, as JSON has them


# -- the named cases of issue 9 (each raised an untyped exception before) ----------------------------

def deep_list(n: int) -> list:
    root: list = []
    node = root
    for _ in range(n):
        node.append([])
        node = node[0]
    return root


def message(arguments, name="calculator", **extra):
    return {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": name, "arguments": arguments}}], **extra}


NAMED = {
    "json string with a 5001-digit integer": (message('{"x": 1' + "0" * 5000 + "}"), "64-bit range"),
    "json string with NaN": (message('{"expression": NaN}'), "not valid JSON"),
    "json string with Infinity": (message('{"expression": -Infinity}'), "not valid JSON"),
    "json string with 1e400": (message('{"expression": 1e400}'), "too large"),
    "json string nested 100,000 deep": (message("[" * 100_000 + "]" * 100_000), "levels deep"),
    "json string object nested 100,000 deep": (message('{"a":' * 100_000 + "1" + "}" * 100_000), "levels deep"),
    "json string with a lone surrogate escape": (message('{"expression": "\\ud800"}'), "lone surrogate"),
    "json string with a raw lone surrogate": (message('{"expression": "\ud800"}'), "lone surrogate"),
    "dict arguments with NaN": (message({"expression": float("nan")}), "NaN"),
    "dict arguments with Infinity": (message({"expression": [1, float("inf")]}), "Infinity"),
    "dict arguments with a huge int": (message({"x": 10**5000}), "64-bit range"),
    "dict arguments with a 30-digit int": (message({"x": 10**30}), "64-bit range"),
    "dict arguments with a lone surrogate": (message({"expression": "1+\udc00"}), "lone surrogate"),
    "dict arguments with a lone surrogate key": (message({"\ud800": "1"}), "lone surrogate"),
    "dict arguments with a set": (message({"expression": {1, 2}}), "set"),
    "dict arguments with bytes": (message({"expression": b"1+1"}), "bytes"),
    "dict arguments with an object": (message({"expression": Opaque()}), "Opaque"),
    "dict arguments with a non-str key": (message({1: "x"}), "not a string"),
    "dict arguments with a tuple key": (message({(1, 2): "x"}), "not a string"),
    "dict arguments with a None key": (message({None: "x"}), "not a string"),
    "dict arguments nested 100,000 deep as Python lists": (message({"x": deep_list(100_000)}), "levels deep"),
    "dict arguments that contain themselves": (message((lambda d: (d.__setitem__("d", d), d)[1])({})), "levels deep"),
    "arguments that are a list": (message([1, 2]), "JSON object"),
    "arguments that are a number": (message(5), "JSON object"),
    "arguments that are a set": (message({1}), "JSON object"),
    "non-string text part": ({"role": "assistant", "content": [{"type": "text", "text": 5}]}, "must be a string"),
    "non-dict content part": ({"role": "assistant", "content": ["hi"]}, "must be an object"),
    "content that is a number": ({"role": "assistant", "content": 5}, "content must be"),
    "content with a lone surrogate": ({"role": "assistant", "content": "a\ud800"}, "lone surrogate"),
    "text with a lone surrogate": ("4\udbff", "lone surrogate"),
    "tool_calls that is a string": ({"role": "assistant", "tool_calls": "oops"}, "must be a list"),
    "tool_calls that is a dict": ({"role": "assistant", "tool_calls": {"function": {}}}, "must be a list"),
    "tool call that is a number": ({"role": "assistant", "tool_calls": [5]}, "must be an object"),
    "function that is a string": ({"role": "assistant", "tool_calls": [{"function": "calculator"}]}, "function object"),
    "function name that is a number": (message("{}", name=5), "must be a string"),
    "function name that is a list": (message("{}", name=["calculator"]), "must be a string"),
    "function name of a megabyte": (message("{}", name="x" * 1_000_000), "characters long"),
    "function name with a lone surrogate": (message("{}", name="calc\ud800"), "lone surrogate"),
    "call id that is a dict": ({"tool_calls": [{"id": {}, "function": {"name": "calculator"}}]}, "must be a string"),
    "None": (None, "not null"),
    "an int": (42, "not a number"),
    "a list of messages": ([{"role": "assistant", "content": "4"}], "not an array"),
}


@pytest.mark.parametrize("action, expected", NAMED.values(), ids=NAMED.keys())
def test_named_malformed_actions_are_explained(action, expected):
    turn = parse_action(action)
    assert_sendable(turn)
    said = turn.error or " ".join(check_call(c, TOOLS) or "" for c in turn.calls)
    assert expected in said, said
    assert len(said) <= 2 * MESSAGE_LIMIT  # never echoes the junk back


@pytest.mark.parametrize("value", [{1, 2}, frozenset(), b"4", bytearray(b"4"), (1, 2), Opaque(), object(),
                                   1 + 2j, Ellipsis, print, ToolCall(FunctionCall("f"))],
                         ids=lambda value: type(value).__name__)
def test_values_that_are_not_actions_raise_invalid_action(value):
    for check in (check_action_type, parse_action):
        with pytest.raises(InvalidAction) as caught:
            check(value)
        assert isinstance(caught.value, OpenEnvGymError) and isinstance(caught.value, TypeError)
        assert len(str(caught.value)) < 200


def test_numpy_values_are_not_actions_but_numpy_strings_are():
    np = pytest.importorskip("numpy")
    with pytest.raises(InvalidAction):
        parse_action(np.array(["4"]))
    assert parse_action(np.str_("4")).text == "4"
    (call,) = parse_action(message({"expression": np.int64(3)})).calls
    assert "int64" in call.error


def test_limits_are_exact():
    depth_ok = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    assert parse_action(message('{"x": ' + depth_ok + "}")).calls[0].error is None
    assert "levels deep" in parse_action(message('{"x": [' + depth_ok + "]}")).calls[0].error
    (call,) = parse_action(message({"lo": JSON_INT_MIN, "hi": JSON_INT_MAX})).calls
    assert call.arguments == {"lo": JSON_INT_MIN, "hi": JSON_INT_MAX}
    for big in (JSON_INT_MIN - 1, JSON_INT_MAX + 1):
        assert "64-bit" in parse_action(message({"x": big})).calls[0].error
        assert "64-bit" in parse_action(message(json.dumps({"x": big}))).calls[0].error
    assert parse_action(message("{}", name="f" * MAX_NAME_LENGTH)).error is None
    assert "characters long" in parse_action(message("{}", name="f" * (MAX_NAME_LENGTH + 1))).error


def test_the_parser_does_not_depend_on_the_recursion_limit():
    """Nesting is bounded by MAX_JSON_DEPTH, not by how deep the caller's stack already is."""
    limit = sys.getrecursionlimit()
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    try:
        sys.setrecursionlimit(depth + 60)  # as if deep inside a framework's stack
        assert parse_action(message({"x": deep_list(100_000)})).calls[0].error
        assert parse_action(message("[" * 100_000 + "]" * 100_000)).calls[0].error
    finally:
        sys.setrecursionlimit(limit)


def test_good_actions_are_unchanged():
    turn = parse_action(message('{"expression": "12 * (3 + 4)"}', content=[{"type": "text", "text": "let me"},
                                                                            {"type": "image_url", "image_url": {}}]))
    assert turn.text == "let me" and turn.error is None
    (call,) = turn.calls
    assert (call.id, call.name, call.arguments, call.error) == ("c1", "calculator", {"expression": "12 * (3 + 4)"}, None)
    assert call.raw_arguments == '{"expression": "12 * (3 + 4)"}'
    (call,) = parse_action(message({"expression": ("1", "+", "1")})).calls  # a tuple is a JSON array
    assert call.arguments == {"expression": ["1", "+", "1"]}
