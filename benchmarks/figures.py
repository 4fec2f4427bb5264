"""One shape for every benchmark's results, so ``run_all.py`` can put them in one table.

Each benchmark measures repeats (rounds, reps) and reports a figure as the median of the
per-repeat values with their min and max, next to its target. ``--json`` writes
``{"figures": [...], "details": {...}}``; the figures are what docs/performance.md's table shows.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["figure", "write"]


def figure(name: str, values: Sequence[float], *, unit: str = "x", target: float | None = None,
           higher_is_better: bool = True, note: str = "") -> dict[str, Any]:
    """A figure over repeats: median, min, max, and whether the median meets ``target``."""
    vals = [float(v) for v in values]
    med = statistics.median(vals) if vals else float("nan")
    met = None if target is None else (med >= target if higher_is_better else med <= target)
    return {"name": name, "unit": unit, "median": med, "min": min(vals, default=med), "max": max(vals, default=med),
            "reps": len(vals), "target": target, "higher_is_better": higher_is_better, "met": met, "note": note}


def write(path: str | Path | None, figures: list[dict[str, Any]], details: Any = None) -> None:
    """Write the figures (and any details) as JSON to ``path`` (nothing if ``path`` is None)."""
    if path is not None:
        Path(path).write_text(json.dumps({"figures": figures, "details": details}, indent=2, default=str))
