"""The play server without a browser: its API over the real Arithmetic env, and its lifetime.

What a user relies on: an action gets the env's answer, its reward and the episode's end; a
slow step leaves the server answering (other actions are refused with 409 until it ends); a
saved episode is a record ``view`` reads; and however the server stops (Ctrl-C, SIGTERM, the
last page closed, even mid-step), the env is closed and no process it started is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import gymnasium as gym
import httpx
import pytest
from web_fixtures import serve, started_worker  # noqa: F401 (pytest fixtures, used by name)

from openenv_gym.errors import ConfigurationError
from openenv_gym.records import read_records
from openenv_gym.testing import procs
from openenv_gym.web.access import Access
from openenv_gym.web.play import PlaySession, make_app, parse_kwargs
from openenv_gym.web.rollouts import load
from openenv_gym.web.serving import LoopbackServer

SLOW = ["adapter=openenv_gym.testing.latency:LatencyAdapter", "sigma=0", "turns=50"]


def call(name: str, **args) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


@pytest.fixture
def arithmetic(serve, tmp_path: Path):
    env = gym.make("openenv/Arithmetic-v0")
    session = PlaySession(env, "openenv/Arithmetic-v0", tmp_path / "play.jsonl")
    session.reset(seed=3)
    served = serve(LoopbackServer(make_app(session, started_worker(), linger=60), Access()))
    client = httpx.Client(base_url=served.base, headers={"Authorization": f"token {served.token}"}, timeout=60)
    yield served, client, session
    client.close()


def test_calculator_then_the_right_answer_gives_reward_1_and_ends(arithmetic) -> None:
    served, client, session = arithmetic
    state = client.get("/api/state").json()
    assert state["env_id"] == "openenv/Arithmetic-v0" and state["record"]["seed"] == 3
    assert {s["name"]: s["num_tasks"] for s in state["splits"]} == {"train": 2000, "test": 500}
    assert [t["function"]["name"] for t in state["record"]["tools"]] == ["calculator", "submit"]
    question = state["record"]["messages"][0]["content"].split("Compute ", 1)[1].split(". ", 1)[0]
    state = client.post("/api/step", json={"action": call("calculator", expression=question)}).json()
    result = state["record"]["messages"][-1]
    assert result["role"] == "tool" and state["last"] == {"reward": 0.0, "terminated": False, "truncated": False, "error": None}
    state = client.post("/api/step", json={"action": call("submit", answer=result["content"])}).json()
    assert state["last"]["reward"] == 1.0 and state["record"]["terminated"] and state["record"]["total_reward"] == 1.0
    after = client.post("/api/step", json={"action": "more?"})
    assert after.status_code == 409 and "ended" in after.json()["error"]
    # Saved, it is a record `view` reads, and its actions replay the episode.
    assert client.post("/api/save", json={}).json()["saved"]["count"] == 1
    [record] = read_records(session.out)
    assert record.total_reward == 1.0 and record.terminated and len(record.actions()) == 2
    assert load([session.out]).columns["reward"] == [1.0]
    env = gym.make("openenv/Arithmetic-v0")
    try:
        env.reset(options=record.reset_options())
        rewards = [env.step(a)[1] for a in record.actions()]
    finally:
        env.close()
    assert rewards == record.rewards


def test_text_replies_bad_calls_and_tasks_by_split_and_index(arithmetic) -> None:
    served, client, _ = arithmetic
    state = client.post("/api/step", json={"action": "I think it is 4."}).json()
    assert state["record"]["messages"][-2] == {"role": "assistant", "content": "I think it is 4."}
    assert state["record"]["messages"][-1]["role"] == "user"  # the env says a tool call is needed
    state = client.post("/api/step", json={"action": call("nope")}).json()
    assert "nope" in state["record"]["messages"][-1]["content"] and not state["record"]["terminated"]
    state = client.post("/api/reset", json={"split": "test", "index": 7}).json()
    assert (state["record"]["split"], state["record"]["index"], len(state["record"]["messages"])) == ("test", 7, 1)
    a = client.post("/api/reset", json={"seed": 11}).json()["record"]
    b = client.post("/api/reset", json={"seed": 11}).json()["record"]
    assert (a["split"], a["index"]) == (b["split"], b["index"]) and a["seed"] == 11
    missing = client.post("/api/reset", json={"split": "test", "index": 10**6})
    assert missing.status_code == 400 and "TaskNotFound" in missing.json()["error"]
    assert missing.json()["problem"].startswith("TaskNotFound")
    assert client.post("/api/reset", json={}).status_code == 200  # a new episode clears the problem
    for body in ({"seed": "x"}, {"sed": 1}, {"action": 3}, {}, [1]):
        path = "/api/reset" if "seed" in str(body) or "sed" in str(body) else "/api/step"
        response = client.post(path, json=body)
        assert response.status_code == 400, body
        assert response.json()["error"].startswith("bad request")
    assert client.post("/api/step", content=b"{", headers={"Content-Type": "application/json"}).status_code == 400
    for deep in (b'{"action": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                 b'{"action": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}"):
        for path in ("/api/step", "/api/reset"):  # nested past any decoder: a JSON 400, as a bad field is
            response = client.post(path, content=deep, headers={"Content-Type": "application/json"})
            assert response.status_code == 400 and response.json()["error"].startswith("bad request"), response.text[:200]
    assert client.get("/api/state").status_code == 200


def test_a_slow_step_leaves_the_server_answering(serve, tmp_path: Path) -> None:
    """While a step takes 20 s, the state, the page and refusals of other actions all come back
    (each request finishing while the step is still running shows that none waited for it)."""
    env = gym.make("openenv/ORS-v0", **parse_kwargs(SLOW + ["median=20"]))
    session = PlaySession(env, "slow", tmp_path / "p.jsonl")
    session.reset(seed=0)
    served = serve(LoopbackServer(make_app(session, started_worker(), linger=60), Access()))
    client = httpx.Client(base_url=served.base, headers={"Authorization": f"token {served.token}"}, timeout=60)

    def step() -> None:
        try:
            client.post("/api/step", json={"action": call("wait")})
        except httpx.HTTPError:
            pass  # the server stops under it at the end of the test

    stepping = threading.Thread(target=step, daemon=True)
    stepping.start()
    try:
        deadline = time.monotonic() + 30
        while client.get("/api/state").json()["busy_for"] is None:
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
        refused = client.post("/api/step", json={"action": call("wait")})
        assert refused.status_code == 409 and "still answering" in refused.json()["error"]
        assert client.post("/api/reset", json={}).status_code == 409
        assert client.post("/api/save", json={}).status_code == 200  # the episode so far: no env call
        assert client.get("/").status_code == 200
        state = client.get("/api/state").json()
        assert state["busy_for"] is not None and state["record"]["rewards"] == []
        assert stepping.is_alive(), "the step ended before the other requests did: nothing was shown"
    finally:
        client.close()
    served.stop()  # mid-step: the env is closed all the same


def test_parse_kwargs() -> None:
    assert parse_kwargs(["max_turns=8", "source=./my_env", "isolate=true", 'secrets={"k": "v"}', "name="]) == \
        {"max_turns": 8, "source": "./my_env", "isolate": True, "secrets": {"k": "v"}, "name": ""}
    for bad in ("noequals", "=1", "a b=1"):
        with pytest.raises(ConfigurationError, match="KEY=VALUE"):
            parse_kwargs([bad])


# -- the command: its lifetime and what it leaves -------------------------------------------------


class Play:
    """``openenv-gym play`` in a subprocess of its own session; its URL read from its output."""

    def __init__(self, *args: str, cwd: Path):
        self.process = subprocess.Popen([sys.executable, "-m", "openenv_gym.cli", "play", *args], cwd=cwd,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         start_new_session=True)
        self.lines: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if "http://" in line:
                self.url = re.search(r"http://\S+", line).group(0)
                self.base = self.url.split("/?")[0]
                return
        self.process.kill()
        raise RuntimeError("".join(self.lines))

    def descendants(self) -> list[int]:
        return procs.descendants(self.process.pid)

    def wait(self, timeout: float = 30) -> tuple[int, str]:
        out, _ = self.process.communicate(timeout=timeout)
        return self.process.returncode, "".join(self.lines) + out

    def kill(self) -> None:
        """What a failed test left: the command and everything it started."""
        left = self.descendants()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def play_command():
    """Start ``openenv-gym play`` with ``play_command(*args, cwd=...)``; killed after the test if still there."""
    started: list[Play] = []

    def start(*args: str, cwd: Path) -> Play:
        started.append(Play(*args, cwd=cwd))
        return started[-1]

    yield start
    for play in started:
        play.kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_closes_the_env_and_leaves_no_process(play_command, tmp_path: Path, sig: signal.Signals) -> None:
    play = play_command("openenv/Arithmetic-v0", cwd=tmp_path)
    servers = play.descendants()
    assert servers, "the Arithmetic env runs a local ORS server"
    assert httpx.get(play.url, timeout=30, follow_redirects=True).status_code == 200
    play.process.send_signal(sig)
    code, out = play.wait()
    assert code == 0 and out.rstrip().endswith("stopped")
    assert procs.wait_dead(servers) == []


def test_closing_the_last_page_stops_the_server_and_the_env(play_command, tmp_path: Path) -> None:
    play = play_command("openenv/Arithmetic-v0", "--linger", "0.5", cwd=tmp_path)
    servers = play.descendants()

    async def visit() -> None:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(play.url.replace("/?", "/api/live?")) as ws:
                await asyncio.sleep(0.2)
                await ws.close()

    asyncio.run(visit())
    code, out = play.wait(timeout=30)
    assert code == 0 and "the last page was closed: stopping" in out
    assert procs.wait_dead(servers) == []


def test_ctrl_c_mid_step_stops_promptly(play_command, tmp_path: Path) -> None:
    play = play_command("openenv/ORS-v0", *SLOW, "median=60", cwd=tmp_path)
    token = play.url.split("token=")[1]

    def step() -> None:
        try:
            httpx.post(play.base + "/api/step", json={"action": call("wait")},
                       headers={"Authorization": f"token {token}"}, timeout=90)
        except httpx.HTTPError:
            pass  # the server stopped under it: that is the test

    stepping = threading.Thread(target=step, daemon=True)
    stepping.start()
    time.sleep(1.0)
    start = time.monotonic()
    play.process.send_signal(signal.SIGINT)
    code, out = play.wait(timeout=40)
    assert code == 0, out
    assert time.monotonic() - start < 35  # not the step's 60 s
    assert play.descendants() == []


def test_play_refuses_what_it_cannot_start(tmp_path: Path) -> None:
    from openenv_gym.cli import main

    assert main(["play", "openenv/Arithmetc-v0"]) == 2
    assert main(["play", "openenv/Arithmetic-v0", "no_such_kwarg=1"]) == 2
    assert main(["play", "openenv/Arithmetic-v0", "oops"]) == 2


ENVS = Path(__file__).resolve().parents[1] / "envs"


@pytest.mark.parametrize("kind", [pytest.param("verifiers", marks=pytest.mark.needs("verifiers")),
                                  pytest.param("openenv", marks=pytest.mark.needs("openenv"))])
def test_play_drives_other_kinds_through_the_same_api(serve, tmp_path: Path, kind: str) -> None:
    """A legacy Verifiers env (its own loop, driven from play's worker thread) and an OpenEnv env
    served from its folder: the same routes, the same record."""
    if kind == "verifiers":
        env_id, kwargs = "openenv/Verifiers-v0", {"source": str(ENVS / "verifiers_v0" / "vf_calc_tool.py")}
    else:
        env_id, kwargs = "openenv/OpenEnv-v0", {"source": str(ENVS / "openenv_echo_env")}
    env = gym.make(env_id, **kwargs)
    session = PlaySession(env, env_id, tmp_path / "p.jsonl")
    session.reset(seed=0)
    served = serve(LoopbackServer(make_app(session, started_worker(), linger=60), Access()))
    with httpx.Client(base_url=served.base, headers={"Authorization": f"token {served.token}"}, timeout=120) as client:
        state = client.post("/api/reset", json={"split": session.splits[0]["name"], "index": 0}).json()
        tools = [t["function"]["name"] for t in state["record"]["tools"]]
        if kind == "verifiers":
            assert "multiply" in tools and "12 * 13" in state["record"]["messages"][-1]["content"]
            state = client.post("/api/step", json={"action": call("multiply", a=12, b=13)}).json()
            assert state["record"]["messages"][-1]["content"] == "156"
            state = client.post("/api/step", json={"action": "156"}).json()
            assert state["record"]["terminated"] and state["record"]["total_reward"] == 1.0
        else:
            name = tools[0]
            schema = state["record"]["tools"][0]["function"]["parameters"]
            args = {key: "hello from play" for key in schema.get("required", [])}
            state = client.post("/api/step", json={"action": call(name, **args)}).json()
            assert "hello from play" in json.dumps(state["record"]["messages"][-1])
        assert client.post("/api/save", json={}).status_code == 200
    assert load([session.out]).columns["turns"] == [len(state["record"]["rewards"])]
