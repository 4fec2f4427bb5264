"""The adapter host's wire: length-prefixed msgspec msgpack frames over one Unix socket.

A driver and the host process it started share a ``socketpair`` (no path on disk, so no other
process of the machine can connect to it, whoever it runs as). Each message is one
:class:`Frame`: a 4-byte big-endian length, then the msgpack-encoded frame.

Driver to host, ``kind`` is a method of :class:`~openenv_gym.hosts.shard.EnvHost` (plus ``init``,
which builds it, and ``bye``, which ends the host); ``id`` pairs the answer with its request
(``0``: no answer wanted, as for ``cancel``). Host to driver, ``kind`` is ``reply`` (the method
returned ``body``), ``error`` (it raised; ``error`` is ``{"type", "message"}``) or ``results`` (some
of a ``run``'s results, sent as they finish, before its ``reply``). Op and result bodies are the
same msgpack bytes a Ray actor exchanges (:mod:`openenv_gym.vector.ops`).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec

__all__ = ["Frame", "PROTOCOL", "read_frame", "write_frame", "MAX_FRAME"]

PROTOCOL = 1
"""Bumped on any change of the frames or the methods; both ends check it at ``init``."""

MAX_FRAME = 1 << 30
"""Bytes one frame may hold: a length beyond this is a corrupted stream, not a message."""

_HEADER = struct.Struct(">I")


class Frame(msgspec.Struct, array_like=True, omit_defaults=True):
    id: int
    kind: str
    body: bytes = b""
    error: dict[str, Any] | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Frame)


def write_frame(writer: asyncio.StreamWriter, frame: Frame) -> None:
    """Queue ``frame`` on ``writer`` (the caller drains when it needs back-pressure)."""
    data = _encoder.encode(frame)
    writer.write(_HEADER.pack(len(data)) + data)


async def read_frame(reader: asyncio.StreamReader) -> Frame | None:
    """The next frame, or ``None`` at a clean end of stream; ``ValueError`` on a corrupted one."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ValueError("the host stream ended inside a frame header") from None
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"a host frame of {size} bytes is beyond the {MAX_FRAME}-byte limit")
    try:
        data = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise ValueError("the host stream ended inside a frame") from None
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"a corrupted host frame: {exc}") from None
