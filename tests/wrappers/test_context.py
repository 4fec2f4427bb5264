"""ContextManagement: the Fleet context tools answered locally, over the real Arithmetic env and a fake.

The Arithmetic example (a real ORS server subprocess, started once for the module) shows the
wrapper over a real AgentEnv: tools listed, local calls never forwarded, mixed actions, check_env.
A tiny in-process fake env returns tool outputs of any size for truncation, paging and pruning;
hypothesis checks that paging gives back every output exactly.
"""

from __future__ import annotations

import copy
import json
import re
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorder import Recorder, base  # noqa: F401  (base: a fixture)

import openenv_gym  # noqa: F401  (registers openenv/Arithmetic-v0)
from openenv_gym.actions import parse_action, tool_message, user_message
from openenv_gym.errors import ConfigurationError, EpisodeFinished, EpisodeNotStarted
from openenv_gym.spaces import AssistantAction, Messages
from openenv_gym.wire import ToolSpec
from openenv_gym.wrappers import CONTEXT_TOOLS, ContextManagement

LOCAL_NAMES = {t.name for t in CONTEXT_TOOLS}


def call(name: str, args: dict | str | None = None, id: str | None = "c") -> dict:
    fn = {"name": name, "arguments": json.dumps(args or {}) if not isinstance(args, str) else args}
    return {"type": "function", "function": fn, **({"id": id} if id is not None else {})}


