"""Tests for openenv_gym.sse: a round-trip fuzz over chunk boundaries plus ORS wire examples."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openenv_gym.sse import ServerSentEvent, SSEDecoder, parse_sse

ENDINGS = ("\r\n", "\n", "\r")


def decode_in_chunks(text: str, cuts: list[int]) -> tuple[list[ServerSentEvent], SSEDecoder]:
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    bounds = [0, *sorted(cuts), len(text)]
    for start, stop in zip(bounds, bounds[1:]):
        events.extend(decoder.feed(text[start:stop]))
    events.extend(decoder.close())
    return events, decoder


# ------------------------------------------------------------------------------------------
# Round-trip fuzz
# ------------------------------------------------------------------------------------------

# No CR in data: SSE cannot carry it (it is a line ending). LF is fine: it becomes several
# `data:` lines. The default alphabet includes U+2028, U+0085 etc., which must not split lines.
data_text = st.text(st.characters(blacklist_characters="\r", blacklist_categories=("Cs",)))
line_value = st.text(
    st.characters(blacklist_characters="\r\n\0", blacklist_categories=("Cs",)), max_size=8
)


@st.composite
def event_specs(draw: st.DrawFn) -> dict:
    return {
        # "" and "message" both mean the default type; None omits the `event:` line.
        "event": draw(st.sampled_from([None, "", "message", "task_id", "chunk", "end", "error"])),
        # None: a block with no data line, which must not be dispatched.
        "data": draw(st.one_of(st.none(), data_text)) if draw(st.booleans()) else draw(data_text),
        "id": draw(st.one_of(st.none(), line_value)),
        "retry": draw(st.one_of(st.none(), st.integers(0, 10**6))),
        "junk": draw(st.booleans()),
    }


def field_line(name: str, value: str, space: bool) -> str:
    # A value that starts with a space needs the separator space, or the decoder strips its own.
    return f"{name}: {value}" if space or value[:1] == " " else f"{name}:{value}"


def event_lines(spec: dict, draw: st.DrawFn) -> list[str]:
    lines: list[str] = []
    if spec["event"] is not None:
        lines.append(field_line("event", spec["event"], draw(st.booleans())))
    if spec["id"] is not None:
        lines.append(field_line("id", spec["id"], draw(st.booleans())))
    if spec["retry"] is not None:
        lines.append(field_line("retry", str(spec["retry"]), draw(st.booleans())))
    if spec["junk"]:
        lines.append(draw(st.sampled_from(["unknown: x", "bogus", "retry: soon", "Data: no"])))
    # Field order inside a block does not matter, except among `data` lines: shuffle the other
    # fields, then interleave the data lines in their own order at random positions.
    lines = list(draw(st.permutations(lines)))
    if spec["data"] is not None:
        position = 0
        for part in spec["data"].split("\n"):
            position = draw(st.integers(position, len(lines)))
            lines.insert(position, field_line("data", part, draw(st.booleans())))
            position += 1
    return lines


def expected_events(specs: list[dict]) -> list[ServerSentEvent]:
    out: list[ServerSentEvent] = []
    last_id: str | None = None
    for spec in specs:
        if spec["id"] is not None:
            last_id = spec["id"]  # the last event ID persists, even across undispatched blocks
        if spec["data"] is None:
            continue
        out.append(
            ServerSentEvent(
                event=spec["event"] or "message", data=spec["data"], id=last_id, retry=spec["retry"]
            )
        )
    return out


comment_line = st.sampled_from(
    [":", ": ping - 2026-11-22 07:13:17.893522+00:00", ":ping", ":: data: not a field"]
)


@st.composite
def streams(draw: st.DrawFn) -> tuple[str, list[dict], int, list[int]]:
    specs = draw(st.lists(event_specs(), max_size=6))
    lines: list[str] = []
    for spec in specs:
        lines.extend(event_lines(spec, draw))
        lines.append("")
    # Comments may sit anywhere: before, inside and between blocks.
    n_comments = 0
    for _ in range(draw(st.integers(0, 4))):
        lines.insert(draw(st.integers(0, len(lines))), draw(comment_line))
        n_comments += 1
    parts: list[str] = []
    previous = ""
    for line in lines:
        ending = draw(st.sampled_from(ENDINGS))
        # CR then an LF-terminated empty line reads as one CRLF: no writer can express that.
        if previous == "\r" and line == "" and ending == "\n":
            ending = "\r\n"
        parts.append(line + ending)
        previous = ending
    text = "".join(parts)
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=12))
    if draw(st.booleans()):
        # Uniform cuts rarely land between CR and LF; this is where decoders usually break.
        cuts += [i + 1 for i, c in enumerate(text) if c == "\r"]
    return text, specs, n_comments, cuts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_round_trip_with_arbitrary_chunking(stream: tuple[str, list[dict], int, list[int]]) -> None:
    text, specs, n_comments, cuts = stream
    events, decoder = decode_in_chunks(text, cuts)
    assert events == expected_events(specs)
    assert decoder.comments == n_comments


@settings(max_examples=50, deadline=None)
@given(streams())
def test_one_character_at_a_time(stream: tuple[str, list[dict], int, list[int]]) -> None:
    text, specs, n_comments, _ = stream
    events, decoder = decode_in_chunks(text, list(range(1, len(text))))
    assert events == expected_events(specs)
    assert decoder.comments == n_comments


# ------------------------------------------------------------------------------------------
# ORS wire examples
# ------------------------------------------------------------------------------------------

ORS_CALL = (
    "event: task_id\r\ndata: 1862ffe361524375b357c39c910b7354\r\n\r\n"
    'event: end\r\ndata: {"ok":true,"output":{"blocks":[{"text":"Correct!","detail":null,'
    '"type":"text"}],"metadata":{"expected":"4"},"reward":1.0,"finished":true}}\r\n\r\n'
)


def test_ors_tool_call_bytes() -> None:
    events = parse_sse(ORS_CALL)
    assert [e.event for e in events] == ["task_id", "end"]
    assert events[0].data == "1862ffe361524375b357c39c910b7354"
    result = json.loads(events[1].data)
    assert result["ok"] is True
    assert result["output"]["reward"] == 1.0 and result["output"]["finished"] is True


@pytest.mark.parametrize("cut", range(len("event: task_id\r\n") - 2, len("event: task_id\r\n") + 2))
def test_crlf_split_across_chunks(cut: int) -> None:
    events, _ = decode_in_chunks(ORS_CALL, [cut])
    assert events == parse_sse(ORS_CALL)


def test_chunked_9000_char_payload() -> None:
    payload = json.dumps({"ok": True, "output": {"blocks": [{"text": "x" * 9000, "type": "text"}]}})
    pieces = [payload[i : i + 4096] for i in range(0, len(payload), 4096)]
    body = "event: task_id\r\ndata: abc\r\n\r\n" + "".join(
        f"event: {'end' if i == len(pieces) - 1 else 'chunk'}\r\ndata: {piece}\r\n\r\n"
        for i, piece in enumerate(pieces)
    )
    # Deliver it in network-ish 1000-char reads.
    events, _ = decode_in_chunks(body, list(range(1000, len(body), 1000)))
    assert [e.event for e in events] == ["task_id", "chunk", "chunk", "end"]
    assert json.loads("".join(e.data for e in events[1:])) == json.loads(payload)


def test_error_event() -> None:
    events = parse_sse(
        "event: task_id\r\ndata: 42\r\n\r\nevent: error\r\ndata: boom on purpose\r\n\r\n"
    )
    assert events[-1] == ServerSentEvent(event="error", data="boom on purpose")


def test_empty_end_event_is_dispatched() -> None:
    # /create_session ends with an `end` event whose data line is empty: it still counts.
    assert parse_sse("event: end\r\ndata: \r\n\r\n") == [ServerSentEvent(event="end", data="")]
    assert parse_sse("event: end\r\ndata:\r\n\r\n") == [ServerSentEvent(event="end", data="")]


def test_keep_alive_comments_are_counted_not_dispatched() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(
        "event: task_id\r\ndata: t\r\n\r\n: ping - 2026-11-22 07:13:17.893522+00:00\r\n\r\n"
    )
    assert decoder.comments == 1
    assert [e.event for e in events] == ["task_id"]


# ------------------------------------------------------------------------------------------
# Field rules and end of stream
# ------------------------------------------------------------------------------------------


def test_field_rules() -> None:
    body = (
        "data\n\n"
        "data:a\ndata:  b\nevent\n\n"
        "id: 7\nretry: 15\ndata: x\n\n"
        "data: y\n\n"
        "id\ndata: z\n\n"
    )
    assert parse_sse(body) == [
        ServerSentEvent(data=""),  # a field name without colon has an empty value
        ServerSentEvent(data="a\n b"),  # only one leading space is stripped
        ServerSentEvent(data="x", id="7", retry=15),
        ServerSentEvent(data="y", id="7"),  # the last event ID persists, retry does not
        ServerSentEvent(data="z", id=""),  # an empty id resets it
    ]


def test_an_enormous_retry_value_is_ignored_not_raised() -> None:
    # int() of more than 4300 digits raises ValueError: a server could crash the reader with it.
    assert parse_sse(f"retry: {'9' * 5000}\ndata: x\n\n") == [ServerSentEvent(data="x")]
    assert parse_sse(f"retry: {'9' * 19}\ndata: x\n\n") == [ServerSentEvent(data="x")]
    assert parse_sse(f"retry: {'9' * 18}\ndata: x\n\n")[0].retry == 10**18 - 1


def test_ignored_fields() -> None:
    body = "event: e\nretry: 1s\nid: a\0b\nfoo: bar\ndata: d\n\nevent: nodata\n\n"
    assert parse_sse(body) == [ServerSentEvent(event="e", data="d")]


def test_bom_and_unicode_line_separators() -> None:
    text = "\ufeffdata: a\u2028b\x85c\x1cd\n\n"
    assert parse_sse(text) == [ServerSentEvent(data="a\u2028b\x85c\x1cd")]


def test_close_dispatches_event_missing_only_the_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed("event: end\r\ndata: {}\r\n") == []
    assert decoder.close() == [ServerSentEvent(event="end", data="{}")]
    # A trailing CR is a complete line ending too.
    assert parse_sse("data: x\r") == [ServerSentEvent(data="x")]


def test_close_discards_event_cut_mid_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed('event: end\r\ndata: {"ok": tr') == []
    assert decoder.close() == []
    # Complete data lines do not rescue an event whose last line was cut off.
    assert decoder.feed("event: chunk\ndata: first\ndata: sec") == []
    assert decoder.close() == []


def test_decoder_is_reusable_after_close() -> None:
    decoder = SSEDecoder()
    decoder.feed("data: half")
    assert decoder.close() == []
    assert decoder.feed("data: whole\n\n") == [ServerSentEvent(data="whole")]


def test_long_line_in_tiny_chunks() -> None:
    line = "data: " + "y" * 200_000 + "\n\n"
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    for i in range(0, len(line), 7):
        events.extend(decoder.feed(line[i : i + 7]))
    assert events == [ServerSentEvent(data="y" * 200_000)]
