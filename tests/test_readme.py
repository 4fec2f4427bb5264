"""The README is a front page: short, with the set-up commands, the tested versions, a quickstart,
the backends, the headline benchmark rows (copied from docs/performance.md, never typed) and a
link to every page of docs/. Its snippets and links are checked with the docs' (test_docs.py).
"""

from __future__ import annotations

import re

from test_docs import DOCS, README, ROOT, TEMPLATE, expected_prints, links, snippets

MAIN_JOB = ("python3 -m venv .venv && .venv/bin/pip install -c openenv_gym/constraints/py3.11.txt -e '.[ors]' && "
            ".venv/bin/openenv-gym rollout openenv/Arithmetic-v0 --episodes 1000 --num-envs 32 --out rollout.jsonl "
            "--overwrite")
TESTS = ("python3 -m venv .venv && .venv/bin/pip install -c openenv_gym/constraints/py3.11.txt "
         "-e '.[ors,ray,fleet,verifiers,openenv,multiagent,tokens,dev]' && .venv/bin/pytest -q")


def section(title: str) -> str:
    return README.read_text().split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_readme_is_a_front_page():
    assert len(README.read_text().splitlines()) <= 300


def test_the_set_up_section_has_the_two_commands():
    setup = section("Set-up on a fresh machine")
    assert re.findall(r"```bash\n(.*?)\n```", setup, re.S) == [MAIN_JOB, TESTS]


def test_the_tested_versions_stay_on_the_front_page():
    setup = section("Set-up on a fresh machine")
    assert "**Tested versions.**" in setup and "OPENENV_GYM_CONSTRAINTS" in setup
    assert "| tested (Python 3.11) | version | where a newer release breaks |" in setup


def test_the_quickstart_runs_and_shows_what_seed_7_gives():
    runnable = [code for _, code in snippets(README) if not code.startswith(TEMPLATE)]
    assert runnable and all(expected_prints(c) for c in runnable)
    assert "(17 + 4) * 3 - 8" not in README.read_text()  # the quickstart shows what seed 7 really gives


def test_the_backends_table_names_each_backend_and_its_page():
    backends = section("Backends")
    for backend, page in [("ORS", "ors"), ("Verifiers", "verifiers"), ("Fleet", "fleet"), ("OpenEnv", "openenv")]:
        assert re.search(rf"^\| {backend}\b.*\(docs/backends/{page}\.md\) \|$", backends, re.M), backend


def test_the_headline_benchmark_rows_are_copied_from_the_performance_page():
    performance = (DOCS / "performance.md").read_text().splitlines()
    headline = section("Performance").splitlines()
    rows = [line for line in headline if line.startswith("| ") and not line.startswith("| benchmark ")]
    machine = [line for line in headline if line.startswith("Measured ")]
    assert len(rows) >= 5 and len(machine) == 1
    assert set(rows + machine) <= set(performance), "a README figure that docs/performance.md does not have"


def test_the_readme_links_every_page_of_the_docs():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(README)}
    assert {page.resolve() for page in DOCS.rglob("*.md")} <= linked
