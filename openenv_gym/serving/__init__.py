"""Serving: any registered id behind a protocol server, ORS or OpenEnv, for other ecosystems' clients.

``openenv-gym serve ID --protocol ors|openenv`` (or :func:`serve` / :func:`served`): each client
session is a session of the id's :class:`~openenv_gym.pool.SessionPool`, so what the shards do
(deadlines, recreation, isolation, Ray placement) serves clients too. One module per protocol
(:mod:`~openenv_gym.serving.ors`, :mod:`~openenv_gym.serving.openenv`), the session logic they
share (:mod:`~openenv_gym.serving.sessions`, :mod:`~openenv_gym.serving.content`), the task API
(:mod:`~openenv_gym.serving.tasks`), HTTP bodies and errors (:mod:`~openenv_gym.serving.http`),
access (:mod:`~openenv_gym.serving.access`), named limits (:mod:`~openenv_gym.serving.limits`),
the server's lifetime (:mod:`~openenv_gym.serving.server`) and the command
(:mod:`~openenv_gym.serving.command`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Server", "ServedURL", "serve", "served"]


def __getattr__(name: str) -> Any:
    # The server (aiohttp, the pool) loads on first use: the command line reads only the limits.
    if name in __all__:
        from openenv_gym.serving import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
