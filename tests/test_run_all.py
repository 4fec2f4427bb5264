"""benchmarks/run_all.py: a --quick smoke run never overwrites the committed results.

The runner and one fast benchmark (catalog loading) are copied into a temporary folder with a
copy of the committed results, and run there, so nothing in the repository is written.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def copy_of_benchmarks(tmp_path: Path) -> Path:
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    for name in ("run_all.py", "figures.py", "catalog_load.py", "results.md", "results.json"):
        shutil.copy(BENCHMARKS / name, folder / name)
    return folder


def run_all(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(folder / "run_all.py"), *args], capture_output=True, text=True,
                          timeout=300, cwd=folder.parent)


def test_a_quick_run_writes_beside_the_committed_results_never_over_them(tmp_path):
    folder = copy_of_benchmarks(tmp_path)
    committed = {name: (folder / name).read_bytes() for name in ("results.md", "results.json")}
    proc = run_all(folder, "--quick", "--only", "catalog")
    assert proc.returncode == 0, proc.stderr
    assert {name: (folder / name).read_bytes() for name in committed} == committed
    quick = (folder / "results" / "quick.md").read_text()
    assert "| catalog | catalog load, 1,000 entries |" in quick and "one run" in quick  # --reps 1 at --quick
    assert "written to" in proc.stdout and str(folder / "results" / "quick") in proc.stdout


def test_a_quick_run_refuses_the_committed_results_as_its_out(tmp_path):
    folder = copy_of_benchmarks(tmp_path)
    committed = {name: (folder / name).read_bytes() for name in ("results.md", "results.json")}
    proc = run_all(folder, "--quick", "--only", "catalog", "--out", "benchmarks/results")
    assert proc.returncode == 2 and "never writes the committed" in proc.stderr
    assert {name: (folder / name).read_bytes() for name in committed} == committed
    assert not (folder / "results").exists()
