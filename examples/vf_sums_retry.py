"""A small Verifiers environment (legacy API) for the serving example: add two numbers.

The agent answers in plain text; a wrong answer gets "Not quite, try again." and another turn, up
to three; a right one ends the episode. The rubric rewards an exact answer (1.0). Served with
``openenv-gym serve openenv/Verifiers-v0 source=examples/vf_sums.py --protocol openenv``, the
answer is sent with the ``respond`` tool.
"""

import random

import verifiers as vf
from datasets import Dataset


def _rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        rows.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
    return rows


class Sums(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        said = (messages[-1].content or "").strip()
        if said == state["answer"]:
            reply = [vf.UserMessage(content="Correct!")]
            state["final_env_response"] = reply
            return reply
        return [vf.UserMessage(content="Not quite, try again.")]


def load_environment(num_tasks: int = 64, max_turns: int = 3, **kwargs) -> vf.Environment:
    def exact(completion, answer) -> float:
        said = [m["content"].strip() for m in completion if m["role"] == "assistant" and m["content"]]
        return 1.0 if said and said[-1] == answer else 0.0

    return Sums(dataset=Dataset.from_list(_rows(num_tasks, seed=0)),
                system_prompt="Reply with the number only.", rubric=vf.Rubric(funcs=[exact]),
                max_turns=max_turns, **kwargs)
