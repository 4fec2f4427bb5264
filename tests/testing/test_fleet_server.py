"""The Fleet test server against the real fleet-python SDK (sync and async) and the real mcp client.

Every server here is a real subprocess on 127.0.0.1, started by ``FleetTestServer`` and stopped by
PID. The MCP helper below is written to work with mcp 1.x and 2.x alike (results are read by
their wire names through ``model_dump(by_alias=True)``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

fleet = pytest.importorskip("fleet")
pytest.importorskip("mcp")

import fleet._async.exceptions as async_exc  # noqa: E402
import fleet.exceptions as exc  # noqa: E402
from fleet.tasks import Task as SyncTask  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared import exceptions as mcp_exceptions  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from openenv_gym.testing.fleet import EXAMPLE_TASKS, FleetTestServer, write_example_tasks  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))
from conftest import pid_alive  # noqa: E402

API_KEY = "fleet-test-key-7f3c1d9a"  # distinctive, so "never in the log" is a meaningful check
# The error an MCP client session raises for an error the server sent: McpError in mcp 1.x,
# renamed MCPError in 2.x.
MCP_ERROR: type[Exception] = getattr(mcp_exceptions, "MCPError", None) or mcp_exceptions.McpError
TASKS = {t["key"]: t for t in EXAMPLE_TASKS}


@pytest.fixture(autouse=True)
def _no_runner_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDK would send this instead of fetching the server's token.
    monkeypatch.delenv("RUNNER_AUTH_TOKEN", raising=False)


@pytest.fixture(scope="module")
def srv() -> Iterator[FleetTestServer]:
    server = FleetTestServer(api_key=API_KEY).start()
    yield server
    server.stop()


def new_instances(srv: FleetTestServer, before: set[str]) -> list[dict[str, Any]]:
    return [i for i in srv.instances() if i["instance_id"] not in before]


def instance_ids(srv: FleetTestServer) -> set[str]:
    return {i["instance_id"] for i in srv.instances()}


# --------------------------------------------------------------------------- MCP helper


@contextlib.asynccontextmanager
async def mcp_session(url: str) -> AsyncIterator[ClientSession]:
    """An initialized session; mcp 1.x yields 3 streams and 2.x yields 2, so index them."""
    async with create_mcp_http_client() as http, streamable_http_client(url, http_client=http) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            yield session


async def call(session: ClientSession, name: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await asyncio.wait_for(session.call_tool(name, args), 10)
    return result.model_dump(by_alias=True, exclude_none=True)


async def tool_names(session: ClientSession) -> list[str]:
    return [t.name for t in (await session.list_tools()).tools]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, tag = struct.unpack(">I4s", data[8:16])
    assert tag == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    idat_len = struct.unpack(">I", data[33:37])[0]
    raw = zlib.decompress(data[41 : 41 + idat_len])
    assert len(raw) == height * (1 + 3 * width)
    return width, height


# --------------------------------------------------------------------------- full cycles


def test_sync_fleet_full_cycle(srv: FleetTestServer) -> None:
    client = fleet.Fleet(api_key=API_KEY, base_url=srv.url)
    env = client.make("issues:1.0.0", data_key="seed:1.0", run_id="sync-run")
    assert env.status == "running" and env.urls.root.endswith("/")
    assert env.urls.root.startswith(srv.url) and env.urls.manager.api == env.urls.root + "api/v1/env"

    assert env.reset(seed=7).success
    assert {r.name for r in env.resources()} == {"seed", "current"}
    rows = env.db("current").query("SELECT id, status FROM issues ORDER BY id").rows
    assert rows == [[1, "open"], [2, "open"]]
    assert env.db("seed").describe().tables[0].name == "issues"

    task = SyncTask(key="login", prompt="p", env_id="issues", version="1.0.0",
                    verifier_func=TASKS["create-login-bug"]["verifier_func"])
    before = task.verify_detailed(env)
    assert before.success and before.result == 0.0

    async def act() -> None:
        async with mcp_session(env.urls.root + "mcp") as session:
            assert set(await tool_names(session)) == {
                "create_issue", "list_issues", "close_issue", "read_log", "count_issues"}
            created = await call(session, "create_issue", {"title": "Login fails", "body": "500 on submit"})
            assert not created["isError"] and json.loads(created["content"][0]["text"])["id"] == 3
            count = await call(session, "count_issues", {})
            assert count["structuredContent"] == {"result": 3}
            missing = await call(session, "close_issue", {"issue_id": 99})
            assert missing["isError"] and "Issue 99 does not exist" in missing["content"][0]["text"]
            log = (await call(session, "read_log", {"lines": 120}))["content"][0]["text"].splitlines()
            assert len(log) == 120 and all(len(line) <= 80 for line in log)

    asyncio.run(act())
    after = task.verify_detailed(env)
    assert after.success and after.result == 1.0 and isinstance(after.execution_time_ms, int)
    assert after.bundle_cache_hit  # second call on the same Task: check said yes, no upload

    assert env.close().status == "stopped"
    record = next(i for i in srv.instances() if i["instance_id"] == env.instance_id)
    assert record["status"] == "stopped" and record["run_id"] == "sync-run" and record["resets"] == 1


def test_async_fleet_full_cycle(srv: FleetTestServer) -> None:
    async def scenario() -> None:
        client = fleet.AsyncFleet(api_key=API_KEY, base_url=srv.url)
        env = await client.make("issues:1.1.0", data_key="seed:1.0", image_type="mcp")
        assert env.version == "1.1.0"
        assert (await env.reset()).success
        await env.resources()
        assert (await env.db("current").query("SELECT COUNT(*) FROM issues")).rows == [[2]]

        task = fleet.Task(key="flicker", prompt="p", env_id="issues", version="1.1.0",
                          verifier_func=TASKS["screen-flicker"]["verifier_func"])
        assert (await task.verify_detailed_async(env)).result == 0.0
        async with mcp_session(env.urls.root + "api/v1/mcp") as session:
            assert "computer" in await tool_names(session)
            shot = await call(session, "computer", {"action": "screenshot"})
            image = shot["content"][0]
            assert image["type"] == "image" and image["mimeType"] == "image/png"
            assert png_size(base64.b64decode(image["data"])) == (64, 48)
            await call(session, "create_issue", {"title": "Screen flicker"})
        result = await task.verify_detailed_async(env)
        assert result.success and result.result == 1.0

        closed = await env.close()
        assert closed.status == "stopped"

    asyncio.run(scenario())
    assert [i for i in srv.instances() if i["image_type"] == "mcp"][-1]["status"] == "stopped"


def test_example_tasks_load_and_verify(srv: FleetTestServer, tmp_path: Path) -> None:
    client = fleet.Fleet(api_key=API_KEY, base_url=srv.url)
    tasks = {t.key: t for t in client.load_tasks_from_file(str(write_example_tasks(tmp_path / "tasks.json")))}
    assert set(tasks) == set(TASKS)
    assert sorted(t["split"] for t in EXAMPLE_TASKS) == ["test", "train", "train", "train"]
    assert {t["task_modality"] for t in EXAMPLE_TASKS} == {"tool_use", "computer_use"}
    assert {t.key for t in client.load_tasks(env_key="issues")} == set(TASKS)

    env = client.make(tasks["triage"].env_key, data_key=tasks["triage"].data_key)
    try:
        count = tasks["count-open"]
        assert count.verify_detailed(env, final_answer="There are 2 open issues.").result == 1.0
        assert count.verify_detailed(env, final_answer="3").result == 0.0

        async def close_first() -> None:
            async with mcp_session(env.urls.root + "mcp") as session:
                assert "Closed issue 1" in (await call(session, "close_issue", {"issue_id": 1}))["content"][0]["text"]

        asyncio.run(close_first())
        partial = tasks["triage"].verify_detailed(env)
        assert partial.success and partial.result == 0.0
        out = partial.stdout
        successes = out.split(">>> SUCCESS_ACCUMULATOR >>>\n")[1].split("\n<<< SUCCESS_ACCUMULATOR <<<")[0]
        errors = out.split(">>> ERROR_ACCUMULATOR >>>\n")[1].split("\n<<< ERROR_ACCUMULATOR <<<")[0]
        assert successes == repr(["issue 1 is closed"]) and errors == repr(["no issue titled 'Crash on save'"])
    finally:
        env.close()


# --------------------------------------------------------------------------- faults


def test_create_retries_through_two_503s(srv: FleetTestServer) -> None:
    before = instance_ids(srv)
    srv.inject(503, "^/v1/env/instances$", method="POST", times=2)
    env = fleet.Fleet(api_key=API_KEY, base_url=srv.url).make("issues")
    creates = [r for r in srv.requests() if r["method"] == "POST" and r["path"] == "/v1/env/instances"][-3:]
    assert [r["status"] for r in creates] == [503, 503, 200]
    assert len({r["request_id"] for r in creates}) == 1
    assert [i["instance_id"] for i in new_instances(srv, before)] == [env.instance_id]
    env.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_lost_create_response_is_recovered_without_a_second_instance(srv: FleetTestServer, flavour: str) -> None:
    before = instance_ids(srv)
    srv.inject_lost_response()
    if flavour == "sync":
        env = fleet.Fleet(api_key=API_KEY, base_url=srv.url).make("issues")
        env.close()
    else:
        async def make_and_close() -> Any:
            env = await fleet.AsyncFleet(api_key=API_KEY, base_url=srv.url).make("issues")
            await env.close()
            return env

        env = asyncio.run(make_and_close())
    created = new_instances(srv, before)
    assert [i["instance_id"] for i in created] == [env.instance_id]
    creates = [r for r in srv.requests() if r["method"] == "POST" and r["path"] == "/v1/env/instances"][-2:]
    assert [r["status"] for r in creates] == [503, 409] and creates[0]["lost_status"] == 200
    assert creates[0]["request_id"] == creates[1]["request_id"] == created[0]["request_id"]


def test_unknown_env_and_version_fail_within_2_s_without_retries(srv: FleetTestServer) -> None:
    client = fleet.Fleet(api_key=API_KEY, base_url=srv.url)
    started = time.monotonic()
    with pytest.raises(exc.FleetEnvironmentNotFoundError):
        client.make("no-such-env:1.0.0")
    with pytest.raises(exc.FleetVersionNotFoundError) as info:
        client.make("issues:9.9.9")
    assert info.value.version == "v9.9.9" and info.value.env_key == "issues"
    assert time.monotonic() - started < 2.0  # 400s are not retried


def test_bad_api_key(srv: FleetTestServer) -> None:
    with pytest.raises(exc.FleetAuthenticationError):
        fleet.Fleet(api_key="wrong-key", base_url=srv.url).make("issues")
    with pytest.raises(async_exc.FleetAuthenticationError):  # the async tree's own class
        asyncio.run(fleet.AsyncFleet(api_key="wrong-key", base_url=srv.url).make("issues"))
    assert srv.requests()[-1]["status"] == 401


def test_create_delay_and_generic_injection(srv: FleetTestServer) -> None:
    client = fleet.Fleet(api_key=API_KEY, base_url=srv.url, max_retries=0)
    srv.set_create_delay(0.4)
    try:
        started = time.monotonic()
        env = client.make("issues")
        assert time.monotonic() - started >= 0.4
    finally:
        srv.set_create_delay(0.0)
    srv.inject(500, r"^/v1/env/instances/[^/]+$", method="GET", detail="boom")
    with pytest.raises(exc.FleetAPIError, match="boom"):
        client.instance(env.instance_id)
    assert client.instance(env.instance_id).status == "running"  # the fault was used up
    srv.inject(500, r"^/v1/account", times=5)
    srv.inject(500, r"^/v1/account", times=0)  # cancels the pending five
    assert client.account().team_id
    env.close()


def test_dropped_mcp_session_gets_an_error_and_reconnect_works(srv: FleetTestServer) -> None:
    env = fleet.Fleet(api_key=API_KEY, base_url=srv.url).make("issues")
    url = env.urls.root + "mcp"

    async def scenario() -> None:
        async with mcp_session(url) as session:
            assert not (await call(session, "count_issues", {}))["isError"]
            assert srv.drop_mcp_sessions() >= 1
            with pytest.raises(MCP_ERROR, match="(?i)session"):
                await call(session, "count_issues", {})
        async with mcp_session(url) as session:  # a fresh session works
            assert (await call(session, "count_issues", {}))["structuredContent"] == {"result": 2}

    try:
        asyncio.run(scenario())
    finally:
        env.close()
    assert any(r["path"] == "/" + env.instance_id + "/mcp" and r["status"] == 404 for r in srv.requests())


def test_concurrent_sessions_act_on_their_own_instance(srv: FleetTestServer) -> None:
    client = fleet.Fleet(api_key=API_KEY, base_url=srv.url)
    a, b = client.make("issues"), client.make("issues")

    async def scenario() -> None:
        async with mcp_session(a.urls.root + "mcp") as sa, mcp_session(b.urls.root + "mcp") as sb:
            await asyncio.gather(*(call(sa, "create_issue", {"title": f"a{i}"}) for i in range(3)),
                                 call(sb, "close_issue", {"issue_id": 2}))
            assert (await call(sa, "count_issues", {}))["structuredContent"] == {"result": 5}
            assert (await call(sb, "count_issues", {}))["structuredContent"] == {"result": 2}
        # A session id opened on one instance is refused on another.
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        headers = {"Accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient(headers=headers) as http:
            opened = await http.post(a.urls.root + "mcp", json=init)
            session_id = opened.headers["mcp-session-id"]
            ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
            wrong = await http.post(b.urls.root + "mcp", json=ping, headers={"mcp-session-id": session_id})
            assert wrong.status_code == 404

    try:
        asyncio.run(scenario())
        a.resources(), b.resources()  # the SDK needs these before db()
        assert a.db("current").query("SELECT COUNT(*) FROM issues WHERE status='open'").rows == [[5]]
        assert b.db("current").query("SELECT id FROM issues WHERE status='open'").rows == [[1]]
    finally:
        a.close()
        b.close()


def test_execute_without_a_known_bundle_is_not_found(srv: FleetTestServer) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    body = {"key": "k", "sha256": "0" * 64, "args_array": [{"env": "nope"}], "function_name": "verify"}
    answer = httpx.post(f"{srv.url}/v1/verifiers/execute", json=body, headers=auth)
    assert answer.status_code == 404 and "bundle not found" in answer.json()["detail"].lower()
    assert httpx.get(f"{srv.url}/v1/verifiers/check", params={"sha256": "0" * 64}, headers=auth).json() == {
        "success": False}


def test_request_log_never_contains_secrets(srv: FleetTestServer) -> None:
    env = fleet.Fleet(api_key=API_KEY, base_url=srv.url).make("issues")
    try:  # an SDK call into the instance manager, which presents the runner token (whatever ran before)
        assert env.reset(seed=0).success
    finally:
        env.close()
    token = httpx.get(f"{srv.url}/v1/runner-auth/token", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    text = srv.log_path.read_text()
    entries = srv.requests()
    assert entries and all({"method", "path", "query", "status", "request_id", "json"} <= set(e) for e in entries)
    assert API_KEY not in text and token["token"] not in text
    assert any(e["runner_token_sent"] for e in entries)  # the SDK did send it; only its value is kept out


# --------------------------------------------------------------------------- other modes and lifecycle


def test_stateless_mcp_runner_token_gate_and_stop() -> None:
    srv = FleetTestServer(api_key=API_KEY, mcp_mode="stateless", require_runner_token=True).start()
    pid, workdir = srv.pid, srv.log_path.parent
    try:
        client = fleet.Fleet(api_key=API_KEY, base_url=srv.url)
        env = client.make("issues")
        assert env.reset().success  # the SDK fetched the runner token by itself
        bare = httpx.post(env.urls.manager.api + "/reset", json={})
        assert bare.status_code == 404

        async def scenario() -> None:
            async with mcp_session(env.urls.root + "mcp") as session:
                assert (await call(session, "count_issues", {}))["structuredContent"] == {"result": 2}
            assert srv.drop_mcp_sessions() == 0

        asyncio.run(scenario())
        mcp_posts = [r for r in srv.requests() if r["path"].endswith("/mcp") and r["method"] == "POST"]
        assert mcp_posts and all(r["status"] in (200, 202) for r in mcp_posts)
        raw = httpx.post(env.urls.root + "mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         headers={"Accept": "application/json, text/event-stream",
                                  "mcp-protocol-version": "2025-06-18"})
        assert raw.headers["content-type"].startswith("application/json") and "mcp-session-id" not in raw.headers
        env.close()
    finally:
        srv.stop()
    assert srv.pid == pid and not pid_alive(pid) and not workdir.exists()
    srv.stop()  # idempotent


def test_server_dies_with_its_parent() -> None:
    launcher = textwrap.dedent("""
        import time
        from openenv_gym.testing.fleet import FleetTestServer
        srv = FleetTestServer().start()
        print(srv.pid, srv.log_path.parent, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    try:
        pid_text, workdir_text = parent.stdout.readline().split()
        child_pid, workdir = int(pid_text), Path(workdir_text)
        assert pid_alive(child_pid) and workdir.exists()
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
    deadline = time.monotonic() + 10
    while pid_alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child_pid)
    assert not workdir.exists()  # the server removed the launcher's temp dir on its way out


