"""Stored tool outputs and their pages: the text the context tools search and show, exactly."""

from __future__ import annotations

import json
import re
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from typing import Any

from openenv_gym.wire import Message
from openenv_gym.wrappers.context.tools import SNIPPET_CHARS

__all__ = ["text_of", "calls_text", "message_chars", "count_lines", "compile_pattern", "snippet", "Page", "pieces",
           "paginate", "StoredOutput", "page_header"]


# -- text helpers -------------------------------------------------------------------------------


def text_of(content: Any) -> str:
    """The text of a message's content: the string, or its text parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(
        p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
    )


def calls_text(message: Message, skip: Container[str] = ()) -> str:
    """The tool calls of an assistant message as ``name(arguments)`` lines (for size and search)."""
    lines = []
    for call in message.get("tool_calls") or ():
        fn = (call.get("function") or {}) if isinstance(call, dict) else {}
        if fn.get("name") in skip:
            continue
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False, default=str) if args is not None else ""
        lines.append(f"{fn.get('name', '')}({args})")
    return "\n".join(lines)


def message_chars(message: Message) -> int:
    # Text only: an image's base64 data URL says nothing useful about its token cost.
    return len(text_of(message.get("content"))) + len(calls_text(message))


def count_lines(text: str) -> int:
    return text.count("\n") + (0 if text == "" or text.endswith("\n") else 1)


def compile_pattern(pattern: str) -> tuple[re.Pattern[str], str]:
    """The pattern as a case-insensitive regex, or as literal text when it is not a valid regex.

    Python's ``re`` has no timeout, so a catastrophically backtracking pattern over a huge output
    stalls the step; the answers are capped, the scan is not. A known, accepted limitation.
    """
    try:
        return re.compile(pattern, re.IGNORECASE), ""
    except (re.error, RecursionError, OverflowError) as exc:
        note = f"Note: {pattern!r} is not a valid regular expression ({exc}); searched for it as literal text.\n"
        return re.compile(re.escape(pattern), re.IGNORECASE), note


def snippet(text: str, match: re.Match[str]) -> str:
    """One line of context around ``match``, at most about ``SNIPPET_CHARS`` characters."""
    start = max(0, match.start() - SNIPPET_CHARS // 3)
    end = min(len(text), max(match.end(), start + SNIPPET_CHARS))
    end = min(end, start + SNIPPET_CHARS)
    piece = text[start:end].replace("\r", " ").replace("\n", " ")
    return ("…" if start > 0 else "") + piece + ("…" if end < len(text) else "")


# -- paging ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    start: int  # character offsets into the output: the page body is text[start:end]
    end: int
    first_line: int  # 1-based line numbers of the first and last (possibly partial) lines
    last_line: int
    starts_mid_line: bool
    ends_mid_line: bool


def pieces(text: str, budget: int | None) -> Iterator[tuple[int, int, int, bool, bool]]:
    """``(start, end, line, starts_line, ends_line)`` for each line, long lines cut into ``budget`` chunks.

    Lines end at ``\\n`` only and keep it, so ``\\r\\n`` stays inside its line and a lone ``\\r``
    or a Unicode separator does not split one: the pieces concatenate back to ``text`` exactly.
    """
    pos, line, n = 0, 0, len(text)
    while pos < n:
        nl = text.find("\n", pos)
        end = n if nl < 0 else nl + 1
        line += 1
        if budget is None or end - pos <= budget:
            yield pos, end, line, True, True
        else:
            for s in range(pos, end, budget):
                e = min(s + budget, end)
                yield s, e, line, s == pos, e == end
        pos = end


def paginate(text: str, page_size: int, budget: int | None) -> list[Page]:
    """Split ``text`` into pages of at most ``page_size`` lines and ``budget`` characters.

    The character budget is why a page may hold fewer lines than asked: one page of a minified
    JSON dump would otherwise be the whole dump, which is what truncation was protecting from.
    Every character lands on exactly one page, in order.
    """
    pages: list[Page] = []
    cur: list[Any] | None = None  # [start, end, first_line, last_line, starts_mid, ends_mid, pieces]
    for start, end, line, starts_line, ends_line in pieces(text, budget):
        if cur is not None and (
            cur[6] >= page_size or (budget is not None and (cur[1] - cur[0]) + (end - start) > budget)
        ):
            pages.append(Page(*cur[:6]))
            cur = None
        if cur is None:
            cur = [start, end, line, line, not starts_line, not ends_line, 1]
        else:
            cur[1], cur[3], cur[5], cur[6] = end, line, not ends_line, cur[6] + 1
    if cur is not None:
        pages.append(Page(*cur[:6]))
    return pages or [Page(0, 0, 0, 0, False, False)]


@dataclass
class StoredOutput:
    """The full text of one tool output the inner env returned."""

    id: int
    text: str
    truncated: bool
    lines: int = 0
    _pages: dict[tuple[int, int | None], list[Page]] = field(default_factory=dict, repr=False)

    def pages(self, page_size: int, budget: int | None) -> list[Page]:
        key = (page_size, budget)
        if key not in self._pages:  # agents page sequentially: don't re-split a megabyte per page
            if len(self._pages) >= 4:
                self._pages.clear()  # an agent trying many page sizes must not grow memory unboundedly
            self._pages[key] = paginate(self.text, page_size, budget)
        return self._pages[key]


def page_header(stored: StoredOutput, number: int, count: int, page: Page) -> str:
    if stored.lines == 0:
        return f"[output_id={stored.id} page 1 of 1: empty output]\n"
    first, last = page.first_line, page.last_line
    lines = f"line {first}" if first == last else f"lines {first}-{last}"
    remarks = []
    if page.starts_mid_line:
        remarks.append(f"line {page.first_line} began on the previous page")
    if page.ends_mid_line:
        remarks.append(f"line {page.last_line} continues on the next page")
    extra = f"; {'; '.join(remarks)}" if remarks else ""
    return f"[output_id={stored.id} page {number} of {count}: {lines} of {stored.lines}{extra}]\n"
