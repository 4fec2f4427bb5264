"""Shared fixtures: real ORS servers from both SDKs on 127.0.0.1, started and stopped by PID.

The probe environments live in ``tests/envs``: ``ors_probe.py`` (ors-sdk) and
``openreward_probe.py`` (openreward). Each server runs the SDK's own ``Server`` via the file's
``__main__`` on a port chosen here; the fixture polls ``/health`` and kills the process at the end.
Every test also gets a private catalog file, so no test reads or writes the user's catalog.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from openenv_gym.testing import procs

ENVS = Path(__file__).parent / "envs"
# A shell that is not interactive starts a background job (`pytest &`, `nohup ... &`) with SIGINT
# ignored, and Python then never installs its Ctrl-C handler: every test of what Ctrl-C does
# would fail, in this process and in the children it starts (an ignored signal survives exec).
# Give the suite the terminal's default, as a user's script has it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
os.environ["OPENREWARD_DISABLE_UPDATE_CHECK"] = "1"
# Test modules import ray before openenv_gym's Ray backend does: have it read the single-machine
# setting anyway, so the local clusters the tests start bind 127.0.0.1 (openenv_gym.vector.ray).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# The TRL example's tests need torch and TRL, which live in their own venv (.ci/trl.sh builds it
# and runs them there); the main venv does not collect them rather than report them skipped.
collect_ignore = [] if importlib.util.find_spec("trl") else ["examples/test_trl_grpo.py", "examples/test_trl_env_factory.py"]
# So do the browser tests: playwright (the `browser` extra) is installed by their own CI step.
if not importlib.util.find_spec("playwright"):
    collect_ignore.append("web/test_browser.py")

# `import openenv_gym` registers the catalog: never let the suite read the user's own.
_SESSION_DIR = tempfile.mkdtemp(prefix="openenv-gym-test-")
os.environ["OPENENV_GYM_CATALOG"] = os.path.join(_SESSION_DIR, "catalog.json")
os.environ["OPENENV_GYM_CACHE"] = os.path.join(_SESSION_DIR, "cache")  # nor read or write the user's discovery cache
atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)  # tests leave no temp dir behind
# uv (the Verifiers v1 harness programs' environments, isolated venvs) resolves into an empty cache
# of the session's own, so a machine that ran the suite before sees what a new one sees: uv keeps
# a harness environment it built once, whatever the registry serves later. The first process
# makes it and its xdist workers inherit it (one download per session); the first removes it.
if "OPENENV_GYM_TEST_UV_CACHE" not in os.environ:
    os.environ["OPENENV_GYM_TEST_UV_CACHE"] = tempfile.mkdtemp(prefix="openenv-gym-uv-cache-")
    atexit.register(shutil.rmtree, os.environ["OPENENV_GYM_TEST_UV_CACHE"], ignore_errors=True)
os.environ["UV_CACHE_DIR"] = os.environ["OPENENV_GYM_TEST_UV_CACHE"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    def __init__(self, flavour: str, process: subprocess.Popen, url: str, source: Path):
        self.flavour, self.process, self.url, self.source = flavour, process, url, source

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        procs.terminate(self.process)


def start_server(flavour: str, timeout: float = 60.0) -> RunningServer:
    source = ENVS / ("ors_probe.py" if flavour == "ors" else "openreward_probe.py")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(source), str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{flavour} probe server exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return RunningServer(flavour, process, url, source)
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{flavour} probe server not healthy within {timeout} s")


@pytest.fixture(scope="session", params=["ors", "openreward"])
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """A probe server of each flavour (tests using it run once per flavour)."""
    running = start_server(request.param)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def ors_server() -> Iterator[RunningServer]:
    running = start_server("ors")
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def private_catalog(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path_factory.mktemp("catalog") / "catalog.json"
    monkeypatch.setenv("OPENENV_GYM_CATALOG", str(path))
    return path


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (a zombie is dead for our purposes)."""
    return procs.alive(pid)


# -- tests run with any extras ------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(*modules): runs only where each module is importable (an extra of the package brings "
                   "it); skipped, naming what is missing, elsewhere")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        missing = [m for m in mark.args if importlib.util.find_spec(m) is None]
        if missing:
            pytest.skip(f"needs {', '.join(missing)}, not installed (an extra of the package: pip install -e '.[all]')")
