"""The Verifiers v1 adapter against real tasksets, the library's real harness and tool servers.

The tasksets live in ``tests/envs/verifiers_v1`` (``vf1_arith``: chat, exact match, two splits;
``vf1_calc``: the ``calc_multiply`` MCP tool, per rollout or shared). Nothing is mocked on the
library side: the ``null`` harness program runs under ``uv`` in a subprocess, tool servers are
``python -m`` children. Each test checks something a user relies on: rewards equal to the
library's own evaluation, bad tool calls that reach the agent, nothing left running after
close or a reset mid-episode, limit stops and policy time against the library's timeouts as
truncation, vector envs, Gymnasium's checker, version gating.

The library's own path (the reference for rewards) is ``Env.serving()`` +
``Env.run_episode(task, ctx)`` with its own interception server and eval client, pointed at a
scripted OpenAI-compatible stub that answers with the same policy as the agent.

Runs in the venv with verifiers 0.4 (and on 0.3.1's ``verifiers.v1``); skipped when
``verifiers.v1`` is missing or lacks what the adapter needs.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from openenv_gym.adapters.verifiers import v1 as v1mod
from openenv_gym.errors import ConfigurationError, TaskNotFound
from openenv_gym.testing import procs

try:
    vf = v1mod._import_v1()
except ConfigurationError as _exc:
    pytest.skip(f"verifiers.v1 is not usable here: {_exc}", allow_module_level=True)

from openenv_gym import runtime  # noqa: E402
from openenv_gym.adapters.base import AdapterSpec  # noqa: E402
from openenv_gym.adapters.verifiers.process import importable  # noqa: E402
from openenv_gym.adapters.verifiers.v1 import VerifiersV1Adapter  # noqa: E402
from openenv_gym.adapters.verifiers.v1_calls import whole_error  # noqa: E402
from openenv_gym.env import AgentEnv  # noqa: E402
from openenv_gym.testing.openai_stub import OpenAIStub  # noqa: E402

ENVS = Path(__file__).parents[1] / "envs" / "verifiers_v1"
ARITH, CALC = ENVS / "vf1_arith", ENVS / "vf1_calc"
SHARED = {"task": {"shared_tools": True}}

Policy = Callable[[list[dict[str, Any]]], dict[str, Any]]

# -- policies: the same function answers for the agent (adapter) and for the stub (library) --------

ARITH_ANSWERS = {"What is 2 + 3?": "5", "What is 6 * 7?": "42", "What is 10 - 4?": "7"}  # the last is wrong


def arith_policy(messages: list[dict[str, Any]]) -> dict[str, Any]:
    question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    return {"role": "assistant", "content": ARITH_ANSWERS.get(question, "0")}


def calc_policy(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Multiply with the tool, send broken JSON, call a tool that does not exist, then answer."""
    tools = [m for m in messages if m["role"] == "tool"]
    if not tools:
        a, b = re.findall(r"\d+", next(m["content"] for m in messages if m["role"] == "user"))[:2]
        return _call("calc_multiply", f'{{"a": {a}, "b": {b}}}', "call_1")
    if len(tools) == 1:
        return _call("calc_multiply", '{"a": 1, "b": ', "call_2")
    if len(tools) == 2:
        return _call("nope", "{}", "call_3")
    return {"role": "assistant", "content": str(tools[0]["content"])}


