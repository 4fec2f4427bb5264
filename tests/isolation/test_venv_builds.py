"""Isolated envs in venvs uv really builds (marked ``venv``: minutes on a fresh machine; own CI step).

    pytest -m venv tests/isolation

The venvs go to a data dir of this module (uv's download cache is shared, so a second build of
the same packages is seconds).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import openenv_gym
from openenv_gym.cli import main
from openenv_gym.importers.catalog import load_catalog
from openenv_gym.isolation import venvs
from openenv_gym.registration import register_catalog
from openenv_gym.testing import procs

sys.path.insert(0, str(Path(__file__).parent))
from isolation_envs import one_tool_env  # noqa: E402

pytestmark = [pytest.mark.venv, pytest.mark.timeout(900)]

ENVS = Path(__file__).resolve().parents[1] / "envs"
ARITH, VF = "openenv/Arithmetic-v0", "openenv/Verifiers-v0"

CONFLICTING_ENV = one_tool_env(
    "Versions", "versions", "f\"sse-starlette {version('sse-starlette')}\"", imports="from importlib.metadata import version",
    doc="An ors-sdk env that needs sse-starlette 3, which this package's own venv cannot hold (openreward pins 2.3.6).")


def call(name: str, args: dict | None = None) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": name, "arguments": json.dumps(args or {})}}]}


def say(text: str) -> dict:
    return {"role": "assistant", "content": text}


@pytest.fixture(scope="module", autouse=True)
def data_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("data")
    mp.setenv("OPENENV_GYM_DATA", str(path))
    yield path
    mp.undo()


def installed(python: str, distribution: str) -> str:
    return subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def answer(question: str) -> str:
    """The value of the arithmetic in a question ("Compute 3 + 4 * 2. ...", "What is 2 + 3?")."""
    expression = re.search(r"[\d(][\d+\-*() ]*[\d)]|\d", question)[0]
    return str(eval(expression, {"__builtins__": {}}))  # digits, spaces, parentheses and + - * only


def test_one_mixture_plays_arithmetic_a_legacy_env_and_a_v1_taskset_each_under_its_own_verifiers(tmp_path):
    """Arithmetic and a legacy env in this process (verifiers 0.3.1); a v1 taskset isolated under 0.4.0."""
    v1 = tmp_path / "vf1_arith"
    shutil.copytree(ENVS / "verifiers_v1" / "vf1_arith", v1)
    (v1 / "requirements.txt").write_text("verifiers==0.4.0\n")
    assert installed(sys.executable, "verifiers") == "0.3.1"
    legacy, tasks = "openenv/VfLegacy-v0", "openenv/VfTasks-v0"
    gym.register(legacy, entry_point="openenv_gym.registration:make_env",
                 vector_entry_point="openenv_gym.registration:make_vec",
                 kwargs={"adapter": "openenv_gym.adapters.verifiers.adapter:adapter_spec",
                         "source": str(ENVS / "verifiers_v0" / "vf_arith.py")})
    gym.register(tasks, entry_point="openenv_gym.registration:make_env",
                 vector_entry_point="openenv_gym.registration:make_vec",
                 kwargs={"adapter": "openenv_gym.adapters.verifiers.adapter:adapter_spec", "source": str(v1), "isolate": True})
    before = set(procs.descendants())
    mix = openenv_gym.make_mixture({ARITH: 2, legacy: 2, tasks: 2})
    try:
        hosts = mix.parts[tasks].pids
        assert all(installed(procs.cmdline(p).split()[0], "verifiers") == "0.4.0" for p in hosts)
        obs, infos = mix.reset(seed=0)
        assert infos["env"].tolist() == [ARITH] * 2 + [legacy] * 2 + [tasks] * 2
        actions = [call("submit", {"answer": answer(obs[i][-1]["content"])}) for i in range(2)]
        actions += [say(answer(obs[i][-1]["content"])) for i in range(2, 6)]
        actions[3] = say("wrong")
        actions[5] = say("wrong")
        _, rewards, terminated, truncated, infos = mix.step(actions)
        assert not truncated.any() and "error" not in infos and terminated.all()
        np.testing.assert_allclose(rewards[:2], [1.0, 1.0])
        # the legacy rubric: exact match (weight 1) plus a length penalty of 0.01 per char (weight 0.5)
        right = answer(obs[2][-1]["content"])
        np.testing.assert_allclose(rewards[2:4], [1.0 - 0.005 * len(right), -0.005 * len("wrong")])
        np.testing.assert_allclose(rewards[4:], [1.0, 0.0])  # the v1 taskset's exact_match, under 0.4.0
    finally:
        mix.close()
    assert procs.wait_dead(set(procs.descendants()) - before, timeout=20) == []


def test_a_source_whose_requirements_conflict_with_this_venv_runs_isolated(tmp_path):
    src = tmp_path / "versions"
    src.mkdir()
    (src / "env.py").write_text(CONFLICTING_ENV)
    (src / "requirements.txt").write_text("sse-starlette>=3\n")
    assert installed(sys.executable, "sse-starlette").startswith("2.")
    assert main(["import", str(src), "--name", "Versions", "--isolated"]) == 0
    entry = load_catalog()["Versions"]
    assert Path(entry.isolated.venv, ".complete").is_file() and "sse-starlette>=3" in entry.isolated.requirements
    register_catalog()
    env = gym.make("openenv/Versions-v0")  # the catalog registered isolate=True: the built venv
    try:
        env.reset(seed=0)
        obs, reward, terminated, *_ = env.step(call("versions"))
        assert obs[0]["content"].startswith("sse-starlette 3.") and reward == 1.0 and terminated
        assert procs.cmdline(env.unwrapped.runner.pid).split()[0] == str(venvs.venv_python(Path(entry.isolated.venv)))
    finally:
        env.close()
    # vectorised, through host processes under the same venv
    envs = gym.make_vec("openenv/Versions-v0", num_envs=3)
    try:
        envs.reset(seed=0)
        obs, rewards, *_ = envs.step([call("versions")] * 3)
        assert all(o[0]["content"].startswith("sse-starlette 3.") for o in obs) and rewards.tolist() == [1.0] * 3
    finally:
        envs.close()


def test_venvs_are_cached_by_their_requirements_and_a_half_built_one_is_rebuilt(tmp_path):
    src = tmp_path / "env"
    src.mkdir()
    (src / "env.py").write_text(CONFLICTING_ENV)
    (src / "requirements.txt").write_text("sse-starlette>=3\n")
    first = venvs.python_for("ors", src)
    assert venvs.python_for("ors", src) == first  # cached: same requirements, same venv
    (src / "requirements.txt").write_text("sse-starlette>=3\ntabulate\n")
    second = venvs.python_for("ors", src)
    assert second != first and installed(second, "tabulate")
    venv = Path(second).parents[1]
    (venv / ".complete").unlink()  # as if the build had crashed before the end
    (venv / "bin" / "python").unlink()
    assert venvs.python_for("ors", src) == second and Path(second).exists()
    # a requirement that cannot resolve is a clear error with uv's own words, and leaves no venv
    built = {p.name for p in venv.parent.iterdir() if p.is_dir()}
    (src / "requirements.txt").write_text("sse-starlette>=3,<2\n")
    with pytest.raises(openenv_gym.errors.ConfigurationError, match="(?s)building the venv failed.*sse-starlette"):
        venvs.python_for("ors", src)
    assert {p.name for p in venv.parent.iterdir() if p.is_dir()} == built


FIGLET_TASKSET = '''
import pyfiglet  # a dependency the project declares, which this package's own venv does not have

import verifiers.v1 as vf


class BannerData(vf.TaskData):
    answer: str


class BannerTask(vf.Task[BannerData]):
    @vf.reward(weight=1.0)
    async def exact_match(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)


class BannerTaskset(vf.Taskset[BannerTask, vf.TasksetConfig]):
    def load(self):
        art = pyfiglet.figlet_format("hi")
        yield BannerTask(BannerData(name="banner-0", prompt=f"Which word is this?\\n{art}", answer="hi"),
                         self.config.task)


__all__ = ["BannerTaskset"]
'''


def test_an_isolated_packaged_project_gets_its_own_dependencies_and_itself(tmp_path):
    """The Verifiers packaging (pyproject.toml at the root, the module in a package folder): the
    project's dependencies and the project itself are installed in the isolated venv."""
    project = tmp_path / "vf1-figlet"
    (project / "vf1_figlet").mkdir(parents=True)
    (project / "vf1_figlet" / "__init__.py").write_text(FIGLET_TASKSET)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "vf1-figlet"\nversion = "0.1.0"\ndependencies = ["verifiers>=0.3.1", "pyfiglet"]\n'
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["vf1_figlet"]\n')
    with pytest.raises(ModuleNotFoundError):
        __import__("pyfiglet")  # not in this venv: only the isolated one can play it
    assert main(["import", str(project), "--name", "Figlet", "--isolated"]) == 0
    entry = load_catalog()["Figlet"]
    assert "pyfiglet" in entry.isolated.requirements
    # the project itself, from its snapshot (editable: the package runs from there)
    assert [r for r in entry.isolated.requirements if r.startswith("-e ") and Path(r[3:], "vf1_figlet").is_dir()]
    python = str(venvs.venv_python(Path(entry.isolated.venv)))
    assert installed(python, "pyfiglet") and installed(python, "vf1-figlet") == "0.1.0"
    register_catalog()
    env = gym.make("openenv/Figlet-v0")
    try:
        obs, _ = env.reset(options={"index": 0})
        assert obs[-1]["content"].startswith("Which word is this?\n") and "|" in obs[-1]["content"]
        _, reward, terminated, *_ = env.step("hi")
        assert (reward, terminated) == (1.0, True)
    finally:
        env.close()


