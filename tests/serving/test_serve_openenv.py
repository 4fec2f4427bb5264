"""A served env over OpenEnv's protocol, driven by OpenEnv 0.10's own clients (``MCPToolClient``
in its default production mode, ``GenericEnvClient``) and by raw WebSockets, compared step by step
with ``gym.make`` of the same id."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import httpx
import pytest
from serve_helpers import ARITHMETIC, ECHO, call, expression, serve_process, start_serve  # noqa: F401 (a fixture)

import openenv_gym  # noqa: F401
from openenv_gym.testing import procs

pytest.importorskip("openenv")


@pytest.fixture(scope="module")
def arith():
    served = start_serve(ARITHMETIC, "--protocol", "openenv", "--max-sessions", "6")
    yield served
    assert served.stop() == 0


@pytest.fixture(scope="module")
def reference():
    env = gym.make(ARITHMETIC)
    yield env
    env.close()


def test_mcp_tool_client_lists_calls_and_gets_rewards_as_gym_make_does(arith, reference):
    from openenv.core.env_server.mcp_types import CallToolAction, ToolErrorType
    from openenv.core.mcp_client import MCPToolClient

    async def play(index: int) -> None:
        obs, _ = reference.reset(options={"split": "train", "index": index})
        async with MCPToolClient(base_url=arith.url, headers=arith.headers) as env:
            opening = await env.reset(split="train", index=index)
            assert opening.observation.metadata["prompt"] == obs
            assert not opening.done
            assert [t.name for t in await env.list_tools()] == ["calculator", "submit"]
            action = {"expression": expression(obs[0]["content"])}
            said, reward, terminated, _, _ = reference.step(call("calculator", action))
            result = await env.step(CallToolAction(tool_name="calculator", arguments=action))
            assert result.observation.result["data"] == said[0]["content"]
            assert (result.reward, result.done) == (reward, terminated)
            # call_tool goes over HTTP /mcp to the same session: the episode moves on there too.
            said, reward, *_ = reference.step(call("calculator", {"expression": "6*7"}))
            out = await env.call_tool("calculator", expression="6*7")
            assert out == said[0]["content"] == "42"  # the tool's result, as from OpenEnv's own server
            said, *_ = reference.step(call("nope"))
            refused = await env.step(CallToolAction(tool_name="nope", arguments={}))
            assert refused.observation.error.error_type is ToolErrorType.TOOL_NOT_FOUND
            assert refused.observation.error.message == said[0]["content"]
            answer = reference.unwrapped.task("train", index)["answer"]
            said, reward, terminated, _, _ = reference.step(call("submit", {"answer": answer}))
            final = await env.step(CallToolAction(tool_name="submit", arguments={"answer": answer}))
            assert (final.reward, final.done, reward, terminated) == (1.0, True, 1.0, True)
            assert (await env.state()).step_count == 4

    for index in (2, 1500):
        asyncio.run(play(index))


def test_generic_client_resets_by_seed_as_gym_make_does(arith, reference):
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=arith.url, headers=arith.headers) as env:
        for seed in (0, 11, 12):
            obs, info = reference.reset(seed=seed)
            opening = env.reset(seed=seed)
            meta = opening.observation["metadata"]
            assert meta["prompt"] == obs and (meta["split"], meta["index"]) == (info["split"], info["index"])
            assert [t["name"] for t in meta["tools"]] == ["calculator", "submit"]
            # What the client learns of the task: never its spec (which holds the answer).
            assert set(meta) == {"prompt", "tools", "task_id", "split", "index", "episode_id"}
            wrong = {"answer": "-1"}
            _, reward, terminated, _, _ = reference.step(call("submit", wrong))
            result = env.step({"type": "call_tool", "tool_name": "submit", "arguments": wrong})
            assert (result.reward, result.done) == (reward, terminated) == (0.0, True)
            assert result.observation["metadata"] == {"turn": 1, "terminated": True, "truncated": False}
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.reset(split="train", index=10**6)
        env.reset(seed=1)  # the session goes on after a refused reset


def test_capacity_reached_is_openenvs_error(serve_process):
    from openenv.core.generic_client import GenericEnvClient

    served = serve_process(ARITHMETIC, "--protocol", "openenv", "--max-sessions", "1")
    first = GenericEnvClient(base_url=served.url, headers=served.headers)
    second = GenericEnvClient(base_url=served.url, headers=served.headers)
    try:
        first.reset(seed=0)
        with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
            second.reset(seed=0)
        first.close()  # its session ends with its socket: the next client gets the slot
        assert second.reset(seed=0).done is False
    finally:
        first.close()
        second.close()
    assert served.stop() == 0


def test_malformed_messages_are_errors_the_client_reads(arith):
    from websockets.sync.client import connect

    with connect(arith.url.replace("http", "ws") + "/ws", additional_headers=arith.headers) as ws:
        def ask(text: str) -> dict:
            ws.send(text)
            return json.loads(ws.recv())

        cases = [
            ("{nope", "INVALID_JSON"), ("[1, 2]", "VALIDATION_ERROR"), ('{"type": "dance"}', "UNKNOWN_TYPE"),
            ('{"type": "step", "data": {"type": "call_tool", "tool_name": "submit", "arguments": {}}}', "EXECUTION_ERROR"),
            ('{"type": "reset", "data": {"seed": -1}}', "VALIDATION_ERROR"),
            ('{"type": "reset", "data": {"split": "nope"}}', "VALIDATION_ERROR"),
            ('{"type": "step", "data": {"action": "RIGHT"}}', "VALIDATION_ERROR"),
            ('{"type": "step", "data": {"type": "call_tool", "tool_name": 3}}', "VALIDATION_ERROR"),
            ('{"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list"}}', None),
            ("[" * 100_000 + "]" * 100_000, "INVALID_JSON"),
        ]
        for text, code in cases:
            reply = ask(text)
            if code is None:
                assert reply["type"] == "mcp" and reply["data"]["result"]["tools"]
            else:
                assert reply["type"] == "error" and reply["data"]["code"] == code, (text, reply)
        reply = ask('{"type": "reset", "data": {"seed": 3}}')
        assert reply["type"] == "observation" and reply["data"]["done"] is False
        reply = ask('{"type": "state"}')
        assert reply == {"type": "state", "data": {"episode_id": reply["data"]["episode_id"], "step_count": 0}}
        # A wrong-type argument is the call's error, as OpenEnv's MCP envs report a bad call.
        reply = ask('{"type": "step", "data": {"type": "call_tool", "tool_name": "calculator", '
                    '"arguments": {"expression": 5}}}')
        assert reply["type"] == "observation", reply
        observation = reply["data"]["observation"]
        assert observation["error"]["error_type"] == "invalid_args" and reply["data"]["done"] is False, observation
    with httpx.Client(headers=arith.headers) as client:
        rpc = client.post(f"{arith.url}/mcp", content=b"{oops").json()
        assert rpc["error"]["code"] == -32700
        rpc = client.post(f"{arith.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                    "params": {"name": "submit", "arguments": {}}}).json()
        assert rpc["error"]["code"] == -32602 and "session" in rpc["error"]["message"]
        rpc = client.post(f"{arith.url}/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "nope"}).json()
        assert rpc["error"]["code"] == -32601
        assert client.get(f"{arith.url}/health").json() == {"status": "healthy"}


def test_schema_and_metadata_are_openenvs_models(arith):
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
    from openenv.core.env_server.types import EnvironmentMetadata, Observation, State

    with httpx.Client(headers=arith.headers) as client:
        schema = client.get(f"{arith.url}/schema").json()
        meta = client.get(f"{arith.url}/metadata").json()
    assert schema == {"action": CallToolAction.model_json_schema(), "observation": CallToolObservation.model_json_schema(),
                      "reset_observation": Observation.model_json_schema(), "state": State.model_json_schema()}
    assert EnvironmentMetadata(**meta).name == "Arithmetic"


def test_an_openenv_source_served_in_process_plays_as_gym_make_does():
    """``in_process=true``: the env's class runs in the server's own process (no server of its own
    behind it), and OpenEnv's own client gets what gym.make of the same id gives."""
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.mcp_client import MCPToolClient

    served = start_serve(*ECHO, "in_process=true", "--protocol", "openenv", "--max-sessions", "4")
    reference = gym.make(ECHO[0], source=ECHO[1].split("=", 1)[1], in_process=True)
    try:
        assert procs.descendants(served.pid) == [], "no server process behind the served env"

        async def play(index: int) -> None:
            obs, _ = reference.reset(options={"index": index})
            async with MCPToolClient(base_url=served.url, headers=served.headers) as env:
                opening = await env.reset(split="default", index=index)
                assert opening.observation.metadata["prompt"] == obs
                assert sorted(t.name for t in await env.list_tools()) == ["describe", "echo", "fail", "guess"]
                for name, args in (("echo", {"message": "hi"}), ("fail", {"reason": "x"}),
                                   ("guess", {"number": (index + 1) % 10}), ("guess", {"number": index % 10})):
                    said, reward, terminated, _, _ = reference.step(call(name, args))
                    result = await env.step(CallToolAction(tool_name=name, arguments=args))
                    if result.observation.error is None:
                        assert result.observation.result["data"] == said[0]["content"]
                    else:
                        assert result.observation.error.message in said[0]["content"]
                    assert (result.reward or 0.0, result.done) == (reward, terminated)
                assert terminated

        for index in (3, 7):
            asyncio.run(play(index))
    finally:
        reference.close()
        assert served.stop() == 0


