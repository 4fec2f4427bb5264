"""Wire types of the single-session test environment (OpenEnv pydantic models)."""

from typing import Literal

from openenv.core.env_server.types import Action, Observation


class SoloAction(Action):
    """Step right, stay, or make the environment's own code raise."""

    move: Literal["RIGHT", "STAY", "CRASH"]


class SoloObservation(Observation):
    position: int = 0
    pid: int = 0
    message: str = ""
