"""Handle: what a vector env's driver holds for each out-of-process shard of sub-envs.

A shard runs in an :class:`~openenv_gym.hosts.shard.EnvHost` somewhere: a Ray actor
(:mod:`openenv_gym.vector.ray`) or an adapter host process (:mod:`openenv_gym.hosts.process`).
The driver (:class:`~openenv_gym.vector.hosted.HostedVectorEnv`) speaks to every kind through
this one interface, so sharding, first-ready delivery, dead-host replacement and cancellation
are written once.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from openenv_gym.errors import HostDied
from openenv_gym.vector.ops import Result
from openenv_gym.wire import ToolSpec

__all__ = ["Handle", "HostDied"]


class Handle(abc.ABC):
    """One shard's host, as the driver sees it. Every coroutine runs on the runtime loop.

    Failures: a method raises :class:`~openenv_gym.errors.HostDied` when the host itself is gone
    (killed, crashed, its node lost), which makes the driver replace it; any other exception is
    the host's code failing, reported and the host kept.
    """

    label: str = "host"
    """How errors name this kind of host (``"Ray actor"``, ``"host process"``)."""

    @abc.abstractmethod
    async def start(self) -> list[ToolSpec]:
        """Start the host's adapters; the tools every task offers."""

    def begin(self, data: bytes) -> Any:
        """Start running the ops ``data`` holds from the caller's thread, if this kind of host
        can (a Ray call can be made from any thread); what :meth:`run` then awaits, or ``None``
        (the default: :meth:`run` starts the call itself, on the loop)."""
        return None

    @abc.abstractmethod
    async def run(self, data: bytes, deliver: Callable[[Result], None], begun: Any = None) -> None:
        """Run the ops ``data`` holds (:func:`~openenv_gym.vector.ops.encode_ops`), or await the
        call :meth:`begin` made for them (``begun``), handing each result to ``deliver`` (as
        each finishes, or all at the end); returns when all are done. Cancelled ops get no
        result."""

    @abc.abstractmethod
    def cancel(self, requests: list[tuple[int, int]]) -> None:
        """Ask the host to cancel these ``(env_id, req_id)`` ops; not awaited."""

    @abc.abstractmethod
    async def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        """``EnvHost.call``: call or read ``name`` on each of the shard's sessions."""

    @abc.abstractmethod
    async def set_attr(self, name: str, values: list[Any]) -> None:
        """``EnvHost.set_attr``."""

    @abc.abstractmethod
    async def pid(self) -> int:
        """The host's process id."""

    @abc.abstractmethod
    async def close(self, timeout: float) -> None:
        """Close the host's sessions and adapters, then end it; it is killed if that takes longer
        than ``timeout`` seconds. Never raises."""

    @abc.abstractmethod
    def kill(self) -> None:
        """End the host at once (it died or hung); never raises."""
