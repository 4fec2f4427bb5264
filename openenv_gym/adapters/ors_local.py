"""Local sources served in subprocesses, private to their user, shared within a process.

A local ORS source (a file or folder defining an ``ors`` / ``openreward`` Environment class) is
served by the SDK's own ``Server`` in a child process (:mod:`openenv_gym.adapters.ors_serve`). A
subprocess rather than in-process serving because the SDK servers block their loop on sync tools,
openreward's import takes seconds, and its pinned sse-starlette works on one event loop only
(docs/backends.md). OpenEnv environments are served the same way: :func:`acquire` with ``app=``
runs the environment's ASGI app (``server.app:app``) under uvicorn, with the environment
variables the adapter gives (``MAX_CONCURRENT_ENVS``; see :mod:`openenv_gym.adapters.openenv`).

**Workers.** One Python server process runs on one core: a CPU-bound or blocking tool would cap
every vector env on it at one core. So a source is served by a :class:`ServerGroup` of ``workers``
processes (``server_workers=`` of the adapters; :func:`default_workers` picks it from the core
count and the sessions a vector env expects). Each worker is a whole server of its own (its own
private directory and socket, or its own port and token), because a session (an ORS session, an
OpenEnv WebSocket episode) is state inside one process: an adapter routes each episode to one
worker (:meth:`ServerGroup.pick`: fewest sessions in flight, ties round-robin) and sends all of
its requests there. The workers are started together and health-checked together, a dead one is
restarted alone (:meth:`ServerGroup.heal`; the other workers' sessions go on), and they are
stopped as one, by PID.

Nobody else on the machine may use these servers: ``/task`` holds the answers, and a session is
an episode in progress. Each worker therefore lives in its own private directory (``mkdtemp``,
mode 0700) and by default listens on a Unix socket inside it, so only this user can connect and
no TCP port is open at all. Where a socket cannot reach (a client that only speaks TCP),
``listen="tcp"`` binds 127.0.0.1 and the worker refuses every request without its random token
(``Authorization: Bearer``; see :meth:`LocalServer.auth_headers`), which travels to the child in
an environment variable, never on its command line.

Every env of the process that uses the same source, class, interpreter, listen mode and number of
workers shares one group (reference counted); the group stops when its last user releases it and
at interpreter exit, and each child ends itself, removing its directory, if this process dies
(``PR_SET_PDEATHSIG``). Directories that outlived a SIGKILL are removed the next time any process
of this user starts a server: each holds the pids (with start times) of its owner and its server.
A worker's log is rotated at :data:`LOG_MAX_BYTES`, so a week-long run cannot fill the disk.
"""

from __future__ import annotations

import asyncio
import atexit
import math
import operator
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from openenv_gym.adapters.ors_serve import TOKEN_ENV, is_stopped, proc_state, process_start_time
from openenv_gym.adapters.ors_transport import make_client
from openenv_gym.errors import BackendTimeout, BackendUnavailable, ConfigurationError

__all__ = [
    "LocalServer", "ServerGroup", "acquire", "release", "stop_all", "sweep_stale", "default_workers",
    "check_workers", "LOG_MAX_BYTES", "LISTEN_MODES", "SESSIONS_PER_WORKER", "MAX_DEFAULT_WORKERS",
    "MAX_SERVER_WORKERS",
]

_SERVE_SCRIPT = Path(__file__).with_name("ors_serve.py")
_PREFIX = "openenv-gym-ors-"
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, 104 on macOS

LOG_MAX_BYTES = 1 << 20
"""Size at which a server's ``server.log`` is rotated to ``server.log.1`` (so at most ~2x on disk)."""

LISTEN_MODES = ("unix", "tcp")

SESSIONS_PER_WORKER = 8
"""Sessions a vector env must expect per extra worker before :func:`default_workers` adds one."""

MAX_DEFAULT_WORKERS = 8
"""The most workers :func:`default_workers` picks on its own (more only when asked)."""

MAX_SERVER_WORKERS = 256
"""The most workers a source may be given at all (a typo must not fork thousands of servers)."""

