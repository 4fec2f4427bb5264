"""The legacy (v0) Verifiers adapter against real v0 environments run by verifiers 0.3.x.

The environments are small modules in ``tests/envs/verifiers_v0`` (datasets built in-process with
``Dataset.from_list``; nothing is downloaded). The reference for every reward is the library
itself: ``Environment.run_rollout`` with a scripted ``vf.Client`` that answers with the same
messages the agent sends, so a pass means "this episode scored exactly as vf-eval would score it".
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

vf = pytest.importorskip("verifiers")
if not hasattr(vf, "__version__") or not vf.__version__.startswith(("0.2", "0.3")):
    pytest.skip("needs verifiers<0.4 (the legacy v0 API)", allow_module_level=True)

from openenv_gym import runtime  # noqa: E402
from openenv_gym.adapters.base import AdapterSpec  # noqa: E402
from openenv_gym.adapters.verifiers.v0 import VerifiersV0Adapter  # noqa: E402
from openenv_gym.env import AgentEnv  # noqa: E402
from openenv_gym.errors import (  # noqa: E402
    BackendTimeout,
    ConfigurationError,
    EpisodeInterrupted,
    RuntimeClosed,
    SourceNotFound,
)
from openenv_gym.vector import make as make_vector  # noqa: E402
from openenv_gym.vector.base import info_at  # noqa: E402
from openenv_gym.wire import TaskRef  # noqa: E402

ENVS = Path(__file__).resolve().parent.parent / "envs" / "verifiers_v0"
ARITH, GUESS, CALC, GROUP = (str(ENVS / f"{n}.py") for n in ("vf_arith", "vf_guess", "vf_calc_tool", "vf_group"))


# -- helpers ------------------------------------------------------------------------------------

def call(*calls: tuple[str, str], text: str | None = None) -> dict[str, Any]:
    """An OpenAI assistant message with tool calls given as (name, raw arguments string)."""
    return {"role": "assistant", "content": text, "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
        for i, (name, args) in enumerate(calls)]}


class ScriptedClient(vf.Client):
    """The library-side reference: a vf.Client answering each model call from a script."""

    def __init__(self, actions: list[Any]):
        super().__init__(None)
        self.actions = list(actions)

    def setup_client(self, config): return None
    async def to_native_tool(self, tool): return tool
    async def to_native_prompt(self, messages): return messages, {}
    async def get_native_response(self, *args, **kwargs): raise NotImplementedError
    async def raise_from_native_response(self, response): return None
    async def from_native_response(self, response): return response
    async def close(self): return None

    async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        action = self.actions.pop(0) if self.actions else ""
        if isinstance(action, str):
            message = vf.ResponseMessage(content=action, finish_reason="stop", is_truncated=False)
        else:
            calls = [vf.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                     for c in action["tool_calls"]]
            message = vf.ResponseMessage(content=action.get("content"), tool_calls=calls,
                                         finish_reason="tool_calls", is_truncated=False)
        return vf.Response(id="ref", created=0, model=model, message=message)


def library_output(adapter: VerifiersV0Adapter, row: dict[str, Any], actions: list[Any]) -> dict[str, Any]:
    """What the library's own rollout gives for ``row`` when the model says ``actions``."""
    return runtime.run_sync(adapter.env.run_rollout(row, ScriptedClient(actions), adapter.model,
                                                    dict(adapter.sampling_args)), 60)


def play(env: AgentEnv, actions: list[Any], **reset_options: Any) -> tuple[list[tuple], dict[str, Any]]:
    """Reset with ``reset_options`` and step ``actions`` until the episode ends; the steps and reset info."""
    _, info = env.reset(options=reset_options)
    steps = []
    for action in actions:
        steps.append(env.step(action))
        if steps[-1][2] or steps[-1][3]:
            break
    return steps, info


def runtime_tasks() -> set[asyncio.Task]:
    async def others() -> set[asyncio.Task]:
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
    return runtime.run_sync(others(), 10)