def _call(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def play(env: Any, policy: Policy, index: int, split: str | None = None) -> tuple[float, bool, bool, dict, list]:
    """One episode through the Gymnasium API; returns (reward, terminated, truncated, info, history)."""
    options: dict[str, Any] = {"index": index}
    if split:
        options["split"] = split
    obs, info = env.reset(options=options)
    history = list(obs)
    for _ in range(20):
        action = policy(history)
        history.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        history += obs
        if terminated or truncated:
            return float(reward), terminated, truncated, info, history
    raise AssertionError("the episode did not end")


def library_rewards(taskset: str, policy: Policy, indices: list[int], env_args: dict | None = None,
                    max_turns: int | None = None) -> Future[dict[int, tuple[float, dict, str | None]]]:
    """The library's own evaluation of the same tasks with the same answers, started on the
    runtime loop (it overlaps the adapter's episodes; one loop, as in real use): a future of
    index -> (reward, metrics, stop condition)."""
    async def run() -> dict[int, tuple[float, dict, str | None]]:
        config = vf.resolve_env_config({
            "taskset": {"id": taskset, **(env_args or {})},
            "agent": {"runtime": {"type": "subprocess"}, "harness": v1mod._held_to_pins({"id": "null"}, local=True),
                      "max_turns": max_turns},
        })
        env = await asyncio.to_thread(vf.load_environment, config)
        tasks = list(env.taskset)
        out = {}
        with OpenAIStub(lambda body: policy(body["messages"])) as stub:
            ctx = vf.ModelContext(model="stub", client=vf.EvalClientConfig(base_url=stub.url, api_key_var="NO_SUCH_KEY"))
            async with env.serving():
                for i in indices:
                    episode = await env.run_episode(tasks[i], ctx)
                    trace = episode.traces[-1]
                    assert trace.ok, trace.errors
                    out[i] = (float(trace.reward), dict(trace.metrics), trace.stop_condition)
        return out

    return runtime.submit(run())


# -- processes and tasks ---------------------------------------------------------------------------

def descendants(root: int | None = None) -> dict[int, str]:
    """Live (non-zombie) descendants of this process: pid -> command line."""
    return {pid: procs.cmdline(pid) for pid in procs.descendants(root)}


def wait_gone(pids: set[int], timeout: float = 10.0) -> set[int]:
    """The ``pids`` still alive after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        alive = pids & set(descendants())
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def loop_tasks() -> set[int]:
    async def snapshot() -> set[int]:
        return {id(t) for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}

    return runtime.run_sync(snapshot(), 10)


def wait_tasks(before: set[int], timeout: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while True:
        extra = loop_tasks() - before
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.1)


# -- fixtures ----------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def importable_tasksets() -> Iterator[None]:
    """The library's own runs (the reference) import the tasksets by name."""
    with importable(ENVS):
        yield


@pytest.fixture(scope="module")
def arith_env() -> Iterator[AgentEnv]:
    env = AgentEnv(VerifiersV1Adapter(source=ARITH))
    yield env
    env.close()


@pytest.fixture(scope="module")
def arith_runs(arith_env: AgentEnv) -> tuple[dict[int, tuple[float, bool, bool, dict]], dict[int, tuple]]:
    """(the adapter's episodes, the library's own evaluation) of every train task with ``arith_policy``.

    The library's run overlaps ours on the runtime loop: both are mostly subprocess start-up.
    """
    library = library_rewards("vf1_arith", arith_policy, [0, 1, 2])
    ours = {}
    for i in range(arith_env.num_tasks("train")):
        reward, terminated, truncated, info, _ = play(arith_env, arith_policy, i)
        ours[i] = (reward, terminated, truncated, info)
    return ours, library.result(120)


@pytest.fixture(scope="module")
def arith_rewards(arith_runs: tuple) -> dict[int, tuple[float, bool, bool, dict]]:
    return arith_runs[0]


# -- tests -------------------------------------------------------------------------------------

def test_tasks_and_splits(arith_env: AgentEnv) -> None:
    base = arith_env.unwrapped
    assert [(s.name, s.type) for s in base.splits()] == [("train", "train"), ("test", "test")]
    assert base.num_tasks("train") == 3 and base.num_tasks("test") == 2
    task = base.task("test", 1)
    assert task["prompt"] == "What is 3 * 3?" and task["answer"] == "9" and task["type"] == "ArithTask"
    obs, info = arith_env.reset(options={"split": "test", "index": 0})
    assert obs == [{"role": "system", "content": "Answer with the number only."},
                   {"role": "user", "content": "What is 9 + 9?"}]
    assert info["tools"] == [] and info["task_id"] == "test-0" and info["harness"] == "null"
    # uv next to sys.executable (a venv's bin) but not on PATH: the adapter put it on PATH
    bindir = Path(sys.executable).parent
    assert base.adapter.uv_path_added in (None, str(bindir))
    if (bindir / "uv").exists():
        assert shutil.which("uv")
    _, reward, terminated, truncated, info = arith_env.step("18")
    assert (reward, terminated, truncated, info["stop_condition"]) == (1.0, True, False, "agent_completed")


def test_chat_rewards_equal_the_library_evaluation(arith_runs: tuple) -> None:
    arith_rewards, theirs = arith_runs
    ours = {i: r[0] for i, r in arith_rewards.items()}
    assert ours == {i: t[0] for i, t in theirs.items()} == {0: 1.0, 1: 1.0, 2: 0.0}
    for reward, terminated, truncated, info in arith_rewards.values():
        assert terminated and not truncated and info["stop_condition"] == "agent_completed"
        assert info["rewards"] == {"exact_match": reward} and "error" not in info


def test_tool_rewards_equal_the_library_evaluation() -> None:
    """Per-rollout tool servers: the reward, metrics and stop condition are the library's."""
    before = set(descendants())
    library = library_rewards("vf1_calc", calc_policy, [0])  # overlaps ours: half the wall time
    env = AgentEnv(VerifiersV1Adapter(source=CALC))
    try:
        reward, terminated, truncated, info, history = play(env, calc_policy, 0)
    finally:
        env.close()
    theirs = library.result(120)[0]
    tool_results = [m for m in history if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["name"]) for m in tool_results] == [
        ("call_1", "calc_multiply"), ("call_2", "calc_multiply"), ("call_3", "nope")]
    assert tool_results[0]["content"] == "156"
    assert "invalid JSON" in tool_results[1]["content"]  # the harness's own answers; the episode went on
    assert "unknown tool" in tool_results[2]["content"]
    assert (reward, info["metrics"], info["stop_condition"]) == theirs == (1.0, {"tool_calls": 3.0}, "agent_completed")
    assert terminated and not truncated
    assert not wait_gone(set(descendants()) - before), "processes outlived the episode"


