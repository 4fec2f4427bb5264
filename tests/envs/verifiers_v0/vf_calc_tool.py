"""A legacy (v0) Verifiers ToolEnv with a ``multiply(a, b)`` tool (test fixture).

``boom`` raises (ToolEnv turns it into a tool message, or ends the rollout with
``vf.ToolCallError`` when ``stop_on_tool_error=True``).
"""

import verifiers as vf
from datasets import Dataset

ROWS = [
    {"question": "What is 12 * 13? Use the tool, then reply with the number only.", "answer": "156"},
    {"question": "What is 7 * 8? Use the tool, then reply with the number only.", "answer": "56"},
]


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def boom(x: int) -> int:
    """A tool that always fails.

    Args:
        x: anything
    """
    raise RuntimeError(f"boom({x}) exploded")


def load_environment(stop_on_tool_error: bool = False, max_turns: int = 6, **kwargs) -> vf.Environment:
    def correct(completion, answer) -> float:
        last = completion[-1] if completion else None
        text = (last["content"] or "") if last is not None and last["role"] == "assistant" else ""
        return 1.0 if text.strip() == answer else 0.0

    return vf.ToolEnv(
        dataset=Dataset.from_list(ROWS),
        tools=[multiply, boom],
        system_prompt="Use the tools.",
        rubric=vf.Rubric(funcs=[correct]),
        max_turns=max_turns,
        stop_errors=[RuntimeError] if stop_on_tool_error else None,
        **kwargs,
    )
