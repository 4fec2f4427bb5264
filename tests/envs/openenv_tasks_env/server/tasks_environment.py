"""Sums as tasks: split ``train`` has 5 (``i+i``), ``test`` has 3 (``i*10+1``).

Reset takes ``split`` and ``index`` (OpenEnv's task API); a right answer gives 1.0 and ends the
episode, a wrong one 0.0, and the episode ends after 3 wrong answers.
"""

import uuid

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

try:
    from ..models import QuestionObservation
except ImportError:
    from models import QuestionObservation

SPLITS = {"train": 5, "test": 3}


def _task(split, index):
    if split not in SPLITS or not 0 <= index < SPLITS[split]:
        raise IndexError(index)
    if split == "train":
        return {"id": f"train-{index}", "q": f"{index}+{index}", "a": str(2 * index)}
    return {"id": f"test-{index}", "q": f"{index * 10}+1", "a": str(index * 10 + 1)}


class TasksEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)
        self.task = _task("train", 0)
        self.wrong = 0

    # OpenEnv's TaskProvider protocol
    def list_splits(self):
        return list(SPLITS)

    def list_tasks(self, split):
        return [_task(split, i) for i in range(SPLITS[split])]

    def num_tasks(self, split):
        return SPLITS[split]

    def get_task(self, split, index):
        return _task(split, index)

    def reset(self, seed=None, episode_id=None, split=None, index=None, **kwargs):
        self.task = _task(split or "train", 0 if index is None else int(index))
        self.wrong = 0
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return QuestionObservation(question=f"Compute {self.task['q']}", reward=None, done=False,
                                   metadata={"task_id": self.task["id"]})

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        if action.answer.strip() == self.task["a"]:
            return QuestionObservation(question="", feedback="correct", reward=1.0, done=True)
        self.wrong += 1
        return QuestionObservation(question=f"Compute {self.task['q']}", feedback="wrong", reward=0.0,
                                   done=self.wrong >= 3)

    @property
    def state(self):
        return self._state
