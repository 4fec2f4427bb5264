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
