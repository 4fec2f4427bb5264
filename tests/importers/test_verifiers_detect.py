"""Static detection of Verifiers sources (both generations) and discovery of installed packages.

Nothing here imports the sources: detection reads syntax trees, discovery reads metadata. The
sources are written by the tests; a fake site directory stands in for installed distributions.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest

from openenv_gym.adapters.verifiers.detect import detect_verifiers, discover_installed, resolve_source
from openenv_gym.errors import AmbiguousSource, ConfigurationError, DetectionError, SourceNotFound
from openenv_gym.importers import detect

V0 = """
import verifiers as vf
from datasets import Dataset

def load_environment(**kwargs):
    data = Dataset.from_list([{"question": "1+1?", "answer": "2"}])
    return vf.SingleTurnEnv(dataset=data, rubric=vf.Rubric(funcs=[lambda completion, answer: 1.0]))
"""

V1_INIT = """
from .taskset import ArithTaskset

__all__ = ["ArithTaskset"]
"""
V1_TASKSET = """
import verifiers.v1 as vf

class ArithTask(vf.Task[vf.TaskData]):
    pass

class Base(vf.Taskset[ArithTask, vf.TasksetConfig]):
    pass

class ArithTaskset(Base):
    def load(self):
        return []
"""
EARLY_V1 = """
import verifiers.v1 as vf

def load_taskset(config):
    return None

def load_environment(config):
    return vf.Env(taskset=load_taskset(config))
"""


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_legacy_module_file_and_package(tmp_path):
    write(tmp_path, {"vf_one.py": V0, "vf_pkg/__init__.py": V0})
    one = detect_verifiers(tmp_path / "vf_one.py")
    assert (one.generation, one.module, one.root) == ("v0", "vf_one", str(tmp_path))
    pkg = detect_verifiers(tmp_path / "vf_pkg")
    assert (pkg.generation, pkg.module, pkg.root) == ("v0", "vf_pkg", str(tmp_path))


def test_v1_taskset_package_through_reexport_and_local_base(tmp_path):
    write(tmp_path, {"vf1_arith/__init__.py": V1_INIT, "vf1_arith/taskset.py": V1_TASKSET})
    found = detect_verifiers(tmp_path / "vf1_arith")
    assert (found.generation, found.module, found.entry) == ("v1", "vf1_arith", "ArithTaskset")


def test_a_v1_package_must_export_its_taskset(tmp_path):
    write(tmp_path, {"vf1_x/__init__.py": "from .taskset import ArithTaskset\n", "vf1_x/taskset.py": V1_TASKSET})
    with pytest.raises(DetectionError, match="__all__"):
        detect_verifiers(tmp_path / "vf1_x")


def test_early_v1_is_refused_with_a_reason(tmp_path):
    write(tmp_path, {"old.py": EARLY_V1})
    with pytest.raises(DetectionError, match="early verifiers.v1"):
        detect_verifiers(tmp_path / "old.py")


def test_project_folder_and_kind_detection(tmp_path):
    write(tmp_path, {"my_env/pyproject.toml": "[project]\nname='my-env'\n", "my_env/my_env.py": V0})
    found = detect(tmp_path / "my_env")
    assert (found.kind, found.sdk, found.env_name) == ("verifiers", "v0", "my_env")


def test_not_an_environment(tmp_path):
    write(tmp_path, {"plain.py": "import verifiers\nx = 1\n"})
    with pytest.raises(DetectionError, match="load_environment"):
        detect_verifiers(tmp_path / "plain.py")


def _where(source: Path) -> tuple[Path, str, str, bool]:
    found = resolve_source(source)
    return found.root, found.module, found.file.name, found.package


def test_resolve_source_accepts_every_layout_any_caller_took(tmp_path):
    """One resolver for the importer and both adapters: the union of the layouts each accepted."""
    root = tmp_path.resolve()
    write(tmp_path, {
        "flat.py": "",                                   # a module file (all three)
        "pkg/__init__.py": "",                           # a package folder (all three)
        "my-env/my_env.py": V0,                          # upstream project layout (v0, v1, importer)
        "my-proj/my_proj/__init__.py": "",               # `prime env init` layout (v1)
        "single/environment.py": V0,                     # one module under another name (v0)
        "single/tests/test_it.py": "",
        "several/helpers.py": "x = 1\n",                 # several modules, one environment (importer)
        "several/the_env.py": V0,
        "several/_private.py": V0,
    })
    assert _where(tmp_path / "flat.py") == (root, "flat", "flat.py", False)
    assert _where(tmp_path / "pkg") == (root, "pkg", "__init__.py", True)
    assert _where(tmp_path / "pkg" / "__init__.py") == (root, "pkg", "__init__.py", True)
    assert _where(tmp_path / "my-env") == (root / "my-env", "my_env", "my_env.py", False)
    assert _where(tmp_path / "my-proj") == (root / "my-proj", "my_proj", "__init__.py", True)
    assert _where(tmp_path / "single") == (root / "single", "environment", "environment.py", False)
    assert _where(tmp_path / "several") == (root / "several", "the_env", "the_env.py", False)
    assert detect_verifiers(tmp_path / "several").module == "the_env"


def test_resolve_source_errors_say_what_was_looked_for(tmp_path):
    write(tmp_path, {"two/a.py": V0, "two/b.py": V0, "none/a.py": "x = 1\n", "none/b.py": "y = 2\n",
                     "notes.txt": "", "bad-name/__init__.py": ""})
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceNotFound, match="does not exist"):
        resolve_source(tmp_path / "missing")
    with pytest.raises(AmbiguousSource, match=r"several Verifiers environments \(a, b\)"):
        resolve_source(tmp_path / "two")
    with pytest.raises(DetectionError, match=r"cannot tell the taskset module .*found a, b"):
        resolve_source(tmp_path / "none", noun="taskset")
    with pytest.raises(DetectionError, match="cannot tell the environment module"):
        resolve_source(tmp_path / "empty")
    with pytest.raises(DetectionError, match="not a .py file"):
        resolve_source(tmp_path / "notes.txt")
    with pytest.raises(ConfigurationError, match="not importable"):
        resolve_source(tmp_path / "bad-name")


def test_a_package_reexporting_its_environment_is_still_detected(tmp_path):
    """Detection looks one level down when a folder's own module is no environment."""
    write(tmp_path, {"vf_pkg/__init__.py": "from .env import load_environment\n", "vf_pkg/env.py": V0})
    assert detect_verifiers(tmp_path / "vf_pkg").generation == "v0"


