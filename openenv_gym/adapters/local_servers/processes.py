"""One local server process (a worker): its private directory, launch, readiness, log and stop.

A worker runs :mod:`openenv_gym.adapters.local_servers.serve` in a child process: the SDK's own ``Server``
for an ORS class, or an ASGI app (an OpenEnv environment's ``server.app:app``) under uvicorn.
Nobody else on the machine may use it (``/task`` holds the answers, a session is an episode in
progress), so each worker lives in its own private directory (``mkdtemp``, mode 0700) and by
default listens on a Unix socket inside it: only this user can connect, and no TCP port is open.
Where a socket cannot reach, ``listen="tcp"`` binds 127.0.0.1 and the worker refuses every request
without its random token (``Authorization: Bearer``), which travels to the child in an environment
variable, never on its command line.

The directory also holds the address file (written once the socket is bound), the app's own
session limit when the launcher could read it (``capacity``), the log (rotated at
:data:`LOG_MAX_BYTES`) and two pid files with start times (``owner``: the parent, ``server.pid``:
the child), so that directories left by a SIGKILL are swept by the next start of any process of
this user (:func:`sweep_stale`) and a reused pid is never mistaken for a live one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import httpx

from openenv_gym.adapters.local_servers.serve import CAPACITY_FILE, TOKEN_ENV
from openenv_gym.adapters.net.client import make_client
from openenv_gym.errors import BackendTimeout, BackendUnavailable
from openenv_gym.processes import is_stopped, proc_state, process_start_time
from openenv_gym.tokens import new_token

__all__ = ["Launch", "Worker", "spawn", "wait_ready", "all_ready", "sweep_stale", "LOG_MAX_BYTES", "LISTEN_MODES"]

_SERVE_SCRIPT = Path(__file__).with_name("serve.py")
_PREFIX = "openenv-gym-ors-"
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, 104 on macOS

LOG_MAX_BYTES = 1 << 20
"""Size at which a server's ``server.log`` is rotated to ``server.log.1`` (so at most ~2x on disk)."""

LISTEN_MODES = ("unix", "tcp")


class Launch:
    """What every worker of a source is started from (so that a dead one is started again alike).

    Args:
        root: the folder ``module_file`` (or ``app``) is found from; the server's working directory.
        module_file, env_class: the ORS Environment class to serve (only part of the key with ``app``).
        python: the interpreter that runs the server.
        listen: ``"unix"`` or ``"tcp"``.
        app: an ASGI app (``"module:attr"`` importable from ``root``) to serve instead of a class.
        env: extra environment variables for the server.
        startup_timeout: seconds a worker may take to answer ``GET /health``.
        label: what the server is called in messages ("ORS server", "OpenEnv server").
    """

    __slots__ = ("root", "module_file", "env_class", "python", "listen", "app", "env", "startup_timeout", "label")

    def __init__(self, root: Path, module_file: str, env_class: str, python: str, listen: str, *,
                 app: str | None = None, env: dict[str, str] | None = None, startup_timeout: float = 120.0,
                 label: str = "ORS server"):
        self.root, self.module_file, self.env_class, self.python = root, module_file, env_class, python
        self.listen, self.app, self.env, self.startup_timeout, self.label = listen, app, dict(env or {}), \
            startup_timeout, label

    def key(self) -> tuple[str, ...]:
        """What makes two launches the same server (every field but the timeout and the label)."""
        what = f"{self.root}:{self.app}" if self.app else str(self.root / self.module_file)
        return (what, self.env_class, self.python, str(self.root), self.listen,
                *sorted(f"{k}={v}" for k, v in self.env.items()))


