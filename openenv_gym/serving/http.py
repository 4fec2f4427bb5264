"""What both protocol servers do with HTTP: JSON bodies in, JSON answers and errors out.

Request bodies are read within :data:`~openenv_gym.serving.limits.MAX_REQUEST_BYTES` and decoded as plain JSON
(:func:`openenv_gym.wire.loads_plain_json`: no ``NaN``, 64-bit integers, at most
:data:`~openenv_gym.wire.MAX_JSON_DEPTH` levels), then checked against a msgspec shape that
refuses unknown fields, as the SDK servers' pydantic models do. Failures answer as FastAPI does
(``{"detail": ...}``), which is what both ecosystems' clients read: 422 for a body that fails
validation, 400 for the caller's mistakes (a bad split or index), 503 with ``Retry-After`` at
capacity, 504 for a step past ``step_timeout``, 500 for the env's own failures. No answer quotes a
request header; a handler's unexpected exception is a 500 naming its type, never a crash.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from openenv_gym.errors import BackendTimeout, CapacityReached, ConfigurationError, OpenEnvGymError, RuntimeClosed
from openenv_gym.serving.limits import RETRY_AFTER
from openenv_gym.wire import json_encode, loads_plain_json

__all__ = ["Invalid", "read_body", "json_response", "detail", "error_response", "guard", "for_env", "json_errors"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Invalid(Exception):
    """A request body that fails validation: 422."""


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """``data`` as a JSON answer (msgspec: several times faster than ``json.dumps``)."""
    return web.Response(body=json_encode(data), status=status, headers=headers, content_type="application/json")


def detail(status: int, message: Any, headers: dict[str, str] | None = None) -> web.Response:
    return json_response({"detail": message}, status, headers)


async def read_body(request: web.Request, shape: type[Any]) -> Any:
    """The request's JSON body as ``shape`` (a msgspec Struct); :class:`Invalid` if it is not one."""
    raw = await request.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid("the body is not UTF-8") from None
    if not text.strip():
        raise Invalid("the body is empty; a JSON object is expected")
    value, why = loads_plain_json(text)
    if why is not None:
        raise Invalid(why)
    try:
        return msgspec.convert(value, shape)
    except msgspec.ValidationError as exc:
        raise Invalid(str(exc)) from None


def error_response(exc: BaseException) -> web.Response:
    """A failure of the request or of the served env, as the SDK servers answer it."""
    if isinstance(exc, Invalid):
        return detail(422, [{"type": "value_error", "loc": ["body"], "msg": str(exc)}])
    if isinstance(exc, CapacityReached):
        return detail(503, f"at capacity: {exc}; retry later", {"Retry-After": str(RETRY_AFTER)})
    if isinstance(exc, ConfigurationError):  # a bad split, index or option: the caller's to fix
        return detail(400, str(exc))
    if isinstance(exc, RuntimeClosed):
        return detail(503, "the server is stopping")
    if isinstance(exc, BackendTimeout):
        return detail(504, str(exc))
    return detail(500, f"{type(exc).__name__}: {exc}")


def guard(handler: Handler) -> Handler:
    """``handler`` with the package's typed errors and invalid bodies answered by :func:`error_response`."""
    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except (OpenEnvGymError, Invalid) as exc:
            return error_response(exc)
    return guarded


def for_env(name: str, handler: Handler) -> Handler:
    """:func:`guard` of ``handler`` for ``/{env}/...`` routes: another environment's name is 404
    (names match without case, as the SDK servers match them)."""
    async def checked(request: web.Request) -> web.StreamResponse:
        env = request.match_info.get("env")
        if env is not None and env.lower() != name.lower():
            return detail(404, f"unknown environment {env!r}")
        return await handler(request)
    return guard(checked)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error answer as JSON ``{"detail"}`` (aiohttp's own 404, 405 and 413 are text), and an
    unexpected exception as a 500 naming its type: the server goes on."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return detail(exc.status, exc.reason, {k: v for k, v in exc.headers.items() if k.lower() == "allow"})
    except Exception as exc:  # noqa: BLE001 - a bug must answer this request, not stop the server
        return detail(500, f"Internal Server Error ({type(exc).__name__})")
