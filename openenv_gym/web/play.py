"""``openenv-gym play``: be the agent of any registered env, in a page.

The page shows the episode as the agent sees it (its prompt, then each action and what the env
answered, with the reward and the end), the env's tools as forms generated from their JSON
schemas, and a box for a text reply; it starts a new episode from a seed, or the task at a split
and index, and saves the episode as an :class:`~openenv_gym.records.EpisodeRecord` line that
``openenv-gym view`` opens.

The env is driven only through the Gymnasium API (``gym.make``, ``reset``, ``step``,
``env.unwrapped.splits()`` / ``num_tasks()``), so every id plays: ORS, Verifiers, Fleet, OpenEnv,
isolated ones. Its calls block, so they run on one daemon thread of their own, in order, never
on the server's event loop: a slow step leaves the page and the server answering (the page shows
the step as pending; another action is refused with 409 until it ends). The thread is a daemon
so that a step that never returns cannot hold the process at exit.

Lifetime: the server stops on Ctrl-C or SIGTERM, and also once the last open page has been
closed for ``linger`` seconds (each page holds a WebSocket; a reload comes back within the
grace); either way the env is closed, so no server process it started is left.

The record is built here, with the helpers :class:`~openenv_gym.wrappers.RecordEpisodes` uses
(:func:`~openenv_gym.wrappers.conversation.new_messages`, ``sent_message``), rather than by that
wrapper: the page shows the episode while it runs and saves it on demand, finished or not, where
the wrapper writes only finished episodes and keeps the one in progress to itself.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import gymnasium as gym
import msgspec
from aiohttp import WSMsgType, web

from openenv_gym.errors import ConfigurationError
from openenv_gym.records import EpisodeRecord, encode_record
from openenv_gym.runtime import Worker
from openenv_gym.web.access import Access
from openenv_gym.web.page import Page, json_block_text
from openenv_gym.web.serving import STOP, LoopbackServer, run
from openenv_gym.wire import loads_plain_json
from openenv_gym.wrappers.conversation import new_messages, sent_message
from openenv_gym.wrappers.record import JsonlWriter

__all__ = ["PLAY_PAGE", "PlaySession", "make_app", "parse_kwargs", "play_command"]

PLAY_PAGE = Page("play.html", styles=["style.css"], scripts=["chat.js", "play.js"], title="openenv-gym play")

CLOSE_BUDGET = 30.0
"""Seconds the server waits for ``env.close()`` on the way out (the env bounds its own close)."""


class Conflict(Exception):
    """The request does not fit the session's state (an episode that has ended, a call running): 409."""


class Busy(Conflict):
    """The env is still answering the previous call."""

    def __init__(self) -> None:
        super().__init__("the env is still answering the previous action")


