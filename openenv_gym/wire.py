"""Wire types shared by every layer, as msgspec Structs, and the shared encoders/decoders.

These are the package's data contract: adapters return :class:`Opening` and :class:`Outcome`,
:class:`AgentEnv` turns them into Gymnasium tuples, and vector envs ship them between processes.
msgspec rather than pydantic because they sit on the hot path of every step (decode of each tool
result, encode of each step record), where msgspec is several times faster.

Agent-written JSON (tool arguments, task specs passed to ``reset``) is checked here by
:func:`to_plain_json` and :func:`loads_plain_json`, so that whatever passes can be sent by every
backend (httpx's ``json=``, MCP, Verifiers' ``json.loads``) and shipped between processes as
msgpack. "Plain JSON" means: ``None``, ``bool``, ``str`` (valid Unicode: no lone surrogates),
``int`` within 64 bits (:data:`JSON_INT_MIN`..:data:`JSON_INT_MAX`: what msgpack and most JSON
libraries outside Python hold; bigger numbers belong in strings), finite ``float``, and lists and
``str``-keyed dicts of these, nested at most :data:`MAX_JSON_DEPTH` deep.

Messages stay plain OpenAI-format dicts (``{"role": ..., "content": ...}``): that is what a trainer
feeds to a tokenizer's chat template, so converting them back and forth would be wasted work.
"""

from __future__ import annotations

import math
import operator
import re
from functools import partial
from itertools import chain, compress
from typing import Any, overload

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
    "decode_with",
    "decode_within_depth",
    "TooDeep",
    "MAX_JSON_DEPTH",
    "JSON_INT_MIN",
    "JSON_INT_MAX",
    "to_plain_json",
    "loads_plain_json",
    "unicode_problem",
    "clip",
    "UNBOUNDED_TASKS",
]

UNBOUNDED_TASKS = 2**31 - 1
"""``num_tasks`` of a split that never ends (an infinite Verifiers taskset, an OpenEnv server
without a task API): every index from 0 up is a task. In such a split ``reset(seed=k)`` plays
task ``k`` and each later reset without a seed the next one (a vector env's sub-envs step by
``num_envs``, so together they play every task once); ``options={"index": k}`` plays task ``k``."""

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

    @classmethod
    def from_openai(cls, entry: dict[str, Any]) -> ToolSpec:
        """The tool an OpenAI ``tools`` entry describes (the inverse of :meth:`to_openai`)."""
        function = entry.get("function", entry)
        return cls(function["name"], function.get("description") or "", function.get("parameters"))


class Split(msgspec.Struct):
    """A task split: its name and its type (``train``, ``validation`` or ``test``)."""

    name: str
    type: str = "validation"


class TaskRef(msgspec.Struct, omit_defaults=True):
    """Which task an episode plays: a split and an index, or an explicit task spec."""

    split: str | None = None
    index: int | None = None
    spec: dict[str, Any] | None = None

    @property
    def task_id(self) -> str:
        """A stable name for the task: ``"split/index"``, or an explicit spec's ``id``."""
        if self.spec is not None:
            return str(self.spec.get("id", "task_spec"))
        return f"{self.split}/{self.index}"


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


@overload
def decode_with(decoder: msgspec.json.Decoder, data: bytes | str) -> Any: ...
@overload
def decode_with(decoder: msgspec.msgpack.Decoder, data: bytes) -> Any: ...


def decode_with(decoder: msgspec.json.Decoder | msgspec.msgpack.Decoder, data: Any) -> Any:
    """``decoder.decode(data)``, every unreadable input a ``msgspec.DecodeError``.

    msgspec reports two kinds of unreadable input otherwise: nesting too deep to decode
    (``RecursionError``) and strings that are not UTF-8 (``UnicodeDecodeError``). Callers on a hot
    path keep their own prebuilt decoder and pass it here.
    """
    try:
        return decoder.decode(data)
    except RecursionError:
        raise msgspec.DecodeError("the data is nested too deeply to decode") from None
    except UnicodeDecodeError as exc:
        raise msgspec.DecodeError(f"the data is malformed: invalid UTF-8 (byte {exc.start})") from None


class TooDeep(msgspec.DecodeError):
    """JSON whose arrays and objects nest deeper than a limit (``max_depth`` says which)."""

    def __init__(self, max_depth: int):
        super().__init__(f"arrays and objects nest more than {max_depth} levels deep")
        self.max_depth = max_depth