def test_a_split_that_never_ends_is_served_over_ors_as_a_range_to_ask_for():
    served = start_serve(*ECHO, "in_process=true", "--protocol", "ors", "--max-sessions", "2")
    try:
        with httpx.Client(headers=served.headers, timeout=60) as client:
            env = client.get(f"{served.url}/list_environments").json()[0]
            assert client.get(f"{served.url}/{env}/splits").json() == [{"name": "default", "type": "train"}]
            count = client.post(f"{served.url}/{env}/num_tasks", json={"split": "default"}).json()["num_tasks"]
            assert count == 2**31 - 1  # an int an ORS client reads; the docs say it stands for "unbounded"
            everything = client.post(f"{served.url}/{env}/tasks", json={"split": "default"})
            assert everything.status_code == 400 and "never ends" in everything.json()["detail"]
            ranged = client.post(f"{served.url}/{env}/task_range", json={"split": "default", "start": 0, "stop": 3})
            assert [t["seed"] for t in ranged.json()["tasks"]] == [0, 1, 2]
    finally:
        assert served.stop() == 0


def test_mcp_tool_client_gets_from_a_served_env_what_openenvs_own_server_gives(tmp_path):
    """The same MCP env (the echo env) served by OpenEnv's own app under uvicorn, and by
    ``openenv-gym serve``: ``call_tool`` returns the tool's result from both (a dict tool's dict, not
    its JSON text), and raises on an unknown tool from both; a step over the socket gives the same
    observation, reward (``None`` where the env gives none) and ``done`` from both."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from openenv.core.generic_client import GenericEnvClient
    from openenv.core.mcp_client import MCPToolClient

    async def calls(url: str, headers: dict | None = None) -> list:
        out: list = []
        async with MCPToolClient(base_url=url, **({"headers": headers} if headers else {})) as env:
            await env.reset()
            for name, args in (("echo", {"message": "Hello!"}), ("describe", {"word": "noon"}), ("nope", {})):
                try:
                    out.append(("returned", await env.call_tool(name, **args)))
                except RuntimeError:
                    out.append(("raised", RuntimeError.__name__))
        async with GenericEnvClient(base_url=url, **({"headers": headers} if headers else {})) as env:
            await env.reset(seed=4)
            for name, args in (("echo", {"message": "hi"}), ("describe", {"word": "ab"}), ("guess", {"number": 3}),
                               ("guess", {"number": 4})):
                step = await env.step({"type": "call_tool", "tool_name": name, "arguments": args})
                result = step.observation["result"]
                out.append(("stepped", name, result.get("data"), result.get("structured_content"),
                            result.get("is_error"), step.reward, step.done))
        return out

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    envs = str(ECHO[1].split("=", 1)[1].rsplit("/", 1)[0])
    theirs = subprocess.Popen([sys.executable, "-m", "uvicorn", "openenv_echo_env.server.app:app", "--port", str(port)],
                              cwd=envs, env={**os.environ, "PYTHONPATH": envs}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and theirs.poll() is None, "OpenEnv's server did not start"
            time.sleep(0.2)
        reference = asyncio.run(calls(f"http://127.0.0.1:{port}"))
    finally:
        theirs.terminate()
        theirs.wait(30)
    served = start_serve(*ECHO, "in_process=true", "--protocol", "openenv")
    try:
        ours = asyncio.run(calls(served.url, served.headers))
    finally:
        assert served.stop() == 0
    described = {"word": "noon", "length": 4, "letters": ["n", "o"]}
    assert reference[:3] == [("returned", "Hello!"), ("returned", described), ("raised", "RuntimeError")]
    assert [row[-2:] for row in reference[3:]] == [(None, False), (None, False), (0.0, False), (1.0, True)]
    assert ours == reference


def test_a_single_session_env_starts_its_servers_as_sessions_need_them():
    """OpenEnv's own envs mostly allow one session per process: 64 of them started up front took
    13 GiB and minutes before `serve` answered. Served, they start as sessions arrive."""
    from pathlib import Path

    from openenv.core.mcp_client import MCPToolClient

    solo = Path(ECHO[1].split("=", 1)[1]).with_name("openenv_solo_env")
    served = start_serve("openenv/OpenEnv-v0", f"source={solo}", "--protocol", "openenv", "--max-sessions", "16")
    try:
        servers = lambda: [p for p in procs.descendants(served.pid) if "local_servers/serve.py" in procs.cmdline(p)]  # noqa: E731
        assert len(servers()) <= 2  # the first workers, not sixteen

        async def three_at_once() -> list:
            clients = [MCPToolClient(base_url=served.url, headers=served.headers) for _ in range(3)]
            for client in clients:
                await client.__aenter__()
            try:
                return [await client.reset() for client in clients]
            finally:
                for client in clients:
                    await client.__aexit__(None, None, None)

        openings = asyncio.run(three_at_once())
        assert all(not o.done for o in openings) and len(servers()) == 3  # one per session held at once
    finally:
        assert served.stop() == 0


def test_workers_started_for_a_burst_of_sessions_stop_once_idle(monkeypatch):
    """Three sessions at once start three single-session servers; once the sessions have ended
    and IDLE_WORKER_TIMEOUT has passed, only the first worker still runs (a burst must not leave
    its processes behind until `serve` exits)."""
    import os
    import time
    from pathlib import Path

    from openenv.core.mcp_client import MCPToolClient

    from openenv_gym.adapters.local_servers import group
    from openenv_gym.serving import Server

    monkeypatch.setattr(group, "IDLE_WORKER_TIMEOUT", 1.0)
    solo = Path(ECHO[1].split("=", 1)[1]).with_name("openenv_solo_env")
    local = lambda: {p for p in procs.descendants(os.getpid()) if "local_servers/serve.py" in procs.cmdline(p)}  # noqa: E731
    others = local()  # another test's servers (a module fixture's)
    servers = lambda: sorted(local() - others)  # noqa: E731
    server = Server("openenv/OpenEnv-v0", source=str(solo), protocol="openenv", max_sessions=8)
    url = server.start()
    try:
        first = servers()
        assert len(first) == 1

        async def three_at_once() -> None:
            clients = [MCPToolClient(base_url=url, headers=url.headers) for _ in range(3)]
            for client in clients:
                await client.__aenter__()
            try:
                for client in clients:
                    await client.reset()
                assert len(servers()) == 3
            finally:
                for client in clients:
                    await client.__aexit__(None, None, None)

        asyncio.run(three_at_once())
        deadline = time.monotonic() + 30
        while len(servers()) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert servers() == first  # the burst's workers stopped, the first one kept

        asyncio.run(three_at_once())  # and they start again when needed
    finally:
        server.stop()
    assert servers() == []