class PlaySession:
    """One env and the episode the page shows. The blocking methods (:meth:`reset`, :meth:`step`,
    :meth:`close`) run on a :class:`~openenv_gym.runtime.Worker`'s thread; :meth:`state` may be read from any."""

    def __init__(self, env: gym.Env, env_id: str, out: str | os.PathLike[str]):
        self.env, self.env_id, self.out = env, env_id, Path(out)
        self.splits = self._splits()
        self.record: EpisodeRecord | None = None
        self.turn_errors: dict[int, Any] = {}
        self.last: dict[str, Any] | None = None
        self.problem: str | None = None
        self.saved = 0
        self.busy_since: float | None = None
        self._writer: JsonlWriter | None = None
        self._lock = threading.Lock()

    def _splits(self) -> list[dict[str, Any]]:
        base: Any = self.env.unwrapped  # duck-typed: any env with splits() and num_tasks()
        out = []
        for split in base.splits() if hasattr(base, "splits") else []:
            try:
                count: int | None = int(base.num_tasks(split.name))
            except Exception:  # a backend that cannot count its tasks still plays
                count = None
            out.append({"name": split.name, "type": split.type, "num_tasks": count})
        return out

    # -- blocking: on the worker thread ---------------------------------------------------------

    def reset(self, seed: int | None = None, split: str | None = None, index: int | None = None) -> None:
        """Start a new episode: from ``seed``, or the task at ``split``/``index``."""
        options: dict[str, Any] = {}
        if split is not None:
            options["split"] = split
        if index is not None:
            options["index"] = index
        try:
            obs, info = self.env.reset(seed=seed, options=options or None)
        except Exception as exc:
            with self._lock:
                self.problem = _describe(exc)
            raise
        tools = info.get("tools")
        with self._lock:
            self.record = EpisodeRecord(
                env=self.env_id, task_id=_str(info.get("task_id")), split=_str(info.get("split")),
                index=info.get("index") if isinstance(info.get("index"), int) else None, seed=seed,
                tools=list(tools) if isinstance(tools, list) else None, messages=new_messages(obs, info),
            )
            self.turn_errors, self.last, self.problem = {}, None, None

    def step(self, action: str | dict[str, Any]) -> None:
        """Apply one action of the page's: text, or an assistant message with tool calls."""
        record = self.record
        if record is None:
            raise Conflict("no episode: start one")
        if record.terminated or record.truncated:
            raise Conflict("this episode has ended: start a new one")
        try:
            obs, reward, terminated, truncated, info = self.env.step(action)
        except Exception as exc:
            with self._lock:
                self.problem = _describe(exc)
            raise
        with self._lock:
            record.messages.append(sent_message(action, info))
            record.messages.extend(new_messages(obs, info))
            record.rewards.append(float(reward))
            record.total_reward = float(math.fsum(record.rewards))
            error = info.get("error")
            if isinstance(error, dict):
                record.errors.append(dict(error))
                self.turn_errors[len(record.rewards) - 1] = dict(error)
            if isinstance(info.get("tools"), list):
                record.tools = list(info["tools"])
            record.terminated, record.truncated = bool(terminated), bool(truncated)
            self.last = {"reward": float(reward), "terminated": bool(terminated), "truncated": bool(truncated),
                         "error": error if isinstance(error, dict) else None}

    def save(self) -> None:
        """Append the episode so far to :attr:`out` as one record line."""
        with self._lock:
            if self.record is None:
                raise Conflict("no episode to save")
            line = encode_record(self.record)
        if self._writer is None:
            self._writer = JsonlWriter(self.out)
        self._writer.write(line)
        self.saved += 1

    def close(self) -> None:
        """Close the env and the record file (idempotent)."""
        try:
            self.env.close()
        finally:
            if self._writer is not None:
                self._writer.close()

    # -- any thread -----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What the page shows: the episode so far, the last step, whether a call is running."""
        with self._lock:
            record = self.record
            return {
                "env_id": self.env_id, "splits": self.splits,
                "record": None if record is None else msgspec.to_builtins(record),
                "turn_errors": {str(k): v for k, v in self.turn_errors.items()},
                "last": self.last, "problem": self.problem,
                "busy_for": None if self.busy_since is None else round(time.monotonic() - self.busy_since, 1),
                "saved": {"path": str(self.out), "count": self.saved},
            }


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


class _Reset(msgspec.Struct, forbid_unknown_fields=True):
    seed: int | None = None
    split: str | None = None
    index: int | None = None


class _Step(msgspec.Struct, forbid_unknown_fields=True):
    action: str | dict[str, Any]


class _Presence:
    """The pages open on this server; stops it ``linger`` seconds after the last one closed."""

    def __init__(self, app: web.Application, linger: float):
        self.app, self.linger = app, linger
        self.sockets: set[web.WebSocketResponse] = set()
        self._timer: asyncio.TimerHandle | None = None

    def opened(self, ws: web.WebSocketResponse) -> None:
        self.sockets.add(ws)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def closed(self, ws: web.WebSocketResponse) -> None:
        self.sockets.discard(ws)
        if not self.sockets and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.linger, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if not self.sockets:
            print("the last page was closed: stopping", flush=True)
            self.app[STOP].set()


