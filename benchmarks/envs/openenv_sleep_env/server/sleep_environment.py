"""Steps that take ``SLEEP_ENV_SECONDS`` (default 1.0) and cost the server nothing meanwhile:
the shape of OpenEnv's scaling harness, whose every step takes 1.0 s. ``step_async`` is what
OpenEnv's WebSocket handler awaits, so a thousand sleeping sessions hold no thread."""

import asyncio
import os
import uuid

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

try:
    from ..models import SleepObservation
except ImportError:  # run from the folder itself
    from models import SleepObservation

SECONDS = float(os.environ.get("SLEEP_ENV_SECONDS", "1.0"))


class SleepEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return SleepObservation(text="Say anything.", reward=None, done=False)

    def step(self, action, timeout_s=None, **kwargs):  # the sync path (OpenEnv's HTTP routes)
        raise NotImplementedError("the sleep environment steps over the WebSocket only (step_async)")

    async def step_async(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        await asyncio.sleep(SECONDS)
        return SleepObservation(text=action.text, reward=0.0, done=False)

    @property
    def state(self):
        return self._state
