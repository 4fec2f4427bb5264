"""Wire types of the sleep environment (OpenEnv pydantic models)."""

from openenv.core.env_server.types import Action, Observation


class SleepAction(Action):
    """Any text; the step sleeps, then echoes it."""

    text: str = ""


class SleepObservation(Observation):
    text: str = ""
