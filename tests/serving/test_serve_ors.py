"""A served env over ORS, driven by the ORS ecosystem's own clients (ors-sdk's ``ORS``, the
``openreward`` client) and by raw HTTP, compared step by step with ``gym.make`` of the same id.

One ``openenv-gym serve openenv/Arithmetic-v0`` process per module (started and stopped by PID);
a second small one (``--max-sessions 2``, a short idle limit) for capacity and reaping, and one of
the ORS probe env for streams: chunked results, images, a tool that raises, resumes.
"""

from __future__ import annotations

import json
import time
import uuid

import gymnasium as gym
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_helpers import ARITHMETIC, PROBE, call, expression, serve_process, start_serve  # noqa: F401 (a fixture)

import openenv_gym  # noqa: F401


@pytest.fixture(scope="module", params=["server", "in_process"])
def arith(request):
    """The served Arithmetic env: over its own ORS server, and (``in_process=true``) run in the
    gateway's process; every test that uses it must hold for both."""
    extra = ["in_process=true"] if request.param == "in_process" else []
    served = start_serve(ARITHMETIC, *extra, "--max-sessions", "16")
    yield served
    assert served.stop() == 0
    assert "stopped" in served.output()


@pytest.fixture(scope="module")
def reference():
    env = gym.make(ARITHMETIC)
    yield env
    env.close()


def sse(response: httpx.Response) -> list[tuple[str, str]]:
    """The events of an SSE answer, as ``(event, data)``."""
    events, name, data = [], None, []
    for line in response.text.splitlines():
        if line.startswith(":"):
            continue
        if not line:
            if name is not None:
                events.append((name, "\n".join(data)))
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
    return events


def create(client: httpx.Client, url: str, headers: dict, **body) -> str:
    sid = uuid.uuid4().hex
    reply = client.post(f"{url}/create", json=body, headers={**headers, "X-Session-ID": sid})
    assert reply.status_code == 200, reply.text
    return sid


# -- the ecosystems' clients ---------------------------------------------------------------------------
def test_ors_sdk_client_plays_each_step_as_gym_make_does(arith, reference):
    from ors.client import ORS, ToolCallError

    with ORS(base_url=arith.url, api_key=arith.token) as client:
        env = client.environment("arithmetic")
        assert env.list_splits() == ["train", "test"]
        assert env.num_tasks("train") == reference.unwrapped.num_tasks("train")
        for index in (0, 7, 1999):
            assert env.get_task("train", index).task_spec == reference.unwrapped.task("train", index)
            obs, _ = reference.reset(options={"split": "train", "index": index})
            with env.session(split="train", index=index) as session:
                assert [b.text for b in session.get_prompt()] == [obs[0]["content"]]
                assert [t.name for t in session.list_tools()] == ["calculator", "submit"]
                # A call the env does not run: the SDK raises ToolCallError with the env's own words.
                said, *_ = reference.step(call("nope"))
                with pytest.raises(ToolCallError) as refused:
                    session.call_tool("nope", {})
                assert str(refused.value) == said[0]["content"]
                said, *_ = reference.step(call("submit", {}))  # a required argument missing
                with pytest.raises(ToolCallError):
                    session.call_tool("submit", {})
                for action in (("calculator", {"expression": expression(obs[0]["content"])}),
                               ("calculator", {"expression": "1 / 0"})):
                    said, reward, terminated, truncated, _ = reference.step(call(*action))
                    out = session.call_tool(*action)
                    assert [b.text for b in out.blocks] == [said[0]["content"]]
                    assert (out.reward, out.finished) == (reward, terminated or truncated)
                answer = reference.unwrapped.task("train", index)["answer"]
                said, reward, terminated, _, _ = reference.step(call("submit", {"answer": answer}))
                out = session.call_tool("submit", {"answer": answer})
                assert (out.reward, out.finished, reward, terminated) == (1.0, True, 1.0, True)
                assert out.metadata == {"turn": 5, "terminated": True, "truncated": False}
                with pytest.raises(ToolCallError, match="finished"):
                    session.call_tool("submit", {"answer": answer})
        task = env.get_task("test", 3)  # a session on an explicit task spec (the ORS Task object)
        with env.session(task=task) as session:
            assert task.task_spec["question"] in session.get_prompt()[0].text
            assert session.call_tool("submit", {"answer": task.task_spec["answer"]}).reward == 1.0


