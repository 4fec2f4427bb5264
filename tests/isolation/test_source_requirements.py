"""What an isolated venv installs for a source: its project's dependencies, and the project itself
when the source is a package inside it (the Verifiers packaging). No venv is built here."""

from __future__ import annotations

from pathlib import Path

from openenv_gym.isolation import venvs

PYPROJECT = ('[project]\nname = "my-env"\nversion = "0.1.0"\ndependencies = ["verifiers", "pyfiglet>=1"]\n'
             '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n')


def test_a_package_inside_its_project_gets_the_projects_dependencies_and_the_project(tmp_path: Path) -> None:
    (tmp_path / "my-env" / "my_env").mkdir(parents=True)
    (tmp_path / "my-env" / "my_env" / "__init__.py").write_text("")
    (tmp_path / "my-env" / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "my-env" / "requirements.txt").write_text("tabulate\n")
    project = (tmp_path / "my-env").resolve()
    package = tmp_path / "my-env" / "my_env"
    assert venvs.project_of(package) == tmp_path / "my-env"
    assert venvs.source_requirements(package) == ["verifiers", "pyfiglet>=1", f"-e {project}", "tabulate"]
    # the flat layout (my-env/my_env.py beside the pyproject) is a module inside its project too
    (tmp_path / "my-env" / "my_env.py").write_text("")
    assert f"-e {project}" in venvs.source_requirements(tmp_path / "my-env" / "my_env.py")
    reqs = venvs.requirements_for("verifiers", package, sdk="v1")
    assert reqs[:3] == ["verifiers", "pyfiglet>=1", f"-e {project}"]
    assert not [r for r in reqs if r.startswith("verifiers>=")]  # the project's own pin wins...
    # ...except the legacy bound: a bare "verifiers" would resolve to 0.4, which has no v0 API
    assert "verifiers>=0.3.1,<0.4" in venvs.requirements_for("verifiers", package, sdk="v0")


def test_a_source_that_is_its_project_folder_gets_only_the_dependencies(tmp_path: Path) -> None:
    (tmp_path / "env.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    assert venvs.source_requirements(tmp_path) == ["verifiers", "pyfiglet>=1"]


def test_a_package_without_a_project_declares_nothing(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "loose").mkdir()  # not a package: its parent's pyproject is not its project
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    assert venvs.project_of(tmp_path / "loose") is None
    assert venvs.source_requirements(tmp_path / "loose") == []
    assert venvs.source_requirements(tmp_path / "pkg")[-1] == f"-e {tmp_path.resolve()}"
    (tmp_path / "pyproject.toml").unlink()
    assert venvs.source_requirements(tmp_path / "pkg") == []
