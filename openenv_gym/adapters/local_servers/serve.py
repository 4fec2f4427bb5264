"""Serve one ORS environment class from a local source, privately (run as a script).

This file is executed by path in a child process, possibly under another interpreter (a venv
built from the source's own requirements), so it imports nothing from openenv_gym: only the
standard library, uvicorn and the SDK that the environment class is written against (and the
package's ``processes.py``, loaded by path as a file of its own).

What the child does, and why:

* **Listens privately.** ``--listen unix`` (the default) binds a Unix socket ``ors.sock`` inside
  ``--workdir``, a 0700 directory of the parent's user: no other user can connect, and nothing
  listens on a TCP port. ``--listen tcp`` binds 127.0.0.1 on a port the kernel picks (no race
  with a parent choosing a "free" port) for clients that cannot reach a socket file; every request
  must then carry ``Authorization: Bearer <token>``, the token coming from the environment
  variable ``OPENENV_GYM_ORS_TOKEN`` (never argv, which every local user can read in ``ps``).
  Either way the address is written atomically to ``<workdir>/address`` once the socket is bound.
* **Serves an ORS class or any ASGI app.** ``--module-file``/``--class`` serve an ORS class with
  its SDK's ``Server``; ``--app module:attr`` serves an app as it is (an OpenEnv environment's
  ``server.app:app``), imported with ``--root`` first on ``sys.path``.
* **Serves the protocol only.** FastAPI's ``/docs``, ``/redoc`` and ``/openapi.json`` are removed.
* **Runs asyncio's event loop for thousands of sessions** (``--loop asyncio``; uvicorn's default,
  uvloop where installed, otherwise): a server saturated by 8,192 sessions on uvloop left new
  connections in its accept queue for 30 s while it served the open ones (4,700 of 16,384
  sessions' first steps in a probe of ``benchmarks/scale.py``'s run); asyncio's loop answered them
  within 4 s, for about 11% more CPU per request, which a single env's steps feel.
* **Collects garbage less often, and makes less of it** (see ``tune_gc`` and ``lean_sse``): with
  many sessions in flight, Python's default thresholds cost the server half its throughput, and
  sse-starlette's cancelled helper tasks left a garbage cycle behind every tool call.
* **Keeps its log bounded.** The SDK's per-request log lines are turned off (log level WARNING
  unless the user set one) and everything written to stdout/stderr goes to
  ``<workdir>/server.log``, which is rotated to ``server.log.1`` at ``--log-max-bytes``: the two
  files never hold much more than twice that, however long the run.
* **Leaves nothing behind.** It asks the kernel to SIGTERM it when its parent dies
  (``PR_SET_PDEATHSIG``), and on SIGTERM/SIGINT, or when its parent is gone, it removes its own
  ``--workdir`` before exiting. After a crash it keeps the directory so that the parent can show the
  log; a parent that is itself gone by then leaves it to the next start's sweep of stale
  directories (``server.pid`` and the parent's ``owner`` file say whose it is).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import shutil
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any


# The process helpers' and the token guard's one copies, loaded by path: importing the package
# would run its `__init__` (Gymnasium, the catalog, entry points) in every local server for
# nothing, and run as a script the package may not be importable at all.
def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_openenv_gym_{name}", Path(__file__).resolve().parents[2] / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_processes, _tokens = _load("processes"), _load("tokens")
GC_THRESHOLDS, die_with_parent, is_stopped = _processes.GC_THRESHOLDS, _processes.die_with_parent, _processes.is_stopped
proc_state, process_start_time, tune_gc = _processes.proc_state, _processes.process_start_time, _processes.tune_gc

# Run by path, this file's folder lands first on sys.path, where a module of openenv_gym's could
# shadow a package of the same name that the env imports: take the folder out before anything loads.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != _HERE]

TOKEN_ENV = "OPENENV_GYM_ORS_TOKEN"
CAPACITY_FILE = "capacity"
"""Where the server writes the app's own session limit, when it can read one (before the address)."""
_HIDDEN_ROUTES = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


