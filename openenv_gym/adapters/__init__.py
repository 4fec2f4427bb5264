"""The API for a backend's author: the adapter and episode to implement, what they exchange, the descriptor to register.

One folder per backend lives here (``ors/``, ``openenv/``, ``fleet/``, ``verifiers/``), each laid
out as docs/architecture.md ("Adding a backend") says; these names are imported on first use, so
importing a backend's package stays cheap.
"""

from __future__ import annotations

from openenv_gym.backends import lazy_names

__all__ = ["Adapter", "AdapterSpec", "Backend", "Episode", "Opening", "Outcome", "Split", "TaskRef", "ToolSpec",
           "Turn", "check_call", "refuse_call", "register", "tool_message", "user_message"]

_LAZY = {
    "Adapter": "openenv_gym.adapters.base", "AdapterSpec": "openenv_gym.adapters.base",
    "Episode": "openenv_gym.adapters.base", "Backend": "openenv_gym.backends", "register": "openenv_gym.backends",
    "Opening": "openenv_gym.wire", "Outcome": "openenv_gym.wire", "Split": "openenv_gym.wire",
    "TaskRef": "openenv_gym.wire", "ToolSpec": "openenv_gym.wire", "Turn": "openenv_gym.actions",
    "check_call": "openenv_gym.actions", "refuse_call": "openenv_gym.actions",
    "tool_message": "openenv_gym.actions", "user_message": "openenv_gym.actions",
}


__getattr__ = lazy_names(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
