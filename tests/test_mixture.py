"""make_mixture: one vector env over sub-envs of several ids, hosted ones included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import openenv_gym
from openenv_gym import rollout
from openenv_gym.errors import ConfigurationError
from openenv_gym.records import read_records
from openenv_gym.testing import procs

ENVS = Path(__file__).resolve().parent / "envs"
PROBE = dict(source=str(ENVS / "ors_probe.py"), env_class="Probe")
ARITH, ORS = "openenv/Arithmetic-v0", "openenv/ORS-v0"
VF_ARITH = ENVS / "verifiers_v0" / "vf_arith.py"


def call(name: str, args: dict | None = None) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": name, "arguments": json.dumps(args or {})}}]}


@pytest.fixture
def mix():
    envs = openenv_gym.make_mixture({ARITH: 2, ORS: 2}, env_kwargs={ORS: {**PROBE, "python": sys.executable}})
    yield envs
    envs.close()


def test_each_sub_env_plays_its_own_id_with_its_own_tools(mix):
    assert mix.num_envs == 4 and mix.env_names == (ARITH, ARITH, ORS, ORS)
    obs, infos = mix.reset(seed=0)
    assert infos["env"].tolist() == [ARITH, ARITH, ORS, ORS]
    names = [sorted(t["function"]["name"] for t in infos["tools"][i]) for i in range(4)]
    assert names[0] == ["calculator", "submit"] and "hint" in names[2] and "hint" not in names[0]
    assert [t.name for t in mix.single_action_spaces[0].tools] == ["calculator", "submit"]
    assert {"calculator", "hint"} <= {t.name for t in mix.single_action_space.tools}
    # the same seeds give each part the tasks it gives alone
    alone = gym.make_vec(ARITH, num_envs=2)
    try:
        assert alone.reset(seed=0)[1]["task_id"].tolist() == infos["task_id"][:2].tolist()
    finally:
        alone.close()
    obs, rewards, terminated, truncated, infos = mix.step(
        [call("calculator", {"expression": "2*3"})] * 2 + [call("hint"), call("calculator", {"expression": "1"})])
    assert obs[0][0]["content"] == "6" and obs[1][0]["content"] == "6"
    assert obs[2][0]["role"] == "tool" and "error" not in json.dumps(infos.get("error", ""))
    assert "calculator" in obs[3][0]["content"]  # the probe has no calculator: the agent is told so
    assert infos["env"].tolist() == [ARITH, ARITH, ORS, ORS]


def test_recv_is_first_ready_across_ids(mix):
    mix.reset(seed=1)
    mix.send([call("calculator", {"expression": "1"}), call("calculator", {"expression": "1"}),
              call("slow", {"seconds": 2}), call("hint")])
    first = mix.recv(batch_size=3, timeout=10)
    assert sorted(first.env_ids.tolist()) == [0, 1, 3]
    assert first.infos["env"].tolist() == [mix.env_names[i] for i in first.env_ids]
    last = mix.recv(timeout=10)
    assert last.env_ids.tolist() == [2] and last.infos["env"].tolist() == [ORS]


def test_groups_stay_inside_one_id():
    with pytest.raises(ConfigurationError, match="span two ids"):
        openenv_gym.make_mixture({ARITH: 3, ORS: 1}, group_size=2, env_kwargs={ORS: PROBE})
    envs = openenv_gym.make_mixture({ARITH: 2, ORS: 2}, group_size=2, env_kwargs={ORS: PROBE})
    try:
        _, infos = envs.reset(seed=4)
        assert infos["group"].tolist() == [0, 0, 1, 1]
        assert infos["task_id"][0] == infos["task_id"][1] and infos["task_id"][2] == infos["task_id"][3]
    finally:
        envs.close()


def test_bad_mixtures_are_refused_before_anything_starts():
    before = set(procs.descendants())
    with pytest.raises(ConfigurationError, match="is not registered"):
        openenv_gym.make_mixture({ARITH: 2, "openenv/Nope-v0": 2})
    with pytest.raises(ConfigurationError, match="positive integer"):
        openenv_gym.make_mixture({ARITH: 0})
    with pytest.raises(ConfigurationError, match="not in the mixture"):
        openenv_gym.make_mixture({ARITH: 1}, env_kwargs={ORS: PROBE})
    with pytest.raises(ConfigurationError):  # the second part fails to start: the first is closed
        openenv_gym.make_mixture({ARITH: 2, ORS: 2}, env_kwargs={ORS: {"source": str(ENVS / "missing.py")}})
    assert procs.wait_dead(set(procs.descendants()) - before, timeout=15) == []


@pytest.mark.parametrize("kwargs, says", [
    (dict(weights={ARITH: 2}, group_size=0), "group_size must be a positive integer, not 0"),
    (dict(weights={ARITH: 2}, group_size=-2), "group_size must be a positive integer"),
    (dict(weights={ARITH: 2}, group_size=1.5), "group_size must be a positive integer"),
    (dict(weights={ARITH: 2}, env_kwargs={ARITH: ["split", "test"]}), r"env_kwargs\['openenv/Arithmetic-v0'\] must be a dict"),
    (dict(weights={ARITH: 2}, env_kwargs=[(ARITH, {})]), "env_kwargs must map ids to dicts"),
    (dict(weights={"CartPole-v1": 2}), "'CartPole-v1' is not an openenv id"),
    (dict(weights=[(ARITH, 2)]), "takes a mapping of id -> number of sub-envs"),
    (dict(weights=[ARITH, ORS]), "takes a mapping of id -> number of sub-envs"),
    (dict(weights={ARITH: np.float64(2.0)}), "count for 'openenv/Arithmetic-v0' must be a positive integer"),
    (dict(weights={ARITH: np.bool_(True)}), "must be a positive integer"),
    (dict(weights={ARITH: 2}, autoreset_mode="Sometimes"), "autoreset_mode must be one of"),
], ids=["group_size=0", "group_size<0", "group_size float", "env_kwargs value a list", "env_kwargs a list",
        "a Gymnasium id", "weights a list of pairs", "weights a list of ids", "a float count", "a numpy bool count",
        "an unknown autoreset mode"])
def test_every_bad_argument_is_a_configuration_error_naming_it(kwargs, says):
    before = set(procs.descendants())
    weights = kwargs.pop("weights")
    with pytest.raises(ConfigurationError, match=says):
        openenv_gym.make_mixture(weights, **kwargs)
    assert set(procs.descendants()) - before == set()  # refused before anything started


def test_numpy_integer_counts_work_like_ints():
    envs = openenv_gym.make_mixture({ARITH: np.int64(2)}, group_size=np.int32(2))
    try:
        assert envs.num_envs == 2 and envs.group_size == 2
        _, infos = envs.reset(seed=0)
        assert infos["group"].tolist() == [0, 0]
    finally:
        envs.close()


def test_a_dead_host_in_one_part_leaves_the_other_part_alone(mix):
    mix.reset(seed=2)
    hosted = mix.parts[ORS]
    pid = hosted.pids[0]
    import os
    import signal

    os.kill(pid, signal.SIGKILL)
    obs, rewards, terminated, truncated, infos = mix.step(
        [call("calculator", {"expression": "1"})] * 2 + [call("hint")] * 2)
    np.testing.assert_array_equal(truncated, [False, False, True, True])
    assert infos["error"]["type"][2] == "HostDied" and obs[0][0]["content"] == "1"
    obs, rewards, terminated, truncated, infos = mix.step([call("calculator", {"expression": "1"})] * 2 + [call("hint")] * 2)
    assert not truncated.any() and "error" not in infos


def test_close_leaves_nothing():
    before = set(procs.descendants())  # servers other tests' fixtures keep up are not this mixture's
    mix = openenv_gym.make_mixture({ARITH: 2, ORS: 2}, env_kwargs={ORS: {**PROBE, "python": sys.executable}})
    mix.reset(seed=0)
    pids = [p for p in mix.parts[ORS].pids if p]
    started = set(procs.descendants()) - before
    assert set(pids) <= started and len(started) > len(pids)  # the hosts, and the servers they run
    mix.close()
    mix.close()
    assert procs.wait_dead(started, timeout=15) == []


@pytest.mark.needs("verifiers")
def test_rollout_collects_a_mixture_and_names_each_episodes_id(tmp_path):
    """An ORS env and a legacy Verifiers env (each scored by its own library) in one rollout."""
    out = tmp_path / "mix.jsonl"
    vf_id = "openenv/Verifiers-v0"
    summary = rollout.collect({ARITH: 2, vf_id: 2}, episodes=8, out=out, progress=False, group_size=2,
                              make_kwargs=dict(env_kwargs={ARITH: {"max_turns": 3}, vf_id: {"source": str(VF_ARITH)}}))
    assert summary.episodes == 8 and summary.env_id == f"{ARITH}+{vf_id}"
    records = read_records(out)
    assert len(records) == 8 and {r.env for r in records} == {ARITH, vf_id}
    for r in records:
        tools = {t["function"]["name"] for t in r.tools or []}
        assert ("calculator" in tools) == (r.env == ARITH)
        if r.env == vf_id:  # one turn, scored by the library's rubric (a length penalty at least)
            assert len(r.rewards) == 1 and r.terminated and r.total_reward != 0.0
        assert r.group is not None and r.advantage is not None
