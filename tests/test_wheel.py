"""The built wheel, installed (not editable) into a fresh venv, runs the README's main job.

An editable install reads the package from the checkout; a wheel holds only what its package data
says. This builds the wheel, installs it with the ``ors`` extra into a new venv, and runs the main
job from a directory outside the checkout, so nothing but the installed wheel can be imported.
Marked ``venv`` (it builds one; CI runs it in its own step with ``pytest -m venv``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.venv, pytest.mark.timeout(900)]


def test_the_installed_wheel_runs_the_main_job(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                    str(ROOT)], check=True, timeout=600)
    (wheel,) = dist.glob("openenv_gym-*.whl")
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"{wheel}[ors]"], check=True, timeout=600)
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(python), "-c", "import openenv_gym; print(openenv_gym.__file__)"], cwd=work,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert str(env) in where and str(ROOT) not in where, "the wheel, not the checkout, must be imported"
    out = subprocess.run([str(env / "bin" / "openenv-gym"), "rollout", "openenv/Arithmetic-v0", "--episodes", "40",
                          "--num-envs", "8", "--out", "rollout.jsonl"], cwd=work, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in (work / "rollout.jsonl").read_text().splitlines()]
    assert len(records) >= 40 and all(r["task_id"] for r in records)
    # What the wheel must carry beyond .py modules: the bundled example envs, the server launcher
    # run by path, the web pages' static files.
    listing = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel)], capture_output=True, text=True).stdout
    for member in ("openenv_gym/examples/arithmetic.py", "openenv_gym/examples/kuhn_poker_v1/taskset.py",
                   "openenv_gym/adapters/local_servers/serve.py",
                   "openenv_gym/web/static/", "openenv_gym/py.typed"):
        assert member in listing, member
