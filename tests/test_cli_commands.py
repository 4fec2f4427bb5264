"""What the ``openenv-gym`` commands tell a user: the version, an id's origin, what a rollout wrote.

Mistakes are one line on stderr and exit status 2, never a traceback; what a command says it did
is what it did.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from openenv_gym import __version__
from openenv_gym.cli import main

ENVS = Path(__file__).resolve().parent / "envs"
ARITH = "openenv/Arithmetic-v0"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "openenv_gym.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("openenv-gym: error: "), err
    return lines[0]


def test_version():
    done = cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"openenv-gym {__version__}"


def test_rollout_into_a_missing_folder_is_one_line_and_starts_nothing(tmp_path, capsys):
    from openenv_gym.testing import procs

    before = set(procs.descendants())
    assert main(["rollout", ARITH, "--episodes", "2", "--quiet", "--out", str(tmp_path / "no" / "e.jsonl")]) == 2
    out, err = capsys.readouterr()
    assert "does not exist" in one_line_error(err) and out == ""
    assert set(procs.descendants()) - before == set()


def test_rollout_never_truncates_a_file_unasked(tmp_path, capsys):
    out = tmp_path / "e.jsonl"
    out.write_text('{"earlier": "run"}\n')
    assert main(["rollout", ARITH, "--episodes", "2", "--num-envs", "2", "--quiet", "--out", str(out)]) == 2
    assert "--append" in one_line_error(capsys.readouterr().err)
    assert out.read_text() == '{"earlier": "run"}\n'
    assert main(["rollout", ARITH, "--episodes", "2", "--num-envs", "2", "--quiet", "--out", str(out), "--append"]) == 0
    assert f"2 episodes appended to {out}" in capsys.readouterr().out
    assert out.read_text().startswith('{"earlier": "run"}\n') and len(out.read_text().splitlines()) == 3
    assert main(["rollout", ARITH, "--episodes", "1", "--num-envs", "1", "--quiet", "--out", str(out), "--overwrite"]) == 0
    assert f"1 episodes written to {out}" in capsys.readouterr().out and len(out.read_text().splitlines()) == 1
    assert main(["rollout", ARITH, "--episodes", "1", "--quiet", "--append"]) == 2
    assert "add --out" in one_line_error(capsys.readouterr().err)


def test_drop_equal_says_when_nothing_was_written(tmp_path):
    from openenv_gym.testing.openai_stub import OpenAIStub

    out = tmp_path / "d.jsonl"
    with OpenAIStub() as stub:  # the stub solves every task: every group's rewards are equal
        done = cli("rollout", ARITH, "--episodes", "4", "--num-envs", "4", "--group-size", "2", "--drop-equal",
                   "--policy", "openai", "--base-url", stub.url, "--model", "stub", "--quiet", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert not any(line.startswith("episodes written") for line in done.stdout.splitlines())
    assert f"no episodes written to {out}: every group's rewards were equal" in done.stdout
    assert out.read_text() == ""
    assert main(["rollout", ARITH, "--episodes", "2", "--drop-equal", "--quiet"]) == 2


def test_info_shows_where_an_install_came_from_and_what_its_snapshot_left_out(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "init.defaultBranch=main"]
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ENVS / "ors_probe.py", src / "env.py")
    shutil.copy(ENVS / "probe_common.py", src)
    (src / ".env").write_text("OPENAI_API_KEY=sk-0123\n")
    (src / "token.txt").write_text("sk-0123\n")
    for args in (["init", "--quiet"], ["add", "-A"], ["commit", "--quiet", "-m", "v1"]):
        subprocess.run([*git, *args], cwd=src, check=True, capture_output=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, check=True, capture_output=True,
                            text=True).stdout.strip()
    env = {"OPENENV_GYM_DATA": str(tmp_path / "data"), "OPENENV_GYM_CATALOG": str(tmp_path / "catalog.json")}
    done = cli("install", str(src), "--name", "Probe", "--env-class", "Probe", "--yes", "--no-build", env=env)
    assert done.returncode == 0, done.stderr
    done = cli("info", "openenv/Probe-v0", env=env)
    assert done.returncode == 0, done.stderr
    imported = json.loads(done.stdout)["imported"]
    assert imported["origin"] == str(src) and imported["commit"] == commit
    assert Path(imported["snapshot"]).is_relative_to(tmp_path / "data")
    assert {".env (may hold a secret)", "token.txt (may hold a secret)"} <= set(imported["left_out_of_snapshot"])
    assert any(r.startswith("ors-sdk") for r in imported["requirements"])
    assert "sk-0123" not in done.stdout
    # an id that was not imported has nothing to add
    assert "imported" not in json.loads(cli("info", ARITH, env=env).stdout)


@pytest.mark.parametrize("argv", [["import", str(ENVS / "ors_probe.py"), "--name", "X", "--include", ".env"]])
def test_include_without_isolated_is_refused(argv, capsys):
    assert main(argv) == 2
    assert "--isolated" in one_line_error(capsys.readouterr().err)


# -- first contact: counts, pipes, paths, kwargs ------------------------------------------------------------
@pytest.mark.parametrize("argv, says", [
    (["rollout", ARITH, "--num-envs", "0"], "num_envs must be between 1 and 1,048,576, not 0"),
    (["rollout", ARITH, "--num-envs", "-1"], "num_envs must be between 1 and 1,048,576, not -1"),
    (["rollout", ARITH, "--episodes", "0"], "episodes must be a positive integer, not 0"),
    (["rollout", ARITH, "--episodes", "-5"], "episodes must be a positive integer, not -5"),
    (["bench", ARITH, "--num-envs", "0", "--backend", "sync"], "num_envs must be between 1 and 1,048,576, not 0"),
])
def test_counts_below_one_are_refused_with_make_vecs_message(argv, says, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert one_line_error(capsys.readouterr().err).endswith(says)
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started


def test_collect_refuses_the_same_counts():
    from openenv_gym.errors import ConfigurationError
    from openenv_gym.rollout import collect

    with pytest.raises(ConfigurationError, match="num_envs must be between 1 and 1,048,576, not 0"):
        collect(ARITH, 4, num_envs=0)
    with pytest.raises(ConfigurationError, match="episodes must be a positive integer"):
        collect(ARITH, 0)


def test_a_closed_pipe_ends_a_command_quietly():
    for argv in (["list"], ["rollout", ARITH, "--episodes", "40", "--num-envs", "2", "--quiet"]):
        done = subprocess.run(f"{sys.executable} -m openenv_gym.cli {' '.join(argv)} | head -c 1; "
                              "exit ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", capture_output=True,
                              text=True, timeout=300)
        assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
        assert done.returncode in (0, 141), (argv, done.returncode, done.stderr)


def test_directories_and_missing_folders_are_named_at_once(tmp_path, capsys):
    episodes = tmp_path / "e.jsonl"
    episodes.write_text(json.dumps({"env": ARITH, "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["view", str(episodes), "--html", str(tmp_path / "missing" / "x.html")]) == 2
    assert one_line_error(capsys.readouterr().err).endswith(f"its folder {tmp_path / 'missing'} does not exist")
    for flags in ([], ["--overwrite"], ["--append"]):
        assert main(["rollout", ARITH, "--episodes", "1", "--out", str(tmp_path), *flags]) == 2
        assert "it is a directory" in one_line_error(capsys.readouterr().err)


def test_view_needs_an_episode_and_counts_in_the_singular(tmp_path, capsys):
    notes = tmp_path / "notes.md"
    notes.write_text("# not records\n")
    other = tmp_path / "other.jsonl"
    other.write_text('{"a": 1}\n')
    for path in (notes, other):
        assert main(["view", str(path), "--html", str(tmp_path / "page.html")]) == 2
        err = one_line_error(capsys.readouterr().err)
        assert "no episode records" in err and "line 1 is not an episode record" in err
    assert not (tmp_path / "page.html").exists()
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"env": ARITH, "messages": [{"role": "user", "content": "hi"}]}) + "\n" + '{"a": 1}\n')
    assert main(["view", str(one), "--html", str(tmp_path / "page.html")]) == 0
    out = capsys.readouterr().out
    assert "wrote 1 episode to" in out and "has none of a record's fields" in out
    assert (tmp_path / "page.html").stat().st_mode & 0o777 == 0o600  # it holds the runs' model text
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_link_at_the_old_temp_name_is_left_alone(tmp_path, capsys):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"env": ARITH, "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "page.html.tmp").symlink_to(victim)
    assert main(["view", str(one), "--html", str(tmp_path / "page.html")]) == 0
    assert victim.read_text() == "keep me"


def test_rollout_takes_env_kwargs_as_play_and_serve_do(tmp_path, capsys):
    out = tmp_path / "e.jsonl"
    assert main(["rollout", ARITH, "max_turns=1", "--episodes", "2", "--num-envs", "2", "--quiet", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all(len(r["rewards"]) == 1 for r in records)  # one turn each: the kwarg arrived
    assert main(["rollout", ARITH, "nokey", "--episodes", "1"]) == 2
    assert "KEY=VALUE" in one_line_error(capsys.readouterr().err)


def test_bench_skips_ray_rows_without_ray(monkeypatch):
    import importlib.util

    from openenv_gym import bench

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    rows = bench.bench(ARITH, [1], ["ray", "sync"], rounds=2)
    assert rows[0].skipped and "pip install -e '.[ray]'" in rows[0].skipped and not rows[0].error
    assert rows[1].steps_per_sec > 0
    assert "skipped: ray is not installed" in bench.table(rows)


def test_view_of_a_file_whose_name_is_not_utf8_prints_it_escaped(tmp_path):
    name = os.fsdecode(b"runs-\xff.jsonl")
    (tmp_path / name).write_text(json.dumps({"env": ARITH, "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    done = subprocess.run([sys.executable, "-m", "openenv_gym.cli", "view", name, "--html", "page.html"], cwd=tmp_path,
                          capture_output=True, timeout=300, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    assert b"wrote 1 episode to page.html" in done.stdout
    assert "runs-\\\\udcff.jsonl" in (tmp_path / "page.html").read_text()  # named, escaped (then JSON-escaped)


def test_view_html_is_bounded_by_a_named_limit(tmp_path, capsys, monkeypatch):
    from openenv_gym.web import view

    monkeypatch.setattr(view, "MAX_HTML_BYTES", 2000)
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"env": ARITH, "messages": [{"role": "user", "content": "x" * 5000}]}) + "\n")
    assert main(["view", str(big), "--html", str(tmp_path / "page.html")]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert "over MAX_HTML_BYTES=2,000" in err and "serve it instead" in err
    assert not (tmp_path / "page.html").exists()


def test_play_refuses_opponents_without_a_seat_before_starting_anything(capsys):
    """--opponent-url and --opponent-model play a game's other seats: without --seat (or one
    without the other) the command says so, and no env or page starts."""
    assert main(["play", "openenv/KuhnPoker-v0", "--opponent-url", "http://127.0.0.1:9/v1",
                 "--opponent-model", "m"]) == 2
    assert "give --seat" in one_line_error(capsys.readouterr().err)
    assert main(["play", "openenv/KuhnPoker-v0", "--seat", "player1", "--opponent-url", "http://127.0.0.1:9/v1"]) == 2
    assert "go together" in one_line_error(capsys.readouterr().err)
