"""Multi-agent Verifiers envs as PettingZoo games (``openenv_gym.multiagent``).

The envs are verifiers' own ``kuhn_poker_v1`` and ``proposer_solver_v1`` (copied unchanged into
``tests/envs/verifiers_v1``). The reference for every seat's reward is the library's own episode
(``Env.serving()`` + ``Env.run_episode``), its seats answered by a scripted OpenAI-compatible stub
with the same replies the test's policy gives through the game.
"""

from __future__ import annotations

import asyncio
import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pettingzoo = pytest.importorskip("pettingzoo", reason="the multiagent extra is not installed")

from openenv_gym.adapters.verifiers import v1 as v1mod  # noqa: E402
from openenv_gym.errors import ConfigurationError  # noqa: E402

try:
    vf = v1mod._import_v1()
except ConfigurationError as _exc:
    pytest.skip(f"verifiers.v1 is not usable here: {_exc}", allow_module_level=True)

from pettingzoo.test import api_test, parallel_api_test  # noqa: E402

import openenv_gym  # noqa: E402,F401 - registers openenv/Verifiers-v0
from openenv_gym import runtime  # noqa: E402
from openenv_gym.adapters.games import NotAsked  # noqa: E402
from openenv_gym.adapters.verifiers.process import importable  # noqa: E402
from openenv_gym.adapters.verifiers.v1_env import TooManyRuns  # noqa: E402
from openenv_gym.errors import EpisodeFinished, EpisodeNotStarted  # noqa: E402
from openenv_gym.multiagent import SinglePlayer, aec_env, parallel_env  # noqa: E402
from openenv_gym.testing import procs  # noqa: E402
from openenv_gym.testing.openai_stub import OpenAIStub  # noqa: E402

ENVS = Path(__file__).parents[1] / "envs" / "verifiers_v1"
KUHN = Path(openenv_gym.__file__).parent / "examples" / "kuhn_poker_v1"
PROPOSER = ENVS / "proposer_solver_v1"
VERIFIERS = "openenv/Verifiers-v0"
PINNED_NULL = v1mod._held_to_pins({"id": "null"}, local=True)
"""The ``null`` harness resolved as the package resolves it (the tested set): the library's own runs
share the session's uv cache with the adapter's, and uv keys a script's environment by its
requirements, not by the resolution date."""


@pytest.fixture(scope="module", autouse=True)
def importable_tasksets() -> Iterator[None]:
    """The library's own runs (the reference) import the tasksets by name."""
    with importable(ENVS), importable(KUHN.parent):
        yield


def text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))


def kuhn_move(messages: list[dict[str, Any]]) -> str:
    """A fixed strategy from the seat's whole conversation: bet or call with a king, check with a
    queen and call a bet with it, fold a jack to a bet."""
    seen = text(messages)
    card = re.search(r"Your private card: ([JQK])", seen)[1]
    legal = re.findall(r"Your legal actions: (.*)\.", seen)[-1]
    if "[bet]" in legal:
        return "I bet. [bet]" if card == "K" else "[check]"
    return "[call]" if card in "KQ" else "[fold]"


def library_kuhn(indices: list[int], reply: Callable[[list[dict[str, Any]]], str]) -> dict[int, dict[str, tuple]]:
    """The library's own hands answered by ``reply``: index -> seat -> (payoff, forfeit, history)."""
    async def run() -> dict[int, dict[str, tuple]]:
        seat = {"runtime": {"type": "subprocess"}, "harness": PINNED_NULL}
        config = vf.resolve_env_config({"taskset": {"id": "kuhn_poker_v1"}, "player0": seat, "player1": seat})
        env = await asyncio.to_thread(vf.load_environment, config)
        out = {}
        with OpenAIStub(lambda body: {"role": "assistant", "content": reply(body["messages"])}) as stub:
            ctx = vf.ModelContext(model="stub", client=vf.EvalClientConfig(base_url=stub.url, api_key_var="NO_SUCH_KEY"))
            async with env.serving():
                tasks = env.taskset.take(max(indices) + 1) if hasattr(env.taskset, "take") else None
                tasks = list(tasks) if tasks is not None else [t for _, t in zip(range(max(indices) + 1), env.taskset)]
                for i in indices:
                    episode = await env.run_episode(tasks[i], ctx)
                    assert episode.ok, episode.errors
                    out[i] = {t.agent.name: (float(t.reward), float(t.metrics["forfeit"]), t.info["kuhn"]["history"])
                              for t in episode.traces}
        return out

    return runtime.submit(run()).result(600)


