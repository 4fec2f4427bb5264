"""Static detection of Fleet task sets: a JSON file of tasks, checked without running any of it.

A Fleet task set is what ``fleet.load_tasks_from_file`` reads: a JSON list of tasks, each with a
prompt, the environment it runs in (``env_id``/``env_key``) and usually verifier code. Detection
reads the JSON and parses each verifier with ``ast`` (a task whose verifier does not even parse
would only fail at the end of its first episode); it never imports fleet-python and never
executes the verifier code.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

from openenv_gym.errors import ConfigurationError, DetectionError
from openenv_gym.importers import Detected

__all__ = ["looks_like_fleet", "detect_fleet_tasks", "load_tasks", "normalize_task", "verifier_name", "MODALITIES",
           "SPLIT_TYPES"]

MODALITIES = {"tool_use": (None, "mcp"), "computer_use": ("mcp", "api/v1/mcp")}
"""modality -> (image_type sent to ``make``, MCP path under the instance root)."""
SPLIT_TYPES = {"train": "train", "test": "test", "validation": "validation", "val": "validation", "dev": "validation"}

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
    if not tasks:
        return False
    return all(isinstance(t, dict) and "prompt" in t and any(k in t for k in _ENV_KEYS)
               for t in tasks)


def detect_fleet_tasks(path: Path) -> tuple[list[dict], list[str]]:
    """The normalized tasks of the task file at ``path`` and its split names, or DetectionError."""
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
                verifier_name(task["verifier_func"])
            except ConfigurationError as exc:
                raise DetectionError(f"task {task['key']!r} in {path}: {exc}") from None
    return tasks, list(dict.fromkeys(t["split"] for t in tasks))


# -- the task file format (the Fleet adapter reads it with these too) -----------------------------

def split_version(key: str | None, version: str | None) -> tuple[str | None, str | None]:
    if key and ":" in key and version is None:
        key, version = key.split(":", 1)
    return key, version


def normalize_task(raw: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """A task in the shape the Fleet adapter uses, from Fleet's JSON or OpenEnv's task configs.

    Accepts the spellings ``fleet.load_task_from_json`` accepts (``key|id|task_key``,
    ``env_id|env_key``, ``verifier_func|verifier_code|verifier.code``, ...) plus ``split`` and
    ``task_modality``. Nothing is executed.
    """
    if not isinstance(raw, dict):
        raise ConfigurationError(f"task {index} is not a JSON object")
    verifier = raw.get("verifier_func") or raw.get("verifier_code")
    if verifier is None and isinstance(raw.get("verifier"), dict):
        verifier = raw["verifier"].get("code")
    env_key, version = split_version(raw.get("env_id") or raw.get("env_key"),
                                      raw.get("version") or raw.get("env_version") or None)
    data_key, data_version = split_version(raw.get("data_id") or raw.get("data_key") or None,
                                            raw.get("data_version") or None)
    modality = raw.get("task_modality") or raw.get("modality") or None
    if modality is not None and modality not in MODALITIES:
        raise ConfigurationError(f"task {index}: modality {modality!r} is not supported; use tool_use or computer_use")
    return {
        "key": str(raw.get("key") or raw.get("id") or raw.get("task_key") or f"task-{index}"),
        "prompt": raw.get("prompt") or "",
        "env_key": env_key,
        "version": version,
        "data_key": data_key,
        "data_version": data_version,
        "env_variables": dict(raw.get("env_variables") or {}),
        "verifier_func": verifier,
        "modality": modality,
        "split": str(raw.get("split") or "train"),
        "metadata": dict(raw.get("metadata") or {}),
    }


def load_tasks(source: str | os.PathLike | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tasks from a Fleet task file (a JSON list, or ``{"tasks": [...]}``) or a list of dicts."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigurationError(f"task file {str(path)!r} does not exist") from None
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"task file {str(path)!r} is not readable JSON: {exc}") from None
    else:
        data = source
    if isinstance(data, dict):
        data = data.get("tasks", [data] if "prompt" in data else None)
    if not isinstance(data, list):
        raise ConfigurationError("a Fleet task file holds a JSON list of tasks (or {\"tasks\": [...]})")
    return [normalize_task(t, i) for i, t in enumerate(data)]


def verifier_name(source: str) -> str:
    """The verifier's function name, read with ``ast`` (never by running the code)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ConfigurationError(f"the verifier code does not parse: {exc}") from None
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not names:
        raise ConfigurationError("the verifier code defines no function")
    return "verify" if "verify" in names else names[0]


# -- the kind's detector, named by its descriptor -------------------------------------------------

def fleet_source(source: Path, env_class: str | None) -> Detected:
    """The Fleet task set ``source`` holds."""
    if env_class is not None:
        raise DetectionError("a Fleet task set has no environment classes; drop --env-class")
    tasks, _splits = detect_fleet_tasks(source)
    return Detected(kind="fleet", env_class="", env_name=tasks[0]["env_key"], module_file=source.name,
                    sdk="fleet-python", source=str(source))
