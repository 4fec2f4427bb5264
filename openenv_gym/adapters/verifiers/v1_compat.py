"""Importing ``verifiers.v1``, telling before anything runs whether it can run a taskset, and its errors.

The v1 adapter (:mod:`openenv_gym.adapters.verifiers.v1`) works with every ``verifiers`` whose
``verifiers.v1`` has the names it uses (:data:`REQUIRED_NAMES`); a taskset may need more.
:func:`check_source_compat` reads a taskset's source (never runs it) for the ``verifiers.v1``
names it uses and its ``pyproject.toml`` requirement, so that a taskset written for a newer
release is refused with what to install instead of failing inside a rollout.
:func:`translate_load_error` does the same for errors raised while loading a taskset, and
:func:`library_exit` turns the library's attempts to leave the process into ordinary errors.
"""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path
from typing import Any

from openenv_gym.errors import ConfigurationError

__all__ = ["MIN_VERSION", "REQUIRED_NAMES", "check_source_compat", "episode_record", "guarded", "guarded_async",
           "import_v1", "installed_version", "library_exit", "translate_load_error"]

MIN_VERSION = "0.3"
"""The first release whose ``verifiers.v1`` has the Taskset/Agent/Env shape used here (0.2's
``verifiers.v1`` has tasksets but no ``Agent`` nor ``Env`` seats)."""

REQUIRED_NAMES = (
    "Agent", "AgentConfig", "Agents", "Env", "Episode", "SingleAgentEnv", "SubprocessConfig",
    "EvalClientConfig", "Taskset", "Task", "resolve_env_config", "load_environment", "default_harness_id",
)
"""Public ``verifiers.v1`` names the adapter itself uses; missing ones mean an incompatible v1."""


def import_v1() -> Any:
    """``verifiers.v1``, or a ConfigurationError saying what to install."""
    try:
        import verifiers
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ConfigurationError(
            "Verifiers v1 tasksets need the `verifiers` package with its v1 API "
            f"(verifiers>={MIN_VERSION}; 0.4.x is v1 only): pip install 'verifiers>=0.4' "
            f"({type(exc).__name__}: {exc})"
        ) from None
    version = getattr(verifiers, "__version__", "?")
    missing = [n for n in REQUIRED_NAMES if not hasattr(vf, n)]
    if missing:
        raise ConfigurationError(
            f"the installed verifiers {version} has an older, incompatible verifiers.v1 "
            f"(it lacks {', '.join(missing)}); install verifiers>={MIN_VERSION}, e.g. "
            "pip install -U 'verifiers>=0.4'"
        )
    return vf


def installed_version() -> str:
    import verifiers

    return str(getattr(verifiers, "__version__", "?"))


def _v1_references(tree: ast.AST) -> dict[str, set[str]]:
    """``{module: {names}}`` a module takes from ``verifiers.v1`` (and its submodules).

    Resolves ``import verifiers.v1 as vf`` + ``vf.X``, ``from verifiers import v1`` + ``v1.X``,
    ``import verifiers.v1`` + ``verifiers.v1.X`` and ``from verifiers.v1[.sub] import X``.
    """
    refs: dict[str, set[str]] = {}
    aliases: dict[str, str] = {}  # local name -> module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "verifiers.v1" or a.name.startswith("verifiers.v1."):
                    if a.asname:
                        aliases[a.asname] = a.name
                    refs.setdefault(a.name, set())
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "verifiers":
                for a in node.names:
                    if a.name == "v1":
                        aliases[a.asname or "v1"] = "verifiers.v1"
            elif node.module == "verifiers.v1" or node.module.startswith("verifiers.v1."):
                refs.setdefault(node.module, set()).update(a.name for a in node.names if a.name != "*")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in aliases:
            refs.setdefault(aliases[value.id], set()).add(node.attr)
        elif (isinstance(value, ast.Attribute) and value.attr == "v1" and isinstance(value.value, ast.Name)
              and value.value.id == "verifiers"):
            refs.setdefault("verifiers.v1", set()).add(node.attr)
    return refs


def _source_files(root: Path, limit: int = 400) -> list[Path]:
    if root.is_file():
        return [root]
    skip = {".git", ".venv", "venv", "__pycache__", "node_modules", "build", "dist", ".tox"}
    files = []
    for path in sorted(root.rglob("*.py")):
        if not skip.intersection(path.relative_to(root).parts):
            files.append(path)
            if len(files) >= limit:
                break
    return files