def test_a_venv_builds_under_the_tested_set_and_the_envs_own_pin_wins(tmp_path, monkeypatch):
    """uv gets the constraints in force (here a file of the user's, OPENENV_GYM_CONSTRAINTS): a bare
    requirement takes the capped version, a requirement that gives its own version keeps it."""
    pins = tmp_path / "pins.txt"
    pins.write_text("six<=1.16.0\ntabulate<=0.8.10\n")
    monkeypatch.setenv("OPENENV_GYM_CONSTRAINTS", str(pins))
    capped = str(venvs.venv_python(venvs.ensure_venv(["six", "tabulate==0.9.0"])))
    assert installed(capped, "six") == "1.16.0" and installed(capped, "tabulate") == "0.9.0"
    monkeypatch.setenv("OPENENV_GYM_CONSTRAINTS", "none")
    free = str(venvs.venv_python(venvs.ensure_venv(["six", "tabulate==0.9.0"])))
    assert free != capped and installed(free, "six") != "1.16.0"  # other constraints, another venv
    monkeypatch.setenv("OPENENV_GYM_CONSTRAINTS", str(pins))
    pins.write_text("six<=0.0.1\n")  # a cap no release of six meets
    with pytest.raises(openenv_gym.errors.ConfigurationError, match="under the tested versions .*OPENENV_GYM_CONSTRAINTS=none"):
        venvs.ensure_venv(["six"])  # the cap leaves a bare requirement nothing: the error says how out