Key = tuple[str, ...]


def _cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS tells, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_workers(expected_sessions: int | None) -> int:
    """How many server processes a local source gets when ``server_workers`` is not given.

    One for a single env (``expected_sessions`` ``None`` or 1): one episode at a time cannot use
    a second process. For a vector env, one per :data:`SESSIONS_PER_WORKER` sessions it expects,
    at most one per core this process may use and at most :data:`MAX_DEFAULT_WORKERS`: a worker
    is a whole interpreter with the environment's imports (tens of MiB, and seconds to start for
    openreward), worth it only once enough sessions run at once to keep it busy, and more
    workers than cores only trade CPU between them. So 16 sub-envs on a 2-core machine get 2
    workers, 4 sub-envs get 1. Ray actors are already spread over the CPUs, so the Ray backend
    gives each actor's source one worker unless ``server_workers`` says otherwise.
    """
    if expected_sessions is None or expected_sessions <= 1:
        return 1
    return max(1, min(_cores(), MAX_DEFAULT_WORKERS, math.ceil(expected_sessions / SESSIONS_PER_WORKER)))


def check_workers(value: object) -> int | None:
    """``server_workers`` as an int (``None``: pick by :func:`default_workers`), or ConfigurationError.

    Any integer type counts (a numpy integer from a config); a bool, a float or a string does not.
    """
    if value is None:
        return None
    count: int | None = None
    if not isinstance(value, bool):
        try:
            count = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    if count is None or not 1 <= count <= MAX_SERVER_WORKERS:
        if isinstance(value, float) or (count is not None and abs(count) < 10**9):
            shown = repr(value if count is None else count)
        elif count is not None:
            shown = "a larger number"  # never repr: a huge int is slow to print, or refuses to
        else:
            shown = f"a {type(value).__name__}"
        raise ConfigurationError(
            f"server_workers must be a whole number from 1 to {MAX_SERVER_WORKERS} (server processes for a "
            f"local source), not {shown}")
    return count


class LocalServer:
    """One running server process (one worker of a :class:`ServerGroup`): address, PID, directory, log.

    ``url`` is ``unix:<socket path>`` or ``http://127.0.0.1:<port>``; a TCP server also needs
    :meth:`auth_headers` on every request. The token never appears in ``repr``. ``sessions``
    counts the episodes in flight that adapters routed to this worker.
    """

    def __init__(self, key: Key, process: subprocess.Popen, workdir: Path, listen: str, token: str | None):
        self.key = key
        self.process = process
        self.workdir = workdir
        self.listen = listen
        self.url = ""
        self.sessions = 0
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
        return is_stopped(self.pid)

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
        """End the process and reap it, then remove its directory.

        SIGTERM first (the server shuts down and removes its own directory), SIGKILL after
        ``grace`` seconds. A stopped process is killed at once: a SIGTERM stays pending until
        SIGCONT, so waiting for it would only waste the grace period.
        """
        self.signal_stop()
        self.reap(grace)




class _Launch:
    """What every worker of a group is started from (so a dead one can be started again alike)."""

    def __init__(self, root: Path, module_file: str, env_class: str, python: str, listen: str,
                 app: str | None, env: dict[str, str] | None, startup_timeout: float):
        self.root, self.module_file, self.env_class, self.python = root, module_file, env_class, python
        self.listen, self.app, self.env, self.startup_timeout = listen, app, env, startup_timeout


