"""The bundled example ORS environment: integer arithmetic with a calculator tool.

This module owns a small, fully deterministic ORS environment that needs no data files, no network
and no API keys, so the package always has something real to serve in demos, docs and tests. It
is run as a stand-alone script by ``ors.Server`` in a subprocess, which is why it imports only the
standard library, ``ors`` and pydantic and never ``openenv_gym``.

Tasks are generated lazily from ``(split, index)`` with a private ``random.Random`` seeded by the
string ``f"{split}:{index}"``: string seeds are hashed with SHA-512 by ``random``, so a task is
the same in every process and on every machine regardless of ``PYTHONHASHSEED``.

Serve it with ``python arithmetic.py [PORT]`` (binds 127.0.0.1, default port 8101).
"""

from __future__ import annotations

import ast
import math
import operator
import random
import sys
from collections.abc import Callable
from typing import Any

from ors import Environment, JSONObject, Server, Split, TextBlock, ToolOutput, tool
from pydantic import BaseModel, Field

__all__ = [
    "Arithmetic",
    "CalculatorInput",
    "SubmitInput",
    "SPLIT_SIZES",
    "make_task",
    "safe_eval",
    "CalculatorError",
]

SPLIT_SIZES: dict[str, int] = {"train": 2000, "test": 500}

# Guards for the calculator: the agent controls the input, so bound both the parse and the work.
_MAX_EXPRESSION_CHARS = 500
_MAX_EXPONENT = 64
_MAX_MAGNITUDE = 10**100


# --------------------------------------------------------------------------------------------
# Task generation
# --------------------------------------------------------------------------------------------

_PRECEDENCE = {"+": 1, "-": 1, "*": 2}
_APPLY: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}


def _build(rng: random.Random, n_ops: int, under_mul: bool) -> tuple[str, int, int]:
    """Return ``(text, value, precedence)`` of a random expression with ``n_ops`` operators."""
    if n_ops == 0:
        # Operands multiplied directly stay small so answers remain human-sized.
        value = rng.randint(2, 12) if under_mul else rng.randint(1, 99)
        return str(value), value, 3
    op = rng.choice("+-*")
    left_ops = rng.randint(0, n_ops - 1)
    is_mul = op == "*"
    lt, lv, lp = _build(rng, left_ops, is_mul)
    rt, rv, rp = _build(rng, n_ops - 1 - left_ops, is_mul)
    prec = _PRECEDENCE[op]
    if lp < prec:
        lt = f"({lt})"
    # "a - (b + c)" needs its parentheses; "a + (b - c)" and "a * (b * c)" do not.
    if rp < prec or (op == "-" and rp == prec):
        rt = f"({rt})"
    return f"{lt} {op} {rt}", _APPLY[op](lv, rv), prec


def make_task(split: str, index: int) -> dict[str, str]:
    """The task at ``(split, index)``; ``index`` must already be a non-negative in-range int."""
    rng = random.Random(f"{split}:{index}")
    text, value, _ = _build(rng, rng.randint(2, 4), under_mul=False)
    return {"id": f"{split}-{index:05d}", "question": text, "answer": str(value)}


def _resolve_index(split: str, index: int) -> int:
    size = _split_size(split)
    # Python indexing, as the SDK's list-backed default gives: -1 is the last task.
    resolved = index + size if index < 0 else index
    if not 0 <= resolved < size:
        raise IndexError(f"task index {index} out of range for split {split!r} ({size} tasks)")
    return resolved


def _split_size(split: str) -> int:
    try:
        return SPLIT_SIZES[split]
    except KeyError:
        known = sorted(SPLIT_SIZES)
        raise ValueError(f"unknown split {split!r}; expected one of {known}") from None


