"""A finished episode is freed by reference counting, on every in-process backend.

An episode left in a reference cycle (a library's state holding a model client that holds the
episode, as the legacy Verifiers adapter once did) keeps its whole rollout alive until the cycle
collector runs, and the collections it triggers walk it again every few dozen steps. These play
whole episodes, and one a reset cuts short, with the collector off and list what only it could free.
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import openenv_gym  # noqa: F401

ENVS = Path(__file__).parent / "envs"


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def arithmetic(obs: list[dict[str, Any]], info: dict[str, Any]) -> list[Any]:
    expression = obs[0]["content"].split("Compute ", 1)[1].split(". ", 1)[0]
    return [call("calculator", {"expression": expression}), call("submit", {"answer": str(eval(expression))})]


def echo(obs: list[dict[str, Any]], info: dict[str, Any]) -> list[Any]:
    # The env's hidden number is its reset seed % 10, and task i is its reset(seed=i).
    return [call("echo", {"message": "hi"}), call("guess", {"number": info["index"] % 10})]


def multiply(obs: list[dict[str, Any]], info: dict[str, Any]) -> list[Any]:
    a, b = map(int, re.findall(r"\d+", obs[-1]["content"])[:2])
    return [call("multiply", {"a": a, "b": b}), str(a * b)]


Script = Callable[[list[dict[str, Any]], dict[str, Any]], list[Any]]
NEEDS = {"openenv": ("openenv",), "verifiers_v0": ("verifiers",)}
"""What each case needs besides the ors extra."""

CASES: dict[str, tuple[Callable[[], gym.Env], Script]] = {
    "ors": (lambda: gym.make("openenv/Arithmetic-v0", in_process=True), arithmetic),
    "openenv": (lambda: gym.make("openenv/OpenEnv-v0", source=str(ENVS / "openenv_echo_env"), in_process=True), echo),
    "verifiers_v0": (lambda: gym.make("openenv/Verifiers-v0", source=str(ENVS / "verifiers_v0" / "vf_calc_tool.py")),
                     multiply),
}


def play(env: gym.Env, actions_for: Script, seed: int, steps: int = 2) -> bool:
    """Reset with ``seed`` and take ``steps`` of the scripted actions; whether the episode ended."""
    obs, info = env.reset(seed=seed)
    ended = False
    for action in actions_for(obs, info)[:steps]:
        _, _, terminated, truncated, _ = env.step(action)
        ended = terminated or truncated
    return ended


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.needs(*NEEDS.get(n, ()))) for n in CASES])
def test_finished_episodes_leave_nothing_for_the_collector(name):
    make, actions_for = CASES[name]
    env = make()
    try:
        for seed in range(3):  # warm: caches, pools, the first episodes' one-off objects
            play(env, actions_for, seed)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            ended = [play(env, actions_for, seed) for seed in range(3, 8)]
            play(env, actions_for, 8, steps=1)  # one episode cut short by the next reset
            env.reset(seed=9)
            gc.collect()
            kept = sorted({type(o).__qualname__ for o in gc.garbage})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert all(ended)
        assert kept == []
    finally:
        env.close()
