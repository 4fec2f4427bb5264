"""TextToolCalls: every format round-trips hypothesis-generated calls; any text is safe.

The parser is checked on its own (round trips of Hermes/Qwen, Llama 3 JSON and both Mistral
forms with generated names, JSON arguments and surrounding text; arbitrary and adversarial text
never raises), then the wrapper over the real Arithmetic env (a local ORS server started once for
the module): parsed calls reach the env and are answered, text that holds no readable call is
answered exactly as without the wrapper.
"""

from __future__ import annotations

import json
import math
import time
import warnings

import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from recorder import Recorder, base  # noqa: F401  (base: a fixture)

import openenv_gym  # noqa: F401  (registers openenv/Arithmetic-v0)
from openenv_gym.errors import ConfigurationError
from openenv_gym.wire import AssistantMessage
from openenv_gym.wrappers import FORMATS, ConversationHistory, TextToolCalls, ToolText, parse_tool_text

MARKERS = ("<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]",
           "<|eom_id|>", "<|eot_id|>", "</s>", "<|im_end|>", "<|endoftext|>")

# -- strategies -------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
arguments = st.dictionaries(st.text(max_size=12), json_values, max_size=5)
names = st.text(min_size=1, max_size=30)
ident_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,30}", fullmatch=True)
# Text around the calls: anything without the formats' own markers (a marker in prose is a call).
prose = st.text(max_size=40).filter(lambda s: not any(m in s for m in MARKERS))
leading_prose = prose.filter(lambda s: not s.lstrip().startswith(("{", "[")))
calls_st = st.lists(st.tuples(names, arguments), min_size=1, max_size=4)


def dumps(value, ascii_: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_)


def expected_content(pieces: list[str]) -> str | None:
    return "\n".join(p.strip() for p in pieces if p.strip()) or None


def check_calls(found: ToolText, fmt: str, calls: list[tuple[str, dict]], content: str | None) -> None:
    assert found.format == fmt and found.error is None, found
    assert [c["function"]["name"] for c in found.calls] == [n for n, _ in calls]
    assert [json.loads(c["function"]["arguments"]) for c in found.calls] == [a for _, a in calls]
    assert all(c["type"] == "function" and isinstance(c["id"], str) and c["id"] for c in found.calls)
    assert len({c["id"] for c in found.calls}) == len(found.calls)
    assert found.content == content


# -- round trips ------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(calls=calls_st, data=st.data(), ascii_=st.booleans(), sep=st.sampled_from(["", "\n", " \n"]),
       closed_last=st.booleans(), end=st.sampled_from(["", "<|im_end|>", "\n"]))
def test_hermes_round_trips(calls, data, ascii_, sep, closed_last, end):
    pieces = [data.draw(prose) for _ in range(len(calls) + 1)]
    if not closed_last:
        pieces[-1] = ""  # a last block cut off before </tool_call> has nothing after it
    text = pieces[0]
    for i, (name, args) in enumerate(calls):
        closing = f"{sep}</tool_call>" if closed_last or i < len(calls) - 1 else ""
        text += f"<tool_call>{sep}{dumps({'name': name, 'arguments': args}, ascii_)}{closing}" + pieces[i + 1]
    check_calls(parse_tool_text(text + end, ["hermes"]), "hermes", calls, expected_content(pieces))


@settings(max_examples=150, deadline=None)
@given(calls=calls_st, before=leading_prose, tag=st.booleans(), key=st.sampled_from(["parameters", "arguments"]),
       shape=st.sampled_from(["semicolons", "array"]), ascii_=st.booleans(),
       end=st.sampled_from(["", "<|eom_id|>", "<|eot_id|>"]))
def test_llama3_json_round_trips(calls, before, tag, key, shape, ascii_, end):
    objs = [{"name": n, key: a} for n, a in calls]
    body = "; ".join(dumps(o, ascii_) for o in objs) if shape == "semicolons" else dumps(objs, ascii_)
    text = (before + "<|python_tag|>" + body) if tag else body
    content = expected_content([before]) if tag else None
    check_calls(parse_tool_text(text + end, ["llama3_json"]), "llama3_json", calls, content)


@settings(max_examples=150, deadline=None)
@given(calls=calls_st, before=prose, ascii_=st.booleans(), with_ids=st.booleans(), end=st.sampled_from(["", "</s>"]))
def test_mistral_json_list_round_trips(calls, before, ascii_, with_ids, end):
    objs = [{"name": n, "arguments": a, **({"id": f"abc{i:06d}"} if with_ids else {})} for i, (n, a) in enumerate(calls)]
    found = parse_tool_text(before + "[TOOL_CALLS]" + dumps(objs, ascii_) + end, ["mistral"])
    check_calls(found, "mistral", calls, expected_content([before]))
    if with_ids:
        assert [c["id"] for c in found.calls] == [o["id"] for o in objs]
    else:  # what Mistral's chat templates require: 9 alphanumerics
        assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in found.calls)


