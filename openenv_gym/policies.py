"""Policies that drive sub-envs from outside: what a rollout uses when no trainer is attached.

A rollout steps many sub-envs and asks for the next actions of whichever sub-envs are ready, so
a policy is keyed by env id and answers in batches:

* :class:`RandomPolicy` samples each env's action space (tool calls with schema-valid random
  arguments), a baseline that exercises an environment end to end with no model;
* :class:`OpenAIPolicy` asks any OpenAI-compatible ``/chat/completions`` server, all envs of a
  batch concurrently, keeping each env's whole conversation (observations carry only the new
  messages) and passing the env's tools through.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import httpx
import numpy as np

from openenv_gym import runtime
from openenv_gym.errors import BackendUnavailable, ConfigurationError
from openenv_gym.spaces import AssistantAction
from openenv_gym.wire import Message, ToolSpec

__all__ = ["Policy", "RandomPolicy", "OpenAIPolicy", "tools_from_info"]


@runtime_checkable
class Policy(Protocol):
    """Chooses actions for sub-envs identified by id."""

    def reset(self, env_id: int, observation: list[Message], info: dict[str, Any]) -> None:
        """A new episode began in sub-env ``env_id`` with ``observation``."""

    def act_batch(
        self, env_ids: Sequence[int], observations: Sequence[list[Message]], infos: Sequence[dict[str, Any]]
    ) -> list[Any]:
        """One action per env id (same order), given each env's newest messages."""

    def close(self) -> None:
        """Release clients."""


def tools_from_info(info: dict[str, Any]) -> list[ToolSpec] | None:
    """The tools an info announces (OpenAI format -> ToolSpec), or None when it announces none."""
    tools = info.get("tools")
    if tools is None:
        return None
    out = []
    for tool in tools:
        fn = tool.get("function", tool)
        out.append(ToolSpec(fn["name"], fn.get("description") or "", fn.get("parameters")))
    return out


class RandomPolicy:
    """Samples each env's :class:`~openenv_gym.spaces.AssistantAction` space.

    Every env id draws from its own stream derived from ``seed``, so the same seed gives the same
    actions per env whatever order the batches arrive in.
    """

    def __init__(self, seed: int | None = None, text_probability: float = 0.1):
        self.seed = seed
        self.text_probability = text_probability
        self._spaces: dict[int, AssistantAction] = {}

    def _space(self, env_id: int) -> AssistantAction:
        space = self._spaces.get(env_id)
        if space is None:
            seq = np.random.SeedSequence(self.seed, spawn_key=(env_id,)) if self.seed is not None else None
            space = AssistantAction(text_probability=self.text_probability,
                                    seed=np.random.default_rng(seq) if seq is not None else None)
            self._spaces[env_id] = space
        return space

    def reset(self, env_id: int, observation: list[Message], info: dict[str, Any]) -> None:
        tools = tools_from_info(info)
        if tools is not None:
            self._space(env_id).tools = tools

    def act_batch(
        self, env_ids: Sequence[int], observations: Sequence[list[Message]], infos: Sequence[dict[str, Any]]
    ) -> list[Any]:
        actions = []
        for env_id, info in zip(env_ids, infos):
            tools = tools_from_info(info)
            if tools is not None:
                self._space(env_id).tools = tools
            actions.append(self._space(env_id).sample())
        return actions

    def forget(self, env_id: int) -> None:
        """Drop ``env_id``'s action space (its episode is over and the id will not come back)."""
        self._spaces.pop(env_id, None)

    def close(self) -> None:
        pass


_KEEP = ("role", "content", "tool_calls")