def decode_within_depth(decoder: msgspec.json.Decoder, data: bytes | str, max_depth: int) -> Any:
    """:func:`decode_with`, refusing JSON nested more than ``max_depth`` levels with :class:`TooDeep`.

    For JSON a server sent: msgspec (like the standard library's ``json``) decodes nesting up to
    Python's recursion limit and raises ``RecursionError`` past it, and a value it did decode a
    thousand levels deep still breaks later Python code that recurses (``copy.deepcopy``,
    ``repr`` in some wrappers). Nothing real nests that deep, so the limit is far lower. Cheap
    on the hot path: a document with at most ``max_depth`` brackets (a C-level count) cannot nest
    deeper and is decoded once; only one with more is first decoded untyped and swept level by
    level (:func:`_nests_deeper`).
    """
    if isinstance(data, bytes):
        brackets = data.count(b"[") + data.count(b"{")
    else:
        brackets = data.count("[") + data.count("{")
    try:
        if brackets > max_depth:
            plain = _json_decoder.decode(data)
            if _nests_deeper(plain, max_depth):
                raise TooDeep(max_depth)
            if decoder is _json_decoder:
                return plain
        return decoder.decode(data)
    except RecursionError:
        raise TooDeep(max_depth) from None
    except UnicodeDecodeError as exc:
        raise msgspec.DecodeError(f"the data is malformed: invalid UTF-8 (byte {exc.start})") from None


def json_decode(data: bytes | str, type: Any = None) -> Any:
    """Decode JSON, into ``type`` when given (validating it), else into builtins.

    Raises ``msgspec.DecodeError`` (a ``ValueError``; ``ValidationError`` is one) for anything
    unreadable (see :func:`decode_with`).
    """
    return decode_with(_json_decoder if type is None else msgspec.json.Decoder(type), data)


def msgpack_encode(obj: Any) -> bytes:
    """Encode with the shared msgpack encoder (the format vector envs use between processes)."""
    return _msgpack_encoder.encode(obj)


def msgpack_decode(data: bytes, type: Any = None) -> Any:
    """Decode msgpack, into ``type`` when given; errors as :func:`json_decode`'s."""
    return decode_with(_msgpack_decoder if type is None else msgspec.msgpack.Decoder(type), data)


# -- agent-written JSON ------------------------------------------------------------------------------

MAX_JSON_DEPTH = 100
"""How deep arrays and objects may nest in agent-written JSON (the outermost one is level 1).
Real tool arguments nest a few levels; the limit keeps every encoder and decoder far from
Python's recursion limit, in whichever process the value is decoded."""

JSON_INT_MIN = -(2**63)
JSON_INT_MAX = 2**64 - 1

_IS_DICT = partial(operator.is_, dict)
_IS_LIST = partial(operator.is_, list)
_IS_CONTAINER = frozenset((dict, list)).__contains__
_SURROGATE = re.compile("[\ud800-\udfff]")
_BIG_INT = "write numbers that large as strings"
_AT_BYTE = re.compile(r" \(byte (\d+)\)$")
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
# A \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF one, or the latter alone (msgspec
# refuses them with a confusing "truncated"; this finds them to say so plainly).
_LONE_ESCAPE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def clip(text: str, limit: int = 60) -> str:
    """``repr`` of ``text`` cut to about ``limit`` characters: safe to echo in a message (lone
    surrogates and control characters come out escaped; megabytes do not come out at all)."""
    if len(text) > limit:
        return f"{text[:limit]!r}... ({len(text)} characters)"
    return repr(text)


def unicode_problem(text: str) -> str | None:
    """Why ``text`` is not valid Unicode, or ``None``: "a lone surrogate (...) at position N..."
    (the only way a Python ``str`` can fail; no UTF-8 encoder accepts one)."""
    if text.isascii():
        return None
    match = _SURROGATE.search(text)
    if match is None:
        return None
    return f"a lone surrogate (U+{ord(match.group()):04X}) at position {match.start()}, which is not valid Unicode"


def _nests_deeper(plain: Any, max_depth: int) -> bool:
    """Whether arrays and objects nest more than ``max_depth`` levels deep in ``plain`` (decoded
    JSON, so only exact builtin types). A level-by-level sweep whose per-element work runs in C
    (map, compress, chain): it costs about what decoding the value did, whatever its strings hold."""
    level = [plain]
    for _ in range(max_depth):
        types = list(map(type, level))
        children = list(chain(
            chain.from_iterable(map(dict.values, compress(level, map(_IS_DICT, types)))),
            chain.from_iterable(compress(level, map(_IS_LIST, types))),
        ))
        level = list(compress(children, map(_IS_CONTAINER, map(type, children))))
        if not level:
            return False
    return True


def _path(node: tuple | None) -> str:
    """JSONPath-like text of a walk node (a linked list ``(parent, key)``), built only to report."""
    parts: list[str] = []
    while node is not None:
        node, key = node
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif key.isidentifier() and len(key) <= 40:
            parts.append(f".{key}")
        else:
            parts.append(f"[{clip(key, 40)}]")
    return "$" + "".join(reversed(parts))


