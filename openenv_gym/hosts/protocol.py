"""The adapter host's wire: length-prefixed msgspec msgpack frames over one Unix socket.

A driver and the host process it started share a ``socketpair`` (no path on disk, so no other
process of the machine can connect to it, whoever it runs as). Each message is one
:class:`Frame`: a 4-byte big-endian length, then the msgpack-encoded frame.

Driver to host, ``kind`` is one of the closed set of :class:`Kind` requests: a method of the
host's :class:`~openenv_gym.shard.shard.Shard`, plus ``INIT`` (builds it from a pickled
:class:`~openenv_gym.shard.shard.ShardConfig`) and ``BYE`` (ends the host); ``id`` pairs the
answer with its request (``0``: no answer wanted, as for ``CANCEL``). Host to driver, ``kind`` is
``REPLY`` (the method returned ``body``), ``ERROR`` (it raised; ``error`` is ``{"type",
"message"}``) or ``RESULTS`` (some of a ``RUN``'s results, sent as they finish, before its
``REPLY``; the ``REPLY`` of a ``RUN`` holds the results not streamed yet, so a one-op run costs one
frame each way). Op and result bodies are the same msgpack bytes a Ray actor exchanges
(:mod:`openenv_gym.shard.ops`).
"""

from __future__ import annotations

import asyncio
import enum
import struct
from typing import Any

import msgspec

__all__ = ["Frame", "Kind", "PROTOCOL", "read_frame", "write_frame", "pack", "unpack", "MAX_FRAME"]

PROTOCOL = 3
"""Bumped on any change of the frames or the methods; both ends check it at ``init``."""

MAX_FRAME = 1 << 30
"""Bytes one frame may hold: a length beyond this is a corrupted stream, not a message."""

_HEADER = struct.Struct(">I")


class Kind(enum.IntEnum):
    """What a frame is: a request of the driver, or an answer of the host."""

    INIT = 0
    START = 1
    RUN = 2
    CANCEL = 3
    CALL = 4
    SET_ATTR = 5
    PID = 6
    CLOSE = 7
    BYE = 8
    REPLY = 20
    ERROR = 21
    RESULTS = 22


class Frame(msgspec.Struct, array_like=True, omit_defaults=True):
    id: int
    kind: Kind
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