def test_openreward_client_sees_messages_tasks_and_typed_refusals(arith, reference):
    from openreward import OpenReward
    from openreward.api.environments.types import ToolCallError

    client = OpenReward(api_key=arith.token)
    try:
        env = client.environments.get(name="arithmetic", base_url=arith.url)
        assert env.list_splits() == ["train", "test"]
        assert [t.task_spec for t in env.get_task_range("test", 3, 6)] == \
            [reference.unwrapped.task("test", i) for i in range(3, 6)]
        assert env.get_task("test", -1).task_spec == reference.unwrapped.task("test", 499)
        obs, _ = reference.reset(options={"split": "test", "index": 4})
        with env.session(split="test", index=4) as session:
            messages = session.get_messages()
            assert [(m.role, [b.text for b in m.blocks]) for m in messages] == [("user", [obs[0]["content"]])]
            with pytest.raises(ToolCallError) as unknown:
                session.call_tool("nope", {})
            assert unknown.value.reason == "not_found"
            with pytest.raises(ToolCallError) as bad:
                session.call_tool("calculator", {})
            assert bad.value.reason == "input_validation"
            out = session.call_tool("submit", {"answer": "not it"})
            assert (out.reward, out.finished) == (0.0, True)
            with pytest.raises(ToolCallError) as after:
                session.call_tool("submit", {"answer": "4"})
            assert after.value.reason == "episode_finished"
    finally:
        client.close()


def test_many_concurrent_sessions_over_one_server(arith, reference):
    """16 sessions at once through the async ORS client: every one is its own episode."""
    import asyncio

    from ors.client import AsyncORS

    answers = {i: reference.unwrapped.task("train", i)["answer"] for i in range(16)}

    async def play(env, index: int) -> float:
        async with env.session(split="train", index=index) as session:
            prompt = (await session.get_prompt())[0].text
            value = (await session.call_tool("calculator", {"expression": expression(prompt)})).blocks[0].text
            assert value == answers[index]
            return (await session.call_tool("submit", {"answer": value})).reward

    async def main() -> list[float]:
        client = AsyncORS(base_url=arith.url, api_key=arith.token)
        env = client.environment("arithmetic")
        return await asyncio.gather(*(play(env, i) for i in range(16)))

    assert asyncio.run(main()) == [1.0] * 16


# -- the wire, raw ------------------------------------------------------------------------------------
def test_malformed_requests_get_readable_errors_and_the_server_goes_on(arith):
    url, headers = arith.url, arith.headers
    with httpx.Client(timeout=30) as client:
        sid = {"X-Session-ID": "s-" + uuid.uuid4().hex}
        cases = [
            (client.post(f"{url}/create", json={"split": "train", "index": 0}, headers=headers), 400, "X-Session-ID"),
            (client.post(f"{url}/create", content=b"{not json", headers={**headers, **sid}), 422, "not valid JSON"),
            (client.post(f"{url}/create", json={"split": "train", "index": 0, "color": 1}, headers={**headers, **sid}),
             422, "color"),
            (client.post(f"{url}/create", json={"split": "train", "index": 0, "task_spec": {}}, headers={**headers, **sid}),
             422, "either task_spec or both"),
            # The env itself fails on a task spec that lacks what it needs: the caller's to fix.
            (client.post(f"{url}/create", json={"task_spec": {}}, headers={**headers, **sid}),
             400, "could not start an episode on this task_spec"),
            (client.post(f"{url}/create", json={"split": "nope", "index": 0}, headers={**headers, **sid}), 400, "nope"),
            (client.post(f"{url}/create", json={"split": "train", "index": 10**6}, headers={**headers, **sid}),
             400, "outside"),
            (client.post(f"{url}/create", json={"env_name": "other", "split": "train", "index": 0},
                         headers={**headers, **sid}), 404, "unknown environment"),
            (client.post(f"{url}/create", json={"split": "train", "index": 1.5}, headers={**headers, **sid}), 422, "int"),
            (client.get(f"{url}/arithmetic/prompt", headers={**headers, **sid}), 404, "not found"),
            (client.post(f"{url}/arithmetic/call", json={"name": "submit"}, headers=headers), 400, "X-Session-ID"),
            (client.post(f"{url}/arithmetic/num_tasks", json=[1, 2], headers=headers), 422, "object"),
            (client.post(f"{url}/arithmetic/task", json={"split": "train", "index": 2000}, headers=headers), 400, "outside"),
            (client.get(f"{url}/other/tools", headers=headers), 404, "unknown environment"),
            (client.get(f"{url}/no/such/route", headers=headers), 404, "Not Found"),
            (client.post(f"{url}/create", content=b"x" * (9 * 2**20), headers={**headers, **sid}), 413, ""),
            (client.post(f"{url}/create", content=b"[" * 100_000 + b"]" * 100_000, headers={**headers, **sid}), 422,
             "nest"),
            (client.post(f"{url}/create", json={"split": "train", "index": 2**70}, headers={**headers, **sid}), 422,
             "64-bit"),
        ]
        for reply, status, says in cases:
            assert reply.status_code == status, (reply.request.url, reply.text[:300])
            assert says.lower() in json.dumps(reply.json()).lower(), reply.text[:300]
        session = create(client, url, headers, split="train", index=3)
        h = {**headers, "X-Session-ID": session}
        for body in ({"name": 3}, {"name": "submit", "input": [1]}, {"input": {}}, {"name": "submit", "extra": 1}):
            reply = client.post(f"{url}/arithmetic/call", json=body, headers=h)
            assert reply.status_code == 422, (body, reply.text)
        # The session is untouched by what was refused: it plays on.
        events = sse(client.post(f"{url}/arithmetic/call", json={"name": "calculator", "input": {"expression": "2+2"}},
                                 headers=h))
        assert [e for e, _ in events] == ["task_id", "end"]
        assert json.loads(events[-1][1])["output"]["blocks"][0]["text"] == "4"
        assert client.post(f"{url}/create", json={"split": "train", "index": 0}, headers=h).json()["detail"] == \
            "Session already exists"
        assert client.post(f"{url}/delete", headers=h).json() == {"sid": session}
        assert client.post(f"{url}/delete", headers=h).status_code == 200  # idempotent
        assert client.get(f"{url}/health", headers=headers).json() == {"status": "ok"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                         lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                             st.sampled_from(["name", "input", "task_id", "split", "index", "task_spec", "x"]) | st.text(max_size=8),
                             inner, max_size=4), max_leaves=12),
       route=st.sampled_from(["/create", "/arithmetic/call", "/arithmetic/task", "/arithmetic/task_range"]))
