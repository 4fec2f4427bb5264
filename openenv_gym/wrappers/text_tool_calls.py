"""TextToolCalls: tool calls written as plain text by open models, parsed into OpenAI tool calls.

A model served without a tool parser (a raw vLLM or SGLang completion, a trainer's own sampler)
answers with text in which its chat template's tool-call format is spelled out. The env needs
OpenAI ``tool_calls``; without them it answers "no tool call found". This module owns the parsing
of the three formats open models use, and the wrapper that applies it to every plain-text action:

* ``hermes`` (Hermes, Qwen 2.5/3, many fine-tunes): ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>``, any number of blocks, text around them. A last block whose closing tag is
  missing (generation stopped at the end-of-turn token) is accepted when its JSON is complete.
* ``llama3_json`` (Llama 3.1-3.3 JSON tool calling): the message is ``{"name": ...,
  "parameters": {...}}`` (``"arguments"`` also read), or several separated by ``;``, or a JSON
  array of them; after ``<|python_tag|>`` text may precede the calls. Without the tag the whole
  message must be the calls, so an answer that merely contains JSON stays an answer.
* ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}, ...]`` and the newer
  ``[TOOL_CALLS]name[ARGS]{...}`` (optionally ``name[CALL_ID]id[ARGS]{...}``), text before the
  first ``[TOOL_CALLS]`` kept.

What the wrapper guarantees: it never raises on any text; text that holds no calls, or whose calls
cannot be read, goes to the env unchanged (so the env answers it exactly as it would without the
wrapper); a parse is all or nothing (one unreadable call leaves the whole text as it was, since
running only some of what the model asked for would teach it the wrong thing).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, SupportsFloat

import gymnasium as gym
import msgspec
from gymnasium.utils import RecordConstructorArgs

from openenv_gym.errors import ConfigurationError
from openenv_gym.wire import AssistantMessage, Message

__all__ = ["TextToolCalls", "ToolText", "parse_tool_text", "FORMATS"]

FORMATS: tuple[str, ...] = ("hermes", "llama3_json", "mistral")
"""The formats :func:`parse_tool_text` reads, in the order they are tried."""

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"

# End-of-turn tokens a sampler may leave at the end when it does not skip special tokens.
_END_TOKENS = ("<|eom_id|>", "<|eot_id|>", "</s>", "<|im_end|>", "<|endoftext|>")
# Text that starts like a Llama 3 JSON call: only then is a failure to read it worth reporting.
_LLAMA_ATTEMPT = re.compile(r'\[?\s*\{\s*"name"\s*:')
_decoder = json.JSONDecoder(strict=False)  # models put raw newlines in strings; the output is re-encoded


@dataclass(frozen=True)
class ToolText:
    """What :func:`parse_tool_text` found in a text.

    ``format`` is the format whose markers were found (``None``: none were); ``calls`` the OpenAI
    tool calls (``id``, ``type``, ``function.name``, ``function.arguments`` as a JSON string),
    empty when none were found or they could not be read; ``content`` the text outside the calls
    (its pieces stripped and joined by newlines; ``None`` when empty); ``error`` why calls whose
    markers were found could not be read.
    """

    format: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    content: str | None = None
    error: str | None = None


class _Bad(Exception):
    """A call whose markers are there but whose text cannot be read (becomes ``ToolText.error``)."""


def _outside(pieces: Sequence[str]) -> str | None:
    kept = [p.strip() for p in pieces if p.strip()]
    return "\n".join(kept) or None


def _call(value: Any, where: str) -> tuple[str, Any, str | None]:
    """``(name, arguments, id)`` of one decoded call object."""
    if not isinstance(value, dict):
        raise _Bad(f"{where} is not a JSON object")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise _Bad(f'{where} has no "name" string')
    if "arguments" in value:
        arguments = value["arguments"]
    else:
        arguments = value.get("parameters", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, (dict, str)):
        raise _Bad(f"the arguments of {where} are not a JSON object")
    call_id = value.get("id")
    return name, arguments, call_id if isinstance(call_id, str) and call_id else None


def _strip_end(text: str) -> str:
    """``text`` without trailing whitespace and end-of-turn tokens.

    Linear in the length of ``text``: the end moves back over an index and the text is sliced
    once. (Slicing after each token copies the text each time: a megabyte of ``</s>`` took
    seconds, holding the GIL.)
    """
    end = len(text)
    while True:
        while end and text[end - 1].isspace():
            end -= 1
        for token in _END_TOKENS:
            if text.endswith(token, 0, end):
                end -= len(token)
                break
        else:
            return text[:end]


def _skip(text: str, pos: int, also: str = "") -> int:
    n = len(text)
    while pos < n and (text[pos].isspace() or text[pos] in also):
        pos += 1
    return pos


def _value(text: str, pos: int, where: str) -> tuple[Any, int]:
    """The JSON value starting at ``text[pos]`` (after whitespace) and where it ends."""
    try:
        return _decoder.raw_decode(text, _skip(text, pos))
    except ValueError as exc:
        raise _Bad(f"{where} is not valid JSON ({exc})") from None


def _json_values(text: str, where: str) -> list[Any]:
    """Every JSON value in ``text``, separated by whitespace or ``;``, to its end."""
    values, pos = [], _skip(text, 0, ";")
    while pos < len(text):
        value, pos = _value(text, pos, where)
        values.append(value)
        pos = _skip(text, pos, ";")
    return values


def _objects(values: list[Any], where: str) -> list[tuple[str, Any, str | None]]:
    calls: list[tuple[str, Any, str | None]] = []
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            calls.append(_call(item, f"{where} call {len(calls) + 1}"))
    if not calls:
        raise _Bad(f"{where} holds no call")
    return calls


def _hermes(text: str) -> tuple[list[tuple[str, Any, str | None]], str | None] | None:
    if HERMES_OPEN not in text:
        return None
    text = _strip_end(text)
    calls: list[tuple[str, Any, str | None]] = []
    pieces: list[str] = []
    pos = 0
    while True:
        start = text.find(HERMES_OPEN, pos)
        if start < 0:
            pieces.append(text[pos:])
            break
        pieces.append(text[pos:start])
        where = f"<tool_call> block {len(calls) + 1}"
        # The JSON is read first and the closing tag looked for after it, so a tag inside an
        # argument string cannot end the block early.
        value, end = _value(text, start + len(HERMES_OPEN), where)
        calls.append(_call(value, where))
        end = _skip(text, end)
        if text.startswith(HERMES_CLOSE, end):
            pos = end + len(HERMES_CLOSE)
        elif end == len(text):  # generation stopped before the closing tag
            break
        else:
            raise _Bad(f"{where} has text after its JSON and before {HERMES_CLOSE}")
    return calls, _outside(pieces)


def _llama3(text: str) -> tuple[list[tuple[str, Any, str | None]], str | None] | None:
    body = _strip_end(text)
    stripped = body.lstrip()
    tagged = PYTHON_TAG in body
    if stripped.startswith(("{", "[")):
        # A message that is all calls is read whole first: a tag inside one of its strings (an
        # argument that quotes the token) is then a string, not where the calls begin.
        try:
            return _objects(_json_values(stripped, "the JSON text"), "the JSON text"), None
        except _Bad:
            if not tagged and _LLAMA_ATTEMPT.match(stripped):
                raise
    if not tagged:
        return None  # no calls (a JSON answer that is not a call among them)
    before, _, body = body.partition(PYTHON_TAG)
    return _objects(_json_values(body, "the <|python_tag|> text"), "the <|python_tag|> text"), _outside([before])


def _mistral(text: str) -> tuple[list[tuple[str, Any, str | None]], str | None] | None:
    start = text.find(MISTRAL_CALLS)
    if start < 0:
        return None
    text = _strip_end(text)
    calls: list[tuple[str, Any, str | None]] = []
    pos, part = start + len(MISTRAL_CALLS), 1
    while True:
        where = f"[TOOL_CALLS] part {part}"
        pos = _skip(text, pos)
        if text.startswith(("[", "{"), pos) and not text.startswith(MISTRAL_CALLS, pos):
            value, pos = _value(text, pos, where)
            calls.extend(_objects([value], where))
        else:
            args_at = text.find(MISTRAL_ARGS, pos)
            if args_at < 0:
                raise _Bad(f"{where} is neither a JSON list of calls nor name[ARGS]{{...}}")
            name, _, call_id = text[pos:args_at].partition(MISTRAL_CALL_ID)
            if not name.strip() or any(c.isspace() for c in name.strip()):
                raise _Bad(f"{where} has no tool name before [ARGS]")
            value, pos = _value(text, args_at + len(MISTRAL_ARGS), where)
            calls.append(_call({"name": name.strip(), "arguments": value, "id": call_id.strip()}, where))
        pos = _skip(text, pos, ";")
        if pos >= len(text):
            return calls, _outside([text[:start]])
        if text.startswith(MISTRAL_CALLS, pos):
            pos += len(MISTRAL_CALLS)
            part += 1
        elif not text.startswith(("[", "{"), pos):
            raise _Bad(f"{where} has text after its calls")


_PARSERS = {"hermes": _hermes, "llama3_json": _llama3, "mistral": _mistral}


def _arguments_json(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments  # already a JSON string (some models double-encode): the env decodes it
    try:
        return json.dumps(arguments, ensure_ascii=False)
    except (ValueError, RecursionError):
        raise _Bad("the arguments cannot be written back as JSON") from None


def _call_id(fmt: str, turn: int, n: int) -> str:
    # Mistral's chat templates refuse ids other than 9 alphanumerics; the others take any string.
    if fmt == "mistral":
        return f"c{turn % 10_000:04d}{n % 10_000:04d}"
    return f"call_{turn}_{n}"


def parse_tool_text(text: str, formats: Sequence[str] = FORMATS, turn: int = 0) -> ToolText:
    """Find the tool calls written in ``text`` in one of ``formats`` (see the module docs).

    Formats are tried in the order of :data:`FORMATS` among those whose markers ``text`` holds;
    the first that reads wins. Calls without an id get ``call_<turn>_<n>`` (Mistral:
    ``c<turn:04><n:04>``, the 9 alphanumerics its templates need). Never raises.
    """
    result = ToolText()
    for fmt in FORMATS:
        if fmt not in formats:
            continue
        try:
            found = _PARSERS[fmt](text)
            if found is None:
                continue
            raw_calls, content = found
            calls = [
                {"id": call_id or _call_id(fmt, turn, n), "type": "function",
                 "function": {"name": name, "arguments": _arguments_json(arguments)}}
                for n, (name, arguments, call_id) in enumerate(raw_calls)
            ]
        except _Bad as exc:
            if result.error is None:
                result = ToolText(format=fmt, error=str(exc))
            continue
        except Exception as exc:  # whatever the text holds, a parse never raises
            if result.error is None:
                result = ToolText(format=fmt, error=f"the calls could not be read ({type(exc).__name__})")
            continue
        return ToolText(format=fmt, calls=calls, content=content)
    return result


def _action_text(action: Any) -> str | None:
    """The text of an action that is plain text: a str, or an assistant message with string
    content and no tool calls. ``None`` for any other action (it passes through)."""
    if isinstance(action, str):
        return str(action)
    if isinstance(action, AssistantMessage):
        return action.content if isinstance(action.content, str) and not action.tool_calls else None
    if isinstance(action, dict):
        try:
            content, calls = action.get("content"), action.get("tool_calls")
        except Exception:
            return None
        return content if isinstance(content, str) and not calls else None
    return None


class TextToolCalls(gym.Wrapper, RecordConstructorArgs):
    """Parse tool calls out of plain-text actions, for models served without a tool parser.

    A plain-text action (a ``str``, or an assistant message whose ``content`` is a string and
    which has no ``tool_calls``) is read by :func:`parse_tool_text` in ``formats``. When calls are
    found, the inner env gets ``{"role": "assistant", "content": <text outside the calls or None>,
    "tool_calls": [...]}`` (other keys of a message action kept), and ``info`` gets
    ``text_tool_calls = {"format": ..., "calls": <count>}`` and ``assistant_message`` (that
    message, unless a wrapper below set its own), so :class:`ConversationHistory` and
    :class:`RecordEpisodes` above record the calls the env answered. Calls the model wrote without
    an id get ``call_<turn>_<n>`` (``turn`` counts this wrapper's steps from 1 after each reset;
    Mistral: ``c<turn><n>``, 9 alphanumerics, as its templates require), unique in an episode.

    When markers are found but the calls cannot be read, the action goes through unchanged and
    ``info["text_tool_calls"] = {"format": ..., "error": ...}`` says why (a trainer may penalise
    it; the env answers the text as it always does). Text without markers and every other action
    go through untouched, with no ``text_tool_calls`` key.

    Args:
        env: an env following the openenv_gym contract (or a wrapper of one).
        formats: the formats to read, a subset of :data:`FORMATS` (default: all). Restrict it to
            your model's own format, so text in another format is answered as text.

    Raises:
        ConfigurationError: an unknown or empty ``formats``.

    Example:
        >>> import gymnasium as gym, openenv_gym
        >>> from openenv_gym.wrappers import TextToolCalls
        >>> env = TextToolCalls(gym.make("openenv/Arithmetic-v0"), formats=["hermes"])
        >>> obs, info = env.reset(seed=0)
        >>> text = 'Let me check.\\n<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
        >>> obs, reward, terminated, truncated, info = env.step(text)
        >>> obs[0]["content"], info["text_tool_calls"], info["assistant_message"]["content"]
        ('4', {'format': 'hermes', 'calls': 1}, 'Let me check.')
        >>> env.close()
    """

    def __init__(self, env: gym.Env, formats: Sequence[str] = FORMATS):
        if isinstance(formats, str):
            formats = [formats]
        formats = tuple(formats)
        unknown = [f for f in formats if f not in FORMATS]
        if unknown or not formats:
            raise ConfigurationError(f"formats must be a non-empty subset of {list(FORMATS)}, not {list(formats)}")
        RecordConstructorArgs.__init__(self, formats=formats)
        gym.Wrapper.__init__(self, env)
        self.formats = formats
        self._turn = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the inner env (and the call-id counter)."""
        self._turn = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the inner env with ``action``, its text's tool calls parsed (see the class docs)."""
        self._turn += 1
        text = _action_text(action)
        found = parse_tool_text(text, self.formats, self._turn) if text is not None else ToolText()
        forward = action
        if found.calls:
            forward = _with_calls(action, found)
        obs, reward, terminated, truncated, info = self.env.step(forward)
        if found.format is None:
            return obs, reward, terminated, truncated, info
        info = dict(info)
        if found.calls:
            info["text_tool_calls"] = {"format": found.format, "calls": len(found.calls)}
            info.setdefault("assistant_message", forward)
        else:
            info["text_tool_calls"] = {"format": found.format, "error": found.error}
        return obs, reward, terminated, truncated, info


def _with_calls(action: Any, found: ToolText) -> Message:
    if isinstance(action, AssistantMessage):
        action = msgspec.to_builtins(action)
    message = dict(action) if isinstance(action, dict) else {}
    message["role"] = "assistant"
    message["content"] = found.content
    message["tool_calls"] = found.calls
    return message
