"""The Fleet adapter against the project's Fleet-compatible server (a real subprocess on 127.0.0.1).

fleet-python and the mcp client are the real ones; only the Fleet service is local. Each test
checks something a user relies on: rewards from the task's verifier, instances that never leak,
transient failures retried and fatal ones surfaced at once, MCP sessions that survive a drop,
bad tool calls that reach the agent as messages.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

pytest.importorskip("fleet", reason="the fleet extra is not installed")

import openenv_gym  # noqa: E402,F401
from openenv_gym.errors import ProvisioningError, ServerError  # noqa: E402
from openenv_gym.testing.fleet import EXAMPLE_TASKS, FleetTestServer, write_example_tasks  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[FleetTestServer]:
    srv = FleetTestServer().start()
    yield srv
    srv.stop()
    assert not Path(f"/proc/{srv.pid}").exists()


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fleet") / "tasks.json"
    write_example_tasks(path)
    return path


def _make(server: FleetTestServer, tasks_file: Path, **kwargs: Any) -> Any:
    kwargs.setdefault("retry_backoff", 0.05)
    return gym.make("openenv/Fleet-v0", tasks=str(tasks_file), api_key=server.api_key, base_url=server.url, **kwargs)


def _where(env: Any, key: str) -> tuple[str, int]:
    """(split, index) of the task called ``key``."""
    base = env.unwrapped
    for split in base.splits():
        for i in range(base.num_tasks(split.name)):
            if base.task(split.name, i)["key"] == key:
                return split.name, i
    raise KeyError(key)


def _reset_to(env: Any, key: str) -> tuple[list, dict]:
    split, index = _where(env, key)
    return env.reset(options={"split": split, "index": index})


def call(name: str, cid: str = "c1", **arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def _status(server: FleetTestServer, instance_id: str) -> str:
    return next(i["status"] for i in server.instances() if i["instance_id"] == instance_id)


def test_episode_reward_one_then_zero_on_a_reused_instance(server, tasks_file):
    env = _make(server, tasks_file)
    try:
        obs, info = _reset_to(env, "create-login-bug")
        assert obs[-1]["role"] == "user" and "Login fails" in obs[-1]["content"]
        names = {t["function"]["name"] for t in info["tools"]}
        assert {"create_issue", "list_issues", "close_issue", "submit_final_answer"} <= names
        assert "computer" not in names  # tool_use keeps the API tools only
        first = info["instance_id"]
        assert _status(server, first) == "running" and info["instance_reused"] is False

        obs, reward, terminated, truncated, info = env.step(call("create_issue", title="Login fails", body="500 on submit"))
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert obs[0]["role"] == "tool" and obs[0]["tool_call_id"] == "c1" and "Login fails" in obs[0]["content"]
        obs, reward, terminated, truncated, info = env.step(call("submit_final_answer", answer="done"))
        assert reward == 1.0 and terminated and not truncated
        assert info["verifier"]["success"] is True

        # The next episode reuses the instance: it is reset, so the issue created above is gone.
        obs, info = _reset_to(env, "create-login-bug")
        assert info["instance_id"] == first and info["instance_reused"] is True
        obs, reward, terminated, truncated, info = env.step(call("submit_final_answer", answer="done"))
        assert reward == 0.0 and terminated
    finally:
        env.close()
    assert _status(server, first) == "stopped"


def test_final_answer_reaches_the_verifier(server, tasks_file):
    env = _make(server, tasks_file)
    try:
        _reset_to(env, "count-open")
        obs, reward, terminated, _, _ = env.step(call("submit_final_answer", answer="2"))
        assert reward == 1.0 and terminated
        _reset_to(env, "count-open")
        obs, reward, terminated, _, _ = env.step(call("submit_final_answer", answer="3"))
        assert reward == 0.0 and terminated
    finally:
        env.close()


def test_partial_credit_from_the_verifiers_accumulators(server, tasks_file):
    env = _make(server, tasks_file)
    strict = _make(server, tasks_file, partial_credit=False)
    try:
        for e, expected in ((env, 0.5), (strict, 0.0)):
            _reset_to(e, "triage")
            e.step(call("create_issue", title="Crash on save"))
            _, reward, terminated, _, info = e.step(call("submit_final_answer", answer="done"))
            assert terminated and reward == pytest.approx(expected)
            assert (info["verifier"]["checks_passed"], info["verifier"]["checks_failed"]) == (1, 1)
        _reset_to(env, "triage")
        env.step(call("create_issue", title="Crash on save"))
        env.step(call("close_issue", issue_id=1))
        assert env.step(call("submit_final_answer", answer="done"))[1] == 1.0
    finally:
        env.close()
        strict.close()


def test_new_instance_per_episode_when_reuse_is_off(server, tasks_file):
    env = _make(server, tasks_file, reuse_instance=False)
    try:
        _, info = _reset_to(env, "count-open")
        first = info["instance_id"]
        _, info = _reset_to(env, "count-open")
        assert info["instance_id"] != first
        assert _status(server, first) == "stopped" and _status(server, info["instance_id"]) == "running"
    finally:
        env.close()
    assert _status(server, info["instance_id"]) == "stopped"


def test_bad_tool_calls_reach_the_agent_and_the_episode_goes_on(server, tasks_file):
    env = _make(server, tasks_file)
    try:
        _reset_to(env, "create-login-bug")
        obs, reward, terminated, truncated, _ = env.step(call("no_such_tool", x=1))
        assert "unknown tool" in obs[0]["content"] and not (terminated or truncated)
        bad_json = {"role": "assistant", "tool_calls": [{"id": "b", "type": "function",
                                                         "function": {"name": "create_issue", "arguments": "{title: oops"}}]}
        obs, *_ = env.step(bad_json)
        assert obs[0]["tool_call_id"] == "b" and "not valid JSON" in obs[0]["content"]
        obs, *_ = env.step(call("create_issue"))  # missing the required title
        assert "missing required argument" in obs[0]["content"]
        obs, *_ = env.step(call("close_issue", issue_id=999))  # the tool itself fails
        assert obs[0]["content"].startswith("Error") and "999" in obs[0]["content"]
        obs, *_ = env.step("just text")
        assert obs[0]["role"] == "user" and "submit_final_answer" in obs[0]["content"]
        obs, reward, terminated, *_ = env.step(call("create_issue", title="Login fails"))
        assert not terminated
        assert env.step(call("submit_final_answer", answer="x"))[1] == 1.0
    finally:
        env.close()


def test_mcp_session_reconnects_after_the_server_drops_it(server, tasks_file):
    env = _make(server, tasks_file)
    try:
        _, info = _reset_to(env, "create-login-bug")
        mcp_path = f"/{info['instance_id']}/mcp"
        env.step(call("list_issues"))
        assert server.drop_mcp_sessions() >= 1
        obs, reward, terminated, truncated, info = env.step(call("create_issue", title="Login fails"))
        assert "Login fails" in obs[0]["content"] and info["calls"][0]["ok"]
        inits = [r for r in server.requests() if r["path"] == mcp_path and (r.get("json") or {}).get("method") == "initialize"]
        assert len(inits) == 2  # the dropped session was replaced by a new one
        assert env.step(call("submit_final_answer", answer="x"))[1] == 1.0
    finally:
        env.close()


def test_stateless_mcp_server(tasks_file):
    with FleetTestServer(mcp_mode="stateless", require_runner_token=True) as srv:
        env = _make(srv, tasks_file)
        try:
            _reset_to(env, "create-login-bug")
            env.step(call("create_issue", title="Login fails"))
            assert env.step(call("submit_final_answer", answer="x"))[1] == 1.0
        finally:
            env.close()


def test_computer_use_gets_the_computer_tool_and_screenshots(server, tasks_file):
    key = next(t["key"] for t in EXAMPLE_TASKS if t.get("task_modality") == "computer_use")
    env = _make(server, tasks_file)
    try:
        _, info = _reset_to(env, key)
        names = [t["function"]["name"] for t in info["tools"]]
        assert names == ["computer", "submit_final_answer"]
        create = next(r for r in server.requests() if r["method"] == "POST" and r["path"] == "/v1/env/instances"
                      and (r.get("json") or {}).get("image_type") == "mcp")
        assert create is not None
        obs, *_ = env.step(call("computer", action="screenshot"))
        parts = obs[0]["content"]
        assert isinstance(parts, list)
        assert any(p["type"] == "image_url" and p["image_url"]["url"].startswith("data:image/png;base64,") for p in parts)
    finally:
        env.close()


def test_transient_503s_are_retried_with_the_same_request_id(server, tasks_file):
    before = len(server.requests())
    server.inject(503, r"^/v1/env/instances$", method="POST", times=2)
    env = _make(server, tasks_file, reuse_instance=False)
    try:
        _, info = _reset_to(env, "count-open")
        creates = [r for r in server.requests()[before:] if r["method"] == "POST" and r["path"] == "/v1/env/instances"]
        assert [r["status"] for r in creates] == [503, 503, 200]
        assert len({r["request_id"] for r in creates}) == 1
        assert _status(server, info["instance_id"]) == "running"
    finally:
        env.close()


def test_a_lost_create_response_makes_one_instance_not_two(server, tasks_file):
    running = {i["instance_id"] for i in server.instances()}
    server.inject_lost_response(times=1)
    env = _make(server, tasks_file)
    try:
        _, info = _reset_to(env, "count-open")
        new = [i for i in server.instances() if i["instance_id"] not in running]
        assert [i["instance_id"] for i in new] == [info["instance_id"]]
    finally:
        env.close()


def test_bad_env_key_fails_without_a_retry_with_fleets_message(server, tasks_file):
    before = len(server.requests())
    env = gym.make("openenv/Fleet-v0", env_key="no-such-env", prompt="hi", api_key=server.api_key, base_url=server.url)
    try:
        with pytest.raises(ProvisioningError, match="no-such-env") as err:
            env.reset()
        assert "NotFound" in str(err.value)
    finally:
        env.close()
    creates = [r for r in server.requests()[before:] if r["path"] == "/v1/env/instances"]
    assert len(creates) == 1  # not retried


def test_bad_api_key_is_a_provisioning_error(server, tasks_file):
    env = gym.make("openenv/Fleet-v0", env_key="issues", api_key="wrong-key", base_url=server.url)
    try:
        with pytest.raises(ProvisioningError, match="Authentication"):
            env.reset()
    finally:
        env.close()


def test_api_key_stays_out_of_the_spec_and_the_request_log(server, tasks_file):
    env = _make(server, tasks_file, env_variables={"TOKEN": "hidden-value"})
    try:
        assert env.spec.kwargs["api_key"] == "***"
        assert env.unwrapped.spec.kwargs["env_variables"] == {"TOKEN": "***"}
        assert server.api_key not in env.spec.to_json()
        _reset_to(env, "count-open")
    finally:
        env.close()
    assert server.api_key not in json.dumps(server.requests())


def test_a_failing_verifier_call_deletes_the_instance_and_raises(server, tasks_file):
    env = _make(server, tasks_file, max_retries=1)
    try:
        _, info = _reset_to(env, "count-open")
        server.inject(500, r"^/v1/verifiers/", times=10)
        with pytest.raises(ServerError, match="verifier"):
            env.step(call("submit_final_answer", answer="2"))
        assert _status(server, info["instance_id"]) == "stopped"
        server.inject(500, r"^/v1/verifiers/", times=0)
        _, info2 = _reset_to(env, "count-open")  # the env recovers with a new instance
        assert info2["instance_id"] != info["instance_id"]
    finally:
        env.close()


def test_instances_are_deleted_when_the_process_exits(server, tasks_file, tmp_path):
    script = tmp_path / "leaky.py"
    script.write_text(textwrap.dedent(f"""
        import gymnasium as gym, openenv_gym
        env = gym.make("openenv/Fleet-v0", tasks={str(tasks_file)!r}, base_url={server.url!r})
        obs, info = env.reset()
        print(info["instance_id"], flush=True)
        raise SystemExit("crash without close()")
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "FLEET_API_KEY": server.api_key})
    instance_id = out.stdout.split()[0]
    assert _status(server, instance_id) == "stopped"


