"""The ``>>>`` examples in the package's docstrings run and show what they say.

Every module holding one is run through :mod:`doctest`; a module whose optional dependency is not
installed is skipped with its name.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "openenv_gym"
WITH_EXAMPLES = sorted(p for p in PACKAGE.rglob("*.py") if ">>>" in p.read_text())


def test_the_public_helpers_carry_examples():
    assert len(WITH_EXAMPLES) >= 10


@pytest.mark.parametrize("path", WITH_EXAMPLES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_docstring_examples_run(path: Path):
    name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        pytest.skip(f"{name} needs {exc.name}, not installed")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (run it with python -m doctest -v)"
