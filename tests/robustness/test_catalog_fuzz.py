"""Fuzzing the user catalog: whatever the file holds, ``import openenv_gym`` must go on.

The catalog is a file users edit by hand, sync between machines and half-write from crashed
scripts. Whatever it holds -- random bytes, any JSON, entries good and bad mixed, nesting far past
the decoder's limit -- loading it registers exactly the good entries, says what it skipped in at
most one warning, raises nothing (an unreadable file is a ``CatalogError`` that registration turns
into that warning) and never hangs. Repair is always possible: ``remove_invalid`` leaves a file
the strict reader accepts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401  (registers the built-ins the catalog must not disturb)
from openenv_gym.importers.catalog import CATALOG_ENV, MAX_DEPTH, load_catalog, remove_entry, remove_invalid
from openenv_gym.registration import ADAPTERS, env_id, register_catalog

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
pytestmark = pytest.mark.timeout(600)

# -- what a file may hold ------------------------------------------------------------------------------

no_surrogates = st.characters(blacklist_categories=("Cs",))
json_leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10)
json_values = st.recursive(json_leaves, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)

GOOD_NAME = st.from_regex(r"\Afz[A-Za-z0-9_.-]{0,15}\Z")  # cannot collide with a built-in's name
# Characters that make a name bad by construction (not by asking the code under test).
BAD_CHARS = ["/", ":", " ", "\t", "\n", "\x00", "\u200b", "\u200d", "\u200f", "\u202e", "\U0001F600",
             "\u00e9", "\u0430", "\uff21", "\u0301", "!", "@", "\\"]


@st.composite
def good_entry(draw: st.DrawFn) -> tuple[str, str]:
    name = draw(GOOD_NAME)
    value = {"name": name, "kind": draw(st.sampled_from(sorted(ADAPTERS))),
             "source": draw(st.text(no_surrogates, max_size=20))}
    if draw(st.booleans()):
        value["options"] = draw(st.dictionaries(st.text(no_surrogates, max_size=8).filter(lambda k: k != "adapter"),
                                                json_leaves, max_size=3))
    for field in ("env_class", "env_name", "module_file", "sdk", "added_at"):
        if draw(st.booleans()):
            value[field] = draw(st.text(no_surrogates, max_size=8))
    return name, json.dumps(value, ensure_ascii=draw(st.booleans()))


def deep(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


@st.composite
def bad_entry(draw: st.DrawFn) -> tuple[str, str]:
    base = draw(GOOD_NAME)
    kind = draw(st.sampled_from(sorted(ADAPTERS)))
    how = draw(st.sampled_from(["name", "empty", "dash", "missing", "type", "mismatch", "kind", "deep",
                                "very deep", "not an object"]))
    if how in ("name", "empty", "dash"):
        if how == "name":
            at = draw(st.integers(0, len(base)))
            name = base[:at] + draw(st.sampled_from(BAD_CHARS)) + base[at:]
        else:
            name = "" if how == "empty" else "-" + base
        return name, json.dumps({"name": name, "kind": kind, "source": "/s"})
    name = "zb" + base  # a good-looking name, apart from the good entries'
    if how == "missing":
        value = {"name": name, "kind": kind, "source": "/s"}
        del value[draw(st.sampled_from(["name", "kind", "source"]))]
        return name, json.dumps(value)
    if how == "type":
        field, wrong = draw(st.sampled_from([("kind", 5), ("source", None), ("options", [1]), ("sdk", {"a": 1})]))
        return name, json.dumps({"name": name, "kind": kind, "source": "/s", field: wrong})
    if how == "mismatch":
        return name, json.dumps({"name": name + "x", "kind": kind, "source": "/s"})
    if how == "kind":
        return name, json.dumps({"name": name, "kind": "zz" + draw(st.text(max_size=5)), "source": "/s"})
    if how == "not an object":
        return name, json.dumps(draw(json_leaves | st.lists(json_leaves, max_size=3)))
    depth = draw(st.integers(MAX_DEPTH, 60) if how == "deep" else st.integers(1_000, 30_000))
    return name, f'{{"name": {json.dumps(name)}, "kind": "{kind}", "source": "/s", "options": {{"o": {deep(depth)}}}}}'


# -- running the loader ----------------------------------------------------------------------------------

@contextlib.contextmanager
def catalog_file(content: bytes) -> Iterator[Path]:
    """A catalog holding ``content``, in force for the block; the registry is restored after."""
    before = dict(gym.registry)
    old = os.environ.get(CATALOG_ENV)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "catalog.json"
        path.write_bytes(content)
        os.environ[CATALOG_ENV] = str(path)
        try:
            yield path
        finally:
            if old is None:
                os.environ.pop(CATALOG_ENV, None)
            else:
                os.environ[CATALOG_ENV] = old
            gym.registry.clear()
            gym.registry.update(before)


def register(path: Path) -> tuple[list[str], list[str]]:
    """``register_catalog()``: the ids, and the warnings it gave (it must raise nothing)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = register_catalog()
    assert all(gym.spec(i).kwargs["adapter"] in ADAPTERS.values() for i in ids)
    return ids, [str(w.message) for w in caught]


