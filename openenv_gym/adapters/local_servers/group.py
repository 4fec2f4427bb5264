"""The workers serving one source, the leases sessions hold on them, and the process's registry.

**Workers.** One Python server process runs on one core: a CPU-bound or blocking tool would cap
every vector env on it at one core. So a source is served by a :class:`ServerGroup` of worker
processes (``server_workers=`` of the adapters; :func:`default_workers` picks it from the core
count and the sessions a vector env expects). Each worker is a whole server of its own, because a
session (an ORS session, an OpenEnv WebSocket) is state inside one process.

**Leases.** A session holds a :class:`Lease` on one worker from its start to its end, and sends
every request there (sticky). A new lease goes to the worker with the fewest episodes in flight
(ties round-robin, so a burst of resets that all see the same counts still spreads), among those
with room for one more session. A lease is a context manager: leaving it, or :meth:`Lease.release`,
gives the slot back.

**Capacity.** Many servers allow a fixed number of sessions (most of OpenEnv's own environments
allow one). A group learns that number from the app's own setting (the launcher reads it, see
:func:`~openenv_gym.adapters.local_servers.processes.wait_ready`) or from a refusal that states
it (:meth:`Servers.learn`), and then starts enough workers for the sessions it expects
(``expected_sessions``, the largest any user asked for) and for every lease asked for beyond
them: a single-session environment under a vector env of 8 gets 8 workers, and under Gymnasium's
``check_env`` (whose render check opens a second env) 2. A :class:`RemoteServers` (a ``url=``)
learns its capacity the same way but cannot grow.

**Lifecycle.** The workers start together and are health-checked together; a dead one is
restarted alone (:meth:`ServerGroup.heal`; the others' sessions go on); all stop together, by PID.
A worker started beyond the first ones and beyond what the expected sessions need is stopped once
it has run no episode for :data:`IDLE_WORKER_TIMEOUT` (:meth:`ServerGroup.retire_idle`); sessions
kept open on it between episodes end with it.
Every adapter of the process asking for the same launch (and the same first worker count) shares
one group, reference counted (:func:`acquire`, :func:`release`): the last user stops it, and so
does interpreter exit (:func:`stop_all`); each child also ends itself if this process dies.
"""

from __future__ import annotations

import asyncio
import atexit
import math
import operator
import os
import time
from collections.abc import Collection
from typing import Any

from openenv_gym.adapters.local_servers.processes import (
    LISTEN_MODES,
    Launch,
    Worker,
    all_ready,
    spawn,
    sweep_stale,
    wait_ready,
)
from openenv_gym.errors import BackendUnavailable, ConfigurationError

__all__ = [
    "Lease", "Servers", "ServerGroup", "RemoteServer", "RemoteServers", "acquire", "release", "stop_all",
    "default_workers", "check_workers", "SESSIONS_PER_WORKER", "MAX_DEFAULT_WORKERS", "MAX_SERVER_WORKERS",
    "IDLE_WORKER_TIMEOUT",
]

SESSIONS_PER_WORKER = 8
"""Sessions a vector env must expect per extra worker before :func:`default_workers` adds one."""

CROWDED_WORKER = 1024
"""Sessions expected per worker from which it runs asyncio's event loop rather than uvloop: a
worker saturated by thousands of sessions on uvloop left new connections unaccepted for 30 s
(see ``serve.py``), while a few sessions' steps are quicker on uvloop."""

MAX_DEFAULT_WORKERS = 8
"""The most workers :func:`default_workers` picks on its own (more only when asked)."""

IDLE_WORKER_TIMEOUT = 60.0
"""Seconds a worker started beyond the group's first ones (for sessions beyond what was expected:
``serve``'s sessions arrive one by one) may run no episode before it is stopped: a burst of
sessions must not leave its processes (tens to hundreds of MiB each) running for good."""

MAX_SERVER_WORKERS = 256
"""The most workers a source may run at all, asked for or started for capacity (a typo, or a
single-session server under a huge vector env, must not fork thousands of servers)."""


