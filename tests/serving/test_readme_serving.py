"""The README's serving commands run as written: each ``openenv-gym serve`` line of its Serving
section starts, prints its URL, answers with the token, and stops on SIGTERM leaving nothing. The
one change: the port, replaced by a free one (the README's may be taken on a shared machine)."""

from __future__ import annotations

import re
import shlex
import socket
from pathlib import Path

import httpx
from serve_helpers import start_serve

README = Path(__file__).resolve().parents[2] / "README.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_lines() -> list[list[str]]:
    section = README.read_text().split("## Serving", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)[1]
    commands = []
    for line in block.splitlines():
        if line.startswith("openenv-gym serve "):
            args = shlex.split(line.split("&", 1)[0])[2:]
            commands.append([str(_free_port()) if prev == "--port" else a for prev, a in zip(["", *args], args)])
    return commands


def test_the_readme_serving_commands_run_as_written(monkeypatch):
    monkeypatch.chdir(README.parent)  # the commands name files relative to the checkout
    commands = serve_lines()
    assert len(commands) >= 3 and any("--protocol" not in c for c in commands)
    served = [start_serve(*args) for args in commands]
    try:
        for process, args in zip(served, commands):
            port = args[args.index("--port") + 1]
            assert process.url == f"http://127.0.0.1:{port}"
            assert httpx.get(f"{process.url}/health", headers=process.headers).status_code == 200
    finally:
        codes = [process.stop() for process in served]
    assert codes == [0] * len(served)