def test_bad_json_and_unknown_tools_reach_the_agent() -> None:
    """Shared tool server; bad JSON, a JSON non-object and unknown tools are tool results, and play goes on."""
    env = AgentEnv(VerifiersV1Adapter(source=CALC, env_args=SHARED))
    try:
        obs, info = env.reset(options={"index": 1})
        assert [t["function"]["name"] for t in info["tools"]] == ["calc_multiply"]
        obs, reward, terminated, truncated, info = env.step(_call("calc_multiply", '{"a": 7, "b": ', "bad1"))
        assert [(m["role"], m["tool_call_id"]) for m in obs] == [("tool", "bad1")]
        assert "invalid JSON" in obs[0]["content"] and not (terminated or truncated)
        obs, *_ = env.step(_call("calc_multiply", "[7, 8]", "bad2"))
        assert "must be a JSON object" in obs[0]["content"]
        obs, reward, terminated, truncated, _ = env.step(_call("nope", "{}", "c3"))
        assert obs == [{"role": "tool", "tool_call_id": "c3", "content": "error: unknown tool 'nope'", "name": "nope"}]
        assert not (terminated or truncated)
        both = _call("calc_multiply", '{"a": 7, "b": 8}', "ok")  # one good call, one bad, in one message
        both["tool_calls"].append({"id": "bad3", "type": "function", "function": {"name": "calc_multiply", "arguments": "{"}})
        obs, *_ = env.step(both)
        assert [m["tool_call_id"] for m in obs] == ["ok", "bad3"] and obs[0]["content"] == "56"
        obs, reward, terminated, truncated, info = env.step("56")
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert info["num_turns"] == 5 and info["metrics"] == {"tool_calls": 5.0}
    finally:
        env.close()


