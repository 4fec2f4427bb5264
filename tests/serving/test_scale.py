"""Where served sessions run: many at once over one server, in host processes (``--workers``, an
id imported isolated), in Ray actors (``--backend ray``); nothing is left when the server stops."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import httpx
import pytest
from serve_helpers import ARITHMETIC, ENVS, expression, serve_process, start_serve  # noqa: F401 (a fixture)

import openenv_gym  # noqa: F401
from openenv_gym.testing import procs


async def _episodes(url: str, headers: dict, count: int) -> list[float]:
    """``count`` Arithmetic episodes at once through the async ors-sdk client: their rewards."""
    from ors.client import AsyncORS

    client = AsyncORS(base_url=url, api_key=headers["Authorization"].split()[1])
    env = client.environment("arithmetic")

    async def play(index: int) -> float:
        async with env.session(split="train", index=index) as session:
            prompt = (await session.get_prompt())[0].text
            value = (await session.call_tool("calculator", {"expression": expression(prompt)})).blocks[0].text
            return (await session.call_tool("submit", {"answer": value})).reward

    return list(await asyncio.gather(*(play(i) for i in range(count))))


def _hosts(pid: int) -> list[int]:
    return [p for p in procs.descendants(pid) if "openenv_gym.hosts.server" in procs.cmdline(p)]


def test_64_sessions_at_once_over_one_server(serve_process):
    served = serve_process(ARITHMETIC, "--max-sessions", "64")
    assert asyncio.run(_episodes(served.url, served.headers, 64)) == [1.0] * 64
    assert served.stop() == 0


def test_workers_run_the_sessions_in_host_processes(serve_process):
    served = serve_process(ARITHMETIC, "--workers", "2", "--max-sessions", "8")
    hosts = _hosts(served.pid)
    assert len(hosts) == 2 and all(procs.cmdline(h).split()[0] == sys.executable for h in hosts)
    assert asyncio.run(_episodes(served.url, served.headers, 8)) == [1.0] * 8
    assert served.stop() == 0  # the hosts and their env servers included


def test_an_id_imported_isolated_is_served_from_its_host(tmp_path):
    """An isolated import plays in a host process under its own interpreter; served, it is the same
    (``python=`` names the interpreter here, so no venv is built: tests/isolation builds real ones)."""
    from openenv_gym.cli import main

    catalog = tmp_path / "catalog.json"
    env = {"OPENENV_GYM_CATALOG": str(catalog), "OPENENV_GYM_DATA": str(tmp_path / "data")}
    os.environ.update(env)
    try:
        assert main(["import", str(ENVS / "ors_probe.py"), "--name", "IsoServed", "--env-class", "Probe", "--isolated",
                     "--no-build"]) == 0
    finally:
        for key in env:
            os.environ.pop(key)
    served = start_serve("openenv/IsoServed-v0", f"python={sys.executable}", "--max-sessions", "2", env=env)
    try:
        assert len(_hosts(served.pid)) == 1
        sid = uuid.uuid4().hex
        headers = {**served.headers, "X-Session-ID": sid}
        assert httpx.post(f"{served.url}/create", json={"split": "train", "index": 1}, headers=headers).status_code == 200
        assert httpx.get(f"{served.url}/isoserved/prompt", headers=headers).json()[0]["text"] == "What is 3+3?"
    finally:
        assert served.stop() == 0


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_ray_backend_runs_the_sessions_in_ray_actors(serve_process):
    pytest.importorskip("ray")
    served = serve_process(ARITHMETIC, "--backend", "ray", "--workers", "2", "--max-sessions", "8")
    actors = [p for p in procs.descendants(served.pid) if procs.cmdline(p).startswith("ray::")]
    assert len([a for a in actors if "Shard" in procs.cmdline(a)]) == 2, [procs.cmdline(a)[:80] for a in actors]
    assert asyncio.run(_episodes(served.url, served.headers, 8)) == [1.0] * 8
    assert served.stop() == 0  # Ray's processes included: the server started the local cluster