def _cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS tells, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_workers(expected_sessions: int | None) -> int:
    """How many server processes a local source starts with when ``server_workers`` is not given.

    One for a single env (``expected_sessions`` ``None`` or 1): one episode at a time cannot use
    a second process. For a vector env, one per :data:`SESSIONS_PER_WORKER` sessions it expects,
    at most one per core this process may use and at most :data:`MAX_DEFAULT_WORKERS`: a worker
    is a whole interpreter with the environment's imports (tens of MiB, and seconds to start for
    openreward), worth it only once enough sessions run at once to keep it busy, and more
    workers than cores only trade CPU between them. So 16 sub-envs on a 2-core machine get 2
    workers, 4 sub-envs get 1. Ray actors are already spread over the CPUs, so the Ray backend
    gives each actor's source one worker unless ``server_workers`` says otherwise. A server that
    allows fewer sessions than that gets more workers (see the module docs).
    """
    if expected_sessions is None or expected_sessions <= 1:
        return 1
    return max(1, min(_cores(), MAX_DEFAULT_WORKERS, math.ceil(expected_sessions / SESSIONS_PER_WORKER)))


def check_in_process(in_process: object, url: str | None, server_python: str | None) -> bool:
    """``in_process`` (an env run here rather than behind a server of its own), or ConfigurationError:
    a bool, and neither a ``url=`` (a server elsewhere) nor a ``server_python=`` (a server's interpreter)."""
    if not isinstance(in_process, bool):
        raise ConfigurationError(f"in_process must be True or False, not {in_process!r}")
    if in_process and url is not None:
        raise ConfigurationError("in_process=True runs a local source= in this process; a url= is a server elsewhere")
    if in_process and server_python is not None:
        raise ConfigurationError("server_python= is the interpreter of a source's server; in_process=True starts "
                                 "none (gym.make(id, python=...) runs the whole adapter under another interpreter)")
    return in_process


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


class RemoteServer:
    """A server this process did not launch (``url=``): the one worker of a :class:`RemoteServers`."""

    pid = None
    capacity = None

    def __init__(self, url: str):
        self.url = url
        self.held = 0
        self.busy = 0
        self.confirmed = 0

    def __repr__(self) -> str:
        return f"<RemoteServer url={self.url!r}>"

    def auth_headers(self) -> dict[str, str]:
        return {}

    def alive(self) -> bool:
        return True

    def known_dead(self) -> bool:
        return False

    exit_note = None


Server = Worker | RemoteServer


class Lease:
    """One session slot on one server, held from a session's start to its end (the session's route).

    ``with lease:`` releases it on leaving; :meth:`release` does the same and may be called any
    number of times. ``busy`` says whether an episode runs on it (an OpenEnv socket kept idle
    between episodes still holds its server session, so it stays held but not busy);
    :meth:`confirm` records that the server accepted the session (refusals are read against it).
    """

    __slots__ = ("server", "_held", "_busy", "_confirmed")

    def __init__(self, server: Server):
        self.server = server
        self._held = self._busy = True
        self._confirmed = False
        server.held += 1
        server.busy += 1

    def __repr__(self) -> str:
        return f"<Lease on {self.server!r} busy={self._busy} held={self._held}>"

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @property
    def held(self) -> bool:
        return self._held

    @property
    def busy(self) -> bool:
        return self._busy

    @busy.setter
    def busy(self, value: bool) -> None:
        if self._held and value != self._busy:
            self._busy = value
            self.server.busy += 1 if value else -1

    def confirm(self) -> None:
        if self._held and not self._confirmed:
            self._confirmed = True
            self.server.confirmed += 1

    def release(self) -> None:
        if not self._held:
            return
        self.busy = False
        self._held = False
        self.server.held -= 1
        if self._confirmed:
            self._confirmed = False
            self.server.confirmed -= 1


