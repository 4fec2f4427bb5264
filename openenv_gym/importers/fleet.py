"""Static detection of Fleet task sets: a JSON file of tasks, checked without running any of it.

A Fleet task set is what ``fleet.load_tasks_from_file`` reads: a JSON list of tasks, each with a
prompt, the environment it runs in (``env_id``/``env_key``) and usually verifier code. Detection
reads the JSON and parses each verifier with ``ast`` (a task whose verifier does not even parse
would only fail at the end of its first episode); it never imports fleet-python and never
executes the verifier code.
"""

from __future__ import annotations

import json
from pathlib import Path

from openenv_gym.errors import ConfigurationError, DetectionError

__all__ = ["looks_like_fleet", "detect_fleet_tasks"]

_ENV_KEYS = ("env_id", "env_key")


def _read(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _task_list(data: object) -> list | None:
    if isinstance(data, dict) and isinstance(data.get("tasks"), list):
        return data["tasks"]
    return data if isinstance(data, list) else None


def looks_like_fleet(path: Path) -> bool:
    """A cheap check: a ``.json`` file whose tasks name a prompt and an environment."""
    if not (path.is_file() and path.suffix == ".json"):
        return False
    tasks = _task_list(_read(path))
    return bool(tasks) and all(isinstance(t, dict) and "prompt" in t and any(k in t for k in _ENV_KEYS)
                               for t in tasks)


def detect_fleet_tasks(path: Path) -> tuple[list[dict], list[str]]:
    """The normalized tasks of the task file at ``path`` and its split names, or DetectionError."""
    from openenv_gym.adapters.fleet import _verifier_name, load_tasks

    if not path.is_file():
        raise DetectionError(f"a Fleet task set is a JSON file; {path} is a folder")
    data = _read(path)
    if data is None:
        raise DetectionError(f"{path} is not a JSON file")
    if _task_list(data) is None:
        raise DetectionError(f"{path} holds no list of tasks (a JSON list, or {{\"tasks\": [...]}})")
    try:
        tasks = load_tasks(path)
    except ConfigurationError as exc:
        raise DetectionError(str(exc)) from None
    if not tasks:
        raise DetectionError(f"{path} holds no tasks")
    for task in tasks:
        if not task["env_key"]:
            raise DetectionError(f"task {task['key']!r} in {path} names no environment (env_id or env_key)")
        if task["verifier_func"]:
            try:
                _verifier_name(task["verifier_func"])
            except ConfigurationError as exc:
                raise DetectionError(f"task {task['key']!r} in {path}: {exc}") from None
    return tasks, list(dict.fromkeys(t["split"] for t in tasks))
