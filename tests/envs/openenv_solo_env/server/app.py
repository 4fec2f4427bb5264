"""The single-session test environment's app: OpenEnv's create_app with its defaults.

No ``max_concurrent_envs`` and no ``MAX_CONCURRENT_ENVS``: like grid_world, connect4, coding and
maze in OpenEnv's own envs/, the server allows one WebSocket session at a time.
"""

from openenv.core.env_server.http_server import create_app

try:
    from ..models import SoloAction, SoloObservation
    from .solo_environment import SoloEnvironment
except ImportError:
    from models import SoloAction, SoloObservation
    from server.solo_environment import SoloEnvironment

app = create_app(SoloEnvironment, SoloAction, SoloObservation, env_name="solo_env")
