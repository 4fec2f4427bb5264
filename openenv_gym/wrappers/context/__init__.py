"""ContextManagement: the Fleet context tools, answered locally, for any AgentEnv.

One module a part: :mod:`~openenv_gym.wrappers.context.tools` (the five tool specs and the caps
on their answers), :mod:`~openenv_gym.wrappers.context.pages` (stored outputs, searched and paged
exactly), :mod:`~openenv_gym.wrappers.context.calls` (the agent's action split into local and
forwarded calls, and the answers put back in order) and
:mod:`~openenv_gym.wrappers.context.wrapper` (the wrapper itself).
"""

from openenv_gym.wrappers.context.tools import CONTEXT_TOOLS, DEFAULT_MAX_OUTPUT_CHARS, DEFAULT_PAGE_SIZE
from openenv_gym.wrappers.context.wrapper import ContextManagement

__all__ = ["ContextManagement", "CONTEXT_TOOLS", "DEFAULT_MAX_OUTPUT_CHARS", "DEFAULT_PAGE_SIZE"]
