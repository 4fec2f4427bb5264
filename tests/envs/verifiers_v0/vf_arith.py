"""A legacy (v0) Verifiers SingleTurnEnv: three sums, exact-match reward (test fixture)."""

import verifiers as vf
from datasets import Dataset

ROWS = [
    {"question": "What is 2 + 3?", "answer": "5"},
    {"question": "What is 40 + 2?", "answer": "42"},
    {"question": "What is 3 + 4?", "answer": "7"},
]
EVAL_ROWS = [{"question": "What is 10 + 10?", "answer": "20"}]


def load_environment(num_rows: int = 3, **kwargs) -> vf.Environment:
    def exact_match(completion, answer) -> float:
        text = completion[-1]["content"] if completion else ""
        return 1.0 if (text or "").strip() == answer else 0.0

    def length_penalty(completion) -> float:  # a weighted second reward, so sums are checked
        return -0.01 * len(completion[-1]["content"] or "") if completion else 0.0

    rubric = vf.Rubric(funcs=[exact_match, length_penalty], weights=[1.0, 0.5])
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(ROWS[:num_rows]),
        eval_dataset=Dataset.from_list(EVAL_ROWS),
        system_prompt="Answer with the number only.",
        rubric=rubric,
        **kwargs,
    )
