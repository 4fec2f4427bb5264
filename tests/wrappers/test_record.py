"""RecordEpisodes and EpisodeRecord: records replay their episode, rotate, and read safely.

Episodes run over the real Arithmetic env (a local ORS server started once for the module). The
central property: a record written by RecordEpisodes, replayed through the env (its task through
``reset(options=record.reset_options())``, its assistant messages as actions), gives the same
rewards, the same ending and the same conversation. The file side (rotation, whole lines for a
concurrent reader, closing) is checked on the same wrapper and on JsonlWriter directly.
"""

from __future__ import annotations

import json
import os
import threading
import warnings

import gymnasium as gym
import msgspec
import numpy as np
import pytest
from gymnasium.utils import RecordConstructorArgs
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401  (registers openenv/Arithmetic-v0)
from openenv_gym.errors import ConfigurationError
from openenv_gym.records import EpisodeRecord, decode_record, encode_record, encode_record_into, iter_records, read_records, write_records
from openenv_gym.wrappers import RecordEpisodes, TextToolCalls
from openenv_gym.wrappers.record import JsonlWriter

SECRET = "sk-test-never-in-a-record-1234567890"


@pytest.fixture(scope="module")
def base():
    env = gym.make("openenv/Arithmetic-v0", max_turns=5, secrets={"api_key": SECRET})
    yield env
    env.close()


def tool(name: str, **args) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}]}


def question(obs) -> str:
    return obs[0]["content"].split("Compute ", 1)[1].split(". ", 1)[0]


def play(env, rng: np.random.Generator, *, seed=None, options=None) -> float:
    """One episode with a mix of what agents do: calculator calls, chatter, mistakes, a submission."""
    obs, info = env.reset(seed=seed, options=options)
    q, total = question(obs), 0.0
    while True:
        kind = rng.integers(6)
        if kind == 0:
            action = "Let me think."
        elif kind == 1:
            action = {"role": "assistant", "tool_calls": [{"function": {"name": "calculator", "arguments": "{bad"}}]}
        elif kind == 2:
            action = tool("calculator", expression=q)
        elif kind == 3:
            action = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 * 3"}}</tool_call>'
        else:
            answer = str(eval(q)) if rng.random() < 0.7 else "-1"  # noqa: S307 - the task's own arithmetic
            action = tool("submit", answer=answer)
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        if terminated or truncated:
            return total


def replay(env, record: EpisodeRecord) -> EpisodeRecord:
    """Play ``record`` again through ``env`` and return what that replay recorded."""
    obs, info = env.reset(options=record.reset_options())
    messages, rewards = list(obs), []
    terminated = truncated = False
    for action in record.actions():
        obs, reward, terminated, truncated, info = env.step(action)
        messages += [action] + obs
        rewards.append(reward)
    return EpisodeRecord(task_id=info.get("task_id", record.task_id), messages=messages, rewards=rewards,
                         total_reward=sum(rewards), terminated=terminated, truncated=truncated)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_a_record_replays_the_same_episode(base, tmp_path_factory, seed):
    path = tmp_path_factory.mktemp("rec") / "episodes.jsonl"
    rng = np.random.default_rng(seed)
    env = RecordEpisodes(base, path)
    returns = [play(env, rng, seed=seed), play(env, rng, options={"split": "test", "index": seed % 500}),
               play(env, rng)]
    records = read_records(path)
    assert [r.total_reward for r in records] == returns and env.episodes == 3
    assert records[0].seed == seed and records[1].seed is None
    assert (records[1].split, records[1].index, records[1].task_id) == ("test", seed % 500, f"test/{seed % 500}")
    for record in records:
        assert record.env == "openenv/Arithmetic-v0" and record.env_id is None
        assert [t["function"]["name"] for t in record.tools] == ["calculator", "submit"]
        assert len(record.rewards) == len(record.actions()) and record.terminated != record.truncated
        again = replay(base, record)
        assert again.rewards == record.rewards
        assert (again.terminated, again.truncated) == (record.terminated, record.truncated)
        assert again.messages == record.messages
        # Every tool answer pairs with a call id of the assistant message before it.
        ids = {c["id"] for m in record.actions() for c in m.get("tool_calls") or ()}
        assert all(m["tool_call_id"] in ids for m in record.messages if m["role"] == "tool")


