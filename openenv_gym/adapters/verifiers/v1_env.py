"""A taskset's ``vf.Env``, played with the external policy as its one agent.

verifiers 0.3 made every run an ``Env``: ``Env.run(task, agents)`` decides how one task becomes
one episode. The plain case, ``SingleAgentEnv``, runs its one ``agent`` seat on the task
(``await agents.agent.run(task)``). A taskset may ship a subclass that scripts more: verifiers'
own ``color_codeword_v1`` opens ``agents.agent.interaction(task)`` and sends scripted user turns
(images, then text) between the agent's turns, then closes the exchange. Other envs declare
several seats (``kuhn_poker_v1``: two players; ``user_sim``: an assistant and a simulated user)
and play them against each other.

This module runs the env's own ``setup``/``run``/``finalize`` with a seat agent of ours
(:func:`seat_agent_class`: the library's ``vf.Agent`` bound to the adapter's interception server
and shared tool servers), so whatever ``run()`` does between the agent's turns happens exactly as
under the library's runner, and every model call the seat makes reaches the episode as an
observation. Gymnasium's contract has one agent and one conversation per episode, hence:

* an env with more than one seat is refused (:func:`check_single_agent`), saying what plays it;
* a seat that ``run()`` starts a second time within one episode (``best-of-n`` with ``n > 1``)
  ends the episode with :class:`SecondRollout`, a configuration error.

Nothing here imports ``verifiers`` until a seat agent class is built.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from openenv_gym.adapters.verifiers.detect import MULTI_AGENT_HINT
from openenv_gym.errors import ConfigurationError

__all__ = ["EpisodeResult", "SecondRollout", "agent_seats", "check_single_agent", "play_episode",
           "scripts_its_own_turns", "seat_agent_class"]

SECOND_ROLLOUT = (
    "this env starts its agent more than once per episode (best-of-n with n > 1, or a retry of its "
    "own); a Gymnasium episode is one conversation of one agent: configure the env for one attempt "
    "with env_config= (its EnvConfig knobs, e.g. {'n': 1} or {'attempts': 1})"
)


class SecondRollout(ConfigurationError):
    """The env started its agent's seat again within one episode (a Gymnasium episode is one
    conversation of one agent)."""


def agent_seats(vf: Any, env: Any) -> dict[str, Any]:
    """The env's agent seats: every top-level ``vf.AgentConfig`` field of its config, by name
    (how the library itself names an env's agents)."""
    return {name: value for name, value in env.config if isinstance(value, vf.AgentConfig)}


def scripts_its_own_turns(vf: Any, env: Any) -> bool:
    """Whether the env's ``run()`` is its own (not ``SingleAgentEnv``'s plain "run the agent once")."""
    return type(env).run is not vf.SingleAgentEnv.run


def check_single_agent(vf: Any, env: Any, env_id: str) -> str:
    """The name of the env's one seat; a ConfigurationError saying what would play it otherwise."""
    seats = agent_seats(vf, env)
    if len(seats) == 1:
        return next(iter(seats))
    names = ", ".join(seats) or "none"
    raise ConfigurationError(
        f"taskset {env_id!r} runs in {type(env).__name__}, a multi-agent Verifiers env "
        f"(seats: {names}): {MULTI_AGENT_HINT}")


@dataclass
class EpisodeResult:
    """What one played episode left: the seat's traces (in completion order) and the env's failure."""

    traces: list[Any] = field(default_factory=list)
    error: dict[str, str] | None = None
    """``{"type", "message"}`` when the env's own ``setup``/``run``/``finalize`` failed."""
    second_rollout: bool = False
    """The env started its seat a second time (see :class:`SecondRollout`)."""


_seat_class: type | None = None


def seat_agent_class(vf: Any) -> type:
    """The ``vf.Agent`` subclass that sits in the env's one seat (built on first use)."""
    global _seat_class
    if _seat_class is not None:
        return _seat_class

    class SeatAgent(vf.Agent):
        """The external policy's seat: the library's Agent, with the adapter's shared tools (for
        the taskset's own tasks, as the library's episode agents get them), one rollout per
        episode, each trace reported to ``on_trace`` when minted and kept in ``traces``."""

        def __init__(self, config: Any, *, interception: Any, shared_tools: Mapping[str, Any],
                     task_cls: type, on_trace: Callable[[Any], None], result: EpisodeResult):
            super().__init__(config, interception=interception)
            self._shared_tools = shared_tools
            self._task_cls = task_cls
            self._report = on_trace
            self._result = result
            self._started = False

        def _begin(self, task: Any, tools: Mapping[str, Any] | None) -> Mapping[str, Any]:
            if self._started:
                # Recorded as well as raised: the env's run() may catch it or wrap it (a TaskGroup).
                self._result.second_rollout = True
                raise SecondRollout(SECOND_ROLLOUT)
            self._started = True
            if tools is not None:
                return tools
            return self._shared_tools if isinstance(task, self._task_cls) else {}

        def _watch(self, on_trace: Callable[[Any], None] | None) -> Callable[[Any], None]:
            def watch(trace: Any) -> None:
                self._report(trace)
                if on_trace is not None:
                    on_trace(trace)
            return watch

        async def run(self, task: Any, *, runtime: Any = None, tools: Mapping[str, Any] | None = None,
                      on_trace: Callable[[Any], None] | None = None, **kwargs: Any) -> Any:
            trace = await super().run(task, runtime=runtime, tools=self._begin(task, tools),
                                      on_trace=self._watch(on_trace), **kwargs)
            self._result.traces.append(trace)
            return trace

        @contextlib.asynccontextmanager
        async def interaction(self, task: Any, *, runtime: Any = None, tools: Mapping[str, Any] | None = None,
                              on_trace: Callable[[Any], None] | None = None, **kwargs: Any) -> AsyncIterator[Any]:
            minted: list[Any] = []

            def remember(trace: Any) -> None:
                minted.append(trace)
                if on_trace is not None:
                    on_trace(trace)

            try:
                async with super().interaction(task, runtime=runtime, tools=self._begin(task, tools),
                                               on_trace=self._watch(remember), **kwargs) as interaction:
                    yield interaction
            finally:
                # Kept also when opening failed: its trace holds the failure.
                if minted and minted[-1].is_completed:
                    self._result.traces.append(minted[-1])

    _seat_class = SeatAgent
    return SeatAgent


async def play_episode(vf: Any, env: Any, task: Any, make_seat: Callable[[EpisodeResult], Any],
                       episode_record: Callable[[Any, list[Any]], Any]) -> EpisodeResult:
    """One episode of ``task`` in ``env``: its ``setup``, ``run`` and ``finalize`` hooks, under the
    env's own ``timeout.episode`` / ``timeout.finalize``, with ``make_seat(result)`` in its one seat.

    A hook that raises (or times out) fails the episode, as under the library's runner: the error
    is returned, with the traces so far. :class:`SecondRollout` and cancellation propagate.
    ``finalize`` runs only when the env overrides it, on ``episode_record(task, traces)`` (the
    library's ``Episode``).
    """
    result = EpisodeResult()
    seat_name = check_single_agent(vf, env, str(getattr(env.config.taskset, "id", "")))
    seat = make_seat(result)
    agents = vf.Agents(env.config, lambda name, spec: seat if name == seat_name else None)
    timeouts = getattr(env.config, "timeout", None)
    name = type(env).__name__
    hook, limit = "setup()", asyncio.timeout(getattr(timeouts, "episode", None))
    try:
        async with limit:
            await env.setup(agents)
            hook = "run()"
            await env.run(task, agents)
        if type(env).finalize is not vf.Env.finalize and result.traces and not result.second_rollout:
            hook, limit = "finalize()", asyncio.timeout(getattr(timeouts, "finalize", None))
            async with limit:
                await env.finalize(task, episode_record(task, result.traces))
    except Exception as exc:  # noqa: BLE001 - the env's hooks failing is the episode failing
        if isinstance(exc, TimeoutError) and limit.expired():
            result.error = {"type": "EnvError", "message": f"{name}.{hook} exceeded its deadline (the env's timeout)"}
        else:
            result.error = {"type": type(exc).__name__, "message": f"{name}.{hook}: {exc}"}
    if result.second_rollout:
        raise SecondRollout(SECOND_ROLLOUT)
    if result.error is None and not result.traces:
        result.error = {"type": "EnvError", "message": f"{name}.run() ran no agent"}
    return result
