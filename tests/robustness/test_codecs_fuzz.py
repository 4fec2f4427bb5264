"""Fuzzing the decoders that read bytes from outside: SSE frames, vector-env ops, wire types.

Each must turn anything into either its value or a typed error (``msgspec.DecodeError``, a
``ValueError``), never another exception and never a hang; valid values round-trip exactly.
"""

from __future__ import annotations

import codecs
import json
import math

try:
    import msgpack  # the format's reference implementation (it comes with the ray extra)
except ImportError:  # tests that compare with it are marked needs("msgpack")
    msgpack = None

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from openenv_gym.shard.ops import Op, OpKind, Result, decode_ops, decode_results, encode_ops, encode_results
from openenv_gym.sse import ServerSentEvent, SSEDecoder, parse_sse
from openenv_gym.wire import (
    JSON_INT_MAX,
    JSON_INT_MIN,
    MAX_JSON_DEPTH,
    AssistantMessage,
    Opening,
    Outcome,
    TaskRef,
    ToolSpec,
    json_decode,
    loads_plain_json,
    msgpack_decode,
    msgpack_encode,
    to_plain_json,
)

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
MANY = settings(max_examples=500, deadline=None, suppress_health_check=_SLOW_OK)
SOME = settings(max_examples=200, deadline=None, suppress_health_check=_SLOW_OK)
FEW = settings(max_examples=100, deadline=None, suppress_health_check=_SLOW_OK)  # costly to generate

# -- SSE -------------------------------------------------------------------------------------------

# Mostly the characters SSE is made of, so that fields, comments and line endings are common.
sse_chars = st.sampled_from(list("data:event:id:retry: \r\n\r\n:1234567890x\ufeff\0\u2028")) | st.characters(
    blacklist_categories=())
sse_texts = st.text(sse_chars, max_size=300)


def feed_in_pieces(pieces: list[str]) -> tuple[list[ServerSentEvent], int]:
    decoder = SSEDecoder()
    events = []
    for piece in pieces:
        events.extend(decoder.feed(piece))
    events.extend(decoder.close())
    return events, decoder.comments