class Servers:
    """What sessions are placed on: a list of servers, their capacity, the least-loaded choice."""

    label = "server"

    def __init__(self) -> None:
        self.workers: list[Any] = []
        self.capacity: int | None = None
        """Sessions one server allows, once learned (``None``: no limit known)."""
        self._cursor = 0

    def has_room(self, server: Server) -> bool:
        return self.capacity is None or server.held < self.capacity

    def choose(self, idle_on: Collection[Server] = ()) -> Server | None:
        """The server for a new episode, or ``None`` when every live one is full.

        Fewest episodes in flight wins, among servers with room for another session or listed in
        ``idle_on`` (where the caller holds an idle session it can reuse; it wins a tie); ties
        otherwise go round-robin. A server known dead is passed over while another runs; if all
        are dead one is returned anyway, so that the request fails with its exit.
        """
        workers = self.workers
        n = len(workers)
        best: Server | None = None
        best_slot = 0
        live = False
        for offset in range(n):
            slot = (self._cursor + offset) % n
            server = workers[slot]
            if server.known_dead():
                continue
            live = True
            reuse = server in idle_on
            if not reuse and not self.has_room(server):
                continue
            if best is None or server.busy < best.busy or (
                    server.busy == best.busy and reuse and best not in idle_on):
                best, best_slot = server, slot
        if best is None:
            if live:
                return None
            best_slot = self._cursor % n
            best = workers[best_slot]
        self._cursor = best_slot + 1
        return best

    def learn(self, lease: Lease, max_sessions: int | None) -> int | None:
        """A new session on ``lease``'s server was refused for capacity: note what that says.

        ``max_sessions`` is the limit the refusal stated (OpenEnv's ``CAPACITY_REACHED`` carries
        it). Without one, the sessions the server had accepted on our leases are the limit, if
        any were (with none, someone else holds the slots: nothing is learned). Returns the
        capacity now known.
        """
        if isinstance(max_sessions, int) and not isinstance(max_sessions, bool) and max_sessions >= 1:
            self.capacity = max_sessions
        elif lease.server.confirmed >= 1:
            self.capacity = min(self.capacity or lease.server.confirmed, lease.server.confirmed)
        return self.capacity

    @property
    def can_grow(self) -> bool:
        return False

    async def place(self, idle_on: Collection[Server] = ()) -> Server:
        """The server for a new episode (see :meth:`choose`); a full remote server is returned as it is."""
        server = self.choose(idle_on)
        return server if server is not None else self.workers[0]


class RemoteServers(Servers):
    """The one server at ``url``: sessions are placed on it, counted, and never more than it allows."""

    def __init__(self, url: str, label: str):
        super().__init__()
        self.label = label
        self.workers = [RemoteServer(url)]