# -- what the file format says, read without the code under test ----------------------------------------
# The rules of importers/catalog.py's docs and the README ("Importing your own environments"),
# applied with Python's json module: they decide what every generated file must give.

NAME_RULE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # ASCII letters, digits, _ - .; 128 at most
OPTIONAL_STRINGS = ("env_class", "env_name", "module_file", "sdk", "origin", "commit")


class Expected(NamedTuple):
    """What loading a readable file must give: entry names by verdict."""

    good: set[str]  # read as entries (kept by ``remove --invalid``)
    registered: set[str]  # of those, registered (options may not set "adapter": the kind chooses it)
    bad: set[str]


def _refuse(name: str) -> None:
    raise ValueError(name)


def nesting(value: object) -> int:
    """How many arrays and objects deep ``value`` nests (0 for a scalar)."""
    if isinstance(value, dict):
        return 1 + max(map(nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(nesting, value), default=0)
    return 0


def lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return any(lone_surrogate(k) or lone_surrogate(v) for k, v in value.items())
    return isinstance(value, list) and any(map(lone_surrogate, value))


def isolation_ok(value: object) -> bool:
    if value is None:
        return True
    if not isinstance(value, dict):
        return False
    lists_ok = all(isinstance(value.get(k, []), list) and all(isinstance(x, str) for x in value.get(k, []))
                   for k in ("requirements", "excluded"))
    return lists_ok and all(value.get(k) is None or isinstance(value[k], str) for k in ("python", "venv"))


def entry_ok(name: str, value: object) -> bool:
    """An entry as the docs define it: its name under its own key, a known kind, a source, the
    optional fields of their types, nesting at most MAX_DEPTH levels (the entry counts 1)."""
    if not isinstance(value, dict) or not NAME_RULE.fullmatch(name):
        return False
    if not all(isinstance(value.get(k), str) for k in ("name", "kind", "source")):
        return False
    if value["name"] != name or value["kind"] not in ADAPTERS:
        return False
    if any(value.get(k) is not None and not isinstance(value[k], str) for k in OPTIONAL_STRINGS):
        return False
    if not isinstance(value.get("added_at", ""), str) or not isolation_ok(value.get("isolated")):
        return False
    options = value.get("options", {})
    return isinstance(options, dict) and 1 + nesting(options) <= MAX_DEPTH


def expected_catalog(content: bytes) -> Expected | None:
    """What loading ``content`` must give, or None for a file that cannot be read at all (not
    UTF-8 JSON, not an object, a version other than 1, entries that are not an object)."""
    try:
        doc = json.loads(content.decode("utf-8"), parse_constant=_refuse)  # strict JSON: no NaN
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or lone_surrogate(doc):
        return None
    version, entries = doc.get("version", 1), doc.get("entries", {})
    if type(version) is not int or version != 1 or not isinstance(entries, dict):
        return None
    good = {name for name, value in entries.items() if entry_ok(name, value)}
    registered = {name for name in good if "adapter" not in entries[name].get("options", {})}
    return Expected(good, registered, set(entries) - good)


def loads_or_warns(content: bytes, expected: Expected | None) -> None:
    """Loading ``content`` registers exactly the expected entries, warns at most once (naming the
    bad ones), raises nothing; ``remove --invalid`` then leaves exactly the good ones."""
    with catalog_file(content) as path:
        ids, said = register(path)
        assert len(said) <= 1
        if expected is None:  # unreadable: one warning, nothing registered
            assert ids == [] and said and "not loaded" in said[0]
            return
        assert sorted(ids) == sorted(env_id(n) for n in expected.registered)
        skipped = expected.bad | (expected.good - expected.registered)
        assert bool(said) == bool(skipped)
        if said and len(skipped) <= 50:  # the warning names the first 50
            assert f"skipped {len(skipped)} invalid catalog entr" in said[0]
            assert all(repr(name)[:40] in said[0] for name in skipped)
        # repair always works: afterwards the strict reader accepts the file
        remove_invalid(path, kinds=ADAPTERS)
        assert set(load_catalog(path)) == expected.good


# -- the properties ---------------------------------------------------------------------------------------

@FUZZ
@given(st.binary(max_size=2_000))
def test_random_bytes(content: bytes) -> None:
    loads_or_warns(content, expected_catalog(content))


@FUZZ
@given(json_values, st.booleans())
def test_any_json(value: object, as_entries: bool) -> None:
    doc = {"version": 1, "entries": value} if as_entries else value
    content = json.dumps(doc).encode()
    loads_or_warns(content, expected_catalog(content))


def nested_options(depth: int) -> dict:
    """Options that nest ``depth`` objects deep (the options object itself included)."""
    value: object = 1
    for _ in range(depth):
        value = {"o": value}
    return value  # type: ignore[return-value]


# Each field of an entry: values that are right, and values that are wrong (by the docs' rules).
RIGHT_AND_WRONG = {
    "kind": (st.sampled_from(sorted(ADAPTERS)), st.sampled_from([None, 5, "zz", "ORS", ""])),
    "source": (st.text(no_surrogates, max_size=10), st.sampled_from([None, 1, ["/s"], {}])),
    "env_class": (st.none() | st.text(no_surrogates, max_size=6), st.sampled_from([1, ["A"], {}])),
    "sdk": (st.none() | st.text(no_surrogates, max_size=6), st.sampled_from([True, [], {"a": 1}])),
    "commit": (st.none() | st.text(no_surrogates, max_size=6), st.sampled_from([0, []])),
    "added_at": (st.text(no_surrogates, max_size=6), st.sampled_from([None, 1])),
    "options": (st.dictionaries(st.sampled_from(["split", "max_turns", "adapter", "x"]), json_leaves, max_size=3)
                | st.sampled_from([MAX_DEPTH - 2, MAX_DEPTH - 1]).map(nested_options),
                st.sampled_from([[1], "x", None]) | st.sampled_from([MAX_DEPTH, MAX_DEPTH + 5]).map(nested_options)),
    "isolated": (st.none() | st.fixed_dictionaries({}, optional={"requirements": st.lists(st.text(max_size=4), max_size=2),
                                                                 "python": st.none() | st.just("3.12"),
                                                                 "excluded": st.just([".env"])}),
                 st.sampled_from([5, "x", {"requirements": "a"}, {"excluded": [1]}, {"python": 3}])),
}


REQUIRED = ("kind", "source")


@st.composite
def entry_like(draw: st.DrawFn) -> tuple[str, object]:
    """An entry with at most one thing wrong: its name, the name it holds, or one field."""
    wrong = draw(st.sampled_from([None] * 6 + ["key", "name", *RIGHT_AND_WRONG]))
    bad_names = ["", "-fz", "fz a", "fz/a", "fz\u00e9", "fz:a", "fz" + "x" * 127]
    name = draw(st.sampled_from(bad_names) if wrong == "key" else GOOD_NAME)
    value: dict[str, object] = {"name": draw(st.sampled_from([name + "x", 5, None, "absent"])) if wrong == "name" else name}
    for field, (right, bad) in RIGHT_AND_WRONG.items():
        if field == wrong:
            how = draw(st.sampled_from(["wrong", "absent"] if field in REQUIRED else ["wrong"]))
        else:
            how = draw(st.sampled_from(["right"] if field in REQUIRED else ["right", "right", "absent"]))
        if how != "absent":
            value[field] = draw(right if how == "right" else bad)
    if draw(st.booleans()):
        value["unknown_field"] = draw(json_leaves)  # ignored
    if value["name"] == "absent":
        del value["name"]
    return name, value


@FUZZ
@given(st.lists(entry_like() | st.tuples(GOOD_NAME, json_values), max_size=8),
       st.sampled_from([1, 1, 1, None, 2, "1", True]))
def test_entries_right_or_wrong_in_any_field(items: list[tuple[str, object]], version: object) -> None:
    """Near-miss files: each entry is judged on its own, exactly as the docs' rules say."""
    doc: dict[str, object] = {"entries": dict(items)}
    if version is not None:
        doc["version"] = version
    content = json.dumps(doc).encode()
    expected = expected_catalog(content)
    assert (expected is None) == (version not in (None, 1) or version is True)
    if expected is not None:
        event(f"good entries: {min(len(expected.good), 3)}, bad: {min(len(expected.bad), 3)}")
    loads_or_warns(content, expected)


@FUZZ
@given(st.lists(good_entry().map(lambda e: (True, e)) | bad_entry().map(lambda e: (False, e)), max_size=12))
def test_good_and_bad_entries_mixed(items: list[tuple[bool, tuple[str, str]]]) -> None:
    entries: dict[str, tuple[bool, str]] = {}
    for is_good, (name, fragment) in items:
        entries.setdefault(name, (is_good, fragment))  # a JSON object keeps the last duplicate: avoid them
    content = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, (_, v) in entries.items()) + "}"
    with catalog_file(('{"version": 1, "entries": ' + content + "}").encode()) as path:
        expected = {name for name, (is_good, _) in entries.items() if is_good}
        ids, said = register(path)
        assert sorted(ids) == sorted(env_id(n) for n in expected)
        bad = set(entries) - expected
        if bad:
            assert len(said) == 1 and f"skipped {len(bad)} invalid catalog entr" in said[0]
            for name in bad:
                assert repr(name)[:40] in said[0]
        else:
            assert said == []
        for name in bad:  # each bad entry can be removed on its own, and nothing else goes
            remove_entry(name, path)
        assert set(load_catalog(path)) == expected