class ServerGroup:
    """The ``size`` worker processes serving one source, started, restarted and stopped as one.

    Adapters route each episode to one worker with :meth:`pick` (and give it back with
    :meth:`done`), call :meth:`heal` when a worker died, and reach a worker through its own
    ``url`` and :meth:`LocalServer.auth_headers`. ``pid``, ``url`` and :meth:`auth_headers` are
    the first worker's (the only one when ``size`` is 1).
    """

    def __init__(self, key: Key, launch: _Launch, size: int, label: str):
        self.key = key
        self.label = label
        self.size = size
        self.users = 0
        self.closed = False
        self.workers: list[LocalServer] = []
        self._launch = launch
        self._cursor = 0
        self._starting: list[LocalServer] = []  # spawned, not yet in `workers` (stop() ends them too)
        self._restarts: dict[int, asyncio.Task[None]] = {}

    def __repr__(self) -> str:
        return f"<ServerGroup {self.label} workers={self.size} pids={self.pids()}>"

    # -- what adapters read ------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.workers[0].pid

    @property
    def url(self) -> str:
        return self.workers[0].url

    def auth_headers(self) -> dict[str, str]:
        """The first worker's headers (its token, for TCP). A secret."""
        return self.workers[0].auth_headers()

    def pids(self) -> list[int]:
        """The workers' PIDs, in slot order."""
        return [w.pid for w in self.workers]

    def sessions(self) -> list[int]:
        """Episodes in flight on each worker, in slot order."""
        return [w.sessions for w in self.workers]

    def alive(self) -> bool:
        """True while every worker runs."""
        return all(w.process.poll() is None for w in self.workers)

    def log_tail(self, lines: int = 20) -> str:
        """The end of every worker's output (each labelled when there are several)."""
        if len(self.workers) == 1:
            return self.workers[0].log_tail(lines)
        return "\n".join(f"[worker {i} pid {w.pid}]\n{w.log_tail(lines)}" for i, w in enumerate(self.workers))

    # -- routing -----------------------------------------------------------------------------------
    def pick(self) -> LocalServer:
        """The worker for a new episode, counted as one more session on it until :meth:`done`.

        Fewest sessions in flight wins; ties go round-robin, so a burst of resets that all see
        the same counts still spreads evenly. A worker known dead is passed over while another runs.
        """
        workers = self.workers
        n = len(workers)
        best: LocalServer | None = None
        best_slot = 0
        for offset in range(n):
            slot = (self._cursor + offset) % n
            worker = workers[slot]
            if worker.process.returncode is not None:  # polled by alive()/heal(): known dead
                continue
            if best is None or worker.sessions < best.sessions:
                best, best_slot = worker, slot
        if best is None:  # all dead: the request fails with the exit and the next reset heals
            best_slot = self._cursor % n
            best = workers[best_slot]
        self._cursor = best_slot + 1
        best.sessions += 1
        return best

    @staticmethod
    def done(worker: LocalServer) -> None:
        """One session picked on ``worker`` ended (or never started)."""
        if worker.sessions > 0:
            worker.sessions -= 1

    # -- start, restart, stop ----------------------------------------------------------------------
    def _spawn(self, slot: int) -> LocalServer:
        if self.closed:
            raise BackendUnavailable(f"the {self.label} for {self.key[0]} was stopped")
        spec = self._launch
        worker = _spawn(spec.root, spec.module_file, spec.env_class, spec.python, spec.listen, spec.app, spec.env)
        worker.key = self.key
        worker.label = self.label if self.size == 1 else f"{self.label} (worker {slot} of {self.size})"
        self._starting.append(worker)
        return worker

    async def start(self) -> None:
        """Start every worker at once and wait until all are healthy; on any failure stop them all."""
        try:
            workers = [self._spawn(slot) for slot in range(self.size)]
            await _all_ready(workers, self._launch.startup_timeout)
        except BaseException:
            await asyncio.to_thread(self.stop)
            raise
        self.workers = workers
        self._starting = [w for w in self._starting if w not in workers]
        if self.closed:  # stopped while starting (interpreter exit): never leak the processes
            await asyncio.to_thread(self.stop)
            raise BackendUnavailable(f"the {self.label} for {self.key[0]} was stopped")

    async def heal(self) -> None:
        """Restart every dead worker in its slot; the others keep running (and their sessions).

        Concurrent callers share one restart per slot. Raises the restart's typed error
        (:class:`~openenv_gym.errors.BackendUnavailable` with the worker's output, or
        :class:`~openenv_gym.errors.BackendTimeout` after ``startup_timeout``).
        """
        for slot, worker in enumerate(self.workers):
            if worker.process.poll() is not None and slot not in self._restarts:
                task = asyncio.get_running_loop().create_task(self._restart(slot, worker))
                self._restarts[slot] = task
                task.add_done_callback(lambda _, s=slot: self._restarts.pop(s, None))
        if self._restarts:
            await asyncio.gather(*(asyncio.shield(t) for t in list(self._restarts.values())))

    async def _restart(self, slot: int, old: LocalServer) -> None:
        await asyncio.to_thread(old.stop)
        new = self._spawn(slot)
        try:
            await _wait_ready(new, self._launch.startup_timeout)
        except BaseException:
            self._starting.remove(new)
            await asyncio.to_thread(new.stop)
            raise
        self._starting.remove(new)
        if self.closed:
            await asyncio.to_thread(new.stop)
            raise BackendUnavailable(f"the {self.label} for {self.key[0]} was stopped")
        self.workers[slot] = new

    def stop(self, grace: float = 5.0) -> None:
        """Stop every worker at once (their grace periods overlap), by PID, and remove their directories."""
        self.closed = True
        everyone = [*self.workers, *self._starting]
        for worker in everyone:
            worker.signal_stop()
        deadline = time.monotonic() + grace
        for worker in everyone:
            worker.reap(deadline - time.monotonic())