def test_bad_arguments_answered_by_the_adapter() -> None:
    """``bad_arguments="answer"``: for harnesses that cannot take broken JSON; never forwarded."""
    env = AgentEnv(VerifiersV1Adapter(source=ARITH, bad_arguments="answer"))
    try:
        env.reset(options={"index": 0})
        obs, reward, terminated, truncated, info = env.step(_call("anything", "{oops", "b1"))
        assert obs[0]["tool_call_id"] == "b1" and "not valid JSON" in obs[0]["content"]
        assert info["forwarded"] is False and not (terminated or truncated)
        obs, reward, terminated, truncated, info = env.step("5")
        assert (reward, terminated, info["num_turns"]) == (1.0, True, 1)  # the bad action was no turn
    finally:
        env.close()


def test_limit_stop_is_truncation() -> None:
    env = AgentEnv(VerifiersV1Adapter(source=CALC, max_turns=1))
    try:
        env.reset(options={"index": 0})
        obs, reward, terminated, truncated, info = env.step(_call("calc_multiply", '{"a": 12, "b": 13}', "c1"))
    finally:
        env.close()
    assert (obs, reward, terminated, truncated) == ([], 0.0, False, True)
    assert info["stop_condition"] == "max_turns" and "error" not in info


def test_policy_time_counts_against_the_rollout_timeout() -> None:
    """The library's agent-stage timeout runs while it waits for ``step()``: a slow policy ends
    the rollout, truncated with reward 0.0 (never None). verifiers 0.4 stops it cleanly as
    ``agent_timeout``; 0.3 records a failure (``info["error"]``)."""
    # The budget covers the harness's start too (seconds on a loaded machine): generous, then
    # the agent thinks past all of it.
    env = AgentEnv(VerifiersV1Adapter(source=ARITH, timeouts={"rollout": 10.0}))
    try:
        env.reset(options={"index": 0})
        time.sleep(10.5)
        obs, reward, terminated, truncated, info = env.step("5")
    finally:
        env.close()
    assert (obs, reward, terminated, truncated) == ([], 0.0, False, True)
    assert "timeout" in f"{info['stop_condition']} {info.get('error', {}).get('message', '')}"


def test_reset_mid_episode_stops_the_old_rollout(arith_env: AgentEnv) -> None:
    before = set(descendants())
    arith_env.reset(options={"index": 0})
    first = set(descendants()) - before
    assert first, "the rollout's harness runs as a child process"
    arith_env.reset(options={"index": 1})  # abandons the first rollout while its harness waits
    assert not wait_gone(first), "the abandoned rollout's processes are still running"
    _, reward, terminated, *_ = arith_env.step("42")
    assert (reward, terminated) == (1.0, True)
    assert not wait_gone(set(descendants()) - before)


def test_close_mid_episode_leaves_nothing_running() -> None:
    before_pids, before_tasks = set(descendants()), loop_tasks()
    env = AgentEnv(VerifiersV1Adapter(source=CALC))
    env.reset(options={"index": 0})
    env.step(_call("calc_multiply", '{"a": 12, "b": 13}', "c1"))  # the tool server has served a call
    running = descendants()
    started = set(running) - before_pids
    commands = [running[p] for p in started]
    assert any("vf1_calc.tools" in c for c in commands), commands  # the per-rollout tool server
    assert any("--base-url=" in c for c in commands), commands  # the harness program
    env.close()  # while the harness waits for the model
    assert not wait_gone(started), "processes outlived close()"
    assert not wait_tasks(before_tasks), "asyncio tasks outlived close()"


def test_vector_env_rewards_equal_single_envs(arith_rewards: dict) -> None:
    from openenv_gym import vector

    before = set(descendants())
    envs = vector.make(3, AdapterSpec("openenv_gym.adapters.verifiers.v1:VerifiersV1Adapter", {"source": str(ARITH)}))
    try:
        obs, infos = envs.reset(seed=[0, 1, 2])
        indices = list(infos["index"])
        actions = [arith_policy(o) for o in obs]
        _, rewards, terminated, truncated, _ = envs.step(actions)
    finally:
        envs.close()
    assert [float(r) for r in rewards] == [arith_rewards[i][0] for i in indices]
    assert all(terminated) and not any(truncated)
    assert not wait_gone(set(descendants()) - before)