def _install(site: Path, name: str, module: str, source: str, requires: str | None) -> None:
    """A minimal installed distribution: module file + dist-info with METADATA and RECORD."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n"
    if requires:
        meta += f"Requires-Dist: {requires}\n"
    (info / "METADATA").write_text(meta)
    (info / "RECORD").write_text(f"{module}.py,,\n{info.name}/METADATA,,\n")


def test_discovery_finds_packages_that_depend_on_verifiers_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENENV_GYM_CACHE", str(tmp_path / "cache"))
    site = tmp_path / "site"
    site.mkdir()
    _install(site, "vf-arith", "vf_arith", V0, "verifiers>=0.3")
    _install(site, "unrelated", "unrelated", "x = 1\n", "requests")
    _install(site, "optional-vf", "optional_vf", V0, 'verifiers; extra == "vf"')
    found = discover_installed([str(site)])
    assert [(e["name"], e["module"], e["generation"]) for e in found] == [("vf-arith", "vf_arith", "v0")]

    import openenv_gym.adapters.verifiers.detect as mod

    def no_scan(paths):
        raise AssertionError("the cache should have answered")

    monkeypatch.setattr(mod, "_scan", no_scan)
    assert discover_installed([str(site)]) == found  # same installed set: from the cache
    monkeypatch.undo()
    monkeypatch.setenv("OPENENV_GYM_CACHE", str(tmp_path / "cache"))

    # installing another environment changes the set: the cache is invalidated
    write(site, {"vf1_calc/__init__.py": V1_INIT, "vf1_calc/taskset.py": V1_TASKSET})
    info = site / "vf1_calc-0.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vf1-calc\nVersion: 0.2.0\nRequires-Dist: verifiers>=0.4\n")
    (info / "top_level.txt").write_text("vf1_calc\n")
    names = [(e["name"], e["generation"]) for e in discover_installed([str(site)])]
    assert names == [("vf-arith", "v0"), ("vf1-calc", "v1")]


def test_discovered_packages_are_registered_on_import(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENENV_GYM_CACHE", str(tmp_path / "cache"))
    site = tmp_path / "site"
    site.mkdir()
    _install(site, "vf-arith", "vf_arith", V0, "verifiers")
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    from openenv_gym.registration import register_discovered

    ids = register_discovered()
    assert "openenv/vf-arith-v0" in ids
    spec = gym.registry["openenv/vf-arith-v0"]
    assert spec.kwargs == {"adapter": "openenv_gym.adapters.verifiers.adapter:adapter_spec", "env_id": "vf_arith",
                           "generation": "v0"}
    assert spec.entry_point == "openenv_gym.registration:make_env"
    assert spec.vector_entry_point == "openenv_gym.registration:make_vec"
    del gym.registry["openenv/vf-arith-v0"]


ENVS_MODULE = """
import verifiers.v1 as vf
from verifiers.v1 import AgentConfig, EnvConfig

class ArithTask(vf.Task[vf.TaskData]):
    pass

class ArithTaskset(vf.Taskset[ArithTask, vf.TasksetConfig]):
    def load(self):
        return []

class Scripted(vf.SingleAgentEnv):
    async def run(self, task, agents):
        await agents.agent.run(task)

class OneSeat(EnvConfig):
    solver: AgentConfig = AgentConfig()
    attempts: int = 1

class TwoSeats(OneSeat):
    judge: vf.AgentConfig = vf.AgentConfig()

class Solo(vf.Env[OneSeat]):
    async def run(self, task, agents):
        await agents.solver.run(task)

class Judged(vf.Env[TwoSeats]):
    async def run(self, task, agents):
        await agents.solver.run(task)

class JudgedAgain(Judged):
    pass
"""


@pytest.mark.parametrize(("exported", "seats"), [
    ("Scripted", None), ("Solo", None), ("Judged", "solver, judge"), ("JudgedAgain", "solver, judge")])
def test_a_multi_agent_env_is_detected_with_its_seats(tmp_path, exported, seats):
    """A taskset package's exported Env: its seats are its config's AgentConfig fields, read from
    the syntax tree (inherited ones included); more than one makes it a game (openenv_gym.multiagent)."""
    pkg = write(tmp_path / "vf1_seats", {
        "__init__.py": f"from .envs import ArithTaskset, {exported}\n\n__all__ = ['ArithTaskset', '{exported}']\n",
        "envs.py": ENVS_MODULE})
    found = detect_verifiers(pkg)
    assert (found.generation, found.entry, found.env) == ("v1", "ArithTaskset", exported)
    assert found.seats == ([] if seats is None else seats.split(", "))