class OpenAIPolicy:
    """Actions from any OpenAI-compatible chat-completions server.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name to request.
        api_key: sent as a bearer token (default: ``OPENAI_API_KEY``); never logged or shown.
        temperature, max_tokens, tool_choice: passed through when set.
        timeout: seconds per request.
        max_concurrency: requests in flight at once.
        extra_body: more request fields (e.g. vLLM sampling options).
        token_ids: ask for what a trainer needs (``logprobs`` and vLLM's ``return_token_ids``, vLLM
            0.10.2+): each turn's prompt token ids, completion token ids and their logprobs, read
            with :meth:`tokens` and written into rollout records. Servers that do not know the
            options may refuse them, so it is off by default.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        tool_choice: str | None = None,
        timeout: float = 120.0,
        max_concurrency: int = 32,
        extra_body: dict[str, Any] | None = None,
        token_ids: bool = False,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.__api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.options = {k: v for k, v in (("temperature", temperature), ("max_tokens", max_tokens),
                                          ("tool_choice", tool_choice)) if v is not None}
        if token_ids:
            self.options.update(logprobs=True, return_token_ids=True)
        self.options.update(extra_body or {})
        self._tokens: dict[int, dict[str, Any]] = {}
        self.timeout = timeout
        self.max_concurrency = max_concurrency
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}
        self._history: dict[int, list[Message]] = {}
        self._tools: dict[int, list[dict[str, Any]]] = {}
        self._fresh: set[int] = set()
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"OpenAIPolicy(base_url={self.base_url!r}, model={self.model!r})"

    def reset(self, env_id: int, observation: list[Message], info: dict[str, Any]) -> None:
        self._history[env_id] = list(observation)
        self._fresh.add(env_id)
        if info.get("tools") is not None:
            self._tools[env_id] = list(info["tools"])

    def act_batch(
        self, env_ids: Sequence[int], observations: Sequence[list[Message]], infos: Sequence[dict[str, Any]]
    ) -> list[Any]:
        return runtime.run_sync(self.aact_batch(env_ids, observations, infos))

    async def aact_batch(
        self, env_ids: Sequence[int], observations: Sequence[list[Message]], infos: Sequence[dict[str, Any]]
    ) -> list[Any]:
        """:meth:`act_batch` for a caller on the runtime loop (an adapter playing a game's other
        seats with this policy)."""
        for env_id, obs, info in zip(env_ids, observations, infos):
            if env_id in self._fresh:  # reset() already recorded this observation
                self._fresh.discard(env_id)
            else:
                self._history.setdefault(env_id, []).extend(obs)
            if info.get("tools") is not None:
                self._tools[env_id] = list(info["tools"])
        return await self._act_all(list(env_ids))

    def forget(self, env_id: int) -> None:
        """Drop ``env_id``'s conversation (its episode is over and the id will not come back)."""
        self._history.pop(env_id, None)
        self._tools.pop(env_id, None)
        self._tokens.pop(env_id, None)
        self._fresh.discard(env_id)

    async def _act_all(self, env_ids: list[int]) -> list[Any]:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.__api_key}"} if self.__api_key else {}
            self._client = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=self.timeout,
                                             limits=httpx.Limits(max_connections=self.max_concurrency))
            self._sem = asyncio.Semaphore(self.max_concurrency)
        return list(await asyncio.gather(*(self._act(env_id) for env_id in env_ids)))

    async def _act(self, env_id: int) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": self._history[env_id], **self.options}
        if self._tools.get(env_id):
            body["tools"] = self._tools[env_id]
        assert self._sem is not None
        async with self._sem:
            data = await runtime.retry(lambda: self._post(body), retry_if=_transient, attempts=5,
                                       deadline=self.timeout, delay_for=_retry_after)
        usage = data.get("usage") or {}
        for key in self.usage:
            self.usage[key] += int(usage.get(key) or 0)
        choice = data["choices"][0]
        message = choice["message"]
        self._tokens[env_id] = _turn_tokens(data, choice)
        action = {k: message[k] for k in _KEEP if message.get(k) is not None}
        action.setdefault("role", "assistant")
        action.setdefault("content", None)
        self._history[env_id].append(action)
        return action

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self._client is not None
        try:
            response = await self._client.post("/chat/completions", json=body)
        except httpx.TransportError as exc:
            raise _Transient(f"{self.base_url} cannot be reached ({type(exc).__name__})", None) from None
        if response.status_code == 429 or response.status_code >= 500:
            after = response.headers.get("retry-after")
            raise _Transient(f"{self.base_url} answered {response.status_code}: {_message(response)}",
                             float(after) if after and after.replace(".", "", 1).isdigit() else None)
        if response.status_code >= 400:
            raise ConfigurationError(f"{self.base_url} refused the request ({response.status_code}): {_message(response)}")
        return response.json()

    def tokens(self, env_id: int) -> dict[str, Any] | None:
        """The last turn's ``prompt_token_ids``, ``completion_token_ids`` and ``logprobs`` for
        ``env_id``, each ``None`` when the server did not return it."""
        return self._tokens.get(env_id)

    def close(self) -> None:
        if self._client is not None:
            runtime.run_sync(self.aclose(), 30.0)

    async def aclose(self) -> None:
        """:meth:`close` for a caller on the runtime loop."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


def _turn_tokens(data: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
    """Token ids and logprobs of one completion, as vLLM returns them (``None`` where absent)."""
    content = (choice.get("logprobs") or {}).get("content")
    return {
        "prompt_token_ids": data.get("prompt_token_ids"),
        "completion_token_ids": choice.get("token_ids"),
        "logprobs": [float(t["logprob"]) for t in content] if content else None,
    }


class _Transient(BackendUnavailable):
    def __init__(self, message: str, after: float | None):
        super().__init__(message)
        self.after = after


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, _Transient)


def _retry_after(exc: BaseException) -> float | None:
    return exc.after if isinstance(exc, _Transient) else None


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return str(error.get("message", error)) if isinstance(error, dict) else str(error)
    except ValueError:
        return response.text[:500]
