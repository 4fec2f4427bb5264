"""Local sources served in subprocesses, private to their user, shared within a process.

A local ORS source (a file or folder defining an ``ors`` / ``openreward`` Environment class) is
served by the SDK's own ``Server`` in a child process (:mod:`openenv_gym.adapters.ors_serve`). A
subprocess rather than in-process serving because the SDK servers block their loop on sync tools,
openreward's import takes seconds, and its pinned sse-starlette works on one event loop only
(docs/backends.md). OpenEnv environments are served the same way: :func:`acquire` with ``app=``
runs the environment's ASGI app (``server.app:app``) under uvicorn, with the environment
variables the adapter gives (``MAX_CONCURRENT_ENVS``; see :mod:`openenv_gym.adapters.openenv`).

Nobody else on the machine may use these servers: ``/task`` holds the answers, and a session is
an episode in progress. Each server therefore lives in its own private directory (``mkdtemp``,
mode 0700) and by default listens on a Unix socket inside it, so only this user can connect and
no TCP port is open at all. Where a socket cannot reach (a client that only speaks TCP),
``listen="tcp"`` binds 127.0.0.1 and the server refuses every request without its random token
(``Authorization: Bearer``; see :meth:`LocalServer.auth_headers`), which travels to the child in
an environment variable, never on its command line.

Every env of the process that uses the same source, class, interpreter and listen mode shares one
server (reference counted); the server stops when its last user releases it and at interpreter
exit, and the child ends itself, removing its directory, if this process dies
(``PR_SET_PDEATHSIG``). Directories that outlived a SIGKILL are removed the next time any process
of this user starts a server: each holds the pids (with start times) of its owner and its server.
The server's log is rotated at :data:`LOG_MAX_BYTES`, so a week-long run cannot fill the disk.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from openenv_gym.adapters.ors_serve import TOKEN_ENV, process_start_time
from openenv_gym.adapters.ors_transport import make_client
from openenv_gym.errors import BackendTimeout, BackendUnavailable, ConfigurationError

__all__ = ["LocalServer", "acquire", "release", "stop_all", "sweep_stale", "LOG_MAX_BYTES", "LISTEN_MODES"]

_SERVE_SCRIPT = Path(__file__).with_name("ors_serve.py")
_PREFIX = "openenv-gym-ors-"
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, 104 on macOS

LOG_MAX_BYTES = 1 << 20
"""Size at which a server's ``server.log`` is rotated to ``server.log.1`` (so at most ~2x on disk)."""

LISTEN_MODES = ("unix", "tcp")

Key = tuple[str, ...]


class LocalServer:
    """One running SDK server process: its address, PID, private directory and log.

    ``url`` is ``unix:<socket path>`` or ``http://127.0.0.1:<port>``; a TCP server also needs
    :meth:`auth_headers` on every request. The token never appears in ``repr``.
    """

    def __init__(self, key: Key, process: subprocess.Popen, workdir: Path, listen: str, token: str | None):
        self.key = key
        self.process = process
        self.workdir = workdir
        self.listen = listen
        self.url = ""
        self.users = 0
        self.label = "ORS server"
        self._token = token

    def __repr__(self) -> str:
        return f"<LocalServer pid={self.pid} url={self.url!r}>"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def socket_path(self) -> str | None:
        """The Unix socket's path, or ``None`` for a TCP server."""
        return self.url[len("unix:"):] if self.url.startswith("unix:") else None

    def auth_headers(self) -> dict[str, str]:
        """Headers every request to this server needs (the token, for a TCP server). A secret."""
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def alive(self) -> bool:
        return self.process.poll() is None

    def stopped(self) -> bool:
        """True while the process is stopped (SIGSTOP, a debugger): it answers nothing."""
        return _proc_state(self.pid) in ("T", "t")

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's output (across a rotation), for error messages."""
        text = ""
        for name in ("server.log.1", "server.log"):
            try:
                text += (self.workdir / name).read_text(errors="replace")
            except OSError:
                pass
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 5.0) -> None:
        """End the process and reap it, then remove its directory.

        SIGTERM first (the server shuts down and removes its own directory), SIGKILL after
        ``grace`` seconds. A stopped process is killed at once: a SIGTERM stays pending until
        SIGCONT, so waiting for it would only waste the grace period.
        """
        if self.process.poll() is None:
            if self.stopped():
                self.process.kill()
            else:
                self.process.terminate()
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(grace)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


_servers: dict[Key, LocalServer] = {}
_lock: asyncio.Lock | None = None


# -- private directories and their cleanup ---------------------------------------------------------
def _base_dirs() -> list[Path]:
    """Where server directories are made: the temp dir, or /tmp when its path is too long for a socket."""
    base = Path(tempfile.gettempdir())
    dirs = [base]
    if len(str(base)) + len(_PREFIX) + 20 > _SOCKET_PATH_MAX and Path("/tmp").is_dir():
        dirs.insert(0, Path("/tmp"))
    return dirs


def _make_workdir() -> Path:
    workdir = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=_base_dirs()[0]))  # mode 0700
    (workdir / "owner").write_text(f"{os.getpid()} {process_start_time(os.getpid())}\n")
    return workdir


def _pid_alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    state = _proc_state(pid)
    if state == "Z":
        return False
    # A recorded start time that differs means the pid now names another process.
    return start == "-" or process_start_time(pid) in ("-", start)


