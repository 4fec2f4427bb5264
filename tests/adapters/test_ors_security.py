"""Local ORS servers are private, bounded and leave nothing behind; a closed adapter stays closed;
timeouts and foreign exceptions become typed errors that name their cause (real servers throughout)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401  (registers the ids)
from openenv_gym import runtime
from openenv_gym.actions import ParsedCall, Turn
from openenv_gym.adapters.local_servers import group as server_groups
from openenv_gym.adapters.local_servers import processes as server_processes
from openenv_gym.adapters.ors.adapter import ORSAdapter
from openenv_gym.errors import (
    BackendTimeout,
    BackendUnavailable,
    ConfigurationError,
    OpenEnvGymError,
    ServerError,
)
from openenv_gym.testing import procs
from openenv_gym.wire import TaskRef

sys.path.insert(0, str(Path(__file__).parents[1]))
from conftest import ENVS, pid_alive  # noqa: E402

PROBE = str(ENVS / "ors_probe.py")


def call(name: str, arguments: dict | None = None, call_id: str = "c1") -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments or {})}}]}


def socket_dir(env: gym.Env) -> Path:
    url = env.unwrapped.adapter.connection()["url"]
    assert url.startswith("unix:"), url
    return Path(url[len("unix:"):]).parent


def ors_serve_children() -> set[int]:
    """PIDs of the ORS servers this test process launched and that are still running."""
    return {p for p in procs.children(os.getpid()) if "local_servers/serve.py" in procs.cmdline(p)}


def tcp_listening_inodes() -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A":  # LISTEN
                inodes.add(cols[9])
    return inodes


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def wait_until(predicate, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


# -- the door is closed -----------------------------------------------------------------------------
NOBODY_PROBE = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sys.argv[1])
        s.sendall(b"POST /probe/task HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
                  b"Content-Length: 31\\r\\n\\r\\n{\\"split\\": \\"train\\", \\"index\\": 0}")
        print("READ", s.recv(65536)[:200])
    except OSError as exc:
        print("REFUSED", type(exc).__name__)
""")


@pytest.mark.timeout(120)
def test_a_local_server_listens_only_on_a_private_unix_socket():
    env = gym.make("openenv/ORS-v0", source=PROBE, env_class="Probe")
    try:
        pid = env.unwrapped.adapter.server_pid()
        folder = socket_dir(env)
        sock = folder / "ors.sock"
        st_dir, st_sock = folder.stat(), sock.stat()
        assert stat.S_IMODE(st_dir.st_mode) == 0o700 and st_dir.st_uid == os.getuid()
        assert stat.S_ISSOCK(st_sock.st_mode) and stat.S_IMODE(st_sock.st_mode) & 0o077 == 0
        assert not socket_inodes(pid) & tcp_listening_inodes(), "the server must not listen on TCP at all"
        env.reset(seed=0, options={"index": 0})
        _, reward, terminated, _, _ = env.step(call("submit", {"answer": "4"}))
        assert reward == 1.0 and terminated
        if os.geteuid() == 0:
            # Another user (nobody) is refused by the folder's permissions, before any HTTP.
            python = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin") or sys.executable
            out = subprocess.run([python, "-c", NOBODY_PROBE, str(sock)], user=65534, group=65534, extra_groups=[],
                                 capture_output=True, text=True, timeout=30, cwd="/")
            assert out.stdout.startswith("REFUSED PermissionError"), out.stdout + out.stderr
    finally:
        env.close()
    assert not pid_alive(pid) and not folder.exists()