def play_aec(env: Any, index: int, reply: Callable[[list[dict[str, Any]]], str]) -> dict[str, tuple]:
    """One game through the AEC env: seat -> (reward, forfeit, history), each seat answered by
    ``reply`` on its whole conversation."""
    env.reset(options={"index": index})
    history: dict[str, list] = {}
    out = {}
    for seat in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        if terminated or truncated:
            out[seat] = (reward, info["metrics"]["forfeit"], info)
            with pytest.raises(ValueError, match="the only valid action is None"):  # PettingZoo's rule for a finished seat
                env.step("[check]")
            env.step(None)
            continue
        history.setdefault(seat, []).extend(obs)
        move = reply(history[seat])
        history[seat].append({"role": "assistant", "content": move})
        env.step(move)
    return out


def test_kuhn_seats_get_the_payoffs_verifiers_own_eval_gives() -> None:
    hands = [0, 1, 5]
    reference = library_kuhn(hands, kuhn_move)
    env = aec_env(VERIFIERS, source=str(KUHN))
    try:
        assert env.possible_agents == ["player0", "player1"]
        for i in hands:
            ours = play_aec(env, i, kuhn_move)
            assert set(ours) == {"player0", "player1"}
            for seat, (reward, forfeit, info) in ours.items():
                assert (reward, forfeit) == reference[i][seat][:2], (i, seat)
                assert info["rewards"] == {"payoff": reward} and info["task_id"] == f"hand#{i}"
            assert ours["player0"][0] == -ours["player1"][0]  # zero-sum
        assert {r[0] for hand in reference.values() for r in hand.values()} - {1.0, -1.0, 2.0, -2.0} == set()
    finally:
        env.close()


def test_a_seat_that_answers_garbage_forfeits_as_the_env_decides() -> None:
    def garbage_first(messages: list[dict[str, Any]]) -> str:
        return "I refuse to play." if "Player 0." in text(messages) else kuhn_move(messages)

    reference = library_kuhn([4], garbage_first)[4]
    env = aec_env(VERIFIERS, source=str(KUHN))
    try:
        ours = play_aec(env, 4, garbage_first)
    finally:
        env.close()
    assert {s: r[:2] for s, r in ours.items()} == {s: r[:2] for s, r in reference.items()}
    assert ours["player0"][:2] == (-1.0, 1.0)  # forfeited after its retry


def test_pettingzoo_conformance_tests_pass() -> None:
    env = aec_env(VERIFIERS, source=str(KUHN))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its advice for array observations
            api_test(env, num_cycles=12)
    finally:
        env.close()
    par = parallel_env(VERIFIERS, source=str(KUHN))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parallel_api_test(par, num_cycles=12)
    finally:
        par.close()


PROBLEM = '{"problem": "What is 6 times 7?", "answer": 42}'


def proposer_reply(messages: list[dict[str, Any]]) -> str | None:
    return f"Here it is.\n{PROBLEM}" if "Invent ONE" in text(messages) else None


def library_proposer_solver(n: int, solver_replies: list[str]) -> tuple[dict[str, float], list[float]]:
    """The library's own episode of task 0: the proposer's (learnability, solve_rate) and the
    solvers' ``correct`` rewards, the k-th solver call answered ``solver_replies[k]``."""
    async def run() -> tuple[dict[str, float], list[float]]:
        seat = {"runtime": {"type": "subprocess"}, "harness": PINNED_NULL}
        config = vf.resolve_env_config({"taskset": {"id": "proposer_solver_v1"}, "n": n, "proposer": seat,
                                        "solver": seat})
        env = await asyncio.to_thread(vf.load_environment, config)
        calls = iter(solver_replies)

        def script(body: dict[str, Any]) -> dict[str, Any]:
            return {"role": "assistant", "content": proposer_reply(body["messages"]) or next(calls)}

        with OpenAIStub(script) as stub:
            ctx = vf.ModelContext(model="stub", client=vf.EvalClientConfig(base_url=stub.url, api_key_var="NO_SUCH_KEY"))
            async with env.serving():
                episode = await env.run_episode(list(env.taskset)[0], ctx)
        assert episode.ok, episode.errors
        proposer = next(t for t in episode.traces if t.agent.name == "proposer")
        solvers = sorted(float(t.reward) for t in episode.traces if t.agent.name == "solver")
        return {"learnability": float(proposer.reward), "solve_rate": float(proposer.metrics["solve_rate"])}, solvers

    return runtime.submit(run()).result(600)


