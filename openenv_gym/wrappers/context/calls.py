"""The agent's action as the context wrapper reads it: its calls split into the local ones (answered
here) and the rest (forwarded), their arguments checked, and the answers put back in order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

from openenv_gym.actions import ParsedCall, parse_action
from openenv_gym.wire import AssistantMessage, Message, ToolSpec

__all__ = ["type_error", "Answer", "Action", "normalize", "json_args", "interleave", "local_info", "spec_of"]


# -- argument checking ----------------------------------------------------------------------------


def type_error(name: str, args: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """Check argument types and bounds against our own (simple, flat) schemas."""
    for key, value in args.items():
        sub = schema["properties"][key]
        kinds = sub["type"] if isinstance(sub["type"], list) else [sub["type"]]
        if value is None and "null" in kinds:
            continue
        if "integer" in kinds:
            # JSON has no int type of its own: accept 3.0, never True (a bool is an int in Python).
            if isinstance(value, float) and value.is_integer():
                value = args[key] = int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                return f"Error: tool {name!r} was not run: argument {key!r} must be an integer, got {value!r}."
            if value < sub.get("minimum", value):
                return f"Error: tool {name!r} was not run: argument {key!r} must be >= {sub['minimum']}, got {value}."
        elif "string" in kinds:
            if not isinstance(value, str):
                return f"Error: tool {name!r} was not run: argument {key!r} must be a string, got {value!r}."
            if len(value) < sub.get("minLength", 0):
                return f"Error: tool {name!r} was not run: argument {key!r} must not be empty."
    return None


@dataclass
class Answer:
    call_index: int
    message: Message
    ok: bool


def local_info(calls: list[ParsedCall], answers: list[Answer]) -> list[dict[str, Any]]:
    return [{"name": calls[a.call_index].name, "ok": a.ok} for a in answers]


def spec_of(tool: dict[str, Any]) -> ToolSpec:
    """A ToolSpec from an OpenAI ``tools`` entry (chat-completions or flat form)."""
    fn = tool.get("function", tool)
    return ToolSpec(name=fn["name"], description=fn.get("description") or "", parameters=fn.get("parameters"))


class Action(msgspec.Struct):
    """The agent's action, read once: for history, for forwarding, and its parsed calls."""

    message: Message  # as recorded in history: ids filled in, dict arguments as JSON text
    original: dict[str, Any] | None  # the action as a dict (None for text or unreadable input)
    calls: list[ParsedCall]  # aligned with raw_calls
    raw_calls: list[dict[str, Any]]  # the agent's calls as written, ids filled in


def normalize(action: Any) -> Action:
    """Read ``action`` with :func:`parse_action`, so the calls are exactly what the inner env sees.

    A call without an id gets ``call_<n>`` (``n`` = its position) there and the same id here;
    forwarding it with that id explicit keeps the pairing when other calls are removed.
    """
    turn = parse_action(action)
    if isinstance(action, str):
        return Action({"role": "assistant", "content": action}, None, [], [])
    if isinstance(action, AssistantMessage) or (
        isinstance(action, dict) and any(not isinstance(c, dict) for c in action.get("tool_calls") or ())
    ):
        action = msgspec.to_builtins(action)  # Structs (whole message or its calls) as plain dicts
    if not isinstance(action, dict):
        return Action({"role": "assistant", "content": None}, None, [], [])
    message = {**action, "role": "assistant"}
    if turn.error is not None or not turn.calls:
        return Action(message, action, [], [])
    raw_calls = [{**raw, "id": call.id} for raw, call in zip(action["tool_calls"], turn.calls)]
    message["tool_calls"] = [
        {
            **raw,
            "type": raw.get("type") or "function",
            "function": {**raw["function"], "arguments": json_args(raw["function"].get("arguments"))},
        }
        for raw in raw_calls
    ]
    return Action(message, action, list(turn.calls), raw_calls)


def json_args(arguments: Any) -> Any:
    """Arguments as OpenAI chat messages carry them: a JSON string."""
    if isinstance(arguments, dict):
        # default=str: a numpy scalar in a trainer-built dict must not break the history copy;
        # a dict no JSON can hold (too deep, odd keys) is recorded as unreadable, not raised.
        try:
            return json.dumps(arguments, ensure_ascii=False, default=str)
        except (TypeError, ValueError, RecursionError):
            return "<arguments that are not JSON>"
    return "{}" if arguments is None else arguments


def interleave(
    calls: list[ParsedCall], answers: list[Answer], inner: list[Message]
) -> tuple[list[Message], list[int]]:
    """Place local answers among the inner env's messages in the order of the original calls.

    A local answer goes right after the result of the env call preceding it in the message (or
    first, when no env call precedes it); inner messages that answer no call (a user notice) keep
    their place. Results are matched by ``tool_call_id``, first come first served, so duplicate
    ids still pair up in order. Returns the merged list and the positions of the local answers.
    """
    by_id: dict[str, list[int]] = {}
    for k, m in enumerate(inner):
        if m.get("role") == "tool":
            by_id.setdefault(str(m.get("tool_call_id")), []).append(k)
    local = {a.call_index: a for a in answers}
    front: list[Message] = []
    after: dict[int, list[Message]] = {}
    anchor: int | None = None
    for i, call in enumerate(calls):
        if i in local:
            (after.setdefault(anchor, []) if anchor is not None else front).append(local[i].message)
        elif by_id.get(call.id):
            anchor = by_id[call.id].pop(0)
    merged = list(front)
    positions = list(range(len(front)))
    for k, m in enumerate(inner):
        merged.append(m)
        for a in after.get(k, ()):
            positions.append(len(merged))
            merged.append(a)
    return merged, positions
