"""``in_process=True``: an ors-sdk source run in this process answers as its own server does.

Every test plays the same source both ways (the SDK's ``Server`` in a subprocess, and the class
loaded here) and compares what a user sees: observations, rewards, episode ends, the tools and
the ``calls`` entries of ``info``, errors included.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401  (registers the ids)
from openenv_gym.errors import ConfigurationError, ServerError
from openenv_gym.testing import procs

sys.path.insert(0, str(Path(__file__).parents[1]))
from conftest import ENVS  # noqa: E402

PROBE = {"source": str(ENVS / "ors_probe.py"), "env_class": "Probe", "secrets": {"key": "s3cret"}}


def call(name: str, arguments: dict | str | None = None) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}]}


def seen(step: tuple) -> tuple:
    """What a user reads of a step, without the session id (each session has its own)."""
    obs, reward, terminated, truncated, info = step
    return obs, reward, terminated, truncated, info.get("calls"), info.get("error")


@pytest.fixture(scope="module")
def both():
    envs = {mode: gym.make("openenv/ORS-v0", in_process=mode, **PROBE) for mode in (False, True)}
    yield envs
    for env in envs.values():
        env.close()


def play(env: gym.Env, index: int, actions: list[dict]) -> list[tuple]:
    obs, info = env.reset(options={"index": index})
    out: list[tuple] = [(obs, info["tools"], info["task_id"])]
    for action in actions:
        out.append(seen(env.step(action)))
    return out


SCRIPT = [
    call("hint"), call("partial", {"x": 3}), call("secret", {"name": "key"}), call("secret", {"name": "nope"}),
    call("big", {"n": 9000}), call("image"), call("boom"), call("slow", {"seconds": 0.01}), call("tick", {"seconds": 0}),
    call("nosuch"), call("partial", {"x": "not a number"}), call("big", {"n": -1}), call("partial", "{not json"),
    {"role": "assistant", "content": "just text"}, call("submit", {"answer": "4"}),
]


def test_every_probe_tool_answers_as_the_server_does(both):
    served, here = (play(both[mode], 0, SCRIPT) for mode in (False, True))
    assert here == served
    # and it is a real episode: the answer is right, the episode ended, a tool's failure is its text
    assert here[-1][1:3] == (1.0, True)
    assert here[7][0][0]["content"] == "Error: the tool failed: boom on purpose"
    assert "Tool input validation error" in here[11][0][0]["content"]
    assert here[3][0][0]["content"] == "s3cret"


def test_the_task_api_and_a_bad_index_agree(both):
    for mode, env in both.items():
        assert env.unwrapped.task("test", 1) == both[not mode].unwrapped.task("test", 1)
        with pytest.raises(openenv_gym.errors.TaskNotFound):
            env.reset(options={"split": "nosuch", "index": 0})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["submit", "partial", "big", "secret", "hint"]),
       args=st.dictionaries(st.sampled_from(["answer", "x", "n", "name", "extra"]),
                            st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.text(max_size=20),
                                      st.floats(allow_nan=False, allow_infinity=False), st.lists(st.integers(), max_size=3)),
                            max_size=3))
def test_any_arguments_get_the_same_answer_both_ways(both, name, args):
    served, here = (play(both[mode], 1, [call(name, args)]) for mode in (False, True))
    assert here == served


def test_nothing_runs_beside_it_and_sys_path_is_as_it_was():
    before, running = list(sys.path), set(procs.descendants())  # other tests' servers may run beside
    env = gym.make("openenv/ORS-v0", in_process=True, **PROBE)
    try:
        env.reset(seed=0)
        assert set(procs.descendants()) <= running
        assert sys.path == before
        with pytest.raises(ConfigurationError, match="runs in this process"):
            env.unwrapped.adapter.connection()
    finally:
        env.close()


def test_what_it_cannot_run_is_refused_with_the_reason():
    with pytest.raises(ConfigurationError, match="ors-sdk environments"):
        env = gym.make("openenv/ORS-v0", in_process=True, source=str(ENVS / "openreward_probe.py"), env_class="Probe")
        env.close()
    with pytest.raises(ConfigurationError, match="url"):
        gym.make("openenv/ORS-v0", in_process=True, url="http://127.0.0.1:9")
    with pytest.raises(ConfigurationError, match="True or False"):
        gym.make("openenv/ORS-v0", in_process="yes", **PROBE)
    with pytest.raises(ConfigurationError, match="server_python"):
        gym.make("openenv/ORS-v0", in_process=True, server_python=sys.executable, **PROBE)


LIFECYCLE = '''
import asyncio, functools, json, os
from pydantic import BaseModel
from ors import Environment, Server, TextBlock, ToolOutput, Toolset, tool
from ors.types import ListToolsOutput, ToolSpec

LOG = os.environ["LIFECYCLE_LOG"]

def note(line):
    with open(LOG, "a") as fh:
        fh.write(line + "\\n")

class Word(BaseModel):
    word: str

def logged(f):
    @functools.wraps(f)
    def inner(self, *args):
        note("called " + f.__name__)
        return f(self, *args)
    return inner

class Shout(Toolset):
    @tool
    def shout(self, params: Word) -> ToolOutput:
        """Shout a word (a toolset's tool)."""
        return ToolOutput(blocks=[TextBlock(text=params.word.upper() + self.env.task_spec["mark"])])

class Life(Environment):
    toolsets = [Shout]

    @classmethod
    def list_splits(cls):
        return ["train"]

    @classmethod
    def list_tasks(cls, split):
        return [{"mark": "!", "fail": False}, {"mark": "?", "fail": True}, {"mark": ".", "fail": False}]

    async def setup(self):
        if self.task_spec["fail"]:
            raise ValueError("no room for this task")
        note("setup " + self.task_spec["mark"])

    async def teardown(self):
        if self.task_spec["mark"] == ".":
            await asyncio.sleep(3600)  # a teardown that hangs must not hang close()
        note("teardown " + self.task_spec["mark"])

    def get_prompt(self):
        return [TextBlock(text="say something" + self.task_spec["mark"])]

    def list_task_tools(self):
        return ListToolsOutput(tools=[ToolSpec(name="secretword", description="only this task's", input_schema=None)])

    @tool(shared=False)
    def secretword(self) -> ToolOutput:
        """A task tool."""
        return ToolOutput(blocks=[TextBlock(text="xyzzy")], reward=1.0, finished=True)

    @tool
    def noop(self) -> ToolOutput:
        """Nothing."""
        return ToolOutput(blocks=[TextBlock(text="ok")])

    @tool
    @logged
    def echo(self, params: Word) -> ToolOutput:
        """A tool under a decorator of the author's (read through functools.wraps)."""
        return ToolOutput(blocks=[TextBlock(text=params.word)])

if __name__ == "__main__":
    import sys
    Server([Life]).run(host="127.0.0.1", port=int(sys.argv[1]))
'''


def test_setup_teardown_toolsets_and_task_tools_as_the_server_runs_them(tmp_path, monkeypatch):
    source = tmp_path / "life.py"
    source.write_text(textwrap.dedent(LIFECYCLE))
    runs = []
    for mode in (False, True):
        log = tmp_path / f"log-{mode}"
        monkeypatch.setenv("LIFECYCLE_LOG", str(log))
        env = gym.make("openenv/ORS-v0", source=str(source), env_class="Life", in_process=mode)
        try:
            played = play(env, 0, [call("shout", {"word": "hi"}), call("noop"), call("echo", {"word": "yo"}),
                                   call("echo", {"word": 3}), call("secretword")])
            with pytest.raises(ServerError, match="no room for this task"):
                env.reset(options={"index": 1})
            env.reset(options={"index": 2})
        finally:
            started = time.monotonic()
            env.close()
            assert time.monotonic() - started < 10, "close() waited on a hung teardown"
        runs.append((played, log.read_text().split("\n")))
    assert runs[0] == runs[1]
    played, log = runs[1]
    assert played[1][0][0]["content"] == "HI!" and played[3][0][0]["content"] == "yo"
    assert "Tool input validation error" in played[4][0][0]["content"] and played[5][1:3] == (1.0, True)
    assert "secretword" in {t["function"]["name"] for t in played[0][1]}
    assert log[:3] == ["setup !", "called echo", "teardown !"]