def child_pids() -> list[int]:
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


@pytest.fixture(scope="module")
def arith():
    env = AgentEnv(VerifiersV0Adapter(source=ARITH))
    yield env
    env.close()


@pytest.fixture(scope="module")
def calc():
    env = AgentEnv(VerifiersV0Adapter(source=CALC))
    yield env
    env.close()


@pytest.fixture(scope="module")
def guess():
    env = AgentEnv(VerifiersV0Adapter(source=GUESS))
    yield env
    env.close()


# -- 1. rewards equal the library's own evaluation ------------------------------------------------------

SCRIPTS = {
    "arith": [("train", 0, ["5"]), ("train", 1, ["42"]), ("train", 2, ["8"]), ("train", 0, ["The answer is 5"]),
              ("eval", 0, ["20"])],
    "guess": [("train", 0, ["5", "2", "3"]), ("train", 1, ["7"]), ("train", 2, ["abc", "10", "9"]),
              ("train", 0, ["1", "2", "4", "5", "6"])],
    "calc": [("train", 0, [call(("multiply", '{"a": 12, "b": 13}')), "156"]),
             ("train", 1, [call(("multiply", '{"a": 7, "b": 8}'), ("boom", '{"x": 1}')), "56"]),
             ("train", 1, [call(("multiply", '{"a": 7,'), ("nope", "{}")), call(("multiply", '{"a": 7, "b": 8}')), "56"]),
             ("train", 0, ["155"])],
}


@pytest.mark.parametrize("name", ["arith", "guess", "calc"])
def test_rewards_and_metrics_equal_the_librarys_rollout(name, request):
    env = request.getfixturevalue(name)
    adapter = env.adapter
    for split, index, actions in SCRIPTS[name]:
        steps, info = play(env, actions, split=split, index=index)
        obs, reward, terminated, truncated, last = steps[-1]
        assert terminated or truncated, (name, index, steps)
        # the task's own end is terminated (a SingleTurnEnv's one turn too); limits truncate
        assert truncated == (last["stop_condition"] == "max_turns_reached" and name != "arith")
        assert all(s[1] == 0.0 for s in steps[:-1])  # reward only at the end
        reference = library_output(adapter, env.task(split, index), actions)
        assert reward == pytest.approx(reference["reward"]), (name, split, index, actions)
        assert last["metrics"] == pytest.approx(reference["metrics"])
        assert last["stop_condition"] == reference["stop_condition"]
        assert last["metrics"]["num_turns"] == len(steps)
        assert info["task_id"] == f"{split}/{env.task(split, index)['example_id']}"


