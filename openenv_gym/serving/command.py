"""``openenv-gym serve ID``: the command's arguments, and running it.

    openenv-gym serve ID [KEY=VALUE ...] [--protocol ors|openenv] [--host 127.0.0.1] [--port N | --uds PATH]
                      [--max-sessions N] [--workers K] [--backend concurrent|ray] [--address ADDR]
                      [--token TOKEN] [--session-idle-timeout S]

``KEY=VALUE`` are the env's kwargs, as for ``gym.make`` and ``openenv-gym play`` (right after the id).
"""

from __future__ import annotations

import argparse
from typing import TextIO

from openenv_gym.serving.limits import MAX_SESSIONS, PROTOCOLS, SESSION_IDLE_TIMEOUT, TOKEN_ENV

__all__ = ["add_arguments", "serve_command"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``serve`` command's arguments (after its ``id``)."""
    p.add_argument("kwargs", nargs="*", metavar="KEY=VALUE",
                   help="env kwargs for gym.make; a VALUE that parses as JSON is that value, else a string")
    p.add_argument("--protocol", choices=PROTOCOLS, default="ors", help="the protocol clients speak")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (any but loopback needs a token)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--port", type=int, default=0, help="TCP port (0: any free port; the URL is printed)")
    where.add_argument("--uds", default=None, metavar="PATH",
                       help="listen on a Unix socket instead (mode 0600: only your processes; no token)")
    p.add_argument("--max-sessions", type=int, default=MAX_SESSIONS,
                   help="sessions served at once; one more gets the protocol's capacity error")
    p.add_argument("--workers", type=int, default=None,
                   help="processes the sessions run in: Ray actors with --backend ray, else host processes "
                        "(default: Ray's default, or the server's own process)")
    p.add_argument("--backend", choices=("concurrent", "ray"), default="concurrent",
                   help="where sessions run: this process or host processes, or Ray actors")
    p.add_argument("--address", default=None, help="with --backend ray: the address of a Ray cluster to use")
    p.add_argument("--token", default=None,
                   help=f"the token clients must send (visible in the process list: prefer {TOKEN_ENV}); "
                        "default: a random one, printed once")
    p.add_argument("--session-idle-timeout", type=float, default=SESSION_IDLE_TIMEOUT,
                   help="seconds without a request after which a session is ended")


def serve_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run ``openenv-gym serve`` with parsed ``args``; returns the exit status."""
    from openenv_gym.serving.server import serve
    from openenv_gym.web.play import parse_kwargs  # the one reader of KEY=VALUE env kwargs

    return serve(args.id, out=out, protocol=args.protocol, host=args.host, port=args.port, uds=args.uds,
                 max_sessions=args.max_sessions, workers=args.workers, backend=args.backend,
                 address=args.address, token=args.token, session_idle_timeout=args.session_idle_timeout,
                 **parse_kwargs(args.kwargs))
