"""Servers that misbehave: whatever a server sends, the client stays bounded and says what went wrong.

The server is ``tests/hostile_server.py``, a real aiohttp app in its own process (ORS on a Unix
socket, OpenEnv on 127.0.0.1), stopped by PID. It misbehaves as each action asks (one mode per
behaviour), so a vector env can hold one misbehaving sub-env among well-behaved ones. Every
error names the limit or the fault; nothing hangs until ``step_timeout`` and nothing grows
without bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import httpx
import pytest

import openenv_gym  # noqa: F401  (registers the ids)
from openenv_gym.adapters.limits import DEFAULT_MAX_JSON_DEPTH, DEFAULT_MAX_RESPONSE_BYTES
from openenv_gym.errors import ServerError
from openenv_gym.testing import procs

pytestmark = pytest.mark.timeout(180)

SCRIPT = Path(__file__).parents[1] / "hostile_server.py"
MIB = 1024 * 1024


class Hostile:
    """The hostile server: ``ors`` (a ``unix:`` URL) and ``openenv`` (``http://127.0.0.1:<port>/openenv``)."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="hostile-")
        socket_path = os.path.join(self.folder, "hostile.sock")
        self.process = subprocess.Popen([sys.executable, str(SCRIPT), "--unix", socket_path, "--port", "0"],
                                        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        self.ors = self.process.stdout.readline().strip()
        self.http = self.process.stdout.readline().strip()
        assert self.ors.startswith("unix:") and self.http.startswith("http://127.0.0.1:"), (self.ors, self.http)
        self.openenv = f"{self.http}/openenv"

    def sent(self) -> int:
        """Bytes the server wrote in its endless and huge modes so far."""
        return httpx.get(f"{self.http}/sent", timeout=5).json()["sent"]

    def stop(self) -> None:
        procs.terminate(self.process)
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    server = Hostile()
    try:
        yield server
    finally:
        server.stop()
    assert not procs.alive(server.process.pid)


def act(how: str, name: str = "act", key: str = "how") -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{how}", "type": "function", "function": {"name": name, "arguments": json.dumps({key: how})}}]}


def step_action(how: str) -> dict:
    return act(how, name="step")


class PeakRSS:
    """This process's peak resident memory over a block (the kernel's high-water mark, reset first)."""

    def __enter__(self) -> PeakRSS:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
        self.before = self._read("VmHWM")
        return self

    def __exit__(self, *exc: object) -> None:
        self.growth = self._read("VmHWM") - self.before

    @staticmethod
    def _read(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field} in /proc/self/status")


# -- ORS --------------------------------------------------------------------------------------------------
def ors_env(hostile: Hostile, **kwargs) -> gym.Env:
    return gym.make("openenv/ORS-v0", url=hostile.ors, step_timeout=60, **kwargs)


@pytest.mark.parametrize("how", ["end_then_ping", "end_then_silence"])
def test_a_result_is_returned_when_it_arrives_however_long_the_stream_stays_open(hostile, how):
    env = ors_env(hostile)
    try:
        env.reset(options={"index": 0})
        start = time.monotonic()
        obs, reward, terminated, truncated, info = env.step(act(how))
        assert time.monotonic() - start < 5, "the step waited for the stream to end after its result"
        assert (obs[0]["content"], reward) == (f"fine {how}", 1.0)
        obs, reward, *_ = env.step(act("ok"))  # the next call gets a connection of its own
        assert (obs[0]["content"], reward) == ("fine ok", 1.0)
    finally:
        env.close()


def test_an_endless_stream_stops_at_max_response_bytes_with_memory_bounded(hostile):
    env = ors_env(hostile)
    try:
        env.reset(options={"index": 0})
        sent_before = hostile.sent()
        with PeakRSS() as peak:
            start = time.monotonic()
            with pytest.raises(ServerError, match=f"max_response_bytes={DEFAULT_MAX_RESPONSE_BYTES}"):
                env.step(act("endless_chunks"))
            elapsed = time.monotonic() - start
        sent = hostile.sent() - sent_before
        assert elapsed < 30
        # What the server got to write before the client hung up: the limit, plus socket buffers.
        assert DEFAULT_MAX_RESPONSE_BYTES < sent < DEFAULT_MAX_RESPONSE_BYTES + 32 * MIB, sent
        assert peak.growth < 2 * DEFAULT_MAX_RESPONSE_BYTES, f"peak RSS grew {peak.growth / MIB:.0f} MiB"
        time.sleep(0.5)
        assert hostile.sent() - sent_before - sent < 2 * MIB, "the stream went on after the client gave up"
        env.reset(options={"index": 0})
        assert env.step(act("ok"))[1] == 1.0
    finally:
        env.close()


def test_a_huge_result_and_a_huge_prompt_are_refused_by_name_and_a_smaller_limit_holds(hostile):
    env = ors_env(hostile, max_response_bytes=4 * MIB)
    try:
        env.reset(options={"index": 0})
        with PeakRSS() as peak:
            with pytest.raises(ServerError, match=r"tool 'act': .*larger than max_response_bytes=4194304"):
                env.step(act("huge_result"))
            with pytest.raises(ServerError, match=r"GET /hostile/prompt: .*larger than max_response_bytes=4194304"):
                env.reset(options={"index": 1})
        assert peak.growth < 48 * MIB, f"peak RSS grew {peak.growth / MIB:.0f} MiB"
        env.reset(options={"index": 0})
        assert env.step(act("ok"))[1] == 1.0
    finally:
        env.close()


@pytest.mark.parametrize("how", ["deep_result", "deep_500"])
def test_deep_json_in_a_tool_result_is_a_server_error_naming_max_json_depth(hostile, how):
    env = ors_env(hostile)
    try:
        env.reset(options={"index": 0})
        with pytest.raises(ServerError, match=f"max_json_depth={DEFAULT_MAX_JSON_DEPTH}"):
            env.step(act(how))
        with pytest.raises(ServerError, match=f"GET /hostile/prompt: .*max_json_depth={DEFAULT_MAX_JSON_DEPTH}"):
            env.reset(options={"index": 2})
    finally:
        env.close()
    deeper = ors_env(hostile, max_json_depth=1000)  # the limit is the user's to raise
    try:
        deeper.reset(options={"index": 0})
        if how == "deep_500":
            obs, reward, *_, info = deeper.step(act(how))
            assert reward == 1.0 and obs[0]["content"] == "deep"
        else:
            with pytest.raises(ServerError, match="max_json_depth=1000"):
                deeper.step(act(how))
    finally:
        deeper.close()


@pytest.mark.parametrize("how, says", [("html", "text/html instead of an event stream"),
                                       ("bad_utf8", "unreadable answer")])
def test_a_tool_call_answered_with_something_else_says_what_it_got(hostile, how, says):
    env = ors_env(hostile)
    try:
        env.reset(options={"index": 0})
        with pytest.raises(ServerError, match=says):
            env.step(act(how))
        env.reset(options={"index": 0})
        assert env.step(act("ok"))[1] == 1.0
    finally:
        env.close()


def test_a_vector_env_isolates_each_misbehaving_sub_env(hostile):
    hows = ["ok", "endless_chunks", "deep_result", "end_then_ping", "html", "ok"]
    envs = gym.make_vec("openenv/ORS-v0", num_envs=len(hows), url=hostile.ors, step_timeout=60,
                        vector_options={"envs_per_client": 2})
    try:
        envs.reset(seed=0, options={"index": 0})
        start = time.monotonic()
        obs, rewards, terminated, truncated, infos = envs.step([act(h) for h in hows])
        assert time.monotonic() - start < 30
        assert truncated.tolist() == [False, True, True, False, True, False]
        assert rewards.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
        messages = [infos["error"]["message"][i] if infos["_error"][i] else "" for i in range(len(hows))]
        assert "max_response_bytes=" in messages[1] and "max_json_depth=" in messages[2]
        assert "text/html" in messages[4]
        # the failed sub-envs are recreated: every sub-env plays on
        envs.reset(seed=1, options={"index": 0})
        assert envs.step([act("ok")] * len(hows))[1].tolist() == [1.0] * len(hows)
    finally:
        envs.close()


# -- OpenEnv ------------------------------------------------------------------------------------------------
def openenv_env(hostile: Hostile, **kwargs) -> gym.Env:
    return gym.make("openenv/OpenEnv-v0", url=hostile.openenv, step_timeout=60, **kwargs)


def test_a_reply_of_an_unknown_type_is_a_server_error(hostile):
    env = openenv_env(hostile)
    try:
        env.reset(seed=0)
        with pytest.raises(ServerError, match="reply of type 'telemetry', not an observation"):
            env.step(step_action("unknown_type"))
        env.reset(seed=0)
        obs, reward, *_ = env.step(step_action("ok"))
        assert "fine ok 1" in obs[0]["content"] and reward == 1.0
    finally:
        env.close()


def test_a_server_that_answers_twice_never_shifts_replies_onto_later_steps(hostile):
    env = openenv_env(hostile)
    try:
        env.reset(seed=0)
        obs, *_ = env.step(step_action("twice"))
        assert "reply A to step 1" in obs[0]["content"]
        time.sleep(1.0)  # reply B has been read by now (a loaded machine takes its time)
        with pytest.raises(ServerError, match="no request asked for .*reply B to step 1"):
            env.step(step_action("ok"))
        env.reset(seed=0)  # a new socket: the stray reply is gone with the old one
        obs, *_ = env.step(step_action("ok"))
        assert "fine ok 1" in obs[0]["content"]
    finally:
        env.close()


def test_a_message_over_the_limit_names_max_response_bytes(hostile):
    env = openenv_env(hostile)
    small = openenv_env(hostile, max_response_bytes=MIB)
    try:
        env.reset(seed=0)
        with pytest.raises(ServerError, match=f"step \\(step\\): .*larger than max_response_bytes="
                                              f"{DEFAULT_MAX_RESPONSE_BYTES}"):
            env.step(step_action("huge"))
        with pytest.raises(ServerError, match="reset: .*larger than max_response_bytes=1048576"):
            small.reset(options={"index": 2})
        env.reset(seed=0)
        assert env.step(step_action("ok"))[1] == 1.0
    finally:
        env.close()
        small.close()


def test_huge_http_answers_are_refused_with_memory_bounded(hostile):
    with PeakRSS() as peak:
        with pytest.raises(ServerError, match=f"GET /schema: .*larger than max_response_bytes="
                                              f"{DEFAULT_MAX_RESPONSE_BYTES}"):
            gym.make("openenv/OpenEnv-v0", url=f"{hostile.http}/openenv-huge")
    assert peak.growth < 2 * DEFAULT_MAX_RESPONSE_BYTES, f"peak RSS grew {peak.growth / MIB:.0f} MiB"


@pytest.mark.parametrize("how, says", [("deep", f"max_json_depth={DEFAULT_MAX_JSON_DEPTH}"),
                                       ("deep_500", f"max_json_depth={DEFAULT_MAX_JSON_DEPTH}"),
                                       ("bad_utf8", "unreadable answer")])
def test_deep_or_undecodable_observations_are_server_errors(hostile, how, says):
    env = openenv_env(hostile)
    try:
        env.reset(seed=0)
        with pytest.raises(ServerError, match=says):
            env.step(step_action(how))
        with pytest.raises(ServerError, match=f"reset: .*max_json_depth={DEFAULT_MAX_JSON_DEPTH}"):
            env.reset(options={"index": 1})
        env.reset(seed=0)
        assert env.step(step_action("ok"))[1] == 1.0
    finally:
        env.close()


def test_an_openenv_vector_env_isolates_each_misbehaving_sub_env(hostile):
    hows = ["ok", "unknown_type", "huge", "deep", "ok"]
    envs = gym.make_vec("openenv/OpenEnv-v0", num_envs=len(hows), url=hostile.openenv, step_timeout=60,
                        vector_options={"envs_per_client": 2})
    try:
        # sub-env i opens with the server's reset(seed=10 + i): all fine (seeds 1 and 2 open badly)
        envs.reset(seed=10)
        obs, rewards, terminated, truncated, infos = envs.step([step_action(h) for h in hows])
        assert truncated.tolist() == [False, True, True, True, False]
        assert rewards.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
        messages = infos["error"]["message"]
        assert "telemetry" in messages[1] and "max_response_bytes=" in messages[2]
        assert "max_json_depth=" in messages[3]
        envs.reset(seed=10)
        assert envs.step([step_action("ok")] * len(hows))[1].tolist() == [1.0] * len(hows)
        obs, infos = envs.reset(seed=0)  # the seed reaches the server: 1 and 2 open deep and huge
        assert infos["error"]["_type"].tolist() == [False, True, True, False, False]
    finally:
        envs.close()
