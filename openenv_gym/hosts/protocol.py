"""The adapter host's wire: length-prefixed msgspec msgpack frames over one Unix socket.

A driver and the host process it started share a ``socketpair`` (no path on disk, so no other
process of the machine can connect to it, whoever it runs as). Each message is one
:class:`Frame`: a 4-byte big-endian length, then the msgpack-encoded frame.

Driver to host, ``kind`` is a method of :class:`~openenv_gym.hosts.shard.EnvHost` (plus ``init``,
which builds it, and ``bye``, which ends the host); ``id`` pairs the answer with its request
(``0``: no answer wanted, as for ``cancel``). Host to driver, ``kind`` is ``reply`` (the method
returned ``body``), ``error`` (it raised; ``error`` is ``{"type", "message"}``) or ``results`` (some
of a ``run``'s results, sent as they finish, before its ``reply``; the ``reply`` of a ``run`` holds
the results not streamed yet, so a one-op run costs one frame each way). Op and result bodies are the
same msgpack bytes a Ray actor exchanges (:mod:`openenv_gym.vector.ops`).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec

__all__ = ["Frame", "PROTOCOL", "read_frame", "write_frame", "pack", "unpack", "MAX_FRAME"]

PROTOCOL = 2
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


def pack(frame: Frame) -> bytes:
    """``frame`` as it goes on the wire: its length, then its msgpack."""
    data = _encoder.encode(frame)
    return _HEADER.pack(len(data)) + data


def unpack(buffer: bytearray) -> Frame | None:
    """Take the first whole frame off ``buffer`` (``None``: not all of it has come yet);
    ``ValueError`` on a corrupted stream. For a driver reading a blocking socket itself."""
    if len(buffer) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack_from(buffer)
    if size > MAX_FRAME:
        raise ValueError(f"a host frame of {size} bytes is beyond the {MAX_FRAME}-byte limit")
    end = _HEADER.size + size
    if len(buffer) < end:
        return None
    data = bytes(buffer[_HEADER.size:end])
    del buffer[:end]
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"a corrupted host frame: {exc}") from None


def write_frame(writer: asyncio.StreamWriter, frame: Frame) -> None:
    """Queue ``frame`` on ``writer`` (the caller drains when it needs back-pressure)."""
    writer.write(pack(frame))


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
