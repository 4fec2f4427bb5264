"""Gymnasium wrappers per sub-env of a vector env: ``gym.make_vec(..., env_wrappers=[...])``.

A trainer stacks the same wrappers on every sub-env as on a single env and drives the vector env
first-ready: text tool calls parsed per sub-env, whole conversations as observations (autoresets
included), every finished episode recorded and replayable, token-id actions passing ``send``.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.vector import AutoresetMode

import openenv_gym  # noqa: F401
from openenv_gym.errors import ConfigurationError
from openenv_gym.records import read_records
from openenv_gym.vector.base import info_at
from openenv_gym.wrappers import ConversationHistory, RecordEpisodes, TextToolCalls

ARITH = "openenv/Arithmetic-v0"


def hermes(name: str, args: dict) -> str:
    return f"Let me use a tool.\n<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def question(messages: list[dict]) -> str:
    return next(m["content"] for m in messages if m["role"] == "user").split("Compute ", 1)[1].split(". ", 1)[0]


def test_text_tool_calls_and_whole_conversations_per_sub_env(tmp_path):
    path = tmp_path / "episodes.jsonl"
    envs = gym.make_vec(ARITH, num_envs=4, autoreset_mode=AutoresetMode.SAME_STEP,
                        env_wrappers=[TextToolCalls, ConversationHistory, functools.partial(RecordEpisodes, path=path)])
    try:
        obs, _ = envs.reset(seed=0)
        assert all(len(o) == 1 and o[0]["role"] == "user" for o in obs)
        envs.send([hermes("calculator", {"expression": question(o)}) for o in obs])
        calc = {}
        while len(calc) < 4:  # first-ready: the sub-envs answer in any order
            b = envs.recv(2)
            for k, i in enumerate(b.env_ids.tolist()):
                conversation = b.obs[k]
                assert [m["role"] for m in conversation] == ["user", "assistant", "tool"]
                assert conversation[1]["tool_calls"][0]["function"]["name"] == "calculator"
                assert conversation[1]["content"] == "Let me use a tool."  # the text outside the call
                calc[i] = conversation
        envs.send([hermes("submit", {"answer": calc[i][-1]["content"]}) for i in range(4)])
        b = envs.recv()
        assert b.terminations.all() and (b.rewards == 1.0).all()
        for k in range(4):
            info = info_at(b.infos, k)
            assert [m["role"] for m in info["final_obs"]] == ["user", "assistant", "tool", "assistant", "tool"]
            assert [m["role"] for m in b.obs[k]] == ["user"]  # the autoreset went through the wrappers
    finally:
        envs.close()
    records = read_records(path)
    assert len(records) == 4 and all(r.total_reward == 1.0 and r.terminated for r in records)
    env = gym.make(ARITH)
    try:
        for record in records:  # each recorded episode replays on a single env
            env.reset(options=record.reset_options())
            assert [env.step(a)[1] for a in record.actions()] == record.rewards
    finally:
        env.close()


@pytest.mark.ray
def test_wrappers_run_inside_the_ray_actors(tmp_path):
    pytest.importorskip("ray")
    path = tmp_path / "ray.jsonl"
    envs = gym.make_vec(ARITH, num_envs=4, backend="ray", vector_options={"num_actors": 2},
                        autoreset_mode=AutoresetMode.SAME_STEP,
                        env_wrappers=[TextToolCalls, ConversationHistory, functools.partial(RecordEpisodes, path=path)])
    try:
        obs, _ = envs.reset(seed=1)
        _, _, _, _, infos = envs.step([hermes("calculator", {"expression": question(o)}) for o in obs])
        conversations = [info_at(infos, i) for i in range(4)]
        obs = envs.step([hermes("submit", {"answer": "-1"})] * 4)[0]  # wrong answers end every episode
        assert all([m["role"] for m in o] == ["user"] for o in obs)
        assert all("error" not in c for c in conversations)
    finally:
        envs.close()
    records = read_records(path)  # written by the actors' wrappers, flushed on close
    assert len(records) == 4 and all(r.terminated and len(r.actions()) == 2 for r in records)
    assert all(r.actions()[0]["tool_calls"][0]["function"]["name"] == "calculator" for r in records)


def test_wrappers_must_be_callables():
    with pytest.raises(ConfigurationError, match="callable"):
        gym.make_vec(ARITH, num_envs=2, env_wrappers=["TextToolCalls"])
    with pytest.raises(ConfigurationError, match="list"):
        gym.make_vec(ARITH, num_envs=2, env_wrappers=TextToolCalls)


_HUNG_WRAPPER = """
import threading
import gymnasium as gym
import openenv_gym  # noqa: F401

class Hang(gym.Wrapper):
    def step(self, action):
        threading.Event().wait()  # a wrapper's step that never returns

envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=2, env_wrappers=[Hang], step_timeout=1.0, in_process=True)
envs.reset(seed=0)
obs, rewards, terminations, truncations, infos = envs.step(["hello", "hello"])
print(*infos["error"]["type"], flush=True)
envs.close()
print("end", flush=True)
"""


def test_a_wrapped_step_that_never_returns_does_not_hold_the_exit():
    """step_timeout gives up on the stuck wrapper (an info error per sub-env), close() returns, and
    the process exits: the wrapper stacks' threads are daemons (a ThreadPoolExecutor's are joined
    at exit, and this script then never ended)."""
    process = subprocess.Popen([sys.executable, "-c", _HUNG_WRAPPER], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert out.split() == ["BackendTimeout", "BackendTimeout", "end"] and process.returncode == 0, (out, process.returncode)
