"""What a driver asks of a sub-env, and what it gets back: ops, results, and running one.

An :class:`Op` is one request for one sub-env (reset, step, or step-then-reset for SAME_STEP
autoreset); a :class:`Result` is its answer. Both are msgspec Structs: in the same process they
pass as objects, and only where they cross a process boundary (a host process, a Ray actor) are
they encoded, as msgpack (:func:`encode_ops`, :func:`encode_results`). :func:`run_op` executes an
op against an :class:`~openenv_gym.session.EnvSession` and never raises for a backend failure:
the failure becomes ``Result.error`` with the sub-env truncated, so one broken sub-env never stops
the others. Every shard, wherever it runs, runs ops through this one function.
"""

from __future__ import annotations

import asyncio
import enum
import errno
from collections.abc import Iterable
from typing import Any

import msgspec

from openenv_gym.actions import Turn
from openenv_gym.adapters.games import Moves
from openenv_gym.errors import ConfigurationError
from openenv_gym.processes import open_files_limit
from openenv_gym.runtime import Deadlines
from openenv_gym.runtime import within as _within
from openenv_gym.session import EnvSession, GameSession
from openenv_gym.wire import Message, decode_with

__all__ = [
    "OpKind", "Op", "Result", "run_op", "run_game_op", "error_dict", "failed", "call_each",
    "encode_ops", "decode_ops", "encode_results", "decode_results", "encodable", "ENCODE_ERRORS",
]

ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError)
"""What encoding a value msgpack cannot carry raises (an object, a huge int, deep nesting)."""


class OpKind(enum.IntEnum):
    """What an :class:`Op` asks (an int on the wire: one byte)."""

    RESET = 0
    STEP = 1
    STEP_RESET = 2
    """Step, and if that ends the episode, reset in the same request (SAME_STEP autoreset)."""
    END = 3
    """End the running episode (its backend session is released); the sub-env waits for a reset."""


class Op(msgspec.Struct, array_like=True, omit_defaults=True):
    """One request for one sub-env."""

    env_id: int
    req_id: int
    kind: OpKind
    action: Any = None
    seed: int | None = None
    options: dict[str, Any] | None = None
    note: dict[str, Any] | None = None
    """An ``error`` entry to report with this op's result (why a reset was forced)."""
    recreate: bool = False
    """Replace the sub-env's session before running (its previous request failed)."""
    next_seed: int | None = None
    """For ``STEP_RESET``: the seed of the next episode if this step ends the current one (a
    group's shared task, see :mod:`openenv_gym.vector.groups`)."""
    turn: Turn | None = None
    """The action already parsed (a driver that ships ops to another process sends this rather
    than the raw action: a parsed turn always encodes, whatever the model wrote; a served session
    sends both, having parsed it to check the call). Sub-envs with wrappers take ``action``."""
    turns: dict[str, Turn] | None = None
    """A game's ``STEP``: the turns of the seats it answers, parsed on the driver (a game is one
    session; the seats it waits on are its pending ops)."""


class Result(msgspec.Struct, array_like=True, omit_defaults=True):
    """The answer to an :class:`Op`."""

    env_id: int
    req_id: int
    obs: list[Message]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = {}
    error: dict[str, Any] | None = None
    """Set when the backend failed; the sub-env was truncated and must be recreated."""
    moves: Moves | None = None
    """A game's answer: where it stands once it settled (whom it waits on, who is paid)."""


def error_dict(exc: BaseException, message: str | None = None) -> dict[str, Any]:
    """``exc`` as a result's ``error`` entry: its type name and message (``message`` overrides).

    A failure caused by the process running out of file descriptors says so (the transport's own
    message names only the connection that failed)."""
    error: dict[str, Any] = {"type": type(exc).__name__, "message": message or str(exc)}
    if _out_of_files(exc):
        soft, _ = open_files_limit()
        error["message"] += (f" [the process ran out of file descriptors (too many open files; its limit is "
                             f"{soft}): raise it with `ulimit -n`, or spread the sub-envs over processes]")
    if isinstance(exc, ConfigurationError):
        error["user"] = True  # the caller's mistake (a bad split or option): reset() raises it
    return error