@pytest.mark.timeout(120)
def test_tcp_mode_refuses_every_request_without_the_token():
    env = gym.make("openenv/ORS-v0", source=PROBE, env_class="Probe", listen="tcp")
    try:
        adapter = env.unwrapped.adapter
        conn = adapter.connection()
        url, headers = conn["url"], conn["headers"]
        assert url.startswith("http://127.0.0.1:")
        token = headers["Authorization"].removeprefix("Bearer ")
        assert len(token) >= 32
        body = {"split": "train", "index": 0}
        for bad in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}, {"Authorization": "Bearer"},
                    {"Authorization": f"Basic {token}"}, {"Authorization": f"Bearer {token}x"}):
            assert httpx.post(f"{url}/probe/task", json=body, headers=bad).status_code == 401
            assert httpx.get(f"{url}/health", headers=bad).status_code == 401
            assert httpx.post(f"{url}/create", json={"split": "train", "index": 0},
                              headers={**bad, "X-Session-ID": "intruder"}).status_code == 401
        assert httpx.post(f"{url}/probe/task", json=body, headers=headers).json()["task"]["answer"] == "4"
        # The scheme is case-insensitive (RFC 9110), the token is not.
        for scheme in ("bearer", "BEARER", "bEaReR"):
            good = {"Authorization": f"{scheme} {token}"}
            assert httpx.post(f"{url}/probe/task", json=body, headers=good).json()["task"]["answer"] == "4"
        lowered = {"Authorization": f"Bearer {token.swapcase()}"}
        assert token.swapcase() == token or httpx.get(f"{url}/health", headers=lowered).status_code == 401
        # The token never travels on the command line (every local user can read that).
        cmdline = Path(f"/proc/{adapter.server_pid()}/cmdline").read_bytes()
        assert token.encode() not in cmdline
        assert token not in repr(adapter.endpoint.local) and token not in repr(adapter.endpoint.local.workers)
        assert token not in repr(env.unwrapped.spec)
        # The env itself, and another client given the connection, both play normally.
        env.reset(seed=0, options={"index": 0})
        assert env.step(call("submit", {"answer": "4"}))[1] == 1.0
        other = gym.make("openenv/ORS-v0", url=url, headers=headers, env_name="probe")
        try:
            other.reset(seed=0, options={"index": 1})
            assert other.step(call("hint"))[0][0]["content"] == "Think step by step."
        finally:
            other.close()
    finally:
        env.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flavour_file", ["ors_probe.py", "openreward_probe.py"])
def test_docs_and_openapi_are_not_served(flavour_file):
    env = gym.make("openenv/ORS-v0", source=str(ENVS / flavour_file), env_class="Probe")
    try:
        sock = str(socket_dir(env) / "ors.sock")
        with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://ors") as client:
            assert client.get("/health").status_code == 200
            for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
                response = client.get(path, follow_redirects=True)
                assert response.status_code == 404, (path, response.status_code)
                assert "openapi" not in response.text.lower() and "swagger" not in response.text.lower()
    finally:
        env.close()


# -- nothing left behind ----------------------------------------------------------------------------
LAUNCH = textwrap.dedent("""
    import sys, time, gymnasium as gym, openenv_gym
    env = gym.make("openenv/Arithmetic-v0")
    env.reset(seed=0)
    url = env.unwrapped.adapter.connection()["url"]
    print(env.unwrapped.adapter.server_pid(), url[len("unix:"):], flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
""")


def launch_trainer(mode: str = "wait") -> tuple[subprocess.Popen, int, Path]:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, mode], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    assert len(line) == 2 and line[0].isdigit(), f"launcher printed {line!r}"
    return proc, int(line[0]), Path(line[1]).parent


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_trainer_leaves_no_server_and_no_temp_dir(sig):
    proc, pid, folder = launch_trainer()
    try:
        assert pid_alive(pid) and folder.is_dir()
        os.kill(proc.pid, sig)
        proc.wait(30)
        assert wait_until(lambda: not pid_alive(pid)), "the server outlived its trainer"
        assert wait_until(lambda: not folder.exists()), "the server's temp dir outlived it"
    finally:
        proc.kill()
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(120)
def test_a_trainer_that_exits_without_close_leaves_no_temp_dir():
    proc, pid, folder = launch_trainer("exit")
    try:
        assert proc.wait(60) == 0
        assert wait_until(lambda: not pid_alive(pid)), "the server outlived its trainer"
        assert not folder.exists(), "the server's temp dir outlived a normal exit"
    finally:
        proc.kill()