# --------------------------------------------------------------------------------------------
# Safe calculator
# --------------------------------------------------------------------------------------------


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message is shown to the agent."""


Number = int | float

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _check(value: Any) -> Number:
    # A negative base with a fractional exponent yields a complex number in Python.
    if not isinstance(value, (int, float)):
        raise CalculatorError("result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    if abs(value) > _MAX_MAGNITUDE:
        raise CalculatorError("result too large")
    return value


def _eval_node(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        # bool is an int subclass; "True + 1" is not arithmetic the agent should rely on.
        if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return _check(node.value)
        raise CalculatorError(f"unsupported literal {node.value!r}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _eval_node(node.operand)
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp):
        fn = _BINOPS.get(type(node.op))
        if fn is None:
            raise CalculatorError(f"unsupported operator {type(node.op).__name__}")
        left = _eval_node(node.left)
        right = _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise CalculatorError(f"exponent too large (max {_MAX_EXPONENT})")
        try:
            return _check(fn(left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result too large") from None
    raise CalculatorError(f"unsupported syntax {type(node).__name__}")


def safe_eval(expression: str) -> Number:
    """Evaluate an arithmetic expression without ``eval``; raise :class:`CalculatorError`."""
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {_MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError("could not parse expression") from None
    try:
        return _eval_node(tree.body)
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def _format_number(value: Number) -> str:
    if isinstance(value, int):
        return str(value)
    return format(value, ".12g")


def _normalize_answer(answer: str) -> str:
    text = answer.strip()
    try:
        return str(int(text))
    except ValueError:
        pass
    try:
        as_float = float(text)
    except ValueError:
        return text
    if math.isfinite(as_float) and as_float.is_integer():
        return str(int(as_float))
    return text


# --------------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------------


class CalculatorInput(BaseModel):
    expression: str = Field(
        description="An arithmetic expression using numbers, + - * / // % ** and parentheses, "
        "e.g. '(17 + 4) * 3'."
    )


class SubmitInput(BaseModel):
    answer: str = Field(description="Your final answer as an integer, digits only, e.g. '55'.")


class Arithmetic(Environment):
    """Compute an integer expression, optionally with a calculator, then submit the answer."""

    def __init__(self, task_spec: dict[str, Any] = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec=task_spec, secrets=secrets)
        self.secrets = dict(secrets)

    @classmethod
    def list_splits(cls) -> list[Split]:  # type: ignore[override]  # ors's is typed as functools.cache's wrapper (decorator order)
        return [Split(name="train", type="train"), Split(name="test", type="test")]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, str]]:
        return [make_task(split, i) for i in range(_split_size(split))]

    @classmethod
    async def num_tasks(cls, split: str) -> int:
        return _split_size(split)

    @classmethod
    async def get_task(cls, split: str, index: int) -> dict[str, str]:
        return make_task(split, _resolve_index(split, index))

    @classmethod
    async def get_task_range(
        cls, split: str, start: int | None = None, stop: int | None = None
    ) -> list[JSONObject]:  # the SDK's signature (a list is invariant: list[dict[str, str]] is not one)
        return [make_task(split, i) for i in range(*slice(start, stop).indices(_split_size(split)))]

    def get_prompt(self) -> list[TextBlock]:
        question = self.task_spec["question"]
        return [
            TextBlock(
                text=f"Compute {question}. You may use the `calculator` tool for intermediate "
                "steps. When done, call `submit` with the final integer answer."
            )
        ]

    @tool
    def calculator(self, params: CalculatorInput) -> ToolOutput:
        """Evaluate an arithmetic expression (+ - * / // % **, parentheses). Not an answer."""
        try:
            text = _format_number(safe_eval(params.expression))
        except CalculatorError as exc:
            text = f"error: {exc}"
        return ToolOutput(blocks=[TextBlock(text=text)], reward=0.0, finished=False)

    @tool
    def submit(self, params: SubmitInput) -> ToolOutput:
        """Submit the final integer answer. Ends the episode."""
        correct = _normalize_answer(params.answer) == str(self.task_spec["answer"])
        return ToolOutput(
            blocks=[TextBlock(text="Correct!" if correct else "Incorrect.")],
            metadata={"correct": correct},
            reward=1.0 if correct else 0.0,
            finished=True,
        )


if __name__ == "__main__":
    Server([Arithmetic]).run(host="127.0.0.1", port=int(sys.argv[1]) if len(sys.argv) > 1 else 8101)