@settings(max_examples=100, deadline=None)
@given(calls=st.lists(st.tuples(ident_names, arguments), min_size=1, max_size=4), before=prose,
       ids=st.booleans(), ascii_=st.booleans())
def test_mistral_args_form_round_trips(calls, before, ids, ascii_):
    text = before + "".join(
        f"[TOOL_CALLS]{n}" + (f"[CALL_ID]x{i:08d}" if ids else "") + "[ARGS]" + dumps(a, ascii_)
        for i, (n, a) in enumerate(calls))
    found = parse_tool_text(text, ["mistral"])
    check_calls(found, "mistral", calls, expected_content([before]))
    if ids:
        assert [c["id"] for c in found.calls] == [f"x{i:08d}" for i in range(len(calls))]


def test_markers_inside_argument_strings_do_not_cut_a_call():
    args = {"a": "</tool_call>", "b": "[TOOL_CALLS]", "c": "<|python_tag|>", "d": "<tool_call>"}
    text = '<tool_call>{"name": "f", "arguments": ' + json.dumps(args) + "}</tool_call>"
    check_calls(parse_tool_text(text), "hermes", [("f", args)], None)
    text = '[TOOL_CALLS][{"name": "f", "arguments": ' + json.dumps(args) + "}]"
    check_calls(parse_tool_text(text, ["mistral"]), "mistral", [("f", args)], None)
    call = '{"name": "f", "parameters": ' + json.dumps(args) + "}"
    for text in (call, "<|python_tag|>" + call, "Checking.<|python_tag|>" + call):
        content = "Checking." if text.startswith("C") else None
        check_calls(parse_tool_text(text, ["llama3_json"]), "llama3_json", [("f", args)], content)
    # a tool named after the tag, the whole message a call
    found = parse_tool_text('{"name": "<|python_tag|>", "parameters": {}}', ["llama3_json"])
    check_calls(found, "llama3_json", [("<|python_tag|>", {})], None)


