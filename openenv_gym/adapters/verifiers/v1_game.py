"""A game of a multi-agent Verifiers v1 env: every seat an agent of ours, every model call a prompt.

The env's own ``run(task, agents)`` plays as under the library's runner (``kuhn_poker_v1`` opens
both players' interactions and asks whichever must bet; ``proposer_solver_v1`` runs the proposer,
then ``n`` solvers at once), with a seat agent of ours in every seat
(:func:`~openenv_gym.adapters.verifiers.v1_env.seat_agent_class`). Each run of a seat is a
player: its trace is bound on the adapter's router to a :class:`Handoff` of its own, so its model
calls reach this game as that player's prompts.

When does the game wait on the caller? A player is *busy* while its harness runs (inside a
``run()``, or one ``turn()`` of an interaction): a busy player will ask the model or finish. So
the game has *settled* once at least one player asked and every busy player has asked (or the
env's ``run()`` returned): nothing more happens until the caller answers. A player that is not
busy waits on the env (another seat's turn); it is neither asked nor finished.

Rewards are paid when the game is over (after ``run()`` and the env's ``finalize()``), from each
player's trace, as :func:`~openenv_gym.adapters.verifiers.v1_calls.trace_outcome` reads a
single agent's: the env may record them only then (kuhn's payoff after both interactions close,
proposer_solver's ``learnability`` in ``finalize``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from openenv_gym.actions import Turn, unreadable_reply
from openenv_gym.adapters.games import Asked, Game, Moves, NotAsked, Paid
from openenv_gym.adapters.verifiers.v1_calls import SeatCalls, trace_error, trace_outcome
from openenv_gym.adapters.verifiers.v1_compat import guarded_async
from openenv_gym.adapters.verifiers.v1_env import EpisodeResult, seat_name
from openenv_gym.adapters.verifiers.v1_handoff import Handoff
from openenv_gym.errors import BackendError, ConfigurationError, ServerError
from openenv_gym.wire import Message, TaskRef, ToolSpec

if TYPE_CHECKING:
    from openenv_gym.adapters.verifiers.v1 import VerifiersV1Adapter

__all__ = ["VerifiersV1Game"]

logger = logging.getLogger(__name__)

SETTLE_PASSES = 3
"""Loop passes a settled game waits before it answers: runs the env started in the same pass (a
TaskGroup's solvers) begin on the next one, and must be seen busy before the game says who asked."""


class _Player:
    """One run of one seat: its model calls, what it has not yet seen, and its trace."""

    def __init__(self, name: str, on_call: Any, bad_arguments: str):
        self.name = name
        self.handoff = Handoff(on_call)
        self.calls = SeatCalls(bad_arguments)
        self.trace: Any = None
        self.trace_ids: list[str] = []
        self.busy = False
        self.opened = False
        self.unread: list[Message] = []
        self.local: list[Message] = []
        """Tool messages answered here (unparseable calls), shown with the next prompt."""
        self.tools: list[ToolSpec] | None = None
        self.info: dict[str, Any] = {}

    def read(self) -> None:
        """Take the player's next model call, if one waits, into what it has not yet seen."""
        if self.handoff.pending is not None:
            return
        call = self.handoff.poll()
        if call is None:
            return
        if not self.opened:
            self.opened = True
            messages, opening_tools = self.calls.opening(call)
            self.unread += messages
            self.tools = opening_tools
            self.info = {"trace_id": self.trace_ids[-1] if self.trace_ids else None}
            return
        new, info, tools = self.calls.added(call)
        if self.local:
            info["invalid_action"] = "bad_arguments"
        self.unread += new + self.local
        self.local = []
        if tools is not None:
            self.tools = tools
        self.info.update(info)


class VerifiersV1Game(Game):
    """One game of the adapter's env (see the module docs); made by ``VerifiersV1Adapter.game()``."""

    def __init__(self, adapter: VerifiersV1Adapter):
        self.adapter = adapter
        self.players = adapter.players()
        self._by_name: dict[str, _Player] = {}
        self._order: list[str] = []
        self._asked_order: list[str] = []
        self._run: asyncio.Task[EpisodeResult] | None = None
        self._changed = asyncio.Event()
        self._task_id: str | None = None
        self._paid: dict[str, Paid] | None = None
        self._closed = False

    # -- the env's side (called from inside its run) --------------------------------------------------
    def _player(self, seat: str, k: int) -> _Player:
        name = seat_name(seat, self.adapter.seat_runs.get(seat, 1), k)
        player = self._by_name.get(name)
        if player is None:
            player = self._by_name[name] = _Player(name, self._changed.set, self.adapter.bad_arguments)
            self._order.append(name)
        return player

    def _on_trace(self, seat: str, trace: Any, k: int) -> None:
        player = self._player(seat, k)
        player.trace = trace  # a retried run mints a new trace: the last one counts
        player.trace_ids.append(trace.id)
        self.adapter.router.bind(trace.id, player.handoff)
        self._changed.set()

    def _on_busy(self, seat: str, k: int, busy: bool) -> None:
        self._player(seat, k).busy = busy
        self._changed.set()

    # -- the caller's side -----------------------------------------------------------------------------
    async def start(self, task: TaskRef) -> Moves:
        adapter = self.adapter
        if not adapter.serving:
            raise BackendError("the Verifiers v1 adapter is not started (or is closed)")
        if self._run is not None:
            raise ConfigurationError("a game is started once; make a new one for the next")
        vtask, self._task_id = await adapter.resolve_task(task)
        self._run = asyncio.get_running_loop().create_task(
            guarded_async(adapter.play(vtask, self._on_trace, self._on_busy)), name=f"verifiers-v1 game {adapter.env_id}")
        try:
            return await self._settle()
        except BaseException:
            await self.aclose()
            raise

    async def act(self, turns: dict[str, Turn]) -> Moves:
        if self._run is None or self._closed:
            raise BackendError("the game is not running")
        if self._paid is not None:
            raise NotAsked("the game is over; start a new one")
        for name in turns:
            player = self._by_name.get(name)
            if player is None or player.handoff.pending is None:
                what = "no seat of this game" if name not in self.players else (
                    "not asked now (the game waits on " + (", ".join(self._asked()) or "no seat") + ")")
                raise NotAsked(f"{name!r} is {what}")
        for name, turn in turns.items():
            player = self._by_name[name]
            player.unread, player.info = [], {}
            if turn.error is not None:
                player.unread = [unreadable_reply(turn.error)]
                player.info = {"invalid_action": "unreadable"}
                continue
            local, answered = player.calls.answer(turn, player.handoff.take)
            if not answered:
                player.unread = local
                player.info = {"invalid_action": "bad_arguments", "forwarded": False}
            else:
                player.local = local
                self._asked_order.remove(name)
        return await self._settle()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        run, self._run = self._run, None
        if run is not None and not run.done():
            run.cancel()  # cancels every seat's rollout: the library stops their programs
            done, _ = await asyncio.wait({run}, timeout=60.0)
            if not done:
                logger.warning("the game of %s did not stop within 60 s", self.adapter.env_id)
        elif run is not None and not run.cancelled():
            run.exception()  # retrieved: no "exception was never retrieved" noise
        for player in self._by_name.values():
            for trace_id in player.trace_ids:
                self.adapter.router.unbind(trace_id, player.handoff)
            player.handoff.close()

    # -- settling ---------------------------------------------------------------------------------------
    def _asked(self) -> list[str]:
        return [n for n in self._asked_order if self._by_name[n].handoff.pending is not None]

    def _moves(self) -> Moves:
        asked = {}
        for name in self._asked():
            player = self._by_name[name]
            asked[name] = Asked(name, player.unread, player.tools, dict(player.info))
            player.tools = None  # sent once
        return Moves(asked, list(self._order), self._paid, {"task_id": self._task_id})

    async def _settle(self) -> Moves:
        run = self._run
        assert run is not None
        passes = 0
        while True:
            self._changed.clear()
            for player in self._by_name.values():
                had = player.handoff.pending is not None
                player.read()
                if not had and player.handoff.pending is not None:
                    self._asked_order.append(player.name)
            if run.done():
                return self._over(run)
            players = self._by_name.values()
            if self._asked() and all(p.handoff.pending is not None for p in players if p.busy):
                if passes >= SETTLE_PASSES:
                    return self._moves()
                passes += 1
                await asyncio.sleep(0)
                continue
            passes = 0
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({changed, run}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()

    def _over(self, run: asyncio.Task[EpisodeResult]) -> Moves:
        if run.cancelled():
            raise BackendError("the game was cancelled")
        exc = run.exception()
        if isinstance(exc, ConfigurationError):
            raise exc  # a seat ran more often than declared (seat_runs)
        if exc is not None:
            raise ServerError(f"the Verifiers game raised {type(exc).__name__}: {exc}") from exc
        result = run.result()
        paid: dict[str, Paid] = {}
        info: dict[str, Any] = {"task_id": self._task_id}
        if result.error is not None:
            info["error"] = result.error
        final = {trace.id: trace for trace in result.traces}  # as finalize() left them
        for name in self._order:
            player = self._by_name[name]
            player.trace = next((final[t] for t in reversed(player.trace_ids) if t in final), player.trace)
            if player.trace is None:  # started, but its rollout never minted a trace
                paid[name] = Paid(name, 0.0, False, True, {"error": result.error or {
                    "type": "EnvError", "message": "the seat's rollout did not start"}})
                continue
            reward, terminated, truncated, seat_info = trace_outcome(player.trace, result.error)
            error = trace_error(player.trace)
            if error is not None and "error" not in seat_info:
                seat_info["error"] = error
            paid[name] = Paid(name, reward, terminated, truncated, seat_info)
        self._paid = paid
        return Moves({}, list(self._order), paid, info)
