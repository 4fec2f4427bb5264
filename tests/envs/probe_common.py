"""Data shared by the probe environments of both SDKs (``ors_probe.py``, ``openreward_probe.py``).

Only the standard library and pydantic, so either SDK's server can import it: a served source's
folder is on ``sys.path``, as when the file is run as a script.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = ["PROBE_TASKS", "TINY_PNG_BASE64", "big_text", "SubmitInput", "PartialInput",
           "SecretInput", "BigInput", "SlowInput"]

# Distinct questions per index so tests can tell tasks apart by their prompt.
PROBE_TASKS: dict[str, list[dict[str, str]]] = {
    "train": [
        {"id": f"train-{i}", "question": f"What is {i + 2}+{i + 2}?", "answer": str(2 * (i + 2))}
        for i in range(5)
    ],
    "test": [
        {"id": f"test-{i}", "question": f"What is {i + 3}*{i + 3}?", "answer": str((i + 3) ** 2)}
        for i in range(2)
    ],
}

# A valid 1x1 RGBA PNG (one half-transparent blue pixel); CRCs and zlib stream check out.
TINY_PNG_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJ"
    "RU5ErkJggg=="
)

_BIG_MAX = 5_000_000


def big_text(n: int) -> str:
    """The exact text ``big(n)`` returns: ``len == n``.

    For ``n >= 3``: ``"0123456789"`` repeated and cut to ``n - 3`` characters, followed by
    ``"END"``. For ``n < 3``: the first ``n`` characters of ``"012"`` (no marker fits).
    """
    if n < 3:
        return "012"[:n]
    return ("0123456789" * (n // 10 + 1))[: n - 3] + "END"


class SubmitInput(BaseModel):
    answer: str = Field(description="Your final answer.")


class PartialInput(BaseModel):
    x: int = Field(description="Any integer; echoed back.")


class SecretInput(BaseModel):
    name: str = Field(description="Name of the secret to reveal.")


class BigInput(BaseModel):
    n: int = Field(ge=0, le=_BIG_MAX, description="Exact number of characters to return.")


class SlowInput(BaseModel):
    seconds: float = Field(ge=0, le=600, description="How long to sleep before answering.")
