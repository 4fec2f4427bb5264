"""A taskset's ``vf.Env``, played with the external policy as its one agent.

verifiers 0.3 made every run an ``Env``: ``Env.run(task, agents)`` decides how one task becomes
one episode. The plain case, ``SingleAgentEnv``, runs its one ``agent`` seat on the task
(``await agents.agent.run(task)``). A taskset may ship a subclass that scripts more: verifiers'
own ``color_codeword_v1`` opens ``agents.agent.interaction(task)`` and sends scripted user turns
(images, then text) between the agent's turns, then closes the exchange. Other envs declare
several seats (``kuhn_poker_v1``: two players; ``user_sim``: an assistant and a simulated user)
and play them against each other.

This module runs the env's own ``setup``/``run``/``finalize`` with seat agents of ours
(:func:`seat_agent_class`: the library's ``vf.Agent`` bound to the adapter's interception server
and shared tool servers), so whatever ``run()`` does between the agents' turns happens exactly as
under the library's runner, and every model call a seat makes reaches its player as an
observation. Gymnasium's contract has one agent and one conversation per episode, hence, for
``gym.make``:

* an env with more than one seat is refused (:func:`check_single_agent`), saying what plays it;
* a seat that ``run()`` starts a second time within one episode (``best-of-n`` with ``n > 1``)
  ends the episode with :class:`SecondRollout`, a configuration error.

A game (:mod:`openenv_gym.multiagent`) puts an agent of ours in every seat instead
(``single=False``): each run of a seat is a player of its own (``solver_0`` ... where the env
runs a seat several times, up to the runs declared for it), and every seat reports when it is
*busy* (inside a run, or inside one turn of an interaction): a busy seat will either ask the
model or finish, which is how a game knows that every seat it waits on has asked.

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

__all__ = ["EpisodeResult", "SecondRollout", "TooManyRuns", "agent_seats", "check_single_agent", "play_episode",
           "scripts_its_own_turns", "seat_agent_class", "seat_name"]

SECOND_ROLLOUT = (
    "this env starts its agent more than once per episode (best-of-n with n > 1, or a retry of its "
    "own); a Gymnasium episode is one conversation of one agent: configure the env for one attempt "
    "with env_config= (its EnvConfig knobs, e.g. {'n': 1} or {'attempts': 1})"
)


class SecondRollout(ConfigurationError):
    """The env started its agent's seat again within one episode (a Gymnasium episode is one
    conversation of one agent)."""


class TooManyRuns(ConfigurationError):
    """A game's env ran a seat more often than the runs declared for it (``seat_runs``)."""


def seat_name(seat: str, runs: int, k: int) -> str:
    """The player of run ``k`` of ``seat``: the seat's own name when it runs once per game, else
    ``seat_k`` (``solver_0`` ... ``solver_3``)."""
    return seat if runs == 1 else f"{seat}_{k}"


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
    refused: ConfigurationError | None = None
    """Set when the env did what the caller cannot play (:class:`SecondRollout`,
    :class:`TooManyRuns`): raised once the episode ends, whatever the env's ``run()`` made of it."""


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
                     task_cls: type, on_trace: Callable[[Any, int], None], result: EpisodeResult,
                     runs: int | None = None, name: str = "agent",
                     on_busy: Callable[[int, bool], None] | None = None):
            super().__init__(config, interception=interception)
            self._shared_tools = shared_tools
            self._task_cls = task_cls
            self._report = on_trace
            self._result = result
            self._runs = runs
            self._name = name
            self._on_busy = on_busy
            self._started = 0

        def _begin(self, task: Any, tools: Mapping[str, Any] | None) -> tuple[Mapping[str, Any], int]:
            k = self._started
            refusal: ConfigurationError | None = None
            if self._runs is None and k:
                refusal = SecondRollout(SECOND_ROLLOUT)
            elif self._runs is not None and k >= self._runs:
                refusal = TooManyRuns(
                    f"the env ran seat {self._name!r} {k + 1} times in one game, more than the {self._runs} "
                    f"declared: pass seat_runs={{{self._name!r}: N}} with the number of times it runs")
            if refusal is not None:
                # Recorded as well as raised: the env's run() may catch it or wrap it (a TaskGroup).
                self._result.refused = self._result.refused or refusal
                raise refusal
            self._started += 1
            if tools is not None:
                return tools, k
            return (self._shared_tools if isinstance(task, self._task_cls) else {}), k

        def _watch(self, on_trace: Callable[[Any], None] | None, k: int) -> Callable[[Any], None]:
            def watch(trace: Any) -> None:
                # Stamped at mint, as the library's own episode agents stamp theirs: an env's
                # finalize() finds its seats' traces by ``trace.agent.name``.
                if getattr(trace, "agent", None) is not None:
                    trace.agent.name = self._name
                    trace.agent.trainable = self.trainable
                self._report(trace, k)
                if on_trace is not None:
                    on_trace(trace)
            return watch

        def _busy(self, k: int, busy: bool) -> None:
            if self._on_busy is not None:
                self._on_busy(k, busy)

        async def run(self, task: Any, *, runtime: Any = None, tools: Mapping[str, Any] | None = None,
                      on_trace: Callable[[Any], None] | None = None, **kwargs: Any) -> Any:
            tools, k = self._begin(task, tools)
            self._busy(k, True)
            try:
                trace = await super().run(task, runtime=runtime, tools=tools, on_trace=self._watch(on_trace, k),
                                          **kwargs)
            finally:
                self._busy(k, False)
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

            tools, k = self._begin(task, tools)
            try:
                self._busy(k, True)  # opening may run the harness (a prompted task speaks first)
                try:
                    opened = super().interaction(task, runtime=runtime, tools=tools, on_trace=self._watch(remember, k),
                                                 **kwargs)
                    interaction = await opened.__aenter__()
                finally:
                    self._busy(k, False)
                try:
                    yield _Turns(interaction, lambda busy: self._busy(k, busy))
                except BaseException as exc:
                    self._busy(k, True)
                    try:
                        if not await opened.__aexit__(type(exc), exc, exc.__traceback__):
                            raise
                    finally:
                        self._busy(k, False)
                else:
                    self._busy(k, True)  # closing scores the exchange
                    try:
                        await opened.__aexit__(None, None, None)
                    finally:
                        self._busy(k, False)
            finally:
                # Kept also when opening failed: its trace holds the failure.
                if minted and minted[-1].is_completed:
                    self._result.traces.append(minted[-1])

    _seat_class = SeatAgent
    return SeatAgent