def act(*calls: dict, content: str | None = None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def body(answer: str) -> str:
    """A view_tool_output answer minus its header line: the raw page."""
    return answer.split("\n", 1)[1]


# -- a fake env following the contract ---------------------------------------------------------------

_OBJ = {"type": "object", "additionalProperties": False}


class FakeChatEnv(gym.Env):
    """Tools: echo(text) returns text; echo_parts(text) as content parts with an image; grow()
    adds a tool (reported in info["tools"]); finish() terminates. Records every action it gets."""

    metadata = {"render_modes": []}
    TOOLS = [
        ToolSpec("echo", "Echo.", {**_OBJ, "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        ToolSpec("echo_parts", "Echo as parts.", {**_OBJ, "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        ToolSpec("grow", "Add a tool.", {**_OBJ, "properties": {}}),
        ToolSpec("finish", "End.", {**_OBJ, "properties": {}}),
    ]

    def __init__(self, tools: list[ToolSpec] | None = None):
        self.observation_space = Messages()
        self.action_space = AssistantAction(tools or self.TOOLS)
        self.received: list = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.action_space.tools = list(self.action_space.tools)
        self.received = []
        opening = [{"role": "system", "content": "You are tested."}, {"role": "user", "content": "Do the task."}]
        return opening, {"tools": [t.to_openai() for t in self.action_space.tools], "task_id": "fake/0"}

    def step(self, action):
        self.received.append(copy.deepcopy(action))
        turn = parse_action(action)
        messages, info, terminated = [], {}, False
        if not turn.calls:
            messages.append(user_message("No tool call found."))
        for c in turn.calls:
            if c.name == "echo":
                messages.append(tool_message(c.id, c.name, c.arguments["text"]))
            elif c.name == "echo_parts":
                parts = [{"type": "text", "text": c.arguments["text"]},
                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
                messages.append(tool_message(c.id, c.name, parts))
            elif c.name == "grow":
                self.action_space.tools = [*self.action_space.tools, ToolSpec("extra", "New.", {**_OBJ, "properties": {}})]
                info["tools"] = [t.to_openai() for t in self.action_space.tools]
                messages.append(tool_message(c.id, c.name, "grown"))
            elif c.name == "finish":
                terminated = True
                messages.append(tool_message(c.id, c.name, "done"))
            else:
                messages.append(tool_message(c.id, c.name, f"Error: unknown tool {c.name!r}."))
        return messages, 1.0 if terminated else 0.0, terminated, False, info


def fake(**kwargs) -> ContextManagement:
    env = ContextManagement(FakeChatEnv(), **kwargs)
    env.reset(seed=0)
    return env


def run(env: ContextManagement, name: str, **args) -> str:
    """One local call; returns its answer text."""
    obs, reward, terminated, truncated, info = env.step(act(call(name, args, id="x")))
    assert len(obs) == 1 and obs[0]["tool_call_id"] == "x" and obs[0]["name"] == name
    assert (reward, terminated, truncated) == (0.0, False, False)
    return obs[0]["content"]


# -- over the real Arithmetic env ---------------------------------------------------------------------


@pytest.fixture
def arith(base):
    recorder = Recorder(base)
    return ContextManagement(recorder), recorder


def sent_names(recorder: Recorder) -> list[str]:
    return [c["function"]["name"] for a in recorder.actions for c in a.get("tool_calls") or ()]


def test_tools_are_listed_and_accepted_by_the_action_space(arith):
    env, _ = arith
    _, info = env.reset(seed=3)
    names = [t["function"]["name"] for t in info["tools"]]
    assert names[:2] == ["calculator", "submit"] and set(names[2:]) == LOCAL_NAMES
    for spec in info["tools"][2:]:
        assert spec["type"] == "function" and spec["function"]["parameters"]["additionalProperties"] is False
    assert env.action_space.contains(act(call("view_tool_output", {"output_id": 1})))
    env.action_space.seed(0)
    sampled = {s["tool_calls"][0]["function"]["name"] for s in (env.action_space.sample() for _ in range(200))
               if isinstance(s, dict)}
    assert LOCAL_NAMES | {"calculator", "submit"} <= sampled
    assert not LOCAL_NAMES & {t.name for t in env.unwrapped.action_space.tools}  # the inner space is untouched
    assert env.unwrapped.num_tasks("train") >= 1000  # the task API stays on unwrapped


def test_local_calls_are_answered_here_and_do_not_use_turns(arith):
    env, recorder = arith
    obs, info = env.reset(seed=3)
    question = env.unwrapped.task(info["split"], info["index"])["question"]
    for n in range(10):  # more than the env's max_turns=8: local calls are not turns
        answer = json.loads(run(env, "check_context"))
        assert answer["messages"] == 1 + 2 * n and answer["turns"] == n
    assert recorder.actions == []
    obs, reward, terminated, truncated, _ = env.step(act(call("calculator", {"expression": question})))
    assert obs[0]["role"] == "tool" and not truncated and not terminated
    assert sent_names(recorder) == ["calculator"]
    hits = run(env, "search_history", pattern=re.escape(question))
    assert "message 0 [user]" in hits and "calculator(" in hits


def test_mixed_actions_forward_only_env_calls_and_keep_the_order(arith):
    env, recorder = arith
    _, info = env.reset(seed=4)
    answer = env.unwrapped.task(info["split"], info["index"])["answer"]
    action = act(
        call("check_context", id=None),
        call("calculator", {"expression": "2+3"}, id=None),
        call("search_history", {"pattern": "Compute"}, id=None),
        call("calculator", {"expression": "4*5"}, id=None),
        content="thinking",
    )
    obs, reward, terminated, truncated, info = env.step(action)
    assert [m["tool_call_id"] for m in obs] == ["call_0", "call_1", "call_2", "call_3"]
    assert [m["name"] for m in obs] == ["check_context", "calculator", "search_history", "calculator"]
    assert obs[1]["content"] == "5" and obs[3]["content"] == "20" and "message 0 [user]" in obs[2]["content"]
    assert info["local_calls"] == [{"name": "check_context", "ok": True}, {"name": "search_history", "ok": True}]
    sent = recorder.actions[-1]
    assert sent["content"] == "thinking" and [c["id"] for c in sent["tool_calls"]] == ["call_1", "call_3"]
    assert sent_names(recorder) == ["calculator", "calculator"]
    # Duplicate ids still pair up in order; the env's reward and termination come through.
    obs, reward, terminated, _, _ = env.step(act(call("submit", {"answer": answer}), call("check_context")))
    assert [m["name"] for m in obs] == ["submit", "check_context"] and obs[0]["content"] == "Correct!"
    assert reward == 1.0 and terminated
    with pytest.raises(EpisodeFinished):
        env.step(act(call("check_context")))


def test_check_env_passes_on_the_wrapped_env(base):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*different from the unwrapped.*")
        check_env(ContextManagement(base), skip_render_check=True)


# -- truncation and exact paging (fake env) ----------------------------------------------------------


def test_long_outputs_are_truncated_with_a_note_and_kept_in_full():
    env = fake(max_output_chars=100)
    text = "".join(f"row {i}: {'x' * (i % 7)}\n" for i in range(300))
    obs, *_ = env.step(act(call("echo", {"text": text})))
    shown = obs[0]["content"]
    assert shown.startswith(text[:100] + "\n[Output truncated")
    assert "output_id=1" in shown and "view_tool_output(output_id=1, page=1)" in shown and f"{len(text):,}" in shown
    first = run(env, "view_tool_output", output_id=1)
    assert first.startswith("[output_id=1 page 1 of ") and body(first) == text[: len(body(first))]
    assert env.full_history[-1]["content"] == first  # local answers are part of the conversation
    short, *_ = env.step(act(call("echo", {"text": "short"})))
    assert short[0]["content"] == "short"  # under the limit: untouched, but stored as output 2
    assert body(run(env, "view_tool_output", output_id=2)) == "short"


def test_content_parts_are_truncated_and_images_kept():
    env = fake(max_output_chars=10)
    obs, *_ = env.step(act(call("echo_parts", {"text": "abcdefghijklmnop"})))
    parts = obs[0]["content"]
    assert parts[0]["type"] == "text" and parts[0]["text"].startswith("abcdefghij\n[Output truncated")
    assert parts[1]["type"] == "image_url"
    assert body(run(env, "view_tool_output", output_id=1, page=1)) == "abcdefghij"


_PIECES = st.one_of(
    st.text(max_size=25),
    st.sampled_from(["\n", "\n", "\r\n", "\r", "", "é", "日本", "😀", "\u2028", "\x00", " "]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.lists(_PIECES, max_size=40).map("".join),
    limit=st.integers(1, 40),
    page_size=st.integers(1, 6),
)
def test_pages_join_back_to_the_exact_output(text, limit, page_size):
    env = fake(max_output_chars=limit)
    obs, *_ = env.step(act(call("echo", {"text": text})))
    if len(text) > limit:
        assert obs[0]["content"].startswith(text[:limit] + "\n[Output truncated")
    else:
        assert obs[0]["content"] == text
    first = run(env, "view_tool_output", output_id=1, page=1, page_size=page_size)
    count = int(re.match(r"\[output_id=1 page 1 of (\d+)", first).group(1))
    answers = [first]
    if count > 1:  # the other pages in one message: several local calls answered in order
        more = [call("view_tool_output", {"output_id": 1, "page": p, "page_size": page_size}, id=f"p{p}")
                for p in range(2, count + 1)]
        obs, *_ = env.step(act(*more))
        assert [m["tool_call_id"] for m in obs] == [f"p{p}" for p in range(2, count + 1)]
        answers += [m["content"] for m in obs]
    pages = [body(a) for a in answers]
    assert "".join(pages) == text
    assert "".join(pages).encode() == text.encode()
    for p, page in enumerate(pages, 1):
        assert answers[p - 1].startswith(f"[output_id=1 page {p} of {count}")
        assert len(page) <= limit and page.count("\n") <= page_size
        assert page or count == 1  # no empty pages, except for an empty output
    out_of_range = run(env, "view_tool_output", output_id=1, page=count + 1, page_size=page_size)
    assert out_of_range.startswith("Error: page") and f"has {count} page(s)" in out_of_range


def test_page_headers_count_lines_and_flag_split_lines():
    env = fake(max_output_chars=10)
    env.step(act(call("echo", {"text": "a\r\nb\n" + "z" * 25 + "\nlast"})))
    answers = [run(env, "view_tool_output", output_id=1, page=p, page_size=2) for p in (1, 2, 3, 4)]
    assert answers[0] == "[output_id=1 page 1 of 4: lines 1-2 of 4]\na\r\nb\n"
    assert answers[1] == "[output_id=1 page 2 of 4: line 3 of 4; line 3 continues on the next page]\n" + "z" * 10
    assert answers[2] == (
        "[output_id=1 page 3 of 4: line 3 of 4; line 3 began on the previous page; "
        "line 3 continues on the next page]\n" + "z" * 10
    )
    assert answers[3] == "[output_id=1 page 4 of 4: lines 3-4 of 4; line 3 began on the previous page]\nzzzzz\nlast"
    env.step(act(call("echo", {"text": ""})))
    assert run(env, "view_tool_output", output_id=2) == "[output_id=2 page 1 of 1: empty output]\n"


def test_search_tool_output_gives_ids_lines_and_pages():
    env = fake(max_output_chars=1000)
    lines = [f"entry {i} {'NEEDLE' if i in (7, 180) else 'hay'}" for i in range(1, 201)]
    env.step(act(call("echo", {"text": "\n".join(lines)})))
    env.step(act(call("echo", {"text": "another needle\r\nhere"})))
    found = run(env, "search_tool_output", pattern=r"needle$")  # case-insensitive; \r is not part of a line
    assert "3 line(s) match" in found
    assert "output_id=1 line 7 (page 1): entry 7 NEEDLE" in found
    assert "output_id=2 line 1 (page 1): another needle" in found
    page = re.search(r"output_id=1 line 180 \(page (\d+)\)", found).group(1)
    assert "entry 180 NEEDLE" in run(env, "view_tool_output", output_id=1, page=int(page))
    only_two = run(env, "search_tool_output", pattern="needle", output_id=2)
    assert "output_id=1" not in only_two and "1 line(s) match" in only_two
    assert run(env, "search_tool_output", pattern="absent").startswith("No line of 2 stored output(s)")
    literal = run(env, "search_tool_output", pattern="entry 7 (")
    assert "not a valid regular expression" in literal and "No line" in literal


# -- history and pruning --------------------------------------------------------------------------


def test_manage_context_prunes_to_the_opening_and_recent_turns():
    env = fake()
    for word in ("alpha", "beta", "gamma", "delta"):
        env.step(act(call("echo", {"text": word}, id=word)))
    assert len(env.history) == 2 + 4 * 2
    obs, reward, terminated, truncated, info = env.step(act(call("manage_context", {"keep_recent_turns": 1}, id="m")))
    assert "Dropped the 3 oldest turn(s): 6 messages" in obs[0]["content"]
    managed = info["context"]["messages"]
    assert info["context"]["pruned"] is True and info["context"]["dropped"] == 6
    assert managed == env.history
    assert [m["role"] for m in managed] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert managed[3]["content"] == "delta" and managed[4]["tool_calls"][0]["id"] == "m"
    assert len(env.full_history) == 2 + 5 * 2  # nothing lost
    stats = json.loads(run(env, "check_context"))
    assert stats["messages"] == 6 and stats["pruned_messages"] == 6 and stats["turns"] == 2
    hits = run(env, "search_history", pattern="^alpha$")
    position = int(re.search(r"message (\d+) \[tool echo, pruned\]: alpha", hits).group(1))
    assert env.full_history[position]["content"] == "alpha"
    recent = run(env, "search_history", pattern="delta")
    assert "[tool echo]: delta" in recent and ", pruned" not in recent
    # Nothing more to drop; no context replacement is announced.
    obs, *_, info = env.step(act(call("manage_context", {"keep_recent_turns": 50})))
    assert obs[0]["content"].startswith("Nothing to drop") and "context" not in info
    obs, *_, info = env.step(act(call("manage_context", {"keep_recent_turns": 0})))
    assert [m["role"] for m in info["context"]["messages"]] == ["system", "user", "assistant", "tool"]


def test_check_context_measures_the_managed_conversation():
    env = fake(max_output_chars=50)
    env.step(act(call("echo", {"text": "y" * 400})))
    stats = json.loads(run(env, "check_context"))
    chars = sum(len(m["content"] or "") for m in env.history[:-2]) + sum(
        len(c["function"]["name"]) + len(c["function"]["arguments"]) + 2
        for m in env.history[:-2] for c in m.get("tool_calls") or ()
    )
    assert stats["characters"] == chars and stats["estimated_tokens"] == -(-chars // 4)
    assert stats["stored_tool_outputs"] == 1 and stats["truncated_tool_outputs"] == 1
    assert stats["max_output_chars"] == 50 and stats["messages"] == 4


def test_search_history_does_not_echo_its_own_answers():
    env = fake()
    env.step(act(call("echo", {"text": "the secret word is walrus"})))
    first = run(env, "search_history", pattern="walrus")
    second = run(env, "search_history", pattern="walrus")
    assert first == second  # neither the first search's call nor its answer (quoting walrus) is a hit
    assert "2 message(s) match" in first  # the echo call's arguments and its result
    assert "not a valid regular expression" in run(env, "search_history", pattern="[walrus")


# -- bad arguments, limits, lifecycle -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "problem"),
    [
        ("manage_context", {}, "missing required argument(s) keep_recent_turns"),
        ("manage_context", {"keep_recent_turns": 1, "x": 2}, "unexpected argument(s) x"),
        ("manage_context", {"keep_recent_turns": "2"}, "must be an integer"),
        ("manage_context", {"keep_recent_turns": True}, "must be an integer"),
        ("manage_context", {"keep_recent_turns": -1}, "must be >= 0"),
        ("view_tool_output", {"output_id": 9}, "no tool output with output_id=9"),
        ("search_history", {"pattern": ""}, "must not be empty"),
        ("search_tool_output", {"pattern": 3}, "must be a string"),
        ("check_context", '{"broken', "not valid JSON"),
    ],
)
def test_bad_arguments_are_answered_and_the_episode_goes_on(name, arguments, problem):
    env = fake()
    obs, reward, terminated, truncated, info = env.step(act(call(name, arguments)))
    assert obs[0]["content"].startswith("Error") and problem in obs[0]["content"]
    assert info["local_calls"] == [{"name": name, "ok": False}] and not (terminated or truncated)
    assert env.step(act(call("echo", {"text": "still here"})))[0][0]["content"] == "still here"
    assert env.unwrapped.received[-1]["tool_calls"][0]["function"]["name"] == "echo"


def test_max_local_calls_truncates_a_looping_agent():
    env = fake(max_local_calls=2)
    run(env, "check_context")
    assert json.loads(run(env, "check_context"))["context_tool_calls_left"] == 0
    obs, reward, terminated, truncated, info = env.step(act(call("echo", {"text": "hi"}), call("check_context", id="k")))
    assert truncated and not terminated and info["error"]["type"] == "LocalCallLimit"
    assert all(m["content"].startswith("Not run") for m in obs) and env.unwrapped.received == []
    with pytest.raises(EpisodeFinished):
        env.step(act(call("check_context")))
    env.reset()
    assert env.history == env.full_history and len(env.history) == 2
    run(env, "check_context")  # the count starts again


def test_reset_clears_the_conversation_and_the_outputs():
    env = fake(max_output_chars=5)
    env.step(act(call("echo", {"text": "a long output"})))
    env.step(act(call("manage_context", {"keep_recent_turns": 0})))
    env.reset(seed=1)
    assert [m["role"] for m in env.full_history] == ["system", "user"] and env.history == env.full_history
    assert "no tool output with output_id=1" in run(env, "view_tool_output", output_id=1)
    with pytest.raises(EpisodeNotStarted):
        ContextManagement(FakeChatEnv()).step("hello")


def test_text_actions_and_env_tool_changes_pass_through():
    env = fake()
    obs, *_ = env.step("just text")
    assert obs == [{"role": "user", "content": "No tool call found."}] and env.unwrapped.received == ["just text"]
    assert env.full_history[-2] == {"role": "assistant", "content": "just text"}
    obs, _, _, _, info = env.step(act(call("grow"), call("check_context", id="d")))
    names = [t["function"]["name"] for t in info["tools"]]
    assert "extra" in names and LOCAL_NAMES <= set(names)
    assert env.action_space.contains(act(call("extra"))) and "extra" in {t.name for t in env.action_space.tools}


def test_an_env_tool_named_like_a_context_tool_is_refused():
    clash = [ToolSpec("check_context", "mine", {"type": "object", "properties": {}})]
    with pytest.raises(ConfigurationError, match="check_context"):
        ContextManagement(FakeChatEnv(tools=clash))
    with pytest.raises(ConfigurationError):
        ContextManagement(FakeChatEnv(), max_output_chars=0)