def _find_problem(value: Any, max_depth: int) -> str | None:
    """The first part of ``value`` that is not plain JSON, said in words, or ``None``.

    An iterative walk that never goes deeper than ``max_depth`` (so cycles and 100,000-deep
    nesting end quickly). It runs only after the fast check failed, to say what and where.
    """
    stack: list[tuple[Any, tuple | None, int]] = [(value, None, 1)]
    while stack:
        item, node, depth = stack.pop()
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            why = unicode_problem(item)
            if why is not None:
                return f"the string at {_path(node)} holds {why}"
        elif isinstance(item, int):
            if not JSON_INT_MIN <= item <= JSON_INT_MAX:
                digits = int(item.bit_length() * 0.30103) + 1
                return f"the integer at {_path(node)} (about {digits} digits) is outside the 64-bit range ({_BIG_INT})"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"the number at {_path(node)} is {_NON_FINITE.get(repr(item), repr(item))}, which JSON cannot hold"
        elif isinstance(item, (list, tuple, dict)):
            if depth > max_depth:
                return f"arrays and objects nest more than {max_depth} levels deep"
            if isinstance(item, dict):
                for key, sub in item.items():
                    if not isinstance(key, str):
                        return f"the object at {_path(node)} has a key that is not a string ({type(key).__name__})"
                    why = unicode_problem(key)
                    if why is not None:
                        return f"a key of the object at {_path(node)} holds {why}"
                    stack.append((sub, (node, key), depth + 1))
            else:
                stack.extend((sub, (node, i), depth + 1) for i, sub in enumerate(item))
        else:
            return f"the value at {_path(node)} is a Python {type(item).__name__}, which JSON cannot hold"
    return None


def _limits(plain: Any, containers: int, max_depth: int) -> tuple[Any, str | None]:
    """Apply the depth and integer limits to ``plain``, decoded from JSON that has at most
    ``containers`` arrays and objects (a count of brackets, which may include some in strings)."""
    if containers > max_depth and _nests_deeper(plain, max_depth):
        return None, f"arrays and objects nest more than {max_depth} levels deep"
    try:
        _msgpack_encoder.encode(plain)  # C-fast, and refuses exactly the ints beyond 64 bits
    except OverflowError:
        return None, _find_problem(plain, max_depth) or f"an integer is outside the 64-bit range ({_BIG_INT})"
    return plain, None


def to_plain_json(value: Any, max_depth: int = MAX_JSON_DEPTH) -> tuple[Any, str | None]:
    """``(value as plain JSON builtins, None)``, or ``(None, why it is not plain JSON)``.

    Fast enough for every step: msgspec encodes and decodes the value in C, and a C-level ``==``
    confirms that nothing was converted on the way (msgspec writes NaN and Infinity as ``null``,
    sets and tuples as arrays, bytes as base64, int keys as strings). Only when that fails does a
    Python walk look for what to report (a tuple or a subclass is fine: it is returned as its
    plain form). Never raises, whatever ``value`` holds (cycles and deep nesting included).
    """
    data = plain = None
    decoded = same = False
    try:
        data = _json_encoder.encode(value)
        plain = _json_decoder.decode(data)
        decoded = True
        same = plain == value
    except Exception:  # msgspec's refusals, RecursionError, or an object's own failing methods
        pass
    if not same:
        try:
            problem = _find_problem(value, max_depth)
        except Exception as exc:  # a container whose iteration fails
            problem = f"the value cannot be read as JSON ({type(exc).__name__})"
        if problem is not None:
            return None, problem
        if not decoded:
            return None, "the value cannot be encoded as JSON"
    assert data is not None
    return _limits(plain, data.count(b"[") + data.count(b"{"), max_depth)


def loads_plain_json(text: str, max_depth: int = MAX_JSON_DEPTH) -> tuple[Any, str | None]:
    """Decode agent-written JSON ``text``: ``(value, None)`` or ``(None, why it is not valid)``.

    Strict JSON (no ``NaN``/``Infinity`` literals, no lone surrogate escapes) with the limits of
    :func:`to_plain_json`. Never raises.
    """
    try:
        plain = _json_decoder.decode(text)
    except UnicodeEncodeError as exc:
        return None, f"the text holds a lone surrogate (U+{ord(text[exc.start]):04X}) at position {exc.start}, which is not valid Unicode"
    except RecursionError:
        return None, f"arrays and objects nest more than {max_depth} levels deep"
    except msgspec.ValidationError as exc:  # msgspec's only one for untyped decoding: a number out of range
        if "Integer" in str(exc):
            return None, f"an integer is outside the 64-bit range ({_BIG_INT})"
        return None, "a number is too large for a float"
    except msgspec.DecodeError as exc:
        lone = _LONE_ESCAPE.search(text)
        if lone is not None:
            return None, f"the text is not valid JSON (the escape {lone.group()} at position {lone.start()} is a lone surrogate)"
        detail = _AT_BYTE.sub(r" at byte \1", str(exc).removeprefix("JSON is malformed: "))
        return None, f"the text is not valid JSON ({detail[:1].lower()}{detail[1:]})"
    except Exception as exc:  # pragma: no cover - msgspec documents only the errors above
        return None, f"the text is not valid JSON ({type(exc).__name__})"
    return _limits(plain, text.count("[") + text.count("{"), max_depth)