@pytest.mark.timeout(120)
def test_a_stale_dir_of_a_sigkilled_process_is_removed_at_the_next_start(tmp_path):
    proc, pid, folder = launch_trainer()
    try:
        os.kill(pid, signal.SIGKILL)  # the server first, so nobody gets to clean up
        assert wait_until(lambda: not pid_alive(pid))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    assert folder.is_dir(), "precondition: a SIGKILL leaves the folder behind"
    # A folder whose owner is alive (this process) must survive the sweep.
    live = Path(server_processes.make_workdir())
    try:
        env = gym.make("openenv/ORS-v0", source=PROBE, env_class="Probe")
        env.close()
        assert not folder.exists(), "the next start must remove the stale folder"
        assert live.is_dir(), "a folder of a live process must be kept"
    finally:
        shutil.rmtree(live, ignore_errors=True)


def test_dirs_of_an_older_version_are_removed_once_their_port_is_closed():
    import socket
    import tempfile

    from conftest import free_port

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    dead = Path(tempfile.mkdtemp(prefix="openenv-gym-ors-"))
    alive = Path(tempfile.mkdtemp(prefix="openenv-gym-ors-"))
    try:
        (dead / "port").write_text(str(free_port()))
        (alive / "port").write_text(str(listening.getsockname()[1]))
        removed = server_processes.sweep_stale()
        assert dead in removed and not dead.exists()
        assert alive.is_dir(), "a server that still listens keeps its folder"
    finally:
        listening.close()
        shutil.rmtree(dead, ignore_errors=True)
        shutil.rmtree(alive, ignore_errors=True)


NOISY_ENV = textwrap.dedent("""
    import sys
    from pydantic import BaseModel
    from ors import Environment, TextBlock, ToolOutput, tool

    class Say(BaseModel):
        n: int

    class Noisy(Environment):
        @classmethod
        def list_splits(cls): return ["train"]
        @classmethod
        def list_tasks(cls, split): return [{"q": "say"}]
        def get_prompt(self): return [TextBlock(text="say something")]
        @tool
        def say(self, params: Say) -> ToolOutput:
            print(f"line {params.n} " + "x" * 2000)
            print(f"err {params.n}", file=sys.stderr)
            return ToolOutput(blocks=[TextBlock(text=str(params.n))], reward=0.0, finished=False)
""")


@pytest.mark.timeout(180)
def test_server_log_stays_under_its_cap_and_keeps_the_latest_output(tmp_path, monkeypatch):
    source = tmp_path / "noisy.py"
    source.write_text(NOISY_ENV)
    cap = 16 * 1024
    monkeypatch.setattr(server_processes, "LOG_MAX_BYTES", cap)
    env = gym.make("openenv/ORS-v0", source=str(source), env_class="Noisy")
    try:
        folder = socket_dir(env)
        env.reset(seed=0)
        for n in range(200):  # ~400 KB of output
            obs, *_ = env.step(call("say", {"n": n}))
            assert obs[0]["content"] == str(n)
        time.sleep(0.2)
        sizes = {p.name: p.stat().st_size for p in folder.glob("server.log*")}
        assert set(sizes) == {"server.log", "server.log.1"}, sizes
        assert all(size <= cap for size in sizes.values()), sizes
        assert "err 199" in env.unwrapped.adapter.endpoint.local.log_tail()
    finally:
        env.close()


@pytest.mark.timeout(180)
def test_a_quiet_env_writes_no_log_line_per_request():
    env = gym.make("openenv/Arithmetic-v0")
    try:
        log = socket_dir(env) / "server.log"
        env.reset(seed=0)
        before = log.stat().st_size
        for seed in range(30):
            _, info = env.reset(seed=seed)
            task = env.unwrapped.task(info["split"], info["index"])
            env.step(call("submit", {"answer": task["answer"]}))
        time.sleep(0.2)
        assert log.stat().st_size - before < 200, log.read_text()[-2000:]
    finally:
        env.close()


# -- a closed adapter stays closed ------------------------------------------------------------------
def _probe_adapter(**kwargs) -> ORSAdapter:
    return ORSAdapter(source=PROBE, env_class="Probe", **kwargs)