def _required_spec(root: Path) -> str | None:
    """The ``verifiers`` requirement of the source's ``pyproject.toml`` (package dir or its parent)."""
    base = root if root.is_dir() else root.parent
    for candidate in (base / "pyproject.toml", base.parent / "pyproject.toml"):
        if not candidate.is_file():
            continue
        try:
            data = tomllib.loads(candidate.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            return None
        for dep in data.get("project", {}).get("dependencies", []) or []:
            if isinstance(dep, str) and dep.replace("_", "-").lower().split("[")[0].strip().startswith("verifiers"):
                return dep
        return None
    return None


def check_source_compat(source: str | os.PathLike, vf: Any | None = None) -> None:
    """Raise ConfigurationError when ``source`` needs a newer ``verifiers`` than the installed one.

    Static, never runs the source: its ``pyproject.toml`` requirement on ``verifiers`` (when
    ``packaging`` is importable) and every ``verifiers.v1`` name its modules use.
    """
    import importlib

    vf = vf if vf is not None else import_v1()
    root = Path(source)
    version = installed_version()
    spec = _required_spec(root)
    if spec is not None:
        try:
            from packaging.requirements import Requirement
            from packaging.version import Version

            req = Requirement(spec)
            if req.name.replace("_", "-").lower() == "verifiers" and req.specifier and \
                    not req.specifier.contains(Version(version), prereleases=True):
                raise ConfigurationError(
                    f"{root.name} requires {spec!r} but verifiers {version} is installed: "
                    f"pip install '{req.name}{req.specifier}'"
                )
        except ImportError:
            pass
        except ValueError as exc:  # an unparsable requirement or version: names decide below
            if isinstance(exc, ConfigurationError):
                raise
    missing: dict[str, set[str]] = {}
    for path in _source_files(root):
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for module_name, names in _v1_references(tree).items():
            try:
                module = vf if module_name == "verifiers.v1" else importlib.import_module(module_name)
            except ImportError:
                missing.setdefault(module_name, set()).add("(module)")
                continue
            for name in names:
                if not hasattr(module, name):
                    try:  # a submodule not imported by its package
                        importlib.import_module(f"{module_name}.{name}")
                    except ImportError:
                        missing.setdefault(module_name, set()).add(name)
    if missing:
        listed = "; ".join(f"{m}: {', '.join(sorted(n))}" for m, n in sorted(missing.items()))
        raise ConfigurationError(
            f"{root.name} uses Verifiers v1 names that the installed verifiers {version} lacks "
            f"({listed}); it needs a newer verifiers: pip install -U verifiers"
        )


def _import_failure(exc: BaseException, module: str) -> ImportError | None:
    """The import error a taskset's own code raised, under the library's "taskset not found".

    The library's loader turns *any* ``ModuleNotFoundError`` met while importing the taskset
    (one of the taskset's own dependencies missing, say) into "taskset 'x' not found", keeping
    the real one as its cause. Returns the innermost import error of the chain unless it is about
    the taskset module itself (then the taskset really is not installed).
    """
    chain: list[ImportError] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ImportError):
            chain.append(current)
        current = current.__cause__ or current.__context__
    if not chain:
        return None
    inner = chain[-1]
    name = getattr(inner, "name", None) or ""
    if isinstance(inner, ModuleNotFoundError) and (not name or name.split(".")[0] == module):
        return None  # the taskset itself is not importable (or nothing says what was missing)
    return inner


def translate_load_error(exc: BaseException, env_id: str) -> BaseException:
    """A ConfigurationError for a taskset that cannot be loaded, with the error that really happened."""
    module = env_id.split("/")[-1].split("@")[0].replace("-", "_").lower()
    real = _import_failure(exc, module) if isinstance(exc, ImportError) else None
    if real is not None and real is not exc:
        exc = real
    message = f"{type(exc).__name__}: {exc}"
    missing_module = getattr(exc, "name", None) or ""
    if (isinstance(exc, ModuleNotFoundError) and missing_module.startswith("verifiers")) or (
            isinstance(exc, (AttributeError, ImportError)) and not isinstance(exc, ModuleNotFoundError)
            and "verifiers" in str(exc)):
        return ConfigurationError(
            f"taskset {env_id!r} needs a newer verifiers than the installed {installed_version()} "
            f"({message}); pip install -U verifiers"
        )
    if real is not None:
        return ConfigurationError(
            f"importing taskset {env_id!r} failed: {message}; install what it imports (its "
            "pyproject.toml dependencies: `pip install -e <project folder>` installs them)"
        )
    if isinstance(exc, ModuleNotFoundError):
        return ConfigurationError(
            f"taskset {env_id!r} cannot be imported ({message}); install its package, or pass "
            "source= (the package folder)"
        )
    if isinstance(exc, Exception):
        return ConfigurationError(f"taskset {env_id!r} cannot be loaded: {message}")
    return exc


def episode_record(vf: Any, env_id: str, traces: list[Any]) -> Any:
    """The library's ``vf.Episode`` of one finished episode's traces (what ``Env.finalize`` reads).

    verifiers 0.3.1 added a required ``task`` field (the task as recorded on every trace).
    """
    fields: dict[str, Any] = {"env": {"id": env_id}, "traces": list(traces),
                              "ok": all(getattr(t, "ok", False) for t in traces)}
    if "task" in getattr(vf.Episode, "model_fields", {}):
        fields["task"] = traces[0].task
    return vf.Episode(**fields)


def library_exit(exc: BaseException) -> BaseException:
    """A library ``SystemExit`` (e.g. "not authenticated with prime") as an ordinary error.

    Raised inside a task on the shared runtime loop, a ``SystemExit`` would stop the loop
    itself and hang every env of the process.
    """
    return ConfigurationError(f"the Verifiers library exited: {exc}" if str(exc) else "the Verifiers library exited")


def guarded(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, with the library's ``SystemExit``/``KeyboardInterrupt`` as :func:`library_exit`."""
    try:
        return fn(*args)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise library_exit(exc) from None


async def guarded_async(coro: Any) -> Any:
    """``await coro``, with the library's ``SystemExit``/``KeyboardInterrupt`` as :func:`library_exit`."""
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise library_exit(exc) from None