def test_observations_are_the_librarys_messages(calc, guess):
    obs, info = calc.reset(options={"index": 0})
    row = calc.task("train", 0)
    assert obs == row["prompt"]  # system + user, as plain OpenAI dicts
    assert [t["function"]["name"] for t in info["tools"]] == ["multiply", "boom"]
    assert info["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
    assert info["request"] == {"sampling_args": {"n": 1, "extra_body": {}}}
    obs, *_ = calc.step(call(("multiply", '{"a": 12, "b": 13}')))
    assert obs == [{"role": "tool", "tool_call_id": "call_0", "content": "156"}]

    obs, _ = guess.reset(options={"index": 0})
    assert [m["role"] for m in obs] == ["system", "user"]
    obs, reward, terminated, truncated, _ = guess.step("5")
    assert obs == [{"role": "user", "content": "Lower."}] and (reward, terminated, truncated) == (0.0, False, False)
    obs, reward, terminated, truncated, info = guess.step("3")  # the env ends it: final_env_response shown
    assert obs == [{"role": "user", "content": "Correct!"}]
    assert terminated and not truncated and info["stop_condition"] == "has_final_env_response" and reward > 1.0


def test_explicit_task_and_eval_split(arith):
    steps, info = play(arith, ["5"], task={"question": "What is 2 + 3?", "answer": "5"})
    assert steps[-1][1] == pytest.approx(1.0 - 0.005) and steps[-1][2]
    obs, info = arith.reset(options={"task": arith.task("train", 1)})
    assert obs == arith.task("train", 1)["prompt"]
    assert [(s.name, s.type) for s in arith.splits()] == [("train", "train"), ("eval", "test")]
    assert arith.num_tasks("eval") == arith.num_tasks("test") == 1
    obs, _ = arith.reset(options={"split": "test", "index": 0})
    assert "10 + 10" in obs[-1]["content"]


# -- 2. bad tool calls reach the agent; the episode goes on ---------------------------------------------

def test_bad_json_and_unknown_tool_become_tool_messages(calc):
    calc.reset(options={"index": 0})
    obs, reward, terminated, truncated, _ = calc.step(
        call(("multiply", '{"a": 12,'), ("no_such_tool", '{"a": 1}'), ("boom", '{"x": 3}')))
    assert not terminated and not truncated and reward == 0.0
    assert [m["role"] for m in obs] == ["tool", "tool", "tool"]
    assert [m["tool_call_id"] for m in obs] == ["call_0", "call_1", "call_2"]
    assert "Expecting" in obs[0]["content"]  # json.loads's own error, from ToolEnv.error_formatter
    assert obs[1]["content"] == "'no_such_tool'"  # ToolEnv's KeyError, as vf-eval shows it
    assert obs[2]["content"] == "boom(3) exploded"  # a raising tool: its message, episode goes on
    obs, *_ = calc.step(call(("multiply", '{"a": 12, "b": 13}')))
    assert obs[0]["content"] == "156"
    _, reward, terminated, truncated, info = calc.step("156")
    assert reward == 1.0 and terminated and not truncated
    assert info["metrics"]["total_tool_calls"] == 4.0 and info["metrics"]["num_turns"] == 3.0


def test_unreadable_action_is_answered_without_feeding_the_library(guess):
    guess.reset(options={"index": 1})
    obs, reward, terminated, truncated, info = guess.step(None)
    assert obs[0]["role"] == "user" and "could not be read" in obs[0]["content"]
    assert (reward, terminated, truncated) == (0.0, False, False)
    _, reward, terminated, _, info = guess.step("7")
    assert terminated and info["metrics"]["num_turns"] == 1.0


# -- 3. close and reset mid-episode cancel the rollout ----------------------------------------------

def test_close_and_reset_mid_episode_cancel_the_rollout(caplog):
    caplog.set_level(logging.ERROR, logger="asyncio")
    env = AgentEnv(VerifiersV0Adapter(source=CALC))
    loop = env.runner.loop  # a single v0 env runs on a loop of its own (Adapter.caller_thread)

    def tasks() -> set[asyncio.Task]:
        return {t for t in asyncio.all_tasks(loop) if not t.done()}

    play(env, [call(("multiply", '{"a": 12, "b": 13}')), "156"], index=0)  # warm up pools
    threads, children = threading.active_count(), child_pids()
    assert tasks() == set()

    env.reset(options={"index": 0})
    env.step(call(("multiply", '{"a": 1, "b": 2}')))
    (rollout,) = tasks()  # the library's rollout, paused in the model call
    assert "verifiers-v0 rollout" in rollout.get_name()
    env.reset(options={"index": 1})  # a new reset mid-episode
    assert rollout.cancelled()
    assert len(tasks()) == 1  # only the new episode's rollout
    env.step(call(("multiply", '{"a": 7, "b": 8}')))
    (rollout,) = tasks()
    env.close()  # close mid-episode
    assert rollout.cancelled() and loop.is_closed()
    env.close()  # idempotent
    gc.collect()
    deadline = time.monotonic() + 5  # the loop's idle worker threads exit on their own
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [r for r in caplog.records if "destroyed" in r.getMessage()]
    assert threading.active_count() <= threads and child_pids() == children


def test_episode_aclose_is_idempotent_and_adapter_close_cancels_episodes():
    adapter = VerifiersV0Adapter(source=GUESS)

    async def scenario() -> tuple[bool, bool]:
        await adapter.start()
        a, b = adapter.episode(), adapter.episode()
        await a.start(TaskRef(split="train", index=0))
        await b.start(TaskRef(split="train", index=1))
        task_a = a._task
        await a.aclose()
        await a.aclose()
        task_b = b._task
        await adapter.aclose()
        await b.aclose()
        return task_a.cancelled(), task_b.cancelled()

    others = runtime_tasks()
    assert runtime.run_sync(scenario(), 30) == (True, True)
    assert runtime_tasks() == others


# -- 4. group reward functions ----------------------------------------------------------------------

def test_group_reward_functions_are_refused_at_construction():
    with pytest.raises(ConfigurationError, match=r"group reward functions \(diversity_bonus\).*not supported per episode"):
        VerifiersV0Adapter(source=GROUP)


def test_a_rubric_without_reward_functions_is_refused(tmp_path):
    # Rubric.score_rollout asserts at least one reward function: every rollout would fail at the end.
    (tmp_path / "vf_norubric.py").write_text(
        "import verifiers as vf\nfrom datasets import Dataset\n"
        "def load_environment():\n"
        "    return vf.SingleTurnEnv(dataset=Dataset.from_list([{'question': 'hi', 'answer': 'hi'}]))\n")
    with pytest.raises(ConfigurationError, match="Rubric has no reward functions"):
        VerifiersV0Adapter(source=tmp_path / "vf_norubric.py")


# -- 5. limit stops are truncations -------------------------------------------------------------------

def test_max_turns_stop_is_truncated_and_scored():
    for kwargs in ({"env_args": {"max_turns": 2}}, {"max_turns": 2}):
        env = AgentEnv(VerifiersV0Adapter(source=GUESS, **kwargs))
        try:
            steps, _ = play(env, ["1", "2", "4"], index=0)
            assert len(steps) == 2
            obs, reward, terminated, truncated, info = steps[-1]
            assert truncated and not terminated and obs == []
            assert info["stop_condition"] == "max_turns_reached"
            reference = library_output(env.adapter, env.task("train", 0), ["1", "2"])
            assert reward == pytest.approx(reference["reward"]) == pytest.approx(0.125)
        finally:
            env.close()


def test_policy_time_counts_against_timeout_seconds():
    env = AgentEnv(VerifiersV0Adapter(source=GUESS, timeout_seconds=0.3))
    try:
        env.reset(options={"index": 0})
        obs, *_ = env.step("5")
        assert obs == [{"role": "user", "content": "Lower."}]
        time.sleep(0.5)  # the agent "thinks" longer than the env's timeout
        obs, reward, terminated, truncated, info = env.step("3")  # too late: not used
        assert truncated and not terminated and info["stop_condition"] == "timeout_reached"
        assert info["metrics"]["num_turns"] == 1.0 and reward == pytest.approx(0.25)
    finally:
        env.close()


def test_rollout_timeout_bounds_only_the_envs_own_time():
    others = runtime_tasks()
    env = AgentEnv(VerifiersV0Adapter(source=GUESS, rollout_timeout=0.3))
    try:
        env.reset(options={"index": 0})
        time.sleep(0.4)  # policy time does not count
        obs, *_ = env.step("5")
        assert obs == [{"role": "user", "content": "Lower."}]
        started = time.monotonic()
        # (runtime.run_sync re-labels any TimeoutError, so the message is not checked here)
        with pytest.raises(BackendTimeout):
            env.step("slow")  # env_response takes 5 s
        assert time.monotonic() - started < 2.0
        assert runtime_tasks() == others  # the rollout was cancelled
    finally:
        env.close()


# -- 6. vector env ------------------------------------------------------------------------------------

def test_vector_env_rewards_equal_single_env_rewards(guess):
    scripts = [["5", "2", "3"], ["7"], ["abc", "10", "9"], ["1", "2", "4", "5", "6"]]
    tasks = [0, 1, 2, 0]
    single = []
    for task, script in zip(tasks, scripts):
        steps, _ = play(guess, script, index=task)
        single.append(steps[-1][1])

    others = runtime_tasks()
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    envs = make_vector(4, AdapterSpec("openenv_gym.adapters.verifiers.v0:VerifiersV0Adapter", {"source": GUESS}))
    try:
        # built on the runtime thread (not the main one): construction works, handlers untouched
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
        for i, task in enumerate(tasks):
            mask = np.zeros(4, dtype=np.bool_)
            mask[i] = True
            envs.reset(options={"index": task, "reset_mask": mask})
        rewards: list[float | None] = [None] * 4
        for turn in range(max(map(len, scripts))):
            actions = [s[turn] if turn < len(s) and rewards[i] is None else "" for i, s in enumerate(scripts)]
            _, reward, terminated, truncated, infos = envs.step(actions)
            for i in range(4):
                if rewards[i] is None and (terminated[i] or truncated[i]):
                    assert "error" not in info_at(infos, i)
                    rewards[i] = float(reward[i])
        assert rewards == pytest.approx(single)
    finally:
        envs.close()
    assert runtime_tasks() <= others


# -- 7. Gymnasium's checker -------------------------------------------------------------------------

def test_check_env_passes_for_a_tool_env():
    env = AgentEnv(VerifiersV0Adapter(source=CALC))
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


# -- 8. rollout errors surface in info ---------------------------------------------------------------

def test_env_response_vf_error_surfaces_in_info():
    env = AgentEnv(VerifiersV0Adapter(source=GUESS, env_args={"fail_on": "x"}))
    try:
        env.reset(options={"index": 0})
        obs, reward, terminated, truncated, info = env.step("x")
        assert truncated and not terminated and obs == []
        assert info["stop_condition"] == "has_error"
        assert info["error"]["type"] == "Error" and "refused guess 'x'" in info["error"]["message"]
        reference = library_output(env.adapter, env.task("train", 0), ["x"])
        assert isinstance(reward, float) and reward == pytest.approx(reference["reward"])
    finally:
        env.close()


def test_tool_error_listed_in_stop_errors_surfaces_in_info():
    env = AgentEnv(VerifiersV0Adapter(source=CALC, env_args={"stop_on_tool_error": True}))
    try:
        env.reset(options={"index": 0})
        obs, reward, terminated, truncated, info = env.step(call(("boom", '{"x": 1}')))
        assert truncated and info["stop_condition"] == "has_error"
        assert info["error"]["type"] == "ToolCallError" and reward == 0.0
    finally:
        env.close()


# -- loading ------------------------------------------------------------------------------------------

def test_load_errors_are_configuration_errors():
    with pytest.raises(ConfigurationError, match="Could not import 'no_such_vf_env_xyz'"):
        VerifiersV0Adapter(env_id="no_such_vf_env_xyz")
    with pytest.raises(ConfigurationError, match="Failed to load environment 'vf_arith'"):
        VerifiersV0Adapter(source=ARITH, env_args={"num_rows": "three"})
    with pytest.raises(SourceNotFound):
        VerifiersV0Adapter(source=str(ENVS / "missing.py"))


def test_env_id_and_signal_handlers_are_kept():
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    path = list(sys.path)
    adapter = VerifiersV0Adapter(env_id="someorg/vf-arith", source=ARITH)  # vf maps the id to vf_arith
    try:
        assert adapter.env.env_id == "someorg/vf-arith"
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
        assert sys.path.count(str(ENVS)) == 1
    finally:
        runtime.run_sync(adapter.aclose(), 30)
    assert sys.path == path  # the source's folder is held while some adapter of it is open


def test_source_layouts_and_a_shadowing_module(tmp_path):
    text = Path(ARITH).read_text()
    package = tmp_path / "a" / "vf_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(text)
    upstream = tmp_path / "b" / "my-env"  # environments/my-env/my_env.py + pyproject.toml
    upstream.mkdir(parents=True)
    (upstream / "my_env.py").write_text(text)
    (upstream / "pyproject.toml").write_text("[project]\nname = 'my-env'\n")
    shadow = tmp_path / "c" / "vf_arith.py"  # same module name as the fixture, another file
    shadow.parent.mkdir()
    shadow.write_text(text.replace("num_rows: int = 3", "num_rows: int = 1"))
    for source, rows in ((package, 3), (upstream, 3), (shadow, 1), (ARITH, 3), (upstream / "my_env.py", 3)):
        adapter = VerifiersV0Adapter(source=source)
        try:
            runtime.run_sync(adapter.start(), 30)
            assert runtime.run_sync(adapter.num_tasks("train"), 30) == rows, source
        finally:
            runtime.run_sync(adapter.aclose(), 30)
    with pytest.raises(ConfigurationError, match="names module 'vf_guess' but source"):
        VerifiersV0Adapter(env_id="vf-guess", source=ARITH)


def test_project_folder_with_a_package_named_after_it(tmp_path):
    """The layout of ``prime env init`` projects (``my-env/my_env/__init__.py``), as the v1 adapter takes it."""
    project = tmp_path / "my-env"
    (project / "my_env").mkdir(parents=True)
    (project / "my_env" / "__init__.py").write_text(Path(ARITH).read_text())
    adapter = VerifiersV0Adapter(source=project)
    try:
        assert adapter.env_id == "my_env"
        runtime.run_sync(adapter.start(), 30)
        assert runtime.run_sync(adapter.num_tasks("train"), 30) == 3
    finally:
        runtime.run_sync(adapter.aclose(), 30)


def test_making_an_env_prints_no_progress_bars(capfd):
    """Hugging Face's "Map" bars (one per split, on every make) are hidden; the user's setting is kept."""
    import datasets

    before = datasets.are_progress_bars_disabled()
    for source in (GUESS, ARITH):  # GUESS maps inside load_environment, ARITH when its datasets are built
        env = AgentEnv(VerifiersV0Adapter(source=source))
        try:
            env.reset(options={"index": 0})
        finally:
            env.close()
    out, err = capfd.readouterr()
    assert "Map" not in out + err
    assert datasets.are_progress_bars_disabled() == before
    datasets.disable_progress_bars()  # a user who turned them off keeps them off
    try:
        VerifiersV0Adapter(source=GUESS)
        assert datasets.are_progress_bars_disabled()
    finally:
        if not before:
            datasets.enable_progress_bars()


def test_construction_off_the_main_thread():
    out: dict[str, Any] = {}
    before = signal.signal

    def build() -> None:
        try:
            out["adapter"] = VerifiersV0Adapter(source=ARITH)
        except BaseException as exc:  # pragma: no cover - reported below
            out["error"] = exc

    thread = threading.Thread(target=build)
    thread.start()
    thread.join(60)
    assert "error" not in out, out.get("error")
    assert signal.signal is before
    env = AgentEnv(out["adapter"])
    try:
        steps, _ = play(env, ["42"], index=1)
        assert steps[-1][1] == pytest.approx(0.99)
    finally:
        env.close()


def test_a_verifiers_without_the_v0_api_is_refused(monkeypatch):
    fake = types.ModuleType("verifiers")
    fake.__version__ = "0.4.0"
    monkeypatch.setitem(sys.modules, "verifiers", fake)
    with pytest.raises(ConfigurationError, match=r"verifiers 0\.4 installed has no v0 API: install 'verifiers<0\.4'"):
        VerifiersV0Adapter(source=ARITH)


# -- a single env runs on the caller's thread (Adapter.caller_thread) ---------------------------------

SLOW = str(ENVS / "vf_slow_tool.py")


def nap(seconds: float) -> dict[str, Any]:
    return call(("nap", f'{{"seconds": {seconds}}}'))


def test_a_single_env_runs_on_the_callers_thread_not_the_runtime_loop():
    env = AgentEnv(VerifiersV0Adapter(source=CALC))
    try:
        seen = []
        tool = env.adapter.env.tool_map["multiply"]
        env.adapter.env.tool_map["multiply"] = lambda a, b: seen.append(threading.current_thread()) or tool(a, b)
        play(env, [call(("multiply", '{"a": 12, "b": 13}')), "156"], index=0)
        assert seen == [threading.current_thread()]
    finally:
        env.close()


def test_the_librarys_own_offloads_run_on_the_episodes_loop_and_a_tools_stay_in_threads(monkeypatch):
    # The library hands its pure bookkeeping to asyncio.to_thread (the rollout's output, a
    # reply's tokens): an episode runs it at once on its loop's thread (a single env's: the
    # caller's; a vector env's: the runtime loop's). A tool's blocking call is user code that may
    # hang: it goes to a thread still, and step_timeout cuts it. The library's own rollout, run
    # by other code on the same loop, keeps its thread hops.
    from verifiers.legacy.envs import environment as vf_environment

    where: list[threading.Thread] = []
    library = vf_environment.state_to_output

    @functools.wraps(library)
    def spy(*args: Any, **kwargs: Any) -> Any:
        where.append(threading.current_thread())
        return library(*args, **kwargs)

    monkeypatch.setattr(vf_environment, "state_to_output", spy)
    env = AgentEnv(VerifiersV0Adapter(source=SLOW), step_timeout=0.5)
    try:
        env.reset(options={"index": 0})
        obs, *_ = env.step(call(("doze", '{"seconds": 0.01}')))
        assert obs[-1]["content"] == "dozed"
        assert env.step("done")[1] == 1.0
        assert where == [threading.current_thread()]

        env.reset(options={"index": 0})
        start = time.monotonic()
        with pytest.raises(BackendTimeout, match=r"step did not finish within step_timeout=0\.5 s"):
            env.step(call(("doze", '{"seconds": 30}')))
        assert time.monotonic() - start < 5
    finally:
        env.close()

    def loop_thread() -> threading.Thread:
        async def which() -> threading.Thread:
            return threading.current_thread()
        return runtime.run_sync(which(), 10)

    where.clear()
    envs = make_vector(2, AdapterSpec("openenv_gym.adapters.verifiers.v0:VerifiersV0Adapter", {"source": SLOW}),
                       step_timeout=5)
    try:
        envs.reset(seed=0, options={"index": 0})
        obs, *_ = envs.step([call(("doze", '{"seconds": 0.01}'))] * 2)
        assert [o[-1]["content"] for o in obs] == ["dozed", "dozed"]
        assert list(envs.step(["done", "done"])[1]) == [1.0, 1.0]
        assert where == [loop_thread()] * 2

        adapter = VerifiersV0Adapter(source=SLOW)
        runtime.run_sync(adapter.start(), 60)
        try:
            row = runtime.run_sync(adapter.rollout_input("train", 0), 10)
            where.clear()
            assert library_output(adapter, row, [call(("doze", '{"seconds": 0.01}')), "done"])["reward"] == 1.0
            assert where and loop_thread() not in where
        finally:
            runtime.run_sync(adapter.aclose(), 30)
    finally:
        envs.close()


def test_step_timeout_ctrl_c_and_close_from_another_thread_end_a_running_step():
    env = AgentEnv(VerifiersV0Adapter(source=SLOW), step_timeout=0.5)
    try:
        env.reset(options={"index": 0})
        start = time.monotonic()
        with pytest.raises(BackendTimeout, match=r"step did not finish within step_timeout=0\.5 s"):
            env.step(nap(30))
        assert time.monotonic() - start < 5
        with pytest.raises(EpisodeInterrupted):
            env.step("done")

        env.reset(options={"index": 0})
        threading.Timer(0.3, lambda: signal.pthread_kill(threading.get_ident(), signal.SIGINT)).start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            env.step(nap(0.45))  # inside the step_timeout: only the Ctrl-C ends it
        assert time.monotonic() - start < 5
        with pytest.raises(EpisodeInterrupted):
            env.step("done")
        env.reset(options={"index": 0})  # the env goes on after both
        obs, reward, terminated, _, _ = env.step(nap(0.01))
        assert obs[0]["content"] == "rested" and not terminated
        assert env.step("done")[1] == 1.0
    finally:
        env.close()

    env = AgentEnv(VerifiersV0Adapter(source=SLOW), step_timeout=60)
    env.reset(options={"index": 0})
    threading.Timer(0.3, env.close).start()
    start = time.monotonic()
    with pytest.raises(RuntimeClosed):
        env.step(nap(30))
    assert time.monotonic() - start < 10
    with pytest.raises(ConfigurationError, match="closed"):
        env.reset()


def test_areset_and_astep_work_from_any_event_loop():
    env = AgentEnv(VerifiersV0Adapter(source=CALC))

    async def episode() -> float:
        await env.areset(options={"index": 1})
        await env.astep(call(("multiply", '{"a": 7, "b": 8}')))
        return float((await env.astep("56"))[1])

    try:
        assert asyncio.run(episode()) == 1.0
        assert runtime.run_sync(episode(), 60) == 1.0  # the runtime loop's thread too
    finally:
        env.close()


def test_a_forgotten_close_of_a_single_env_leaves_no_task_or_thread():
    env = AgentEnv(VerifiersV0Adapter(source=SLOW))
    env.reset(options={"index": 0})
    loop = env.runner.loop
    (rollout,) = [t for t in asyncio.all_tasks(loop) if not t.done()]
    del env
    gc.collect()
    deadline = time.monotonic() + 10
    while not loop.is_closed() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert loop.is_closed() and rollout.cancelled()


def test_tool_specs_follow_the_tools_each_episode_gets():
    # The library gives each episode a new list of the env's same Tool objects: the specs are
    # converted once, yet every call returns its own copy, and a different set is converted anew.
    from openenv_gym.adapters.verifiers.v0 import _ToolCache

    add = vf.Tool(name="add", description="Add", parameters={"type": "object", "properties": {"a": {"type": "integer"}}})
    mul = vf.Tool(name="mul", description="Multiply", parameters={"type": "object", "properties": {}})
    cache = _ToolCache()
    first, second = cache.specs([add]), cache.specs([add])
    assert [s.name for s in first] == ["add"] and first == second
    assert first[0].parameters is not second[0].parameters  # never aliased between resets
    first[0].parameters["properties"].clear()
    assert cache.specs([add])[0].parameters["properties"] == {"a": {"type": "integer"}}
    assert [s.name for s in cache.specs([add, mul])] == ["add", "mul"]  # a tool added
    assert [s.name for s in cache.specs([mul])] == ["mul"]  # another set
    assert cache.specs(None) == [] and cache.specs([]) == []


def test_dropping_an_unclosed_env_in_a_fresh_process_prints_nothing(tmp_path):
    script = (
        "import gc, gymnasium as gym, openenv_gym\n"
        f"env = gym.make('openenv/Verifiers-v0', source={GUESS!r})\n"
        "env.reset(options={'index': 0})\n"
        "del env\n"
        "gc.collect()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "was never awaited" not in done.stderr and "Task was destroyed" not in done.stderr, done.stderr
