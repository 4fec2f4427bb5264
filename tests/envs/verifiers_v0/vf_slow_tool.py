"""A legacy (v0) Verifiers ToolEnv whose ``nap(seconds)`` tool sleeps (test fixture): a step
that is still running when a timeout, a Ctrl-C or a close from another thread arrives.
``doze(seconds)`` sleeps in a blocking call it hands to a thread (``asyncio.to_thread``), as a
tool wrapping blocking code does."""

import asyncio
import time

import verifiers as vf
from datasets import Dataset

ROWS = [{"question": "Take a nap, then say 'done'.", "answer": "done"}]


async def nap(seconds: float) -> str:
    """Sleep a while.

    Args:
        seconds: how long
    """
    await asyncio.sleep(seconds)
    return "rested"


async def doze(seconds: float) -> str:
    """Sleep a while, blocking a thread.

    Args:
        seconds: how long
    """
    await asyncio.to_thread(time.sleep, seconds)
    return "dozed"


def load_environment(**kwargs) -> vf.Environment:
    def correct(completion, answer) -> float:
        last = completion[-1] if completion else None
        text = (last["content"] or "") if last is not None and last["role"] == "assistant" else ""
        return 1.0 if text.strip() == answer else 0.0

    return vf.ToolEnv(dataset=Dataset.from_list(ROWS), tools=[nap, doze], rubric=vf.Rubric(funcs=[correct]),
                      max_turns=4, **kwargs)
