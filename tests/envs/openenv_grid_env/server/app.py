"""The grid test environment's app: OpenEnv's create_app, plus a fault switch for tests.

``MAX_CONCURRENT_ENVS`` sets the session limit (default 1, OpenEnv's own default). A message
whose text contains ``"move": "DISCONNECT"``-style content (the value ``DISCONNECT``) makes the
server close the socket instead of answering: a server that drops a session mid-episode.
"""

import os

from openenv.core.env_server.http_server import create_app

try:
    from ..models import GridAction, GridObservation
    from .grid_environment import GridEnvironment
except ImportError:
    from models import GridAction, GridObservation
    from server.grid_environment import GridEnvironment

_app = create_app(
    GridEnvironment, GridAction, GridObservation, env_name="grid_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "1")),
)


async def app(scope, receive, send):
    if scope["type"] != "websocket":
        return await _app(scope, receive, send)

    async def faulty_receive():
        message = await receive()
        if message.get("type") == "websocket.receive" and "DISCONNECT" in (message.get("text") or ""):
            await send({"type": "websocket.close", "code": 1011})
            return {"type": "websocket.disconnect", "code": 1011}
        return message

    return await _app(scope, faulty_receive, send)


app.router = _app.router  # lets the launcher hide the docs routes as for any FastAPI app
app.openapi_url = None
