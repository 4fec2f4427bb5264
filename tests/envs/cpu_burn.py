"""A CPU-bound ORS environment: its tool burns a set amount of CPU time in the server process.

This module owns ``CpuBurn``, the environment that measures how local sources scale with
``server_workers`` (``benchmarks/server_workers.py``) and that tests use to see which server
process served a request. A sync tool blocks the server's event loop while it runs, as a
CPU-bound tool of a real environment does, so one server process serves at most
``1000 / ms`` calls a second however many sessions wait on it.

* ``burn(ms=5)`` spins until this thread has used ``ms`` milliseconds of CPU, then answers
  ``"<pid> <n>"``: the serving process and how many calls this session has made (session state
  lives in one process, so a request routed to another worker would not find it).
* ``finish()`` ends the episode with reward 1.

It imports only the standard library, ``ors`` and pydantic (it runs in the server's interpreter).
"""

from __future__ import annotations

import os
import time
from typing import Any

from ors import Environment, Split, TextBlock, ToolOutput, tool
from pydantic import BaseModel, Field

__all__ = ["CpuBurn", "BurnInput", "burn_cpu", "TASKS", "MAX_BURN_MS"]

TASKS = 1000
MAX_BURN_MS = 1000.0


class BurnInput(BaseModel):
    ms: float = Field(5.0, ge=0.0, le=MAX_BURN_MS, description="Milliseconds of CPU time to use.")


def burn_cpu(ms: float) -> None:
    """Spin until this thread has used ``ms`` milliseconds of CPU time (not wall time: a busy
    machine makes the call take longer, never cost less)."""
    end = time.thread_time() + ms / 1000.0
    while time.thread_time() < end:
        sum(range(200))


class CpuBurn(Environment):
    """Call ``burn`` as often as you like; ``finish`` ends the episode."""

    def __init__(self, task_spec: dict[str, Any] = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec=task_spec, secrets=secrets)
        self.calls = 0

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name="train", type="train")]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, int]]:
        return [{"id": i} for i in range(TASKS)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"Task {self.task_spec['id']}: call burn, then finish.")]

    @tool
    def burn(self, params: BurnInput) -> ToolOutput:
        """Use the given milliseconds of CPU in the server; answers '<server pid> <calls so far>'."""
        burn_cpu(params.ms)
        self.calls += 1
        return ToolOutput(blocks=[TextBlock(text=f"{os.getpid()} {self.calls}")], reward=0.0, finished=False)

    @tool
    def finish(self) -> ToolOutput:
        """End the episode (reward 1)."""
        return ToolOutput(blocks=[TextBlock(text="done")], reward=1.0, finished=True)
