"""An in-process backend whose steps take a random time: for measuring batching, not environments.

``LatencyAdapter`` has no server and no CPU work: each step sleeps a lognormal duration (median
``median`` seconds, shape ``sigma``), the shape of real LLM-environment step times, where most
steps are quick and a few are very slow. It isolates what a vector env's batching strategy
gains (first-ready ``recv`` against lockstep ``step``) from any backend cost. Episodes last
``turns`` steps and end with reward 1. With ``median=0`` a step costs nothing at all (it yields to
the loop once), so a step's time is the machinery around it: what a vector env adds.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import numpy as np

from openenv_gym.actions import Turn, tool_message, user_message
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.wire import Opening, Outcome, Split, TaskRef, ToolSpec

__all__ = ["LatencyAdapter"]

_instances = itertools.count()


class LatencyAdapter(Adapter):
    """Steps sleep ``lognormal(log(median), sigma)`` seconds (``median=0``: no time); ``turns`` steps an episode."""

    kind = "latency"

    def __init__(self, median: float = 0.02, sigma: float = 1.0, turns: int = 4, seed: int | None = None,
                 num_tasks: int = 1000):
        super().__init__()
        self.median, self.sigma, self.turns, self.tasks = median, sigma, turns, num_tasks
        # Each instance draws its own stream: a vector env builds several adapters from one
        # recipe, and identical streams would make their sub-envs' delays move together.
        self.rng = np.random.default_rng(None if seed is None else [seed, next(_instances)])

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def episode(self) -> Episode:
        return _LatencyEpisode(self)

    async def tools(self) -> list[ToolSpec]:
        return [ToolSpec("wait", "Wait for the environment.", {"type": "object", "properties": {}})]

    async def _fetch_splits(self) -> list[Split]:
        return [Split("train", "train")]

    async def _fetch_num_tasks(self, split: str) -> int:
        return self.tasks

    async def task(self, split: str, index: int) -> dict[str, Any]:
        return {"id": f"{split}-{index}"}

    def delay(self) -> float:
        if self.median <= 0:
            return 0.0
        return float(self.rng.lognormal(np.log(self.median), self.sigma))


class _LatencyEpisode(Episode):
    def __init__(self, adapter: LatencyAdapter):
        self.adapter, self.turn = adapter, 0

    async def start(self, task: TaskRef) -> Opening:
        self.turn = 0
        return Opening([user_message(f"task {task.index}")], await self.adapter.tools(), f"{task.split}/{task.index}")

    async def step(self, turn: Turn) -> Outcome:
        await asyncio.sleep(self.adapter.delay())
        self.turn += 1
        done = self.turn >= self.adapter.turns
        call_id = turn.calls[0].id if turn.calls else "none"
        return Outcome([tool_message(call_id, "wait", "ok")], reward=1.0 if done else 0.0, terminated=done)

    async def aclose(self) -> None:
        pass
