"""One seat's model calls as its agent sees them, and a finished trace as a reward.

A Verifiers v1 rollout talks to "the model" in whole requests: each model call carries the full
conversation so far. An agent of ours sees it as Gymnasium does: the first call's messages at
reset, then only what each next call added (tool results, the env's user turns), and answers
each call with one assistant message. :class:`SeatCalls` keeps that view for one seat (one
rollout); the single-agent episode and a game's every seat use it alike. :func:`trace_outcome`
turns the seat's finished trace into its reward, its end (terminated or truncated) and its info.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable
from typing import Any

from openenv_gym.actions import ParsedCall, Turn, check_call, tool_message
from openenv_gym.adapters.verifiers.v1_handoff import ModelCall
from openenv_gym.tracebacks import summarize
from openenv_gym.wire import Message, ToolSpec

__all__ = ["LIBRARY_TAIL", "LIMIT_STOPS", "SeatCalls", "completion", "trace_error", "trace_outcome", "tool_specs",
           "whole_error"]

LIMIT_STOPS = frozenset({
    "max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "context_length",
    "compaction_failed",
})
"""Stop conditions that are limits (-> ``truncated``), besides ``<stage>_timeout``."""

LIBRARY_TAIL = 2000
"""Characters of a failed program's output the library keeps in its error (``Harness._check_result``)."""

_PROGRAM_FAILURE = re.compile(r"^(harness .+? exited -?\d+|runtime died under harness .+? \(exit -?\d+\)"
                              r"|failed to prepare uv script): (.*)$", re.DOTALL)

_completion_ids = itertools.count(1)


def tool_specs(raw: Any) -> list[ToolSpec]:
    """A model request's ``tools`` (OpenAI format) as :class:`ToolSpec`s."""
    specs = []
    for tool in raw or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("name"):
            specs.append(ToolSpec(name=fn["name"], description=fn.get("description") or "",
                                  parameters=fn.get("parameters")))
    return specs


def _arguments(call: ParsedCall) -> str:
    """The arguments as the agent wrote them when it wrote a string (even invalid JSON: the
    harness answers that in its own words, and the trace records what the agent did)."""
    raw = getattr(call, "raw_arguments", None)
    return raw if raw is not None else json.dumps(call.arguments or {})