def test_proposer_solver_seats_act_together_and_the_proposer_is_paid_after_the_solvers() -> None:
    reference = library_proposer_solver(3, ["The answer is 42", "41", "I think 42"])
    env = parallel_env(VERIFIERS, source=str(PROPOSER), env_config={"n": 3}, seat_runs={"solver": 3})
    try:
        assert env.possible_agents == ["proposer", "solver_0", "solver_1", "solver_2"]
        obs, infos = env.reset(options={"index": 0})
        assert env.agents == ["proposer"] and infos["proposer"]["asked"]
        assert "Invent ONE" in text(obs["proposer"])
        obs, rewards, terms, truncs, infos = env.step({"proposer": proposer_reply(obs["proposer"])})
        # The n solvers, asked at once; the proposer stays live (unpaid), not asked.
        assert env.agents == ["proposer", "solver_0", "solver_1", "solver_2"]
        assert [s for s in env.agents if infos[s]["asked"]] == ["solver_0", "solver_1", "solver_2"]
        assert obs["proposer"] == [] and not any(terms.values())
        assert all("What is 6 times 7?" in text(obs[s]) for s in ("solver_0", "solver_1", "solver_2"))
        actions = {"proposer": None, "solver_0": "The answer is 42", "solver_1": "41", "solver_2": "I think 42"}
        obs, rewards, terms, truncs, infos = env.step(actions)
        assert env.agents == [] and all(terms.values()) and not any(truncs.values())
        assert rewards["proposer"] == pytest.approx(reference[0]["learnability"])
        assert infos["proposer"]["metrics"]["solve_rate"] == pytest.approx(reference[0]["solve_rate"])
        assert sorted(rewards[s] for s in ("solver_0", "solver_1", "solver_2")) == reference[1]
        assert [rewards[s] for s in ("solver_0", "solver_1", "solver_2")] == [1.0, 0.0, 1.0]
        assert infos["solver_1"]["rewards"] == {"correct": 0.0}
    finally:
        env.close()


def test_a_seat_run_more_often_than_declared_says_how_to_declare_it() -> None:
    env = aec_env(VERIFIERS, source=str(PROPOSER), env_config={"n": 2})
    try:
        assert env.possible_agents == ["proposer", "solver"]
        env.reset(options={"index": 0})
        with pytest.raises(TooManyRuns, match=r"ran seat 'solver' 2 times.*seat_runs=\{'solver': N\}"):
            env.step(proposer_reply(env.observe("proposer")))
    finally:
        env.close()


def test_bad_input_is_a_clear_error_or_an_observation_and_closing_mid_game_stops_every_seat() -> None:
    before = set(procs.descendants(os.getpid()))  # other tests' servers of this worker
    env = aec_env(VERIFIERS, source=str(KUHN))
    try:
        with pytest.raises(EpisodeNotStarted):
            env.step("[check]")
        env.reset(options={"index": 1})
        seat = env.agent_selection
        env.step({"role": "assistant", "content": "[bet]", "tool_calls": "not a list"})  # unreadable
        obs, reward, terminated, truncated, info = env.last()
        assert env.agent_selection == seat and info["invalid_action"] == "unreadable"
        assert [m["role"] for m in obs] == ["user"] and obs[0]["content"].startswith("Your last message could not be read")
        with pytest.raises(TypeError):  # not an action at all: the trainer's bug, raised
            env.step({1, 2})
        running = set(procs.descendants(os.getpid())) - before
        assert running, "the asked seat's program runs while it waits for its answer"
    finally:
        env.close()
    assert procs.wait_dead(sorted(running), timeout=10) == [], "closing mid-game left a seat's program running"
    par = parallel_env(VERIFIERS, source=str(KUHN))
    try:
        par.reset(options={"index": 1})
        with pytest.raises(NotAsked, match="no action for player0"):
            par.step({"player1": "[check]"})
        with pytest.raises(NotAsked, match="'dealer' is no seat"):
            par.step({"player0": "[check]", "dealer": "[bet]"})
        while par.agents:
            par.step({s: "[check]" for s in par.agents})
        with pytest.raises(EpisodeFinished):
            par.step({"player0": "[check]"})
    finally:
        par.close()


