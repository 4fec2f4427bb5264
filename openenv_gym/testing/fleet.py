"""A Fleet-compatible server on 127.0.0.1 for offline tests, with fault injection and a request log.

fleet-python can be pointed at any base URL, and every per-instance URL it uses comes from the
create response, so one local process can stand in for Fleet's orchestrator, its instance
managers and its MCP endpoints (docs/backends.md, "Fleet"). :class:`FleetTestServer` starts
that process (:mod:`openenv_gym.testing.fleet_server`), waits until it answers, and drives it
through ``/_test/...`` control endpoints::

    from openenv_gym.testing.fleet import FleetTestServer, EXAMPLE_TASKS

    with FleetTestServer(api_key="test-key") as srv:
        fleet = Fleet(api_key=srv.api_key, base_url=srv.url)
        env = fleet.make("issues:1.0.0", data_key="seed:1.0")
        ...
        srv.inject(503, r"^/v1/env/instances$", method="POST", times=2)
        assert all("test-key" not in str(r) for r in srv.requests())

The server is a subprocess rather than a thread so that tests exercise real sockets, a killed
server really disappears, and the SDK's event loops never share one with the server. The child
asks the kernel to terminate it when its parent dies (``PR_SET_PDEATHSIG``); that signal is tied
to the *thread* that started it, so call :meth:`FleetTestServer.start` from a thread that lives
as long as the server (the main thread, a pytest fixture).

The API key reaches the server in the environment variable ``FLEET_TEST_SERVER_API_KEY``, never
on its command line, where any local user could read it (``ps``).

``python -m openenv_gym.testing.fleet --port 8123`` runs the same server in the foreground (its
key, too, comes from ``FLEET_TEST_SERVER_API_KEY``, default ``test-key``).

:data:`EXAMPLE_TASKS` are Fleet task dicts for the server's ``issues`` environment, in the JSON
shape ``Fleet.load_tasks_from_file`` reads, plus ``split`` and ``task_modality`` keys (defined in
:mod:`openenv_gym.testing.fleet_common`, which the server imports too).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from openenv_gym.testing.fleet_common import (
    API_KEY_ENV,
    DEFAULT_API_KEY,
    EXAMPLE_TASKS,
    take_api_key,
    write_example_tasks,
)

__all__ = ["EXAMPLE_TASKS", "FleetTestServer", "write_example_tasks"]

# --------------------------------------------------------------------------- launcher

# Strong references: a server nobody stopped still gets stopped at interpreter exit.
_running: set[FleetTestServer] = set()


def _stop_all() -> None:
    for server in list(_running):
        server.stop()


atexit.register(_stop_all)


class FleetTestServer:
    """One Fleet-compatible server subprocess on 127.0.0.1.

    ``mcp_mode`` is ``"stateful"`` (SSE responses, ``mcp-session-id``) or ``"stateless"`` (JSON
    responses, no sessions). With ``require_runner_token`` the instance-manager routes answer 404
    unless ``X-Runner-Token`` carries the token from ``GET /v1/runner-auth/token`` (the SDK
    fetches it by itself). ``create_delay`` makes every create take that many seconds.
    """

    def __init__(
        self,
        api_key: str = DEFAULT_API_KEY,
        mcp_mode: str = "stateful",
        require_runner_token: bool = False,
        create_delay: float = 0.0,
        *,
        startup_timeout: float = 30.0,
        stop_grace: float = 5.0,
    ):
        if mcp_mode not in ("stateful", "stateless"):
            raise ValueError(f"mcp_mode must be 'stateful' or 'stateless', not {mcp_mode!r}")
        self.api_key = api_key
        self.mcp_mode = mcp_mode
        self.require_runner_token = require_runner_token
        self.create_delay = create_delay
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self._process: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self._workdir: Path | None = None
        self._url: str | None = None
        self._client: httpx.Client | None = None

    # ---- lifecycle

    @property
    def url(self) -> str:
        """The fleet-python ``base_url``: ``http://127.0.0.1:PORT``, no trailing slash."""
        if self._url is None:
            raise RuntimeError("FleetTestServer is not started")
        return self._url

    @property
    def pid(self) -> int | None:
        """The server's PID (kept after :meth:`stop`, so tests can check that it is gone)."""
        return self._pid

    @property
    def log_path(self) -> Path:
        """The JSONL request log (removed by :meth:`stop`)."""
        if self._workdir is None:
            raise RuntimeError("FleetTestServer is not started")
        return self._workdir / "requests.jsonl"

    @property
    def output_path(self) -> Path:
        """The server process's stdout and stderr (its warnings and errors; removed by :meth:`stop`)."""
        if self._workdir is None:
            raise RuntimeError("FleetTestServer is not started")
        return self._workdir / "server.log"

    def start(self) -> FleetTestServer:
        """Spawn the server and wait until it answers; returns ``self``."""
        if self._process is not None:
            return self
        self._workdir = Path(tempfile.mkdtemp(prefix="fleet-test-server-"))
        port_file = self._workdir / "port"
        cmd = [
            sys.executable, "-m", "openenv_gym.testing.fleet_server",
            "--port", "0", "--port-file", str(port_file), "--log-file", str(self.log_path),
            "--state-dir", str(self._workdir / "state"), "--mcp-mode", self.mcp_mode,
            "--create-delay", str(self.create_delay), "--parent-pid", str(os.getpid()),
            "--remove-on-exit", str(self._workdir),
        ]
        if self.require_runner_token:
            cmd.append("--require-runner-token")
        # The key goes through the environment, not argv, where `ps` would show it.
        env = {**os.environ, API_KEY_ENV: self.api_key}
        # `-m` puts the working directory first on sys.path, where a stray fleet.py or mcp/ would
        # shadow the real packages: run in the (empty) work dir and find this package explicitly.
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        with open(self.output_path, "wb") as log:
            self._process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=self._workdir
            )
        self._pid = self._process.pid
        _running.add(self)
        try:
            self._wait_ready(port_file)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, port_file: Path) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"Fleet test server exited with {self._process.returncode}:\n{self._log_tail()}"
                )
            if self._url is None and port_file.exists():
                self._url = f"http://127.0.0.1:{port_file.read_text().strip()}"
                self._client = httpx.Client(
                    base_url=self._url, headers={"Authorization": f"Bearer {self.api_key}"}, timeout=10.0
                )
            if self._client is not None:
                try:
                    if self._client.get("/_test/health", timeout=1.0).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"Fleet test server not ready within {self.startup_timeout} s:\n{self._log_tail()}")

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.output_path.read_text(errors="replace") if self._workdir else ""
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_grace`` seconds; reap; remove temp dirs. Idempotent."""
        if self._client is not None:
            self._client.close()
            self._client = None
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
                try:
                    process.wait(self.stop_grace)
                except subprocess.TimeoutExpired:
                    os.kill(process.pid, signal.SIGKILL)
                    process.wait(self.stop_grace)
            _running.discard(self)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self._url = None

    def __enter__(self) -> FleetTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"FleetTestServer(url={self._url!r}, pid={self.pid}, mcp_mode={self.mcp_mode!r})"

    # ---- inspection and control

    def _control(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        if self._client is None:
            raise RuntimeError("FleetTestServer is not started")
        response = self._client.request(method, path, json=body)
        response.raise_for_status()
        return response.json()

    def requests(self) -> list[dict[str, Any]]:
        """Every logged request, oldest first.

        Each is ``{"method", "path", "query", "status", "request_id" (X-Request-ID), "json"
        (the body if it was JSON, else None), "runner_token_sent" (bool), "time"}``; injected
        faults also carry ``"injected": True`` (and ``"lost_status"`` for a lost response).
        Header values are never logged. ``/_test`` control calls are not logged.
        """
        try:
            lines = self.log_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being written right now
                continue
        return out

    def instances(self) -> list[dict[str, Any]]:
        """Every instance ever created: ``{"instance_id", "env_key", "version", "status"
        ("pending" | "running" | "stopped"), "image_type", "data_key", "data_version", "run_id",
        "request_id", "stop_reason", "heartbeats", "resets", ...}``."""
        return self._control("GET", "/_test/instances")

    def inject(
        self,
        status: int,
        path: str,
        method: str | None = None,
        times: int = 1,
        detail: str | dict[str, Any] | None = None,
    ) -> None:
        """Answer the next ``times`` requests whose path matches the regex ``path`` (``re.search``:
        anchor it, ``^/v1/env/instances$``, for one exact route) and ``method``, if given, with
        ``status`` and ``{"detail": detail}``, without running them. Rules are tried in the order
        they were added. ``times=0`` cancels what is still pending for the same ``path`` pattern
        (and ``method``, if given)."""
        self._control("POST", "/_test/inject", {
            "status": status, "path": path, "method": method, "times": times, "detail": detail,
        })

    def inject_lost_response(
        self, path: str = "^/v1/env/instances$", times: int = 1, method: str | None = "POST", status: int = 503
    ) -> None:
        """Perform the next matching request(s) (regex as in :meth:`inject`; the default is the
        create) but answer ``status`` (503) instead, as if the response were lost on the way back.
        For a create, the SDK's transport retry then re-sends the same X-Request-ID, gets 409
        ``duplicate_request_id`` and recovers the instance by polling it."""
        self._control("POST", "/_test/inject", {
            "status": status, "path": path, "method": method, "times": times, "lost": True,
        })

    def clear_faults(self) -> None:
        """Forget every pending injected fault."""
        self._control("POST", "/_test/clear-faults")

    def set_create_delay(self, seconds: float) -> None:
        """Make every later create take ``seconds`` before it answers."""
        self.create_delay = seconds
        self._control("POST", "/_test/config", {"create_delay": seconds})

    def drop_mcp_sessions(self) -> int:
        """Forget all MCP sessions (stateful mode): a request with an old session id gets 404,
        so a client must reconnect. Returns how many sessions were dropped."""
        return int(self._control("POST", "/_test/drop-mcp-sessions")["dropped"])


# --------------------------------------------------------------------------- foreground CLI


def main(argv: list[str] | None = None) -> None:
    """``python -m openenv_gym.testing.fleet``: run the server in the foreground.

    The API key comes from ``FLEET_TEST_SERVER_API_KEY`` (default ``test-key``), not from argv.
    """
    parser = argparse.ArgumentParser(
        description="Run a Fleet-compatible test server on 127.0.0.1.",
        epilog=f"The API key is read from ${API_KEY_ENV} (default {DEFAULT_API_KEY!r}), never from argv.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=8123, help="0 picks a free port")
    parser.add_argument("--mcp-mode", choices=["stateful", "stateless"], default="stateful")
    parser.add_argument("--require-runner-token", action="store_true")
    parser.add_argument("--create-delay", type=float, default=0.0)
    parser.add_argument("--log-file", type=Path, help="append a JSONL request log here")
    parser.add_argument("--write-tasks", type=Path, help="also write EXAMPLE_TASKS to this JSON file")
    args = parser.parse_args(argv)
    api_key = take_api_key()

    from openenv_gym.testing import fleet_server

    if args.write_tasks:
        write_example_tasks(args.write_tasks)

    def ready(port: int, state: Any) -> None:
        url = f"http://127.0.0.1:{port}"
        print(f"Fleet test server on {url} (MCP {args.mcp_mode}, mcp {fleet_server.MCP_MAJOR}.x)")
        print(f"  export FLEET_BASE_URL={url}")
        print(f"  export FLEET_API_KEY={api_key}")
        print('  environment "issues" (versions 1.0.0, 1.1.0), data "seed:1.0"')
        if args.write_tasks:
            print(f"  tasks written to {args.write_tasks}")
        print("Ctrl-C to stop.", flush=True)

    fleet_server.serve(
        fleet_server.ServerOptions(
            api_key=api_key, port=args.port, mcp_mode=args.mcp_mode,
            require_runner_token=args.require_runner_token, create_delay=args.create_delay,
            log_file=args.log_file,
        ),
        on_ready=ready,
    )


if __name__ == "__main__":
    main()
