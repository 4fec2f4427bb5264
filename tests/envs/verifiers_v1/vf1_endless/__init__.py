"""An endless (``INFINITE``) taskset for the Verifiers v1 adapter tests, shaped as the library's
own ``color_codeword_v1`` and ``kuhn_poker_v1`` are: ``load()`` is a generator drawing every task
from one seeded ``random.Random``, so task ``k`` exists only after the ``k`` before it.

Task ``k`` asks for the sum of two numbers; :data:`DRAWN` counts the tasks generated (how far
the adapter has read the generator).
"""

import itertools
import random

import verifiers.v1 as vf

DRAWN = [0]


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def exact_match(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    INFINITE = True

    def load(self):
        rng = random.Random(7)
        for k in itertools.count():
            a, b = rng.randrange(100), rng.randrange(100)
            DRAWN[0] = k + 1
            yield SumTask(SumData(name=f"sum-{k}", prompt=f"What is {a} + {b}?", answer=str(a + b),
                                  system_prompt="Answer with the number only."), self.config.task)


def expected(k: int) -> tuple[str, str]:
    """(question, answer) of task ``k``, drawn as ``load()`` draws it."""
    rng = random.Random(7)
    for _ in range(k):
        rng.randrange(100), rng.randrange(100)
    a, b = rng.randrange(100), rng.randrange(100)
    return f"What is {a} + {b}?", str(a + b)


__all__ = ["SumTaskset"]
