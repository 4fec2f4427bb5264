"""A 3x3 grid: every move costs 0.1, reaching (2, 2) gives 1.0 and ends the episode.

``STAY`` sleeps ``GRID_STAY_SECONDS`` (default 0) before answering: a slow step for timeouts.
"""

import os
import time
import uuid

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

try:
    from ..models import GridObservation
except ImportError:  # run from the folder itself
    from models import GridObservation

MOVES = {"UP": (0, -1), "DOWN": (0, 1), "LEFT": (-1, 0), "RIGHT": (1, 0), "STAY": (0, 0)}


class GridEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self.x = self.y = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        self.x = self.y = 0
        return GridObservation(x=0, y=0, message="Walk to (2, 2).", reward=None, done=False)

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        if action.move == "STAY":
            time.sleep(float(os.environ.get("GRID_STAY_SECONDS", "0")))
        dx, dy = MOVES[action.move]
        self.x = min(2, max(0, self.x + dx))
        self.y = min(2, max(0, self.y + dy))
        if (self.x, self.y) == (2, 2):
            return GridObservation(x=self.x, y=self.y, message="You found the goal!", reward=1.0, done=True,
                                   metadata={"steps": self._state.step_count})
        return GridObservation(x=self.x, y=self.y, message="Keep going...", reward=-0.1, done=False,
                               metadata={"steps": self._state.step_count})

    @property
    def state(self):
        return self._state
