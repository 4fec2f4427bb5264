"""Keeping secrets out of ``env.spec``: one place for which kwargs are secret and how they are hidden.

Gymnasium's ``make``/``make_vec`` record the merged kwargs on ``env.unwrapped.spec`` (and
``spec.to_json()`` writes them out), so an API key passed as a kwarg would be copied into every
spec, log line or saved config. Envs that take secrets use :class:`RedactedSpec`, whose ``spec``
setter replaces secret values with ``"***"`` before storing.
"""

from __future__ import annotations

import copy
from typing import Any

from gymnasium.envs.registration import EnvSpec

__all__ = ["SECRET_KWARGS", "redact_kwargs", "RedactedSpec"]

SECRET_KWARGS = frozenset({"secrets", "api_key", "headers", "env_variables"})


def _hide(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "***" for k in value}
    return "***" if value is not None else None


def redact_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the values of secret keys hidden."""
    return {k: (_hide(v) if k in SECRET_KWARGS else v) for k, v in kwargs.items()}


class RedactedSpec:
    """Mixin: a ``spec`` attribute that never holds secret kwargs."""

    @property
    def spec(self) -> EnvSpec | None:
        return getattr(self, "_redacted_spec", None)

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        if value is not None and any(k in (value.kwargs or {}) for k in SECRET_KWARGS):
            value = copy.copy(value)
            value.kwargs = redact_kwargs(value.kwargs)
        self._redacted_spec = value
