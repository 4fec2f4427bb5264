"""A real two-node Ray cluster on this machine, for tests and benchmarks: ``ray start`` twice.

A head node and a worker node, each a ``ray start --block`` subprocess, so each has a PID to
stop. Each node has its own loopback address (127.0.0.2 and 127.0.0.3: Ray would turn 127.0.0.1
into the machine's network address for a multi-node cluster). The caller's ``env`` carries what
Ray must read at start (``RAY_AUTH_MODE=token`` and this run's ``RAY_AUTH_TOKEN``, so that no one
else on the machine can join or drive the cluster): :func:`cluster_env` builds it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from openenv_gym import processes

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
RAY = str(Path(sys.executable).with_name("ray"))


def cluster_env() -> dict[str, str]:
    """What a process that starts or joins the cluster needs in its environment: multi-node
    clusters allowed on this OS, no usage stats, and a token of this run's."""
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Cluster:
    """Start a head (``head_cpus``) and a worker node (``worker_cpus``, ``worker_resources``) joined
    by address; :meth:`stop` stops both by PID and returns the PIDs of theirs still alive.

    ``preexec_fn`` runs in each node's process before Ray does (a benchmark passes
    :func:`openenv_gym.processes.die_with_parent` so that nodes die with it).
    """

    def __init__(self, env: dict[str, str], *, head_cpus: int = 1, worker_cpus: int = 1,
                 worker_resources: str | None = None, preexec_fn: Callable[[], None] | None = None) -> None:
        self.env = env
        self.head: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.temp = tempfile.mkdtemp(prefix="rc-", dir="/tmp")  # Ray's socket paths must stay short
        self.port = _free_port(HEAD_IP)
        self.address = f"{HEAD_IP}:{self.port}"
        self._preexec_fn = preexec_fn
        try:
            self.head = self._start(
                [RAY, "start", "--head", f"--node-ip-address={HEAD_IP}", f"--port={self.port}",
                 "--include-dashboard=false", f"--temp-dir={self.temp}", f"--num-cpus={head_cpus}",
                 "--disable-usage-stats", "--block"])
            self.wait_nodes(1)
            extra = [f"--resources={worker_resources}"] if worker_resources else []
            self.worker = self._start(
                [RAY, "start", f"--address={self.address}", f"--node-ip-address={WORKER_IP}", *extra,
                 f"--num-cpus={worker_cpus}", "--disable-usage-stats", "--block"])
            self.wait_nodes(2)
        except BaseException:
            self.stop()
            raise

    def _start(self, argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=self._preexec_fn)

    def wait_nodes(self, n: int, timeout: float = 90.0) -> None:
        """Wait until the cluster shows ``n`` live nodes (asked from a fresh process each time:
        this one may not have joined, and must not join by accident)."""
        code = (f"import ray; ray.init(address={self.address!r}, log_to_driver=False); "
                "print(sum(1 for x in ray.nodes() if x['Alive'])); ray.shutdown()")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in (self.head, self.worker):
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"`ray start` exited with {p.returncode}")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=self.env, timeout=60)
            if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(n)]:
                return
            time.sleep(1.0)
        raise RuntimeError(f"the cluster did not show {n} live nodes within {timeout} s")

    def node_of(self, pid: int) -> str | None:
        """``"head"`` or ``"worker"``: the node whose process tree holds ``pid`` (None: neither)."""
        for name, p in (("worker", self.worker), ("head", self.head)):
            if p is not None and pid in processes.descendants(p.pid):
                return name
        return None

    def stop(self) -> list[int]:
        tree = [p.pid for p in (self.head, self.worker) if p is not None]
        tree += [c for pid in list(tree) for c in processes.descendants(pid)]
        for p in (self.worker, self.head):  # the worker first: it would keep calling a dead head
            if p is not None:
                processes.terminate(p, timeout=30)
        left = processes.wait_dead(tree, timeout=30)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.temp, ignore_errors=True)
        return left
