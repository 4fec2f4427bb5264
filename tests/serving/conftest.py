"""Fixtures of the serving tests (the helpers are in ``serve_helpers.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from serve_helpers import Served, start_serve


@pytest.fixture
def serve_process() -> Iterator[Any]:
    """Start servers with :func:`start_serve`; any left running at the test's end is stopped."""
    started: list[Served] = []

    def start(*args: str, **kwargs: Any) -> Served:
        served = start_serve(*args, **kwargs)
        started.append(served)
        return served

    yield start
    for served in started:
        if served.process.poll() is None:
            served.stop()