def test_check_env_passes(server, tasks_file):
    env = _make(server, tasks_file)
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_vector_env_runs_instances_side_by_side_and_deletes_them(server, tasks_file):
    before = {i["instance_id"] for i in server.instances()}
    envs = gym.make_vec("openenv/Fleet-v0", num_envs=3, tasks=str(tasks_file), split="train",
                        api_key=server.api_key, base_url=server.url)
    try:
        obs, infos = envs.reset(seed=0)
        ids = set(infos["instance_id"])
        assert len(ids) == 3
        obs, rewards, terminated, truncated, infos = envs.step([call("submit_final_answer", answer="x")] * 3)
        assert terminated.all() and set(rewards.tolist()) <= {0.0, 1.0}
    finally:
        envs.close()
    new = [i for i in server.instances() if i["instance_id"] not in before]
    assert new and all(i["status"] == "stopped" for i in new)


def test_import_a_task_file_registers_its_tasks(server, tasks_file):
    from openenv_gym.importing import import_source
    from openenv_gym.registration import register_catalog

    entry = import_source(tasks_file, "IssueTasks", kind="fleet")
    assert entry.kind == "fleet" and entry.env_name == "issues"
    assert "openenv/IssueTasks-v0" in register_catalog()
    env = gym.make("openenv/IssueTasks-v0", api_key=server.api_key, base_url=server.url)
    try:
        splits = {s.name: env.unwrapped.num_tasks(s.name) for s in env.unwrapped.splits()}
        assert splits == {s: sum(t.get("split", "train") == s for t in EXAMPLE_TASKS) for s in splits}
    finally:
        env.close()


