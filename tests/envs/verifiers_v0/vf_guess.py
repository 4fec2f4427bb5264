"""A legacy (v0) Verifiers MultiTurnEnv: guess a number with higher/lower hints (test fixture).

The env ends the episode itself (``state["final_env_response"]``) on a correct guess; wrong
guesses get a hint. ``max_turns`` bounds the guesses. ``fail_on`` makes ``env_response`` raise
``vf.Error`` when the agent sends that text, and the text ``slow`` makes it take ``slow_seconds``
(for error-path and timeout tests).
"""

import asyncio

import verifiers as vf
from datasets import Dataset

ROWS = [{"question": "Guess my number between 1 and 10.", "answer": str(n)} for n in (3, 7, 9)]


class GuessEnv(vf.MultiTurnEnv):
    def __init__(self, fail_on: str | None = None, slow_seconds: float = 5.0, **kwargs):
        super().__init__(**kwargs)
        self.fail_on = fail_on
        self.slow_seconds = slow_seconds

    async def setup_state(self, state):
        state["guesses"] = 0
        return state

    async def env_response(self, messages, state, **kwargs):
        guess = (messages[-1].content or "").strip()
        if self.fail_on is not None and guess == self.fail_on:
            raise vf.Error(f"the env refused guess {guess!r}")
        if guess == "slow":
            await asyncio.sleep(self.slow_seconds)
        state["guesses"] += 1
        target = int(state["answer"])
        try:
            value = int(guess)
        except ValueError:
            return [vf.UserMessage(content="Please answer with a number.")]
        if value == target:
            reply = [vf.UserMessage(content="Correct!")]
            state["final_env_response"] = reply
            return reply
        return [vf.UserMessage(content="Higher." if value < target else "Lower.")]


def load_environment(max_turns: int = 5, fail_on: str | None = None, **kwargs) -> vf.Environment:
    def solved(completion, answer) -> float:
        said = [m["content"].strip() for m in completion if m["role"] == "assistant" and m["content"]]
        return 1.0 if answer in said else 0.0

    def efficiency(state) -> float:
        return 1.0 / max(1, len(state["trajectory"]))

    rubric = vf.Rubric(funcs=[solved, efficiency], weights=[1.0, 0.25])
    return GuessEnv(
        dataset=Dataset.from_list(ROWS),
        system_prompt="Reply with one integer.",
        rubric=rubric,
        max_turns=max_turns,
        fail_on=fail_on,
        **kwargs,
    )