def test_check_env(arith_env: AgentEnv) -> None:
    from gymnasium.utils.env_checker import check_env

    check_env(arith_env, skip_render_check=True)


def test_http_transport_gives_the_same_rewards(arith_rewards: dict) -> None:
    """The no-private-API path (a local OpenAI-compatible endpoint) plays the same episodes."""
    env = AgentEnv(VerifiersV1Adapter(source=ARITH, transport="http"))
    try:
        reward, terminated, _, info, _ = play(env, arith_policy, 1)
        assert env.unwrapped.adapter.info()["transport"] == "http"
    finally:
        env.close()
    assert (reward, terminated, info["stop_condition"]) == (arith_rewards[1][0], True, "agent_completed")


def test_the_handoff_serves_calls_in_order_one_at_a_time() -> None:
    """The object where the library's model calls meet the agent's actions, on its own."""
    from openenv_gym.adapters.verifiers.v1_handoff import CallRouter, Handoff
    from openenv_gym.errors import BackendError

    async def scenario() -> None:
        handoff, router = Handoff(), CallRouter()
        router.bind("trace-1", handoff)
        first = asyncio.ensure_future(router.answer({"n": 1}, "trace-1"))  # the library's side
        second = asyncio.ensure_future(handoff.ask({"n": 2}))
        rollout = asyncio.get_running_loop().create_future()
        assert (await handoff.next_call(rollout)).body == {"n": 1}
        handoff.take().reply({"answer": 1})
        assert await first == {"answer": 1}
        with pytest.raises(BackendError, match="no pending model call"):
            handoff.take()
        assert (await handoff.next_call(rollout)).body == {"n": 2}
        handoff.close()  # the episode closes: the library's waiting call is cancelled
        with pytest.raises(asyncio.CancelledError):
            await second
        rollout.set_result(None)  # the rollout ended instead of calling again
        assert await handoff.next_call(rollout) is None
        router.unbind("trace-1", handoff)
        # The library's interception server turns a ProviderError into an HTTP answer to the harness.
        with pytest.raises(vf.ProviderError, match="no live openenv_gym episode") as info:
            await router.answer({"n": 3}, "trace-1")
        assert getattr(info.value, "status_code", None) == 409  # the harness must not retry it

    asyncio.run(scenario())


# -- configuration and version gating (no processes) ---------------------------------------------

def _package(tmp_path: Path, name: str, body: str, pyproject: str | None = None) -> Path:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    if pyproject is not None:
        (pkg / "pyproject.toml").write_text(textwrap.dedent(pyproject))
    return pkg


def test_a_source_needing_newer_names_is_refused(tmp_path: Path) -> None:
    pkg = _package(tmp_path, "vf1_future", """
        import verifiers.v1 as vf
        from verifiers.v1 import Taskset, HoloDeck

        class FutureTaskset(vf.Taskset):
            def load(self):
                return [vf.QuantumTask()]

        __all__ = ["FutureTaskset"]
    """)
    with pytest.raises(ConfigurationError, match=r"HoloDeck.*QuantumTask.*newer verifiers|QuantumTask"):
        v1mod.check_source_compat(pkg)
    adapter = VerifiersV1Adapter(source=pkg)
    with pytest.raises(ConfigurationError, match="newer verifiers"):
        runtime.run_sync(adapter.start(), 60)
    runtime.run_sync(adapter.aclose(), 60)


def test_a_source_requiring_a_newer_release_is_refused(tmp_path: Path) -> None:
    pkg = _package(tmp_path, "vf1_pinned", "import verifiers.v1 as vf\n",
                   '[project]\nname = "vf1-pinned"\ndependencies = ["verifiers>=99.0"]\n')
    with pytest.raises(ConfigurationError, match=r"verifiers>=99.0"):
        v1mod.check_source_compat(pkg)


