"""Adapter host processes: ``gym.make(id, python=...)`` and vector envs over host processes.

The hosts run under this test's own interpreter (``python=sys.executable``): what is tested here
is the host itself (the protocol, typed errors, first-ready delivery, a host dying, nothing left
running). Other interpreters and venvs are tested in tests/isolation.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401  (registers the ids)
from openenv_gym.errors import (
    BackendTimeout,
    ConfigurationError,
    EpisodeInterrupted,
    EpisodeNotStarted,
    HostDied,
    InvalidAction,
    TaskNotFound,
)
from openenv_gym.hosts.protocol import unpack
from openenv_gym.testing import procs
from openenv_gym.wrappers import ConversationHistory

ENVS = Path(__file__).resolve().parents[1] / "envs"
PROBE = dict(source=str(ENVS / "ors_probe.py"), env_class="Probe")
PY = sys.executable


def call(name: str, args: dict | None = None) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": name, "arguments": json.dumps(args or {})}}]}


def host_pid(env) -> int:
    pid = env.unwrapped.runner.pid
    assert pid is not None and procs.alive(pid)
    return pid


@pytest.fixture
def hosted():
    env = gym.make("openenv/ORS-v0", python=PY, **PROBE)
    yield env
    env.close()


def test_a_hosted_env_plays_exactly_like_an_in_process_one(hosted):
    local = gym.make("openenv/ORS-v0", **PROBE)
    try:
        assert hosted.unwrapped.splits() == local.unwrapped.splits()
        assert hosted.unwrapped.num_tasks("train") == local.unwrapped.num_tasks("train")
        assert hosted.unwrapped.task("train", 1) == local.unwrapped.task("train", 1)
        assert [t.name for t in hosted.action_space.tools] == [t.name for t in local.action_space.tools]
        for seed in (0, 1, 7):
            (obs_h, info_h), (obs_l, info_l) = hosted.reset(seed=seed), local.reset(seed=seed)
            assert obs_h == obs_l
            for key in ("task_id", "split", "index", "tools"):
                assert info_h[key] == info_l[key], key
            for action in (call("hint"), call("partial"), "plain text", call("nope"), call("submit", {"answer": "x"})):
                out_h, out_l = hosted.step(action), local.step(action)
                assert out_h[0] == out_l[0] and out_h[1:4] == out_l[1:4], action
                if out_h[2] or out_h[3]:
                    break
    finally:
        local.close()


def test_errors_come_back_typed(hosted):
    # (unwrapped: Gymnasium's passive checker breaks on a second step after a first that raised)
    with pytest.raises(EpisodeNotStarted):
        hosted.unwrapped.step(call("hint"))
    hosted.reset(seed=0)
    with pytest.raises(TaskNotFound):
        hosted.reset(options={"index": 10**6})
    with pytest.raises(ConfigurationError, match="unknown reset option"):
        hosted.reset(options={"bogus": 1})
    hosted.reset(seed=0)
    obs, reward, terminated, truncated, info = hosted.step(call("boom"))  # a tool raising: a message
    assert obs and reward == 0.0 and not terminated and "boom" in json.dumps(obs)
    with pytest.raises(InvalidAction):
        hosted.step({1, 2})
    obs, *_ = hosted.step('{"not": "a call"')  # a malformed action: the agent reads what was wrong
    assert obs and obs[0]["role"] in ("user", "tool")


def test_a_step_cut_short_leaves_the_episode_interrupted_and_the_host_alive():
    env = gym.make("openenv/ORS-v0", python=PY, step_timeout=1.0, **PROBE)
    try:
        env.reset(seed=0)
        pid = host_pid(env)
        start = time.monotonic()
        with pytest.raises(BackendTimeout):
            env.step(call("slow", {"seconds": 30}))
        assert time.monotonic() - start < 10
        with pytest.raises(EpisodeInterrupted):
            env.step(call("hint"))
        env.reset(seed=0)
        assert env.step(call("hint"))[0]
        assert host_pid(env) == pid  # the host itself was fine
    finally:
        env.close()


def test_ctrl_c_mid_step_is_cancelled_in_the_host_too(hosted):
    hosted.reset(seed=0)
    main = threading.get_ident()
    threading.Timer(0.5, lambda: signal.pthread_kill(main, signal.SIGINT)).start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        hosted.step(call("tick", {"seconds": 3}))
    assert time.monotonic() - start < 5
    with pytest.raises(EpisodeInterrupted):
        hosted.step(call("hint"))
    hosted.reset(seed=0)
    # the cancelled tick never counted: the host cancelled it (its server saw the session end)
    obs, *_ = hosted.step(call("tick", {"seconds": 0}))
    assert obs[0]["content"] == "1"


def test_a_killed_host_is_a_typed_error_within_5_s_and_reset_recovers(hosted):
    hosted.reset(seed=0)
    pid = host_pid(hosted)
    servers = procs.descendants(pid)
    assert servers, "the host should run the source's server"
    threading.Timer(0.5, lambda: os.kill(pid, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(HostDied, match="gone"):
        hosted.step(call("slow", {"seconds": 30}))
    assert time.monotonic() - start < 5
    assert procs.wait_dead(servers) == [], "the dead host's server outlived it"
    with pytest.raises(EpisodeInterrupted, match="lost"):
        hosted.step(call("hint"))
    obs, info = hosted.reset(seed=0)
    assert obs and host_pid(hosted) != pid
    assert hosted.step(call("hint"))[0]


def test_a_late_answer_is_never_taken_for_the_next_requests():
    """A step given up (its timeout) leaves its answer to come later: matched by id and dropped."""
    env = gym.make("openenv/ORS-v0", python=PY, step_timeout=1.0, **PROBE)
    try:
        tasks = env.unwrapped.num_tasks("train")
        env.reset(seed=0)
        with pytest.raises(BackendTimeout, match="step_timeout=1.0"):
            env.step(call("tick", {"seconds": 2.0}))
        time.sleep(2.0)  # the given-up step's answer (or its cancellation) is on the socket by now
        assert env.unwrapped.num_tasks("train") == tasks
        obs, _ = env.reset(seed=0)
        assert obs and obs[0]["role"] == "user"
        obs, *_ = env.step(call("tick", {"seconds": 0}))
        assert obs[0]["content"] == "1"  # this step's own answer: the new episode's first tick
    finally:
        env.close()


def test_close_from_another_thread_ends_a_hung_step_within_10_s():
    env = gym.make("openenv/ORS-v0", python=PY, **PROBE)
    env.reset(seed=0)
    pid = host_pid(env)
    tree = [pid, *procs.descendants(pid)]
    threading.Timer(0.5, env.close).start()
    start = time.monotonic()
    with pytest.raises(HostDied):
        env.step(call("slow", {"seconds": 60}))
    assert time.monotonic() - start < 10
    assert procs.wait_dead(tree, timeout=10) == []


def test_a_stopped_host_times_out_within_5_s_and_closes_within_10_s():
    """A host frozen by SIGSTOP answers nothing: the step ends at step_timeout, close() kills it."""
    env = gym.make("openenv/ORS-v0", python=PY, step_timeout=1.0, **PROBE)
    env.reset(seed=0)
    pid = host_pid(env)
    tree = [pid, *procs.descendants(pid)]
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(BackendTimeout, match="step_timeout=1.0"):
            env.step(call("hint"))
        assert time.monotonic() - start < 5
        start = time.monotonic()
        env.close()
        assert time.monotonic() - start < 10
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert procs.wait_dead(tree, timeout=10) == []


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=2**32 - 1))
def test_any_bytes_on_the_host_socket_are_a_frame_or_a_clear_error(data, size):
    """What a broken host could write: a frame, not yet a frame, or ValueError (HostDied then)."""
    for stream in (data, struct.pack(">I", size) + data):
        buffer = bytearray(stream)
        try:
            while unpack(buffer) is not None:
                pass
        except ValueError:
            pass


def test_close_leaves_no_process():
    env = gym.make("openenv/ORS-v0", python=PY, **PROBE)
    env.reset(seed=0)
    pid = host_pid(env)
    tree = [pid, *procs.descendants(pid)]
    env.close()
    env.close()  # idempotent
    assert procs.wait_dead(tree, timeout=10) == []


def test_an_interpreter_without_openenv_gym_is_refused_clearly(tmp_path):
    subprocess.run([PY, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = str(tmp_path / "bare" / "bin" / "python")
    before = set(procs.descendants())
    with pytest.raises(ConfigurationError, match="cannot run the openenv_gym host"):
        gym.make("openenv/ORS-v0", python=bare, **PROBE)
    with pytest.raises(ConfigurationError, match="no such interpreter"):
        gym.make("openenv/ORS-v0", python=str(tmp_path / "missing"), **PROBE)
    assert procs.wait_dead(set(procs.descendants()) - before, timeout=10) == []


def test_a_named_interpreter_wins_over_isolate():
    """An id imported isolated registers isolate=True; python= given to gym.make runs it there, unbuilt."""
    env = gym.make("openenv/ORS-v0", python=PY, isolate=True, **PROBE)
    try:
        env.reset(seed=0)
        assert procs.cmdline(host_pid(env)).split()[0] == PY
    finally:
        env.close()


# -- vector envs over host processes -------------------------------------------------------------
@pytest.fixture
def vec():
    envs = gym.make_vec("openenv/ORS-v0", num_envs=4, python=PY, vector_options={"num_hosts": 2}, **PROBE)
    yield envs
    envs.close()


def test_a_hosted_vector_env_is_first_ready_across_and_within_hosts(vec):
    assert type(vec.unwrapped).__name__ == "ProcessVectorEnv" and vec.unwrapped.num_hosts == 2
    vec.reset(seed=0)
    # sub-envs 0 and 2 share host 0: 2's answer must not wait for 0's slow tool
    vec.send([call("slow", {"seconds": 2}), call("hint"), call("hint"), call("hint")])
    first = vec.recv(batch_size=3, timeout=10)
    assert sorted(first.env_ids.tolist()) == [1, 2, 3]
    last = vec.recv(timeout=10)
    assert last.env_ids.tolist() == [0] and last.obs[0][0]["content"] == "slept"


def test_a_hosted_vector_env_steps_like_the_concurrent_one(vec):
    local = gym.make_vec("openenv/ORS-v0", num_envs=4, **PROBE)
    try:
        (obs_h, inf_h), (obs_l, inf_l) = vec.reset(seed=3), local.reset(seed=3)
        assert obs_h == obs_l and inf_h["task_id"].tolist() == inf_l["task_id"].tolist()
        actions = [call("hint"), call("partial"), "text", call("submit", {"answer": "x"})]
        for _ in range(3):
            out_h, out_l = vec.step(actions), local.step(actions)
            assert out_h[0] == out_l[0]
            for a, b in zip(out_h[1:4], out_l[1:4]):
                np.testing.assert_array_equal(a, b)
    finally:
        local.close()


def test_killing_a_host_truncates_only_its_sub_envs_and_it_is_replaced(vec):
    vec.reset(seed=0)
    old = vec.unwrapped.pids
    servers = procs.descendants(old[0])
    os.kill(old[0], signal.SIGKILL)  # hosts sub-envs 0 and 2
    start = time.monotonic()
    obs, rewards, terminated, truncated, infos = vec.step([call("hint")] * 4)
    assert time.monotonic() - start < 10
    mine = np.array([True, False, True, False])
    np.testing.assert_array_equal(truncated, mine)
    np.testing.assert_array_equal(infos["_error"], mine)
    for i in (0, 2):
        assert infos["error"]["type"][i] == "HostDied" and "replaced" in infos["error"]["message"][i]
        assert obs[i] == []
    for i in (1, 3):
        assert obs[i] and obs[i][0]["role"] == "tool"
    obs, rewards, terminated, truncated, infos = vec.step([call("hint")] * 4)
    assert "error" not in infos and not truncated.any()
    assert vec.unwrapped.replaced_hosts == 1
    new = vec.unwrapped.pids
    assert new[0] != old[0] and new[1] == old[1]
    assert procs.wait_dead([old[0], *servers]) == []


def test_groups_and_wrappers_work_through_hosts():
    envs = gym.make_vec("openenv/ORS-v0", num_envs=4, python=PY, group_size=2, env_wrappers=[ConversationHistory],
                        vector_options={"num_hosts": 2}, **PROBE)
    try:
        obs, infos = envs.reset(seed=5)
        assert infos["group"].tolist() == [0, 0, 1, 1]
        assert infos["task_id"][0] == infos["task_id"][1] and infos["task_id"][2] == infos["task_id"][3]
        obs, *_ = envs.step([call("hint")] * 4)
        # ConversationHistory makes the observation the whole conversation so far
        assert all(o[0]["role"] == "user" and o[-1]["role"] == "tool" for o in obs)
    finally:
        pids = [p for p in envs.unwrapped.pids if p]
        envs.close()
    assert procs.wait_dead(pids) == []


# -- hosts that stop answering are replaced, single env and vector env alike (the same rule) ------
# A host that misses a deadline must answer a liveness check within PING_TIMEOUT, or it is killed
# and replaced: a single env on its next call, a vector env at once (step_timeout + HUNG_GRACE
# into the call).

@pytest.fixture
def corrupting_hosts(tmp_path, monkeypatch):
    """Host processes that answer their first RUN (a reset), then send a frame header announcing
    64 MiB and nothing more: the driver is left waiting inside a frame (the stream is corrupt)."""
    site = tmp_path / "site"
    site.mkdir()
    # The host runs `-m openenv_gym.hosts.server`, which imports these protocol functions by name
    # after this runs: reading and packing frames is where the host is made to misbehave.
    (site / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('OPENENV_GYM_TEST_CORRUPT_HOST'):\n"
        "    import struct\n"
        "    from openenv_gym.hosts import protocol\n"
        "    real_pack, real_read, runs = protocol.pack, protocol.read_frame, []\n"
        "    async def read_frame(reader):\n"
        "        frame = await real_read(reader)\n"
        "        if frame is not None and frame.kind is protocol.Kind.RUN:\n"
        "            runs.append(frame.id)\n"
        "        return frame\n"
        "    def pack(frame):\n"
        "        if len(runs) > 1 and frame.id in runs[1:]:\n"
        "            return struct.pack('>I', 64 << 20) + b'garbage'\n"
        "        return real_pack(frame)\n"
        "    protocol.read_frame, protocol.pack = read_frame, pack\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("OPENENV_GYM_TEST_CORRUPT_HOST", "1")
    yield


def test_a_stopped_single_host_is_replaced_by_the_next_reset():
    """SIGSTOP: the step times out at step_timeout, the next reset finds the host dead, kills it and
    plays on a new host (it used to time out against the same pid forever)."""
    env = gym.make("openenv/ORS-v0", python=PY, step_timeout=1.0, **PROBE)
    try:
        env.reset(seed=0)
        pid = host_pid(env)
        tree = [pid, *procs.descendants(pid)]
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(BackendTimeout, match="step_timeout=1.0"):
            env.step(call("hint"))
        obs, info = env.reset(seed=1)
        assert "What is" in obs[0]["content"]
        assert host_pid(env) != pid and env.unwrapped.runner.replaced == 1
        assert procs.wait_dead(tree, timeout=10) == [], "the stopped host and its server were not killed"
        assert env.step(call("hint"))[0][0]["content"] == "Think step by step."
    finally:
        env.close()


@pytest.mark.slow
def test_a_single_host_with_a_corrupt_stream_is_replaced(corrupting_hosts):
    env = gym.make("openenv/ORS-v0", python=PY, step_timeout=2.0, **PROBE)
    try:
        env.reset(seed=0)
        pid = host_pid(env)
        with pytest.raises(BackendTimeout):
            env.step(call("hint"))  # its answer never completes
        obs, _ = env.reset(seed=1)  # the liveness check fails: a new host (it corrupts only later runs)
        assert "What is" in obs[0]["content"]
        assert host_pid(env) != pid and env.unwrapped.runner.replaced == 1
        assert procs.wait_dead([pid], timeout=10) == []
    finally:
        env.close()


@pytest.mark.slow
def test_a_vector_host_with_a_corrupt_stream_is_replaced(corrupting_hosts):
    from openenv_gym.shard.handle import HUNG_GRACE, PING_TIMEOUT

    vec = gym.make_vec("openenv/ORS-v0", num_envs=2, python=PY, step_timeout=1.0,
                       vector_options={"num_hosts": 1}, **PROBE)
    try:
        vec.reset(seed=0)
        (pid,) = vec.unwrapped.pids
        start = time.monotonic()
        _, _, _, truncated, infos = vec.step([call("hint")] * 2)
        assert time.monotonic() - start < 1.0 + HUNG_GRACE + PING_TIMEOUT + 5
        assert truncated.all() and set(infos["error"]["type"]) == {"BackendTimeout"}
        assert all("stopped answering" in m and "replaced" in m for m in infos["error"]["message"])
        assert vec.unwrapped.replaced_hosts == 1 and procs.wait_dead([pid], timeout=10) == []
    finally:
        vec.close()


def test_a_dead_hosts_message_leads_with_its_exception_and_shows_whole_lines(tmp_path):
    """Only the end of a host's output is kept: the cause comes first, no line starts mid-word."""
    from openenv_gym.hosts.process import gone_message

    out = tmp_path / "stderr"
    out.write_bytes(b"x" * 5000 + b"word\nTraceback (most recent call last):\n  File \"env.py\", line 3, in <module>\n"
                    b"    import missing_sdk\nModuleNotFoundError: No module named 'missing_sdk'\n")
    with open(out, "rb") as f:
        message = gone_message(None, "it exited", f)
    assert message.startswith("ModuleNotFoundError: No module named 'missing_sdk' (the host process (pid None) is gone: it exited")
    assert "the end of its output:\nTraceback (most recent call last):" in message and "xword" not in message