def test_fuzzed_bodies_never_crash_the_server(arith, body, route):
    with httpx.Client(timeout=30) as client:
        sid = create(client, arith.url, arith.headers, split="train", index=1) if route.endswith("call") else "fuzz"
        headers = {**arith.headers, "X-Session-ID": sid}
        try:
            content = json.dumps(body, allow_nan=True).encode()
        except ValueError:
            return
        reply = client.post(arith.url + route, content=content, headers=headers)
        assert reply.status_code in (200, 400, 404, 422), reply.text[:300]
        if reply.status_code != 200:
            assert "detail" in reply.json()
        client.post(f"{arith.url}/delete", headers=headers)
        assert client.get(f"{arith.url}/health", headers=arith.headers).status_code == 200


# -- capacity and idle sessions -----------------------------------------------------------------------------
def test_capacity_is_the_protocols_own_error_and_idle_sessions_are_ended(serve_process):
    served = serve_process(ARITHMETIC, "--max-sessions", "2", "--session-idle-timeout", "1.5")
    url, headers = served.url, served.headers
    with httpx.Client(timeout=30) as client:
        first = create(client, url, headers, split="train", index=0)
        create(client, url, headers, split="train", index=1)
        refused = client.post(f"{url}/create", json={"split": "train", "index": 2},
                              headers={**headers, "X-Session-ID": "third"})
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert "capacity" in refused.json()["detail"]
        assert client.post(f"{url}/delete", headers={**headers, "X-Session-ID": first}).status_code == 200
        create(client, url, headers, split="train", index=2)  # a slot came back
        # Both sessions go idle: ended after the limit, their slots free again.
        time.sleep(4)
        gone = client.get(f"{url}/arithmetic/prompt", headers={**headers, "X-Session-ID": first})
        assert gone.status_code == 404
        for i in range(2):
            create(client, url, headers, split="train", index=i)
    assert served.stop() == 0