def test_a_record_below_text_tool_calls_replays_on_the_bare_env(base, tmp_path):
    """The record holds the calls the env understood, so the env replays them without the parser."""
    path = tmp_path / "text.jsonl"
    env = RecordEpisodes(TextToolCalls(base), path)
    env.reset(options={"index": 7})
    env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>')
    env.step('{"name": "submit", "parameters": {"answer": "42"}}')
    [record] = read_records(path)
    assert record.actions()[0]["tool_calls"][0]["function"]["name"] == "calculator"
    again = replay(base, record)
    assert again.rewards == record.rewards and again.messages == record.messages


def test_errors_and_truncation_are_recorded(base, tmp_path):
    path = tmp_path / "t.jsonl"
    env = RecordEpisodes(base, path)
    env.reset(seed=1)
    for _ in range(5):  # max_turns=5: the fifth action truncates
        *_, terminated, truncated, _ = env.step("no tools here")
    [record] = read_records(path)
    assert record.truncated and not record.terminated and record.rewards == [0.0] * 5
    assert len(record.messages) == 1 + 2 * 5


def test_an_episode_cut_short_is_not_written(base, tmp_path):
    path = tmp_path / "cut.jsonl"
    env = RecordEpisodes(base, path)
    env.reset(seed=2)
    env.step("unfinished")
    env.reset(seed=3)  # abandons the first episode
    env.step(tool("submit", answer="0"))
    records = read_records(path)
    assert len(records) == 1 and records[0].seed == 3 and env.episodes == 1


def test_no_secret_reaches_the_file(base, tmp_path):
    path = tmp_path / "s.jsonl"
    env = RecordEpisodes(base, path)
    play(env, np.random.default_rng(0), seed=0)
    data = path.read_bytes()
    assert data and SECRET.encode() not in data
    assert set(json.loads(data)) == set(EpisodeRecord.__struct_fields__)


def test_explicit_task_specs_are_kept_for_replay():
    record = EpisodeRecord(task={"id": "x", "question": "1 + 1"}, split="train", index=None)
    assert record.reset_options() == {"task": {"id": "x", "question": "1 + 1"}}
    assert EpisodeRecord(split="test", index=3).reset_options() == {"split": "test", "index": 3}


# -- the file -------------------------------------------------------------------------------------------


def test_rotation_keeps_whole_lines_and_the_newest_backups(base, tmp_path):
    path = tmp_path / "r.jsonl"
    env = RecordEpisodes(base, path, max_bytes=4_000, backups=2)
    rng = np.random.default_rng(5)
    written = [play(env, rng, options={"index": i}) for i in range(12)]
    files = [path.with_name(f"r.jsonl.{n}") for n in (2, 1)] + [path]
    assert all(f.exists() for f in files) and not path.with_name("r.jsonl.3").exists()
    kept = [r for f in files for r in read_records(f)]
    assert [r.index for r in kept] == list(range(12))[-len(kept):]  # oldest first, none lost in between
    assert [r.total_reward for r in kept] == written[-len(kept):]
    for f in files:
        data = f.read_bytes()
        assert data.endswith(b"\n") and (len(data) <= 4_000 or data.count(b"\n") == 1)


def test_backups_zero_deletes_the_full_file(tmp_path):
    path = tmp_path / "z.jsonl"
    writer = JsonlWriter(path, max_bytes=100, backups=0)
    for i in range(5):
        writer.write(json.dumps({"i": i, "pad": "x" * 60}).encode() + b"\n")
    writer.close()
    assert [json.loads(line)["i"] for line in path.read_bytes().splitlines()] == [4]
    assert list(tmp_path.iterdir()) == [path]


def test_a_concurrent_reader_only_ever_sees_whole_records(tmp_path):
    path = tmp_path / "live.jsonl"
    writer = JsonlWriter(path, max_bytes=200_000, backups=1)
    big = EpisodeRecord(task_id="t", messages=[{"role": "user", "content": "x" * 20_000}], rewards=[1.0])
    done = threading.Event()
    seen, problems = [], []

    def read() -> None:
        while not done.is_set():
            try:
                seen.append(len(read_records(path)))
            except FileNotFoundError:
                pass  # between the rename and the new file
            except Exception as exc:  # a half-written record would land here
                problems.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(300):
            writer.write(encode_record(big))
    finally:
        done.set()
        reader.join(30)
        writer.close()
    assert not problems and seen


