"""Reading the agent's action, and the messages that tell the agent what was wrong with it.

An action is assistant text (a ``str``), an OpenAI assistant message (a ``dict``, optionally with
``tool_calls`` whose ``arguments`` are a JSON string or a dict) or an :class:`AssistantMessage`.

What is answered and what is raised:

* Whatever a model can be made to write is *answered*, never raised. Agents make mistakes
  (invalid JSON, a tool that does not exist, NaN or a 5,000-digit number in the arguments, lone
  surrogates, JSON nested 100,000 deep, a ``tool_calls`` that is not a list); those are part of
  learning, so :func:`parse_action` records each problem in ``Turn.error`` (the message cannot be
  read) or ``ParsedCall.error`` (one call cannot run) and the adapter answers it with a short
  message the agent can read: reward 0, the episode goes on. This covers a ``str``, any ``dict``
  whatever it holds (a set or an object inside a message is a malformed message), and the other
  JSON values a trainer may get by decoding model output (``None``, a number, a boolean, a list).
* A value that is not an action at all, because no decoding of model output produces it (a set,
  bytes, a tuple, a numpy array, any other object), is a bug in the trainer: :func:`parse_action`
  raises :class:`~openenv_gym.errors.InvalidAction` (a ``TypeError``). :func:`check_action_type`
  applies only this rule, cheaply, for callers that must refuse such values before dispatching
  them (a vector env's ``send``).

What a :class:`Turn` guarantees, so that every backend can send it as it is (httpx ``json=``, MCP,
Verifiers' ``json.loads``, msgpack between processes): every string in it (text, ids, names, raw
arguments, errors) is valid Unicode; ids and names are at most :data:`MAX_NAME_LENGTH` characters;
every ``arguments`` is plain JSON as :func:`openenv_gym.wire.to_plain_json` defines it (``str``
keys, finite floats, 64-bit integers, nesting at most :data:`~openenv_gym.wire.MAX_JSON_DEPTH`
deep). Messages quote at most a few dozen characters of what the agent wrote.
"""

from __future__ import annotations

from typing import Any

import msgspec

from openenv_gym.errors import InvalidAction
from openenv_gym.wire import (
    AssistantMessage,
    FunctionCall,
    Message,
    Outcome,
    ToolCall,
    ToolSpec,
    clip,
    loads_plain_json,
    to_plain_json,
    unicode_problem,
)

__all__ = [
    "ParsedCall",
    "Turn",
    "parse_action",
    "check_action_type",
    "check_call",
    "tool_message",
    "user_message",
    "unreadable_reply",
    "no_tool_call",
    "refuse_call",
    "MAX_NAME_LENGTH",
]

MAX_NAME_LENGTH = 256
"""Longest tool name or tool-call id accepted (OpenAI allows 64-character names, MCP 128)."""

_ACTION_TYPES = (str, dict, AssistantMessage)
_JSON_NON_ACTIONS = (list, int, float)  # bool is an int; None is tested apart
_JSON_TYPE_NAMES = {type(None): "null", bool: "a boolean", int: "a number", float: "a number",
                    list: "an array", str: "a string", dict: "an object"}


class ParsedCall(msgspec.Struct):
    """One tool call, its arguments decoded; ``error`` says why it cannot run as written."""

    id: str
    name: str
    arguments: dict[str, Any] | None
    error: str | None = None
    raw_arguments: str | None = None
    """The arguments exactly as the agent wrote them, when they were a (valid Unicode) string:
    backends that parse arguments themselves (Verifiers' ToolEnv) answer bad JSON in their own
    words."""


class Turn(msgspec.Struct):
    """The agent's action, interpreted: its text, its tool calls, or why it could not be read."""

    text: str | None
    calls: list[ParsedCall]
    error: str | None = None


class _Unreadable(Exception):
    """A problem that makes the whole message unreadable (becomes ``Turn.error``)."""


def _kind(value: Any) -> str:
    """How to name ``value``'s type to the agent: in JSON terms where it has one."""
    for t, name in _JSON_TYPE_NAMES.items():
        if isinstance(value, t):
            return name
    return f"a {type(value).__name__}"


