"""Reading episode files for the viewer: rollouts, rotated RecordEpisodes files, and broken lines.

The promise: every line of every file is either an episode in the list or a note saying why it is
not; nothing a file holds makes the reader raise; a torn last line is skipped with a note.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from web_fixtures import recorded_files, rollout_file  # noqa: F401 (pytest fixtures, used by name)

from openenv_gym.errors import ConfigurationError
from openenv_gym.records import read_records
from openenv_gym.web.rollouts import MAX_NOTES, episode_text, expand, load
from openenv_gym.web.summary import summarize


def test_a_rollout_is_read_whole(rollout_file: Path) -> None:
    records = read_records(rollout_file)
    rollouts = load([rollout_file])
    assert len(rollouts) == len(records) == 32 and rollouts.skipped == 0
    c = rollouts.columns
    assert c["reward"] == [r.total_reward for r in records]
    assert c["turns"] == [len(r.rewards) for r in records]
    assert c["task"] == [f"{r.split}/{r.index}" for r in records]
    assert c["group"] == [r.group for r in records] and c["advantage"] == [r.advantage for r in records]
    assert c["terminated"] == [r.terminated for r in records]
    assert all(c["tokens"]), "the stub's token ids are seen"
    assert [rollouts.envs[e] for e in c["env"]] == ["openenv/Arithmetic-v0"] * 32
    for i, record in enumerate(records):  # opening an episode gives the record as rollouts wrote it
        assert rollouts.record(i) == record
        assert rollouts.where(i) == f"groups.jsonl:{i + 1}"


def test_rotated_files_are_read_oldest_first(recorded_files: Path) -> None:
    files = expand([recorded_files])
    assert [f.name for f in files] == [f"episodes.jsonl.{n}" for n in (5, 4, 3, 2, 1)] + ["episodes.jsonl"]
    rollouts = load([recorded_files])
    seeds = [rollouts.record(i).seed for i in range(len(rollouts))]
    assert seeds == [0, 1, 2, 3, 4, 5]
    assert rollouts.files == [f.name for f in files]
    # Naming a rotated file, or a file twice, reads it once.
    again = load([recorded_files, recorded_files.with_name("episodes.jsonl.2"), recorded_files])
    assert len(again) == 6


def test_a_torn_last_line_is_skipped_with_a_note(rollout_file: Path, tmp_path: Path) -> None:
    data = rollout_file.read_bytes()
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(data[: len(data) - 40])  # the last record is cut 40 bytes before its end
    rollouts = load([torn])
    assert len(rollouts) == 31 and rollouts.skipped == 1
    assert rollouts.notes == ["torn.jsonl: line 32 has no end (a record still being written, or cut off): skipped"]


def test_broken_lines_are_skipped_with_notes_and_the_rest_read(rollout_file: Path, tmp_path: Path) -> None:
    lines = rollout_file.read_bytes().splitlines(keepends=True)
    bad = [b"not json\n", b'{"rewards": "many"}\n', b"\xff\xfe\n", b"[" * 100_000 + b"\n", b'"a string"\n']
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(lines[0] + b"".join(bad) + b"\n  \n" + lines[1])
    rollouts = load([mixed])
    assert len(rollouts) == 2 and rollouts.skipped == len(bad)
    assert [n.split(" is not")[0] for n in rollouts.notes] == [f"mixed.jsonl: line {k}" for k in range(2, 7)]
    assert rollouts.columns["line"] == [1, 9]


def test_notes_are_capped_but_every_skip_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "junk.jsonl"
    path.write_bytes(b"junk\n" * (MAX_NOTES * 3))
    rollouts = load([path])
    assert len(rollouts) == 0 and rollouts.skipped == MAX_NOTES * 3 and len(rollouts.notes) == MAX_NOTES


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no such file: .*nope.jsonl"):
        load([tmp_path / "nope.jsonl"])
    with pytest.raises(ConfigurationError, match="not a file"):
        load([tmp_path])


def test_a_record_whose_other_fields_are_malformed_is_listed_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "logprobs": [["x"]]}) + "\n")
    rollouts = load([path])
    assert len(rollouts) == 1
    with pytest.raises(msgspec.DecodeError):
        rollouts.record(0)


def test_search_finds_text_calls_and_results_case_insensitively(rollout_file: Path) -> None:
    rollouts = load([rollout_file])
    records = read_records(rollout_file)
    assert rollouts.search("") == list(range(32))
    assert rollouts.search("CORRECT!") == [i for i, r in enumerate(records) if r.total_reward > 0]
    question = records[5].messages[0]["content"].split("Compute ", 1)[1].split(".", 1)[0]
    hits = rollouts.search(f"  compute   {question} ")
    assert 5 in hits and all(records[i].index == records[5].index for i in hits)
    assert rollouts.search('"expression"') and rollouts.search("calculator")  # call arguments and names
    assert rollouts.search("tool_calls") == []  # the JSON's keys are not the conversation


def test_episode_text_reads_parts_and_odd_arguments() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "look\nhere"}, {"type": "image_url"}]},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}, "junk", {"function": None}]},
                "not a message"]
    assert episode_text(messages) == 'look here f {"a":1}'


def test_summary_of_a_grouped_rollout(rollout_file: Path) -> None:
    records = read_records(rollout_file)
    s = summarize(load([rollout_file]))
    rewards = [r.total_reward for r in records]
    assert s["episodes"] == 32 and s["mean_reward"] == pytest.approx(sum(rewards) / 32)
    groups: dict[tuple[int, int], list[float]] = {}
    for r in records:
        groups.setdefault((r.group, r.group_episode), []).append(r.total_reward)
    assert s["groups"]["count"] == len(groups) == 8 and s["groups"]["k"] == 4
    assert s["groups"]["mean_at_k"] == pytest.approx(sum(sum(g) / 4 for g in groups.values()) / 8)
    assert s["groups"]["pass_at_k"] == pytest.approx(sum(max(g) > 0 for g in groups.values()) / 8)
    assert s["histogram"] == {"labels": sorted({f"{x:.4g}" for x in rewards}, key=float),
                              "counts": [rewards.count(v) for v in sorted(set(rewards))]}
    assert s["envs"][0]["env"] == "openenv/Arithmetic-v0" and s["envs"][0]["episodes"] == 32


def test_summary_without_groups_and_with_many_distinct_rewards(tmp_path: Path) -> None:
    path = tmp_path / "spread.jsonl"
    path.write_text("".join(json.dumps({"env": "a" if i % 2 else "b", "total_reward": i / 7}) + "\n" for i in range(100)))
    s = summarize(load([path]))
    assert s["groups"] is None
    assert len(s["histogram"]["counts"]) == 20 and sum(s["histogram"]["counts"]) == 100
    assert {e["env"]: e["episodes"] for e in s["envs"]} == {"b": 50, "a": 50}
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert summarize(load([empty]))["episodes"] == 0


# -- fuzz: whatever a line holds, it is an episode or a note ---------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=12)
_field = st.sampled_from(["env", "task_id", "split", "index", "messages", "rewards", "total_reward", "terminated",
                          "errors", "group", "group_episode", "advantage", "completion_token_ids", "tools", "logprobs"])
_record_like = st.dictionaries(_field, _json, max_size=8).map(lambda d: json.dumps(d).encode())
_line = st.one_of(_record_like, st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")),
                  _json.map(lambda v: json.dumps(v).encode()))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_line, max_size=8), torn=st.booleans())
def test_fuzz_every_line_is_an_episode_or_a_note(tmp_path: Path, lines: list[bytes], torn: bool) -> None:
    path = tmp_path / "fuzz.jsonl"
    data = b"".join(line + b"\n" for line in lines)
    if torn and data:
        data = data[:-1]
    path.write_bytes(data)
    rollouts = load([path])
    whole = lines[:-1] if torn and lines else lines
    expected = sum(1 for line in whole if line.strip())  # blank lines are neither
    if torn and lines and lines[-1]:
        expected += 1  # the torn line: a note
    assert len(rollouts) + rollouts.skipped == expected
    summarize(rollouts)
    for i in range(len(rollouts)):
        try:
            rollouts.record(i)
        except msgspec.DecodeError:
            pass  # listed, and opening it says why
    rollouts.search("a")
    os.unlink(path)
