"""The serving page's commands run as written: each ``openenv-gym serve`` line of docs/serving.md's
first shell block starts, prints its URL, answers with the token, and stops on SIGTERM leaving
nothing. The one change: the port, replaced by a free one (the page's may be taken on a shared
machine)."""

from __future__ import annotations

import re
import shlex
import socket
from pathlib import Path

import httpx
import pytest
from serve_helpers import start_serve

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "serving.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_lines() -> list[list[str]]:
    block = re.search(r"```bash\n(.*?)```", PAGE.read_text(), re.S)[1]
    commands = []
    for line in block.splitlines():
        if line.startswith("openenv-gym serve "):
            args = shlex.split(line.split("&", 1)[0])[2:]
            commands.append([str(_free_port()) if prev == "--port" else a for prev, a in zip(["", *args], args)])
    return commands


@pytest.mark.needs("verifiers", "openenv")
def test_the_serving_page_commands_run_as_written(monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name files relative to the checkout
    commands = serve_lines()
    assert len(commands) >= 3 and any("--protocol" not in c for c in commands)
    served = []
    try:
        for args in commands:  # one by one: a command that fails to start still stops those before it
            served.append(start_serve(*args))
        for process, args in zip(served, commands):
            port = args[args.index("--port") + 1]
            assert process.url == f"http://127.0.0.1:{port}"
            assert httpx.get(f"{process.url}/health", headers=process.headers).status_code == 200
    finally:
        codes = [process.stop() for process in served]
    assert codes == [0] * len(served)
