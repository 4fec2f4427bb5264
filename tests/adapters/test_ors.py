"""The ORS adapter against real SDK servers (both flavours) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import openenv_gym  # noqa: F401  (registers the ids)
from openenv_gym.errors import (
    BackendUnavailable,
    ConfigurationError,
    EpisodeFinished,
    EpisodeNotStarted,
    TaskNotFound,
)
from openenv_gym.spaces import AssistantAction

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "envs"))
from conftest import ENVS, pid_alive  # noqa: E402
from envs.ors_probe import PROBE_TASKS, TINY_PNG_BASE64, big_text  # noqa: E402


def call(name: str, arguments: dict | str | None = None, call_id: str = "c1") -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]}


@pytest.fixture
def env(server):
    env = gym.make("openenv/ORS-v0", url=server.url, env_name="probe")
    yield env
    env.close()


def test_full_episode_right_answer_gets_reward_one(env, server):
    obs, info = env.reset(seed=0, options={"index": 2})
    task = env.unwrapped.task("train", 2)
    assert obs == [{"role": "user", "content": task["question"]}]
    assert info["server_flavour"] == server.flavour
    assert info["split"] == "train" and info["index"] == 2 and info["task_id"] == "train/2"
    names = {t["function"]["name"] for t in info["tools"]}
    assert {"hint", "submit", "partial", "secret", "big", "boom", "slow", "image"} <= names
    submit = next(t for t in info["tools"] if t["function"]["name"] == "submit")
    assert submit["type"] == "function" and submit["function"]["parameters"]["required"] == ["answer"]

    obs, reward, terminated, truncated, info = env.step(call("hint"))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert obs == [{"role": "tool", "tool_call_id": "c1", "name": "hint", "content": "Think step by step."}]

    obs, reward, terminated, truncated, info = env.step(call("partial", {"x": 3}))
    assert reward == 0.25 and not terminated

    obs, reward, terminated, truncated, info = env.step(call("submit", {"answer": task["answer"]}, "c9"))
    assert reward == 1.0 and terminated and not truncated
    assert obs[0]["tool_call_id"] == "c9"
    assert info["calls"][0]["ok"] is True
    with pytest.raises(EpisodeFinished):
        env.step(call("hint"))


def test_wrong_answer_gets_reward_zero_and_ends(env):
    env.reset(seed=1)
    obs, reward, terminated, truncated, _ = env.step(call("submit", {"answer": "-1"}))
    assert reward == 0.0 and terminated and isinstance(reward, float)


def test_task_api_and_seeded_choice(env):
    base = env.unwrapped
    assert [(s.name, s.type) for s in base.splits()] == [("train", "train"), ("test", "test")]
    assert base.num_tasks("train") == 5 and base.num_tasks("test") == 2
    assert base.task("test", 1) == PROBE_TASKS["test"][1]
    first = [env.reset(seed=s)[1]["task_id"] for s in range(8)]
    again = [env.reset(seed=s)[1]["task_id"] for s in range(8)]
    assert first == again
    assert len(set(first)) > 1, "different seeds should reach different tasks"
    obs, info = env.reset(seed=0, options={"split": "test", "index": 1})
    assert obs[0]["content"] == PROBE_TASKS["test"][1]["question"]
    with pytest.raises(TaskNotFound):
        env.reset(options={"split": "nope"})
    with pytest.raises(TaskNotFound):
        env.reset(options={"index": 99})
    assert not hasattr(env, "task"), "the task API must not be reachable through wrappers"


def test_explicit_task_spec(env):
    spec = {"id": "custom", "question": "What is 20+1?", "answer": "21"}
    obs, info = env.reset(options={"task": spec})
    assert obs[0]["content"] == "What is 20+1?" and info["task_id"] == "custom"
    _, reward, terminated, _, _ = env.step(call("submit", {"answer": "21"}))
    assert reward == 1.0 and terminated


@pytest.mark.parametrize(
    "action, expected",
    [
        (call("submit", '{"answer": "4"'), "not valid JSON"),
        (call("submit", "[1, 2]"), "must be a JSON object"),
        (call("nosuch", {}), "unknown tool 'nosuch'"),
        (call("submit", {}), "missing required argument(s) answer"),
        (call("partial", {"x": "not a number"}), "validation"),
    ],
)
def test_bad_tool_calls_reach_the_agent_and_the_episode_goes_on(env, action, expected):
    obs, info = env.reset(seed=0, options={"index": 0})
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs[0]["role"] == "tool" and obs[0]["tool_call_id"] == "c1"
    assert expected.lower() in obs[0]["content"].lower()
    assert (reward, terminated, truncated) == (0.0, False, False)
    _, reward, terminated, _, _ = env.step(call("submit", {"answer": PROBE_TASKS["train"][0]["answer"]}))
    assert reward == 1.0 and terminated


@pytest.mark.parametrize("action", ["the answer is 4", {"role": "assistant", "content": "4"}, None, 42,
                                    {"role": "assistant", "tool_calls": "oops"}])
def test_text_or_junk_where_a_tool_call_is_needed(env, action):
    env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step(action)
    assert obs[0]["role"] == "user" and not terminated and reward == 0.0
    assert "tool" in obs[0]["content"] or "could not be read" in obs[0]["content"]


def test_step_before_reset_and_after_end_raise_clear_errors(server):
    env = gym.make("openenv/ORS-v0", url=server.url, env_name="probe")
    try:
        with pytest.raises(EpisodeNotStarted, match="reset"):
            env.step(call("hint"))
        env.reset(seed=0, options={"index": 0})
        env.step(call("submit", {"answer": "4"}))
        with pytest.raises(EpisodeFinished, match="reset"):
            env.step(call("hint"))
        with pytest.raises(gym.error.ResetNeeded):  # also what Gymnasium users catch
            env.step(call("hint"))
    finally:
        env.close()


def test_several_calls_in_one_message_run_in_order_and_stop_at_finish(env):
    env.reset(seed=0, options={"index": 0})
    action = {"role": "assistant", "content": "let me try", "tool_calls": [
        call("partial", {"x": 1}, "a")["tool_calls"][0],
        call("submit", {"answer": "4"}, "b")["tool_calls"][0],
        call("hint", None, "c")["tool_calls"][0],
    ]}
    obs, reward, terminated, _, info = env.step(action)
    assert [m["tool_call_id"] for m in obs] == ["a", "b", "c"]
    assert reward == 1.25 and terminated
    assert "already finished" in obs[2]["content"]  # enforced here even where ors-sdk would run it


def test_tool_output_over_4096_chars_arrives_whole(env):
    env.reset(seed=0)
    obs, *_ = env.step(call("big", {"n": 20_000}))
    assert obs[0]["content"] == big_text(20_000)


def test_image_blocks_become_data_url_parts(env):
    env.reset(seed=0)
    obs, *_ = env.step(call("image"))
    parts = obs[0]["content"]
    assert isinstance(parts, list)
    urls = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    assert urls == [f"data:image/png;base64,{TINY_PNG_BASE64}"]
    assert env.unwrapped.observation_space.contains(obs)


def test_a_tool_that_raises_is_reported_and_the_episode_goes_on(env):
    env.reset(seed=0, options={"index": 0})
    obs, reward, terminated, _, info = env.step(call("boom"))
    assert "boom on purpose" in obs[0]["content"] and not terminated and reward == 0.0
    assert info["error"]["type"] == "ToolFailed"
    _, reward, terminated, _, _ = env.step(call("submit", {"answer": "4"}))
    assert reward == 1.0 and terminated


def test_secrets_reach_the_server_and_stay_out_of_the_spec(server):
    env = gym.make("openenv/ORS-v0", url=server.url, env_name="probe", secrets={"API_TOKEN": "s3cr3t-value"})
    try:
        env.reset(seed=0)
        obs, *_ = env.step(call("secret", {"name": "API_TOKEN"}))
        assert obs[0]["content"] == "s3cr3t-value"
        assert "s3cr3t-value" not in repr(env.unwrapped.spec)
        assert env.unwrapped.spec.kwargs["secrets"] == {"API_TOKEN": "***"}
        assert "s3cr3t-value" not in env.unwrapped.spec.to_json()
    finally:
        env.close()


def test_explicit_env_name_routes_to_the_right_env(ors_server):
    env = gym.make("openenv/ORS-v0", url=ors_server.url, env_name="ProbeBeta")
    try:
        assert [s.name for s in env.unwrapped.splits()] == ["alpha", "beta"]
        obs, info = env.reset(options={"split": "beta", "index": 2})
        assert obs[0]["content"] == "Say the word beta2."
        _, reward, terminated, _, _ = env.step(call("submit", {"answer": "beta2"}))
        assert reward == 1.0 and terminated
    finally:
        env.close()
    with pytest.raises(ConfigurationError, match="no environment 'nosuch'"):
        gym.make("openenv/ORS-v0", url=ors_server.url, env_name="nosuch")


class _FastToolsOnly(AssistantAction):
    """check_env samples random tool calls: keep them off the probe's deliberately slow tools."""

    def sample(self, mask=None, probability=None):
        tools, self.tools = self.tools, [t for t in self.tools if t.name not in ("slow", "tick", "big")]
        try:
            return super().sample()
        finally:
            self.tools = tools