class Scripted:
    """An opponent policy ``(seat, observation, info) -> action`` playing :func:`kuhn_move` on each
    seat's whole conversation."""

    def __init__(self) -> None:
        self.history: dict[str, list] = {}

    def __call__(self, seat: str, observation: list, info: dict) -> str:
        seen = self.history.setdefault(seat, [])
        seen += observation
        move = kuhn_move(seen)
        seen.append({"role": "assistant", "content": move})
        return move


@pytest.mark.parametrize("made", ["wrapper", "gym.make"])
def test_one_seat_is_a_gymnasium_env_against_a_given_policy(made: str) -> None:
    import gymnasium as gym

    reference = library_kuhn([2], kuhn_move)[2]
    if made == "wrapper":
        env = SinglePlayer(aec_env(VERIFIERS, source=str(KUHN)), "player1", opponents=Scripted())
    else:
        env = gym.make("openenv/KuhnPoker-v0", single_player="player1", opponents=Scripted())
        assert env.spec.id == "openenv/KuhnPoker-v0"
    try:
        obs, info = env.reset(options={"index": 2})
        mine = list(obs)
        assert info["seat"] == "player1" and "Player 1" in text(obs)
        for _ in range(4):
            move = kuhn_move(mine)
            mine.append({"role": "assistant", "content": move})
            obs, reward, terminated, truncated, info = env.step(move)
            mine += obs
            if terminated or truncated:
                break
        assert terminated and reward == reference["player1"][0]
        with pytest.raises(EpisodeFinished):
            env.step("[check]")
    finally:
        env.close()


def test_single_player_kwargs_are_checked_where_they_cannot_apply() -> None:
    import gymnasium as gym

    with pytest.raises(ConfigurationError, match="pass single_player=SEAT too"):
        gym.make("openenv/KuhnPoker-v0", opponents=Scripted())
    with pytest.raises(ConfigurationError, match="needs opponents="):
        gym.make("openenv/KuhnPoker-v0", single_player="player1")
    with pytest.raises(ConfigurationError, match="not a multi-agent env"):
        gym.make("openenv/Arithmetic-v0", single_player="player1", opponents=Scripted())
    with pytest.raises(ConfigurationError, match="'dealer' is not a seat"):
        gym.make("openenv/KuhnPoker-v0", single_player="dealer", opponents=Scripted())


