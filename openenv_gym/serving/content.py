"""Messages as the protocols carry them: content items of text and images.

A served session answers with the messages the env produced (OpenAI chat format). ORS sends
content as *blocks* (``{"type": "text", "text", "detail"}``, ``{"type": "image", "data",
"mimeType", "detail"}``) and MCP as *content items* of the same shape without ``detail``, so one
conversion serves both: :func:`items` of a message's content, in order, with images written as
base64 ``data:`` URLs turned back into their data and MIME type.
"""

from __future__ import annotations

from typing import Any

from openenv_gym.wire import Message, json_encode

__all__ = ["items", "message_items", "text_of", "ors_blocks", "ROLES"]

ROLES = frozenset({"system", "user", "assistant"})
"""The roles an ORS ``/messages`` answer may carry; any other (a ``tool`` message in an opening)
is sent as ``user``."""


def _text_item(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _image_item(url: str) -> dict[str, Any]:
    # data:<mime>;base64,<data>; any other URL (the env linked an image) stays a text item.
    head, sep, data = url.partition(",")
    if url.startswith("data:") and sep and head.endswith(";base64"):
        return {"type": "image", "data": data, "mimeType": head[5:-7] or "image/png"}
    return _text_item(url)


def items(content: Any) -> list[dict[str, Any]]:
    """A message's ``content`` (text, or a list of OpenAI content parts) as content items."""
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [_text_item(content)]
    if not isinstance(content, list):
        return [_text_item(_json(content))]
    out = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            out.append(_text_item(part["text"]))
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            out.append(_image_item(url) if isinstance(url, str) else _text_item(_json(part)))
        else:
            out.append(_text_item(_json(part)))
    return out


def message_items(messages: list[Message]) -> list[dict[str, Any]]:
    """The content items of every message, in order (what one call or one opening produced)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        out += items(message.get("content"))
    return out


def text_of(content_items: list[dict[str, Any]]) -> str:
    """The text items joined by newlines (images left out)."""
    return "\n".join(i["text"] for i in content_items if i.get("type") == "text")


def ors_blocks(content_items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Content items as ORS blocks (every block carries ``detail``, as the SDK servers send it)."""
    return [{**i, "detail": None} for i in content_items]


def _json(value: Any) -> str:
    try:
        return json_encode(value).decode()
    except Exception:
        return repr(value)