class ServerGroup(Servers):
    """The worker processes serving one source, started, grown, restarted and stopped as one.

    Adapters place each session with :meth:`place` and hold a :class:`Lease` on the worker it
    returns; they call :meth:`heal` when a worker died. ``pid`` and ``url`` are the first worker's.
    """

    def __init__(self, key: tuple[str, ...], launch: Launch, size: int):
        super().__init__()
        self.key = key
        self.label = launch.label
        self.size = size
        self.users = 0
        self.closed = False
        self.expected = 1
        """The most sessions any user said it will run at once (its ``expected_sessions``)."""
        self._launch = launch
        self._starting: list[Worker] = []  # spawned, not yet in `workers` (stop() ends them too)
        self._restarts: dict[int, asyncio.Task[None]] = {}
        self._growth: asyncio.Task[None] | None = None
        self._idle_since: dict[Worker, float] = {}
        self._retirer: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<ServerGroup {self.label} workers={len(self.workers)} pids={self.pids()}>"

    # -- what adapters read ------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.workers[0].pid

    @property
    def url(self) -> str:
        return self.workers[0].url

    def pids(self) -> list[int]:
        """The workers' PIDs, in slot order."""
        return [w.pid for w in self.workers]

    def alive(self) -> bool:
        """True while every worker runs."""
        return all(w.process.poll() is None for w in self.workers)

    def log_tail(self, lines: int = 20) -> str:
        """The end of every worker's output (each labelled when there are several)."""
        if len(self.workers) == 1:
            return self.workers[0].log_tail(lines)
        return "\n".join(f"[worker {i} pid {w.pid}]\n{w.log_tail(lines)}" for i, w in enumerate(self.workers))

    @property
    def can_grow(self) -> bool:
        return not self.closed and len(self.workers) < MAX_SERVER_WORKERS

    # -- placing sessions --------------------------------------------------------------------------
    async def place(self, idle_on: Collection[Server] = ()) -> Server:
        """The worker for a new episode (see :meth:`Servers.choose`), starting more when all are full."""
        while True:
            worker = self.choose(idle_on)
            if worker is not None:
                return worker
            await self.grow()

    async def expect(self, sessions: int | None) -> None:
        """A user will run up to ``sessions`` at once: start enough workers if the capacity is known."""
        self.expected = max(self.expected, sessions or 1)
        if self.capacity is not None and len(self.workers) * self.capacity < self.expected:
            await self.grow()

    async def grow(self) -> None:
        """Start workers until the sessions expected, and one more than those held, fit.

        Concurrent callers share one round of starts. Raises
        :class:`~openenv_gym.errors.BackendUnavailable` when that would pass
        :data:`MAX_SERVER_WORKERS`, and a start's own error if a worker fails to start.
        """
        if self._growth is None:
            self._growth = asyncio.get_running_loop().create_task(self._grow())
            self._growth.add_done_callback(self._grown)
        await asyncio.shield(self._growth)

    def _grown(self, task: asyncio.Task[None]) -> None:
        self._growth = None
        if not task.cancelled():
            task.exception()  # retrieved here: every caller re-raises its own copy via shield

    async def _grow(self) -> None:
        capacity = self.capacity or 1
        live = [w for w in self.workers if not w.known_dead()]
        wanted = max(self.expected, sum(w.held for w in live) + 1)
        needed = max(1, math.ceil(wanted / capacity) - len(live))
        if len(self.workers) + needed > MAX_SERVER_WORKERS:
            raise BackendUnavailable(
                f"the {self.label} for {self.key[0]} allows {capacity} session(s) per process, and "
                f"{wanted} at once would need {len(live) + needed} processes, more than MAX_SERVER_WORKERS="
                f"{MAX_SERVER_WORKERS}; run fewer sub-envs, or raise the server's own session limit")
        new = [self._spawn(len(self.workers) + i) for i in range(needed)]
        try:
            await all_ready(new, self._launch.startup_timeout)
        except BaseException:
            for worker in new:
                self._starting.remove(worker)
            await asyncio.to_thread(_stop_all, new)
            raise
        for worker in new:
            self._starting.remove(worker)
        if self.closed:
            await asyncio.to_thread(_stop_all, new)
            raise BackendUnavailable(f"the {self.label} for {self.key[0]} was stopped")
        self.workers.extend(new)
        self._learn_from(new)
        if self._retirer is None:
            self._retirer = asyncio.get_running_loop().create_task(self._retire_loop())

    # -- idle workers ------------------------------------------------------------------------------
    @property
    def floor(self) -> int:
        """Workers kept whatever their load: the first ones, and those the expected sessions need."""
        return max(self.size, math.ceil(self.expected / (self.capacity or 1)))

    async def retire_idle(self, now: float | None = None) -> int:
        """Stop the workers beyond :attr:`floor` that ran no episode for :data:`IDLE_WORKER_TIMEOUT`
        (the newest first); the number stopped. Sessions kept on them between episodes end with
        them (an adapter drops its idle sockets to a server no longer in :attr:`workers`)."""
        now = time.monotonic() if now is None else now
        retired: list[Worker] = []
        for worker in reversed(self.workers[self.floor:]):
            if worker.busy:  # sessions kept between episodes (idle OpenEnv sockets) do not count
                self._idle_since.pop(worker, None)
            elif now - self._idle_since.setdefault(worker, now) >= IDLE_WORKER_TIMEOUT:
                retired.append(worker)
        if not retired or self._restarts:  # a restart holds slot numbers: retire on the next pass
            return 0
        self.workers = [w for w in self.workers if w not in retired]
        for worker in retired:
            self._idle_since.pop(worker, None)
        await asyncio.to_thread(_stop_all, retired)
        return len(retired)

    async def _retire_loop(self) -> None:
        try:
            while not self.closed and len(self.workers) > self.floor:
                await asyncio.sleep(IDLE_WORKER_TIMEOUT / 4)
                if not self.closed:
                    await self.retire_idle()
        finally:
            self._retirer = None

    def _learn_from(self, workers: list[Worker]) -> None:
        """Take the app's own session limit, as the launcher read it, once a worker is ready."""
        for worker in workers:
            if worker.capacity is not None:
                self.capacity = worker.capacity

    # -- start, restart, stop ----------------------------------------------------------------------
    def _spawn(self, slot: int) -> Worker:
        if self.closed:
            raise BackendUnavailable(f"the {self.label} for {self.key[0]} was stopped")
        label = self.label if self.size == 1 and slot == 0 else f"{self.label} (worker {slot})"
        crowded = self.expected >= CROWDED_WORKER * max(self.size, len(self.workers) + 1)
        worker = spawn(self._launch, label, loop="asyncio" if crowded else "auto")
        self._starting.append(worker)
        return worker

    async def start(self) -> None:
        """Start the first workers at once and wait until all are healthy; on any failure stop them all."""
        try:
            workers = [self._spawn(slot) for slot in range(self.size)]
            await all_ready(workers, self._launch.startup_timeout)
        except BaseException:
            await asyncio.to_thread(self.stop)
            raise
        self.workers = workers
        self._starting = [w for w in self._starting if w not in workers]
        if self.closed:  # stopped while starting (interpreter exit): never leak the processes
            await asyncio.to_thread(self.stop)
            raise BackendUnavailable(f"the {self.label} for {self.key[0]} was stopped")
        self._learn_from(workers)

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

                def forget(_: asyncio.Task[None], s: int = slot) -> None:
                    self._restarts.pop(s, None)

                task.add_done_callback(forget)
        if self._restarts:
            await asyncio.gather(*(asyncio.shield(t) for t in list(self._restarts.values())))

    async def _restart(self, slot: int, old: Worker) -> None:
        await asyncio.to_thread(old.stop)
        new = self._spawn(slot)
        try:
            await wait_ready(new, self._launch.startup_timeout)
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
        retirer = self._retirer
        if retirer is not None:
            try:  # stop() may run on another thread (atexit, asyncio.to_thread)
                retirer.get_loop().call_soon_threadsafe(retirer.cancel)
            except RuntimeError:
                pass  # its loop is closed: the task went with it
        _stop_all([*self.workers, *self._starting], grace)


