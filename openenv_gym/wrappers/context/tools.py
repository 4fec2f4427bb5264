"""The five context tools (OpenAI tool specs), and the caps on what one answer of theirs holds."""

from __future__ import annotations

from openenv_gym.wire import ToolSpec

__all__ = ["CONTEXT_TOOLS", "LOCAL", "DEFAULT_MAX_OUTPUT_CHARS", "DEFAULT_PAGE_SIZE", "MAX_HISTORY_HITS",
           "MAX_OUTPUT_HITS", "SNIPPET_CHARS"]

DEFAULT_MAX_OUTPUT_CHARS = 10_000
DEFAULT_PAGE_SIZE = 50

# Caps on what one answer holds, so the tools meant to save context cannot flood it themselves.
MAX_HISTORY_HITS = 20
MAX_OUTPUT_HITS = 50
SNIPPET_CHARS = 160

CONTEXT_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="check_context",
        description=(
            "Report the size of the conversation in your context: messages, turns, characters, an "
            "estimated token count (characters / 4), how many messages were pruned, and how many "
            "full tool outputs are stored. Answered locally; costs no environment turn."
        ),
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
    ),
    ToolSpec(
        name="manage_context",
        description=(
            "Free context space: keep the opening messages (system prompt and task) and only the "
            "last `keep_recent_turns` turns (a turn is one of your messages plus the messages "
            "answering it), dropping older turns. Dropped messages stay searchable with "
            "search_history, and tool outputs stay readable with view_tool_output."
        ),
        parameters={
            "type": "object",
            "properties": {
                "keep_recent_turns": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "How many of the most recent turns to keep.",
                }
            },
            "required": ["keep_recent_turns"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="search_history",
        description=(
            "Search the whole conversation, including pruned turns, with a case-insensitive Python "
            "regular expression (an invalid one is searched as literal text). Returns the matching "
            "messages with their positions. Tool outputs are searched as you saw them; use "
            "search_tool_output to search full, untruncated outputs. Calls to the context tools "
            "and their answers are not searched."
        ),
        parameters={
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "minLength": 1, "description": "The regular expression."}
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="search_tool_output",
        description=(
            "Search the full text of stored tool outputs line by line with a case-insensitive Python "
            "regular expression (an invalid one is searched as literal text). Returns output ids, "
            "line numbers and the page (of 50 lines) to pass to view_tool_output."
        ),
        parameters={
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "minLength": 1, "description": "The regular expression."},
                "output_id": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "description": "Search only this output (default: all stored outputs).",
                },
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="view_tool_output",
        description=(
            "Read a stored tool output by pages of lines. The answer is one header line "
            "('[output_id=N page i of n: lines a-b of L]'), then the page's text exactly as in the "
            "output. A page also stops before exceeding the truncation limit, splitting a very long "
            "line across pages; the header says so."
        ),
        parameters={
            "type": "object",
            "properties": {
                "output_id": {"type": "integer", "minimum": 1, "description": "The id from the truncation note."},
                "page": {"type": "integer", "minimum": 1, "description": "Page number, from 1 (default 1)."},
                "page_size": {
                    "type": "integer",
                    "minimum": 1,
                    "description": f"Lines per page (default {DEFAULT_PAGE_SIZE}).",
                },
            },
            "required": ["output_id"],
            "additionalProperties": False,
        },
    ),
)
LOCAL: dict[str, ToolSpec] = {t.name: t for t in CONTEXT_TOOLS}
