"""Policies that drive an env from outside: what a rollout needs when no trainer is attached.

A policy maps the observation and info of one episode to the next action. ``RandomPolicy``
samples the env's action space (tool calls with schema-valid random arguments), the baseline that
exercises an environment end to end with no model.
"""

from __future__ import annotations

from typing import Any, Protocol

from openenv_gym.spaces import AssistantAction
from openenv_gym.wire import Message

__all__ = ["Policy", "RandomPolicy"]


class Policy(Protocol):
    """Chooses actions for one env."""

    def reset(self, observation: list[Message], info: dict[str, Any]) -> None:
        """A new episode began with ``observation``."""

    def act(self, observation: list[Message], info: dict[str, Any]) -> Any:
        """The next action, given the newest messages."""


class RandomPolicy:
    """Samples actions from the env's :class:`~openenv_gym.spaces.AssistantAction` space."""

    def __init__(self, action_space: AssistantAction, seed: int | None = None):
        self.action_space = action_space
        self.action_space.seed(seed)

    def reset(self, observation: list[Message], info: dict[str, Any]) -> None:
        pass

    def act(self, observation: list[Message], info: dict[str, Any]) -> Any:
        return self.action_space.sample()