_servers: dict[Key, ServerGroup] = {}
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
    state = proc_state(pid)
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


async def _all_ready(workers: list[LocalServer], timeout: float) -> None:
    """Wait until every worker is healthy; the first failure cancels the other waits and is raised."""
    if len(workers) == 1:
        return await _wait_ready(workers[0], timeout)
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(_wait_ready(w, timeout)) for w in workers]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


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
    workers: int = 1,
) -> ServerGroup:
    """Return the running group of servers for this source and class (or app), launching it if needed.

    A group found with a dead worker has that worker restarted first.

    Args:
        root: the folder ``module_file`` is relative to.
        module_file: the file that defines ``env_class``.
        env_class: the Environment class to serve.
        python: the interpreter to serve with (default: this one). Point it at a venv built from
            the source's requirements to keep its dependencies apart from the trainer's.
        startup_timeout: seconds to wait for ``GET /health`` (of every worker, started together).
        listen: ``"unix"`` (a socket in a private directory) or ``"tcp"`` (127.0.0.1 with a token).
        app: serve this ASGI app (``"module:attr"`` importable from ``root``) instead of an ORS
            class; ``module_file`` and ``env_class`` are then only part of the key.
        env: extra environment variables for the server (part of the key: servers launched with
            different settings are not shared).
        label: what the server is called in error messages.
        workers: how many server processes (see :func:`default_workers`); part of the key.
    """
    if listen not in LISTEN_MODES:
        raise ConfigurationError(f"listen must be one of {LISTEN_MODES}, not {listen!r}")
    size = check_workers(workers) or 1
    global _lock
    if _lock is None:
        _lock = asyncio.Lock()
    root_path = Path(root).resolve()
    key: Key = (f"{root_path}:{app}" if app else str(root_path / module_file), env_class,
                python or sys.executable, str(root_path), listen, f"workers={size}",
                *sorted(f"{k}={v}" for k, v in (env or {}).items()))
    async with _lock:
        group = _servers.get(key)
        if group is not None and group.closed:
            _servers.pop(key, None)
            group = None
        if group is not None and not group.alive():
            await group.heal()
        if group is None:
            await asyncio.to_thread(sweep_stale)
            launch = _Launch(root_path, module_file, env_class, python or sys.executable, listen, app, env,
                             startup_timeout)
            group = ServerGroup(key, launch, size, label)
            await group.start()
            _servers[key] = group
        group.users += 1
        return group


def release(group: ServerGroup) -> None:
    """Drop one user of ``group``; the last user stops every worker."""
    group.users -= 1
    if group.users <= 0:
        if _servers.get(group.key) is group:
            del _servers[group.key]
        group.stop()


def stop_all() -> None:
    """Stop every server this process launched (also run at interpreter exit)."""
    for group in list(_servers.values()):
        group.stop(grace=2.0)
    _servers.clear()


atexit.register(stop_all)