def cut(text, cuts: list[int]):
    bounds = [0, *sorted(c % (len(text) + 1) for c in cuts), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


@MANY
@given(sse_texts, st.lists(st.integers(0, 10**6), max_size=20))
def test_any_text_in_any_chunks_decodes_as_the_whole(text, cuts):
    whole = SSEDecoder()
    expected = whole.feed(text) + whole.close()
    events, comments = feed_in_pieces(cut(text, cuts))
    assert events == expected and comments == whole.comments


@MANY
@given(st.binary(max_size=400), st.lists(st.integers(0, 10**6), max_size=20))
def test_any_bytes_in_any_chunks_decode_without_error(data, cuts):
    """As the ORS transport reads a stream: bytes in network-sized pieces, decoded incrementally."""
    text_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = [text_decoder.decode(piece) for piece in cut(data, cuts)] + [text_decoder.decode(b"", final=True)]
    events, _ = feed_in_pieces(pieces)
    assert events == parse_sse(data.decode("utf-8", errors="replace"))


def test_a_long_line_in_tiny_chunks_completes():
    line = "data: " + "x" * 200_000 + "\n\n"
    events, _ = feed_in_pieces([line[i:i + 7] for i in range(0, len(line), 7)])
    assert events == [ServerSentEvent(data="x" * 200_000)]


# -- vector-env ops ----------------------------------------------------------------------------------

# What msgpack carries unchanged: no tuples (they come back as lists), no NaN (NaN != NaN).
msgpack_leaves = (
    st.none() | st.booleans() | st.integers(JSON_INT_MIN, JSON_INT_MAX) | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.binary(max_size=10)
)
msgpack_values = st.recursive(
    msgpack_leaves,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
str_dicts = st.dictionaries(st.text(max_size=6), msgpack_values, max_size=3)
ints = st.integers(JSON_INT_MIN, JSON_INT_MAX)
ops = st.builds(
    Op, env_id=ints, req_id=ints, kind=st.sampled_from(list(OpKind)),
    action=msgpack_values, seed=st.none() | ints, options=st.none() | str_dicts, note=st.none() | str_dicts,
    recreate=st.booleans(),
)
results = st.builds(
    Result, env_id=ints, req_id=ints, obs=st.lists(str_dicts, max_size=3), reward=st.floats(allow_nan=False),
    terminated=st.booleans(), truncated=st.booleans(), info=str_dicts, error=st.none() | str_dicts,
)


@FEW
@given(st.lists(ops, max_size=3), st.lists(results, max_size=3))
def test_ops_and_results_round_trip(op_list, result_list):
    assert decode_ops(encode_ops(op_list)) == op_list
    assert decode_results(encode_results(result_list)) == result_list


def reference_msgpack(data: bytes) -> object:
    """What msgpack's reference implementation reads from ``data``; raises unless ``data`` is
    exactly one msgpack value."""
    # Any extension type code: msgpack's ExtType refuses the negative (reserved) codes the format allows.
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=lambda code, body: (code, body))


def reference_json(data: bytes) -> object:
    """What Python's json module reads from ``data`` as UTF-8 JSON; raises unless it is one value."""
    return json.loads(data.decode("utf-8"))


def decodes_or_refuses(decode, data, reference, encode) -> str:
    """``decode`` refuses ``data`` with a ``DecodeError``, or ``data`` is one valid document of
    its format (the reference implementation reads it) and what was decoded encodes back to a
    document that decodes to the same. Returns which happened."""
    try:
        reference(data)
        valid = True
    except Exception:  # noqa: BLE001 - the reference's refusals, whatever their type
        valid = False
    try:
        value = decode(data)
    except msgspec.DecodeError:  # ValidationError is a DecodeError; both are ValueErrors
        return "refused"
    assert valid, f"decoded bytes that are not one valid document: {data[:80]!r}"
    again = encode(value)
    assert encode(decode(again)) == again
    return "decoded"


@pytest.mark.needs("msgpack")
@MANY
@given(st.binary(max_size=200))
def test_garbage_bytes_give_decode_errors(data):
    event("ops " + decodes_or_refuses(decode_ops, data, reference_msgpack, encode_ops))
    event("results " + decodes_or_refuses(decode_results, data, reference_msgpack, encode_results))


@pytest.mark.needs("msgpack")
@FEW
@given(st.lists(ops, min_size=1, max_size=3), st.data())
def test_damaged_encodings_give_decode_errors(op_list, data):
    encoded = bytearray(encode_ops(op_list))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(encoded) - 1))
        encoded[at] = data.draw(st.integers(0, 255))
    cut = bytes(encoded[: data.draw(st.integers(0, len(encoded)))])
    event("ops " + decodes_or_refuses(decode_ops, cut, reference_msgpack, encode_ops))
    event("results " + decodes_or_refuses(decode_results, bytes(encoded), reference_msgpack, encode_results))


@pytest.mark.needs("msgpack")
def test_a_cut_encoding_is_refused():
    """Ops cut anywhere short of their end are never read as fewer ops."""
    encoded = encode_ops([Op(env_id=1, req_id=2, kind="step", action={"content": "x" * 40})])
    for end in range(len(encoded)):
        assert decodes_or_refuses(decode_ops, encoded[:end], reference_msgpack, encode_ops) == "refused"


# A list of one op whose action nests 100,000 deep, and one result whose first message does.
DEEP_OPS = b"\x91\x94\x00\x00\xa4step" + b"\x91" * 100_000 + b"\x90"
DEEP_RESULTS = b"\x91\x93\x00\x00\x91\x81\xa1a" + b"\x91" * 100_000 + b"\x90"
# A list of one op whose kind is not UTF-8, and the same for a result's message key.
BAD_UTF8_OPS = b"\x91\x93\x00\x00\xa1\x80"
BAD_UTF8_RESULTS = b"\x91\x93\x00\x00\x91\x81\xa1\x80\xc0"


@pytest.mark.parametrize("decode, data", [(decode_ops, DEEP_OPS), (decode_results, DEEP_RESULTS),
                                          (decode_ops, BAD_UTF8_OPS), (decode_results, BAD_UTF8_RESULTS)],
                         ids=["deep ops", "deep results", "non-UTF-8 ops", "non-UTF-8 results"])
def test_deep_or_non_utf8_bytes_give_decode_errors(decode, data):
    with pytest.raises(msgspec.DecodeError):
        decode(data)


# -- wire types --------------------------------------------------------------------------------------

WIRE_TYPES = [None, Opening, Outcome, ToolSpec, TaskRef, AssistantMessage, list[Outcome]]


