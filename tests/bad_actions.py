"""Actions models really write that once crashed ``step()``: shared by the robustness tests of
every backend (a single env, the concurrent vector env, Ray actors)."""

from __future__ import annotations

SAYS_WHAT_WAS_WRONG = ("could not be read", "was not run", "unknown tool", "No tool call")
"""Phrases the package's own answers to bad actions contain."""


class Opaque:
    """An arbitrary object inside an action's arguments."""


def deep(n):
    root = node = []
    for _ in range(n):
        node.append([])
        node = node[0]
    return root


def call(name, arguments):
    return {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": name, "arguments": arguments}}]}


NAMED_BAD = [
    call("calculator", '{"expression": 1' + "0" * 5000 + "}"),
    call("calculator", {"expression": float("nan")}),
    call("submit", {"answer": float("inf")}),
    call("submit", {"answer": "\ud800"}),
    call("calculator", "[" * 100_000 + "]" * 100_000),
    call("calculator", {"expression": deep(100_000)}),
    call("calculator", {"expression": {1, 2}}),
    call("calculator", {"expression": b"1+1"}),
    call("calculator", {"expression": Opaque()}),
    call("submit", {7: "x"}),
    call(5, "{}"),
    call("x" * 1_000_000, "{}"),
    {"role": "assistant", "content": [{"type": "text", "text": 5}]},
    {"role": "assistant", "tool_calls": "oops"},
    {"role": "assistant", "tool_calls": [5]},
    "a lone surrogate \udbff",
    None,
    42,
]


