"""Gymnasium wrappers over openenv_gym environments.

Each wrapper works on any env that follows the package's contract (docs/architecture.md, "The
Gymnasium contract"): chat-message observations, assistant-message actions, OpenAI tool specs in
``info["tools"]``. None of them depends on a backend, and they compose in any order.

* :class:`ContextManagement` — the Fleet context tools (``check_context``, ``manage_context``,
  ``search_history``, ``search_tool_output``, ``view_tool_output``) answered locally, with long
  tool outputs truncated and kept in full for exact paging.
* :class:`ConversationHistory` — the observation is the whole conversation so far, the agent's
  own turns included; ``info["new_messages"]`` keeps the increment.
* :class:`TextToolCalls` — tool calls written as text (Hermes/Qwen ``<tool_call>``, Llama 3 JSON,
  Mistral ``[TOOL_CALLS]``) parsed into OpenAI tool calls, for models served without a tool parser.
* :class:`RecordEpisodes` — every finished episode written as an
  :class:`~openenv_gym.records.EpisodeRecord` JSON line, rotating by size, safe to read while
  written.
* :class:`ChatTokens` — the prompt's token ids from a Hugging Face chat template, token-id
  actions, and a turn-to-turn prefix check (needs ``pip install openenv-gym[tokens]``).

How they talk to each other, through ``info`` (so the order of wrapping does not lose anything):
a wrapper that rewrites the action on its way to the env sets ``info["assistant_message"]`` (the
turn the env understood); one that changes the observation sets ``info["new_messages"]`` (what the
env observed). Wrappers above read those keys when present (see
:func:`~openenv_gym.wrappers.conversation.sent_message` and
:func:`~openenv_gym.wrappers.conversation.new_messages`). A typical stack for training a model
served without a tool parser, innermost first::

    env = gym.make("openenv/Arithmetic-v0")
    env = TextToolCalls(env, formats=["hermes"])      # text -> tool calls
    env = ChatTokens(env, tokenizer)                  # token ids in and out, prefix check
    env = RecordEpisodes(env, "episodes.jsonl")       # one record per finished episode
"""

from __future__ import annotations

from openenv_gym.wrappers.chat_tokens import ChatTokens
from openenv_gym.wrappers.context import CONTEXT_TOOLS, ContextManagement
from openenv_gym.wrappers.conversation import ConversationHistory
from openenv_gym.wrappers.record import RecordEpisodes
from openenv_gym.wrappers.text_tool_calls import FORMATS, TextToolCalls, ToolText, parse_tool_text

__all__ = [
    "CONTEXT_TOOLS",
    "ChatTokens",
    "ContextManagement",
    "ConversationHistory",
    "FORMATS",
    "RecordEpisodes",
    "TextToolCalls",
    "ToolText",
    "parse_tool_text",
]