def _recorded_pids(workdir: Path) -> list[tuple[int, str]] | None:
    pids = []
    for name in ("owner", "server.pid"):
        try:
            pid, start = (workdir / name).read_text().split()
            pids.append((int(pid), start))
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            return None  # unreadable or half-written: not ours to judge
    return pids


def _legacy_and_dead(path: Path) -> bool:
    """A directory of an older openenv_gym (a ``port`` file, no pid files) whose server is gone."""
    try:
        port = int((path / "port").read_text())
    except (OSError, ValueError):
        return False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def sweep_stale() -> list[Path]:
    """Remove server directories of this user whose owner and server processes are all dead.

    Such directories are left when a process is SIGKILLed (it gets no chance to clean up).
    A directory without pid files is left alone (another process may be creating it right now),
    unless an older version made it and its port no longer answers. Returns what was removed.
    """
    removed = []
    uid = os.getuid()
    for base in _base_dirs():
        try:
            entries = list(os.scandir(base))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.startswith(_PREFIX):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
                continue
            path = Path(entry.path)
            pids = _recorded_pids(path)
            if not pids and not _legacy_and_dead(path):  # being created right now, or not ours
                continue
            if any(_pid_alive(pid, start) for pid, start in pids):
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


# -- launching -----------------------------------------------------------------------------------
def _spawn(root: Path, module_file: str, env_class: str, python: str, listen: str,
           app: str | None = None, extra_env: dict[str, str] | None = None) -> LocalServer:
    workdir = _make_workdir()
    token = secrets.token_urlsafe(32) if listen == "tcp" else None
    env = dict(os.environ, OPENREWARD_DISABLE_UPDATE_CHECK="1", PYTHONUNBUFFERED="1", **(extra_env or {}))
    env.pop(TOKEN_ENV, None)
    what = ["--app", app] if app else ["--module-file", module_file, "--class", env_class]
    if token:
        env[TOKEN_ENV] = token
    try:
        # O_APPEND: the child rotates the log by truncating it, and every writer must follow.
        with open(workdir / "server.log", "ab") as log:
            process = subprocess.Popen(
                [
                    python, str(_SERVE_SCRIPT), "--root", str(root), *what,
                    "--workdir", str(workdir), "--listen", listen,
                    "--log-max-bytes", str(LOG_MAX_BYTES), "--parent-pid", str(os.getpid()),
                ],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(root),
                # Its own session: a terminal's Ctrl-C interrupts the trainer, which then decides
                # (a KeyboardInterrupt it catches must not have killed the server under it); the
                # server still ends with the trainer (exit hook, or PR_SET_PDEATHSIG if it dies).
                start_new_session=True,
            )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return LocalServer(("",), process, workdir, listen, token)


async def _wait_ready(server: LocalServer, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    address = server.workdir / "address"
    client: httpx.AsyncClient | None = None
    try:
        while loop.time() < deadline:
            if not server.alive():
                raise BackendUnavailable(
                    f"the {server.label} for {server.key[0]} exited with code {server.process.returncode} "
                    f"before it was ready; its output ends with:\n{server.log_tail()}"
                )
            if client is None and address.exists():
                server.url = address.read_text().strip()
                client = make_client(server.url, timeout=2.0, headers=server.auth_headers(), local=True)
            if client is not None:
                try:
                    if (await client.get("/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            await asyncio.sleep(0.05)
    finally:
        if client is not None:
            await client.aclose()
    raise BackendTimeout(
        f"the {server.label} for {server.key[0]} was not healthy within startup_timeout={timeout} s; "
        f"its output ends with:\n{server.log_tail()}"
    )


async def acquire(
    root: str | os.PathLike,
    module_file: str,
    env_class: str,
    *,
    python: str | None = None,
    startup_timeout: float = 120.0,
    listen: str = "unix",
    app: str | None = None,
    env: dict[str, str] | None = None,
    label: str = "ORS server",
) -> LocalServer:
    """Return the running server for this source and class (or app), launching it if needed.

    Args:
        root: the folder ``module_file`` is relative to.
        module_file: the file that defines ``env_class``.
        env_class: the Environment class to serve.
        python: the interpreter to serve with (default: this one). Point it at a venv built from
            the source's requirements to keep its dependencies apart from the trainer's.
        startup_timeout: seconds to wait for ``GET /health``.
        listen: ``"unix"`` (a socket in a private directory) or ``"tcp"`` (127.0.0.1 with a token).
        app: serve this ASGI app (``"module:attr"`` importable from ``root``) instead of an ORS
            class; ``module_file`` and ``env_class`` are then only part of the key.
        env: extra environment variables for the server (part of the key: servers launched with
            different settings are not shared).
        label: what the server is called in error messages.
    """
    if listen not in LISTEN_MODES:
        raise ConfigurationError(f"listen must be one of {LISTEN_MODES}, not {listen!r}")
    global _lock
    if _lock is None:
        _lock = asyncio.Lock()
    root_path = Path(root).resolve()
    key: Key = (f"{root_path}:{app}" if app else str(root_path / module_file), env_class,
                python or sys.executable, str(root_path), listen, *sorted(f"{k}={v}" for k, v in (env or {}).items()))
    async with _lock:
        server = _servers.get(key)
        if server is not None and not server.alive():
            _servers.pop(key, None)
            await asyncio.to_thread(server.stop)
            server = None
        if server is None:
            await asyncio.to_thread(sweep_stale)
            server = _spawn(root_path, module_file, env_class, python or sys.executable, listen, app, env)
            server.key, server.label = key, label
            try:
                await _wait_ready(server, startup_timeout)
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
