"""Serve one ORS environment class from a local source on 127.0.0.1 (run as a script).

This file is executed by path in a child process, possibly under another interpreter (a venv
built from the source's own requirements), so it imports nothing from openenv_gym: only the
standard library, uvicorn and the SDK that the environment class is written against.

It binds port 0 itself and reports the port it got through ``--port-file`` (written atomically),
which avoids the race of a parent choosing a "free" port that someone else takes first. It asks
the kernel to end it when its parent dies, so a crashed trainer leaves no server behind.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import signal
import socket
import sys
from pathlib import Path

# Run by path, this file's folder lands first on sys.path, and openenv_gym's own adapters/ors.py
# would then shadow the ors-sdk package: take the folder out before anything imports `ors`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != _HERE]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux ``PR_SET_PDEATHSIG``).

    The one copy of this for every server the package starts (this file must stay importable
    without openenv_gym, since it may run under another interpreter, so it lives here).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's atexit hook still stops us
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(1)


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


def _server_class(env_cls: type) -> type:
    if any(base.__module__.startswith("openreward") for base in env_cls.__mro__):
        from openreward.environments import Server
    else:
        from ors import Server
    return Server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", required=True, help="folder the module path is relative to")
    parser.add_argument("--module-file", required=True)
    parser.add_argument("--class", dest="classes", required=True, help="comma-separated names")
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--parent-pid", type=int, default=os.getppid())
    args = parser.parse_args(argv)

    die_with_parent(args.parent_pid)
    os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
    import uvicorn

    root = Path(args.root)
    env_classes = [_load_class(root, args.module_file, c) for c in args.classes.split(",")]
    app = _server_class(env_classes[0])(env_classes).app

    # proto must be IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets, and without it
    # Nagle's algorithm meets delayed ACKs and every response waits ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    tmp = f"{args.port_file}.tmp"
    with open(tmp, "w") as fh:
        fh.write(str(port))
    os.replace(tmp, args.port_file)

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, timeout_keep_alive=60, access_log=False,
        log_level="warning", backlog=4096,
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
