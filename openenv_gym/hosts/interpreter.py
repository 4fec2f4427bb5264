"""Interpreter: which Python a host process runs, named where it is known and resolved where it runs.

``gym.make(id, python=PATH)`` names a path. ``isolate=True`` names the env's own venv, which is
built (or found in the cache) by :func:`openenv_gym.isolation.venvs.python_for` on the machine
that runs the host: for a Ray actor on another node, that is the node, not the driver.
"""

from __future__ import annotations

import msgspec

__all__ = ["Interpreter"]


class Interpreter(msgspec.Struct, frozen=True, omit_defaults=True):
    """A path (``path``), or the venv of a source of ``kind`` (``source``, ``sdk``, ``version``)."""

    path: str | None = None
    kind: str | None = None
    source: str | None = None
    sdk: str | None = None
    version: str | None = None
    """A Python version for the venv (``"3.12"``; default: the driver's interpreter)."""

    def resolve(self) -> str:
        """The interpreter's path, building the venv first if it is not built yet (minutes, once)."""
        if self.path is not None:
            return self.path
        from openenv_gym.isolation.venvs import python_for

        return python_for(self.kind or "", self.source, sdk=self.sdk, python=self.version)

    def __str__(self) -> str:
        return self.path or f"the venv of {self.source or self.kind}"
