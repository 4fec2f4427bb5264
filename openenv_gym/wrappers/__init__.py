"""Gymnasium wrappers over openenv_gym environments.

Each wrapper works on any env that follows the package's contract (docs/architecture.md, "The
Gymnasium contract"): chat-message observations, assistant-message actions, OpenAI tool specs in
``info["tools"]``. None of them depends on a backend.

* :class:`ContextManagement` — the Fleet context tools (``check_context``, ``manage_context``,
  ``search_history``, ``search_tool_output``, ``view_tool_output``) answered locally, with long
  tool outputs truncated and kept in full for exact paging.
"""

from __future__ import annotations

from openenv_gym.wrappers.context import CONTEXT_TOOLS, ContextManagement

__all__ = ["CONTEXT_TOOLS", "ContextManagement"]