@pytest.mark.needs("msgpack")
@MANY
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_wire_decoders_refuse_garbage_with_decode_errors(data):
    for type_ in WIRE_TYPES:
        event("json " + decodes_or_refuses(lambda d, t=type_: json_decode(d, t), data, reference_json, msgspec.json.encode))
        event("msgpack " + decodes_or_refuses(lambda d, t=type_: msgpack_decode(d, t), data, reference_msgpack,
                                              msgpack_encode))


@pytest.mark.parametrize("type_", WIRE_TYPES, ids=str)
def test_wire_decoders_refuse_deep_nesting_with_decode_errors(type_):
    deep_json = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    deep_msgpack = b"\x91" * 100_000 + b"\x90"
    with pytest.raises(msgspec.DecodeError):
        json_decode(deep_json, type_)
    with pytest.raises(msgspec.DecodeError):
        msgpack_decode(deep_msgpack, type_)


outcomes = st.builds(
    Outcome, messages=st.lists(str_dicts.filter(lambda d: all(not isinstance(v, bytes) for v in d.values())), max_size=3),
    reward=st.floats(allow_nan=False, allow_infinity=False), terminated=st.booleans(), truncated=st.booleans(),
    info=st.dictionaries(st.text(max_size=5), st.text(max_size=5) | st.integers(-5, 5), max_size=3),
    tools=st.none() | st.lists(st.builds(ToolSpec, st.text(max_size=8), st.text(max_size=8)), max_size=2),
)


@SOME
@given(outcomes)
def test_outcomes_round_trip(outcome):
    assert msgpack_decode(msgpack_encode(outcome), Outcome) == outcome


# -- plain JSON (tool arguments, task specs) ---------------------------------------------------------

plain_leaves = (st.none() | st.booleans() | st.integers(JSON_INT_MIN, JSON_INT_MAX)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
plain_values = st.recursive(
    plain_leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=25,
)
python_values = st.recursive(
    plain_leaves | st.floats() | st.integers() | st.text(st.characters(blacklist_categories=()), max_size=5)
    | st.binary(max_size=3) | st.sets(st.integers(), max_size=2) | st.builds(object),
    lambda children: st.lists(children, max_size=3) | st.tuples(children)
    | st.dictionaries(st.text(max_size=3) | st.integers() | st.none(), children, max_size=3),
    max_leaves=15,
)


def is_plain(value, depth=1) -> bool:
    if value is None or type(value) is bool:
        return True
    if type(value) is str:
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if type(value) is int:
        return JSON_INT_MIN <= value <= JSON_INT_MAX
    if type(value) is float:
        return math.isfinite(value)
    if type(value) in (list, dict) and depth > MAX_JSON_DEPTH:
        return False
    if type(value) is list:
        return all(is_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) is str and is_plain(k) and is_plain(v, depth + 1) for k, v in value.items())
    return False


@MANY
@given(plain_values)
def test_plain_json_is_accepted_unchanged(value):
    assert to_plain_json(value) == (value, None)
    assert loads_plain_json(json.dumps(value)) == (value, None)
    assert loads_plain_json(json.dumps(value, ensure_ascii=False)) == (value, None)


@MANY
@given(python_values)
def test_any_python_value_is_made_plain_or_explained(value):
    result, why = to_plain_json(value)
    if why is None:
        assert is_plain(result)
    else:
        assert result is None and isinstance(why, str) and len(why) < 300
    assert (why is None) == is_plain(_tuples_as_lists(value))


def _tuples_as_lists(value):
    if isinstance(value, (list, tuple)):
        return [_tuples_as_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _tuples_as_lists(v) for k, v in value.items()}
    return value


@MANY
@given(st.text(st.sampled_from(list('{}[]",:0123456789.eE+-truefalsn \\u')) | st.characters(blacklist_categories=()),
               max_size=60))
def test_any_text_is_decoded_or_explained(text):
    result, why = loads_plain_json(text)
    assert (result is None and isinstance(why, str)) or (why is None and is_plain(result))


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 1000, 100_000])
def test_depth_limit_is_the_same_for_text_and_values(depth):
    text = "[" * depth + "]" * depth
    value, why = loads_plain_json(text)
    assert (why is None) == (depth <= MAX_JSON_DEPTH)
    nested: list = []
    node = nested
    for _ in range(depth - 1):
        node.append([])
        node = node[0]
    assert (to_plain_json(nested)[1] is None) == (depth <= MAX_JSON_DEPTH)