def test_import_detects_the_kind_and_refuses_broken_verifiers(tmp_path):
    from openenv_gym.errors import DetectionError
    from openenv_gym.importers import detect

    good = tmp_path / "ok.json"
    good.write_text(json.dumps([{"key": "t", "prompt": "p", "env_id": "issues", "verifier_func": "def verify(env):\n    return 1"}]))
    assert detect(good).kind == "fleet"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"key": "t", "prompt": "p", "env_id": "issues", "verifier_func": "def verify(:"}]))
    with pytest.raises(DetectionError, match="does not parse"):
        detect(bad, kind="fleet")


def test_context_management_pages_a_long_tool_output_back_exactly(server, tasks_file):
    from openenv_gym.wrappers import ContextManagement

    plain = _make(server, tasks_file)
    env = ContextManagement(_make(server, tasks_file), max_output_chars=2000)
    try:
        _reset_to(plain, "create-login-bug")
        full = plain.step(call("read_log", lines=300))[0][0]["content"]
        assert len(full) > 10_000
        _, info = _reset_to(env, "create-login-bug")
        assert {"view_tool_output", "search_tool_output"} <= {t["function"]["name"] for t in info["tools"]}
        shown = env.step(call("read_log", lines=300))[0][0]["content"]
        assert len(shown) < 2500 and "view_tool_output" in shown
        output_id = int(re.search(r"output_id[=: ]+(\d+)", shown).group(1))
        pages, page = [], 1
        while True:
            answer = env.step(call("view_tool_output", cid=f"v{page}", output_id=output_id, page=page))[0][0]["content"]
            header, _, body = answer.partition("\n")
            pages.append(body)
            count = int(re.search(r"page \d+ of (\d+)", header).group(1))
            if page == count:
                break
            page += 1
        assert "".join(pages) == full
    finally:
        env.close()
        plain.close()


def test_heartbeats_keep_an_instance_with_a_heartbeat_deadline_alive(server, tasks_file):
    import time

    env = _make(server, tasks_file, heartbeat_interval=2)
    try:
        _, info = _reset_to(env, "count-open")
        time.sleep(3.0)  # past the 2 s deadline: only the adapter's beats keep it running
        instance = next(i for i in server.instances() if i["instance_id"] == info["instance_id"])
        assert instance["heartbeats"] >= 2 and instance["status"] == "running"
        assert env.step(call("submit_final_answer", answer="2"))[1] == 1.0
    finally:
        env.close()
