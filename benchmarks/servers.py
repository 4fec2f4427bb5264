"""Servers the benchmarks start themselves: a free loopback port, and waiting for ``/health``."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx

__all__ = ["free_port", "wait_healthy"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, what: str, timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    """``(proc, url)`` once ``url/health`` answers 200; kills ``proc`` and exits if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the {what} server did not start")
