"""A finished episode is freed by reference counting, on every in-process backend.

An episode left in a reference cycle (a library's state holding a client that holds the episode,
say) keeps its whole rollout alive until the cycle collector runs, and the collections it triggers
walk it again every few dozen steps. These play whole episodes with the collector off and count
what only it could free. (The legacy Verifiers adapter has its own such test, beside its others.)
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import openenv_gym  # noqa: F401

ENVS = Path(__file__).parent / "envs"


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def arithmetic(env: gym.Env, seed: int) -> float:
    obs, _ = env.reset(seed=seed)
    expression = obs[0]["content"].split("Compute ", 1)[1].split(". ", 1)[0]
    env.step(call("calculator", {"expression": expression}))
    _, reward, terminated, _, _ = env.step(call("submit", {"answer": str(eval(expression))}))
    assert terminated
    return float(reward)


def echo(env: gym.Env, seed: int) -> float:
    env.reset(seed=seed)
    env.step(call("echo", {"message": "hi"}))
    _, reward, terminated, _, _ = env.step(call("guess", {"number": 3}))
    return float(reward)


CASES = {
    "ors": (lambda: gym.make("openenv/Arithmetic-v0", in_process=True), arithmetic),
    "openenv": (lambda: gym.make("openenv/OpenEnv-v0", source=str(ENVS / "openenv_echo_env"), in_process=True), echo),
}


@pytest.mark.parametrize("name", list(CASES))
def test_finished_episodes_leave_nothing_for_the_collector(name):
    make, play = CASES[name]
    env = make()
    try:
        for seed in range(3):  # warm: caches, pools, the first episode's one-off objects
            play(env, seed)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            rewards = [play(env, seed) for seed in range(3, 8)]
            env.reset(seed=9)  # and one episode ended by a reset
            gc.collect()
            kept = sorted({type(o).__qualname__ for o in gc.garbage})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert len(rewards) == 5
        assert kept == []
    finally:
        env.close()
