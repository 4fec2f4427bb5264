"""Rollouts over vector envs, the rollout and bench commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import openenv_gym  # noqa: F401
from openenv_gym.rollout import collect


def test_collect_finishes_exactly_n_episodes_and_writes_them(tmp_path):
    out = tmp_path / "episodes.jsonl"
    summary = collect("openenv/Arithmetic-v0", 24, num_envs=6, seed=1, out=out, progress=False)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary.episodes == len(lines) == 24
    assert summary.steps == sum(len(r["rewards"]) for r in lines)
    for record in lines:
        assert record["messages"][0]["role"] == "user" and "Compute" in record["messages"][0]["content"]
        assert record["messages"][1]["role"] == "assistant"
        assert record["total_reward"] == sum(record["rewards"])
        assert record["terminated"] or record["truncated"]
        assert len(record["rewards"]) <= 8  # Arithmetic truncates after 8 turns
    assert summary.errors == 0 and summary.steps_per_sec > 0


def test_collect_with_one_sub_env_is_reproducible(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    collect("openenv/Arithmetic-v0", 6, num_envs=1, seed=5, out=a, progress=False)
    collect("openenv/Arithmetic-v0", 6, num_envs=1, seed=5, out=b, progress=False)
    assert a.read_text() == b.read_text()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "openenv_gym.cli", *args], capture_output=True, text=True,
                          timeout=300, env=os.environ.copy())


def test_rollout_command_with_an_openai_compatible_server(tmp_path):
    from openenv_gym.testing.openai_stub import OpenAIStub

    with OpenAIStub() as stub:
        done = _cli("rollout", "openenv/Arithmetic-v0", "--episodes", "12", "--num-envs", "4", "--policy", "openai",
                    "--base-url", stub.url, "--model", "stub", "--quiet", "--out", str(tmp_path / "o.jsonl"))
    assert done.returncode == 0, done.stderr
    assert "mean reward  1.0000" in done.stdout  # the stub solves arithmetic with the calculator
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 12


def test_bench_command_prints_a_table_and_writes_a_plot(tmp_path):
    plot, data = tmp_path / "bench.png", tmp_path / "bench.json"
    done = _cli("bench", "openenv/Arithmetic-v0", "--num-envs", "1,2", "--backend", "concurrent,sync",
                "--rounds", "3", "--plot", str(plot), "--json", str(data))
    assert done.returncode == 0, done.stderr
    assert "concurrent" in done.stdout and "sync" in done.stdout and "failed" not in done.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(data.read_text())
    assert {(r["backend"], r["num_envs"]) for r in rows} == {("concurrent", 1), ("sync", 1), ("concurrent", 2), ("sync", 2)}
    assert all(r["steps_per_sec"] > 0 for r in rows)


# -- grouped collection (GRPO/RLOO): advantages, dropped groups, mean@k and pass@k ------------------
class HalfRight:
    """Uses the calculator, then submits its result on even sub-envs and a wrong answer on odd ones,
    so each group of 4 mixes rewards 1 and 0 (``all_right``: every sub-env answers right)."""

    def __init__(self, all_right: bool = False):
        self.all_right = all_right

    def reset(self, env_id, observation, info):
        pass

    def act_batch(self, env_ids, observations, infos):
        out = []
        for i, obs in zip(env_ids, observations):
            last = obs[-1]
            if last["role"] == "user":
                expr = last["content"].split("Compute ", 1)[1].split(". ", 1)[0]
                out.append(_call("calculator", {"expression": expr}))
            else:
                right = self.all_right or i % 2 == 0
                out.append(_call("submit", {"answer": last["content"] if right else "-1"}))
        return out

    def close(self):
        pass


def _call(name, args):
    return {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _groups(lines):
    groups = {}
    for record in lines:
        groups.setdefault((record["group"], record["group_episode"]), []).append(record)
    return groups


def test_grouped_collect_writes_whole_groups_with_numpy_advantages(tmp_path):
    import numpy as np

    out = tmp_path / "g.jsonl"
    summary = collect("openenv/Arithmetic-v0", 24, num_envs=8, group_size=4, seed=3, out=out, progress=False,
                      policy=HalfRight())
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    groups = _groups(lines)
    assert len(lines) == 24 and len(groups) == 6 and summary.groups == 6 and summary.dropped_groups == 0
    for members in groups.values():
        assert len(members) == 4 and len({m["task_id"] for m in members}) == 1
        rewards = np.array([m["total_reward"] for m in members])
        expected = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        np.testing.assert_allclose([m["advantage"] for m in members], expected)
        assert sorted(rewards) == [0.0, 0.0, 1.0, 1.0]
        assert members[0]["tools"] and members[0]["messages"][0]["role"] == "user"
    assert len({members[0]["task_id"] for members in groups.values()}) == 6, "groups repeated a task"
    assert summary.mean_at_k == 0.5 and summary.pass_at_k == 1.0


def test_drop_equal_leaves_out_groups_without_signal_and_says_so(tmp_path):
    out = tmp_path / "d.jsonl"
    summary = collect("openenv/Arithmetic-v0", 16, num_envs=8, group_size=4, seed=4, out=out, progress=False,
                      policy=HalfRight(all_right=True), drop_equal=True)
    assert summary.groups == 4 and summary.dropped_groups == 4, summary
    assert out.read_text() == ""
    assert summary.mean_at_k == 1.0 and summary.pass_at_k == 1.0
    assert "4 dropped" in summary.table()


def test_grouped_rollout_command(tmp_path):
    out = tmp_path / "c.jsonl"
    done = _cli("rollout", "openenv/Arithmetic-v0", "--episodes", "8", "--num-envs", "4", "--group-size", "4",
                "--quiet", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "pass@4" in done.stdout and "mean@4" in done.stdout
    groups = _groups([json.loads(line) for line in out.read_text().splitlines()])
    assert len(groups) == 2 and all(len(m) == 4 and len({r["task_id"] for r in m}) == 1 for m in groups.values())
    bad = _cli("rollout", "openenv/Arithmetic-v0", "--episodes", "6", "--group-size", "4", "--quiet")
    assert bad.returncode != 0 and "multiple of group_size" in bad.stderr


def test_records_carry_the_token_ids_and_logprobs_the_server_returned(tmp_path):
    from openenv_gym.policies import OpenAIPolicy
    from openenv_gym.testing.openai_stub import OpenAIStub, render_prompt

    out = tmp_path / "t.jsonl"
    with OpenAIStub() as stub:
        policy = OpenAIPolicy(stub.url, "stub", token_ids=True)
        try:
            collect("openenv/Arithmetic-v0", 8, num_envs=4, group_size=2, policy=policy, out=out, progress=False)
        finally:
            policy.close()
        asked = stub.requests[-1]
    assert asked.get("logprobs") is True and asked.get("return_token_ids") is True
    for record in (json.loads(line) for line in out.read_text().splitlines()):
        turns = [m for m in record["messages"] if m["role"] == "assistant"]
        assert len(record["prompt_token_ids"]) == len(record["completion_token_ids"]) == len(record["logprobs"]) == len(turns)
        for t, (prompt, completion, logprobs) in enumerate(
                zip(record["prompt_token_ids"], record["completion_token_ids"], record["logprobs"])):
            # the ids the model saw: the conversation up to this turn, as the server rendered it
            upto = record["messages"][:record["messages"].index(turns[t])]
            assert bytes(prompt).decode() == render_prompt(upto)
            assert len(logprobs) == len(completion) and all(lp == -0.25 for lp in logprobs)
            if t + 1 < len(turns):  # the next prompt extends this prompt and completion
                assert record["prompt_token_ids"][t + 1][:len(prompt) + len(completion)] == prompt + completion
        assert record["total_reward"] == 1.0  # the stub solves arithmetic


def test_rollout_records_decode_as_episode_records_and_replay(tmp_path):
    """A rollout line is an EpisodeRecord: replaying its actions on its task gives its rewards."""
    import gymnasium as gym

    from openenv_gym.records import read_records

    out = tmp_path / "r.jsonl"
    collect("openenv/Arithmetic-v0", 4, num_envs=2, seed=9, out=out, progress=False, policy=HalfRight())
    records = read_records(out)
    assert len(records) == 4 and all(r.env == "openenv/Arithmetic-v0" for r in records)
    env = gym.make("openenv/Arithmetic-v0")
    try:
        for record in records:
            obs, info = env.reset(options=record.reset_options())
            assert info["task_id"] == record.task_id and obs == record.messages[:len(obs)]
            rewards = [env.step(action)[1] for action in record.actions()]
            assert rewards == record.rewards
    finally:
        env.close()


# -- the output file: checked before anything starts, never truncated unasked ----------------------
def test_an_output_that_cannot_be_written_fails_before_anything_starts(tmp_path):
    import pytest

    from openenv_gym.errors import ConfigurationError
    from openenv_gym.testing import procs

    before = set(procs.descendants())
    with pytest.raises(ConfigurationError, match="folder .*missing does not exist"):
        collect("openenv/Arithmetic-v0", 2, num_envs=2, out=tmp_path / "missing" / "e.jsonl", progress=False)
    with pytest.raises(ConfigurationError, match="cannot write episodes to"):
        collect("openenv/Arithmetic-v0", 2, num_envs=2, out=tmp_path, progress=False, if_exists="append")
    assert set(procs.descendants()) - before == set()  # no server was started for a run that cannot be kept


def test_an_output_that_holds_records_is_refused_unless_appended_to_or_overwritten(tmp_path):
    import pytest

    from openenv_gym.errors import ConfigurationError

    out = tmp_path / "e.jsonl"
    first = collect("openenv/Arithmetic-v0", 2, num_envs=2, seed=1, out=out, progress=False)
    assert first.written == 2
    kept = out.read_bytes()
    with pytest.raises(ConfigurationError, match="already holds data.*--append.*--overwrite"):
        collect("openenv/Arithmetic-v0", 2, num_envs=2, seed=2, out=out, progress=False)
    assert out.read_bytes() == kept  # nothing lost
    collect("openenv/Arithmetic-v0", 3, num_envs=2, seed=2, out=out, progress=False, if_exists="append")
    assert out.read_bytes().startswith(kept) and len(out.read_text().splitlines()) == 5
    with open(out, "ab") as f:  # a run killed mid-record leaves a torn line...
        f.write(b'{"env": "openenv/Arith')
    collect("openenv/Arithmetic-v0", 1, num_envs=1, seed=3, out=out, progress=False, if_exists="append")
    lines = out.read_text().splitlines()  # ...and the next record starts on a line of its own
    assert len(lines) == 7 and lines[5] == '{"env": "openenv/Arith' and json.loads(lines[6])["env"]
    collect("openenv/Arithmetic-v0", 1, num_envs=1, seed=3, out=out, progress=False, if_exists="overwrite")
    assert len(out.read_text().splitlines()) == 1
    empty = tmp_path / "made-by-mktemp.jsonl"
    empty.touch()  # an empty file holds nothing to lose
    assert collect("openenv/Arithmetic-v0", 1, num_envs=1, out=empty, progress=False).written == 1


def test_the_summary_counts_the_records_written(tmp_path):
    out = tmp_path / "d.jsonl"
    summary = collect("openenv/Arithmetic-v0", 8, num_envs=4, group_size=4, seed=4, out=out, progress=False,
                      policy=HalfRight(all_right=True), drop_equal=True)
    assert summary.episodes == 8 and summary.written == 0 and out.read_text() == ""
