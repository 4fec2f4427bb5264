"""Facts and settings of processes, read from ``/proc`` (Linux): who is alive, whose children, is
a pid stopped, when did it start, how much memory; die with the parent; the open-files limit;
collect garbage less often.

The one copy of what every process the package starts needs (local servers, host processes, test
servers), and what tests and benchmarks check to see that nothing outlives an env. A zombie counts
as dead: it has exited and only waits to be reaped. Elsewhere (no ``/proc``) every fact answers as
if nothing were running. It imports nothing but the standard library, so a server script that
runs without openenv_gym on its path loads this file by its path.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

__all__ = ["proc_state", "is_stopped", "process_start_time", "die_with_parent", "tune_gc", "GC_THRESHOLDS",
           "ensure_open_files", "open_files_limit", "tune_gc_for", "TUNE_GC_AT", "PYTHON_GC_THRESHOLDS", "alive",
           "parents", "children",
           "descendants", "cmdline",
           "rss_kib", "wait_dead", "terminate"]

_PR_SET_PDEATHSIG = 1


def proc_state(pid: int) -> str:
    """The kernel's state letter of ``pid`` (``R``, ``S``, ``T``, ``Z``...), ``"?"`` where unknown."""
    fields = _stat(pid)
    return fields[0] if fields else "?"


def is_stopped(pid: int) -> bool:
    """True while ``pid`` is stopped (SIGSTOP, a debugger): it answers nothing, and a SIGTERM
    would wait for a SIGCONT that may never come, so only a SIGKILL ends it."""
    return proc_state(pid) in ("T", "t")


def process_start_time(pid: int) -> str:
    """The kernel's start time of ``pid`` (``/proc/<pid>/stat`` field 22), ``"-"`` where unknown.

    A pid plus its start time names one process even after the pid is reused.
    """
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else "-"


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's atexit hook still stops us
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(1)


def open_files_limit() -> tuple[int, int]:
    """This process's ``(soft, hard)`` limit on open files (``ulimit -n``; -1 for none)."""
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)


def ensure_open_files(needed: int, what: str, base: int = 0) -> None:
    """Make sure this process may open ``needed`` files, raising its soft limit where the hard
    one allows (the processes it starts inherit the new limit); ``OSError`` naming the limit when
    the hard one is too low. ``what`` says who needs them, for that message; ``base`` of the
    ``needed`` are the process's own, the rest can be spread over host processes (the message
    says how many would hold them).

    Sub-envs hold sockets (a connection each, more for servers and hosts): with the common soft
    limit of 1,024 or less, a large vector env otherwise fails part of its sub-envs with errors
    that never mention descriptors. ``needed`` is an estimate (a reset's burst or a session's
    overlapping delete hold a few more for a moment), so the soft limit goes up to the hard one,
    not to the estimate.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else hard
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        hosts = -(-(needed - base) // max(1, hard - base))
        raise OSError(24, f"{what} need about {needed} open files, and this process may open at most {hard} "
                          "(its hard limit, `ulimit -Hn`): raise that limit, or spread the sub-envs over "
                          f"processes: python=sys.executable with vector_options={{'num_hosts': {hosts}}} "
                          "(host processes), or backend='ray'")


PYTHON_GC_THRESHOLDS = ((700, 10, 10), (2000, 10, 10))
"""The collector's thresholds as CPython starts (3.11 and 3.12; 3.13): anything else is a setting of
the user's own, which :func:`tune_gc_for` leaves alone."""

TUNE_GC_AT = 1024
"""Sessions from which a vector env tunes its process's garbage collector (:func:`tune_gc_for`)."""

GC_THRESHOLDS = (50_000, 20, 100)
"""What :func:`tune_gc` sets (Python's defaults: 700, 10, 10)."""


def tune_gc() -> None:
    """Collect garbage far less often than Python's defaults, from now on.

    A process with many sessions in flight holds many young objects (each request's frames,
    tasks and buffers; the SDKs keep each finished tool call for a minute), and with the default
    thresholds the collector walks them again every few hundred allocations. Served from one
    process, 128 sub-envs stepped at about half the rate of 8 (benchmarks/vector.py,
    "collapse"); a client of 1,024 sub-envs spends nearly twice as much per env-step as one of 8.
    What the process has loaded so far is frozen out of every collection, and collections come
    about 70 times less often; garbage cycles wait a little longer, which such a process can
    afford. Every server the package starts calls this once its app is loaded; a training
    process that steps hundreds of sub-envs may call it too (``openenv_gym.tune_gc()``; the
    rollout command does).
    """
    import gc

    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def tune_gc_for(sessions: int) -> bool:
    """:func:`tune_gc` for a process about to hold ``sessions`` sessions, if it holds at least
    :data:`TUNE_GC_AT` and its collector still runs on Python's default thresholds (a setting
    of the user's own is left alone); True if applied.

    With thousands of sessions the default collector walks every request in flight again every
    few hundred allocations, slowing resets and steps alike; a vector env that large is the
    process's main work, so it may decide for the process.
    """
    import gc

    if sessions < TUNE_GC_AT or gc.get_threshold() not in PYTHON_GC_THRESHOLDS:
        return False
    tune_gc()
    return True


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first, then the ppid)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def parents() -> dict[int, int]:
    """Every live (non-zombie) process and its parent: ``{pid: ppid}``."""
    table: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if entry.isdigit():
            fields = _stat(entry)
            if fields is not None and fields[0] not in ("Z", "X"):
                table[int(entry)] = int(fields[1])
    return table


def children(pid: int) -> list[int]:
    """Live child processes of ``pid``, whichever of its threads started them."""
    return [p for p, parent in parents().items() if parent == pid]


def descendants(pid: int | None = None) -> list[int]:
    """Live descendants of ``pid`` (default: this process), children first."""
    root = os.getpid() if pid is None else pid
    by_parent: dict[int, list[int]] = {}
    for p, parent in parents().items():
        by_parent.setdefault(parent, []).append(p)
    found: list[int] = []
    todo = list(by_parent.get(root, []))
    while todo:
        p = todo.pop(0)
        found.append(p)
        todo += by_parent.get(p, [])
    return found


def cmdline(pid: int) -> str:
    """The command line of ``pid``, arguments joined by spaces (``""`` if it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def wait_dead(pids: Iterable[int], timeout: float = 20.0) -> list[int]:
    """Wait up to ``timeout`` seconds for every pid to exit; the ones still alive (empty: all gone)."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left


def terminate(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM ``process`` (a server started for a test or benchmark), then SIGKILL it if it has
    not exited within ``timeout`` seconds; returns once it is reaped."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