def test_arguments_written_as_a_json_string_are_passed_on():
    found = parse_tool_text('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert found.calls[0]["function"]["arguments"] == '{"x": 1}'


# -- never raises, and what is not a call stays text -----------------------------------------------

fragments = st.lists(st.sampled_from(list(MARKERS) + [
    "{", "}", "[", "]", '"name"', '"arguments"', '"parameters"', ":", ",", ";", '"f"', "1", "1e999",
    "NaN", "null", "\\", '"', " ", "\n", "{}", "[]", "x", '"\\ud800"', "\ud800", "9" * 5000,
]), max_size=40).map("".join)
any_text = st.text(st.characters(exclude_categories=()))  # lone surrogates included


@settings(max_examples=400, deadline=None)
@given(text=any_text | fragments | st.tuples(fragments, any_text, fragments).map("".join),
       formats=st.lists(st.sampled_from(FORMATS), min_size=1, unique=True))
def test_parse_never_raises_and_returns_well_formed_calls(text, formats):
    found = parse_tool_text(text, formats)
    assert isinstance(found, ToolText)
    assert (found.error is None) or not found.calls
    for call in found.calls:
        assert isinstance(call["id"], str) and call["type"] == "function"
        assert isinstance(call["function"]["name"], str) and call["function"]["name"]
        assert isinstance(call["function"]["arguments"], str)


# -- linear in the text, whatever it holds --------------------------------------------------------

# What adversarial texts are made of: a prefix, then one unit repeated (markers, end-of-turn tokens,
# JSON openers, quotes, whitespace, a complete call object).
PIECES = [*MARKERS, "{", "[", '"', "\\", " ", "\n", '{"name": "f"}', ";", "x"]


def parse_cost(text: str) -> float:
    """CPU seconds of this thread for one parse: the least of five (the machine is shared)."""
    best = math.inf
    for _ in range(5):
        start = time.thread_time()
        parse_tool_text(text)
        best = min(best, time.thread_time() - start)
    return best


@settings(max_examples=25, deadline=None)
@given(prefix=st.sampled_from(["", *MARKERS]), unit=st.lists(st.sampled_from(PIECES), min_size=1, max_size=3).map("".join))
@example(prefix="", unit="</s>")  # was quadratic: a megabyte of </s> took 4 s, holding the GIL
@example(prefix="<tool_call>", unit="<|eot_id|>\n")
def test_parsing_is_linear_in_the_text(prefix, unit):
    """Four times the text costs about four times as much, never sixteen (a ratio in one run)."""
    n = 50_000 // len(unit) + 1
    small, large = (parse_cost(prefix + unit * k) for k in (n, 4 * n))
    # Under a millisecond for 200,000 characters there is nothing to see but timer noise.
    assert large < 1e-3 or large / max(small, 1e-5) < 8, (prefix, unit, small, large)


@pytest.mark.parametrize("text", [
    "", "The answer is 42.", '{"answer": 42}', "[1, 2, 3]", "I would call <tool_call> but I won't",
    "[TOOL_CALLS] nothing", '<tool_call>{"arguments": {}}</tool_call>', '{"name": 1, "parameters": {}}',
    "[" * 100_000, "<tool_call>" + "{" * 100_000, "<|python_tag|>" + "[" * 100_000, " " * 100_000 + "x",
    '<tool_call>{"name": "f", "arguments": {}} trailing</tool_call>', '{"name": "f", "parameters": [1]}',
    '<tool_call>{"name": "f", "arguments": {"n": ' + "9" * 10_000 + "}}</tool_call>",
])
def test_text_without_readable_calls_yields_no_calls(text):
    found = parse_tool_text(text)
    assert found.calls == []


def test_failures_are_reported_only_when_markers_are_there():
    assert parse_tool_text("plain words") == ToolText()
    assert parse_tool_text('{"answer": 3}') == ToolText()  # JSON, but not a call: no error
    bad = parse_tool_text("<tool_call>{oops}</tool_call>")
    assert bad.format == "hermes" and "not valid JSON" in bad.error and bad.calls == []
    assert parse_tool_text('{"name": "f", "parameters": ').format == "llama3_json"


def test_formats_select_the_parsers():
    hermes = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    mistral = '[TOOL_CALLS][{"name": "f", "arguments": {}}]'
    assert parse_tool_text(hermes, ["mistral"]) == ToolText()
    assert parse_tool_text(mistral, ["hermes", "llama3_json"]).calls == []
    assert parse_tool_text(mistral, ["mistral"]).calls


# -- the wrapper over the real env ------------------------------------------------------------------


@pytest.fixture
def wrapped(base):
    recorder = Recorder(base)
    env = TextToolCalls(recorder)
    env.reset(seed=0)
    return env, recorder


def calc(expression: str) -> dict:
    return {"name": "calculator", "arguments": {"expression": expression}}


@pytest.mark.parametrize("text, fmt", [
    ("Let me compute.\n<tool_call>\n" + json.dumps(calc("6 * 7")) + "\n</tool_call>", "hermes"),
    ('<|python_tag|>{"name": "calculator", "parameters": {"expression": "6 * 7"}}<|eom_id|>', "llama3_json"),
    ('{"name": "calculator", "parameters": {"expression": "6 * 7"}}', "llama3_json"),
    ("[TOOL_CALLS]" + json.dumps([calc("6 * 7")]), "mistral"),
    ('[TOOL_CALLS]calculator[ARGS]{"expression": "6 * 7"}', "mistral"),
])
def test_each_format_reaches_the_env_as_a_tool_call(wrapped, text, fmt):
    env, recorder = wrapped
    obs, reward, terminated, truncated, info = env.step(text)
    assert obs == [{"role": "tool", "tool_call_id": recorder.actions[-1]["tool_calls"][0]["id"],
                    "name": "calculator", "content": "42"}]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["text_tool_calls"] == {"format": fmt, "calls": 1}
    assert info["assistant_message"] == recorder.actions[-1]
    assert info["calls"][0]["ok"]


def test_several_calls_run_in_order_and_the_text_is_kept(wrapped):
    env, recorder = wrapped
    text = ("First <tool_call>" + json.dumps(calc("1 + 1")) + "</tool_call> then "
            "<tool_call>" + json.dumps(calc("2 * 5")) + "</tool_call>")
    obs, *_ = env.step({"role": "assistant", "content": text, "reasoning_content": "kept"})
    sent = recorder.actions[-1]
    assert sent["content"] == "First\nthen" and sent["reasoning_content"] == "kept"
    assert [m["content"] for m in obs] == ["2", "10"]
    assert [m["tool_call_id"] for m in obs] == [c["id"] for c in sent["tool_calls"]]


def test_ids_are_unique_within_an_episode(wrapped):
    env, recorder = wrapped
    for _ in range(3):
        env.step("<tool_call>" + json.dumps(calc("1")) + "</tool_call>")
    ids = [a["tool_calls"][0]["id"] for a in recorder.actions]
    assert len(set(ids)) == 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(exclude_categories=()), max_size=200) | fragments)