class _Turns:
    """An interaction as the env sees it, reporting each ``turn()`` as busy while it runs (the
    seat's harness answers within it; between turns the seat waits on the env, not the model)."""

    def __init__(self, interaction: Any, busy: Callable[[bool], None]):
        self._interaction = interaction
        self._report = busy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._interaction, name)

    async def turn(self, *args: Any, **kwargs: Any) -> Any:
        self._report(True)
        try:
            return await self._interaction.turn(*args, **kwargs)
        finally:
            self._report(False)


async def play_episode(vf: Any, env: Any, task: Any, make_seat: Callable[[str, EpisodeResult], Any],
                       episode_record: Callable[[Any, list[Any]], Any], *, single: bool = True) -> EpisodeResult:
    """One episode of ``task`` in ``env``: its ``setup``, ``run`` and ``finalize`` hooks, under the
    env's own ``timeout.episode`` / ``timeout.finalize``, with ``make_seat(name, result)`` in its
    one seat (``single``), or in every seat (a game).

    A hook that raises (or times out) fails the episode, as under the library's runner: the error
    is returned, with the traces so far. :class:`SecondRollout` and cancellation propagate.
    ``finalize`` runs only when the env overrides it, on ``episode_record(task, traces)`` (the
    library's ``Episode``).
    """
    result = EpisodeResult()
    only = check_single_agent(vf, env, str(getattr(env.config.taskset, "id", ""))) if single else None
    seats: dict[str, Any] = {}

    def seat(name: str, spec: Any) -> Any:
        if only is not None and name != only:
            return None
        if name not in seats:
            seats[name] = make_seat(name, result)
        return seats[name]

    agents = vf.Agents(env.config, seat)
    timeouts = getattr(env.config, "timeout", None)
    name = type(env).__name__
    hook, limit = "setup()", asyncio.timeout(getattr(timeouts, "episode", None))
    try:
        async with limit:
            await env.setup(agents)
            hook = "run()"
            await env.run(task, agents)
        if type(env).finalize is not vf.Env.finalize and result.traces and result.refused is None:
            hook, limit = "finalize()", asyncio.timeout(getattr(timeouts, "finalize", None))
            record = episode_record(task, result.traces)
            async with limit:
                await env.finalize(task, record)
            # What finalize recorded is on the record's traces (the library's Episode validates
            # the traces it is given: they may be copies); the traces keep their ids.
            result.traces = list(record.traces)
    except Exception as exc:  # noqa: BLE001 - the env's hooks failing is the episode failing
        if isinstance(exc, TimeoutError) and limit.expired():
            result.error = {"type": "EnvError", "message": f"{name}.{hook} exceeded its deadline (the env's timeout)"}
        else:
            result.error = {"type": type(exc).__name__, "message": f"{name}.{hook}: {exc}"}
    if result.refused is not None:
        raise result.refused
    if result.error is None and not result.traces:
        result.error = {"type": "EnvError", "message": f"{name}.run() ran no agent"}
    return result
