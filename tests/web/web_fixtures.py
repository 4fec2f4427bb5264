"""Fixtures for the page tests (imported by name: a ``conftest.py`` here would shadow the suite's
own, which other folders import as ``conftest``): real episode files, and a page's server running on a thread.

The rollout is a real grouped collection over the bundled Arithmetic env, played by the bundled
OpenAI-compatible stub with token ids and logprobs, which submits a wrong answer half the time
so groups have mixed rewards. The RecordEpisodes files come from the real wrapper, rotated.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import openenv_gym  # noqa: F401  (registers openenv/Arithmetic-v0)
from openenv_gym.policies import OpenAIPolicy
from openenv_gym.records import EpisodeRecord, encode_record
from openenv_gym.rollout import collect
from openenv_gym.runtime import Worker
from openenv_gym.testing.openai_stub import OpenAIStub, sometimes_wrong
from openenv_gym.web.serving import LoopbackServer, run
from openenv_gym.wrappers import RecordEpisodes

HOSTILE = ['<script>window.__pwned = "script"</script>', '<img src=x onerror="window.__pwned = \'img\'">',
           "</script><script>window.__pwned = 'close'</script>", "<!-- <script>window.__pwned = 'comment'</script>"]


def started_worker() -> Worker:
    """The play server's worker thread, started (as ``openenv-gym play`` starts it)."""
    worker = Worker("openenv-gym-play")
    worker.start()
    return worker


@pytest.fixture(scope="session")
def rollout_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 episodes in 8 groups of 4, with token ids and logprobs, some rewards 1 and some 0."""
    path = tmp_path_factory.mktemp("rollout") / "groups.jsonl"
    with OpenAIStub(sometimes_wrong()) as stub:
        policy = OpenAIPolicy(stub.url, "stub", token_ids=True)
        try:
            collect("openenv/Arithmetic-v0", 32, num_envs=8, group_size=4, policy=policy, out=path, progress=False)
        finally:
            policy.close()
    return path


@pytest.fixture(scope="session")
def recorded_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A RecordEpisodes file rotated at every record: ``episodes.jsonl`` (the newest episode) and
    ``.1`` ... ``.5`` (the oldest), one episode each, ``content`` naming its seed."""
    path = tmp_path_factory.mktemp("recorded") / "episodes.jsonl"
    env = RecordEpisodes(gym.make("openenv/Arithmetic-v0", max_turns=2), path, max_bytes=1)  # one record per file
    try:
        for seed in range(6):
            env.reset(seed=seed)
            done = False
            while not done:
                call = {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}}
                _, _, terminated, truncated, _ = env.step({"role": "assistant", "content": f"episode {seed}", "tool_calls": [call]})
                done = terminated or truncated
    finally:
        env.close()
    return path


def hostile_record() -> EpisodeRecord:
    """An episode whose every text tries to become markup or script."""
    calls = [{"id": "call_0", "type": "function",
              "function": {"name": "calculator", "arguments": json.dumps({"expression": HOSTILE[1]})}}]
    return EpisodeRecord(
        env="openenv/Arithmetic-v0", task_id="train/0", split="train", index=0,
        messages=[{"role": "user", "content": HOSTILE[0]},
                  {"role": "assistant", "content": HOSTILE[2], "tool_calls": calls},
                  {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": HOSTILE[3]}],
        rewards=[0.0], errors=[{"type": "<b>Bold</b>", "message": HOSTILE[1]}], terminated=True,
    )


@pytest.fixture
def hostile_texts() -> list[str]:
    return list(HOSTILE)


@pytest.fixture
def hostile_file(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(encode_record(hostile_record()))
    return path


class Served:
    """A page's :class:`LoopbackServer` run by :func:`~openenv_gym.web.serving.run` on a thread
    (its own event loop), as the command runs it; :meth:`stop` stops it as Ctrl-C would."""

    def __init__(self, server: LoopbackServer):
        self.server = server
        self.output = io.StringIO()
        self.url = ""
        self.exit: int | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, name="page-server", daemon=True)
        self.thread.start()
        if not self._ready.wait(60):
            raise RuntimeError(f"the page server did not start: {self.output.getvalue()}")

    def _run(self) -> None:
        async def ready(url: str) -> None:
            self._loop = asyncio.get_running_loop()
            self.url = url
            self._ready.set()

        try:
            self.exit = run(self.server, "test", self.output, ready=ready)
        finally:
            self._ready.set()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def token(self) -> str:
        return self.server.access.token

    def stop(self) -> None:
        if self._loop is not None and self.thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self.server.stopping.set)
            except RuntimeError:  # its loop already ended
                pass
        self.thread.join(60)
        assert not self.thread.is_alive(), "the page server did not stop"


@pytest.fixture
def serve() -> Iterator[Any]:
    """Start servers with ``serve(server)``; every one is stopped after the test."""
    started: list[Served] = []

    def start(server: LoopbackServer) -> Served:
        served = Served(server)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()
