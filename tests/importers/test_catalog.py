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
    read_catalog,
    remove_entry,
    remove_invalid,
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


# -- hardening: one bad entry costs only itself ------------------------------------------------------

GOOD = {"name": "Good", "kind": "ors", "source": "/src/Good"}
BAD_NAMES = [
    "../../x", "a/b", "a b", "a:b", "", "emoji\U0001F600", "zero\u200bwidth", "rtl\u202eoverride",
    "rtl\u200fmark", "\u0410rithmetic",  # Cyrillic A: prints like the Latin one
    "\uff21bc",  # fullwidth A
    "e\u0301", "-dash-first", ".dot-first", "x" * 129, "tab\t", "new\nline",
]


def write(path: Path, entries: dict[str, object]) -> None:
    path.write_text(json.dumps({"version": 1, "entries": entries}))


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("name", BAD_NAMES, ids=ascii)
def test_names_gymnasium_ids_cannot_hold_or_that_hide_are_refused(name: str) -> None:
    with pytest.raises(InvalidName):
        validate_name(name)


@pytest.mark.parametrize("name", BAD_NAMES, ids=ascii)
def test_a_bad_name_in_the_file_is_skipped_and_the_rest_load(tmp_path: Path, name: str) -> None:
    path = tmp_path / "catalog.json"
    write(path, {"Good": GOOD, name: {"name": name, "kind": "ors", "source": "/src/bad"}})
    contents = read_catalog(path)
    assert set(contents.entries) == {"Good"}
    assert set(contents.invalid) == {name} and "name" in contents.invalid[name]
    with pytest.raises(CatalogError, match="invalid entries") as info:
        load_catalog(path)  # the strict read names the bad entry
    assert repr(name)[:40] in str(info.value)


@pytest.mark.parametrize("value, reason", [
    ({"name": "Broken", "kind": "ors"}, "not a catalog entry"),  # no source
    ({"name": "Broken", "kind": 5, "source": "/s"}, "not a catalog entry"),
    ({"name": "Other", "kind": "ors", "source": "/s"}, "named 'Other'"),
    ({"name": "Broken", "kind": "ors", "source": "/s", "options": [1, 2]}, "not a catalog entry"),
    ("just a string", "not a catalog entry"),
    ({"name": "Broken", "kind": "ors", "source": "/s", "options": {"o": nested(40)}}, "levels deep"),
])
def test_a_corrupt_entry_is_skipped_with_its_reason(tmp_path: Path, value: object, reason: str) -> None:
    path = tmp_path / "catalog.json"
    write(path, {"Good": GOOD, "Broken": value})
    contents = read_catalog(path)
    assert set(contents.entries) == {"Good"}
    assert reason in contents.invalid["Broken"]


def test_options_nested_far_past_the_decoders_limit_cost_only_their_entry(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    deep = '{"name": "Deep", "kind": "ors", "source": "/s", "options": {"o": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    path.write_text('{"version": 1, "entries": {"Good": ' + json.dumps(GOOD) + ', "Deep": ' + deep
                    + ', "Str": {"name": "Str", "kind": "ors", "source": "/s[[[{{", "options": {"s": "]]}"}}}}')
    contents = read_catalog(path)  # was RecursionError
    assert set(contents.entries) == {"Good", "Str"}
    assert contents.entries["Str"].source == "/s[[[{{"  # brackets inside strings are not nesting
    assert "levels deep" in contents.invalid["Deep"]
    # removing another entry keeps the deep one as it was; removing it repairs the file
    assert remove_entry("Str", path).name == "Str"
    assert deep.replace(" ", "") in path.read_text().replace(" ", "").replace("\n", "")
    assert remove_entry("Deep", path) is None
    assert load_catalog(path) == {"Good": CatalogEntry(**GOOD)}  # type: ignore[arg-type]


@pytest.mark.parametrize("content, fails", [
    ('{"version": 1, "junk": ' + "[" * 100_000 + "]" * 100_000 + ', "entries": {}}', False),  # ignored field
    ('{"version": ' + "[" * 100_000 + "]" * 100_000 + ', "entries": {}}', True),
    ("[" * 100_000 + "]" * 100_000, True),
    ("{" * 100_000, True),
])
def test_deep_nesting_outside_the_entries_never_raises_recursion_error(tmp_path: Path, content: str,
                                                                       fails: bool) -> None:
    path = tmp_path / "catalog.json"
    path.write_text(content)
    if fails:
        with pytest.raises(CatalogError, match="catalog.json"):
            read_catalog(path)
    else:
        assert read_catalog(path) == ({}, {})


@pytest.mark.parametrize("name", ["../../x", "zero\u200bwidth", "", "Broken"], ids=ascii)
def test_remove_deletes_a_bad_entry_and_keeps_every_other(tmp_path: Path, name: str) -> None:
    path = tmp_path / "catalog.json"
    other_bad = {"name": "a b", "kind": "ors", "source": "/s"}
    value = {"name": name, "kind": "ors"} if name == "Broken" else {"name": name, "kind": "ors", "source": "/s"}
    write(path, {"Good": GOOD, name: value, "a b": other_bad})
    assert remove_entry(name, path) is None  # a bad entry has no CatalogEntry to return
    raw = json.loads(path.read_text())["entries"]
    assert raw == {"Good": GOOD, "a b": other_bad}  # the other bad entry is kept for its owner


def test_remove_invalid_removes_every_bad_entry_in_one_call(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    write(path, {"Good": GOOD, "a/b": {"name": "a/b", "kind": "ors", "source": "/s"}, "X": {"kind": "ors"}})
    assert set(remove_invalid(path)) == {"a/b", "X"}
    assert set(json.loads(path.read_text())["entries"]) == {"Good"}
    assert remove_invalid(path) == {}


def test_add_refuses_a_catalog_with_bad_entries_and_says_how_to_fix_it(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    write(path, {"a b": {"name": "a b", "kind": "ors", "source": "/s"}})
    before = path.read_bytes()
    with pytest.raises(CatalogError, match="remove"):
        add_entry(entry("New"), path)
    assert path.read_bytes() == before
    with pytest.raises(CatalogError, match="levels deep"):
        add_entry(entry("Deep", options={"o": nested(40)}), tmp_path / "other.json")
