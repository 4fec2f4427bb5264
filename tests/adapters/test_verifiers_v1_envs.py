"""The taskset's own ``vf.Env`` played through the v1 adapter: scripted user turns, and what cannot run.

``tests/envs/verifiers_v1/vf1_colors`` is a ``vf.SingleAgentEnv`` subclass modelled on verifiers'
own ``color_codeword_v1``: its ``run()`` sends scripted user turns (images as content parts, then
text) between the agent's answers and ends the exchange itself. ``vf1_duel`` has two seats, as
``kuhn_poker_v1`` does. The reference for every reward is the library's own episode
(``Env.serving()`` + ``Env.run_episode``) with a scripted OpenAI-compatible stub answering with the
same policy as the agent. Runs under verifiers 0.3.1 and 0.4 (CI's second venv).
"""

from __future__ import annotations

import asyncio
import base64
import io
import textwrap
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from openenv_gym.adapters.verifiers import v1 as v1mod
from openenv_gym.errors import ConfigurationError

try:
    vf = v1mod._import_v1()
except ConfigurationError as _exc:
    pytest.skip(f"verifiers.v1 is not usable here: {_exc}", allow_module_level=True)

from PIL import Image  # noqa: E402 - verifiers.v1 brings pillow (its multimodal renderers)

import openenv_gym  # noqa: E402,F401 - registers openenv/Verifiers-v0
from openenv_gym import runtime  # noqa: E402
from openenv_gym.adapters.verifiers.detect import detect_verifiers  # noqa: E402
from openenv_gym.adapters.verifiers.process import importable  # noqa: E402
from openenv_gym.adapters.verifiers.v1 import VerifiersV1Adapter  # noqa: E402
from openenv_gym.env import AgentEnv  # noqa: E402
from openenv_gym.importing import import_source  # noqa: E402
from openenv_gym.testing.openai_stub import OpenAIStub  # noqa: E402

ENVS = Path(__file__).parents[1] / "envs" / "verifiers_v1"
COLORS, DUEL = ENVS / "vf1_colors", ENVS / "vf1_duel"
LETTERS = {(255, 0, 0): "A", (0, 255, 0): "B", (0, 0, 255): "C", (255, 255, 0): "D"}

Policy = Callable[[list[dict[str, Any]]], dict[str, Any]]


@pytest.fixture(scope="module", autouse=True)
def importable_tasksets() -> Iterator[None]:
    """The library's own runs (the reference) import the tasksets by name."""
    with importable(ENVS):
        yield


def squares(messages: list[dict[str, Any]]) -> list[str]:
    """The letters of every image the user has shown so far, decoded from the PNG data URLs."""
    letters = []
    for message in messages:
        if message["role"] == "user" and isinstance(message["content"], list):
            for part in message["content"]:
                if part["type"] == "image_url":
                    raw = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
                    letters.append(LETTERS[Image.open(io.BytesIO(raw)).convert("RGB").getpixel((0, 0))])
    return letters