# -- streams: chunks, images, failures, resumes --------------------------------------------------------------
def test_streams_chunk_big_results_carry_images_report_failures_and_resume(serve_process):
    served = serve_process(*PROBE, "--max-sessions", "2")
    url, headers = served.url, served.headers
    with httpx.Client(timeout=60) as client:
        sid = create(client, url, headers, split="train", index=0)
        h = {**headers, "X-Session-ID": sid}
        assert client.get(f"{url}/ors/prompt", headers=h).json()[0]["text"].startswith("What is")
        events = sse(client.post(f"{url}/ors/call", json={"name": "big", "input": {"n": 9000}}, headers=h))
        assert [e for e, _ in events] == ["task_id", "chunk", "chunk", "end"]
        assert all(len(d) <= 4096 for _, d in events[1:])
        result = json.loads("".join(d for _, d in events[1:]))
        assert result["output"]["blocks"][0]["text"].endswith("END") and len(result["output"]["blocks"][0]["text"]) == 9000
        image = json.loads(sse(client.post(f"{url}/ors/call", json={"name": "image"}, headers=h))[-1][1])
        kinds = [b["type"] for b in image["output"]["blocks"]]
        assert "image" in kinds and all(b["mimeType"] == "image/png" for b in image["output"]["blocks"] if b["type"] == "image")
        failed = sse(client.post(f"{url}/ors/call", json={"name": "boom"}, headers=h))
        assert [e for e, _ in failed] == ["task_id", "end"]  # the env answered: the tool's failure is a message
        # A resume by task_id gives the same result without running the tool again.
        first = sse(client.post(f"{url}/ors/call", json={"name": "tick", "input": {"seconds": 0.1}}, headers=h))
        task_id = first[0][1]
        again = sse(client.post(f"{url}/ors/call", json={"name": "tick", "input": {"seconds": 0.1}, "task_id": task_id},
                                headers=h))
        assert again == first[1:]
        turn = json.loads(first[-1][1])["output"]["metadata"]["turn"]
        after = json.loads(sse(client.post(f"{url}/ors/call", json={"name": "hint"}, headers=h))[-1][1])
        assert after["output"]["metadata"]["turn"] == turn + 1  # the resume ran nothing
        unknown = sse(client.post(f"{url}/ors/call", json={"name": "hint", "task_id": "nope"}, headers=h))
        assert unknown == [("error", "unknown task_id")]
    assert served.stop() == 0


def test_a_killed_env_server_is_a_readable_error_and_the_next_session_recovers(serve_process):
    import os
    import signal as signals

    from ors.client import ORS

    from openenv_gym.testing import procs

    served = serve_process(ARITHMETIC, "--max-sessions", "4")
    with ORS(base_url=served.url, api_key=served.token) as client:
        env = client.environment("arithmetic")
        with env.session(split="train", index=0) as session:
            session.call_tool("calculator", {"expression": "1+1"})
            (backend,) = [p for p in procs.descendants(served.pid) if "local_servers/serve.py" in procs.cmdline(p)]
            os.kill(backend, signals.SIGKILL)
            with pytest.raises(RuntimeError, match="(?i)connect|reach|closed|exited"):
                session.call_tool("calculator", {"expression": "2+2"})
        with env.session(split="train", index=1) as session:  # the env's server is relaunched
            assert session.call_tool("calculator", {"expression": "2+2"}).blocks[0].text == "4"
    assert served.stop() == 0


# -- hostile and careless callers ---------------------------------------------------------------------------
def test_bad_session_ids_hold_no_slot_and_a_session_reads_only_its_own_calls(serve_process):
    from ors.client import ORS, ToolCallError

    served = serve_process(ARITHMETIC, "--max-sessions", "2")
    url, headers = served.url, served.headers
    with httpx.Client(timeout=30) as client:
        for bad in (b"\xff", b"a" * 300, b"two words", b"tab\there"):
            for _ in range(3):  # more than the server's two slots: none may be held
                reply = client.post(f"{url}/create", json={"split": "train", "index": 0},
                                    headers={**headers, "X-Session-ID": bad})
                assert reply.status_code == 400 and "X-Session-ID" in reply.json()["detail"], reply.text
        mine, theirs = (create(client, url, headers, split="train", index=i) for i in (0, 1))  # both slots free
        # A wrong-type argument is refused as the SDK servers refuse it, and nothing is run.
        body = {"name": "calculator", "input": {"expression": 5}}
        refused = json.loads(sse(client.post(f"{url}/arithmetic/call", json=body,
                                             headers={**headers, "X-Session-ID": mine}))[-1][1])
        assert refused["ok"] is False and refused["reason"] == "input_validation"
        assert "valid string" in refused["error"]  # the env's own words
        # Another session cannot read a call's result by its task id.
        first = sse(client.post(f"{url}/arithmetic/call", json={"name": "calculator", "input": {"expression": "6*7"}},
                                headers={**headers, "X-Session-ID": theirs}))
        task_id = first[0][1]
        stolen = sse(client.post(f"{url}/arithmetic/call", json={"name": "calculator", "task_id": task_id},
                                 headers={**headers, "X-Session-ID": mine}))
        assert stolen == [("error", "unknown task_id")]
        again = sse(client.post(f"{url}/arithmetic/call", json={"name": "calculator", "task_id": task_id},
                                headers={**headers, "X-Session-ID": theirs}))
        assert again == first[1:]  # its own session still resumes it
        for sid in (mine, theirs):
            client.post(f"{url}/delete", headers={**headers, "X-Session-ID": sid})
    with ORS(base_url=url, api_key=served.token) as sdk:
        with sdk.environment("arithmetic").session(split="train", index=0) as session:
            with pytest.raises(ToolCallError):
                session.call_tool("calculator", {"expression": 5})
    assert served.stop() == 0