def check_action_type(action: Any) -> None:
    """Raise :class:`~openenv_gym.errors.InvalidAction` if ``action`` is not an action at all.

    Only the type is looked at (constant time, never the contents): a ``str``, a ``dict``, an
    :class:`AssistantMessage` and the other JSON values (``None``, numbers, booleans, lists) pass,
    because :func:`parse_action` answers them with a message to the agent; anything else (a set,
    bytes, a tuple, an arbitrary object) raises. A vector env calls this in ``send`` so a trainer's
    bug surfaces there instead of ending a sub-env's episode.
    """
    if action is None or isinstance(action, _ACTION_TYPES) or isinstance(action, _JSON_NON_ACTIONS):
        return
    kind = type(action)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    raise InvalidAction(
        f"an action must be assistant text (str) or an assistant message (dict or AssistantMessage), not {name}"
    )


def parse_action(action: Any) -> Turn:
    """Interpret ``action`` (str, OpenAI assistant message dict, or :class:`AssistantMessage`).

    Never raises for anything a model could have written (see the module docs); raises
    :class:`~openenv_gym.errors.InvalidAction` for a value that is not an action at all.
    """
    if isinstance(action, str):
        why = unicode_problem(action)
        if why is not None:
            return Turn(text=None, calls=[], error=f"the text holds {why}")
        return Turn(text=str(action), calls=[])  # str(): a subclass (numpy.str_) as a plain str
    if isinstance(action, (dict, AssistantMessage)):
        try:
            return _parse_message(action)
        except _Unreadable as exc:
            return Turn(text=None, calls=[], error=str(exc))
        except Exception as exc:  # a dict subclass whose own methods fail: still the agent's turn
            return Turn(text=None, calls=[], error=f"the message could not be read ({type(exc).__name__})")
    check_action_type(action)
    return Turn(text=None, calls=[], error=f"the action must be assistant text or an assistant message object, "
                                           f"not {_kind(action)}")


def _get(obj: Any, key: str, struct: type) -> Any:
    if isinstance(obj, dict):
        return obj.get(key)
    if isinstance(obj, struct):
        return getattr(obj, key, None)
    return None


def _parse_message(message: dict[str, Any] | AssistantMessage) -> Turn:
    text = _text_of(_get(message, "content", AssistantMessage))
    raw_calls = _get(message, "tool_calls", AssistantMessage)
    if raw_calls is None:
        return Turn(text=text, calls=[])
    if not isinstance(raw_calls, (list, tuple)):
        raise _Unreadable(f"tool_calls must be a list of tool calls, not {_kind(raw_calls)}")
    calls = [_parse_call(n, raw) for n, raw in enumerate(raw_calls)]
    return Turn(text=text, calls=calls)


def _text_of(content: Any) -> str | None:
    """The message's text: ``content`` as a string, or its ``text`` parts joined by newlines."""
    if content is None:
        return None
    if isinstance(content, str):
        why = unicode_problem(content)
        if why is not None:
            raise _Unreadable(f"the content holds {why}")
        return str(content)
    if not isinstance(content, (list, tuple)):
        raise _Unreadable(f"content must be a string, a list of content parts or null, not {_kind(content)}")
    parts = []
    for n, part in enumerate(content):
        if not isinstance(part, dict):
            raise _Unreadable(f"content part {n} must be an object, not {_kind(part)}")
        kind = part.get("type")
        if not (isinstance(kind, str) and kind == "text"):
            continue  # images and other parts carry no text
        text = part.get("text")
        if not isinstance(text, str):
            raise _Unreadable(f"the text of content part {n} must be a string, not {_kind(text)}")
        why = unicode_problem(text)
        if why is not None:
            raise _Unreadable(f"the text of content part {n} holds {why}")
        parts.append(str(text))
    return "\n".join(parts)


def _name(value: Any, what: str, n: int) -> str:
    if not isinstance(value, str):
        raise _Unreadable(f"the {what} of tool call {n} must be a string, not {_kind(value)}")
    if len(value) > MAX_NAME_LENGTH:
        raise _Unreadable(f"the {what} of tool call {n} is {len(value)} characters long "
                          f"(at most {MAX_NAME_LENGTH}): {clip(value, 40)}")
    why = unicode_problem(value)
    if why is not None:
        raise _Unreadable(f"the {what} of tool call {n} holds {why}")
    return str(value)


def _parse_call(n: int, raw: Any) -> ParsedCall:
    if not isinstance(raw, (dict, ToolCall)):
        raise _Unreadable(f"tool call {n} must be an object with a function, not {_kind(raw)}")
    function = _get(raw, "function", ToolCall)
    if not isinstance(function, (dict, FunctionCall)):
        raise _Unreadable(f"tool call {n} must have a function object with a name, not {_kind(function)}")
    name = _name(_get(function, "name", FunctionCall), "function name", n)
    call_id = _get(raw, "id", ToolCall)
    if call_id is None or (isinstance(call_id, str) and not call_id):
        call_id = f"call_{n}"
    else:
        call_id = _name(call_id, "id", n)
    arguments, error, raw_arguments = _arguments(_get(function, "arguments", FunctionCall))
    return ParsedCall(call_id, name, arguments, error, raw_arguments)


