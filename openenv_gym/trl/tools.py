"""Python functions that stand for an env's tools, for TRL to read their schemas and call them.

TRL's ``environment_factory`` exposes an environment's public methods as the model's tools, and
describes each to the model with ``transformers.utils.get_json_schema``, which reads a function's
name, its Google-style docstring and its type hints. :func:`tool_function` writes, for one
:class:`~openenv_gym.wire.ToolSpec`, the function whose schema that reader gives back as the
env's own: the tool's name, description, parameters (in the env's order), their types, which are
required, and their descriptions. No source is generated or executed: the function takes
``**arguments`` and carries the tool's signature as ``__signature__`` (keyword-only parameters,
so the env's parameter order survives whatever is required), its type hints as
``__annotations__`` and its description as ``__doc__``.

What a Python signature can say is less than what a JSON schema can, so some of a schema reaches
the model changed (:func:`schema_loss` names what, and :class:`EnvSpec` warns once per tool):

* types map to hints and back: ``string``/``integer``/``number``/``boolean``/``null``, arrays
  (``items`` kept), objects (``additionalProperties`` kept; nested ``properties`` are not), scalar
  ``enum`` (as ``Literal``), unions (``type`` lists and ``anyOf``; ``null`` becomes
  ``nullable: true``); constraints (``minimum``, ``pattern``, ``format``, defaults...) and
  ``$ref``/``allOf`` are not expressible and are dropped;
* descriptions: a parameter without one is described by its title or name (the reader requires
  one); a tool without one gets "Call the NAME tool."; whitespace is normalised as the reader
  does it; the reader cuts a description at ``Args:``, ``Returns:`` or ``Raises:`` and reads a
  trailing ``(choices: [...])`` as an enum, so such text gets a space before its colon (``Args :``)
  or a final period.

Tool and parameter names the model may call but a Python signature cannot hold (a parameter named
``from``, a tool named ``reset``) are refused with :class:`~openenv_gym.errors.ConfigurationError`
by :func:`check_names` rather than silently left out.
"""

from __future__ import annotations

import inspect
import keyword
import re
from collections.abc import Callable
from typing import Any, Literal, Union

from openenv_gym.errors import ConfigurationError
from openenv_gym.wire import ToolSpec

__all__ = ["tool_function", "type_hint", "schema_loss", "check_names", "RESERVED"]

RESERVED = frozenset({"reset", "get_reward"})
"""Method names TRL gives a meaning of its own: an env tool cannot be one of them."""

_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool,
                               "null": type(None), "array": list, "object": dict}
_SCALARS = (str, int, float, bool, type(None))
# What get_json_schema's docstring parser treats as section headers, anywhere in the text.
_MARKERS = re.compile(r"(Args|Returns|Raises):")
_CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE)
# Keys a type hint carries back (the rest of a property's schema cannot be said in Python).
_KEPT = frozenset({"type", "items", "enum", "anyOf", "additionalProperties", "description", "title", "default"})


def type_hint(schema: Any) -> Any:
    """The Python type hint whose JSON schema (as ``get_json_schema`` writes it) is ``schema``'s type."""
    if not isinstance(schema, dict):
        return Any
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(type(v) in _SCALARS for v in enum):
        return Literal[tuple(enum)]
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list) and options:
        return _union([type_hint(o) for o in options])
    kind = schema.get("type")
    if isinstance(kind, list) and kind:
        return _union([type_hint({**schema, "type": k}) for k in kind])
    if kind == "array":
        items = schema.get("items")
        return list[type_hint(items)] if isinstance(items, dict) and items else list  # type: ignore[misc]
    if kind == "object":
        extra = schema.get("additionalProperties")
        return dict[str, type_hint(extra)] if isinstance(extra, dict) and extra else dict  # type: ignore[misc]
    return _JSON_TYPES.get(kind, Any) if isinstance(kind, str) else Any


