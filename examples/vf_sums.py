"""A small legacy (v0) Verifiers environment for the TRL example: add two numbers, answer in plain text.

``examples/trl_env_factory.py`` trains on it beside the bundled ``openenv/Arithmetic-v0`` (which
answers through tools): the agent reads the question and replies with the sum as its final
message, and the rubric gives 1.0 for the exact number, 0.0 otherwise. The tasks are generated
from a fixed seed, so every process sees the same ones. Play it with
``gym.make("openenv/Verifiers-v0", source="examples/vf_sums.py")``.
"""

import random

import verifiers as vf
from datasets import Dataset


def _rows(count: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        rows.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
    return rows


def load_environment(num_rows: int = 200, **kwargs) -> vf.Environment:
    def exact_sum(completion, answer) -> float:
        text = completion[-1]["content"] if completion else ""
        return 1.0 if (text or "").strip() == answer else 0.0

    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(_rows(num_rows, seed=0)),
        eval_dataset=Dataset.from_list(_rows(50, seed=1)),
        system_prompt="Answer with the number only.",
        rubric=vf.Rubric(funcs=[exact_sum]),
        **kwargs,
    )
