"""The one exception hierarchy of openenv_gym.

Every error the package raises on purpose derives from :class:`OpenEnvGymError`, so a trainer can
catch the package's failures in one place. Each class also derives from the builtin (or Gymnasium)
exception a caller would naturally catch for that situation: a missing source is a
``FileNotFoundError``, a server that cannot be reached a ``ConnectionError``, stepping an episode
that is not running a :class:`gymnasium.error.ResetNeeded`.

Bad *agent* input (malformed tool calls, unknown tools, bad arguments) is never an exception: it
reaches the agent as an observation. These errors are for the trainer and the infrastructure.
"""

from __future__ import annotations

from gymnasium.error import ResetNeeded

__all__ = [
    "OpenEnvGymError",
    "ConfigurationError",
    "SourceNotFound",
    "DetectionError",
    "AmbiguousSource",
    "InvalidName",
    "CatalogError",
    "TaskNotFound",
    "BackendError",
    "BackendUnavailable",
    "BackendTimeout",
    "HostDied",
    "CapacityReached",
    "ServerError",
    "ProvisioningError",
    "EpisodeNotStarted",
    "EpisodeFinished",
    "InvalidAction",
    "EpisodeInterrupted",
    "ConcurrentUse",
    "InheritedEnv",
    "RuntimeClosed",
    "from_wire",
]


class OpenEnvGymError(Exception):
    """Base class of every error raised by openenv_gym."""


class ConfigurationError(OpenEnvGymError, ValueError):
    """The user asked for something that cannot work (bad kwargs, bad split, unknown env name)."""


class SourceNotFound(ConfigurationError, FileNotFoundError):
    """An import source (file or folder) does not exist."""


class DetectionError(ConfigurationError):
    """Static detection found no environment in a source; the message says what was looked for."""


class AmbiguousSource(DetectionError):
    """Static detection found several environments; the message lists them and asks to pick one."""


class InvalidName(ConfigurationError):
    """A name that cannot become part of a Gymnasium id (it holds ``:`` or ``/``, or is empty)."""


class CatalogError(OpenEnvGymError):
    """The user catalog of imported sources is unreadable or an entry is missing."""


class TaskNotFound(ConfigurationError, LookupError):
    """A split or task index the backend does not have."""


class BackendError(OpenEnvGymError):
    """The environment backend (a server, an SDK, an actor) failed."""


class BackendUnavailable(BackendError, ConnectionError):
    """The backend cannot be reached or died (connection refused, process exited)."""


class HostDied(BackendUnavailable):
    """The process hosting an environment (an adapter host under another interpreter, a Ray
    actor) died or stopped answering; it is replaced, and the episodes it held are lost."""


class CapacityReached(BackendUnavailable):
    """Every session a pool or server may hold is in use (``max_sessions``); retry once one ends."""


class BackendTimeout(BackendError, TimeoutError):
    """The backend did not answer within the configured time."""


class ServerError(BackendError):
    """The backend answered with an error of its own (an HTTP 5xx, a failing setup or reward)."""


class ProvisioningError(BackendError):
    """The backend refused to create an environment (unknown env or version, bad credentials,
    no permission, quota reached): retrying cannot help, so it is raised at once with the
    backend's own message."""


class EpisodeNotStarted(OpenEnvGymError, ResetNeeded):
    """``step`` was called before ``reset``."""


class EpisodeFinished(OpenEnvGymError, ResetNeeded):
    """``step`` was called after the episode terminated or was truncated; call ``reset``."""


class InvalidAction(OpenEnvGymError, TypeError):
    """``step`` got a value that is not an action at all (a set, bytes, an arbitrary object): a bug
    in the trainer, not a mistake of the agent. Malformed actions (bad JSON, unknown tools, a
    message that cannot be read) are never raised: the agent gets a message about them."""


class EpisodeInterrupted(OpenEnvGymError, ResetNeeded):
    """The last ``step`` was interrupted (Ctrl-C, a timeout of the caller's): what it started on
    the backend may or may not have happened, so the episode cannot go on; call ``reset``."""


class ConcurrentUse(ConfigurationError, RuntimeError):
    """Two calls ran on one env at once (say from two threads); an env serves one caller at a time."""


class InheritedEnv(ConfigurationError, RuntimeError):
    """An env (or vector env, or pool) used in a process forked from the one that made it: its
    sessions, servers and connections belong to the parent, so the child may only drop it (its
    ``close()`` then releases nothing); make a new env in the child."""


def inherited(what: str, owner: int) -> InheritedEnv:
    """The error for using ``what`` in a process other than ``owner``, its maker."""
    import os

    return InheritedEnv(f"this {what} was made in process {owner}, and this is process {os.getpid()} (a forked "
                        f"child): its sessions and servers belong to the parent; make a new {what} here")


class RuntimeClosed(OpenEnvGymError, RuntimeError):
    """The loop a call needs is gone: the runtime loop was stopped at interpreter exit, or the
    env (whose own loop ran the call) was closed from another thread while the call ran."""


def from_wire(error: dict[str, object]) -> OpenEnvGymError:
    """The exception an ``error`` entry (``{"type", "message"}``, as results carry it) stands for.

    An error that crossed a process boundary (a host, an actor) is raised again as the class of
    this module with that name, so a single env behaves the same in-process and isolated; a name
    from elsewhere (a library's exception) becomes :class:`ServerError` with the name kept.
    """
    name, message = str(error.get("type", "")), str(error.get("message", ""))
    cls = globals().get(name)
    if isinstance(cls, type) and issubclass(cls, OpenEnvGymError):
        return cls(message)
    if name in ("TimeoutError", "asyncio.TimeoutError"):
        return BackendTimeout(message)
    return ServerError(f"{name}: {message}" if name else message)