@example(text='<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>')
@example(text='[TOOL_CALLS]submit[ARGS]{"answer": "0"}[TOOL_CALLS]nosuch[ARGS]{}')  # the 2nd after the end
@example(text='{"name": "f", "parameters": {}}; {"name": "calculator"}')
def test_any_text_reaches_the_env_unchanged_or_as_the_calls_it_holds(base, text):
    recorder = Recorder(base)
    env = TextToolCalls(recorder)
    env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(text)
    found = parse_tool_text(text, FORMATS, turn=1)
    if not found.calls:  # nothing readable: the env got the very text and answered it as text
        assert recorder.actions == [text]
        assert reward == 0.0 and not terminated
        assert obs[0]["role"] == "user"
        assert "assistant_message" not in info
        assert info.get("text_tool_calls") == ({"format": found.format, "error": found.error} if found.format else None)
    else:  # the env got exactly the calls the parser read, and answered each of them
        sent = {"role": "assistant", "content": found.content, "tool_calls": found.calls}
        assert recorder.actions == [sent] and info["assistant_message"] == sent
        assert info["text_tool_calls"] == {"format": found.format, "calls": len(found.calls)}
        answered = [m["tool_call_id"] for m in obs if m["role"] == "tool"]
        assert answered == [c["id"] for c in found.calls]


def test_an_unreadable_call_gets_the_envs_own_answer(base):
    text = "<tool_call>{not json}</tool_call>"
    base.reset(seed=2)
    _, _, _, _, plain_info = base.step(text)
    plain = base.step(text)[0]  # the same answer both times: the env answers text without a call
    env = TextToolCalls(base)
    env.reset(seed=2)
    obs, reward, terminated, truncated, info = env.step(text)
    assert obs == plain and reward == 0.0 and not (terminated or truncated)
    assert info["text_tool_calls"]["format"] == "hermes" and "not valid JSON" in info["text_tool_calls"]["error"]
    assert info["invalid_action"] == plain_info["invalid_action"] == "no_tool_call"


def test_other_actions_pass_through_untouched(wrapped):
    env, recorder = wrapped
    call = {"role": "assistant", "content": "<tool_call>ignored</tool_call>",
            "tool_calls": [{"id": "x", "type": "function", "function": calc("3")}]}
    env.step(call)
    assert recorder.actions[-1] == call  # a message that already has tool calls is not parsed
    struct = AssistantMessage(content='<tool_call>{"name": "calculator", "arguments": {"expression": "5"}}</tool_call>')
    obs, *_ = env.step(struct)
    assert obs[0]["content"] == "5"
    obs, *_, info = env.step(None)  # not text: the env answers it as always
    assert recorder.actions[-1] is None and "text_tool_calls" not in info


def test_conversation_history_above_holds_the_parsed_calls(base):
    env = ConversationHistory(TextToolCalls(base, formats=["hermes"]))
    env.reset(seed=3)
    obs, *_ = env.step("<tool_call>" + json.dumps(calc("2 + 3")) + "</tool_call>")
    assistant, tool = obs[-2], obs[-1]
    assert assistant["tool_calls"][0]["function"] == {"name": "calculator", "arguments": '{"expression": "2 + 3"}'}
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"] and tool["content"] == "5"


def test_submit_through_text_ends_the_episode_with_its_reward(base):
    env = TextToolCalls(base, formats="llama3_json")
    obs, info = env.reset(options={"split": "test", "index": 4})
    question = obs[0]["content"].split("Compute ", 1)[1].split(". ", 1)[0]
    answer = env.step(json.dumps({"name": "calculator", "parameters": {"expression": question}}))[0][0]["content"]
    obs, reward, terminated, truncated, info = env.step(
        json.dumps({"name": "submit", "parameters": {"answer": answer}}))
    assert (reward, terminated) == (1.0, True)


@pytest.mark.parametrize("formats", [[], ["xml"], ["hermes", "json"]])
def test_bad_formats_are_refused(base, formats):
    with pytest.raises(ConfigurationError, match="formats"):
        TextToolCalls(base, formats=formats)


def test_check_env_passes(base):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*different from the unwrapped.*")
        check_env(TextToolCalls(base), skip_render_check=True)