@pytest.mark.timeout(180)
def test_an_adapter_used_after_close_raises_and_launches_nothing():
    before = ors_serve_children()
    adapter = _probe_adapter()
    runtime.run_sync(adapter.start(), 120)
    pid = adapter.server_pid()
    runtime.run_sync(adapter.aclose(), 30)
    assert not pid_alive(pid)
    for attempt in (lambda: adapter.episode().start(TaskRef("train", 0)), adapter.endpoint.ensure, adapter.start,
                    lambda: adapter.call_tool(None, "x", "hint", {}), lambda: adapter.task("train", 0)):
        with pytest.raises(BackendUnavailable, match="the ORS adapter is closed"):
            runtime.run_sync(attempt(), 60)
    runtime.run_sync(adapter.aclose(), 30)  # closing twice is fine
    assert adapter.server_pid() is None
    assert ors_serve_children() <= before, "a closed adapter launched a server"


@pytest.mark.timeout(300)
def test_reset_racing_close_never_reopens_the_adapter():
    before = ors_serve_children()
    keeper = _probe_adapter()  # holds the shared server, so each round races without a 1 s spawn
    runtime.run_sync(keeper.start(), 120)
    shared = keeper.server_pid()

    async def race(reset_after: int, close_after: int) -> list[object]:
        adapter = _probe_adapter()
        await adapter.start()
        episode = adapter.episode()

        async def later(n: int, coro):
            for _ in range(n):
                await asyncio.sleep(0)
            return await coro

        outcome = await asyncio.gather(later(reset_after, episode.start(TaskRef("train", 0))),
                                       later(close_after, adapter.aclose()), return_exceptions=True)
        await episode.aclose()
        assert adapter.closed and adapter.server_pid() is None
        return outcome

    try:
        # Both orders: a reset already under way when close starts, and one starting while close runs.
        delays = [(0, n) for n in (0, 1, 2, 3, 5, 8, 13, 50, 200)] + [(n, 0) for n in (1, 2, 3, 5, 8, 13)]
        outcomes = [runtime.run_sync(race(r, c), 120) for r, c in delays]
        errors = [o[0] for o in outcomes if isinstance(o[0], BaseException)]
        assert all(isinstance(e, BackendUnavailable) for e in errors), errors
        assert errors, "no round raced: reset always finished before close"
        # Every racing adapter released the shared server: the keeper is its only user.
        assert server_groups.running() and all(s.users == 1 for s in server_groups.running() if s.pid == shared)
    finally:
        runtime.run_sync(keeper.aclose(), 30)
    assert not pid_alive(shared)
    assert wait_until(lambda: ors_serve_children() <= before, 10), "a server outlived every adapter"


# -- timeouts name their limit; a hung server neither hangs reset nor close ------------------------
@pytest.mark.slow  # a failure drill of many seconds: its own CI step (-m slow)
@pytest.mark.timeout(120)
def test_a_sigstopped_server_gives_typed_timeouts_and_closes_within_5_s():
    env = gym.make("openenv/ORS-v0", source=PROBE, env_class="Probe", read_timeout=2.0, connect_timeout=1.0)
    pid = env.unwrapped.adapter.server_pid()
    folder = socket_dir(env)
    try:
        env.reset(seed=0, options={"index": 0})
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(BackendTimeout, match=r"tool 'hint': no response within read_timeout=2.0 s"):
            env.step(call("hint"))
        with pytest.raises(BackendTimeout, match=r"POST /create: no response within read_timeout=2.0 s"):
            env.reset(seed=0, options={"index": 0})
        assert time.monotonic() - start < 30
        start = time.monotonic()
        env.close()
        took = time.monotonic() - start
        assert took < 5.0, f"close took {took:.1f} s with a stopped server"
        assert not pid_alive(pid) and not folder.exists()
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        env.close()


