"""Keeping secrets out of every spec, repr and message: one place for which kwargs are secret.

Gymnasium's ``make``/``make_vec`` record the merged kwargs on ``env.unwrapped.spec`` (and
``spec.to_json()`` writes them out), so an API key passed as a kwarg would be copied into every
spec, log line or saved config. Envs that take secrets use :class:`RedactedSpec`, whose ``spec``
setter hides secret values before storing; :class:`~openenv_gym.adapters.base.AdapterSpec`'s repr
and :func:`~openenv_gym.registration.env_info` go through :func:`redact_kwargs` too.

A key is secret when its name (any case, ``-`` read as ``_``) is one of :data:`SECRET_KWARGS` or
ends like one (``x_api_key``, ``github_token``); the rule is applied at every depth of nested
dicts, so ``env_args={"api_key": ...}`` is hidden as well. A secret dict keeps its keys (which
secret was passed is useful to see) and loses its values.
"""

from __future__ import annotations

import copy
from typing import Any

from gymnasium.envs.registration import EnvSpec

__all__ = ["SECRET_KWARGS", "HIDDEN", "is_secret", "redact_kwargs", "RedactedSpec", "RedactedEnvSpec"]

SECRET_KWARGS = frozenset({
    "secrets", "secret", "api_key", "apikey", "headers", "env_variables", "token", "access_token",
    "refresh_token", "auth_token", "password", "passwd", "authorization", "auth", "credentials",
    "cookies", "private_key", "client_secret",
})
"""Kwarg names whose values are never shown (compared lower-case, ``-`` as ``_``)."""

_SECRET_SUFFIXES = ("_api_key", "_apikey", "_token", "_secret", "_password", "_credentials")

HIDDEN = "***"
_MAX_DEPTH = 32  # kwargs nested deeper than this are not shown at all (nor walked without bound)


def is_secret(name: object) -> bool:
    """Whether a kwarg (or nested key) called ``name`` holds a secret."""
    if not isinstance(name, str):
        return False
    key = name.lower().replace("-", "_")
    return key in SECRET_KWARGS or key.endswith(_SECRET_SUFFIXES)


def _hide(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: HIDDEN for k in value}
    return HIDDEN if value is not None else None


def _redact(value: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return "..."
    if isinstance(value, dict):
        return {k: (_hide(v) if is_secret(k) else _redact(v, depth + 1)) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(_redact(v, depth + 1) for v in value)
    return value


def redact_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``kwargs`` with the values of secret keys hidden, at any depth."""
    return _redact(kwargs, 0)


def _has_secret(value: Any, depth: int = 0) -> bool:
    if depth > _MAX_DEPTH:
        return True  # not walked further: treat as possibly secret, so it is redacted
    if isinstance(value, dict):
        return any(is_secret(k) or _has_secret(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_secret(v, depth + 1) for v in value)
    return False


class RedactedSpec:
    """Mixin: a ``spec`` attribute that never holds secret kwargs."""

    @property
    def spec(self) -> EnvSpec | None:
        return getattr(self, "_redacted_spec", None)

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        if value is not None and _has_secret(value.kwargs or {}):
            value = copy.copy(value)
            value.kwargs = redact_kwargs(value.kwargs)
        self._redacted_spec = value


class RedactedEnvSpec(EnvSpec):
    """A registry :class:`~gymnasium.envs.registration.EnvSpec` whose repr hides secret kwargs.

    The registered spec must keep the real values (``gym.make`` passes them on), but printing
    ``gym.spec(id)`` must not show them.
    """

    def __repr__(self) -> str:
        shown = copy.copy(self)
        shown.kwargs = redact_kwargs(self.kwargs or {})
        return EnvSpec.__repr__(shown)
