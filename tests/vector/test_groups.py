"""``gym.make_vec(..., group_size=k)``: the e-th episode of every member of a group runs one task.

What a GRPO/RLOO trainer relies on, against real ORS servers: members' e-th episodes share
``task_id`` for every e, whatever pace each member plays at (first-ready ``send``/``recv``), in
both autoreset modes, across failures and recreated sub-envs, on both backends; different groups
get different tasks; ``reset(seed=s)`` reproduces the whole assignment.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import openenv_gym  # noqa: F401
from openenv_gym.errors import ConfigurationError
from openenv_gym.vector.base import info_at

ARITH = "openenv/Arithmetic-v0"
PROBE = str(Path(__file__).resolve().parents[1] / "envs" / "ors_probe.py")


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": name, "arguments": json.dumps(args)}}]}


def play(envs, episodes_each: int, *, seed: int, action_for, batch: int = 3) -> dict[tuple[int, int], dict[int, str]]:
    """Drive ``envs`` first-ready until every sub-env finished ``episodes_each`` episodes; return
    ``(group, group_episode) -> {env_id: task_id}`` for every episode that started."""
    n = envs.num_envs
    rng = np.random.default_rng(seed)
    seen: dict[tuple[int, int], dict[int, str]] = defaultdict(dict)
    finished = [0] * n

    def note(i: int, info: dict[str, Any]) -> None:
        if "task_id" in info and info.get("group_episode", -1) >= 0:
            seen[(int(info["group"]), int(info["group_episode"]))][i] = info["task_id"]

    obs, infos = envs.reset(seed=seed)
    for i in range(n):
        note(i, info_at(infos, i))
    same_step = envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    ended = [False] * n
    envs.send([action_for(rng, i, obs[i]) for i in range(n)])
    in_flight = n
    while in_flight:
        b = envs.recv(min(batch, in_flight))
        in_flight -= len(b.env_ids)
        ids, actions = [], []
        for k, i in enumerate(b.env_ids.tolist()):
            info = info_at(b.infos, k)
            done = bool(b.terminations[k] or b.truncations[k])
            if ended[i]:  # NEXT_STEP: this result is the autoreset of the episode that ended
                ended[i] = False
                note(i, info)
            elif done:
                finished[i] += 1
                if same_step:
                    note(i, info)  # the next episode's opening came with the last step
                else:
                    ended[i] = True
            if finished[i] < episodes_each or ended[i]:
                ids.append(i), actions.append(action_for(rng, i, b.obs[k]))
        if ids:
            envs.send(actions, ids)
            in_flight += len(ids)
    return seen


def arithmetic_action(rng: np.random.Generator, i: int, obs: list[dict[str, Any]]) -> dict[str, Any]:
    """Members play at different paces: a calculator call or two, or a (wrong) answer at once."""
    return call("calculator", {"expression": "1+1"}) if rng.random() < 0.6 else call("submit", {"answer": "-1"})


def assert_shared(seen: dict[tuple[int, int], dict[int, str]], group_size: int, episodes_each: int) -> None:
    assert seen, "no episode was recorded"
    for (group, slot), tasks in seen.items():
        assert len(set(tasks.values())) == 1, f"group {group} episode {slot}: members got {tasks}"
    for group in {g for g, _ in seen}:
        for slot in range(episodes_each):
            assert len(seen[(group, slot)]) == group_size, f"group {group} episode {slot}: {seen[(group, slot)]}"


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
def test_members_share_every_episode_task_at_their_own_pace(mode):
    envs = gym.make_vec(ARITH, num_envs=8, group_size=4, autoreset_mode=mode)
    try:
        seen = play(envs, 4, seed=11, action_for=arithmetic_action)
    finally:
        envs.close()
    assert_shared(seen, 4, 4)
    group0 = [seen[(0, e)][0] for e in range(4)]
    group1 = [seen[(1, e)][4] for e in range(4)]
    assert group0 != group1, "two groups were given the same tasks"
    assert len(set(group0)) > 1, "a group's episodes all had one task"


def test_lockstep_step_and_seeds_reproduce_the_assignment():
    def first_tasks(seed: int) -> list[list[str]]:
        envs = gym.make_vec(ARITH, num_envs=4, group_size=2, autoreset_mode=AutoresetMode.SAME_STEP)
        try:
            _, infos = envs.reset(seed=seed)
            rows = [list(infos["task_id"])]
            for _ in range(2):  # every sub-env answers at once: each episode ends in one step
                _, _, term, _, infos = envs.step([call("submit", {"answer": "-1"})] * 4)
                assert term.all()
                assert list(infos["group"]) == [0, 0, 1, 1]
                rows.append(list(infos["task_id"]))
            return rows
        finally:
            envs.close()

    a, b, c = first_tasks(5), first_tasks(5), first_tasks(6)
    assert a == b, "the same seed gave another assignment"
    assert a != c
    for row in a:
        assert row[0] == row[1] and row[2] == row[3] and row[0] != row[2]


def test_a_failed_member_is_recreated_and_stays_on_its_groups_tasks():
    envs = gym.make_vec("openenv/ORS-v0", num_envs=4, group_size=2, source=PROBE, env_class="Probe",
                        step_timeout=1.0, autoreset_mode=AutoresetMode.SAME_STEP)
    failures = []

    def action(rng, i, obs):
        if i == 0 and rng.random() < 0.3:
            return call("slow", {"seconds": 3.0})  # past step_timeout: truncated, recreated
        return call("hint", {}) if rng.random() < 0.5 else call("submit", {"answer": "x"})

    try:
        original_recv = envs.recv

        def recv(*args, **kwargs):
            b = original_recv(*args, **kwargs)
            failures.extend(i for k, i in enumerate(b.env_ids.tolist()) if "error" in info_at(b.infos, k))
            return b

        envs.recv = recv
        seen = play(envs, 4, seed=3, action_for=action, batch=2)
    finally:
        envs.close()
    assert failures, "the slow tool never failed a step; the test did not test recreation"
    for (group, slot), tasks in seen.items():
        assert len(set(tasks.values())) == 1, f"group {group} episode {slot}: members got {tasks}"


def test_group_size_is_checked_before_anything_starts():
    with pytest.raises(ConfigurationError, match="not divisible"):
        gym.make_vec(ARITH, num_envs=6, group_size=4)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ConfigurationError, match="group_size"):
            gym.make_vec(ARITH, num_envs=4, group_size=bad)
    envs = gym.make_vec(ARITH, num_envs=4, group_size=2)
    try:
        with pytest.raises(ValueError, match="group_size"):
            envs.reset(seed=[1, 2, 3, 4])
    finally:
        envs.close()


@pytest.mark.ray
def test_groups_on_the_ray_backend():
    pytest.importorskip("ray")
    envs = gym.make_vec(ARITH, num_envs=4, group_size=2, backend="ray", autoreset_mode=AutoresetMode.SAME_STEP,
                        vector_options={"num_actors": 2})
    try:
        seen = play(envs, 3, seed=7, action_for=arithmetic_action, batch=2)
    finally:
        envs.close()
    assert_shared(seen, 2, 3)