class Worker:
    """One running server process: address, PID, directory, log, and the leases on it.

    ``url`` is ``unix:<socket path>`` or ``http://127.0.0.1:<port>``; a TCP server also needs
    :meth:`auth_headers` on every request. The token never appears in ``repr``. ``held`` counts
    the server sessions leases hold on it (what its session limit counts), ``busy`` the episodes
    in flight (what the least-loaded choice counts), ``confirmed`` the sessions the server
    accepted. ``capacity`` is the app's own session limit when the launcher could read it.
    """

    def __init__(self, process: subprocess.Popen, workdir: Path, listen: str, token: str | None, label: str,
                 source: str):
        self.process = process
        self.workdir = workdir
        self.listen = listen
        self.label = label
        self.source = source
        self.url = ""
        self.capacity: int | None = None
        self.held = 0
        self.busy = 0
        self.confirmed = 0
        self._token = token

    def __repr__(self) -> str:
        return f"<Worker pid={self.pid} url={self.url!r}>"

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

    def known_dead(self) -> bool:
        """True once an earlier poll saw the process end (no system call)."""
        return self.process.returncode is not None

    def stopped(self) -> bool:
        """True while the process is stopped (SIGSTOP, a debugger): it answers nothing."""
        return is_stopped(self.pid)

    async def exit_note(self) -> str:
        """How the process exited, if it did, for "cannot be reached" messages (else ``""``)."""
        # A killed server resets its connections before its exit is visible: give the kernel a
        # moment, so the error can say the process died and how.
        for _ in range(25):
            if not self.alive():
                return f"; the server process exited with code {self.process.returncode}"
            await asyncio.sleep(0.02)
        return ""

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's output (across a rotation), for error messages."""
        text = ""
        for name in ("server.log.1", "server.log"):
            try:
                text += (self.workdir / name).read_text(errors="replace")
            except OSError:
                pass
        return "\n".join(text.splitlines()[-lines:])

    def signal_stop(self) -> None:
        """Ask the process to end: SIGTERM, or SIGKILL if it is stopped (a pending SIGTERM waits for SIGCONT)."""
        if self.process.poll() is None:
            if self.stopped():
                self.process.kill()
            else:
                self.process.terminate()

    def reap(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the process to end, SIGKILL it after that, then remove its directory."""
        if self.process.poll() is None:
            try:
                self.process.wait(max(0.0, grace))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5.0)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def stop(self, grace: float = 5.0) -> None:
        """End the process (SIGTERM, SIGKILL after ``grace`` s; a stopped one at once) and remove its directory."""
        self.signal_stop()
        self.reap(grace)


# -- private directories and their cleanup ---------------------------------------------------------
def _base_dirs() -> list[Path]:
    """Where server directories are made: the temp dir, or /tmp when its path is too long for a socket."""
    base = Path(tempfile.gettempdir())
    dirs = [base]
    if len(str(base)) + len(_PREFIX) + 20 > _SOCKET_PATH_MAX and Path("/tmp").is_dir():
        dirs.insert(0, Path("/tmp"))
    return dirs


def make_workdir() -> Path:
    """A new private (0700) directory for one server, recording this process as its owner."""
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
    if proc_state(pid) == "Z":
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
            if pids is None:  # a pid file unreadable or half-written: not ours to judge
                continue
            if not pids and not _legacy_and_dead(path):  # being created right now, or not ours
                continue
            if any(_pid_alive(pid, start) for pid, start in pids):
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


# -- launching -----------------------------------------------------------------------------------
def spawn(launch: Launch, label: str | None = None, loop: str = "auto") -> Worker:
    """Start one server process for ``launch`` (not waiting for it: see :func:`wait_ready`);
    ``loop`` is its uvicorn's event loop (``"asyncio"`` for a worker expecting thousands of sessions)."""
    workdir = make_workdir()
    token = new_token() if launch.listen == "tcp" else None
    env = dict(os.environ, OPENREWARD_DISABLE_UPDATE_CHECK="1", PYTHONUNBUFFERED="1", **launch.env)
    env.pop(TOKEN_ENV, None)
    what = ["--app", launch.app] if launch.app else ["--module-file", launch.module_file, "--class", launch.env_class]
    if token:
        env[TOKEN_ENV] = token
    try:
        # O_APPEND: the child rotates the log by truncating it, and every writer must follow.
        with open(workdir / "server.log", "ab") as log:
            process = subprocess.Popen(
                [
                    launch.python, str(_SERVE_SCRIPT), "--root", str(launch.root), *what,
                    "--workdir", str(workdir), "--listen", launch.listen,
                    "--log-max-bytes", str(LOG_MAX_BYTES), "--parent-pid", str(os.getpid()), "--loop", loop,
                ],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(launch.root),
                # Its own session: a terminal's Ctrl-C interrupts the trainer, which then decides
                # (a KeyboardInterrupt it catches must not have killed the server under it); the
                # server still ends with the trainer (exit hook, or PR_SET_PDEATHSIG if it dies).
                start_new_session=True,
            )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return Worker(process, workdir, launch.listen, token, label or launch.label, launch.key()[0])


def _read_capacity(workdir: Path) -> int | None:
    try:
        value = int((workdir / CAPACITY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return value if value >= 1 else None


async def wait_ready(worker: Worker, timeout: float) -> None:
    """Wait until ``worker`` answers ``GET /health`` with 200 (its body is never read).

    Raises :class:`~openenv_gym.errors.BackendUnavailable` if it exits first and
    :class:`~openenv_gym.errors.BackendTimeout` after ``timeout`` (``startup_timeout``), each with
    the end of its log.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    address = worker.workdir / "address"
    client: httpx.AsyncClient | None = None
    try:
        while loop.time() < deadline:
            if not worker.alive():
                raise BackendUnavailable(
                    f"the {worker.label} for {worker.source} exited with code {worker.process.returncode} "
                    f"before it was ready; its output ends with:\n{worker.log_tail()}"
                )
            if client is None and address.exists():
                worker.url = address.read_text().strip()
                worker.capacity = _read_capacity(worker.workdir)  # written before the address
                client = make_client(worker.url, timeout=2.0, headers=worker.auth_headers(), local=True)
            if client is not None:
                try:
                    async with client.stream("GET", "/health") as response:
                        if response.status_code == 200:
                            return
                except httpx.TransportError:
                    pass
            await asyncio.sleep(0.05)
    finally:
        if client is not None:
            await client.aclose()
    raise BackendTimeout(
        f"the {worker.label} for {worker.source} was not healthy within {timeout} s (start_timeout); "
        f"its output ends with:\n{worker.log_tail()}"
    )


async def all_ready(workers: list[Worker], timeout: float) -> None:
    """Wait until every worker is healthy; the first failure cancels the other waits and is raised."""
    if len(workers) == 1:
        return await wait_ready(workers[0], timeout)
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(wait_ready(w, timeout)) for w in workers]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