def make_app(session: PlaySession, worker: Worker, linger: float = 30.0) -> web.Application:
    """The play routes: the page (``/``), ``GET /api/state``, ``POST /api/reset``, ``/api/step``,
    ``/api/save``, and ``/api/live`` (the page's WebSocket, by which the server knows it is open).
    Access control is added by :class:`~openenv_gym.web.serving.LoopbackServer`."""
    boot = {"env_id": session.env_id}
    page = PLAY_PAGE.render({"og-boot": ("application/json", json_block_text(msgspec.json.encode(boot)))}, served=True)
    csp = PLAY_PAGE.csp(served=True) + "; frame-ancestors 'none'"
    app = web.Application()
    presence = _Presence(app, linger)
    pending: list[asyncio.Future[Any]] = []

    async def on_worker(fn: Callable[[], Any]) -> None:
        if pending and not pending[0].done():
            raise Busy()
        future = asyncio.wrap_future(worker.submit(fn))
        pending[:] = [future]
        session.busy_since = time.monotonic()
        future.add_done_callback(lambda _: setattr(session, "busy_since", None))
        # shield: a page that goes away mid-step does not cancel the step's bookkeeping.
        await asyncio.shield(future)

    def answer(error: str | None = None, status: int = 200) -> web.Response:
        body = session.state()
        if error is not None:
            body["error"] = error
        return web.json_response(body, status=status, dumps=_dumps)

    async def act(request: web.Request, kind: type[Any], fn: Callable[[Any], Callable[[], Any]]) -> web.Response:
        # Read as serve reads a body (bounded depth, plain JSON), then shaped: a body nested past
        # MAX_JSON_DEPTH is a 400 like any other bad body, never the decoder's RecursionError.
        try:
            value, why = loads_plain_json((await request.read()).decode("utf-8"))
        except UnicodeDecodeError:
            return answer("bad request: the body is not UTF-8", 400)
        if why is not None:
            return answer(f"bad request: {why}", 400)
        try:
            body = msgspec.convert(value, kind)
        except msgspec.ValidationError as exc:
            return answer(f"bad request: {exc}", 400)
        try:
            await on_worker(fn(body))
        except Conflict as exc:
            return answer(str(exc), 409)
        except ConfigurationError as exc:  # the env refused the request (an unknown split, a missing task)
            return answer(_describe(exc), 400)
        except Exception as exc:  # the env failed: say so on the page, the server goes on
            return answer(_describe(exc), 502)
        return answer()

    async def get_page(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8",
                            headers={"Content-Security-Policy": csp})

    async def get_state(request: web.Request) -> web.Response:
        return answer()

    async def post_reset(request: web.Request) -> web.Response:
        return await act(request, _Reset, lambda b: lambda: session.reset(b.seed, b.split, b.index))

    async def post_step(request: web.Request) -> web.Response:
        return await act(request, _Step, lambda b: lambda: session.step(b.action))

    async def post_save(request: web.Request) -> web.Response:
        try:
            await request.read()
            session.save()
        except Conflict as exc:
            return answer(str(exc), 409)
        except OSError as exc:
            return answer(f"cannot write {session.out}: {exc.strerror or exc}", 500)
        return answer()

    async def live(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=20.0)
        await ws.prepare(request)
        presence.opened(ws)
        try:
            async for msg in ws:
                if msg.type == WSMsgType.ERROR:
                    break
        finally:
            presence.closed(ws)
        return ws

    async def on_shutdown(app: web.Application) -> None:
        for ws in list(presence.sockets):
            await ws.close()

    async def on_cleanup(app: web.Application) -> None:
        await close_env(session, worker)

    app.router.add_get("/", get_page)
    app.router.add_get("/api/state", get_state)
    app.router.add_post("/api/reset", post_reset)
    app.router.add_post("/api/step", post_step)
    app.router.add_post("/api/save", post_save)
    app.router.add_get("/api/live", live)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app


def _dumps(obj: Any) -> str:
    return msgspec.json.encode(obj, enc_hook=_enc_hook).decode()


def _enc_hook(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars in a message
        return obj.item()
    return f"<{type(obj).__name__}>"


async def close_env(session: PlaySession, worker: Worker) -> None:
    """Close the env on a thread of its own, even while the worker is stuck in a step (the env
    bounds its close; waiting here is bounded too), then let the worker end."""
    done = threading.Event()

    def close() -> None:
        try:
            session.close()
        finally:
            done.set()

    threading.Thread(target=close, name="openenv-gym-play-close", daemon=True).start()
    await asyncio.get_running_loop().run_in_executor(None, done.wait, CLOSE_BUDGET)
    worker.shutdown()


def parse_kwargs(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` arguments as env kwargs: a VALUE that parses as JSON is that value (``8``,
    ``true``, ``{"a": 1}``), else the string itself (``source=./my_env``)."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigurationError(f"env kwargs are KEY=VALUE, got {item!r}")
        try:
            kwargs[key] = json.loads(value)
        except ValueError:
            kwargs[key] = value
    return kwargs


def play_command(env_id: str, kwargs: Sequence[str] = (), port: int = 0, out: str = "play.jsonl",
                 linger: float = 30.0, stdout: TextIO | None = None,
                 make: Callable[..., gym.Env] | None = None) -> int:
    """``openenv-gym play ID [KEY=VALUE ...]``: make the env, start an episode, serve the page
    until Ctrl-C (or the last page closed), then close the env. ``make(env_id, **kwargs)`` builds
    it (default ``gym.make``; the CLI passes one seat of a game for ``--seat``)."""
    from openenv_gym.registration import check_id

    stdout = stdout or sys.stdout
    check_id(env_id)
    if not linger >= 0:
        raise ConfigurationError(f"--linger must be a number of seconds >= 0, not {linger}")
    env_kwargs = parse_kwargs(kwargs)
    print(f"starting {env_id} ...", file=stdout, flush=True)
    env = (make or gym.make)(env_id, **env_kwargs)
    try:
        session = PlaySession(env, env_id, out)
        session.reset()
    except BaseException:
        env.close()
        raise
    worker = Worker("openenv-gym-play")
    worker.start()
    server = LoopbackServer(make_app(session, worker, linger), Access(), port)
    try:
        return run(server, f"play {env_id}", stdout)
    finally:
        # The app's cleanup closed the env; if the server never started, close it here.
        session.close()