def _union(hints: list[Any]) -> Any:
    unique = list(dict.fromkeys(hints))
    if Any in unique:
        return Any
    # A Union over a runtime tuple has no `X | Y` spelling; reduce(operator.or_, ...) would give a
    # types.UnionType for some hints and a typing.Union for others, where this is always a typing.Union.
    return unique[0] if len(unique) == 1 else Union[tuple(unique)]  # noqa: UP007


def schema_loss(spec: ToolSpec) -> list[str]:
    """What of ``spec``'s parameter schema a type hint cannot carry (empty: nothing is lost)."""
    lost = []
    for name, prop in _properties(spec).items():
        if not isinstance(prop, dict):
            continue
        dropped = sorted(set(prop) - _KEPT)
        if prop.get("type") == "object" and "properties" in prop:
            dropped = sorted(set(dropped) | {"properties"})
        if dropped:
            lost.append(f"{name}: {', '.join(dropped)}")
    return lost


def _properties(spec: ToolSpec) -> dict[str, Any]:
    props = (spec.parameters or {}).get("properties")
    return props if isinstance(props, dict) else {}


def check_names(specs: list[ToolSpec], env: str) -> None:
    """Refuse tools that a TRL environment class cannot offer, naming each and why."""
    seen: set[str] = set()
    for spec in specs:
        name = spec.name
        why = None
        if name in RESERVED:
            why = f"TRL reserves the method name {name!r} (reset, get_reward)"
        elif not name or name.startswith("_"):
            why = "TRL does not offer methods whose names start with '_'"
        elif name in seen:
            why = "two tools have this name"
        else:
            bad = [p for p in _properties(spec) if not p.isidentifier() or keyword.iskeyword(p) or p == "self"]
            if bad:
                why = (f"its parameter(s) {', '.join(map(repr, bad))} cannot be Python parameters, and TRL reads "
                       "a tool's schema from a Python signature")
        if why is not None:
            raise ConfigurationError(f"{env}: tool {name!r} cannot be offered through TRL's environment_factory: {why}")
        seen.add(name)


def _text(text: Any) -> str:
    """One line as the docstring reader leaves it: whitespace runs with newlines become a space."""
    text = re.sub(r"\s*\n+\s*", " ", str(text or "")).strip()
    return _MARKERS.sub(r"\1 :", text)


def _description(spec: ToolSpec) -> str:
    text = inspect.cleandoc(str(spec.description or "")).strip()
    return _MARKERS.sub(r"\1 :", text) if text else f"Call the {spec.name} tool."


def _param_description(name: str, prop: Any) -> str:
    prop = prop if isinstance(prop, dict) else {}
    text = _text(prop.get("description")) or _text(prop.get("title")) or name
    return text + "." if _CHOICES.search(text) else text


def tool_function(spec: ToolSpec, call: Callable[[Any, str, dict[str, Any]], str]) -> Callable[..., str]:
    """A function ``(self, **arguments) -> str`` for the env's tool ``spec``, calling
    ``call(self, name, arguments)``; its signature, hints and docstring describe ``spec``.

    Defined on a class, it is the method TRL offers the model and calls with the arguments the
    model wrote; what they are worth is the env's to say (a missing or unknown argument reaches the
    model as the env's answer, as in every env).
    """
    name = spec.name
    params = _properties(spec)
    required = (spec.parameters or {}).get("required")
    required = set(required) if isinstance(required, list) else set()

    def tool(self: Any, **arguments: Any) -> str:
        return call(self, name, arguments)

    hints = {p: type_hint(prop) for p, prop in params.items()}
    signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for p, hint in hints.items():
        default = inspect.Parameter.empty if p in required else _default(params[p])
        signature.append(inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))
    lines = [_description(spec)]
    if params:
        lines += ["", "Args:"] + [f"    {p}: {_param_description(p, prop)}" for p, prop in params.items()]
    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = "\n".join(lines)
    tool.__signature__ = inspect.Signature(signature, return_annotation=str)  # type: ignore[attr-defined]
    tool.__annotations__ = {**hints, "return": str}
    return tool


def _default(prop: Any) -> Any:
    """An optional parameter's default as the signature shows it (the env applies its own)."""
    if isinstance(prop, dict) and "default" in prop:
        return prop["default"]
    return None

