"""Wire types of the grid test environment (OpenEnv pydantic models)."""

from typing import Literal

from openenv.core.env_server.types import Action, Observation


class GridAction(Action):
    """Move one cell."""

    move: Literal["UP", "DOWN", "LEFT", "RIGHT", "STAY"]


class GridObservation(Observation):
    x: int = 0
    y: int = 0
    message: str = ""
