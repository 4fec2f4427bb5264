"""The tested set (openenv_gym.pins): what every resolution the package starts is held to."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from openenv_gym import pins
from openenv_gym.errors import ConfigurationError

WRAPPED = ["ors-sdk", "openreward", "verifiers", "openenv", "mcp", "fleet-python", "ray", "openai", "httpx", "uv"]


@pytest.fixture(autouse=True)
def shipped(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (pins.CONSTRAINTS_VAR, "UV_EXCLUDE_NEWER", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)


def test_a_file_ships_for_every_supported_python_and_caps_the_wrapped_libraries() -> None:
    for minor in (11, 12, 13):
        found = pins.shipped(f"3.{minor}")
        assert found is not None and found.name == f"py3.{minor}.txt"
        read = pins.Pins.read(found)
        assert read.exclude_newer and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", read.exclude_newer)
        for lib in WRAPPED:
            assert read.version(lib), f"{lib} has no tested version in {found.name}"


def test_this_venv_holds_no_release_newer_than_the_tested_set() -> None:
    """CI installs with the shipped file: a package newer than its cap here means it did not."""
    active = pins.active()
    assert active is not None
    newer = []
    for dist in importlib.metadata.distributions():
        name = pins.canonical(dist.metadata["Name"] or "")
        cap = active.version(name)
        if cap and Version(dist.version).release > Version(cap).release:
            newer.append(f"{name} {dist.version} > {cap}")
    assert newer == []


def test_the_envs_own_versions_win_and_bare_names_keep_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mine.txt"
    mine.write_text("# uv-exclude-newer: 2026-01-02T00:00:00Z\nopenai<=3.0.0\nhttpx<=0.28.1  # a comment\nMCP_Lib==1.0\n")
    monkeypatch.setenv(pins.CONSTRAINTS_VAR, str(mine))
    text = pins.constraints_for(["openai", "httpx>=0.29", "mcp-lib[cli] @ https://example.invalid/x.whl", "-e ./proj"])
    assert text is not None
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == ["openai<=3.0.0"]  # httpx and mcp-lib name their own versions
    assert pins.script_env() == {"UV_EXCLUDE_NEWER": "2026-01-02T00:00:00Z", "PIP_CONSTRAINT": str(mine.resolve())}


def test_the_user_turns_them_off_or_sets_their_own_date(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pins.CONSTRAINTS_VAR, "none")
    assert pins.active() is None and pins.constraints_for(["six"]) is None and pins.script_env() == {}
    monkeypatch.delenv(pins.CONSTRAINTS_VAR)
    monkeypatch.setenv("UV_EXCLUDE_NEWER", "2020-01-01T00:00:00Z")
    assert "UV_EXCLUDE_NEWER" not in pins.script_env()  # theirs stays in the environment uv reads


def test_a_missing_constraints_file_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(pins.CONSTRAINTS_VAR, str(tmp_path / "nope.txt"))
    with pytest.raises(ConfigurationError, match="cannot read the constraints file .*nope.txt .*OPENENV_GYM_CONSTRAINTS"):
        pins.active()


def test_an_interpreter_path_or_version_finds_its_file() -> None:
    assert pins.shipped(sys.executable) == pins.shipped() == pins.shipped(f"{sys.version_info[0]}.{sys.version_info[1]}.9")
    assert pins.shipped("3.99") is None
