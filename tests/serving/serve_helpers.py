"""Served envs for the serving tests: ``openenv-gym serve`` run as a user runs it, stopped by PID.

:func:`start_serve` launches the command in a subprocess, reads the URL it prints once it
answers, and gives the test the URL and the token; :meth:`Served.stop` sends SIGTERM to its PID,
checks it exits cleanly (status 0, "stopped"), and that nothing it started (local servers, host
processes, Ray's processes) outlives it. The reference side of every comparison is
``gym.make`` of the same id in the test process.
"""

from __future__ import annotations

import json
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openenv_gym.testing import procs

ENVS = Path(__file__).resolve().parents[1] / "envs"
ARITHMETIC = "openenv/Arithmetic-v0"
PROBE = ["openenv/ORS-v0", f"source={ENVS / 'ors_probe.py'}", "env_class=Probe"]
GUESS = ["openenv/Verifiers-v0", f"source={ENVS / 'verifiers_v0' / 'vf_guess.py'}"]
CALC = ["openenv/Verifiers-v0", f"source={ENVS / 'verifiers_v0' / 'vf_calc_tool.py'}"]
ECHO = ["openenv/OpenEnv-v0", f"source={ENVS / 'openenv_echo_env'}"]
START_TIMEOUT = 180.0

os.environ["OPENREWARD_DISABLE_UPDATE_CHECK"] = "1"  # the openreward client asks PyPI otherwise


class Served:
    """A running ``openenv-gym serve`` process."""

    def __init__(self, process: subprocess.Popen, url: str, token: str | None, lines: queue.Queue, shown: list[str]):
        self.process, self.url, self.token, self._lines, self.shown = process, url, token, lines, shown

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def output(self) -> str:
        """Everything the command printed so far (stdout and stderr)."""
        while True:
            try:
                self.shown.append(self._lines.get_nowait())
            except queue.Empty:
                return "".join(self.shown)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the server by PID; returns its exit status once nothing it started is left."""
        if self.process.poll() is not None:
            return self.process.returncode
        started = procs.descendants(self.pid)
        self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            for pid in [self.pid, *procs.descendants(self.pid)]:
                os.kill(pid, signal.SIGKILL)
            self.process.wait(10)
            raise AssertionError(f"the server did not stop within {timeout} s of signal {sig}") from exc
        left = procs.wait_dead(started, timeout=30)
        assert not left, f"processes outlived the server: {[procs.cmdline(p)[:120] for p in left]}"
        return code


def _reader(stream: Any, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    stream.close()


def start_serve(*args: str, token: str | None = "env", env: dict[str, str] | None = None,
                timeout: float = START_TIMEOUT) -> Served:
    """``openenv-gym serve ARGS``; ``token``: ``"env"`` passes a random one in OPENENV_GYM_TOKEN,
    ``None`` lets the server make one (read from what it prints)."""
    environ = dict(os.environ, **(env or {}))
    environ.pop("OPENENV_GYM_TOKEN", None)
    given = None
    if token == "env":
        given = environ["OPENENV_GYM_TOKEN"] = secrets.token_urlsafe(32)
    elif token is not None:
        given = token
    process = subprocess.Popen([sys.executable, "-m", "openenv_gym.cli", "serve", *args], env=environ,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(process.stdout, lines), daemon=True).start()
    shown: list[str] = []
    deadline = time.monotonic() + timeout
    url = printed = None
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if process.poll() is not None:
                break
            continue
        shown.append(line)
        if m := re.search(r" at (\S+) \(", line):
            url = m.group(1)
        if m := re.match(r"token: (\S+)", line):
            printed = m.group(1)
        if line.startswith("press Ctrl-C"):
            return Served(process, url or "", given or printed, lines, shown)
    process.kill()
    process.wait(10)
    raise AssertionError(f"openenv-gym serve did not start: {''.join(shown)[-3000:]}")


@pytest.fixture
def serve_process() -> Iterator[Any]:
    """Start servers with :func:`start_serve`; any left running at the test's end is stopped.
    (A test module imports this fixture by name: a ``conftest.py`` here would shadow the suite's
    own, which other folders import as ``conftest``.)"""
    started: list[Served] = []

    def start(*args: str, **kwargs: Any) -> Served:
        served = start_serve(*args, **kwargs)
        started.append(served)
        return served

    yield start
    for served in started:
        if served.process.poll() is None:
            served.stop()


def call(name: str, args: dict[str, Any] | None = None, call_id: str = "c") -> dict[str, Any]:
    """An assistant message with one tool call (what a Gymnasium agent sends)."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args or {})}}]}


def expression(prompt: str) -> str:
    """The expression of an Arithmetic task's prompt."""
    return prompt.split("Compute ", 1)[1].split(". ", 1)[0]
