"""Process facts read from ``/proc`` (Linux): who is alive, whose children, how much memory.

Tests and benchmarks check that nothing outlives an env (servers, actors, stray children) and
watch for leaks; this is the one place that reads the process table for them. A zombie counts
as dead: it has exited and only waits to be reaped. Elsewhere (no ``/proc``) every function
answers as if nothing were running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable

__all__ = ["alive", "parents", "children", "descendants", "cmdline", "rss_kib", "wait_dead", "terminate"]


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