# -- bounded log ---------------------------------------------------------------------------------
class CappedLog(io.TextIOBase):
    """A text stream appending to a file that is rotated once it would pass ``max_bytes``.

    It writes to ``fd`` (the parent opened the log with ``O_APPEND`` and made it this process's
    stdout and stderr, so output from before this object existed, or from C code, lands in the
    same file). Rotation copies the file to ``<name>.1`` and truncates it in place, which every
    ``O_APPEND`` writer then follows. One write larger than the cap keeps only its tail.
    """

    def __init__(self, path: Path, max_bytes: int, fd: int):
        self.path, self.max_bytes, self._fd = path, max(1024, max_bytes), fd
        self._lock = threading.Lock()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "backslashreplace")
        if len(data) > self.max_bytes:
            data = b"[...]" + data[-(self.max_bytes - 5):]
        with self._lock:
            try:
                if os.fstat(self._fd).st_size + len(data) > self.max_bytes:
                    self._rotate()
                os.write(self._fd, data)
            except OSError:
                pass  # a full disk must not take the server down with it
        return len(text)

    def _rotate(self) -> None:
        with open(self.path, "rb") as fh:
            old = fh.read(self.max_bytes * 2)
        tmp = self.path.with_name(self.path.name + ".1.tmp")
        tmp.write_bytes(old)
        os.replace(tmp, self.path.with_name(self.path.name + ".1"))
        os.ftruncate(self._fd, 0)


def _capture_output(workdir: Path, max_bytes: int) -> None:
    """Send Python-level stdout/stderr (print, logging, tracebacks) through a :class:`CappedLog`."""
    log = CappedLog(workdir / "server.log", max_bytes, sys.stderr.fileno())
    sys.stdout = sys.stderr = log
    # The SDKs log every request at INFO: quiet by default, overridable by the user's own setting.
    for name in ("ORS_LOG_LEVEL", "OPENREWARD_LOG_LEVEL"):
        os.environ.setdefault(name, "WARNING")


# -- the app --------------------------------------------------------------------------------------
def _load_class(root: Path, module_file: str, class_name: str) -> type:
    parts = Path(module_file).with_suffix("").parts
    in_package = len(parts) > 1 and all(
        (root.joinpath(*parts[:i]) / "__init__.py").exists() for i in range(1, len(parts))
    )
    if in_package:  # import by dotted name so the package's relative imports work
        sys.path.insert(0, str(root))
        module = importlib.import_module(".".join(parts))
    else:  # a loose file: its siblings are importable by plain name, as when run as a script
        path = (root / module_file).resolve()
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(parts[-1], path)
        if spec is None or spec.loader is None:
            raise SystemExit(f"cannot load {module_file}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[parts[-1]] = module
        spec.loader.exec_module(module)
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise SystemExit(f"{module_file} defines no class {class_name!r}") from None


_TRUE = ("true", "1", "yes")
"""What OpenEnv's ``create_app`` reads as ``ENABLE_WEB_INTERFACE`` on."""


def _openenv_without_web_ui() -> None:
    """Import OpenEnv's server package without its Gradio web UI when the UI is off.

    ``openenv.core.env_server`` imports its web UI, and with it Gradio, on import (seconds of CPU
    per server process, most of a worker's start) and catches ``ModuleNotFoundError`` from it for
    installs without Gradio. With ``ENABLE_WEB_INTERFACE`` off the UI is never built, so Gradio
    is hidden for that one import (``None`` in ``sys.modules`` raises ``ModuleNotFoundError``)
    and restored after it: an env's own ``import gradio`` later imports it as usual.
    """
    if os.environ.get("ENABLE_WEB_INTERFACE", "false").lower() in _TRUE or "gradio" in sys.modules:
        return
    if importlib.util.find_spec("openenv") is None:
        return
    sys.modules["gradio"] = None  # type: ignore[assignment]
    try:
        importlib.import_module("openenv.core.env_server")
    except ImportError:
        pass  # an openenv without that package: the app's own import says what is missing
    finally:
        if sys.modules.get("gradio", False) is None:
            del sys.modules["gradio"]


def _load_app(root: Path, spec: str) -> Any:
    """The ASGI app ``module:attr`` names, imported with ``root`` first on ``sys.path``."""
    module_name, _, attr = spec.partition(":")
    sys.path.insert(0, str(root))
    _openenv_without_web_ui()
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr or "app")
    except AttributeError:
        raise SystemExit(f"{module_name} defines no {attr or 'app'!r}") from None


