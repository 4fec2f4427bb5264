"""The probe environment for the test suite, written against the openreward SDK.

This module owns the openreward twin of ``tests/envs/ors_probe.py``'s ``Probe``: the same splits,
tasks and tools with the same results, served by the openreward server, whose wire format adds
fields and which refuses calls after ``finished`` (see the ORS reference, section 1.6). It is
self-contained rather than importing ``ors_probe`` so that serving it never needs ors-sdk; keep
the two in step. Set ``OPENREWARD_DISABLE_UPDATE_CHECK=1`` before serving to avoid a PyPI check.

Serve with ``python openreward_probe.py PORT`` (binds 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from openreward.environments import (
    Environment,
    ImageBlock,
    Server,
    Split,
    TextBlock,
    ToolOutput,
    tool,
)

__all__ = [
    "Probe",
    "PROBE_TASKS",
    "TINY_PNG_BASE64",
    "big_text",
]

from probe_common import (  # noqa: E402  (a sibling module: the folder is on sys.path)
    PROBE_TASKS,
    TINY_PNG_BASE64,
    BigInput,
    PartialInput,
    SecretInput,
    SlowInput,
    SubmitInput,
    big_text,
)


def _text(text: str, reward: float = 0.0, finished: bool = False) -> ToolOutput:
    return ToolOutput(blocks=[TextBlock(text=text)], reward=reward, finished=finished)


class Probe(Environment):
    """Probe environment: one tool per adapter behaviour under test."""

    def __init__(self, task_spec: dict[str, Any] = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec=task_spec, secrets=secrets)
        self.secrets = dict(secrets)
        self.ticks = 0

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name="train", type="train"), Split(name="test", type="test")]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, str]]:
        return PROBE_TASKS[split]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=str(self.task_spec["question"]))]

    @tool
    def hint(self) -> ToolOutput:
        """Get a hint. Does not end the episode."""
        return _text("Think step by step.")

    @tool
    def submit(self, params: SubmitInput) -> ToolOutput:
        """Submit the final answer. Ends the episode."""
        correct = params.answer.strip() == str(self.task_spec["answer"])
        return _text("Correct!" if correct else "Incorrect.", 1.0 if correct else 0.0, True)

    @tool
    def partial(self, params: PartialInput) -> ToolOutput:
        """Earn a partial reward of 0.25. Does not end the episode."""
        return _text(f"partial {params.x}", 0.25)

    @tool
    def secret(self, params: SecretInput) -> ToolOutput:
        """Reveal the value of a secret passed at session creation, or '<missing>'."""
        return _text(self.secrets.get(params.name, "<missing>"))

    @tool
    def big(self, params: BigInput) -> ToolOutput:
        """Return a text of exactly n characters: digits 0-9 repeated, ending in 'END' if n >= 3."""
        return _text(big_text(params.n))

    @tool
    def boom(self) -> ToolOutput:
        """Always raise RuntimeError('boom on purpose')."""
        raise RuntimeError("boom on purpose")

    @tool
    async def slow(self, params: SlowInput) -> ToolOutput:
        """Sleep for the given number of seconds, then answer 'slept'."""
        await asyncio.sleep(params.seconds)
        return _text("slept")

    @tool
    async def tick(self, params: SlowInput) -> ToolOutput:
        """Sleep for the given seconds, then count this call: answers how often tick has run."""
        await asyncio.sleep(params.seconds)
        self.ticks += 1
        return _text(str(self.ticks))

    @tool
    def image(self) -> ToolOutput:
        """Return a text block and a 1x1 PNG image block."""
        return ToolOutput(
            blocks=[
                TextBlock(text="Here is an image."),
                ImageBlock(data=TINY_PNG_BASE64, mimeType="image/png"),
            ],
            reward=0.0,
            finished=False,
        )


if __name__ == "__main__":
    Server([Probe]).run(host="127.0.0.1", port=int(sys.argv[1]))