def test_missing_verifiers_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verifiers", None)
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'verifiers>=0.4'"):
        v1mod._import_v1()


def test_bad_arguments() -> None:
    with pytest.raises(ConfigurationError):
        VerifiersV1Adapter()
    with pytest.raises(ConfigurationError, match="timeout"):
        VerifiersV1Adapter(env_id="x", timeouts={"agent": 1})
    with pytest.raises(ConfigurationError):
        VerifiersV1Adapter(env_id="x", transport="carrier-pigeon")
    with pytest.raises(ConfigurationError):
        VerifiersV1Adapter(env_id="x", bad_arguments="ignore")
    with pytest.raises(FileNotFoundError):
        VerifiersV1Adapter(source="/nonexistent/vf1_nothing")
    adapter = VerifiersV1Adapter(env_id="vf1_no_such_taskset_anywhere")
    with pytest.raises(ConfigurationError, match="cannot be imported"):
        runtime.run_sync(adapter.start(), 60)


def _resolve_source(source: Path) -> tuple[Path, str]:
    """(import root, module) of a source, as the v1 adapter resolves it (the shared resolver)."""
    from openenv_gym.adapters.verifiers.detect import resolve_source

    found = resolve_source(source, noun="taskset")
    return found.root, found.module


def test_source_layouts(tmp_path: Path) -> None:
    """A package folder, a module file, or a project folder holding the module under its name."""
    project = tmp_path / "my-env"
    (project / "my_env").mkdir(parents=True)
    (project / "my_env" / "__init__.py").write_text("")
    assert _resolve_source(project) == (project.resolve(), "my_env")
    assert _resolve_source(project / "my_env") == (project.resolve(), "my_env")
    (tmp_path / "flat.py").write_text("")
    assert _resolve_source(tmp_path / "flat.py") == (tmp_path.resolve(), "flat")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigurationError, match="cannot tell the taskset module"):
        _resolve_source(tmp_path / "empty")
    assert VerifiersV1Adapter(source=project).env_id == "my_env"


def test_a_taskset_whose_own_import_fails_says_what_failed(tmp_path: Path) -> None:
    """The library reports any ModuleNotFoundError met while importing a taskset as "taskset not
    found"; the adapter reports the error that really happened (a dependency the project declares)."""
    pkg = _package(tmp_path, "vf1_needs_figures", "import no_such_dependency_xyz\n" + (ARITH / "__init__.py").read_text())
    adapter = VerifiersV1Adapter(source=pkg)
    try:
        with pytest.raises(ConfigurationError, match="No module named 'no_such_dependency_xyz'") as info:
            runtime.run_sync(adapter.start(), 60)
        assert "not found" not in str(info.value)
    finally:
        runtime.run_sync(adapter.aclose(), 60)


def port_files() -> set[str]:
    """The port files (``MCP_PORT_FILE``) named in the environment of this process's tool servers."""
    found = set()
    for pid in descendants():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found |= {item.split(b"=", 1)[1].decode() for item in environ if item.startswith(b"MCP_PORT_FILE=")}
    return found


@pytest.mark.parametrize("env_args", [{}, SHARED], ids=["per-rollout", "shared"])
def test_no_port_file_of_the_librarys_tool_servers_is_left_behind(env_args: dict) -> None:
    """Each tool server the library starts writes its port to /tmp/vf-port-<hex>, which the library
    never removes: the adapter removes those of the servers it had started, once they exit."""
    env = AgentEnv(VerifiersV1Adapter(source=CALC, env_args=env_args))
    seen: set[str] = set()
    try:
        for index in ((0,) if env_args else (0, 1)):  # a second reset abandons the first rollout
            env.reset(options={"index": index})
            files = port_files()
            assert files and all(Path(f).is_file() for f in files)
            seen |= files
    finally:
        env.close()
    assert len(seen) == (1 if env_args else 2)  # one shared server, or one per rollout
    assert not [f for f in seen if Path(f).exists()]


