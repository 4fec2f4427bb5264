"""Wire types shared by every layer, as msgspec Structs, and the shared encoders/decoders.

These are the package's data contract: adapters return :class:`Opening` and :class:`Outcome`,
:class:`AgentEnv` turns them into Gymnasium tuples, and vector envs ship them between processes.
msgspec rather than pydantic because they sit on the hot path of every step (decode of each tool
result, encode of each step record), where msgspec is several times faster.

Messages stay plain OpenAI-format dicts (``{"role": ..., "content": ...}``): that is what a trainer
feeds to a tokenizer's chat template, so converting them back and forth would be wasted work.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "Message",
    "FunctionCall",
    "ToolCall",
    "AssistantMessage",
    "ToolSpec",
    "Split",
    "TaskRef",
    "Opening",
    "Outcome",
    "json_encode",
    "json_decode",
    "msgpack_encode",
    "msgpack_decode",
]

Message = dict[str, Any]
"""An OpenAI chat message: ``role`` (system/user/assistant/tool), ``content`` (text or parts)."""


class FunctionCall(msgspec.Struct, omit_defaults=True):
    """The ``function`` member of an OpenAI tool call; ``arguments`` is a JSON string or a dict."""

    name: str
    arguments: str | dict[str, Any] | None = None


class ToolCall(msgspec.Struct, omit_defaults=True):
    """One OpenAI tool call as an agent writes it."""

    function: FunctionCall
    id: str | None = None
    type: str = "function"


class AssistantMessage(msgspec.Struct, omit_defaults=True):
    """The action: an OpenAI assistant message. Unknown keys (``reasoning_content``...) are kept out."""

    role: str = "assistant"
    content: str | list[Any] | None = None
    tool_calls: list[ToolCall] | None = None


class ToolSpec(msgspec.Struct, omit_defaults=True):
    """A tool an agent may call: name, description and a JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry (chat-completions format) for this tool."""
        params = self.parameters or {"type": "object", "properties": {}}
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }


class Split(msgspec.Struct):
    """A task split: its name and its type (``train``, ``validation`` or ``test``)."""

    name: str
    type: str = "validation"


class TaskRef(msgspec.Struct, omit_defaults=True):
    """Which task an episode plays: a split and an index, or an explicit task spec."""

    split: str | None = None
    index: int | None = None
    spec: dict[str, Any] | None = None


class Opening(msgspec.Struct):
    """What an adapter returns when an episode starts."""

    messages: list[Message]
    tools: list[ToolSpec]
    task_id: str
    info: dict[str, Any] = {}


class Outcome(msgspec.Struct):
    """What an adapter returns for one agent action."""

    messages: list[Message]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = {}
    tools: list[ToolSpec] | None = None
    """Set only when the tool list changed during the step."""


_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()
_json_decoder = msgspec.json.Decoder()
_msgpack_decoder = msgspec.msgpack.Decoder()


def json_encode(obj: Any) -> bytes:
    """Encode with the shared JSON encoder (reused: building encoders costs on hot paths)."""
    return _json_encoder.encode(obj)


def json_decode(data: bytes | str, type: Any = None) -> Any:
    """Decode JSON, into ``type`` when given (validating it), else into builtins."""
    if type is None:
        return _json_decoder.decode(data)
    return msgspec.json.decode(data, type=type)


def msgpack_encode(obj: Any) -> bytes:
    """Encode with the shared msgpack encoder (the format vector envs use between processes)."""
    return _msgpack_encoder.encode(obj)


def msgpack_decode(data: bytes, type: Any = None) -> Any:
    """Decode msgpack, into ``type`` when given."""
    if type is None:
        return _msgpack_decoder.decode(data)
    return msgspec.msgpack.decode(data, type=type)
