"""Reading the agent's action, and the messages that tell the agent what was wrong with it.

An action is assistant text or an OpenAI assistant message with optional tool calls. Agents make
mistakes (invalid JSON arguments, tools that do not exist, missing arguments, a plain answer where
a tool call is needed); those are part of learning, so they never raise: :func:`parse_action`
records each problem and the adapter answers it with a message the agent can read, leaving the
episode running. Only a value that is not an action at all (say ``None``) is refused, also as a
message, because that is what a trainer feeding raw model output would want.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from openenv_gym.wire import AssistantMessage, Message, ToolSpec

__all__ = ["ParsedCall", "Turn", "parse_action", "check_call", "tool_message", "user_message"]


class ParsedCall(msgspec.Struct):
    """One tool call, its arguments decoded; ``error`` says why it cannot run as written."""

    id: str
    name: str
    arguments: dict[str, Any] | None
    error: str | None = None
    raw_arguments: str | None = None
    """The arguments exactly as the agent wrote them, when they were a string: backends that
    parse arguments themselves (Verifiers' ToolEnv) answer bad JSON in their own words."""


class Turn(msgspec.Struct):
    """The agent's action, interpreted: its text, its tool calls, or why it could not be read."""

    text: str | None
    calls: list[ParsedCall]
    error: str | None = None


def _text_of(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return "\n".join(parts)


def _decode_arguments(raw: str | dict[str, Any] | None) -> tuple[dict[str, Any] | None, str | None]:
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:
        return None, f"the arguments are not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(value, dict):
        return None, f"the arguments must be a JSON object, got {type(value).__name__}"
    return value, None


def parse_action(action: Any) -> Turn:
    """Interpret ``action`` (str, OpenAI assistant message dict, or :class:`AssistantMessage`)."""
    if isinstance(action, str):
        return Turn(text=action, calls=[])
    if isinstance(action, AssistantMessage):
        message = action
    else:
        try:
            message = msgspec.convert(action, AssistantMessage)
        except msgspec.ValidationError as exc:
            return Turn(text=None, calls=[], error=f"the message is not a valid assistant message: {exc}")
    calls = []
    for n, call in enumerate(message.tool_calls or ()):
        arguments, error = _decode_arguments(call.function.arguments)
        raw = call.function.arguments if isinstance(call.function.arguments, str) else None
        calls.append(ParsedCall(call.id or f"call_{n}", call.function.name, arguments, error, raw))
    return Turn(text=_text_of(message.content), calls=calls)


def check_call(call: ParsedCall, tools: dict[str, ToolSpec]) -> str | None:
    """Return an agent-readable reason why ``call`` cannot run, or ``None`` if it may be sent.

    Checks what can be known without the backend: malformed arguments, unknown tools, and
    missing required or unexpected arguments (the backend still validates types).
    """
    if call.error is not None:
        return f"Error: tool call to {call.name!r} was not run: {call.error}."
    spec = tools.get(call.name)
    if spec is None:
        available = ", ".join(sorted(tools)) or "(none)"
        return f"Error: unknown tool {call.name!r}. Available tools: {available}."
    schema = spec.parameters or {}
    missing = [k for k in schema.get("required", ()) if k not in (call.arguments or {})]
    if missing:
        return f"Error: tool {call.name!r} was not run: missing required argument(s) {', '.join(missing)}."
    if schema.get("additionalProperties") is False:
        extra = sorted(set(call.arguments or {}) - set(schema.get("properties", {})))
        if extra:
            return f"Error: tool {call.name!r} was not run: unexpected argument(s) {', '.join(extra)}."
    return None


def tool_message(call_id: str, name: str, content: str | list[dict[str, Any]]) -> Message:
    """A ``tool`` message answering the call ``call_id``."""
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def user_message(content: str | list[dict[str, Any]]) -> Message:
    """A ``user`` message (task prompts, and notices about actions that were not tool calls)."""
    return {"role": "user", "content": content}
