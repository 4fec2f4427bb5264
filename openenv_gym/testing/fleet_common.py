"""What the Fleet test server and its launcher both use: the example tasks and the key's variable.

:mod:`openenv_gym.testing.fleet` (the launcher, importable without ``mcp``) and
:mod:`openenv_gym.testing.fleet_server` (the server process) both import this module, and it
imports neither, so the two never import each other. It needs nothing beyond the standard library.

:data:`EXAMPLE_TASKS` are Fleet task dicts for the server's ``issues`` environment, in the JSON
shape ``Fleet.load_tasks_from_file`` reads, plus ``split`` and ``task_modality`` keys; the
server lists them at ``GET /v1/tasks`` and :func:`write_example_tasks` writes them to a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["API_KEY_ENV", "DEFAULT_API_KEY", "EXAMPLE_TASKS", "take_api_key", "write_example_tasks"]

API_KEY_ENV = "FLEET_TEST_SERVER_API_KEY"
"""The environment variable that carries the server's API key from the launcher to the server.

Never a command-line argument: any local user can read another process's argv (``ps``,
``/proc/<pid>/cmdline``), while its environment is readable by the same user only."""

DEFAULT_API_KEY = "test-key"


def take_api_key() -> str:
    """The API key from :data:`API_KEY_ENV` (else :data:`DEFAULT_API_KEY`), removed from the environment.

    Removed so that code running later in the server process (the verifiers it executes) cannot
    read it from ``os.environ``.
    """
    return os.environ.pop(API_KEY_ENV, None) or DEFAULT_API_KEY


_VERIFY_LOGIN_BUG = '''\
def verify(env, final_answer=None) -> float:
    """1.0 if an issue titled "Login fails" exists."""
    env.instance.load()
    rows = env.db("current").table("issues").eq("title", "Login fails").all()
    return 1.0 if rows else 0.0
'''

_VERIFY_COUNT_OPEN = '''\
def verify(env, final_answer=None) -> float:
    """1.0 if the final answer names the number of open issues, and no other number."""
    env.instance.load()
    open_count = len(env.db("current").table("issues").eq("status", "open").all())
    numbers = extract_numbers(str(final_answer or ""))
    return 1.0 if numbers and set(numbers) == {float(open_count)} else 0.0
'''

_VERIFY_TRIAGE = '''\
def verify(env, final_answer=None) -> float:
    """Two checks; the accumulator blocks on stdout let a caller give partial credit."""
    env.instance.load()
    issues = env.db("current").table("issues")
    successes, errors = [], []
    if issues.eq("title", "Crash on save").all():
        successes.append("issue 'Crash on save' was created")
    else:
        errors.append("no issue titled 'Crash on save'")
    first = issues.eq("id", 1).first()
    if first is not None and first["status"] == "closed":
        successes.append("issue 1 is closed")
    else:
        errors.append("issue 1 is not closed")
    print(">>> SUCCESS_ACCUMULATOR >>>")
    print(repr(successes))
    print("<<< SUCCESS_ACCUMULATOR <<<")
    print(">>> ERROR_ACCUMULATOR >>>")
    print(repr(errors))
    print("<<< ERROR_ACCUMULATOR <<<")
    return 1.0 if not errors else 0.0
'''

_VERIFY_SCREEN_FLICKER = '''\
def verify(env, final_answer=None) -> float:
    """1.0 if an issue titled "Screen flicker" exists."""
    env.instance.load()
    rows = env.db("current").table("issues").eq("title", "Screen flicker").all()
    return 1.0 if rows else 0.0
'''


def _task(key: str, prompt: str, verifier: str, split: str, modality: str = "tool_use") -> dict[str, Any]:
    return {
        "key": key,
        "prompt": prompt,
        "env_id": "issues",
        "version": "1.0.0",
        "data_id": "seed",
        "data_version": "1.0",
        "verifier_func": verifier,
        "metadata": {},
        "split": split,
        "task_modality": modality,
    }


EXAMPLE_TASKS: list[dict[str, Any]] = [
    _task(
        "create-login-bug",
        'Users report that logging in fails. File an issue titled "Login fails" describing the problem.',
        _VERIFY_LOGIN_BUG,
        "train",
    ),
    _task(
        "count-open",
        "How many issues are currently open? Submit the number with submit_final_answer.",
        _VERIFY_COUNT_OPEN,
        "train",
    ),
    _task(
        "triage",
        'Triage the tracker: file an issue titled "Crash on save", and close issue 1 (it is fixed).',
        _VERIFY_TRIAGE,
        "train",
    ),
    _task(
        "screen-flicker",
        'Take a screenshot of the tracker, then file an issue titled "Screen flicker".',
        _VERIFY_SCREEN_FLICKER,
        "test",
        modality="computer_use",
    ),
]


def write_example_tasks(path: str | os.PathLike[str]) -> Path:
    """Write :data:`EXAMPLE_TASKS` as a JSON list (what ``Fleet.load_tasks_from_file`` reads)."""
    target = Path(path)
    target.write_text(json.dumps(EXAMPLE_TASKS, indent=2) + "\n", encoding="utf-8")
    return target
