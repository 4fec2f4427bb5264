"""RecordEpisodes' files under stress: many writers on one path, a full disk, torn lines.

A vector env's sub-envs all record to the path they were given (``env_wrappers=[partial(
RecordEpisodes, path=...)]``), in this process's threads, in host processes or in Ray actors:
every finished episode must be in the files afterwards, and no file may grow past ``max_bytes``.
A disk that fills up (a real one: a file size limit, or a small tmpfs) must never cost a step's
result or a record already written, and a line torn anyhow costs only itself.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.vector import AutoresetMode

import openenv_gym  # noqa: F401  (registers openenv/Arithmetic-v0)
from openenv_gym.records import EpisodeRecord, encode_record, read_records, write_records
from openenv_gym.wrappers import RecordEpisodes
from openenv_gym.wrappers.record import JsonlWriter

ARITH = "openenv/Arithmetic-v0"
FULL_DISK = Path(__file__).with_name("full_disk.py")
WRONG = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "submit", "arguments": '{"answer": "-1"}'}}]}


def files_of(path: Path) -> list[Path]:
    """``path`` and its rotated backups."""
    return [path, *sorted(path.parent.glob(path.name + ".*"))]


def lines_of(path: Path, max_bytes: int) -> list[bytes]:
    """Every line of ``path`` and its backups; each file whole (ends with a newline) and within
    ``max_bytes`` (or holding a single line)."""
    lines = []
    for f in files_of(path):
        data = f.read_bytes()
        assert data.endswith(b"\n"), f.name
        assert len(data) <= max_bytes or data.count(b"\n") == 1, (f.name, len(data))
        lines += data.splitlines()
    return lines


# -- many writers on one path ------------------------------------------------------------------------

WRITER = """
import sys
from openenv_gym.wrappers.record import JsonlWriter
path, tag, n, max_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
writer = JsonlWriter(path, max_bytes=max_bytes, backups=100_000)
for i in range(n):
    writer.write(('{"w": "%s", "i": %d, "pad": "%s"}\\n' % (tag, i, "x" * (i % 200))).encode())