def decoder(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Answers with the codeword of every square shown so far (right every time)."""
    return {"role": "assistant", "content": "".join(squares(messages))}


def blunderer(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Right on the first turn, then one letter wrong."""
    word = "".join(squares(messages))
    return {"role": "assistant", "content": word if len(word) <= 2 else word[:-1] + "A"}


def play(env: Any, policy: Policy, index: int) -> tuple[list[tuple], list[dict[str, Any]]]:
    """One episode; (the steps as (obs, reward, terminated, truncated, info), the reset's observation)."""
    obs, _ = env.reset(options={"index": index})
    history, first, steps = list(obs), list(obs), []
    for _ in range(10):
        action = policy(history)
        step = env.step(action)
        steps.append(step)
        history += [action, *step[0]]
        if step[2] or step[3]:
            return steps, first
    raise AssertionError("the episode did not end")


def library_episodes(policy: Policy, indices: list[int]) -> Future[dict[int, tuple[float, dict, str | None]]]:
    """The library's own episodes of ``vf1_colors`` answered by ``policy``: index -> (reward, metrics, stop)."""
    async def run() -> dict[int, tuple[float, dict, str | None]]:
        config = vf.resolve_env_config({
            "taskset": {"id": "vf1_colors"},
            "agent": {"runtime": {"type": "subprocess"}, "harness": v1mod._held_to_pins({"id": "null"}, local=True)},
        })
        env = await asyncio.to_thread(vf.load_environment, config)
        assert type(env).__name__ == "ColorsEnv"
        tasks = list(env.taskset)
        out = {}
        with OpenAIStub(lambda body: policy(body["messages"])) as stub:
            ctx = vf.ModelContext(model="stub", client=vf.EvalClientConfig(base_url=stub.url, api_key_var="NO_SUCH_KEY"))
            async with env.serving():
                for i in indices:
                    episode = await env.run_episode(tasks[i], ctx)
                    assert episode.ok, episode.errors
                    (trace,) = episode.traces
                    out[i] = (float(trace.reward), dict(trace.metrics), trace.stop_condition)
        return out

    return runtime.submit(run())


def text_of(message: dict[str, Any]) -> str:
    return "".join(p["text"] for p in message["content"] if p["type"] == "text")


def test_scripted_user_turns_with_images_are_observations_and_rewards_are_the_librarys() -> None:
    library = library_episodes(decoder, [0, 1])
    env = gym.make("openenv/Verifiers-v0", source=str(COLORS))
    try:
        assert env.unwrapped.adapter.info()["env"] == "ColorsEnv"
        ours = {}
        for index in (0, 1):
            steps, first = play(env, decoder, index)
            # The task's prompt: the system prompt, then two squares and text as content parts.
            assert [m["role"] for m in first] == ["system", "user"]
            assert [p["type"] for p in first[1]["content"]] == ["image_url", "image_url", "text"]
            assert all(p["image_url"]["url"].startswith("data:image/png;base64,")
                       for p in first[1]["content"][:2])
            # Each answer is followed by the env's next scripted user turn, and nothing else.
            (turn2,), (turn3,) = steps[0][0], steps[1][0]
            assert turn2["role"] == turn3["role"] == "user"
            assert text_of(turn2) == "Turn 2: 2 more squares." and text_of(turn3) == "Turn 3: 2 more squares."
            assert [p["type"] for p in turn3["content"]] == ["image_url", "image_url", "text"]
            assert [s[1:4] for s in steps[:2]] == [(0.0, False, False)] * 2
            obs, reward, terminated, truncated, info = steps[-1]
            assert len(steps) == 3 and obs == [] and terminated and not truncated
            assert info["stop_condition"] == "user_closed" and info["ok"] and "error" not in info
            assert info["metrics"]["turns_shown"] == 3.0  # the env's own finalize() ran
            ours[index] = (reward, info["metrics"], info["stop_condition"])
    finally:
        env.close()
    theirs = library.result(240)
    assert ours == theirs
    assert {i: r[0] for i, r in ours.items()} == {0: 1.0, 1: 1.0}


def test_the_env_ends_the_exchange_when_it_decides() -> None:
    """The env closes the exchange after a wrong answer: that step is the last, scored by the library."""
    library = library_episodes(blunderer, [0])
    env = AgentEnv(VerifiersV1Adapter(source=COLORS))
    try:
        steps, _ = play(env, blunderer, 0)
    finally:
        env.close()
    assert len(steps) == 2  # right, then wrong: no third turn
    obs, reward, terminated, truncated, info = steps[-1]
    assert (obs, reward, terminated, truncated) == ([], 0.0, True, False)
    assert info["metrics"]["turns_shown"] == 2.0 and info["num_turns"] == 2
    assert (reward, info["metrics"], info["stop_condition"]) == library.result(240)[0]


def test_multi_agent_envs_import_as_games_and_gym_make_says_how_to_play_them(tmp_path: Path) -> None:
    assert detect_verifiers(DUEL).seats == ["first", "second"]
    import_source(DUEL, "Duel", catalog=tmp_path / "catalog.json")
    assert (tmp_path / "catalog.json").exists()
    with pytest.raises(ConfigurationError, match=r"DuelEnv, a multi-agent Verifiers env \(seats: first, second\).*"
                                                 r"openenv_gym\.multiagent\.aec_env"):
        gym.make("openenv/Verifiers-v0", source=str(DUEL))
    # Made for games, it refuses single-agent episodes, saying what plays it.
    adapter = VerifiersV1Adapter(source=DUEL, multiagent=True)
    try:
        runtime.run_sync(adapter.start(), 120)
        assert adapter.players() == ["first", "second"]
        with pytest.raises(ConfigurationError, match="openenv_gym.multiagent"):
            adapter.episode()
    finally:
        runtime.run_sync(adapter.aclose(), 60)


def test_an_env_that_starts_its_agent_twice_is_a_configuration_error(tmp_path: Path) -> None:
    """best-of-n with n > 1 plays several conversations per episode: not one Gymnasium episode.
    Configured for one attempt (``env_config``: the env's own knobs), it plays."""
    pkg = tmp_path / "vf1_twice"
    pkg.mkdir()
    arith = (ENVS / "vf1_arith" / "__init__.py").read_text().replace('__all__ = ["ArithTaskset"]', "")
    (pkg / "__init__.py").write_text(arith + textwrap.dedent("""
        class TwiceConfig(vf.EnvConfig):
            agent: vf.AgentConfig = vf.AgentConfig()
            attempts: int = 2


        class TwiceEnv(vf.Env[TwiceConfig]):
            async def run(self, task, agents):
                for _ in range(self.config.attempts):
                    await agents.agent.run(task)

        __all__ = ["TwiceEnv", "ArithTaskset"]
    """))
    env = AgentEnv(VerifiersV1Adapter(source=pkg))
    try:
        obs, _ = env.reset(options={"index": 0})
        assert obs[-1]["content"] == "What is 2 + 3?"
        with pytest.raises(ConfigurationError, match=r"more than once per episode.*env_config="):
            env.step("5")
        obs, _ = env.reset(options={"index": 1})  # the env stays usable
        assert obs[-1]["content"] == "What is 6 * 7?"
    finally:
        env.close()
    env = AgentEnv(VerifiersV1Adapter(source=pkg, env_config={"attempts": 1}))
    try:
        env.reset(options={"index": 0})
        _, reward, terminated, truncated, info = env.step("5")
        assert (reward, terminated, truncated, info["stop_condition"]) == (1.0, True, False, "agent_completed")
    finally:
        env.close()


def test_a_promptless_task_is_opened_by_the_envs_first_user_turn(tmp_path: Path) -> None:
    """As verifiers' alphabet_sort_v1: the task has no prompt; every user turn is the env's."""
    pkg = tmp_path / "vf1_sorting"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent('''
        import verifiers.v1 as vf


        class SortData(vf.TaskData):
            info: dict


        class SortTask(vf.Task[SortData]):
            @vf.reward(weight=1.0)
            async def sorted_all(self, trace: vf.Trace) -> float:
                return float(trace.last_reply.split() == sorted(sum(self.data.info["turns"], [])))


        class SortEnv(vf.SingleAgentEnv):
            async def run(self, task, agents):
                async with agents.agent.interaction(task) as interaction:
                    for names in task.data.info["turns"]:
                        if (await interaction.turn("Add and sort: " + " ".join(names))).terminated:
                            break


        class SortTaskset(vf.Taskset[SortTask, vf.TasksetConfig]):
            def load(self):
                return [SortTask(SortData(name="sort-0", prompt=None, info={"turns": [["kim", "al"], ["bo"]]}),
                                 self.config.task)]


        __all__ = ["SortEnv", "SortTaskset"]
    '''))
    env = AgentEnv(VerifiersV1Adapter(source=pkg))
    try:
        obs, _ = env.reset(options={"index": 0})
        assert obs[-1] == {"role": "user", "content": "Add and sort: kim al"}
        obs, reward, terminated, truncated, _ = env.step("al kim")
        assert (obs, reward, terminated, truncated) == ([{"role": "user", "content": "Add and sort: bo"}], 0.0, False, False)
        obs, reward, terminated, truncated, info = env.step("al bo kim")
        assert (obs, reward, terminated, truncated, info["stop_condition"]) == ([], 1.0, True, False, "user_closed")
    finally:
        env.close()


