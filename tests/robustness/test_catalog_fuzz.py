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
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401  (registers the built-ins the catalog must not disturb)
from openenv_gym.errors import CatalogError
from openenv_gym.importers.catalog import CATALOG_ENV, MAX_DEPTH, load_catalog, read_catalog, remove_entry, remove_invalid
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


def loads_or_warns(content: bytes) -> None:
    """The properties every file must have, whatever it holds."""
    with catalog_file(content) as path:
        try:
            contents = read_catalog(path, kinds=ADAPTERS)
        except CatalogError:
            contents = None
        ids, said = register(path)
        assert len(said) <= 1
        if contents is None:  # unreadable: one warning, nothing registered
            assert ids == [] and said and "not loaded" in said[0]
            return
        assert sorted(ids) == sorted(env_id(n) for n in contents.entries)
        assert bool(said) == bool(contents.invalid)
        # repair always works: afterwards the strict reader accepts the file
        remove_invalid(path, kinds=ADAPTERS)
        assert set(load_catalog(path)) == set(contents.entries)


# -- the properties ---------------------------------------------------------------------------------------

@FUZZ
@given(st.binary(max_size=2_000))
def test_random_bytes(content: bytes) -> None:
    loads_or_warns(content)


@FUZZ
@given(json_values, st.booleans())
def test_any_json(value: object, as_entries: bool) -> None:
    doc = {"version": 1, "entries": value} if as_entries else value
    loads_or_warns(json.dumps(doc).encode())


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
def test_nesting_of_any_depth_anywhere(depth: int, where: str) -> None:
    good = '"fzGood": {"name": "fzGood", "kind": "ors", "source": "/s"}'
    nest = deep(depth)
    content = {
        "options": f'{{"version": 1, "entries": {{{good}, "fzDeep": {{"name": "fzDeep", "kind": "ors", "source": "/s", "options": {{"o": {nest}}}}}}}}}',
        "entry": f'{{"version": 1, "entries": {{{good}, "fzDeep": {nest}}}}}',
        "entries": f'{{"version": 1, "entries": {nest}}}',
        "version": f'{{"version": {nest}, "entries": {{{good}}}}}',
        "top": nest,
        "string": f'{{"version": 1, "entries": {{{good}, "fzStr": {{"name": "fzStr", "kind": "ors", "source": "{"[" * depth}"}}}}}}',
    }[where]
    loads_or_warns(content.encode())
