"""Incremental Server-Sent Events decoding, following the WHATWG ``text/event-stream`` rules.

This module owns turning the text of an SSE response into events. ORS servers answer every tool
call (and ``/create_session``) with an SSE stream (``task_id``, ``chunk``..., ``end`` or
``error``; CRLF line endings; ``: ping`` keep-alive comments), so this sits on the hot path of
every ``step``. It is dependency-free apart from msgspec, works on text chunks with arbitrary
boundaries (as ``httpx.Response.iter_text`` yields them), and scans with C-level string methods
instead of per-character Python loops.

Decisions where the spec leaves room or where ORS needs more:

* Only CR, LF and CRLF end lines (``str.splitlines`` would also split on U+2028, U+0085, ...,
  which may appear inside JSON data). A CR that ends one chunk and an LF that starts the next
  form a single CRLF, not an extra empty line.
* ``id`` follows the spec: the last event ID persists across events until another ``id`` field
  changes it (an ``id`` value containing NUL is ignored). ``retry`` is reported on the event
  whose block carried it (``None`` otherwise) instead of as decoder-wide state. A ``retry`` of
  more than 18 digits is ignored, like one that is not a number.
* At end of stream (:meth:`SSEDecoder.close`) the spec discards an event that lacks its
  terminating blank line. We dispatch it when every one of its lines was complete (ended by a
  line ending), because a server that closes right after the last ``data:`` line has sent the
  whole event. If the stream stops in the middle of a line, the line may be truncated, so that
  event is discarded as the spec says.
"""

from __future__ import annotations

import msgspec

__all__ = ["ServerSentEvent", "SSEDecoder", "parse_sse"]

_MAX_RETRY_DIGITS = 18
"""Longer ``retry`` values (over 30 million years in ms) are ignored: ``int()`` of thousands of
digits raises, and no reconnection time needs more than a 64-bit integer."""


class ServerSentEvent(msgspec.Struct, frozen=True):
    """One dispatched event. ``data`` lines are joined with ``"\\n"``."""

    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Feed decoded text chunks with arbitrary boundaries; get complete events back.

    ``comments`` counts complete comment lines (``:`` first) seen so far, which makes keep-alive
    pings observable. ``last_event_id`` is the spec's last event ID buffer (``None`` until an
    ``id`` field is seen).
    """

    __slots__ = (
        "comments",
        "last_event_id",
        "_pending",
        "_skip_lf",
        "_at_start",
        "_event",
        "_data",
        "_retry",
    )

    def __init__(self) -> None:
        self.comments: int = 0
        self.last_event_id: str | None = None
        # Pieces of the current unterminated line; a list so a long line arriving in many small
        # chunks is joined once (linear) instead of re-concatenated per chunk (quadratic).
        self._pending: list[str] = []
        self._skip_lf = False
        self._at_start = True
        self._event = ""
        self._data: list[str] = []
        self._retry: int | None = None

    def feed(self, chunk: str) -> list[ServerSentEvent]:
        """Consume ``chunk`` and return the events it completed, in order."""
        if not chunk:
            return []
        if self._at_start:
            self._at_start = False
            # The spec strips one leading BOM from the stream.
            if chunk[0] == "\ufeff":
                chunk = chunk[1:]
                if not chunk:
                    return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == "\n":
                chunk = chunk[1:]
                if not chunk:
                    return []
        if "\n" not in chunk and "\r" not in chunk:
            self._pending.append(chunk)
            return []
        if self._pending:
            self._pending.append(chunk)
            chunk = "".join(self._pending)
            self._pending = []
        if "\r" in chunk:
            # A trailing CR already ends its line; remember to swallow an LF opening the next chunk.
            self._skip_lf = chunk[-1] == "\r"
            chunk = chunk.replace("\r\n", "\n").replace("\r", "\n")
        lines = chunk.split("\n")
        tail = lines.pop()
        if tail:
            self._pending.append(tail)
        return self._process(lines)

    def close(self) -> list[ServerSentEvent]:
        """Signal end of stream; return the final event if it is complete (see module docs).

        The decoder is then ready for a new stream; ``comments`` and ``last_event_id`` are kept.
        """
        truncated = bool(self._pending)
        events: list[ServerSentEvent] = []
        if not truncated and self._data:
            events.append(self._dispatch())
        self._pending = []
        self._skip_lf = False
        self._at_start = True
        self._reset_event()
        return events

    def _process(self, lines: list[str]) -> list[ServerSentEvent]:
        events: list[ServerSentEvent] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(self._dispatch())
                else:
                    # No data line: the spec drops the event but clears its buffers.
                    self._reset_event()
                continue
            if line[0] == ":":
                self.comments += 1
                continue
            field, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if field == "data":
                self._data.append(value)
            elif field == "event":
                self._event = value
            elif field == "id":
                if "\0" not in value:
                    self.last_event_id = value
            elif field == "retry":
                if value.isascii() and value.isdigit() and len(value) <= _MAX_RETRY_DIGITS:
                    self._retry = int(value)
        return events

    def _dispatch(self) -> ServerSentEvent:
        event = ServerSentEvent(
            event=self._event or "message",
            data="\n".join(self._data),
            id=self.last_event_id,
            retry=self._retry,
        )
        self._reset_event()
        return event

    def _reset_event(self) -> None:
        self._event = ""
        self._data = []
        self._retry = None


def parse_sse(text: str) -> list[ServerSentEvent]:
    """Decode a whole SSE body at once (the final event may lack its blank line)."""
    decoder = SSEDecoder()
    events = decoder.feed(text)
    events.extend(decoder.close())
    return events