def test_check_env_passes(server):
    env = gym.make("openenv/ORS-v0", url=server.url, env_name="probe")
    try:
        env.unwrapped.action_space.__class__ = _FastToolsOnly
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_unreachable_server_is_a_typed_error():
    from conftest import free_port

    with pytest.raises(BackendUnavailable):
        gym.make("openenv/ORS-v0", url=f"http://127.0.0.1:{free_port()}")


# -- local sources ----------------------------------------------------------------------------------
@pytest.mark.parametrize("flavour_file", ["ors_probe.py", "openreward_probe.py"])
def test_local_source_is_served_shared_and_stopped(flavour_file):
    source = ENVS / flavour_file
    a = gym.make("openenv/ORS-v0", source=str(source), env_class="Probe")
    b = gym.make("openenv/ORS-v0", source=str(source), env_class="Probe")
    pid = a.unwrapped.adapter.server_pid()
    try:
        assert pid is not None and pid == b.unwrapped.adapter.server_pid()
        a.reset(seed=0, options={"index": 0})
        _, reward, terminated, _, _ = a.step(call("submit", {"answer": "4"}))
        assert reward == 1.0 and terminated
        a.close()
        assert pid_alive(pid), "the server must live while another env uses it"
        b.reset(seed=0)
    finally:
        a.close()
        b.close()
    assert not pid_alive(pid)