def _arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """``(arguments, error, raw string)`` for the ``arguments`` the agent wrote."""
    if raw is None or (isinstance(raw, str) and not raw):
        return {}, None, None
    why: str | None
    if isinstance(raw, str):
        bad = unicode_problem(raw)
        if bad is not None:
            value, why = None, f"the text holds {bad}"
            raw = None  # cannot be forwarded to any backend as written
        else:
            value, why = loads_plain_json(raw)
    elif isinstance(raw, dict):
        value, why = to_plain_json(raw)
        raw = None
    else:
        return None, f"the arguments must be a JSON object or a string holding one, not {_kind(raw)}", None
    if why is not None:
        return None, f"bad arguments: {why}", raw
    if not isinstance(value, dict):
        return None, f"the arguments must be a JSON object, not {_kind(value)}", raw
    return value, None, raw


def _names(names: list[Any], limit: int = 10) -> str:
    """Argument names for a message: plain when they look like names, quoted and cut otherwise."""
    names = [str(k) for k in names]
    shown = ", ".join(k if k.isidentifier() and len(k) <= 40 else clip(k, 40) for k in names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def check_call(call: ParsedCall, tools: dict[str, ToolSpec]) -> str | None:
    """Return an agent-readable reason why ``call`` cannot run, or ``None`` if it may be sent.

    Checks what can be known without the backend: malformed arguments, unknown tools, and
    missing required or unexpected arguments (the backend still validates types).
    """
    if call.error is not None:
        return f"Error: tool call to {clip(call.name)} was not run: {call.error}."
    spec = tools.get(call.name)
    if spec is None:
        available = ", ".join(sorted(tools)) or "(none)"
        return f"Error: unknown tool {clip(call.name)}. Available tools: {available}."
    schema = spec.parameters or {}
    missing = [k for k in schema.get("required", ()) if k not in (call.arguments or {})]
    if missing:
        return f"Error: tool {call.name!r} was not run: missing required argument(s) {_names(missing)}."
    if schema.get("additionalProperties") is False:
        extra = sorted(set(call.arguments or {}) - set(schema.get("properties", {})))
        if extra:
            return f"Error: tool {call.name!r} was not run: unexpected argument(s) {_names(extra)}."
    return None


def tool_message(call_id: str, name: str, content: str | list[dict[str, Any]]) -> Message:
    """A ``tool`` message answering the call ``call_id``.

    >>> tool_message("call_1", "calculator", "4")
    {'role': 'tool', 'tool_call_id': 'call_1', 'name': 'calculator', 'content': '4'}
    """
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def user_message(content: str | list[dict[str, Any]]) -> Message:
    """A ``user`` message (task prompts, and notices about actions that were not tool calls).

    >>> user_message("Compute 2 + 2.")
    {'role': 'user', 'content': 'Compute 2 + 2.'}
    """
    return {"role": "user", "content": content}


# -- answers every tool-call adapter gives to an action it will not run --------------------------

def unreadable_reply(error: str) -> Message:
    """The ``user`` message answering an action that could not be read at all."""
    return user_message(f"Your last message could not be read: {error}.")


def no_tool_call(hint: str) -> Outcome:
    """The outcome of a plain-text action where the environment needs a tool call."""
    return Outcome([user_message(f"No tool call found in your message. {hint}")],
                   info={"invalid_action": "no_tool_call"})


def refuse_call(call: ParsedCall, tools: dict[str, ToolSpec], finished: bool) -> tuple[Message, dict[str, Any]] | None:
    """Why ``call`` must not run, as ``(tool message, record for info["calls"])``, or ``None``.

    A call after the episode finished is not run; a call :func:`check_call` refuses is not sent.
    """
    if finished:
        return (tool_message(call.id, call.name, "Not run: the episode has already finished."),
                {"name": call.name, "ok": False, "reason": "episode_finished"})
    problem = check_call(call, tools)
    if problem is not None:
        return (tool_message(call.id, call.name, problem),
                {"name": call.name, "ok": False, "reason": "invalid_call", "error": problem})
    return None
