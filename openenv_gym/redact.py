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

URLs in text (an error, a plan, a recorded origin) go through :func:`redact_urls`: the user and
password of every URL are removed and the values of secret query parameters (``access_token``,
``private_token``, ``sig`` ...) replaced by ``***``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from gymnasium.envs.registration import EnvSpec

__all__ = ["SECRET_KWARGS", "SECRET_QUERY_KEYS", "HIDDEN", "is_secret", "is_secret_query_key", "redact_kwargs",
           "redact_urls", "RedactedSpec", "RedactedEnvSpec"]

SECRET_KWARGS = frozenset({
    "secrets", "secret", "api_key", "apikey", "headers", "env_variables", "token", "access_token",
    "refresh_token", "auth_token", "password", "passwd", "authorization", "auth", "credentials",
    "cookies", "private_key", "client_secret",
})
"""Kwarg names whose values are never shown (compared lower-case, ``-`` as ``_``)."""

_SECRET_SUFFIXES = ("_api_key", "_apikey", "_token", "_secret", "_password", "_credentials")

SECRET_QUERY_KEYS = frozenset({
    "key", "sig", "signature", "code", "x_amz_signature", "x_amz_credential", "x_amz_security_token",
    "x_goog_signature", "x_goog_credential",
})
"""URL query parameters that carry a secret besides the :data:`SECRET_KWARGS` names (signed URLs)."""

HIDDEN = "***"
_MAX_DEPTH = 32  # kwargs nested deeper than this are not shown at all (nor walked without bound)


def is_secret(name: object) -> bool:
    """Whether a kwarg (or nested key) called ``name`` holds a secret."""
    if not isinstance(name, str):
        return False
    key = name.lower().replace("-", "_")
    return key in SECRET_KWARGS or key.endswith(_SECRET_SUFFIXES)


def is_secret_query_key(name: str) -> bool:
    """Whether a URL query parameter called ``name`` carries a secret (``access_token``, ``X-Amz-Signature``)."""
    return is_secret(name) or name.lower().replace("-", "_") in SECRET_QUERY_KEYS


# A URL as it appears in running text: a scheme, then everything up to whitespace or a quote.
_URL = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://)([^\s\"'<>`]*)")
_QUERY_PAIR = re.compile(r"([^&;=#]+)=([^&;#]*)")


def _redact_url(match: re.Match[str]) -> str:
    scheme, rest = match[1], match[2]
    # The userinfo ends at the *last* "@" before the path: a password may hold "@", "?" or "#"
    # that nobody percent-encoded, and none of it may survive.
    slash = rest.find("/")
    at = rest.rfind("@", 0, slash if slash != -1 else len(rest))
    if at != -1:
        rest = rest[at + 1:]
    query = rest.find("?")
    if query != -1:
        fragment = rest.find("#", query)
        end = fragment if fragment != -1 else len(rest)
        hidden = _QUERY_PAIR.sub(lambda m: f"{m[1]}={HIDDEN}" if is_secret_query_key(m[1]) else m[0],
                                 rest[query + 1:end])
        rest = rest[:query + 1] + hidden + rest[end:]
    return scheme + rest


def redact_urls(text: str) -> str:
    """``text`` with every URL's user and password removed and its secret query values hidden.

    >>> redact_urls("see https://u:p@host/x?access_token=t&page=2")
    'see https://host/x?access_token=***&page=2'
    """
    return _URL.sub(_redact_url, text)


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
