"""ConversationHistory: the observation is the whole conversation, not just the new messages.

An openenv_gym env observes only the messages that are new since the agent's last action
(docs/architecture.md, "The Gymnasium contract"), which is what a vector env ships cheaply; a
trainer that feeds a chat template wants the whole conversation, its own turns included. This
module owns the wrapper that keeps it, and the two rules every wrapper of the package follows to
read a step, so wrappers compose in any order:

* the messages a step added are ``info["new_messages"]`` when a wrapper below already turned the
  observation into something else (this one does), else the observation (:func:`new_messages`);
* the agent's turn is ``info["assistant_message"]`` when a wrapper below changed the action on its
  way to the env (:class:`~openenv_gym.wrappers.TextToolCalls` parses text into tool calls,
  :class:`~openenv_gym.wrappers.ChatTokens` decodes token ids), else the action itself, normalised
  by :func:`~openenv_gym.records.as_assistant_message` (:func:`sent_message`).
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
from gymnasium.utils import RecordConstructorArgs

from openenv_gym.records import as_assistant_message
from openenv_gym.wire import Message

__all__ = ["ConversationHistory", "new_messages", "sent_message"]


def new_messages(observation: Any, info: dict[str, Any]) -> list[Message]:
    """The messages a reset or step added: ``info["new_messages"]`` if a wrapper below set it,
    else the observation."""
    got = info.get("new_messages", observation)
    return list(got) if isinstance(got, (list, tuple)) else []


def sent_message(action: Any, info: dict[str, Any]) -> Message:
    """The agent's turn as the env below understood it: ``info["assistant_message"]`` if a wrapper
    below rewrote the action, else the action as an assistant message."""
    message = info.get("assistant_message")
    return message if isinstance(message, dict) else as_assistant_message(action)


class ConversationHistory(gym.Wrapper, RecordConstructorArgs):
    """Observe the whole conversation so far; ``info["new_messages"]`` keeps the increment.

    After ``reset`` the observation is the opening messages; after each step it is the previous
    observation plus the agent's turn (as an assistant message dict: text becomes
    ``{"role": "assistant", "content": text}``, tool calls get ids and JSON-string arguments, see
    :func:`~openenv_gym.records.as_assistant_message`) plus the step's new messages. Each
    observation is a fresh list (keeping one is safe); the message dicts in it are shared with
    earlier observations and must not be modified. ``info["new_messages"]`` is what the inner env
    observed. The observation space is unchanged (a list of chat messages).

    :attr:`messages` is the same conversation, for a caller holding the wrapper.

    Example:
        >>> import gymnasium as gym, openenv_gym
        >>> from openenv_gym.wrappers import ConversationHistory
        >>> env = ConversationHistory(gym.make("openenv/Arithmetic-v0"))
        >>> obs, info = env.reset(seed=0)
        >>> [m["role"] for m in obs]
        ['user']
        >>> obs, *_, info = env.step("I think it is 4.")
        >>> [m["role"] for m in obs], [m["role"] for m in info["new_messages"]]
        (['user', 'assistant', 'user'], ['user'])
        >>> env.close()
    """

    def __init__(self, env: gym.Env):
        RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        self._messages: list[Message] = []

    @property
    def messages(self) -> list[Message]:
        """The conversation of the current episode, oldest first (a copy of the list)."""
        return list(self._messages)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Reset the inner env; the observation is its opening messages."""
        obs, info = self.env.reset(seed=seed, options=options)
        info = dict(info)
        added = new_messages(obs, info)
        info["new_messages"] = added
        self._messages = list(added)
        return list(self._messages), info

    def step(self, action: Any) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the inner env; the observation is the conversation including this turn."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        added = new_messages(obs, info)
        info["new_messages"] = added
        self._messages.append(sent_message(action, info))
        self._messages.extend(added)
        return list(self._messages), reward, terminated, truncated, info