@pytest.mark.parametrize("backend", ["concurrent", pytest.param("ray", marks=pytest.mark.ray)])
def test_one_seat_is_an_env_of_the_package_so_vector_envs_and_rollout_take_it(tmp_path: Path, backend: str) -> None:
    """single_player= makes the seat an adapter of its own: gym.make_vec runs many seats and
    `openenv-gym rollout` collects them (opponents in their JSON form: a model's endpoint), every
    episode paid the seat's own kuhn payoff."""
    import json

    import gymnasium as gym

    from openenv_gym.cli import main

    with OpenAIStub(lambda body: {"role": "assistant", "content": kuhn_move(body["messages"])}) as stub:
        opponents = {"base_url": stub.url, "model": "stub"}
        envs = gym.make_vec("openenv/KuhnPoker-v0", 2, single_player="player1", opponents=opponents, backend=backend)
        try:
            obs, infos = envs.reset(seed=5)
            assert all("as Player 1" in text(o) for o in obs) and list(infos["seat"]) == ["player1"] * 2
            history = [list(o) for o in obs]
            done = [False, False]
            for _ in range(6):
                actions = [kuhn_move(h) for h in history]
                obs, rewards, terms, truncs, infos = envs.step(actions)
                for i in range(2):
                    history[i] += [{"role": "assistant", "content": actions[i]}, *obs[i]]
                    if (terms[i] or truncs[i]) and not done[i]:
                        done[i] = True
                        assert terms[i] and rewards[i] in (-2.0, -1.0, 1.0, 2.0)  # a kuhn payoff, the seat's own
                if all(done):
                    break
            assert all(done)
        finally:
            envs.close()
        if backend == "ray":
            return
        out = tmp_path / "seat.jsonl"
        assert main(["rollout", "openenv/KuhnPoker-v0", "single_player=player1", f"opponents={json.dumps(opponents)}",
                     "--episodes", "2", "--num-envs", "2", "--quiet", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all("as Player 1" in r["messages"][0]["content"] for r in records)
    assert all(r["terminated"] and r["total_reward"] in (-2.0, -1.0, 1.0, 2.0) for r in records)


@pytest.mark.slow  # a dozen games with random actions: about a minute
def test_one_seat_passes_gymnasiums_env_checker() -> None:
    from gymnasium.utils.env_checker import check_env

    env = SinglePlayer(aec_env(VERIFIERS, source=str(KUHN)), "player1", opponents=Scripted())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_many_games_at_once_first_ready_over_game_seat_pairs_with_per_seat_groups_and_records() -> None:
    from openenv_gym.multiagent import vector_env

    env = vector_env(VERIFIERS, 4, source=str(KUHN), group_size=2)
    try:
        ready = env.reset(seed=7)
        assert sorted((r.game, r.seat) for r in ready) == [(g, "player0") for g in range(4)]
        tasks = {r.game: r.info["task_id"] for r in ready}
        assert tasks[0] == tasks[1] and tasks[2] == tasks[3]  # a group's games share the task
        history: dict[tuple[int, str], list] = {}

        def answer(rs: list) -> dict:
            actions = {}
            for r in rs:
                if r.terminated or r.truncated:
                    continue
                seen = history.setdefault((r.game, r.seat), [])
                seen += r.observation
                actions[(r.game, r.seat)] = kuhn_move(seen)
                seen.append({"role": "assistant", "content": actions[(r.game, r.seat)]})
            return actions

        first = answer(ready)
        env.send({(0, "player0"): first.pop((0, "player0"))})
        moved = env.recv()  # game 0 moved; the others wait for their answers, not holding it up
        assert {r.game for r in moved} == {0}
        with pytest.raises(NotAsked):
            env.send({(0, "player0"): "[check]"})  # already answered
        pending = answer(moved) | first
        records: list = []
        while len([r for r in records if r.group_episode == 0]) < 8:  # each group's first games, both seats
            pending = answer(env.step(pending))
            records += env.pop_records()
    finally:
        env.close()
    records = [r for r in records if r.group_episode == 0]
    assert len(records) == 8 and {r.seat for r in records} == {"player0", "player1"}
    by_game: dict[str, list] = {}
    for r in records:
        by_game.setdefault(r.game_id, []).append(r)
        assert r.other_seats == [s for s in ("player0", "player1") if s != r.seat]
        assert r.messages[0]["role"] == "system" and f"Player {r.seat[-1]}" in r.messages[0]["content"]
        assert r.advantage is not None and r.group in (0, 1)
    assert all(len(rs) == 2 and sum(r.total_reward for r in rs) == 0 for rs in by_game.values())  # zero-sum
    hands = sorted({r.index for r in records})
    reference = library_kuhn(hands, kuhn_move)
    for r in records:
        assert r.total_reward == reference[r.index][r.seat][0]


def test_recv_with_nothing_moving_says_why_at_once() -> None:
    from openenv_gym.multiagent import vector_env

    env = vector_env(VERIFIERS, 1, source=str(KUHN), autoreset=False, step_timeout=600)
    try:
        ready = env.reset(options={"index": 3})
        with pytest.raises(NotAsked, match="1 ready seat"):
            env.recv()  # nobody answered: no game moves
        history: dict = {}
        while True:
            live = [r for r in ready if not (r.terminated or r.truncated)]
            if not live:
                break
            actions = {}
            for r in live:
                seen = history.setdefault(r.seat, [])
                seen += r.observation
                actions[(r.game, r.seat)] = kuhn_move(seen)
            ready = env.step(actions)
        with pytest.raises(NotAsked, match="every game is over"):
            env.recv()
    finally:
        env.close()


def test_an_env_that_fails_mid_game_ends_every_seat_truncated_with_its_error() -> None:
    """proposer_solver's run() raises when the proposer's reply holds no JSON contract: the game
    is over at once, every started seat truncated with the env's error, nothing hangs."""
    env = parallel_env(VERIFIERS, source=str(PROPOSER), env_config={"n": 2}, seat_runs={"solver": 2})
    try:
        env.reset(options={"index": 0})
        obs, rewards, terms, truncs, infos = env.step({"proposer": "I would rather not."})
        assert env.agents == [] and list(truncs) == ["proposer"] and truncs["proposer"]
        assert rewards == {"proposer": 0.0}
        assert "did not end with the JSON contract" in infos["proposer"]["error"]["message"]
    finally:
        env.close()


def play_until(env: Any, ready: list, done: Callable[[list], bool], history: dict, tokens: bool = False) -> list:
    """Answer every ready seat with ``kuhn_move`` until ``done(records so far)``; the records."""
    records: list = []
    while not done(records):
        actions, toks = {}, {}
        for r in ready:
            if r.terminated or r.truncated:
                history.pop((r.game, r.seat), None)
                continue
            seen = history.setdefault((r.game, r.seat), [])
            seen += r.observation
            actions[(r.game, r.seat)] = move = kuhn_move(seen)
            seen.append({"role": "assistant", "content": move})
            toks[(r.game, r.seat)] = {"completion_token_ids": [len(move)], "logprobs": [-0.5]}
        ready = env.step(actions, toks if tokens else None)
        records += env.pop_records()
    return records


@pytest.mark.parametrize("backend", ["hosts", pytest.param("ray", marks=pytest.mark.ray)])
def test_games_run_in_host_processes_and_ray_actors_as_in_process(backend: str) -> None:
    """The same shard holds games wherever it runs: 4 games over 2 host processes (or 2 Ray
    actors) give the seats what this process gives them, the per-seat groups, and the token ids
    the policy reported; closing leaves no process."""
    from openenv_gym.multiagent import vector_env

    before = set(procs.descendants(os.getpid()))
    options = {"num_hosts": 2} if backend == "hosts" else {"num_actors": 2}
    env = vector_env(VERIFIERS, 4, source=str(KUHN), group_size=2, backend="concurrent" if backend == "hosts" else "ray",
                     vector_options=options)
    try:
        assert env.possible_agents == ["player0", "player1"]
        pids = env.pids
        assert len(set(pids)) == 2 and os.getpid() not in pids
        ready = env.reset(seed=3)
        assert sorted((r.game, r.seat) for r in ready) == [(g, "player0") for g in range(4)]
        records = play_until(env, ready, lambda rs: len([r for r in rs if r.group_episode == 0]) >= 8, {}, tokens=True)
    finally:
        env.close()
    first = [r for r in records if r.group_episode == 0]
    assert {r.index for r in first if r.group == 0} == {3} and {r.index for r in first if r.group == 1} == {4}
    by_game: dict[str, list] = {}
    for r in first:
        by_game.setdefault(r.game_id, []).append(r)
        assert r.advantage is not None and r.completion_token_ids == [[len(m["content"])] for m in r.messages
                                                                      if m["role"] == "assistant"]
    assert len(by_game) == 4 and all(sum(r.total_reward for r in rs) == 0 for rs in by_game.values())
    reference = library_kuhn(sorted({r.index for r in first}), kuhn_move)
    assert all(r.total_reward == reference[r.index][r.seat][0] for r in first)
    if backend == "hosts":
        left = sorted(set(procs.descendants(os.getpid())) - before)
        assert procs.wait_dead(left, timeout=10) == [], "closing left a host or a seat's program running"


@pytest.mark.slow
def test_a_killed_host_ends_its_games_truncated_and_they_start_again() -> None:
    from openenv_gym.multiagent import vector_env

    env = vector_env(VERIFIERS, 2, source=str(KUHN), vector_options={"num_hosts": 2})
    try:
        ready = env.reset(seed=0)
        victim = env.pids[1]  # the host of game 1
        os.kill(victim, 9)
        history: dict = {}
        actions = {}
        for r in ready:
            seen = history.setdefault((r.game, r.seat), list(r.observation))
            actions[(r.game, r.seat)] = kuhn_move(seen)
        ended = env.step(actions)
        for _ in range(20):  # game 0 may answer first
            if any(r.game == 1 and r.truncated for r in ended):
                break
            ended += env.recv()
        lost = [r for r in ended if r.game == 1 and r.truncated]
        assert [r.seat for r in lost] == ["player0", "player1"]  # every seat the game had started
        assert "failed and was replaced" in lost[0].info["error"]["message"]
        assert env.replaced_shards == 1 and victim not in env.pids
        # Game 1 starts again on the replacement: its first seat is asked.
        records = play_until(env, [r for r in ended if not r.truncated],
                             lambda rs: any(r.env_id == 1 and not r.truncated for r in rs), history)
        assert any(r.env_id == 1 and r.terminated for r in records)
    finally:
        env.close()
