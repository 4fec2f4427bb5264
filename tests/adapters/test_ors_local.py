"""Local ORS servers never outlive the process that launched them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from conftest import ENVS, pid_alive  # noqa: E402

from openenv_gym.testing import procs  # noqa: E402

LAUNCH = textwrap.dedent(f"""
    import sys, time, gymnasium as gym, openenv_gym
    env = gym.make("openenv/ORS-v0", source={str(ENVS / 'ors_probe.py')!r}, env_class="Probe")
    env.reset(seed=0)
    print(env.unwrapped.adapter.server_pid(), flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
""")


def wait_dead(pid: int, seconds: float = 20.0) -> bool:
    return not procs.wait_dead([pid], seconds)


def start(mode: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, mode], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip().isdigit(), f"launcher printed {line!r}"
    return proc, int(line)


@pytest.mark.timeout(90)
def test_server_stops_at_interpreter_exit_without_close():
    proc, pid = start("exit")
    assert proc.wait(60) == 0
    assert wait_dead(pid), "the server outlived its parent's normal exit"


@pytest.mark.timeout(90)
def test_server_stops_when_its_parent_is_killed():
    proc, pid = start("wait")
    assert pid_alive(pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert wait_dead(pid), "the server outlived a SIGKILLed parent"


def test_idle_sessions_are_pinged_while_the_policy_thinks(server):
    import gymnasium as gym
    from fault_proxy import FaultProxy

    import openenv_gym  # noqa: F401

    proxy = FaultProxy(int(server.url.rsplit(":", 1)[1]))
    env = gym.make("openenv/ORS-v0", url=proxy.url, env_name="probe", ping_interval=0.2)
    try:
        env.reset(seed=0)
        time.sleep(1.0)  # a slow policy
        assert proxy.requests.count("POST /ping") >= 2
    finally:
        env.close()
        proxy.close()