def test_foreground_cli_prints_url_and_key() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "openenv_gym.testing.fleet", "--port", "0"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "FLEET_TEST_SERVER_API_KEY": "cli-key"},
    )
    try:
        first = proc.stdout.readline()
        url = first.split()[first.split().index("on") + 1]
        assert "FLEET_API_KEY=cli-key" in proc.stdout.readline() + proc.stdout.readline()
        envs = httpx.get(f"{url}/v1/env/", headers={"Authorization": "Bearer cli-key"}).json()
        assert envs[0]["env_key"] == "issues" and envs[0]["default_version"] == "1.0.0"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


# --------------------------------------------------------------------------- hardening


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode(errors="replace")


def test_the_api_key_is_never_on_the_command_line() -> None:
    """Any local user can read another process's argv (``ps``); the key travels in the environment."""
    server = FleetTestServer(api_key=API_KEY).start()
    try:
        assert API_KEY not in _cmdline(server.pid)
        assert fleet.Fleet(api_key=API_KEY, base_url=server.url).account().team_id  # and it is the key in use
    finally:
        server.stop()
    refused = subprocess.run(
        [sys.executable, "-m", "openenv_gym.testing.fleet_server", "--api-key", API_KEY, "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode == 2 and "unrecognized arguments: --api-key" in refused.stderr


def test_a_normal_episode_leaves_no_traceback_in_the_server_output() -> None:
    """Ending a stateful MCP session (the client's DELETE) must not print mcp 1.x's teardown traceback."""
    server = FleetTestServer(api_key=API_KEY).start()
    try:
        client = fleet.Fleet(api_key=API_KEY, base_url=server.url)
        env = client.make("issues")
        url = env.urls.root + "mcp"

        async def episode() -> None:
            async with mcp_session(url) as session:  # opens the standalone SSE stream, then DELETEs
                await call(session, "create_issue", {"title": "Login fails"})
                await asyncio.sleep(0.2)  # the standalone stream is open by now

        asyncio.run(episode())
        deadline = time.monotonic() + 10
        while not any(r["method"] == "DELETE" and r["path"] == "/" + env.instance_id + "/mcp"
                      for r in server.requests()):
            assert time.monotonic() < deadline, "the client never ended its session"
            time.sleep(0.05)
        time.sleep(0.5)  # the writer task's teardown runs just after the DELETE is answered
        env.close()
        output = server.output_path.read_text(errors="replace")
    finally:
        server.stop()
    assert "Traceback" not in output and "ClosedResourceError" not in output, output[-2000:]


def test_the_teardown_filter_keeps_every_other_error() -> None:
    import logging

    import anyio

    from openenv_gym.testing.fleet_server import SessionTeardownFilter

    def record(message: str, exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord(SessionTeardownFilter.LOGGER, logging.ERROR, __file__, 1, message, None,
                                 (type(exc), exc, None))

    keep = SessionTeardownFilter().filter
    assert not keep(record("Error in standalone SSE writer", anyio.ClosedResourceError()))
    assert not keep(record("Error in SSE writer", anyio.ClosedResourceError()))
    assert keep(record("Error in standalone SSE writer", RuntimeError("boom")))
    assert keep(record("Error in standalone SSE response", anyio.ClosedResourceError()))
    assert keep(logging.LogRecord(SessionTeardownFilter.LOGGER, logging.ERROR, __file__, 1,
                                  "Error in standalone SSE writer", None, None))


def test_launcher_and_server_do_not_import_each_other() -> None:
    """The server process imports the shared module, never the launcher (anywhere in its code)."""
    import ast

    import openenv_gym.testing.fleet_server as server_module

    tree = ast.parse(Path(server_module.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    assert "openenv_gym.testing.fleet" not in imported
    probe = ("import sys, openenv_gym.testing.fleet_server as s; "
             "assert 'openenv_gym.testing.fleet' not in sys.modules; assert s.EXAMPLE_TASKS")
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
