"""Facts and settings of processes: is a pid stopped, when did it start, die with the parent,
collect garbage less often.

The one copy of what every process the package starts needs (local servers, host processes, test
servers). It imports nothing but the standard library, so a server script that runs without
openenv_gym on its path loads this file by its path.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["proc_state", "is_stopped", "process_start_time", "die_with_parent", "tune_gc", "GC_THRESHOLDS",
           "ensure_open_files", "open_files_limit"]

_PR_SET_PDEATHSIG = 1


def proc_state(pid: int) -> str:
    """The kernel's state letter of ``pid`` (``R``, ``S``, ``T``, ``Z``...), ``"?"`` where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def is_stopped(pid: int) -> bool:
    """True while ``pid`` is stopped (SIGSTOP, a debugger): it answers nothing, and a SIGTERM
    would wait for a SIGCONT that may never come, so only a SIGKILL ends it."""
    return proc_state(pid) in ("T", "t")


def process_start_time(pid: int) -> str:
    """The kernel's start time of ``pid`` (``/proc/<pid>/stat`` field 22), ``"-"`` where unknown.

    A pid plus its start time names one process even after the pid is reused.
    """
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "-"


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


def ensure_open_files(needed: int, what: str) -> None:
    """Make sure this process may open ``needed`` files, raising its soft limit where the hard
    one allows (the processes it starts inherit the new limit); ``OSError`` naming the limit when
    the hard one is too low. ``what`` says who needs them, for that message.

    Sub-envs hold sockets (a connection each, more for servers and hosts): with the common soft
    limit of 1,024 or less, a large vector env otherwise fails part of its sub-envs with errors
    that never mention descriptors.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        raise OSError(24, f"{what} need about {needed} open files, and this process may open at most {hard} "
                          "(its hard limit, `ulimit -Hn`): raise that limit, or spread the sub-envs over "
                          "processes (python=, or backend='ray')")


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