def _server_class(env_cls: type) -> type:
    if any(base.__module__.startswith("openreward") for base in env_cls.__mro__):
        from openreward.environments import Server
    else:
        from ors import Server
    return Server


def hide_docs(app: Any) -> None:
    """Remove FastAPI's interactive docs and schema routes: the server exists for the protocol.

    An app without a router (a plain ASGI function) serves no such routes and is left as it is.
    """
    if getattr(app, "router", None) is None:
        return
    app.openapi_url = app.docs_url = app.redoc_url = app.swagger_ui_oauth2_redirect_url = None
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in _HIDDEN_ROUTES]


def app_capacity(app: Any) -> int | None:
    """The session limit an OpenEnv app was built with (``create_app(max_concurrent_envs=...)``).

    OpenEnv's server object (``HTTPEnvServer``, whose public ``max_concurrent_envs`` is the
    limit) is not reachable from the app, but every route it registers is a function closing
    over it: the one such object found among the routes' closures is the answer. ``None`` for
    any other app (an ORS server, a custom FastAPI app), or when several are found.
    """
    router = getattr(app, "router", None)
    found: set[int] = set()
    for route in getattr(router, "routes", None) or ():
        for cell in getattr(getattr(route, "endpoint", None), "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            limit = getattr(value, "max_concurrent_envs", None) if type(value).__name__ == "HTTPEnvServer" else None
            if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
                found.add(limit)
    return found.pop() if len(found) == 1 else None


def _bind(listen: str, workdir: Path) -> tuple[socket.socket, str]:
    if listen == "unix":
        path = workdir / "ors.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket file is born 0600 (the 0700 folder already guards it)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        return sock, f"unix:{path}"
    # proto must be IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets, and without it
    # Nagle's algorithm meets delayed ACKs and every response waits ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- main -----------------------------------------------------------------------------------------
class _Stop(SystemExit):
    """Raised by the SIGTERM handler so that ``finally`` blocks (and the workdir cleanup) run."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="folder the module path is relative to")
    parser.add_argument("--module-file")
    parser.add_argument("--class", dest="classes", help="comma-separated names")
    parser.add_argument("--app", help="serve this ASGI app ('module:attr', importable from --root) "
                                      "instead of an ORS class (OpenEnv environments)")
    parser.add_argument("--workdir", required=True, help="private 0700 folder: socket, address, log")
    parser.add_argument("--listen", choices=("unix", "tcp"), default="unix")
    parser.add_argument("--loop", choices=("auto", "asyncio"), default="auto", help="uvicorn's event loop")
    parser.add_argument("--log-max-bytes", type=int, default=1 << 20)
    parser.add_argument("--parent-pid", type=int, default=os.getppid())
    args = parser.parse_args(argv)
    if not args.app and not (args.module_file and args.classes):
        parser.error("give --app, or --module-file and --class")
    workdir = Path(args.workdir)
    token = os.environ.pop(TOKEN_ENV, "")  # popped: the env's own subprocesses never inherit it
    if args.listen == "tcp" and not token:
        raise SystemExit(f"--listen tcp needs a token in ${TOKEN_ENV}")

    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        raise _Stop(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        _capture_output(workdir, args.log_max_bytes)
        die_with_parent(args.parent_pid)
        _write_atomically(workdir / "server.pid", f"{os.getpid()} {process_start_time(os.getpid())}\n")
        _serve(args, workdir, token)
    except KeyboardInterrupt:
        stopping = True
    finally:
        if stopping or os.getppid() != args.parent_pid:
            shutil.rmtree(workdir, ignore_errors=True)


def _serve(args: argparse.Namespace, workdir: Path, token: str) -> None:
    os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
    import uvicorn

    root = Path(args.root)
    if args.app:
        app = _load_app(root, args.app)
    else:
        env_classes = [_load_class(root, args.module_file, c) for c in args.classes.split(",")]
        app = _server_class(env_classes[0])(env_classes).app
    hide_docs(app)
    served = _tokens.Guard(token).asgi(app) if args.listen == "tcp" else app

    capacity = app_capacity(app)
    if capacity is not None:
        _write_atomically(workdir / CAPACITY_FILE, str(capacity))
    sock, address = _bind(args.listen, workdir)
    _write_atomically(workdir / "address", address)
    config = uvicorn.Config(
        served, timeout_keep_alive=60, access_log=False, log_level="warning", backlog=4096,
        timeout_graceful_shutdown=2, loop=args.loop,
        # Private servers: no proxy in front to trust headers from, and nobody reads these headers
        # (each costs every request a little; at 16,384 sessions the servers are the bottleneck).
        proxy_headers=False, server_header=False, date_header=False,
    )
    lean_sse()
    tune_gc()
    uvicorn.Server(config).run(sockets=[sock])


def lean_sse() -> bool:
    """Stream SSE responses without leaving garbage cycles behind; True if applied.

    sse-starlette answers each SSE request (every ORS tool call and session start) with four
    anyio tasks: the stream, a keep-alive ping, a shutdown listener and a disconnect listener.
    When the stream ends, the ping and the shutdown listener are cancelled, and anyio's task-done
    callback keeps the ``CancelledError`` in a local of the frame its traceback holds: a cycle
    that holds the whole response (about a hundred objects a call) until the garbage collector
    finds it. Those cycles were most of this server's collection work, and with many sessions in
    flight each collection also walks every live request (benchmarks/vector.py, "collapse").

    This runs the same coroutines of the library's (its stream, ping, shutdown and disconnect
    handling are unchanged) as plain asyncio tasks; the first to end ends the others, as the
    task group did, and an exception of any of them is raised as it is. A cancelled asyncio task
    makes no cycle. Applied to sse-starlette 2.x and 3.x, whose private methods these are
    (another major version is left as it is); what only the library handles (a HEAD request,
    a websocket scope, a ``data_sender_callable``) keeps the library's own path.
    """
    try:
        from importlib.metadata import version

        from sse_starlette.sse import EventSourceResponse
    except ImportError:
        return False
    try:
        major = int(version("sse-starlette").split(".")[0])
    except Exception:  # noqa: BLE001 - no metadata: an unknown version
        return False
    parts = ("_stream_response", "_ping", "_listen_for_exit_signal", "_listen_for_disconnect")
    if major not in (2, 3) or not all(hasattr(EventSourceResponse, p) for p in parts):
        return False
    if getattr(EventSourceResponse.__call__, "lean", False):
        return True
    import asyncio

    library_call = EventSourceResponse.__call__

    async def __call__(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if (self.data_sender_callable is not None or scope.get("type") != "http"
                or str(scope.get("method", "")).upper() == "HEAD"):
            return await library_call(self, scope, receive, send)
        # 3.x: shutdown with a grace period, and no pings at interval 0 (2.x pings regardless)
        exit_listener = getattr(self, "_listen_for_exit_signal_with_grace", None) or self._listen_for_exit_signal
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._stream_response(send)), loop.create_task(exit_listener()),
                 loop.create_task(self._listen_for_disconnect(receive))]
        if major == 2 or self._ping_interval > 0:
            tasks.append(loop.create_task(self._ping(send)))
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if self.background is not None:
            await self.background()

    __call__.lean = True  # type: ignore[attr-defined]
    EventSourceResponse.__call__ = __call__  # type: ignore[method-assign]
    return True


if __name__ == "__main__":
    main()
