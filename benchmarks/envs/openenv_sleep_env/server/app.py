"""The sleep environment's app: OpenEnv's create_app, sessions up to ``MAX_CONCURRENT_ENVS``."""

import os

from openenv.core.env_server.http_server import create_app

try:
    from ..models import SleepAction, SleepObservation
    from .sleep_environment import SleepEnvironment
except ImportError:
    from models import SleepAction, SleepObservation
    from server.sleep_environment import SleepEnvironment

app = create_app(
    SleepEnvironment, SleepAction, SleepObservation, env_name="sleep_env",
    max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "65536")),
)