@pytest.mark.timeout(90)
def test_server_killed_mid_episode_gives_a_typed_error_then_recovers():
    env = gym.make("openenv/ORS-v0", source=str(ENVS / "ors_probe.py"), env_class="Probe")
    try:
        env.reset(seed=0, options={"index": 0})
        pid = env.unwrapped.adapter.server_pid()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(BackendUnavailable, match="exited"):
            env.step(call("hint"))
        obs, info = env.reset(seed=0, options={"index": 0})  # a fresh server takes over
        assert env.unwrapped.adapter.server_pid() not in (None, pid)
        _, reward, terminated, _, _ = env.step(call("submit", {"answer": "4"}))
        assert reward == 1.0 and terminated
    finally:
        env.close()


def test_a_source_that_fails_to_start_reports_its_output(tmp_path):
    bad = tmp_path / "bad_env.py"
    bad.write_text(
        "from ors import Environment, tool, ToolOutput\n"
        "raise RuntimeError('broken on import')\n"
        "class Bad(Environment):\n"
        "    @classmethod\n    def list_splits(cls): return ['train']\n"
        "    @classmethod\n    def list_tasks(cls, split): return [{}]\n"
        "    def get_prompt(self): return []\n"
        "    @tool\n    def go(self) -> ToolOutput: return ToolOutput(blocks=[])\n"
    )
    with pytest.raises(BackendUnavailable, match="broken on import"):
        gym.make("openenv/ORS-v0", source=str(bad))


def test_max_turns_truncates(server):
    env = gym.make("openenv/ORS-v0", url=server.url, env_name="probe", max_turns=2)
    try:
        env.reset(seed=0)
        assert env.step(call("hint"))[3] is False
        _, _, terminated, truncated, _ = env.step(call("hint"))
        assert truncated and not terminated
    finally:
        env.close()


def test_async_api_from_a_foreign_event_loop(server):
    import asyncio

    env = gym.make("openenv/ORS-v0", url=server.url, env_name="probe")

    async def episode():
        obs, info = await env.unwrapped.areset(seed=0, options={"index": 1})
        return await env.unwrapped.astep(call("submit", {"answer": PROBE_TASKS["train"][1]["answer"]}))

    try:
        _, reward, terminated, _, _ = asyncio.run(episode())
        assert reward == 1.0 and terminated
    finally:
        env.close()


# -- protocol faults, through a loopback proxy --------------------------------------------------------
@pytest.fixture
def proxied(server):
    from fault_proxy import FaultProxy

    proxy = FaultProxy(int(server.url.rsplit(":", 1)[1]))
    env = gym.make("openenv/ORS-v0", url=proxy.url, env_name="probe")
    yield proxy, env
    env.close()
    proxy.close()


def test_a_dropped_call_stream_is_resumed_without_running_the_tool_twice(proxied):
    proxy, env = proxied
    env.reset(seed=0)
    proxy.cut_calls = 1
    obs, *_ = env.step(call("tick", {"seconds": 0.5}))
    assert proxy.calls_cut == 1, "the proxy must really have cut the stream"
    assert obs[0]["content"] == "1"
    obs, *_ = env.step(call("tick", {"seconds": 0}))
    assert obs[0]["content"] == "2", "the resumed call must not have run the tool again"


def test_503_with_retry_after_is_waited_out(proxied):
    proxy, env = proxied
    proxy.fail_creates = 2
    obs, info = env.reset(seed=0, options={"index": 0})
    assert proxy.creates_refused == 2
    _, reward, terminated, _, _ = env.step(call("submit", {"answer": "4"}))
    assert reward == 1.0 and terminated