def completion(text: str | None, calls: list[ParsedCall], model: Any) -> dict[str, Any]:
    """The agent's message as an OpenAI ``chat.completion`` (what a provider would have returned).

    Usage is reported as zero: the library's token budgets (``max_*_tokens``) therefore never
    fire for an external policy; use ``max_turns`` or the env's own turn limit instead.
    """
    message: dict[str, Any] = {"role": "assistant", "content": text if (text or not calls) else None}
    if text is None and not calls:
        message["content"] = ""
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c)}}
            for c in calls
        ]
    return {
        "id": f"chatcmpl-openenv-{next(_completion_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or "openenv-gym-policy",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def whole_error(message: str) -> str:
    """A trace error's message with its program's cause first and only whole lines of its output.

    The library keeps the last :data:`LIBRARY_TAIL` characters of a failed harness program's
    output, cut mid-line, with exit-time noise after the real exception: the cause is read out of
    it (:func:`openenv_gym.tracebacks.summarize`) and leads.
    """
    m = _PROGRAM_FAILURE.match(message)
    if m is None:
        return message
    return summarize(m[1], m[2], cut=len(m[2]) >= LIBRARY_TAIL)


def trace_error(trace: Any) -> dict[str, Any] | None:
    """The failure a trace ended with (``{"type", "message"}``), or ``None`` for a trace that is ok."""
    errors = list(getattr(trace, "errors", None) or [])
    if not errors or getattr(trace, "ok", True):
        return None
    last = errors[-1]
    return {"type": getattr(last, "type", "Error"), "message": whole_error(str(getattr(last, "message", last)))}


def trace_outcome(trace: Any, env_error: dict[str, str] | None) -> tuple[float, bool, bool, dict[str, Any]]:
    """A finished trace as ``(reward, terminated, truncated, info)``.

    The reward is ``trace.reward`` (``None`` counts 0); ``info`` holds the named ``rewards`` and
    their ``reward_weights``, ``metrics``, ``stop_condition``, ``num_turns``, ``ok`` and, when the
    trace or the env's own hooks failed (``env_error``), ``error``. Truncated on a limit
    (:data:`LIMIT_STOPS`, ``<stage>_timeout``) or a failure, else terminated.
    """
    stop = trace.stop_condition
    error = env_error or trace_error(trace)
    info: dict[str, Any] = {
        "stop_condition": stop,
        "rewards": {k: (float(v.score) if v is not None and v.score is not None else None)
                    for k, v in (trace.rewards or {}).items()},
        "reward_weights": {k: float(v.weight) for k, v in (trace.rewards or {}).items() if v is not None},
        "metrics": {k: (float(v) if v is not None else None) for k, v in (trace.metrics or {}).items()},
        "num_turns": trace.num_turns,
        "ok": bool(trace.ok) and env_error is None,
    }
    if error is not None:
        info["error"] = error
    name = stop if isinstance(stop, str) else ""
    limited = name in LIMIT_STOPS or name.endswith("_timeout")
    failed = error is not None or not name or name == "error" or name.endswith("_error")
    truncated = limited or failed
    reward = trace.reward
    try:
        reward = float(reward) if reward is not None else 0.0
    except (TypeError, ValueError):
        reward = 0.0
    return reward, not truncated, truncated, info


class SeatCalls:
    """One seat's conversation with the model, as its agent sees it.

    :meth:`opening` reads the first call (its messages and tools), :meth:`answer` answers the
    pending call with the agent's turn, and :meth:`added` reads what the next call added since.
    ``bad_arguments``: ``"forward"`` sends tool calls whose arguments are not JSON to the harness
    as written (the bundled chat programs answer them), ``"answer"`` answers them here.
    """

    def __init__(self, bad_arguments: str = "forward"):
        self.bad_arguments = bad_arguments
        self.tools: dict[str, ToolSpec] = {}
        self._tools_raw: Any = None
        self._prev_len = 0
        self._prev_last: Any = None
        self._names: dict[str, str] = {}

    def opening(self, call: ModelCall) -> tuple[list[Message], list[ToolSpec]]:
        """The first call's messages and tools."""
        messages = list(call.body.get("messages") or [])
        self._prev_len, self._prev_last = len(messages), (messages[-1] if messages else None)
        self._tools_raw = call.body.get("tools")
        tools = tool_specs(self._tools_raw)
        self.tools = {t.name: t for t in tools}
        return messages, tools

    def answer(self, turn: Turn, take: Callable[[], ModelCall]) -> tuple[list[Message], bool]:
        """Answer the pending call (``take()`` hands it over) with ``turn``: (tool messages answered
        here, whether the call was answered).

        Calls whose arguments are unparseable go to the harness as written by default (the
        trace records what the agent did); with ``bad_arguments="answer"``, or when the raw text
        is unknown, they are answered here and never reach the library. A turn made only of
        such calls leaves ``call`` pending (it is not one of the library's turns).
        """
        forward_raw = self.bad_arguments == "forward"
        good = [c for c in turn.calls
                if c.error is None or (forward_raw and getattr(c, "raw_arguments", None) is not None)]
        bad = [c for c in turn.calls if not any(c is g for g in good)]
        local: list[Message] = [tool_message(c.id, c.name, check_call(c, self.tools) or "") for c in bad]
        if bad and not good:
            return local, False
        call = take()
        call.reply(completion(turn.text, good, call.body.get("model")))
        self._names = {c.id: c.name for c in good}
        return local, True

    def added(self, call: ModelCall) -> tuple[list[Message], dict[str, Any], list[ToolSpec] | None]:
        """What ``call`` (the next after an answer) added: (new messages, info, the tools if they changed)."""
        messages = list(call.body.get("messages") or [])
        info: dict[str, Any] = {}
        n = self._prev_len
        if len(messages) > n and (n == 0 or messages[n - 1] == self._prev_last):
            new = messages[n + 1:]  # after the last request's messages and the agent's reply
        else:  # the harness rewrote its context (compaction): show it whole
            new = messages
            info["context_reset"] = True
        self._prev_len, self._prev_last = len(messages), (messages[-1] if messages else None)
        names = self._names
        # Older chat programs (verifiers 0.3) leave ``name`` off tool results; the package's
        # observations always carry it (on a copy: the request's own list is the prefix that the
        # next request is checked against).
        new = [{**m, "name": names[m["tool_call_id"]]}
               if m.get("role") == "tool" and "name" not in m and m.get("tool_call_id") in names else m
               for m in new]
        tools = None
        if call.body.get("tools") != self._tools_raw:
            self._tools_raw = call.body.get("tools")
            tools = tool_specs(self._tools_raw)
            self.tools = {t.name: t for t in tools}
        return new, info, tools
