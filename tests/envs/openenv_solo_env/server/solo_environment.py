"""Walk right three times to finish (reward 1.0 at the end, 0.0 before).

``CRASH`` raises inside ``step``: OpenEnv answers ``EXECUTION_ERROR`` and keeps the session,
whose state is unchanged. Every observation carries the server's pid, so a test can tell which
process served it.
"""

import os
import uuid

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

try:
    from ..models import SoloObservation
except ImportError:  # run from the folder itself
    from models import SoloObservation

GOAL = 3


class SoloEnvironment(Environment):
    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self.position = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        self.position = 0
        return SoloObservation(position=0, pid=os.getpid(), message=f"Walk right {GOAL} times.", reward=None,
                               done=False)

    def step(self, action, timeout_s=None, **kwargs):
        if action.move == "CRASH":
            raise RuntimeError("the environment crashed on purpose")
        self._state.step_count += 1
        if action.move == "RIGHT":
            self.position += 1
        done = self.position >= GOAL
        return SoloObservation(position=self.position, pid=os.getpid(),
                               message="You made it!" if done else "Keep going...", reward=1.0 if done else 0.0,
                               done=done)

    @property
    def state(self):
        return self._state