def _stop_all(workers: list[Worker], grace: float = 5.0) -> None:
    for worker in workers:
        worker.signal_stop()
    deadline = time.monotonic() + grace
    for worker in workers:
        worker.reap(deadline - time.monotonic())


# -- the process's registry -------------------------------------------------------------------------
_groups: dict[tuple[str, ...], ServerGroup] = {}
_lock: asyncio.Lock | None = None


async def acquire(launch: Launch, *, workers: int = 1, expected_sessions: int | None = None) -> ServerGroup:
    """The running group of servers for ``launch``, launched if needed, with one more user.

    A group found with a dead worker has that worker restarted first. ``workers`` (part of the
    key) is how many processes start at first; ``expected_sessions`` how many sessions this user
    will run at once (more workers start if the server's capacity, once known, needs them).
    """
    if launch.listen not in LISTEN_MODES:
        raise ConfigurationError(f"listen must be one of {LISTEN_MODES}, not {launch.listen!r}")
    size = check_workers(workers) or 1
    global _lock
    if _lock is None:
        _lock = asyncio.Lock()
    key = (*launch.key(), f"workers={size}")
    async with _lock:
        group = _groups.get(key)
        if group is not None and group.closed:
            _groups.pop(key, None)
            group = None
        if group is not None and not group.alive():
            await group.heal()
        if group is None:
            await asyncio.to_thread(sweep_stale)
            group = ServerGroup(key, launch, size)
            group.expected = max(1, expected_sessions or 1)  # its first workers' loop depends on it
            await group.start()
            _groups[key] = group
        group.users += 1
        try:
            await group.expect(expected_sessions)
        except BaseException:
            await asyncio.to_thread(release, group)
            raise
        return group


def release(group: ServerGroup) -> None:
    """Drop one user of ``group``; the last user stops every worker."""
    group.users -= 1
    if group.users <= 0:
        if _groups.get(group.key) is group:
            del _groups[group.key]
        group.stop()


def running() -> list[ServerGroup]:
    """The groups this process runs now."""
    return list(_groups.values())


def stop_all() -> None:
    """Stop every server this process launched (also run at interpreter exit)."""
    for group in list(_groups.values()):
        group.stop(grace=2.0)
    _groups.clear()


atexit.register(stop_all)
