"""The named limits on what a server may send, shared by the ORS and OpenEnv transports.

A trainer runs for days against servers it did not write, so nothing a server sends may grow the
client without bound or break it: every answer is counted as it arrives and refused past
``max_response_bytes`` (an ORS response or tool-call stream, an OpenEnv WebSocket message), and
its JSON past ``max_json_depth`` levels of nesting. Both are adapter kwargs with the defaults
below, and every error they raise quotes the kwarg, so the fix is in the message.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, overload

from openenv_gym.errors import ConfigurationError, ServerError

__all__ = ["Limits", "DEFAULT_LIMITS", "DEFAULT_MAX_RESPONSE_BYTES", "DEFAULT_MAX_JSON_DEPTH", "too_large",
           "too_deep", "positive"]

DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
"""The default ``max_response_bytes``: 32 MiB, room for an answer with several large images."""

DEFAULT_MAX_JSON_DEPTH = 100
"""The default ``max_json_depth`` (real answers nest a few levels)."""


class Limits(NamedTuple):
    """What one answer of a server may hold: ``response_bytes`` in all, JSON ``json_depth`` deep."""

    response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    json_depth: int = DEFAULT_MAX_JSON_DEPTH


DEFAULT_LIMITS = Limits()


def too_large(what: str, limit: int, detail: str = "") -> ServerError:
    """The error for an answer over ``max_response_bytes`` (which was dropped, not read whole)."""
    return ServerError(f"{what}: the server's answer is larger than max_response_bytes={limit}{detail}; "
                       "raise the limit if such answers are expected")


def too_deep(what: str, limit: int) -> ServerError:
    """The error for JSON nested deeper than ``max_json_depth``."""
    return ServerError(f"{what}: the server's JSON nests more than max_json_depth={limit} levels")


@overload
def positive(name: str, value: object, *, optional: Literal[False] = False) -> int: ...
@overload
def positive(name: str, value: object, *, optional: bool) -> int | None: ...


def positive(name: str, value: object, *, optional: bool = False) -> int | None:
    """``value`` if it is a positive int (``None`` too when ``optional``), else ConfigurationError."""
    if value is None and optional:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ConfigurationError(f"{name} must be a positive integer")