@FUZZ
@given(st.integers(0, 50_000), st.sampled_from(["options", "entry", "entries", "version", "top", "string"]))
@example(MAX_DEPTH - 2, "options")  # the deepest options allowed: the entry counts 1, its options 2
@example(MAX_DEPTH - 1, "options")  # one level too deep
def test_nesting_of_any_depth_anywhere(depth: int, where: str) -> None:
    good = '"fzGood": {"name": "fzGood", "kind": "ors", "source": "/s"}'
    nest = deep(depth)
    content = {
        "options": (f'{{"version": 1, "entries": {{{good}, "fzDeep": {{"name": "fzDeep", "kind": "ors", "source": "/s", '
                    f'"options": {{"o": {nest}}}}}}}}}'),
        "entry": f'{{"version": 1, "entries": {{{good}, "fzDeep": {nest}}}}}',
        "entries": f'{{"version": 1, "entries": {nest}}}',
        "version": f'{{"version": {nest}, "entries": {{{good}}}}}',
        "top": nest,
        "string": f'{{"version": 1, "entries": {{{good}, "fzStr": {{"name": "fzStr", "kind": "ors", "source": "{"[" * depth}"}}}}}}',
    }[where]
    # What each place allows (nested past the json module's own limit, so said here).
    if where in ("entries", "top") or (where == "version" and depth > 0):
        expected = None  # not the catalog's shape at all
    elif where == "options" and depth <= MAX_DEPTH - 2:
        expected = Expected({"fzGood", "fzDeep"}, {"fzGood", "fzDeep"}, set())
    elif where in ("options", "entry"):
        expected = Expected({"fzGood"}, {"fzGood"}, {"fzDeep"})
    elif where == "string":
        expected = Expected({"fzGood", "fzStr"}, {"fzGood", "fzStr"}, set())
    else:  # "version" 1, written as nothing nested
        expected = Expected({"fzGood"}, {"fzGood"}, set())
    loads_or_warns(content.encode(), expected)
