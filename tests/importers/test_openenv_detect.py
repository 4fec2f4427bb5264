"""Detection of OpenEnv environment folders and discovery of installed OpenEnv environment packages.

Everything here reads files and metadata only: the packages used as "installed" ones raise on
import, so a test that imported one would fail.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401
from openenv_gym import cli
from openenv_gym.adapters.openenv.detect import (
    discover_installed,
    looks_like_openenv,
    read_manifest,
    resolve_source,
)
from openenv_gym.adapters.ors.detect import looks_like_ors
from openenv_gym.errors import DetectionError, SourceNotFound
from openenv_gym.importers import detect
from openenv_gym.importing import import_source
from openenv_gym.registration import env_info, register_catalog, register_discovered

ENVS = Path(__file__).parent.parent / "envs"
POISON = 'raise RuntimeError("an OpenEnv package was imported during discovery")\n'


def test_the_test_environments_are_detected():
    for folder, name, app in [("openenv_grid_env", "grid_env", "openenv_grid_env.server.app:app"),
                              ("openenv_echo_env", "echo_env", "openenv_echo_env.server.app:app"),
                              ("openenv_tasks_env", "tasks_env", "openenv_tasks_env.server.app:app")]:
        path = ENVS / folder
        assert looks_like_openenv(path)
        found = detect(path)
        assert (found.kind, found.env_name, found.env_class, found.source) == ("openenv", name, app, str(path))
        served = resolve_source(path)
        assert (served.root, served.app) == (str(ENVS), app)  # a package: imported from its parent


def test_a_folder_openenv_import_made_is_openenv_without_kind(tmp_path):
    """``openenv import`` vendors an ORS source into an OpenEnv env: both kinds' signals are there,
    and the manifest (how the folder is served) wins; ``--kind ors`` still picks the vendored class."""
    pkg = tmp_path / "arith_env"
    (pkg / "server").mkdir(parents=True)
    (pkg / "vendor" / "arith").mkdir(parents=True)
    shutil.copy(Path(openenv_gym.__file__).parent / "examples" / "arithmetic.py", pkg / "vendor" / "arith")
    for init in ("__init__.py", "server/__init__.py", "vendor/__init__.py", "vendor/arith/__init__.py"):
        (pkg / init).write_text("")
    (pkg / "server" / "app.py").write_text(POISON)
    (pkg / "models.py").write_text(POISON)
    (pkg / "openenv.yaml").write_text(
        "spec_version: 1\nname: arith_env\ntype: space\nruntime: fastapi\napp: server.app:app\nport: 8000\n")
    assert looks_like_ors(pkg) and looks_like_openenv(pkg)
    found = detect(pkg)
    assert (found.kind, found.env_name, found.env_class) == ("openenv", "arith_env", "arith_env.server.app:app")
    entry = import_source(pkg, "ImportedArith", catalog=tmp_path / "c.json")
    assert (entry.kind, entry.source) == ("openenv", str(pkg))
    assert detect(pkg, kind="ors").env_class == "Arithmetic"


def test_a_folder_without_init_is_served_from_itself(tmp_path):
    env = tmp_path / "plain"
    (env / "server").mkdir(parents=True)
    (env / "server" / "app.py").write_text(POISON)
    (env / "openenv.yaml").write_text("spec_version: 1\nname: plain_env\napp: server.app:app\n")
    found = resolve_source(env)
    assert (found.root, found.app, found.name) == (str(env), "server.app:app", "plain_env")
    assert resolve_source(env / "server" / "app.py").folder == str(env)


def test_detection_errors_say_what_was_looked_for(tmp_path):
    (tmp_path / "openenv.yaml").write_text("name: x\napp: web.main:api\n")
    with pytest.raises(DetectionError, match="web/main.py"):
        detect(tmp_path, kind="openenv")
    (tmp_path / "openenv.yaml").write_text("name: x\napp: 'os; rm -rf /'\n")
    with pytest.raises(DetectionError, match="module:attr"):
        detect(tmp_path, kind="openenv")
    with pytest.raises(SourceNotFound):
        resolve_source("no_such_openenv_package_xyz")
    with pytest.raises(SourceNotFound):
        detect(tmp_path / "missing", kind="openenv")


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_read_manifest_never_raises_and_keeps_only_scalars(text):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "openenv.yaml"
        path.write_bytes(text.encode("utf-8", "replace"))
        manifest = read_manifest(path)
    assert isinstance(manifest, dict)
    assert all(isinstance(v, (str, int, float, bool)) for v in manifest.values())


# -- `openenv-gym import --kind openenv`, list, info ----------------------------------------------------

def test_import_list_and_info_show_the_manifest(capsys):
    assert cli.main(["import", str(ENVS / "openenv_grid_env"), "--name", "MyGrid", "--kind", "openenv"]) == 0
    assert "openenv/MyGrid-v0" in capsys.readouterr().out
    register_catalog()
    assert cli.main(["list"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("openenv/MyGrid-v0"))
    assert str(ENVS / "openenv_grid_env") in line
    assert cli.main(["info", "openenv/MyGrid-v0"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kwargs"]["manifest"] == {
        "name": "grid_env", "version": "0.2.0", "description": "A 3x3 grid; walk from (0, 0) to (2, 2)",
        "type": "space", "runtime": "fastapi", "app": "server.app:app", "port": 8000, "spec_version": 1}
    assert info["kwargs"]["adapter"] == "openenv_gym.adapters.openenv.adapter:OpenEnvAdapter"


def test_import_source_records_the_kind(tmp_path):
    entry = import_source(ENVS / "openenv_tasks_env", "Sums", kind="openenv", catalog=tmp_path / "c.json")
    assert (entry.kind, entry.env_name, entry.sdk) == ("openenv", "tasks_env", "1.0.0")


# -- discovery of installed packages --------------------------------------------------------------------

def _install(site: Path, dist: str, module: str, *, requires: str = "openenv>=0.10", manifest: str | None,
             layout_from: Path | None = None, poison: bool = True) -> None:
    """Lay out an installed distribution (files + dist-info), as pip --no-deps would."""
    pkg = site / module
    if layout_from is not None:
        shutil.copytree(layout_from, pkg)
    else:
        (pkg / "server").mkdir(parents=True)
        (pkg / "server" / "app.py").write_text(POISON)
        (pkg / "server" / "__init__.py").write_text("")
    if poison:
        (pkg / "__init__.py").write_text(POISON)
    if manifest is not None:
        (pkg / "openenv.yaml").write_text(manifest)
    elif (pkg / "openenv.yaml").exists():
        (pkg / "openenv.yaml").unlink()
    info = site / f"{dist.replace('-', '_')}-0.3.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.3.0\nRequires-Dist: {requires}\n")
    (info / "top_level.txt").write_text(module + "\n")
    (info / "RECORD").write_text("")


def test_discovery_reads_metadata_and_manifests_without_importing(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENENV_GYM_CACHE", str(tmp_path / "cache"))
    site = tmp_path / "site"
    site.mkdir()
    _install(site, "openenv-chess-env", "chess_env", manifest="spec_version: 1\nname: chess_env\nversion: 2.1.0\n"
             "description: Chess\napp: server.app:app\n")
    _install(site, "openenv-maze-env", "maze_env", requires="openenv-core[core]>=0.3", manifest=None)
    _install(site, "not-openenv", "other_env", requires="requests", manifest="name: other\n")
    _install(site, "openenv-extra", "extra_env", requires='openenv; extra == "dev"', manifest="name: extra\n")
    found = discover_installed([str(site)])
    assert [(e["name"], e["module"], e["distribution"]) for e in found] == [
        ("chess", "chess_env", "openenv-chess-env"), ("maze", "maze_env", "openenv-maze-env")]
    assert found[0]["manifest"]["version"] == "2.1.0" and found[1]["manifest"] == {}
    assert not any(m in sys.modules for m in ("chess_env", "maze_env", "other_env"))
    # cached, and the cache follows the set of installed distributions
    cache = tmp_path / "cache" / "openenv-envs.json"
    assert json.loads(cache.read_text())["envs"] == found
    assert oct(cache.stat().st_mode & 0o777) == "0o600"
    _install(site, "openenv-go-env", "go_env", manifest="name: go_env\n")
    assert [e["name"] for e in discover_installed([str(site)])] == ["chess", "go", "maze"]
    shutil.rmtree(site / "openenv_go_env-0.3.0.dist-info")
    assert [e["name"] for e in discover_installed([str(site)])] == ["chess", "maze"]


def test_an_installed_package_registers_and_plays_without_being_imported_here(tmp_path, monkeypatch):
    pytest.importorskip("openenv")
    monkeypatch.setenv("OPENENV_GYM_CACHE", str(tmp_path / "cache"))
    site = tmp_path / "site"
    site.mkdir()
    _install(site, "openenv-sitegrid-env", "sitegrid_env", manifest=None, poison=False,
             layout_from=ENVS / "openenv_grid_env")
    monkeypatch.syspath_prepend(str(site))
    # The server process must import the package; this process (the trainer) must not.
    (site / "sitegrid_env" / "__init__.py").write_text(
        "import os\nif os.environ.get('OPENENV_TEST_TRAINER_PID') == str(os.getpid()):\n"
        "    raise RuntimeError('imported in the trainer')\n")
    monkeypatch.setenv("OPENENV_TEST_TRAINER_PID", str(__import__("os").getpid()))
    ids = register_discovered()
    assert "openenv/sitegrid-v0" in ids
    assert env_info("openenv/sitegrid-v0")["kwargs"]["source"] == "sitegrid_env"
    env = gym.make("openenv/sitegrid-v0")
    try:
        env.reset()
        assert env.step({"role": "assistant", "tool_calls": [
            {"id": "c", "function": {"name": "step", "arguments": {"move": "RIGHT"}}}]})[1] == pytest.approx(-0.1)
    finally:
        env.close()
    assert "sitegrid_env" not in sys.modules
    gym.registry.pop("openenv/sitegrid-v0", None)
