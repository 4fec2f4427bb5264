"""ConcurrentVectorEnv: Gymnasium parity, first-ready send/recv, request ids, fault isolation."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import openenv_gym  # noqa: F401
from openenv_gym.errors import BackendTimeout, ConfigurationError, EpisodeFinished
from openenv_gym.vector import ConcurrentVectorEnv

sys.path.insert(0, str(Path(__file__).parents[1]))
from conftest import ENVS, pid_alive  # noqa: E402

ARITH = "openenv/Arithmetic-v0"
COMPARED_INFO = ("task_id", "index", "split", "turn")


def call(name, args):
    return {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": name, "arguments": json.dumps(args)}}]}


def scripted(obs_batch, t):
    """A deterministic policy of the observations: calculator, then submit (right or wrong)."""
    actions = []
    for i, obs in enumerate(obs_batch):
        last = obs[-1] if obs else {"role": "user", "content": ""}
        if last["role"] == "tool" and last.get("name") == "calculator":
            answer = last["content"] if (i + t) % 3 else "-1"
            actions.append(call("submit", {"answer": answer}))
        elif "Compute " in str(last.get("content")):
            expr = last["content"].split("Compute ", 1)[1].split(". ", 1)[0]
            actions.append(call("calculator", {"expression": expr}) if (i + t) % 4 else call("submit", {"answer": "0"}))
        else:
            actions.append(call("calculator", {"expression": "1+1"}))
    return actions


def compare_infos(ours, theirs, n):
    for key in COMPARED_INFO:
        assert (key in ours) == (key in theirs), key
        if key in ours:
            np.testing.assert_array_equal(ours[f"_{key}"], theirs[f"_{key}"])
            mask = ours[f"_{key}"]
            np.testing.assert_array_equal(np.asarray(ours[key])[mask], np.asarray(theirs[key])[mask])
    for key in ("final_obs", "_final_obs", "_final_info"):
        assert (key in ours) == (key in theirs), key
    if "final_obs" in ours:
        np.testing.assert_array_equal(ours["_final_obs"], theirs["_final_obs"])
        for i in range(n):
            if ours["_final_obs"][i]:
                assert ours["final_obs"][i] == theirs["final_obs"][i]
                assert ours["final_info"]["turn"][i] == theirs["final_info"]["turn"][i]


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_autoreset_parity_with_sync_vector_env(mode):
    n, steps = 3, 12
    ours = gym.make_vec(ARITH, num_envs=n, autoreset_mode=mode, max_turns=3)
    theirs = gym.make_vec(ARITH, num_envs=n, vectorization_mode="sync", max_turns=3,
                          vector_kwargs={"autoreset_mode": mode})
    try:
        assert isinstance(ours, ConcurrentVectorEnv)
        assert ours.metadata["autoreset_mode"] == theirs.metadata["autoreset_mode"] == mode
        o1, i1 = ours.reset(seed=11)
        o2, i2 = theirs.reset(seed=11)
        assert list(o1) == list(o2)
        compare_infos(i1, i2, n)
        resets = 0
        for t in range(steps):
            actions = scripted(o1, t)
            o1, r1, te1, tr1, i1 = ours.step(actions)
            o2, r2, te2, tr2, i2 = theirs.step(actions)
            assert list(o1) == list(o2), f"step {t}"
            np.testing.assert_array_equal(r1, r2)
            np.testing.assert_array_equal(te1, te2)
            np.testing.assert_array_equal(tr1, tr2)
            compare_infos(i1, i2, n)
            done = te1 | tr1
            if mode == AutoresetMode.DISABLED and done.any():
                o1, i1 = ours.reset(options={"reset_mask": done})
                o2, i2 = theirs.reset(options={"reset_mask": done})
                assert list(o1) == list(o2)
                compare_infos(i1, i2, n)
                resets += 1
            resets += int(done.sum()) if mode != AutoresetMode.DISABLED else 0
        assert resets > 0, "the script must end episodes so autoreset is exercised"
    finally:
        ours.close()
        theirs.close()


def test_disabled_mode_refuses_to_step_an_ended_sub_env():
    envs = gym.make_vec(ARITH, num_envs=2, autoreset_mode="Disabled")
    try:
        envs.reset(seed=0)
        envs.step([call("submit", {"answer": "0"}), call("calculator", {"expression": "1"})])
        with pytest.raises(EpisodeFinished, match="reset_mask"):
            envs.step([call("submit", {"answer": "0"})] * 2)
    finally:
        envs.close()


def test_gymnasium_sync_and_async_vectorizers_work():
    for mode, kwargs in (("sync", {}), ("async", {"shared_memory": False})):
        envs = gym.make_vec(ARITH, num_envs=2, vectorization_mode=mode, vector_kwargs=kwargs)
        try:
            obs, info = envs.reset(seed=3)
            assert all(o[0]["content"].startswith("Compute ") for o in obs)
            obs, rewards, *_ = envs.step(scripted(obs, 1))
            assert rewards.dtype == np.float64 and len(obs) == 2
        finally:
            envs.close()


@pytest.fixture
def probe_vec():
    envs = gym.make_vec("openenv/ORS-v0", num_envs=4, source=str(ENVS / "ors_probe.py"), env_class="Probe",
                        vector_options={"envs_per_client": 2})
    yield envs
    envs.close()


def slow(seconds):
    return call("slow", {"seconds": seconds})


def test_recv_returns_the_first_ready_sub_envs_with_their_ids(probe_vec):
    probe_vec.reset(seed=0)
    probe_vec.send([slow(0.9), slow(0.6), slow(0.3), slow(0.0)])
    first = probe_vec.recv(batch_size=2)
    assert list(first.env_ids) == [3, 2]
    assert all(o[0]["content"] == "slept" for o in first.obs)
    assert first.infos["turn"].tolist() == [1, 1]
    probe_vec.send([slow(0.0)], env_ids=[3])
    rest = probe_vec.recv(batch_size=3)
    assert sorted(rest.env_ids.tolist()) == [0, 1, 3]
    assert rest.env_ids.tolist()[0] == 3  # the new, fast request overtakes the slow old ones
    with pytest.raises(ConfigurationError, match="no request in flight"):
        probe_vec.recv()


def test_sending_twice_to_a_busy_sub_env_is_refused(probe_vec):
    probe_vec.reset(seed=0)
    probe_vec.send([slow(0.2)], env_ids=[1])
    with pytest.raises(ConfigurationError, match="in flight"):
        probe_vec.send([slow(0.0)], env_ids=[1])
    assert probe_vec.recv().env_ids.tolist() == [1]


def test_a_late_reply_is_never_returned_for_a_newer_request(probe_vec):
    probe_vec.reset(seed=0)
    probe_vec.step_async([slow(2.0), slow(0.0), slow(0.0), slow(0.0)])
    with pytest.raises(BackendTimeout):
        probe_vec.step_wait(timeout=0.5)
    obs, rewards, terminated, truncated, infos = probe_vec.step([call("hint", {})] * 4)
    # sub-env 0 was reset (its old request abandoned), the others answered the new hint
    assert obs[0][0]["role"] == "user" and "What is" in obs[0][0]["content"]
    assert infos["error"]["type"][0] == "BackendTimeout" and not infos["_error"][1:].any()
    assert [o[0]["content"] for o in obs[1:]] == ["Think step by step."] * 3
    time.sleep(2.0)  # long after the abandoned call would have finished
    obs, *_ = probe_vec.step([call("hint", {})] * 4)
    assert [o[0]["content"] for o in obs] == ["Think step by step."] * 4


def test_a_sub_env_that_times_out_is_isolated_and_recreated():
    # step_timeout bounds resets too: 0.5 s was once too short for a reset on a loaded CI machine
    # (the sub-env came back from its failed reset with a new episode instead of a timeout)
    envs = gym.make_vec("openenv/ORS-v0", num_envs=3, source=str(ENVS / "ors_probe.py"), env_class="Probe",
                        step_timeout=2.0)
    try:
        _, infos = envs.reset(seed=0)
        assert "error" not in infos, infos["error"]
        obs, rewards, terminated, truncated, infos = envs.step([slow(30.0), call("hint", {}), call("partial", {"x": 1})])
        assert truncated.tolist() == [True, False, False] and not terminated.any()
        assert infos["error"]["type"][0] == "BackendTimeout" and infos["_error"].tolist() == [True, False, False]
        assert rewards.tolist() == [0.0, 0.0, 0.25]
        obs, *_ = envs.step([call("hint", {})] * 3)  # NEXT_STEP: sub-env 0 comes back with a new episode
        assert "What is" in obs[0][0]["content"]
        assert obs[1][0]["content"] == "Think step by step."
    finally:
        envs.close()


@pytest.mark.timeout(120)
def test_a_server_that_dies_mid_rollout_is_reported_and_recovered(probe_vec):
    probe_vec.reset(seed=0)
    pids = {a.server_pid() for a in probe_vec.adapters}
    assert len(pids) == 1, "all sub-envs share one server"
    os.kill(pids.pop(), signal.SIGKILL)
    obs, rewards, terminated, truncated, infos = probe_vec.step([call("hint", {})] * 4)
    assert truncated.all() and infos["_error"].all()
    assert set(infos["error"]["type"]) == {"BackendUnavailable"}
    obs, *_ = probe_vec.step([call("hint", {})] * 4)  # resets on a relaunched server
    assert all("What is" in o[0]["content"] for o in obs)
    obs, *_ = probe_vec.step([call("hint", {})] * 4)
    assert all(o[0]["content"] == "Think step by step." for o in obs)


def test_close_mid_rollout_leaves_no_server_and_no_task():
    envs = gym.make_vec("openenv/ORS-v0", num_envs=3, source=str(ENVS / "ors_probe.py"), env_class="Probe")
    envs.reset(seed=0)
    pid = envs.adapters[0].server_pid()
    envs.send([slow(30.0)] * 3)
    envs.close()
    assert envs.closed and envs.shard.in_flight == 0
    deadline = time.monotonic() + 20
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(pid)
    with pytest.raises(ConfigurationError, match="closed"):
        envs.step([call("hint", {})] * 3)


def test_call_get_attr_and_set_attr(probe_vec):
    assert probe_vec.call("num_tasks", "train") == (5, 5, 5, 5)
    assert probe_vec.get_attr("max_turns") == (None,) * 4
    probe_vec.set_attr("max_turns", 1)
    probe_vec.reset(seed=0)
    _, _, terminated, truncated, _ = probe_vec.step([call("hint", {})] * 4)
    assert truncated.all() and not terminated.any()
    probe_vec.set_attr("max_turns", [None, 2, 3, 4])
    assert probe_vec.get_attr("max_turns") == (None, 2, 3, 4)


def test_reset_with_a_bad_option_raises():
    envs = gym.make_vec(ARITH, num_envs=2)
    try:
        with pytest.raises(ConfigurationError):
            envs.reset(options={"split": "nope"})
    finally:
        envs.close()
