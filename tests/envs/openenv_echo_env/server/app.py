"""The echo test environment's app (MCP), built with OpenEnv's create_app."""

import os

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

try:
    from .echo_environment import EchoEnvironment
except ImportError:
    from server.echo_environment import EchoEnvironment

app = create_app(
    EchoEnvironment, CallToolAction, CallToolObservation, env_name="echo_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "8")),
)
