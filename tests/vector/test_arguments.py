"""What a vector env refuses, and what it releases: num_envs, reset_mask, group seeds with a mask,
and the wrapper stacks of recreated sub-envs."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import openenv_gym  # noqa: F401
from openenv_gym.errors import ConfigurationError
from openenv_gym.testing import procs
from openenv_gym.wrappers import RecordEpisodes

ENVS = Path(__file__).resolve().parents[1] / "envs"
PROBE = dict(source=str(ENVS / "ors_probe.py"), env_class="Probe")


def call(name: str, args: dict | None = None) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": name, "arguments": json.dumps(args or {})}}]}


@pytest.mark.parametrize("num_envs", [0, -3, 10**12, 2.5, "4", True])
def test_a_num_envs_that_cannot_be_is_refused_before_anything_starts(num_envs):
    before = procs.descendants()
    with pytest.raises(ConfigurationError, match="num_envs"):
        gym.make_vec("openenv/Arithmetic-v0", num_envs=num_envs)
    assert procs.descendants() == before


def test_a_numpy_integer_num_envs_works():
    envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=np.int64(2))
    try:
        assert envs.num_envs == 2 and isinstance(envs.num_envs, int)
    finally:
        envs.close()


@pytest.fixture(scope="module")
def arith():
    envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=4, group_size=2)
    yield envs
    envs.close()


@pytest.mark.parametrize("mask, error", [
    ([True, False, True, False], TypeError),                       # a list: Gymnasium raises TypeError
    (np.array([1, 0, 1, 0]), TypeError),                            # a wrong dtype: TypeError too
    (np.array([True, False]), ValueError),                          # a wrong shape
    (np.zeros(4, dtype=bool), ValueError),                          # nothing to reset
])
def test_reset_mask_is_checked_with_gymnasiums_exception_types(arith, mask, error):
    reference = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4,
                                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    reference.reset(seed=0)
    with pytest.raises(error) as theirs:
        reference.reset(options={"reset_mask": mask})
    reference.close()
    arith.reset(seed=0)
    with pytest.raises(error) as ours:
        arith.reset(options={"reset_mask": mask})
    assert str(ours.value) == str(theirs.value)  # Gymnasium's own words, wherever we mirror its checks


def test_a_group_seed_with_a_reset_mask_is_refused_not_ignored(arith):
    arith.reset(seed=0)
    with pytest.raises(ValueError, match="reset_mask"):
        arith.reset(seed=5, options={"reset_mask": np.array([True, True, False, False])})
    obs, infos = arith.reset(options={"reset_mask": np.array([True, True, False, False])})  # no seed: fine
    assert infos["_task_id"].tolist() == [True, True, False, False]


def _open_fds(path: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(path)):
                count += 1
        except OSError:
            pass
    return count


def test_recreated_sub_envs_close_their_wrapper_stacks(tmp_path):
    """Each recreation of a sub-env (after a timeout) builds a new wrapper stack; the old one must be
    closed (a recorder's file with it), and nothing of the recorder is open after close()."""
    path = tmp_path / "episodes.jsonl"
    # step_timeout well above a reset on a loaded machine: the recreation must succeed to be counted
    envs = gym.make_vec("openenv/ORS-v0", num_envs=2, step_timeout=1.5, **PROBE,
                        env_wrappers=[functools.partial(RecordEpisodes, path=str(path))])
    try:
        envs.reset(seed=0)
        baseline = _open_fds(tmp_path)
        for _ in range(4):  # a step past step_timeout breaks sub-env 0; its next request recreates it
            _, _, _, truncated, infos = envs.step([call("slow", {"seconds": 4.0}), call("hint")])
            assert truncated[0] and infos["error"]["type"][0] == "BackendTimeout"
            envs.step([call("hint"), call("hint")])  # the recreation
        assert _open_fds(tmp_path) <= baseline, "a replaced wrapper stack kept its recorder open"
    finally:
        envs.close()
    assert _open_fds(tmp_path) == 0
