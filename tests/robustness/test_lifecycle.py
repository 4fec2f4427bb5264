"""Lifecycle under a careless user and a hostile world: nothing hangs, nothing is left running.

Scripts run in a child Python whose environment carries a unique marker: every process it starts
(local servers, Ray's head and actors) inherits it, so after the script ends a scan of
``/proc/*/environ`` finds anything left behind. Temp dirs go to a private ``TMPDIR``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import gymnasium as gym
import pytest

import openenv_gym  # noqa: F401  (registers the ids)
from openenv_gym.errors import (
    BackendTimeout,
    ConcurrentUse,
    ConfigurationError,
    EpisodeInterrupted,
)
from openenv_gym.testing import procs

ENVS = Path(__file__).resolve().parents[1] / "envs"
PROBE = dict(source=str(ENVS / "ors_probe.py"), env_class="Probe")


def call(name: str, args: dict) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": name, "arguments": json.dumps(args)}}]}


def marked_pids(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker`` (zombies count as dead)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker.encode() not in fh.read():
                    continue
            with open(f"/proc/{entry}/stat") as fh:
                if fh.read().split(")")[-1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


class Script:
    """A child Python running ``code`` with a marker and a private TMPDIR."""

    def __init__(self, code: str):
        self.marker = f"OPENENV_GYM_LIFECYCLE_{uuid.uuid4().hex}"
        self.tmp = Path(tempfile.mkdtemp(prefix="oglc-"))  # short: Unix socket paths are limited
        env = dict(os.environ, TMPDIR=str(self.tmp), PYTHONUNBUFFERED="1", **{self.marker: "1"})
        env.pop("RAY_ADDRESS", None)
        self.process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )

    def wait_for_line(self, text: str, timeout: float = 120.0) -> None:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if text in line:
                return
            if not line and self.process.poll() is not None:
                raise AssertionError(f"script ended before {text!r}: {self.process.stderr.read()}")
        raise AssertionError(f"no {text!r} within {timeout} s")

    def finish(self, timeout: float) -> tuple[int, str, float]:
        """Wait for the script; returns (exit code, stderr, seconds it took to exit)."""
        start = time.monotonic()
        try:
            _, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.communicate()
            raise AssertionError(f"the script did not exit within {timeout} s") from None
        return self.process.returncode, err, time.monotonic() - start

    def leftovers(self, grace: float = 10.0) -> tuple[list[int], list[str]]:
        """Processes and openenv-gym temp entries still there after ``grace`` seconds."""
        deadline = time.monotonic() + grace
        while True:
            pids = marked_pids(self.marker)
            files = sorted(p.name for p in self.tmp.iterdir() if p.name.startswith("openenv-gym"))
            if (not pids and not files) or time.monotonic() > deadline:
                return pids, files
            time.sleep(0.2)

    def cleanup(self) -> None:
        for pid in marked_pids(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def script():
    made: list[Script] = []

    def run(code: str) -> Script:
        made.append(Script(code))
        return made[-1]

    yield run
    for s in made:
        s.cleanup()


MAKE = {
    "single": f"env = gym.make('openenv/ORS-v0', source={PROBE['source']!r}, env_class='Probe'); env.reset(seed=0)",
    "concurrent": f"env = gym.make_vec('openenv/ORS-v0', num_envs=4, source={PROBE['source']!r}, env_class='Probe'); env.reset(seed=0)",
    "ray": ("env = gym.make_vec('openenv/ORS-v0', num_envs=4, backend='ray', vector_options={'num_actors': 1}, "
            f"source={PROBE['source']!r}, env_class='Probe'); env.reset(seed=0)"),
    "hosted": ("env = gym.make('openenv/ORS-v0', python=__import__('sys').executable, "
               f"source={PROBE['source']!r}, env_class='Probe'); env.reset(seed=0)"),
    "hosted_vec": ("env = gym.make_vec('openenv/ORS-v0', num_envs=4, python=__import__('sys').executable, "
                   f"source={PROBE['source']!r}, env_class='Probe'); env.reset(seed=0)"),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["single", "concurrent", pytest.param("ray", marks=pytest.mark.slow), "hosted",
                                  "hosted_vec"])
@pytest.mark.parametrize("ending", ["forget_close", "exception", "keyboard_interrupt"])
def test_a_script_that_never_closes_exits_within_15_s_and_leaves_nothing(script, kind, ending):
    end = {"forget_close": "pass", "exception": "raise RuntimeError('boom')",
           "keyboard_interrupt": "raise KeyboardInterrupt"}[ending]
    s = script(f"""
        import gymnasium as gym, openenv_gym
        {MAKE[kind]}
        print('made', flush=True)
        {end}
    """)
    s.wait_for_line("made", timeout=180)
    code, err, took = s.finish(timeout=30)
    # An uncaught KeyboardInterrupt ends Python by SIGINT, as a shell expects (or with 1, where
    # a library's own handler took the signal over).
    assert code in {"forget_close": (0,), "exception": (1,), "keyboard_interrupt": (-signal.SIGINT, 1)}[ending], err
    assert took < 15, f"exit took {took:.1f} s"
    pids, files = s.leftovers()
    assert pids == [] and files == [], (pids, files)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("where", ["", ", python=__import__('sys').executable"])
def test_a_signal_mid_rollout_ends_the_script_and_everything_it_started(script, sig, where):
    s = script(f"""
        import json, gymnasium as gym, openenv_gym
        envs = gym.make_vec('openenv/ORS-v0', num_envs=4, source={PROBE['source']!r}, env_class='Probe'{where})
        envs.reset(seed=0)
        call = {{'id': 'c', 'function': {{'name': 'slow', 'arguments': json.dumps({{'seconds': 30}})}}}}
        slow = {{'role': 'assistant', 'tool_calls': [call]}}
        print('stepping', flush=True)
        envs.step([slow] * 4)
    """)
    s.wait_for_line("stepping", timeout=120)
    time.sleep(0.5)
    s.process.send_signal(sig)
    code, err, took = s.finish(timeout=30)
    assert code != 0 and took < 15, (code, took, err)
    pids, files = s.leftovers()
    assert pids == [] and files == [], (pids, files)


# -- in-process lifecycle -----------------------------------------------------------------------
@pytest.fixture
def probe_env():
    env = gym.make("openenv/ORS-v0", **PROBE)
    yield env
    env.close()


def interrupt_after(seconds: float) -> threading.Timer:
    """A real SIGINT (as Ctrl-C sends) after ``seconds``, delivered to another thread than the
    main one: Python must still raise KeyboardInterrupt in the main thread (the tests allow 10 s)."""
    timer = threading.Timer(seconds, lambda: signal.pthread_kill(threading.get_ident(), signal.SIGINT))
    timer.start()
    return timer


def test_an_interrupted_step_is_cancelled_and_the_episode_needs_a_reset(probe_env):
    probe_env.reset(seed=0)
    interrupt_after(0.5)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        probe_env.step(call("slow", {"seconds": 30}))
    assert time.monotonic() - start < 10
    with pytest.raises(EpisodeInterrupted, match="reset"):
        probe_env.step(call("hint", {}))
    probe_env.reset(seed=0)
    obs, reward, terminated, truncated, info = probe_env.step(call("hint", {}))
    assert obs[0]["content"] == "Think step by step." and info["turn"] == 1


def test_an_interrupted_recv_loses_no_result():
    envs = gym.make_vec("openenv/ORS-v0", num_envs=2, **PROBE)
    try:
        envs.reset(seed=0)
        envs.send([call("slow", {"seconds": 1.5}), call("slow", {"seconds": 1.5})])
        interrupt_after(0.3)
        with pytest.raises(KeyboardInterrupt):
            envs.recv()
        batch = envs.recv(timeout=30)  # the results the interrupted recv was waiting for
        assert sorted(batch.env_ids.tolist()) == [0, 1]
        assert [o[0]["content"] for o in batch.obs] == ["slept", "slept"]
    finally:
        envs.close()


def test_an_interrupted_make_leaves_no_server(script):
    # The interrupt lands while the local server is starting (it takes about a second).
    s = script(f"""
        import signal, threading, gymnasium as gym, openenv_gym
        threading.Timer(0.3, lambda: signal.pthread_kill(threading.get_ident(), signal.SIGINT)).start()
        try:
            gym.make('openenv/ORS-v0', source={PROBE['source']!r}, env_class='Probe')
        except KeyboardInterrupt:
            print('interrupted', flush=True)
        import time; time.sleep(1.0)  # time for a server that was left starting to show up
    """)
    code, err, _ = s.finish(timeout=60)
    assert code == 0, err
    pids, files = s.leftovers()
    assert pids == [] and files == [], (pids, files)


def test_step_timeout_is_one_name_with_a_finite_default_and_messages_name_the_limit():
    env = gym.make("openenv/ORS-v0", step_timeout=0.5, **PROBE)
    try:
        assert env.unwrapped.step_timeout == 0.5
        env.reset(seed=0)
        with pytest.raises(BackendTimeout, match=r"step did not finish within step_timeout=0\.5 s"):
            env.step(call("slow", {"seconds": 5}))
        with pytest.raises(EpisodeInterrupted):
            env.step(call("hint", {}))
    finally:
        env.close()
    envs = gym.make_vec("openenv/ORS-v0", num_envs=2, step_timeout=0.5, **PROBE)
    try:
        assert envs.step_timeout == 0.5
        _, infos = envs.reset(seed=0)
        assert "error" not in infos, infos["error"]  # a reset past the limit would fail the test here
        *_, infos = envs.step([call("slow", {"seconds": 5}), call("hint", {})])
        assert "step_timeout=0.5 s" in infos["error"]["message"][0]
    finally:
        envs.close()
    default = gym.make("openenv/ORS-v0", **PROBE)
    try:
        assert default.unwrapped.step_timeout is not None and default.unwrapped.step_timeout > 0
    finally:
        default.close()


def test_double_close_and_use_after_close(probe_env):
    probe_env.reset(seed=0)
    probe_env.close()
    probe_env.close()
    with pytest.raises(ConfigurationError, match="closed"):
        probe_env.reset()
    with pytest.raises(ConfigurationError, match="closed"):
        probe_env.step(call("hint", {}))
    envs = gym.make_vec("openenv/ORS-v0", num_envs=2, **PROBE)
    envs.close()
    envs.close()
    with pytest.raises(ConfigurationError, match="closed"):
        envs.reset()
    with pytest.raises(ConfigurationError, match="closed"):
        envs.send([call("hint", {})] * 2)


def test_two_threads_on_one_env_get_a_clear_error_not_a_corrupted_episode(probe_env):
    probe_env.reset(seed=0)
    errors: list[BaseException] = []

    def slow_step() -> None:
        try:
            probe_env.step(call("slow", {"seconds": 1.0}))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    worker = threading.Thread(target=slow_step)
    worker.start()
    time.sleep(0.3)
    with pytest.raises(ConcurrentUse):
        probe_env.step(call("hint", {}))
    worker.join(30)
    assert errors == []
    obs, *_ = probe_env.step(call("hint", {}))  # the episode is intact
    assert obs[0]["content"] == "Think step by step."


def test_reset_racing_close_from_another_thread_leaves_no_server():
    # A reset whose request was in flight when close() shut the client hung until step_timeout
    # (once in a few dozen races on a loaded machine): aclose() now ends the calls in flight.
    for _ in range(8):
        env = gym.make("openenv/ORS-v0", **PROBE)
        pid = env.unwrapped.adapter.server_pid()
        outcome: list[BaseException | None] = []

        def resets(env=env, outcome=outcome) -> None:  # this iteration's: the thread is joined within it
            try:
                for _ in range(50):
                    env.reset()
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001
                outcome.append(exc)

        worker = threading.Thread(target=resets)
        worker.start()
        time.sleep(0.05)
        env.close()
        worker.join(30)
        assert not worker.is_alive()
        assert outcome and (outcome[0] is None or isinstance(outcome[0], (ConfigurationError, ConnectionError))), outcome
        deadline = time.monotonic() + 10
        while procs.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not procs.alive(pid)
        assert env.unwrapped.adapter.server_pid() is None
