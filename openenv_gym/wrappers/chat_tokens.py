"""ChatTokens: the prompt's token ids from the model's own chat template, and token-id actions.

RL on LLMs trains on the tokens the model actually saw and produced. A trainer that keeps text and
re-tokenises it later trains on different tokens whenever the chat template does not render the
history the way the model saw it turn by turn (templates that strip past reasoning, rewrite tool
calls, or date the system prompt), and learns from samples it never generated. This module owns
a wrapper that does the tokenisation at the environment, once per turn, with a Hugging Face
tokenizer (``pip install openenv-gym[tokens]``), and *checks* it instead of hiding it: the prompt
of turn ``t + 1`` must start with the prompt of turn ``t`` followed by the completion the model
produced, and every turn where it does not is reported.

Any object with the tokenizer API works (``apply_chat_template``, ``encode``, ``decode``,
``len``): ``transformers.PreTrainedTokenizerFast`` and the tokenizers of ``AutoTokenizer``.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.utils import RecordConstructorArgs

from openenv_gym.errors import ConfigurationError, InvalidAction
from openenv_gym.wire import Message
from openenv_gym.wrappers.conversation import new_messages, sent_message

__all__ = ["ChatTokens"]


def _all_ints(values: Any) -> bool:
    """Whether every item is an integer (not a bool): plain ints checked at C speed first."""
    if all(type(v) is int for v in values):
        return True
    return all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values)

_CONTEXT = 8  # tokens of each side shown as text in a mismatch report


def _template_message(message: Message) -> Message:
    """``message`` as Hugging Face chat templates take it: tool-call ``arguments`` as a dict.

    Transformers' documented tool-call format carries arguments as an object (templates apply
    ``tojson`` to them); the package's messages carry the OpenAI JSON string.
    """
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list) or not calls:
        return message
    out_calls = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if isinstance(fn, dict) and isinstance(args, str):  # args is a str only when fn is a dict
            try:
                decoded = json.loads(args)
            except (ValueError, RecursionError):
                decoded = None
            if isinstance(decoded, dict):
                call = {**call, "function": {**fn, "arguments": decoded}}
        out_calls.append(call)
    return {**message, "tool_calls": out_calls}


class ChatTokens(gym.Wrapper, RecordConstructorArgs):
    """Add the prompt's token ids to ``info``, accept token ids as actions, and check their prefix.

    Observations and rewards are the inner env's, unchanged (so the wrapper composes with the
    others); what it adds is in ``info``, the place a trainer already reads per-turn data from:

    * ``info["prompt_token_ids"]`` (at reset and after every step): ``list[int]``, the ids of the
      whole conversation so far rendered by the chat template with the env's tools
      (``info["tools"]``) and ``add_generation_prompt=True``, then encoded without adding special
      tokens (a template writes its own BOS), as vLLM does for a chat request. This is the prompt
      to generate the next action from.
    * ``info["turn_tokens"]`` (after every step): ``{"prompt_token_ids", "completion_token_ids",
      "logprobs"}`` of the turn just taken: the prompt it was generated from, and the action's ids
      and logprobs when the action was given as tokens (else ``None``).
      :class:`~openenv_gym.wrappers.RecordEpisodes` above this wrapper records them per turn.
    * ``info["token_prefix_mismatch"]`` (only when the check fails): ``{"position", "expected",
      "got", "expected_text", "got_text"}``: the first position where the new prompt differs from
      the previous prompt followed by the completion ids (or by nothing, for a text action),
      the ids there (``None`` past the end), and a few tokens of each side as text. Nothing is
      re-tokenised to hide it: ``prompt_token_ids`` is always the template's rendering, so a
      trainer decides whether to drop the sample or splice the tokens it generated.
    * ``info["chat_template_error"]`` when the template could not render the conversation (the
      step itself is kept; ``prompt_token_ids`` is then ``None`` and the next turn is not checked).

    Actions: anything the inner env takes, or token ids: a ``list`` of ints, a 1-D integer numpy
    array, or a mapping ``{"token_ids": ids, "logprobs": [...]}`` (what a sampler returns). Ids
    are decoded (``skip_special_tokens``, by default dropping the end-of-turn token) and the text
    is the action the inner env gets; ``info["assistant_message"]`` is that text as an assistant
    message unless a wrapper below (e.g. :class:`~openenv_gym.wrappers.TextToolCalls`, which then
    parses the calls out of it) set its own. The conversation the template renders holds the agent
    turn the env understood (that message), so a template whose rendering of a past turn differs
    from what the model generated is caught by the check.

    Args:
        env: an env following the openenv_gym contract (or a wrapper of one).
        tokenizer: a Hugging Face tokenizer (or anything with its ``apply_chat_template``,
            ``encode``, ``decode`` and ``len``).
        chat_template: a Jinja template string to use instead of the tokenizer's own.
        template_kwargs: more variables for the template (e.g. ``{"enable_thinking": False}``).
        skip_special_tokens: drop special tokens when decoding token-id actions.

    Raises:
        ConfigurationError: the tokenizer lacks the API or has no chat template and none is given.
        InvalidAction: a token-id action with an id outside the vocabulary, or logprobs whose
            length differs from the ids' (raised before the inner env is stepped).
    """

    def __init__(
        self,
        env: gym.Env,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        skip_special_tokens: bool = True,
    ):
        missing = [m for m in ("apply_chat_template", "encode", "decode", "__len__") if not hasattr(tokenizer, m)]
        if missing:
            raise ConfigurationError(f"tokenizer must be a Hugging Face tokenizer; {type(tokenizer).__name__} has no {missing}")
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise ConfigurationError("the tokenizer has no chat template: pass chat_template=")
        RecordConstructorArgs.__init__(self, tokenizer=tokenizer, chat_template=chat_template,
                                       template_kwargs=template_kwargs, skip_special_tokens=skip_special_tokens)
        gym.Wrapper.__init__(self, env)
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs or {})
        self.skip_special_tokens = skip_special_tokens
        self._vocab = len(tokenizer)
        self._clear()

    def _clear(self) -> None:
        self._messages: list[Message] = []  # the conversation in the template's form
        self._tools: list[dict[str, Any]] | None = None
        self._prompt: list[int] | None = None

    @property
    def prompt_token_ids(self) -> list[int] | None:
        """The current prompt's ids (as in the last ``info["prompt_token_ids"]``)."""
        return None if self._prompt is None else list(self._prompt)

    # -- tokens -------------------------------------------------------------------------------------
    def _render(self, info: dict[str, Any]) -> list[int] | None:
        """The conversation's prompt ids, or ``None`` with ``info["chat_template_error"]`` set."""
        try:
            text = self.tokenizer.apply_chat_template(
                self._messages, tools=self._tools or None, chat_template=self.chat_template, tokenize=False,
                add_generation_prompt=True, **self.template_kwargs)
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        except Exception as exc:  # a template's raise_exception, a Jinja error, an odd message
            info["chat_template_error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
            return None

    def _token_action(self, action: Any) -> tuple[list[int], list[float] | None] | None:
        """``(ids, logprobs)`` when ``action`` is token ids, else ``None``."""
        logprobs = None
        if isinstance(action, Mapping) and "token_ids" in action:
            ids, logprobs = action["token_ids"], action.get("logprobs")
        elif isinstance(action, np.ndarray) and action.ndim == 1 and np.issubdtype(action.dtype, np.integer):
            ids = action
        elif isinstance(action, (list, tuple)) and _all_ints(action):
            ids = action
        else:
            return None
        if isinstance(ids, np.ndarray):
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
                raise InvalidAction("token_ids must be a 1-D array of integers")
            ids = ids.tolist()
        elif not isinstance(ids, (list, tuple)) or not _all_ints(ids):
            raise InvalidAction("token_ids must be a list of integers")
        else:
            ids = [int(i) for i in ids]  # numpy integers and int subclasses as plain ints
        if ids and (min(ids) < 0 or max(ids) >= self._vocab):
            bad = next(i for i in ids if not 0 <= i < self._vocab)
            raise InvalidAction(f"token id {bad} is outside the tokenizer's vocabulary (0..{self._vocab - 1})")
        if logprobs is not None:
            try:
                logprobs = [float(x) for x in logprobs]
            except (TypeError, ValueError):
                raise InvalidAction("logprobs must be a list of numbers") from None
            if len(logprobs) != len(ids):
                raise InvalidAction(f"logprobs has {len(logprobs)} entries for {len(ids)} token ids")
        return ids, logprobs

    def _mismatch(self, expected: list[int], got: list[int]) -> dict[str, Any] | None:
        n = len(expected)
        if got[:n] == expected:
            return None
        k = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(n, len(got)))
        return {
            "position": k,
            "expected": expected[k] if k < n else None,
            "got": got[k] if k < len(got) else None,
            "expected_text": self.tokenizer.decode(expected[k:k + _CONTEXT]),
            "got_text": self.tokenizer.decode(got[k:k + _CONTEXT]),
        }

    # -- Gymnasium API --------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the inner env; ``info["prompt_token_ids"]`` is the opening prompt."""
        self._clear()
        obs, info = self.env.reset(seed=seed, options=options)
        info = dict(info)
        self._messages = [_template_message(m) for m in new_messages(obs, info)]
        tools = info.get("tools")
        self._tools = list(tools) if isinstance(tools, list) else None
        self._prompt = self._render(info)
        info["prompt_token_ids"] = self.prompt_token_ids
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the inner env (decoding a token-id action first); check and report the new prompt."""
        tokens = self._token_action(action)
        completion, logprobs = tokens if tokens is not None else (None, None)
        forward = action
        if completion is not None:
            forward = self.tokenizer.decode(completion, skip_special_tokens=self.skip_special_tokens)
        obs, reward, terminated, truncated, info = self.env.step(forward)
        info = dict(info)
        if completion is not None:
            info.setdefault("assistant_message", {"role": "assistant", "content": forward})
        self._messages.append(_template_message(sent_message(forward, info)))
        self._messages.extend(_template_message(m) for m in new_messages(obs, info))
        if isinstance(info.get("tools"), list):
            self._tools = list(info["tools"])
        previous, self._prompt = self._prompt, self._render(info)
        if previous is not None and self._prompt is not None:
            mismatch = self._mismatch(previous + (completion or []), self._prompt)
            if mismatch is not None:
                info["token_prefix_mismatch"] = mismatch
        info["prompt_token_ids"] = self.prompt_token_ids
        info["turn_tokens"] = {"prompt_token_ids": previous, "completion_token_ids": completion, "logprobs": logprobs}
        return obs, reward, terminated, truncated, info