def _out_of_files(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def failed(op: Op, error: dict[str, Any]) -> Result:
    """The answer to ``op`` when it could not run: truncated, no observation, ``info["error"]``."""
    return Result(op.env_id, op.req_id, [], 0.0, False, True, {"error": error}, error=error)


async def run_op(session: EnvSession, op: Op, timeout: float | None = None, wrapped: Any = None,
                 deadlines: Deadlines | None = None) -> Result:
    """Execute ``op`` on ``session``; failures and timeouts become ``Result.error``.

    ``STEP_RESET`` is SAME_STEP autoreset done where the env lives, so it costs one round trip:
    the step's final observation and info go into ``info["final_obs"]``/``info["final_info"]``
    and the returned observation is the next episode's first. ``wrapped``: ``(SubEnvWrappers,
    env)``, the sub-env's wrapper stack over ``session``, which then takes every reset and step.
    ``deadlines``: the caller's shared timer for ``timeout`` (many ops in flight at once).
    """
    within = _within if deadlines is None else deadlines.within
    if wrapped is None:
        reset: Any = session.reset
        step: Any = session.step
    else:
        runner, env = wrapped

        def reset(seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            return runner.run(env.reset, seed=seed, options=options)

        def step(action: Any) -> Any:
            return runner.run(env.step, action)
    try:
        if op.kind is OpKind.END:
            await within(session.aclose(), timeout, "ending the sub-env's episode")
            return Result(op.env_id, op.req_id, [])
        if op.kind is OpKind.RESET:
            obs, info = await within(reset(op.seed, op.options), timeout, "the sub-env's reset")
            if op.note:
                info = {**info, **op.note}
            return Result(op.env_id, op.req_id, obs, info=info)
        # A wrapper stack takes the action as the model wrote it (it may rewrite it before parsing)
        action = op.turn if op.turn is not None and (wrapped is None or op.action is None) else op.action
        obs, reward, terminated, truncated, info = await within(step(action), timeout, "the sub-env's step")
        if op.kind is OpKind.STEP_RESET and (terminated or truncated):
            final = {"final_obs": obs, "final_info": info}
            try:
                obs, info = await within(reset(op.next_seed), timeout, "the sub-env's autoreset")
            except Exception as exc:  # the step happened; only the reset failed
                return Result(op.env_id, op.req_id, [], reward, terminated, truncated,
                              {**final, "error": error_dict(exc)}, error=error_dict(exc))
            info = {**info, **final}
        return Result(op.env_id, op.req_id, obs, reward, terminated, truncated, info)
    except Exception as exc:  # the adapter's own timeouts keep their message (and its limit)
        err = error_dict(exc)
    return failed(op, err)


async def run_game_op(session: GameSession, op: Op, timeout: float | None = None,
                      deadlines: Deadlines | None = None) -> Result:
    """Execute ``op`` on a game: ``RESET`` starts one (``seed``, ``options``), ``STEP`` answers
    the seats in ``op.turns``, ``END`` ends it. The answer is the game's :class:`Moves`; a failure
    or a timeout becomes ``Result.error``, as for :func:`run_op`, and a caller's mistake (an
    action for a seat that was not asked) is marked ``user``."""
    within = _within if deadlines is None else deadlines.within
    try:
        if op.kind is OpKind.END:
            await within(session.end_game(), timeout, "ending the game")
            return Result(op.env_id, op.req_id, [])
        if op.kind is OpKind.RESET:
            moves = await within(session.reset(op.seed, op.options), timeout, "the game's reset")
        else:
            moves = await within(session.act(op.turns or {}), timeout, "the game's step")
        return Result(op.env_id, op.req_id, [], moves=moves)
    except Exception as exc:
        return failed(op, error_dict(exc))


async def call_each(sessions: Iterable[EnvSession], name: str, args: tuple, kwargs: dict) -> list[Any]:
    """``VectorEnv.call`` on the sessions: call ``name`` (awaiting coroutines) or read it, in order."""
    out = []
    for session in sessions:
        attr = getattr(session, name)
        if callable(attr):
            attr = attr(*args, **kwargs)
            if asyncio.iscoroutine(attr):
                attr = await attr
        out.append(attr)
    return out


_ops_decoder = msgspec.msgpack.Decoder(list[Op])
_results_decoder = msgspec.msgpack.Decoder(list[Result])
_encoder = msgspec.msgpack.Encoder()


def encode_ops(ops: list[Op]) -> bytes:
    return _encoder.encode(ops)


def decode_ops(data: bytes) -> list[Op]:
    return decode_with(_ops_decoder, data)


def encode_results(results: list[Result]) -> bytes:
    """``results`` as msgpack; a result that cannot be encoded (an info holding an object) is sent
    as a truncated error result instead, so one sub-env's odd info never loses the others'."""
    try:
        return _encoder.encode(results)
    except ENCODE_ERRORS:
        return _encoder.encode([encodable(r) for r in results])


def decode_results(data: bytes) -> list[Result]:
    return decode_with(_results_decoder, data)


def encodable(result: Result) -> Result:
    """``result``, or a truncated error result if it cannot be sent (an info holding an object)."""
    try:
        _encoder.encode(result)
        return result
    except ENCODE_ERRORS as exc:
        error = {"type": "EncodeError", "message": f"the sub-env's result cannot be sent to the driver: {exc}"}
        return Result(result.env_id, result.req_id, [], 0.0, False, True, {"error": error}, error=error)