writer.close()
"""


def test_writers_in_threads_and_processes_sharing_a_path_lose_no_line(tmp_path):
    """Each writer rotates by the file's real size, under the file's lock: no line is overwritten
    by another writer's rotation, and no file outgrows max_bytes (a writer shared by threads too)."""
    path, n, max_bytes = tmp_path / "shared.jsonl", 400, 4_000
    processes = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"p{k}", str(n), str(max_bytes)])
                 for k in range(3)]

    def write(tag: str) -> None:
        writer = JsonlWriter(path, max_bytes=max_bytes, backups=100_000)
        for i in range(n):
            pad = "x" * (i % 200)
            writer.write(f'{{"w": "{tag}", "i": {i}, "pad": "{pad}"}}\n'.encode())
        writer.close()

    shared = JsonlWriter(path, max_bytes=max_bytes, backups=100_000)  # one writer, two threads

    def write_shared(tag: str) -> None:
        for i in range(n):
            pad = "x" * (i % 200)
            shared.write(f'{{"w": "{tag}", "i": {i}, "pad": "{pad}"}}\n'.encode())

    threads = [threading.Thread(target=write, args=(f"t{k}",)) for k in range(4)]
    threads += [threading.Thread(target=write_shared, args=(f"s{k}",)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(p.wait(120) == 0 for p in processes)
    shared.close()
    got = sorted((d["w"], d["i"]) for d in map(json.loads, lines_of(path, max_bytes)))
    tags = [f"p{k}" for k in range(3)] + [f"t{k}" for k in range(4)] + [f"s{k}" for k in range(2)]
    assert got == sorted((tag, i) for tag in tags for i in range(n))
    assert len(files_of(path)) > 50  # it did rotate, many times over


def vector_kwargs(backend: str) -> dict:
    if backend == "ray":
        pytest.importorskip("ray")
        return {"backend": "ray", "vector_options": {"num_actors": 2}}
    if backend == "hosts":  # 4 host processes under this interpreter
        return {"python": sys.executable, "vector_options": {"num_hosts": 4}}
    return {}


@pytest.mark.parametrize("backend", ["concurrent", "hosts", pytest.param("ray", marks=pytest.mark.ray)])
def test_sub_envs_recording_to_one_path_lose_no_episode(tmp_path, backend):
    """16 sub-envs, each episode one wrong submission, 12 rounds: 192 records, rotated by size."""
    path, n, rounds, max_bytes = tmp_path / "episodes.jsonl", 16, 12, 6_000
    record = functools.partial(RecordEpisodes, path=path, max_bytes=max_bytes, backups=10_000)
    envs = gym.make_vec(ARITH, num_envs=n, autoreset_mode=AutoresetMode.SAME_STEP, env_wrappers=[record],
                        **vector_kwargs(backend))
    try:
        envs.reset(seed=0)
        for _ in range(rounds):
            _, rewards, terminations, _, infos = envs.step([WRONG] * n)
            assert terminations.all() and "record_error" not in infos
    finally:
        envs.close()
    records = [EpisodeRecord(**json.loads(line)) for line in lines_of(path, max_bytes)]
    assert len(records) == n * rounds
    assert all(r.terminated and len(r.actions()) == 1 for r in records)
    assert len(files_of(path)) > 10


# -- a full disk --------------------------------------------------------------------------------------


def check_full_disk_run(out: str) -> None:
    run = json.loads(out)
    # Every step's result reached the caller, the failed recording included.
    assert len(run["steps"]) == 2 * run["episodes"]
    assert all(s["obs"] and s["obs"][0]["role"] == "tool" for s in run["steps"])
    assert [s["terminated"] for s in run["steps"]] == [False, True] * run["episodes"]
    assert run["record_errors"] and run["record_errors"][0]["type"] == "OSError"
    assert any("recording to" in w and "failed" in w for w in run["warnings"])
    # Nothing torn was left, every record before the failure reads back, and so does every one after.
    assert run["ends_whole"] and run["records_before_freeing"] == run["episodes"] - 3
    assert len(run["records"]) == run["written"] == run["episodes"] - 1
    assert run["records"][-2:] == [100, 101]
    assert not [w for w in run["warnings"] if "line" in w]  # the reader found nothing damaged


def test_a_file_size_limit_costs_no_step_and_no_earlier_record(tmp_path):
    """RLIMIT_FSIZE in a process of its own: the write past it is cut short, then fails (EFBIG)."""
    proc = subprocess.run([sys.executable, str(FULL_DISK), "rlimit", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_full_disk_run(proc.stdout)


def _mount_namespace() -> list[str] | None:
    """A command prefix that runs a command in a mount namespace of its own, or None."""
    if shutil.which("unshare") is None:
        return None
    for prefix in (["unshare", "-Urm"], ["unshare", "-m"]):  # an unprivileged user namespace, else root
        if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            return prefix
    return None


def test_a_full_tmpfs_costs_no_step_and_no_earlier_record(tmp_path):
    """A real full file system (ENOSPC): a 64 KiB tmpfs, filled up beside the record file."""
    prefix = _mount_namespace()
    if prefix is None:
        pytest.skip("no mount namespace here (unshare); the RLIMIT_FSIZE test covers a full disk")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = 'mount -t tmpfs -o size=64k tmpfs "$1" && exec "$2" "$3" tmpfs "$1"'
    proc = subprocess.run([*prefix, "sh", "-c", script, "sh", str(disk), sys.executable, str(FULL_DISK)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_full_disk_run(proc.stdout)


# -- torn lines ---------------------------------------------------------------------------------------


def records(*task_ids: str) -> list[EpisodeRecord]:
    return [EpisodeRecord(task_id=t) for t in task_ids]


def test_a_line_torn_by_a_dead_writer_costs_only_itself(tmp_path):
    path = tmp_path / "torn.jsonl"
    write_records(path, records("a"))
    with open(path, "ab") as f:
        f.write(encode_record(EpisodeRecord(task_id="torn"))[:-20])  # a writer killed mid-line
    writer = JsonlWriter(path)
    writer.write(encode_record(EpisodeRecord(task_id="b")))  # ends the torn line first
    writer.close()
    with pytest.warns(UserWarning, match="line 2 of .* is not a record"):
        assert [r.task_id for r in read_records(path)] == ["a", "b"]


def test_a_record_appended_to_a_torn_line_is_read(tmp_path):
    """What writers that did not end a torn line left: the next record on the torn line's end."""
    path = tmp_path / "old.jsonl"
    torn = encode_record(EpisodeRecord(task_id="torn", messages=[{"role": "user", "content": "q"}]))[:-30]
    path.write_bytes(encode_record(EpisodeRecord(task_id="a")) + torn + encode_record(EpisodeRecord(task_id="b")))
    with pytest.warns(UserWarning, match="line 2 .* read the record after its torn start"):
        assert [r.task_id for r in read_records(path)] == ["a", "b"]


def test_a_cut_last_line_warns_unless_a_writer_is_appending_it(tmp_path):
    path = tmp_path / "cut.jsonl"
    write_records(path, records("a", "b"))
    with open(path, "ab") as f:
        f.write(encode_record(EpisodeRecord(task_id="c"))[:-10])
    with pytest.warns(UserWarning, match="line 3 .* cut short .* no writer"):
        assert [r.task_id for r in read_records(path)] == ["a", "b"]
    with open(path, "rb") as held, warnings.catch_warnings():
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # what a JsonlWriter holds while it appends
        warnings.simplefilter("error")  # a line still being written is no damage: no warning
        assert [r.task_id for r in read_records(path)] == ["a", "b"]


def test_a_failed_write_leaves_the_file_as_it_was(tmp_path):
    """The writer cuts off whatever part of a line reached the file before the write failed."""
    path = tmp_path / "w.jsonl"
    writer = JsonlWriter(path)
    writer.write(b'{"i": 1}\n')
    limit = path.stat().st_size + 5
    script = f"""
import resource, sys
from openenv_gym.wrappers.record import JsonlWriter
writer = JsonlWriter({str(path)!r})
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    writer.write(b'{{"i": 2, "pad": "xxxxxxxxxx"}}\\n')
except OSError as exc:
    print(exc.errno)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == str(errno.EFBIG), proc.stderr
    assert path.read_bytes() == b'{"i": 1}\n'
    writer.write(b'{"i": 3}\n')
    writer.close()
    assert path.read_bytes() == b'{"i": 1}\n{"i": 3}\n'


def test_a_new_record_file_is_its_users_alone(tmp_path):
    """Records hold the runs' model text and tokens (play's Save writes through the same writer)."""
    path = tmp_path / "records.jsonl"
    writer = JsonlWriter(path)
    try:
        writer.write(b'{"env": "x", "messages": []}\n')
    finally:
        writer.close()
    assert path.stat().st_mode & 0o777 == 0o600