def test_the_http_policy_endpoint_answers_only_requests_with_its_key() -> None:
    """Any local user can reach a loopback port: a model call without the server's key is refused
    before it reaches an episode (the library's own client sends the key: the test above)."""
    import aiohttp

    from openenv_gym.adapters.verifiers.v1_handoff import CallRouter
    from openenv_gym.adapters.verifiers.v1_servers import POLICY_KEY_HEADER, PolicyHTTPServer

    async def scenario() -> None:
        server = PolicyHTTPServer(CallRouter())
        await server.start()
        try:
            url = server.base_url + "/chat/completions"
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with aiohttp.ClientSession() as client:
                for headers in ({}, {POLICY_KEY_HEADER: "guess"}, {POLICY_KEY_HEADER: server.key[:-1]},
                                {"Authorization": f"Bearer {server.key}"}):
                    async with client.post(url, json=body, headers={"X-Session-ID": "t", **headers}) as r:
                        assert r.status == 401, headers
                # With the key, the call reaches the router, which knows no episode of that trace.
                async with client.post(url, json=body, headers={"X-Session-ID": "t", POLICY_KEY_HEADER: server.key}) as r:
                    assert r.status == 409
                    assert "no live openenv_gym episode" in (await r.json())["error"]["message"]
        finally:
            await server.stop()

    asyncio.run(scenario())


# -- endless tasksets ------------------------------------------------------------------------------

ENDLESS = ENVS / "vf1_endless"


def test_an_endless_taskset_plays_task_k_for_seed_k_without_max_tasks() -> None:
    """``INFINITE = True`` (as color_codeword_v1 and kuhn_poker_v1 declare): no ``max_tasks=``
    needed, ``num_tasks`` says unbounded, seed ``k`` and index ``k`` play task ``k``, and the
    generator is read only as far as asked."""
    import gymnasium as gym

    import openenv_gym  # noqa: F401 - registers openenv/Verifiers-v0
    from openenv_gym.wire import UNBOUNDED_TASKS

    with importable(ENVS):
        import vf1_endless
    env = gym.make("openenv/Verifiers-v0", source=str(ENDLESS))
    try:
        base = env.unwrapped
        assert base.num_tasks("train") == UNBOUNDED_TASKS == 2**31 - 1
        obs, info = env.reset(seed=5)
        assert (info["index"], obs[-1]["content"]) == (5, vf1_endless.expected(5)[0])
        obs, info = env.reset()  # the next task, unseeded
        assert (info["index"], obs[-1]["content"]) == (6, vf1_endless.expected(6)[0])
        obs, info = env.reset(options={"index": 40})
        assert obs[-1]["content"] == vf1_endless.expected(40)[0] and info["task_id"] == "sum-40"
        assert base.task("train", 12)["answer"] == vf1_endless.expected(12)[1]
        _, reward, terminated, _, _ = env.step(vf1_endless.expected(40)[1])
        assert (reward, terminated) == (1.0, True)
        assert sys.modules["vf1_endless"].DRAWN[0] == 41  # the adapter's copy read to task 40, no further
        with pytest.raises(TaskNotFound, match="ENDLESS_READ"):
            env.reset(options={"index": v1mod.ENDLESS_READ})
    finally:
        env.close()
    # max_tasks= still reads a finite prefix
    env = gym.make("openenv/Verifiers-v0", source=str(ENDLESS), max_tasks=3)
    try:
        assert env.unwrapped.num_tasks("train") == 3
        with pytest.raises(TaskNotFound):
            env.reset(options={"index": 3})
    finally:
        env.close()


def test_a_vector_env_plays_every_task_of_an_endless_taskset_once() -> None:
    """Sub-env i of n walks the endless split from task seed + i in steps of n."""
    import gymnasium as gym

    import openenv_gym  # noqa: F401

    envs = gym.make_vec("openenv/Verifiers-v0", num_envs=3, source=str(ENDLESS))
    try:
        played = []
        _, infos = envs.reset(seed=10)
        played += list(infos["index"])
        for _ in range(2):
            _, _, _, _, infos = envs.step(["0"] * 3)  # one answer ends each episode
            _, infos = envs.reset()
            played += list(infos["index"])
        assert sorted(played) == list(range(10, 19))
    finally:
        envs.close()


