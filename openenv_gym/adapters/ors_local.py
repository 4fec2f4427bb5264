"""Local ORS sources served by SDK servers in subprocesses, shared within a process.

A local source (a file or folder defining an ``ors`` / ``openreward`` Environment class) is served
by the SDK's own ``Server`` in a child process bound to 127.0.0.1 on a port it picks itself
(:mod:`openenv_gym.adapters.ors_serve`). A subprocess rather than in-process serving because the
SDK servers block their loop on sync tools, openreward's import takes seconds, and its pinned
sse-starlette works on one event loop only (reference/ors.md §6.3).

Every env of the process that uses the same source, class and interpreter shares one server
(reference counted); the server stops when its last user releases it and at interpreter exit, and
the child also ends itself if this process dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from openenv_gym.errors import BackendTimeout, BackendUnavailable

__all__ = ["LocalServer", "acquire", "release", "stop_all"]

_SERVE_SCRIPT = Path(__file__).with_name("ors_serve.py")


class LocalServer:
    """One running SDK server process: its URL, PID and log file."""

    def __init__(self, key: tuple[str, str, str, str], process: subprocess.Popen, url: str, workdir: Path):
        self.key = key
        self.process = process
        self.url = url
        self.workdir = workdir
        self.users = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's output, for error messages."""
        try:
            text = (self.workdir / "server.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 5.0) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after ``grace`` seconds) and reap it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(grace)
        for name in ("server.log", "port"):
            try:
                (self.workdir / name).unlink()
            except OSError:
                pass
        try:
            self.workdir.rmdir()
        except OSError:
            pass


_servers: dict[tuple[str, str, str, str], LocalServer] = {}
_lock: asyncio.Lock | None = None


def _spawn(root: Path, module_file: str, env_class: str, python: str) -> tuple[subprocess.Popen, Path]:
    workdir = Path(tempfile.mkdtemp(prefix="openenv-gym-ors-"))
    env = dict(os.environ, OPENREWARD_DISABLE_UPDATE_CHECK="1", PYTHONUNBUFFERED="1")
    log = open(workdir / "server.log", "wb")
    try:
        process = subprocess.Popen(
            [
                python, str(_SERVE_SCRIPT), "--root", str(root), "--module-file", module_file,
                "--class", env_class, "--port-file", str(workdir / "port"),
                "--parent-pid", str(os.getpid()),
            ],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(root),
        )
    finally:
        log.close()
    return process, workdir


async def _wait_ready(server: LocalServer, port_file: Path, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with httpx.AsyncClient(timeout=2.0) as client:
        while loop.time() < deadline:
            if not server.alive():
                raise BackendUnavailable(
                    f"the ORS server for {server.key[0]} exited with code {server.process.returncode} "
                    f"before it was ready; its output ends with:\n{server.log_tail()}"
                )
            if port_file.exists():
                server.url = f"http://127.0.0.1:{port_file.read_text().strip()}"
                try:
                    if (await client.get(f"{server.url}/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            await asyncio.sleep(0.05)
    server.stop()
    raise BackendTimeout(
        f"the ORS server for {server.key[0]} was not healthy within {timeout} s; "
        f"its output ends with:\n{server.log_tail()}"
    )


async def acquire(
    root: str | os.PathLike,
    module_file: str,
    env_class: str,
    *,
    python: str | None = None,
    startup_timeout: float = 120.0,
) -> LocalServer:
    """Return the running server for this source and class, launching it if needed.

    Args:
        root: the folder ``module_file`` is relative to.
        module_file: the file that defines ``env_class``.
        env_class: the Environment class to serve.
        python: the interpreter to serve with (default: this one). Point it at a venv built from
            the source's requirements to keep its dependencies apart from the trainer's.
        startup_timeout: seconds to wait for ``GET /health``.
    """
    global _lock
    if _lock is None:
        _lock = asyncio.Lock()
    root_path = Path(root).resolve()
    key = (str(root_path / module_file), env_class, python or sys.executable, str(root_path))
    async with _lock:
        server = _servers.get(key)
        if server is not None and not server.alive():
            _servers.pop(key, None)
            server.stop()
            server = None
        if server is None:
            process, workdir = _spawn(root_path, module_file, env_class, python or sys.executable)
            server = LocalServer(key, process, "", workdir)
            try:
                await _wait_ready(server, workdir / "port", startup_timeout)
            except BaseException:
                server.stop()
                raise
            _servers[key] = server
        server.users += 1
        return server


def release(server: LocalServer) -> None:
    """Drop one user of ``server``; the last user stops it."""
    server.users -= 1
    if server.users <= 0:
        if _servers.get(server.key) is server:
            del _servers[server.key]
        server.stop()


def stop_all() -> None:
    """Stop every server this process launched (also run at interpreter exit)."""
    for server in list(_servers.values()):
        server.stop(grace=2.0)
    _servers.clear()


atexit.register(stop_all)
