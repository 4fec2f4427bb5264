"""Discovery of environment packages installed editable (``pip install -e``), as authors install theirs.

An editable install's metadata does not list its modules: setuptools leaves an import hook that
maps module names to the project's folders, hatchling a ``.pth`` file naming the project folder.
The packages are built here by uv (as pip would) from projects written in the test (setuptools and hatchling
build backends), into a prefix of their own; a child process adds that prefix as a site folder
(its ``.pth`` files run, as in a real venv), lists the ids and plays one step of each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
from uv import find_uv_bin

from openenv_gym.adapters.verifiers.detect import discover_installed
from openenv_gym.importers.discovery import module_locations, top_modules

pytestmark = pytest.mark.timeout(600)  # uv builds the projects (build isolation fetches the backends)

ARITH = Path(__file__).resolve().parents[1] / "envs" / "verifiers_v1" / "vf1_arith" / "__init__.py"

BACKENDS = {
    "setuptools": '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
                  '[tool.setuptools]\npackages = ["{module}"]\n',
    "hatchling": '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
                 '[tool.hatch.build.targets.wheel]\npackages = ["{module}"]\n',
}


def project(root: Path, name: str, backend: str) -> Path:
    """A v1 taskset project (the upstream layout: pyproject.toml beside the package folder)."""
    module = name.replace("-", "_")
    folder = root / name
    (folder / module).mkdir(parents=True)
    shutil.copy(ARITH, folder / module / "__init__.py")
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "0.1.0"\ndependencies = ["verifiers"]\n'
        + BACKENDS[backend].format(module=module))
    return folder


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vf1-edit-st (setuptools) and vf1-edit-hat (hatchling) installed editable, vf1-copy-hat
    (hatchling) installed as a wheel; the site folder they are in."""
    root = tmp_path_factory.mktemp("projects")
    prefix = root / "prefix"
    editable = [project(root, "vf1-edit-st", "setuptools"), project(root, "vf1-edit-hat", "hatchling")]
    regular = project(root, "vf1-copy-hat", "hatchling")
    # uv builds as pip does (each project's own backend, in an isolated build env) and fetches the
    # backends once per test session (its cache), where pip fetched them for every project
    args = [find_uv_bin(), "pip", "install", "--quiet", "--no-deps", "--python", sys.executable, "--prefix", str(prefix)]
    for line in (args + [a for p in editable for a in ("-e", str(p))], args + [str(regular)]):
        done = subprocess.run(line, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    return site_packages(prefix)


def test_editable_installs_of_both_backends_are_found(installed: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENENV_GYM_CACHE", str(tmp_path / "cache"))
    dists = {d.metadata["Name"]: d for d in metadata.distributions(path=[str(installed)])}
    # What makes them hard: the editable RECORDs list no module at all, and hatchling writes no
    # top_level.txt (setuptools writes one, but its module is not in the site folder).
    for name in ("vf1-edit-st", "vf1-edit-hat"):
        direct = json.loads(dists[name].read_text("direct_url.json"))
        assert direct["dir_info"]["editable"] is True
        assert not any(f.name == "__init__.py" for f in dists[name].files)
    assert dists["vf1-edit-hat"].read_text("top_level.txt") is None
    for name, dist in dists.items():
        module = name.replace("-", "_")
        assert top_modules(dist) == [module]
        where = module_locations(dist, [str(installed)])[module]
        assert (where / "__init__.py").is_file()
        # editable: the project's own folder; a wheel: the copy in the site folder
        assert where.parent.name == (name if "edit" in name else "site-packages")
    found = discover_installed([str(installed)])
    assert [(e["name"], e["module"], e["generation"]) for e in found] == [
        ("vf1-copy-hat", "vf1_copy_hat", "v1"), ("vf1-edit-hat", "vf1_edit_hat", "v1"),
        ("vf1-edit-st", "vf1_edit_st", "v1")]


@pytest.mark.needs("verifiers")
def test_editable_installs_are_listed_and_play(installed: Path, tmp_path: Path) -> None:
    """In a process whose site folders hold the installs: ``openenv-gym list`` shows them, and
    ``gym.make`` of the listed id imports the module through the install's own hook and plays."""
    script = textwrap.dedent(f"""
        import site, sys
        site.addsitedir({str(installed)!r})  # runs the .pth files, as at a venv's start
        import gymnasium as gym
        from openenv_gym.cli import main

        main(["list"])
        for name in ("vf1-edit-st", "vf1-edit-hat"):
            env = gym.make(f"openenv/{{name}}-v0")
            try:
                obs, info = env.reset(options={{"index": 0}})
                print(name, obs[-1]["content"], env.step("5")[1:3])
            finally:
                env.close()
    """)
    env = {**os.environ, "OPENENV_GYM_CACHE": str(tmp_path / "cache"), "OPENENV_GYM_DATA": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    listed = {line.split()[0] for line in lines if line.startswith("openenv/")}
    assert {"openenv/vf1-edit-st-v0", "openenv/vf1-edit-hat-v0", "openenv/vf1-copy-hat-v0"} <= listed
    assert "vf1-edit-st What is 2 + 3? (1.0, True)" in lines
    assert "vf1-edit-hat What is 2 + 3? (1.0, True)" in lines