def test_a_failing_env_hook_ends_the_episode_truncated_with_its_error(tmp_path: Path) -> None:
    """The env's own run() raising after the agent's turn fails the episode, as under the library's
    runner: truncated, the error in info (never a silent success)."""
    pkg = tmp_path / "vf1_flaky"
    pkg.mkdir()
    arith = (ENVS / "vf1_arith" / "__init__.py").read_text().replace('__all__ = ["ArithTaskset"]', "")
    (pkg / "__init__.py").write_text(arith + textwrap.dedent("""
        class FlakyEnv(vf.SingleAgentEnv):
            async def run(self, task, agents):
                await agents.agent.run(task)
                raise RuntimeError("the grading service is down")

        __all__ = ["FlakyEnv", "ArithTaskset"]
    """))
    env = AgentEnv(VerifiersV1Adapter(source=pkg))
    try:
        env.reset(options={"index": 0})
        obs, reward, terminated, truncated, info = env.step("5")
    finally:
        env.close()
    assert (obs, terminated, truncated, info["ok"]) == ([], False, True, False)
    assert info["error"] == {"type": "RuntimeError", "message": "FlakyEnv.run(): the grading service is down"}
    assert reward == 1.0 and info["rewards"] == {"exact_match": 1.0}  # the trace itself was scored