def test_call_timeout_and_read_timeout_each_name_themselves(ors_server):
    env = gym.make("openenv/ORS-v0", url=ors_server.url, env_name="probe", call_timeout=1.0)
    try:
        env.reset(seed=0)
        with pytest.raises(BackendTimeout, match=r"tool 'slow' did not finish within call_timeout=1.0 s"):
            env.step(call("slow", {"seconds": 3}))
    finally:
        env.close()
    env = gym.make("openenv/ORS-v0", url=ors_server.url, env_name="probe", read_timeout=1.0)
    try:
        env.reset(seed=0)
        with pytest.raises(BackendTimeout, match=r"tool 'slow': no response within read_timeout=1.0 s") as err:
            env.step(call("slow", {"seconds": 3}))
        assert "call_timeout" not in str(err.value)
    finally:
        env.close()


# -- one error boundary -----------------------------------------------------------------------------
class _Garbage(BaseHTTPRequestHandler):
    """A server that answers every request with 200 and a body that is not what ORS sends."""

    bodies = {"/list_environments": b'["probe"]', "/version": b"{}", "/probe/tools": b'{"tools": 5}'}

    def _answer(self) -> None:
        body = self.bodies.get(self.path, b"not json at all")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def garbage_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_unreadable_answers_are_server_errors(garbage_server):
    with pytest.raises(ServerError, match="GET /probe/tools: the server sent an unreadable answer"):
        gym.make("openenv/ORS-v0", url=garbage_server)
    _Garbage.bodies["/probe/tools"] = b'{"tools": []}'
    try:
        env = gym.make("openenv/ORS-v0", url=garbage_server)
        try:
            with pytest.raises(ServerError, match="unreadable answer"):
                env.unwrapped.splits()
        finally:
            env.close()
    finally:
        _Garbage.bodies["/probe/tools"] = b'{"tools": 5}'


@pytest.fixture(scope="module")
def probe_adapter(ors_server):
    adapter = ORSAdapter(url=ors_server.url, env_name="probe")
    runtime.run_sync(adapter.start(), 60)
    yield adapter
    runtime.run_sync(adapter.aclose(), 30)


def _play(adapter: ORSAdapter, calls: list[ParsedCall]):
    async def go():
        episode = adapter.episode()
        await episode.start(TaskRef("train", 0))
        try:
            first = await episode.step(Turn(text=None, calls=calls))
            last = await episode.step(Turn(text=None, calls=[ParsedCall("s", "submit", {"answer": "4"})]))
            return first, last
        finally:
            await episode.aclose()

    return runtime.run_sync(go(), 60)


def _deep(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value", ["\ud800", 10**5000, object(), _deep(100_000)], ids=["surrogate", "huge-int", "object", "deep"])
def test_arguments_that_cannot_be_json_reach_the_agent_and_the_episode_goes_on(probe_adapter, value):
    first, last = _play(probe_adapter, [ParsedCall("c1", "submit", {"answer": value})])
    assert first.messages[0]["role"] == "tool" and first.messages[0]["tool_call_id"] == "c1"
    assert "cannot be sent as JSON" in first.messages[0]["content"]
    assert first.reward == 0.0 and not first.terminated
    assert first.info["calls"][0]["reason"] == "invalid_call"
    assert last.reward == 1.0 and last.terminated


def test_a_task_spec_that_cannot_be_json_is_a_configuration_error(probe_adapter):
    episode = probe_adapter.episode()
    with pytest.raises(ConfigurationError, match="cannot be sent as JSON"):
        runtime.run_sync(episode.start(TaskRef(spec={"question": "q", "answer": "\udcff"})), 30)
    runtime.run_sync(episode.aclose(), 10)


_json_ish = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=10**4400, max_value=10**4400 * 2)
    | st.floats() | st.text() | st.binary(max_size=8) | st.just("\ud800x") | st.just(object()),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    | st.frozensets(st.integers(), max_size=2),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=_json_ish)
def test_fuzzed_arguments_never_raise_untyped(probe_adapter, answer):
    try:
        first, last = _play(probe_adapter, [ParsedCall("c1", "submit", {"answer": answer})])
    except OpenEnvGymError as exc:  # typed is acceptable; untyped is the defect
        pytest.fail(f"an agent's arguments must not raise at all: {exc!r}")
    assert first.messages and first.messages[0]["tool_call_id"] == "c1"
    assert last.terminated
