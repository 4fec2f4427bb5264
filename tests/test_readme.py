"""The README's Python snippets run as shown, against the bundled env, and print what they say.

A snippet whose first line is ``# template:`` names things a user brings (a server, a source, a
tokenizer): it must still compile. Every other snippet runs, in README order, in one namespace
(as a reader pastes them into one session), in a temporary folder; each ``print(...)  # text``
line must print its comment (``...`` marks text left out, and a final ``(remark)`` is a remark).
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
TEMPLATE = "# template:"


def snippets() -> list[tuple[int, str]]:
    """``(line, code)`` of every Python block of the README."""
    text = README.read_text()
    found = []
    for match in re.finditer(r"^( *)```python\n(.*?)^\1```", text, re.M | re.S):
        found.append((text[:match.start()].count("\n") + 1, textwrap.dedent(match[2])))
    return found


def expected_prints(code: str) -> list[str]:
    """The pieces of text each ``print(...)  # comment`` line promises."""
    pieces = []
    for line in code.splitlines():
        head, sep, comment = line.partition("  # ")
        if not sep or not head.strip().startswith("print("):
            continue
        comment = comment.strip()
        if comment.endswith(")") and " (" in comment:
            comment = comment.rsplit(" (", 1)[0]
        pieces += [p.strip() for p in comment.split("...") if p.strip()]
    return pieces


def test_the_readme_has_runnable_snippets_and_marked_templates():
    runnable = [code for _, code in snippets() if not code.startswith(TEMPLATE)]
    assert len(runnable) >= 5 and all(expected_prints(c) or "print(" not in c for c in runnable)
    assert "(17 + 4) * 3 - 8" not in README.read_text()  # the quickstart shows what seed 7 really gives


@pytest.mark.parametrize("line, code", [s for s in snippets() if s[1].startswith(TEMPLATE)],
                         ids=lambda v: f"line {v}" if isinstance(v, int) else "")
def test_template_snippets_compile(line, code):
    ast.parse(code, filename=f"README.md:{line}")


def test_runnable_snippets_run_and_print_what_they_say(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    for line, code in snippets():
        if code.startswith(TEMPLATE):
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"README.md:{line}", "exec"), namespace)  # noqa: S102
        printed = out.getvalue()
        for piece in expected_prints(code):
            assert piece in printed, f"README.md:{line}: {piece!r} was not printed; it printed:\n{printed}"
    assert (tmp_path / "ep.jsonl").read_text().count("\n") == 64
