"""The task API both protocols share: environments, splits and task specs, for the trainer.

ORS servers and OpenEnv 0.10 servers answer the same routes with the same shapes:
``GET /list_environments``, ``GET /{env}/splits``, ``POST /{env}/tasks`` ``{"split"}``,
``num_tasks`` ``{"split"}``, ``task`` ``{"split", "index"}`` (Python indexing) and
``task_range`` ``{"split", "start", "stop"}`` (slice semantics). The environment name in the path
is matched without case; another name is 404. A task spec may hold the answer: these routes are
for whoever holds the server's token, which is why every served env has one.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from openenv_gym.serving.http import for_env, guard, json_response, read_body
from openenv_gym.serving.sessions import ServedEnv

__all__ = ["add_task_routes"]


class _Split(msgspec.Struct, forbid_unknown_fields=True):
    split: str


class _Task(msgspec.Struct, forbid_unknown_fields=True):
    split: str
    index: int


class _Range(msgspec.Struct, forbid_unknown_fields=True):
    split: str
    start: int | None = None
    stop: int | None = None


def add_task_routes(app: web.Application, served: ServedEnv, name: str, *, bare: bool = False) -> None:
    """Add the task API of ``served``, listed as ``name``, to ``app``; ``bare``: also answer each
    ``/{env}/...`` route at its bare path (``/splits``...), where the openreward client sends them."""

    async def list_environments(request: web.Request) -> web.Response:
        return json_response([name])

    async def splits(request: web.Request) -> web.Response:
        return json_response([{"name": s.name, "type": s.type} for s in await served.splits()])

    async def tasks(request: web.Request) -> web.Response:
        body = await read_body(request, _Split)
        return json_response({"tasks": await served.task_range(body.split), "env_name": name})

    async def num_tasks(request: web.Request) -> web.Response:
        body = await read_body(request, _Split)
        return json_response({"num_tasks": await served.num_tasks(body.split)})

    async def task(request: web.Request) -> web.Response:
        body = await read_body(request, _Task)
        return json_response({"task": await served.task(body.split, body.index), "env_name": name})

    async def task_range(request: web.Request) -> web.Response:
        body = await read_body(request, _Range)
        return json_response({"tasks": await served.task_range(body.split, body.start, body.stop), "env_name": name})

    app.router.add_get("/list_environments", guard(list_environments))
    routes: list[tuple[str, str, Any]] = [("GET", "splits", splits), ("POST", "tasks", tasks),
                                          ("POST", "num_tasks", num_tasks), ("POST", "task", task),
                                          ("POST", "task_range", task_range)]
    for method, what, handler in routes:
        checked = for_env(name, handler)
        app.router.add_route(method, "/{env}/" + what, checked)
        if bare:
            app.router.add_route(method, f"/{what}", checked)
