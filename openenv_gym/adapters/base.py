"""The two protocols every backend implements: an Adapter (tasks and tools) and its Episodes.

An :class:`Adapter` is one connection to one environment: it knows the splits, the tasks and the
tools, and it makes :class:`Episode` objects. Many episodes share one adapter, which is how 64
sub-envs of a vector env share one server process and one connection pool. Everything here is
``async``; the sync Gymnasium surface lives in :mod:`openenv_gym.env`.

Data flows one way: env -> adapter/episode -> the outside system.
"""

from __future__ import annotations

import abc
import importlib
from typing import Any

import msgspec

from openenv_gym.actions import Turn
from openenv_gym.errors import TaskNotFound
from openenv_gym.wire import Opening, Outcome, Split, TaskRef, ToolSpec

__all__ = ["Adapter", "AdapterSpec", "Episode"]


class Episode(abc.ABC):
    """One episode of one task: started once, stepped until it ends, then closed."""

    @abc.abstractmethod
    async def start(self, task: TaskRef) -> Opening:
        """Start the episode on ``task`` and return the opening messages and tools."""

    @abc.abstractmethod
    async def step(self, turn: Turn) -> Outcome:
        """Apply the agent's interpreted action and return what it produced."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release the episode's backend resources. Idempotent; never raises for a dead backend."""


class Adapter(abc.ABC):
    """A backend environment: task provider and episode factory.

    Subclasses implement the ``_fetch_*`` methods; this base caches splits and task counts, which
    never change for a running backend, so seeded task choice costs no round trip per reset.
    """

    kind: str = "base"

    def __init__(self) -> None:
        self._splits: list[Split] | None = None
        self._num_tasks: dict[str, int] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    @abc.abstractmethod
    async def start(self) -> None:
        """Connect to (or launch) the backend. Called once before anything else."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release the backend. Idempotent."""

    @abc.abstractmethod
    def episode(self) -> Episode:
        """A new, not yet started episode."""

    # -- tools and tasks -------------------------------------------------------------------------
    @abc.abstractmethod
    async def tools(self) -> list[ToolSpec]:
        """The tools every task offers (a task may add more at ``Episode.start``)."""

    @abc.abstractmethod
    async def _fetch_splits(self) -> list[Split]: ...

    @abc.abstractmethod
    async def _fetch_num_tasks(self, split: str) -> int: ...

    @abc.abstractmethod
    async def task(self, split: str, index: int) -> dict[str, Any]:
        """The task spec at ``index`` of ``split`` (may hold answers: never show it to the agent)."""

    def info(self) -> dict[str, Any]:
        """Backend metadata for ``info`` at reset (no secrets)."""
        return {"backend": self.kind}

    async def splits(self) -> list[Split]:
        """The splits, in the backend's order."""
        if self._splits is None:
            self._splits = await self._fetch_splits()
        return self._splits

    async def default_split(self) -> str:
        """The first split of type ``train``, else the first split."""
        splits = await self.splits()
        if not splits:
            raise TaskNotFound("the environment has no splits")
        return next((s.name for s in splits if s.type == "train"), splits[0].name)

    async def num_tasks(self, split: str) -> int:
        """How many tasks ``split`` holds."""
        if split not in self._num_tasks:
            names = [s.name for s in await self.splits()]
            if split not in names:
                raise TaskNotFound(f"unknown split {split!r}; the splits are {names}")
            self._num_tasks[split] = await self._fetch_num_tasks(split)
        return self._num_tasks[split]


class AdapterSpec(msgspec.Struct):
    """How to build an adapter: ``"module:Class"`` and its kwargs.

    A recipe rather than an instance because a vector env builds several adapters (one per
    connection pool) and a Ray actor builds its own in another process.
    """

    entry: str
    kwargs: dict[str, Any] = {}

    def build(self) -> Adapter:
        """A new, not yet started adapter."""
        module, _, name = self.entry.partition(":")
        return getattr(importlib.import_module(module), name)(**self.kwargs)
