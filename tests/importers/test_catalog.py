"""The user catalog (openenv_gym.importers.catalog): format, names, errors, concurrent writers."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from openenv_gym.errors import CatalogError, InvalidName
from openenv_gym.importers.catalog import (
    CATALOG_ENV,
    CatalogEntry,
    add_entry,
    catalog_path,
    load_catalog,
    remove_entry,
    validate_name,
)


def entry(name: str, **kw: object) -> CatalogEntry:
    return CatalogEntry(name=name, kind="ors", source=f"/src/{name}", **kw)  # type: ignore[arg-type]


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "catalog.json"  # parent directories are created
    assert load_catalog(path) == {}
    a = entry("Alpha", env_class="Alpha", env_name="alpha", module_file="pkg/a.py", sdk="ors",
              added_at="2024-01-01T00:00:00+00:00", options={"split": "test", "max_turns": 4})
    b = entry("beta-env.v2")
    add_entry(a, path)
    add_entry(b, path)
    loaded = load_catalog(path)
    assert loaded["Alpha"] == a
    assert loaded["beta-env.v2"].added_at  # stamped when empty
    assert loaded["beta-env.v2"].options == {} and loaded["beta-env.v2"].env_class is None

    raw = json.loads(path.read_text())
    assert raw["version"] == 1 and set(raw["entries"]) == {"Alpha", "beta-env.v2"}
    assert "env_class" not in raw["entries"]["beta-env.v2"]  # defaults are omitted

    add_entry(entry("Alpha", env_class="Other"), path)  # replace=True by default
    assert load_catalog(path)["Alpha"].env_class == "Other"
    with pytest.raises(CatalogError, match="already has an entry 'Alpha'"):
        add_entry(entry("Alpha"), path, replace=False)

    assert remove_entry("Alpha", path).env_class == "Other"
    assert set(load_catalog(path)) == {"beta-env.v2"}
    assert sorted(p.name for p in path.parent.iterdir()) == ["catalog.json", "catalog.json.lock"]


def test_remove_unknown_lists_known_names(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    add_entry(entry("One"), path)
    add_entry(entry("Two"), path)
    with pytest.raises(CatalogError, match="'Three'") as info:
        remove_entry("Three", path)
    assert "One, Two" in str(info.value)


@pytest.mark.parametrize("name", ["a:b", "a/b", "", "a b", "tab\there", "new\nline", "a@b", "é!"])
def test_invalid_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidName):
        validate_name(name)
    with pytest.raises(InvalidName):
        add_entry(entry(name), tmp_path / "catalog.json")
    assert not (tmp_path / "catalog.json").exists()


@pytest.mark.parametrize("name", ["MyEnv", "my-env", "my_env.v2", "Env-v1", "x", "gsm8k"])
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize(
    "content", [b"{not json", b"[]", b'{"version": 1, "entries": {"a": {"kind": "ors"}}}', b'{"version": 99}']
)
def test_corrupt_file_names_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "catalog.json"
    path.write_bytes(content)
    with pytest.raises(CatalogError, match="catalog.json"):
        load_catalog(path)
    with pytest.raises(CatalogError):
        add_entry(entry("x"), path)
    assert path.read_bytes() == content  # a write never clobbers a file it could not read


def test_env_var_override_and_xdg_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "custom" / "cat.json"
    monkeypatch.setenv(CATALOG_ENV, str(target))
    assert catalog_path() == target
    add_entry(entry("ViaEnv"))
    assert set(load_catalog()) == {"ViaEnv"} and target.exists()
    assert remove_entry("ViaEnv").name == "ViaEnv"

    monkeypatch.delenv(CATALOG_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert catalog_path() == tmp_path / "xdg" / "openenv_gym" / "catalog.json"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert catalog_path() == tmp_path / "home" / ".config" / "openenv_gym" / "catalog.json"


def _writer(path: str, worker: int) -> None:
    for i in range(10):
        add_entry(entry(f"w{worker}-e{i}", options={"worker": worker, "i": i}), path)


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), w)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
    assert [p.exitcode for p in procs] == [0] * 8
    raw = json.loads(path.read_text())  # valid JSON, not a torn write
    assert len(raw["entries"]) == 80
    assert set(load_catalog(path)) == {f"w{w}-e{i}" for w in range(8) for i in range(10)}
    assert not list(tmp_path.glob("*.tmp"))  # no temp files left behind
