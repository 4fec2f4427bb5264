"""The Python snippets of README.md and of every page under docs/ run as shown, each on its own, and
print what they say; every relative link of those pages leads to a file and heading that exist.

A snippet whose first line is ``# template:`` names things a user brings (a server, a source, a
tokenizer): it must still compile. Every other snippet runs alone, in a fresh namespace and a
temporary folder, as a reader pastes that one snippet into a new session: it imports what it uses
and builds what it needs (the bundled example envs need no outside service). Each
``print(...)  # text`` line must print its comment (``...`` marks text left out, and a final
``(remark)`` is a remark).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
import textwrap
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TEMPLATE = "# template:"
NEEDS = {"openenv_gym.multiagent": "pettingzoo", "openenv/KuhnPoker-v0": "verifiers"}
"""What a runnable snippet needs beyond the ``ors`` extra, by what it names (the suite runs with any
extras: a snippet whose extra is missing skips, naming it)."""


def pages() -> list[Path]:
    """README.md and every markdown page under docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def snippets(page: Path = README) -> list[tuple[int, str]]:
    """``(line, code)`` of every Python block of ``page``."""
    text = page.read_text()
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


def all_snippets(*, templates: bool) -> list[tuple[str, int, str]]:
    """``(page, line, code)`` of every template snippet, or of every runnable one."""
    return [(name(page), line, code) for page in pages() for line, code in snippets(page)
            if code.startswith(TEMPLATE) == templates]


def files_written(code: str, folder: Path) -> None:
    """What a snippet leaves in its folder, where its page promises it."""
    if 'out="ep.jsonl"' in code:  # collect(..., 64 episodes, out="ep.jsonl"): one line per episode
        assert (folder / "ep.jsonl").read_text().count("\n") == 64


def _id(value):
    return f"{value[0]}:{value[1]}"


def test_the_pages_have_runnable_snippets_and_marked_templates():
    runnable = all_snippets(templates=False)
    assert len(runnable) >= 5 and all(expected_prints(c) or "print(" not in c for _, _, c in runnable)
    docs_pages = {page for page, _, _ in runnable if page != "README.md"}
    assert len(docs_pages) >= 4, f"only {sorted(docs_pages)} under docs/ have runnable snippets"
    assert any(page == "README.md" for page, _, _ in runnable)
    assert [page for page, _, code in runnable if 'out="ep.jsonl"' in code] == ["docs/training.md"]


@pytest.mark.parametrize("snippet", [(p, line, c) for p, line, c in all_snippets(templates=True)], ids=_id)
def test_template_snippets_compile(snippet):
    page, line, code = snippet
    ast.parse(code, filename=f"{page}:{line}")


@pytest.mark.parametrize("snippet", all_snippets(templates=False), ids=_id)
def test_each_runnable_snippet_runs_alone_and_prints_what_it_says(snippet, tmp_path, monkeypatch):
    page, line, code = snippet
    missing = sorted({package for marker, package in NEEDS.items()
                      if marker in code and importlib.util.find_spec(package) is None})
    if missing:
        pytest.skip(f"the snippet needs {', '.join(missing)} (an extra that is not installed)")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__doc_snippet__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{page}:{line}", "exec"), namespace)  # noqa: S102
    printed = out.getvalue()
    for piece in expected_prints(code):
        assert piece in printed, f"{page}:{line}: {piece!r} was not printed; it printed:\n{printed}"
    files_written(code, tmp_path)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page``."""
    found: set[str] = set()
    text = re.sub(r"^( *)```.*?^\1```", "", page.read_text(), flags=re.M | re.S)
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = "".join(ch for ch in heading.lower().replace("`", "")
                       if ch in " -_" or unicodedata.category(ch)[0] in "LN").replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def links(page: Path) -> list[str]:
    """The targets of the markdown links and images of ``page``, outside code."""
    text = re.sub(r"^( *)```.*?^\1```", "", page.read_text(), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"!?\[[^\]\n]*\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", pages(), ids=name)
def test_every_relative_link_resolves(page):
    bad = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or ROOT not in file.parents and file != ROOT:
            bad.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            bad.append(f"{target}: no heading #{anchor} in {name(file)}")
    assert not bad, f"{name(page)}: " + "; ".join(bad)
