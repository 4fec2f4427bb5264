"""Observation and action spaces for chat environments.

``gymnasium.spaces.Text`` does not fit chat: its default charset is 62 alphanumerics (a space or
any JSON fails ``contains``) and a full-Unicode charset costs seconds and hundreds of MiB. These
spaces check *structure* and accept any Unicode text:

* :class:`Messages` — the observation: a list of OpenAI chat messages.
* :class:`AssistantAction` — the action: assistant text, or an assistant message with tool calls.
  ``sample()`` draws a valid random action from ``np_random``: a call of one of the env's tools
  with arguments drawn from the tool's JSON schema (plain text only when the env has no tools, or
  with the probability ``text_probability``, 0 by default), which is what ``check_env`` and a
  user reading ``env.action_space.sample()`` expect. :class:`~openenv_gym.policies.RandomPolicy`
  asks for 10 % text, so random rollouts also exercise the agent's plain-text turns.

Both are plain :class:`gymnasium.spaces.Space` subclasses, so Gymnasium batches them as tuples.
With ``AsyncVectorEnv`` pass ``shared_memory=False``: Gymnasium's shared-memory path returns stale
strings for text observations.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space

from openenv_gym.wire import ToolSpec

__all__ = ["Messages", "AssistantAction", "sample_json_schema"]

_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
_SAMPLE_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 +-*/()"


def _random_text(rng: np.random.Generator, max_len: int = 12) -> str:
    n = int(rng.integers(0, max_len + 1))
    return "".join(_SAMPLE_CHARS[i] for i in rng.integers(0, len(_SAMPLE_CHARS), size=n))


def _valid_part(part: Any) -> bool:
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    return isinstance(kind, str) and (kind != "text" or isinstance(part.get("text"), str))


def _valid_content(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    if isinstance(content, list):
        return all(_valid_part(p) for p in content)
    return False


def _valid_message(msg: Any) -> bool:
    if not isinstance(msg, dict):
        return False
    role = msg.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        return False
    if not _valid_content(msg.get("content")):
        return False
    if msg["role"] == "tool" and not isinstance(msg.get("tool_call_id"), str):
        return False
    calls = msg.get("tool_calls")
    return calls is None or (isinstance(calls, list) and all(_valid_call(c) for c in calls))


def _valid_call(call: Any) -> bool:
    if not isinstance(call, dict):
        return False
    fn = call.get("function")
    return (
        isinstance(fn, dict)
        and isinstance(fn.get("name"), str)
        and (fn.get("arguments") is None or isinstance(fn.get("arguments"), (str, dict)))
    )


class Messages(Space[list]):
    """A list of OpenAI-format chat messages (the observation of every openenv_gym env)."""

    def __init__(self, seed: int | np.random.Generator | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(_valid_message(m) for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> list:
        return [{"role": "user", "content": _random_text(self.np_random, 40)}]

    def __repr__(self) -> str:
        return "Messages()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Messages)

    def to_jsonable(self, sample_n: Iterable[list]) -> list:
        return list(sample_n)

    def from_jsonable(self, sample_n: list) -> list:
        return list(sample_n)


class AssistantAction(Space[Any]):
    """Assistant text or an OpenAI assistant message, optionally with tool calls.

    Args:
        tools: the tools ``sample()`` may call (updated by the env when a task brings its own).
        text_probability: how often ``sample()`` returns plain text instead of a tool call (0 by
            default: a sample of an env with tools is a tool call; without tools it is text).
        seed: seed of ``np_random``.
    """

    def __init__(
        self,
        tools: Sequence[ToolSpec] = (),
        *,
        text_probability: float = 0.0,
        seed: int | np.random.Generator | None = None,
    ):
        if not 0.0 <= text_probability <= 1.0:
            raise ValueError(f"text_probability must be between 0 and 1, not {text_probability!r}")
        super().__init__(shape=None, dtype=None, seed=seed)
        self.tools = list(tools)
        self.text_probability = text_probability
        self._calls = 0

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return True
        if not isinstance(x, dict):
            return False
        role = x.get("role", "assistant")
        return isinstance(role, str) and role == "assistant" and _valid_message({**x, "role": "assistant"})

    def sample(self, mask: Any = None, probability: Any = None) -> str | dict[str, Any]:
        rng = self.np_random
        if not self.tools or rng.random() < self.text_probability:
            return _random_text(rng, 40)
        tool = self.tools[int(rng.integers(len(self.tools)))]
        arguments = sample_json_schema(tool.parameters or {"type": "object"}, rng)
        self._calls += 1
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{self._calls}",
                    "type": "function",
                    "function": {"name": tool.name, "arguments": json.dumps(arguments)},
                }
            ],
        }

    def __repr__(self) -> str:
        return f"AssistantAction(tools={[t.name for t in self.tools]})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AssistantAction) and [t.name for t in other.tools] == [
            t.name for t in self.tools
        ]


def sample_json_schema(
    schema: dict[str, Any], rng: np.random.Generator, defs: dict[str, Any] | None = None, depth: int = 0
) -> Any:
    """Draw a value that satisfies the common subset of JSON Schema tools use.

    Handles ``type`` (and lists of types), ``enum``, ``const``, ``properties``/``required``,
    ``items``, ``anyOf``/``oneOf``/``allOf``, ``$ref`` into ``$defs``, and numeric/length bounds.
    Optional properties are included half the time so random policies exercise both forms.
    """
    defs = defs if defs is not None else schema.get("$defs", schema.get("definitions", {}))
    if "$ref" in schema:
        target = schema["$ref"].rsplit("/", 1)[-1]
        return sample_json_schema(defs.get(target, {}), rng, defs, depth + 1)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            return sample_json_schema(options[int(rng.integers(len(options)))], rng, defs, depth + 1)
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(part)
        return sample_json_schema(merged, rng, defs, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[int(rng.integers(len(kind)))]
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        return {
            name: sample_json_schema(sub, rng, defs, depth + 1)
            for name, sub in props.items()
            if name in required or (depth < 3 and rng.random() < 0.5)
        }
    if kind == "array":
        lo = int(schema.get("minItems", 0))
        hi = max(lo, min(int(schema.get("maxItems", lo + 3)), lo + 3)) if depth < 3 else lo
        items = schema.get("items", {"type": "string"})
        return [sample_json_schema(items, rng, defs, depth + 1) for _ in range(int(rng.integers(lo, hi + 1)))]
    if kind == "integer":
        lo = int(schema.get("minimum", schema.get("exclusiveMinimum", -101) + 1))
        hi = int(schema.get("maximum", schema.get("exclusiveMaximum", 101) - 1))
        return int(rng.integers(lo, max(lo, hi) + 1))
    if kind == "number":
        low = float(schema.get("minimum", schema.get("exclusiveMinimum", -100.0)))
        high = float(schema.get("maximum", schema.get("exclusiveMaximum", 100.0)))
        return float(rng.uniform(low, max(low, high)))
    if kind == "boolean":
        return bool(rng.random() < 0.5)
    if kind == "null":
        return None
    lo = int(schema.get("minLength", 0))
    hi = max(lo, min(int(schema.get("maxLength", lo + 12)), lo + 12))
    text = _random_text(rng, hi)
    return (text + "a" * lo)[: max(lo, len(text))] if len(text) < lo else text