def test_a_partial_last_line_is_skipped(tmp_path):
    path = tmp_path / "p.jsonl"
    write_records(path, [EpisodeRecord(task_id="a"), EpisodeRecord(task_id="b")])
    with open(path, "ab") as f:
        f.write(encode_record(EpisodeRecord(task_id="c"))[:-10])
    with pytest.warns(UserWarning, match="cut short"):  # no writer holds the file: the line was torn
        assert [r.task_id for r in iter_records(path)] == ["a", "b"]


def test_close_closes_the_file_and_is_idempotent(base, tmp_path):
    env = RecordEpisodes(gym.make("openenv/Arithmetic-v0"), tmp_path / "c.jsonl")
    fd = env._writer._fd
    env.close()
    assert env._writer.closed
    with pytest.raises(OSError):
        os.fstat(fd)
    env.close()


@pytest.mark.parametrize("kwargs", [{"max_bytes": 0}, {"max_bytes": True}, {"backups": -1}, {"max_bytes": 1.5}])
def test_bad_rotation_settings_are_refused(tmp_path, kwargs):
    with pytest.raises(ConfigurationError):
        JsonlWriter(tmp_path / "x.jsonl", **kwargs)


# -- the record type -----------------------------------------------------------------------------------


def test_rollout_dict_records_decode_into_the_struct():
    """The keys rollout.run has written decode as they are (and unknown ones are ignored)."""
    old = {"env_id": 3, "task_id": "train/5", "split": "train", "index": 5, "tools": [], "messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "rewards": [0.5], "errors": [],
        "group": 1, "group_episode": 2, "total_reward": 0.5, "terminated": True, "truncated": False,
        "advantage": -0.7, "prompt_token_ids": [[1, 2]], "completion_token_ids": [[3]], "logprobs": [[-0.1]],
        "something_new": 1}
    record = decode_record(msgspec.json.encode(old))
    assert (record.env_id, record.group, record.group_episode, record.advantage) == (3, 1, 2, -0.7)
    assert record.completion_token_ids == [[3]] and record.actions() == [{"role": "assistant", "content": "a"}]
    assert decode_record(encode_record(record)) == record


def test_what_a_model_wrote_never_breaks_encoding():
    record = EpisodeRecord(messages=[{"role": "assistant", "content": "bad \ud800 surrogate"},
                                     {"role": "user", "content": [{"type": "text", "text": "x"}], "n": np.int64(3),
                                      "obj": object()}])
    back = decode_record(encode_record(record))
    assert back.messages[0]["content"] == "bad \ufffd surrogate"
    assert back.messages[1]["n"] == 3 and back.messages[1]["obj"] == "<object>"


def test_one_reused_buffer_encodes_each_record_as_encode_record_does():
    """What RecordEpisodes writes: records of any size, one after another, into one buffer."""
    buffer = bytearray()
    for size in (3_000, 10, 700, 0, 5_000, 1):
        record = EpisodeRecord(task_id=str(size), messages=[{"role": "user", "content": "x" * size + "\ud800"}])
        assert bytes(encode_record_into(record, buffer)) == encode_record(record)
        assert decode_record(buffer).task_id == str(size)


def test_a_malformed_line_is_a_clear_decode_error():
    with pytest.raises(msgspec.DecodeError):
        decode_record(b'{"rewards": "x"}')


class EndCounter(gym.Wrapper, RecordConstructorArgs):
    """Counts the steps that end an episode (below the recorder, so it sees what the recorder sees)."""

    def __init__(self, env):
        RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        self.ended = 0

    def step(self, action):
        result = self.env.step(action)
        self.ended += bool(result[2] or result[3])
        return result


def test_check_env_passes(base, tmp_path):
    counter = EndCounter(base)
    env = RecordEpisodes(counter, tmp_path / "check.jsonl")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*different from the unwrapped.*")
        check_env(env, skip_render_check=True)
    env.reset(seed=0)  # and one episode played to its end after check_env's, so there is one at least
    env.step(tool("submit", answer="0"))
    records = read_records(env.path)
    assert len(records) == counter.ended >= 1  # every episode that ended was recorded, whole
    for record in records:
        assert len(record.rewards) == len(record.actions()) and (record.terminated or record.truncated)
