"""A chat taskset for the Verifiers v1 adapter tests: arithmetic questions, exact-match reward.

Built in-process (no hub download). Its config has a ``split`` knob with two values, so the
adapter's split discovery (a ``Literal`` ``split`` field) is exercised too: ``train`` holds 3
questions, ``test`` holds 2.
"""

from typing import Literal

import verifiers.v1 as vf

QUESTIONS = {
    "train": [("What is 2 + 3?", "5"), ("What is 6 * 7?", "42"), ("What is 10 - 4?", "6")],
    "test": [("What is 9 + 9?", "18"), ("What is 3 * 3?", "9")],
}


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def exact_match(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)


class ArithConfig(vf.TasksetConfig):
    split: Literal["train", "test"] = "train"


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        for n, (question, answer) in enumerate(QUESTIONS[self.config.split]):
            yield ArithTask(
                ArithData(name=f"{self.config.split}-{n}", prompt=question, answer=answer,
                          system_prompt="Answer with the number only."),
                self.config.task,
            )


__all__ = ["ArithTaskset"]
