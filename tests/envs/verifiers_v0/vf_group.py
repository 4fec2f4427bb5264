"""A legacy (v0) Verifiers env with a group reward function (needs a group to score; fixture)."""

import verifiers as vf
from datasets import Dataset


def load_environment(**kwargs) -> vf.Environment:
    def correct(completion, answer) -> float:
        return 1.0 if completion and completion[-1]["content"] == answer else 0.0

    def diversity_bonus(completions) -> list[float]:
        texts = [c[-1]["content"] if c else "" for c in completions]
        return [1.0 / texts.count(t) for t in texts]

    return vf.SingleTurnEnv(
        dataset=Dataset.from_list([{"question": "Say hi.", "answer": "hi"}]),
        rubric=vf.Rubric(funcs=[correct, diversity_bonus]),
        **kwargs,
    )
