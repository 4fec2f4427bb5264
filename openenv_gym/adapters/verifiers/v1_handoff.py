"""Where the Verifiers v1 library's model calls meet the agent's actions (inverted control).

Inside a rollout the library calls "the model" and waits for its answer; outside, the agent's
``step()`` supplies that answer (docs/backends.md, "Verifiers"). Two small objects carry the
hand-off, both on the runtime loop:

* :class:`Handoff`, one per episode. The library's side, :meth:`Handoff.ask`, parks a
  :class:`ModelCall` and awaits its answer. The episode's side takes the calls in arrival order
  with :meth:`Handoff.next_call` (which also notices when the rollout ended instead of calling
  again) and answers the one it holds with :meth:`Handoff.take` and :meth:`ModelCall.reply`.
* :class:`CallRouter`, one per adapter. Every call names its rollout (the library's trace id);
  the router hands it to that rollout's :class:`Handoff`. This is how one interception server
  serves every episode of a vector env.

::

    the library (rollout task)            CallRouter / Handoff              the episode
    client.get_response(body, trace) -> router.answer -> handoff.ask        (parks the call)
                                                        handoff.next_call  -> the observation
                                                        handoff.take().reply(completion)  <- step()
    get_response returns the completion <-----------------------------------'
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from openenv_gym.errors import BackendError

__all__ = ["CallRouter", "Handoff", "ModelCall"]


class ModelCall:
    """One model call the harness made: its native request body, and the answer it awaits."""

    __slots__ = ("body", "_answer")

    def __init__(self, body: dict[str, Any], answer: asyncio.Future[dict[str, Any]]):
        self.body = body
        self._answer = answer

    def reply(self, completion: dict[str, Any]) -> None:
        """Answer the call with a ``chat.completion`` dict.

        A no-op when the library gave up on the call meanwhile (its own timeout cancelled it).
        """
        if not self._answer.done():
            self._answer.set_result(completion)

    def cancel(self) -> None:
        """Tell the waiting library that no answer will come."""
        if not self._answer.done():
            self._answer.cancel()


class Handoff:
    """The model calls of one rollout, handed to its episode one at a time.

    At most one call is *pending*: taken by :meth:`next_call` and not yet answered. Further calls
    (a harness with sub-agents may have several in flight) wait in arrival order, one per step.
    """

    def __init__(self, on_call: Callable[[], None] | None = None) -> None:
        self._waiting: asyncio.Queue[ModelCall] = asyncio.Queue()
        self._pending: ModelCall | None = None
        self._on_call = on_call

    # -- the library's side ----------------------------------------------------------------------
    async def ask(self, body: dict[str, Any]) -> dict[str, Any]:
        """Park a model call and wait for the agent's answer (called inside the rollout task);
        ``on_call`` (of the constructor) hears of it."""
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting.put_nowait(ModelCall(body, answer))
        if self._on_call is not None:
            self._on_call()
        return await answer

    @property
    def pending(self) -> ModelCall | None:
        """The call taken and not yet answered, if any."""
        return self._pending

    def poll(self) -> ModelCall | None:
        """The pending call; if none, the next waiting one becomes pending (no waiting)."""
        if self._pending is None and not self._waiting.empty():
            self._pending = self._waiting.get_nowait()
        return self._pending

    # -- the episode's side ----------------------------------------------------------------------
    async def next_call(self, rollout: asyncio.Future[Any]) -> ModelCall | None:
        """The rollout's next model call, now pending; ``None`` when ``rollout`` ended first."""
        self._pending = await self._wait(rollout)
        return self._pending

    def take(self) -> ModelCall:
        """The pending call, handed over to be answered; :class:`BackendError` when none is pending
        (only after a failed step: the rollout cannot be answered any more)."""
        call, self._pending = self._pending, None
        if call is None:
            raise BackendError("the episode has no pending model call")
        return call

    def close(self) -> None:
        """Cancel the pending call and every waiting one (the episode is closing)."""
        calls = [self._pending] if self._pending is not None else []
        self._pending = None
        while not self._waiting.empty():
            calls.append(self._waiting.get_nowait())
        for call in calls:
            call.cancel()

    async def _wait(self, rollout: asyncio.Future[Any]) -> ModelCall | None:
        if not self._waiting.empty():
            return self._waiting.get_nowait()
        if rollout.done():
            return None
        getter = asyncio.ensure_future(self._waiting.get())
        try:
            await asyncio.wait({getter, rollout}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        return None


class CallRouter:
    """Sends each model call to the :class:`Handoff` of the rollout that made it (by trace id)."""

    def __init__(self) -> None:
        self._routes: dict[str, Handoff] = {}

    def bind(self, trace_id: str, handoff: Handoff) -> None:
        """Route the calls of rollout ``trace_id`` to ``handoff`` (from the moment its trace exists)."""
        self._routes[trace_id] = handoff

    def unbind(self, trace_id: str, handoff: Handoff) -> None:
        """Stop routing ``trace_id``, if it still routes to ``handoff``."""
        if self._routes.get(trace_id) is handoff:
            del self._routes[trace_id]

    async def answer(self, body: dict[str, Any], trace_id: str | None) -> dict[str, Any]:
        """The agent's answer (a ``chat.completion`` dict) to a model call of rollout ``trace_id``."""
        handoff = self._routes.get(trace_id or "")
        if handoff is None:
            from verifiers.v1.errors import model_error

            # 409, not 5xx: the harness SDK must not retry a call whose episode is gone.
            raise model_error(f"no live openenv_gym episode for rollout {trace_id!r}", status_code=409)
        return await handoff.ask(body)
