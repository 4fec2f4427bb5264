"""The two protocols every backend implements: an Adapter (tasks and tools) and its Episodes.

An :class:`Adapter` is one connection to one environment: it knows the splits, the tasks and the
tools, and it makes :class:`Episode` objects. Many episodes share one adapter, which is how 64
sub-envs of a vector env share one server process and one connection pool. Everything here is
``async``; the sync Gymnasium surface lives in :mod:`openenv_gym.env`.

Data flows one way: env -> adapter/episode -> the outside system.
"""

from __future__ import annotations

import abc
import difflib
import importlib
import inspect
from collections.abc import Callable, Collection, Iterable
from typing import Any

import msgspec

from openenv_gym.actions import Turn
from openenv_gym.errors import ConfigurationError, TaskNotFound
from openenv_gym.redact import redact_kwargs
from openenv_gym.wire import Opening, Outcome, Split, TaskRef, ToolSpec

__all__ = ["Adapter", "AdapterSpec", "Episode", "accepted_kwargs", "check_kwargs"]


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
    caller_thread: bool = False
    """True when a single env may run this adapter on a loop of its own, driven by the caller's
    thread during each call (:class:`~openenv_gym.runtime.CallerLoop`), instead of hopping to the
    runtime loop's thread: its work happens inside the calls, in this process (no server it
    launches, no background task that must run on time between calls), nothing it holds is
    shared with another env, and its connections need between calls at most the passes of
    :attr:`idle_pass`."""
    idle_pass: float | None = None
    """With :attr:`caller_thread`: seconds between the passes made over the env's own loop while
    no call runs, so its connections answer pings (``None``: it holds no connection)."""

    open_files_per_session: float = 2.0
    """Open files this process holds for one live session of the adapter, for the shard's check
    of its limit before it starts (a server's own sockets count in the server's process). The
    default allows a connection and one more of the env's own; an adapter that knows better says
    so, so that a configuration is refused only for files it would really open."""

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


def _shown(name: object) -> str:
    text = repr(name)
    return text if len(text) <= 60 else text[:57] + "..."


HIDDEN_KWARGS = frozenset({"startup_timeout"})
"""Adapter parameters the user does not name: ``startup_timeout`` (how long a local server may take
to answer) is set from the env's ``start_timeout``, one name for the wait (the old one still works,
with a DeprecationWarning)."""


def check_kwargs(names: Iterable[str], accepted: Collection[str], what: str, *, also: Collection[str] = ()) -> None:
    """Raise :class:`ConfigurationError` if a name in ``names`` is not in ``accepted``.

    The message lists the unknown *names* with close matches (difflib) among ``accepted`` and
    ``also`` (names the caller takes elsewhere, such as the env's own), and never a value:
    Gymnasium formats a ``TypeError`` from an env creator with every kwarg, a secret included,
    so a wrong name must be refused here first, as a ``ValueError``.
    """
    known = (set(accepted) | set(also)) - HIDDEN_KWARGS
    unknown = [n for n in names if n not in accepted]
    if not unknown:
        return
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(str(name), sorted(known), n=2, cutoff=0.6)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        parts.append(_shown(name) + hint)
    plural = "s" if len(unknown) > 1 else ""
    raise ConfigurationError(f"unknown keyword argument{plural} {', '.join(parts)}; known for {what}: "
                             f"{', '.join(sorted(known))}")


def accepted_kwargs(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword names ``fn`` (a class: its constructor) accepts; ``None`` if it takes ``**kwargs``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): cannot check
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


class AdapterSpec(msgspec.Struct):
    """How to build an adapter: ``"module:Class"`` and its kwargs.

    A recipe rather than an instance because a vector env builds several adapters (one per
    connection pool) and a Ray actor builds its own in another process.

    ``entry`` names an :class:`Adapter` subclass, or a *front door*: a function that takes the
    same kwargs and returns the ``AdapterSpec`` of the class to build (Verifiers picks its
    generation's adapter this way); :meth:`resolve` follows front doors to the class. The repr
    hides secret kwargs (:mod:`openenv_gym.redact`), since a spec ends up in messages and logs.
    """

    entry: str
    kwargs: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"AdapterSpec(entry={self.entry!r}, kwargs={redact_kwargs(self.kwargs)!r})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:  # msgspec.Struct's own returns a list
        return [("entry", self.entry), ("kwargs", redact_kwargs(self.kwargs))]

    def target(self) -> Callable[..., Any]:
        """The class or front door ``entry`` names, imported."""
        module, sep, name = self.entry.partition(":")
        if not sep or not module or not name:
            raise ConfigurationError(f"an adapter entry is 'module:Class', not {_shown(self.entry)}")
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise ConfigurationError(f"module {module!r} has no {name!r} (adapter entry {self.entry!r})") from None
        if not callable(obj):
            raise ConfigurationError(f"adapter entry {self.entry!r} is not a class or a function")
        return obj

    def resolve(self) -> AdapterSpec:
        """The spec of the :class:`Adapter` class to build, front doors followed (cheap: nothing starts)."""
        spec = self
        for _ in range(8):
            target = spec.target()
            if isinstance(target, type):
                return spec
            spec.check()
            made = target(**spec.kwargs)
            if not isinstance(made, AdapterSpec):
                raise ConfigurationError(
                    f"adapter entry {spec.entry!r} is a function that returned {type(made).__name__}; "
                    "name an Adapter class, or a function returning an AdapterSpec")
            spec = made
        raise ConfigurationError(f"adapter entry {self.entry!r}: front doors lead to front doors")

    def check(self, also: Collection[str] = ()) -> None:
        """Refuse kwargs the target does not take (names only, see :func:`check_kwargs`).

        ``also`` are names the caller takes elsewhere (the env's own), offered as suggestions.
        """
        target = self.target()
        accepted = accepted_kwargs(target)
        if accepted is not None:
            what = getattr(target, "__name__", self.entry)
            check_kwargs(self.kwargs, accepted, what, also=also)

    def accepted_here(self) -> frozenset[str] | None:
        """The kwargs the target takes, or ``None`` if it takes any or cannot be imported in this
        process (an adapter run in a host under another interpreter may need packages only that
        interpreter has; the host checks its kwargs there)."""
        try:
            return accepted_kwargs(self.target())
        except ImportError:
            return None

    def build(self) -> Adapter:
        """A new, not yet started adapter (a front door's choice, for a front door)."""
        target = self.target()
        self.check()
        made = target(**self.kwargs)
        # A front door answers with the spec of its choice; an older-style factory with the adapter.
        return made.build() if isinstance(made, AdapterSpec) else made