# -- the tested set ---------------------------------------------------------------------------------

def test_a_builtin_harness_resolves_at_the_tested_date_and_the_users_env_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from openenv_gym import pins

    monkeypatch.delenv(pins.CONSTRAINTS_VAR, raising=False)
    monkeypatch.delenv("UV_EXCLUDE_NEWER", raising=False)
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    date = pins.active().exclude_newer
    assert date, "the shipped constraints date the harness scripts"
    held = v1mod._held_to_pins({"id": "null"}, local=True)
    assert held["env"]["UV_EXCLUDE_NEWER"] == date and held["env"]["PIP_CONSTRAINT"].endswith(".txt")
    own = v1mod._held_to_pins({"id": "null", "env": {"UV_EXCLUDE_NEWER": "2020-01-01T00:00:00Z"}}, local=True)
    assert own["env"]["UV_EXCLUDE_NEWER"] == "2020-01-01T00:00:00Z"  # the user's harness env wins
    assert "PIP_CONSTRAINT" not in v1mod._held_to_pins({"id": "bash"}, local=False)["env"]  # no host path in a box
    assert v1mod._held_to_pins({"id": "my_own_harness"}, local=True) == {"id": "my_own_harness"}
    monkeypatch.setenv("UV_EXCLUDE_NEWER", "2021-01-01T00:00:00Z")  # set by the user: left to uv
    assert "UV_EXCLUDE_NEWER" not in v1mod._held_to_pins({"id": "null"}, local=True)["env"]
    monkeypatch.setenv(pins.CONSTRAINTS_VAR, "none")
    assert v1mod._held_to_pins({"id": "null"}, local=True) == {"id": "null"}


def test_the_agent_config_carries_the_date_to_the_harness(arith_env: AgentEnv) -> None:
    from openenv_gym import pins

    harness = arith_env.unwrapped.adapter._agent_configs["agent"].harness
    assert harness.env.get("UV_EXCLUDE_NEWER") == pins.active().exclude_newer


HARNESS_TAIL = '''le "/u/env/lib/python3.11/site-packages/openai/_base_client.py", line 1676, in __init__
    self._client = http_client or AsyncHttpxClientWrapper(
                                  ^^^^^^^^^^^^^^^^^^^^^^^^
  File "/u/env/lib/python3.11/site-packages/httpx2/_config.py", line 132, in __init__
    raise TypeError(
TypeError: Invalid timeout: expected a number, `None`, a tuple or `httpx2.Timeout`, got <class 'httpx.Timeout'>.
Exception ignored in: <function AsyncHttpxClientWrapper.__del__ at 0x7f>
Traceback (most recent call last):
  File "/u/env/lib/python3.11/site-packages/httpx2/_client.py", line 214, in is_closed
AttributeError: 'AsyncHttpxClientWrapper' object has no attribute '_state'
'''


def test_a_dead_harness_reports_its_exception_first_and_whole_lines() -> None:
    """The library keeps the last 2,000 characters of the program's output, cut mid-word."""
    # the kept tail starts inside a frame's path, as the library's cut leaves it
    padding = "p" * (v1mod.LIBRARY_TAIL - len(HARNESS_TAIL) - 1)
    detail = HARNESS_TAIL.replace("/u/env/", f"/u/env/{padding}/", 1)
    assert len(detail) == v1mod.LIBRARY_TAIL
    message = whole_error(f"harness 'null' exited 1: {detail}")
    assert message.startswith("TypeError: Invalid timeout: expected a number")
    assert "(harness 'null' exited 1; the end of its output:\n    self._client = http_client" in message
    assert padding not in message  # the cut line is dropped, not shown from mid-word
    assert whole_error("stop condition 'max_turns'") == "stop condition 'max_turns'"
