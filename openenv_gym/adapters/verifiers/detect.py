"""Where a Verifiers source's code is, static detection of its generation, and discovery.

:func:`resolve_source` is the one place that turns a source path into the module to import and
the directory to import it from; the importer (:func:`detect_verifiers`) and both adapters
(:mod:`openenv_gym.adapters.verifiers.v0`, :mod:`openenv_gym.adapters.verifiers.v1`) use it.

Verifiers has two incompatible generations (docs/backends.md, "Verifiers"), told apart here from
the syntax tree alone (nothing is imported or run):

* **v0** (legacy, ``verifiers<0.4``): a module or package with a top-level
  ``def load_environment(...)`` that imports ``verifiers`` (not ``verifiers.v1``);
* **v1** (``verifiers.v1``, 0.2-0.4): a package whose ``__init__.py`` exports, in ``__all__``,
  a class deriving from ``verifiers.v1.Taskset`` (the loader's hard requirement);
* the pre-0.2 "early v1" shape (module-level ``load_taskset``/``load_environment(config)`` on
  ``verifiers.v1``) is recognised only to say it is not supported.

Discovery: installed distributions that depend on ``verifiers`` are environments (that is how
``prime env install`` and ``vf-install`` ship them). Finding them means reading every
distribution's metadata, so the result is cached in a file keyed by the *set* of installed
distributions (the names of the ``*.dist-info`` entries on ``sys.path``, which carry versions):
``import openenv_gym`` then costs one directory listing per path entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib import metadata

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path

import msgspec

from openenv_gym.errors import AmbiguousSource, DetectionError, SourceNotFound
from openenv_gym.importers import Detected
from openenv_gym.importers.discovery import cache_dir, cached_scan, module_locations
from openenv_gym.importers.pysource import (
    Module,
    iter_python_files,
    parse_file,
    top_level,
)

__all__ = [
    "SourceModule", "VerifiersSource", "cache_path", "detect_verifiers", "discover_installed",
    "looks_like_verifiers", "resolve_source",
]

_V1 = "verifiers.v1"
_REQ = re.compile(r"^\s*verifiers\b(?![-_.a-zA-Z0-9])", re.IGNORECASE)


class VerifiersSource(msgspec.Struct, omit_defaults=True):
    """One Verifiers environment found statically.

    ``module`` is the importable name; ``root`` the directory to put on ``sys.path`` for it;
    ``entry`` the ``load_environment`` function (v0) or the Taskset class (v1).
    """

    generation: str
    module: str
    root: str
    entry: str
    path: str
    env: str = ""
    """v1: the ``verifiers.v1.Env`` subclass the package exports, if any (it plays each episode)."""
    seats: list[str] = []
    """v1: that env's seats when it has more than one (a multi-agent env, played as a game by
    :mod:`openenv_gym.multiagent`)."""


def _imports_verifiers(mod: Module) -> tuple[bool, bool]:
    """(imports legacy verifiers, imports verifiers.v1)."""
    targets = set(mod.aliases.values())
    v1 = any(t == _V1 or t.startswith(_V1 + ".") for t in targets)
    legacy = any((t == "verifiers" or t.startswith("verifiers.")) and not (t == _V1 or t.startswith(_V1 + "."))
                 for t in targets)
    return legacy, v1


def _qual(mod: Module, node: ast.expr) -> str | None:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Name):
        return mod.aliases.get(node.id, f"{mod.name}.{node.id}" if node.id in mod.classes else None)
    if isinstance(node, ast.Attribute):
        base = _qual(mod, node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _module_of(path: Path, root: Path) -> Module | None:
    tree = parse_file(path)
    if tree is None:
        return None
    return Module.build(path.relative_to(root).as_posix(), tree)


def _v0_entry(mod: Module) -> bool:
    legacy, v1 = _imports_verifiers(mod)
    defs = {n.name: n for n in top_level(mod.tree.body) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if "load_environment" not in defs:
        return False
    if legacy and not v1:
        return True
    if v1 and ("load_taskset" in defs or "load_harness" in defs):
        raise DetectionError(
            f"{mod.rel} is written for the early verifiers.v1 API (verifiers 0.1.x: module-level "
            "load_taskset/load_environment(config)), which openenv_gym does not support; port it to a "
            "v1 Taskset package (verifiers >= 0.2) or to a legacy load_environment module"
        )
    return False


def _all_names(mod: Module) -> list[str]:
    value = mod.assigns.get("__all__")
    if isinstance(value, (ast.List, ast.Tuple)):
        return [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _resolve_class(pkg: Path, mod: Module, name: str, depth: int = 0) -> tuple[Module, ast.ClassDef] | None:
    """The class ``name`` (as seen from ``mod``) and the module defining it, when it is the
    package's own (defined there, or re-exported with ``from .sub import Name``)."""
    if depth > 6:
        return None
    node = mod.classes.get(name)
    if node is not None:
        return mod, node
    target = mod.aliases.get(name)
    if target is None:
        return None
    modpart, _, cls = target.rpartition(".")
    sub = modpart[len(pkg.name) + 1:] if modpart.startswith(pkg.name + ".") else modpart.split(".")[-1]
    for cand in (pkg / f"{sub.replace('.', '/')}.py", pkg / sub.replace(".", "/") / "__init__.py"):
        if cand.is_file():
            other = _module_of(cand, pkg.parent)
            return _resolve_class(pkg, other, cls, depth + 1) if other is not None else None
    return None


def _local_name(node: ast.expr) -> str | None:
    """The name a base-class expression uses in its module (``Base``, ``Base[...]``)."""
    if isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _local_bases(pkg: Path, mod: Module, node: ast.ClassDef, depth: int) -> list[tuple[Module, ast.ClassDef]]:
    """The package's own classes that ``node`` derives from directly."""
    found = []
    for base in node.bases:
        name = _local_name(base)
        hit = _resolve_class(pkg, mod, name, depth + 1) if name else None
        if hit is not None and hit[1] is not node:
            found.append(hit)
    return found


def _derives(pkg: Path, mod: Module, node: ast.ClassDef, names: frozenset[str], depth: int = 0) -> bool:
    """Whether ``node`` derives from one of the ``verifiers.v1`` classes ``names`` (directly or
    through the package's own classes)."""
    if depth > 6:
        return False
    if any(_qual(mod, b) in names for b in node.bases):
        return True
    return any(_derives(pkg, m, n, names, depth + 1) for m, n in _local_bases(pkg, mod, node, depth))


_TASKSET = frozenset({f"{_V1}.Taskset", f"{_V1}.taskset.Taskset"})
_ENV = frozenset({f"{_V1}.Env", f"{_V1}.env.Env"})
_SINGLE_AGENT_ENV = frozenset({f"{_V1}.SingleAgentEnv", f"{_V1}.envs.SingleAgentEnv",
                               f"{_V1}.envs.single_agent.SingleAgentEnv"})
_AGENT_CONFIG = frozenset({f"{_V1}.AgentConfig", f"{_V1}.configs.agent.AgentConfig", f"{_V1}.agent.AgentConfig"})
_ENV_CONFIG = frozenset({f"{_V1}.EnvConfig", f"{_V1}.configs.env.EnvConfig"})


def _is_taskset(pkg: Path, mod: Module, name: str) -> bool:
    """Whether ``name`` (as seen from ``mod``) is a class deriving from ``verifiers.v1.Taskset``."""
    hit = _resolve_class(pkg, mod, name)
    return hit is not None and _derives(pkg, hit[0], hit[1], _TASKSET)


def _config_seats(pkg: Path, mod: Module, node: ast.ClassDef, depth: int = 0) -> list[str] | None:
    """The ``AgentConfig`` fields of an env config class (its own and its package bases'), or
    ``None`` when they cannot be told statically."""
    if depth > 6:
        return None
    seats = [t.target.id for t in node.body
             if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)
             and _qual(mod, t.annotation) in _AGENT_CONFIG]
    for base in node.bases:
        if _qual(mod, base) in _ENV_CONFIG:
            continue
        name = _local_name(base)
        hit = _resolve_class(pkg, mod, name, depth + 1) if name else None
        inherited = _config_seats(pkg, hit[0], hit[1], depth + 1) if hit is not None else None
        if inherited is None:
            return None
        seats = inherited + [s for s in seats if s not in inherited]
    return seats


def env_seats(pkg: Path, mod: Module, node: ast.ClassDef, depth: int = 0) -> list[str] | None:
    """The agent seats of a ``verifiers.v1.Env`` subclass, found statically (``None``: unknown).

    A ``SingleAgentEnv`` subclass has the one seat ``agent``; ``vf.Env[Config]`` has the
    ``AgentConfig`` fields of ``Config`` (how the library names an env's agents).
    """
    if depth > 6:
        return None
    if _derives(pkg, mod, node, _SINGLE_AGENT_ENV):
        return ["agent"]
    for base in node.bases:
        if _qual(mod, base) in _ENV and isinstance(base, ast.Subscript):
            name = _local_name(base.slice)
            hit = _resolve_class(pkg, mod, name) if name else None
            return _config_seats(pkg, *hit) if hit is not None else None
    for other_mod, other in _local_bases(pkg, mod, node, depth):
        seats = env_seats(pkg, other_mod, other, depth + 1)
        if seats is not None:
            return seats
    return None


MULTI_AGENT_HINT = (
    "Gymnasium's Env has one agent: play its seats with openenv_gym.multiagent.aec_env(ID) or "
    "parallel_env(ID) (PettingZoo's API), or one seat as a Gymnasium env with "
    "gym.make(ID, single_player=SEAT, opponents=...) (openenv_gym.multiagent.SinglePlayer)"
)
"""What to say when a multi-agent Verifiers env is made as a Gymnasium env."""


def _detect_package(pkg: Path) -> VerifiersSource | None:
    init = pkg / "__init__.py"
    mod = _module_of(init, pkg.parent) if init.is_file() else None
    if mod is None:
        return None
    exported = _all_names(mod)
    for name in exported:
        if _is_taskset(pkg, mod, name):
            env, several = "", []
            for other in exported:
                hit = _resolve_class(pkg, mod, other)
                if hit is None or not _derives(pkg, hit[0], hit[1], _ENV | _SINGLE_AGENT_ENV):
                    continue
                env = other
                seats = env_seats(pkg, *hit)
                several = seats if seats is not None and len(seats) > 1 else []
            return VerifiersSource("v1", pkg.name, str(pkg.parent), name, str(pkg), env, several)
    if _v0_entry(mod):
        return VerifiersSource("v0", pkg.name, str(pkg.parent), "load_environment", str(pkg))
    return None


def _detect_file(path: Path) -> VerifiersSource | None:
    mod = _module_of(path, path.parent)
    if mod is not None and _v0_entry(mod):
        return VerifiersSource("v0", path.stem, str(path.parent), "load_environment", str(path))
    return None


# -- where a source's code is ----------------------------------------------------------------------

@dataclass(frozen=True)
class SourceModule:
    """The module a Verifiers source path names: import ``module`` with ``root`` on ``sys.path``.

    ``file`` is the file that defines it (a package's ``__init__.py``); ``package`` says whether
    it is a package (whose relative imports need it imported as one).
    """

    root: Path
    module: str
    file: Path
    package: bool


_SKIP_CHILDREN = frozenset({"tests", "test"})


def _children(folder: Path) -> list[SourceModule]:
    """The top-level modules and packages of a project folder (hidden, private and test ones skipped)."""
    found = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith((".", "_")):
            continue
        if child.is_dir() and (child / "__init__.py").is_file() and child.name not in _SKIP_CHILDREN:
            found.append(SourceModule(folder, child.name, child / "__init__.py", True))
        elif child.is_file() and child.suffix == ".py" and child.stem not in _SKIP_CHILDREN:
            found.append(SourceModule(folder, child.stem, child, False))
    return found


def _detect(found: SourceModule) -> VerifiersSource | None:
    return _detect_package(found.file.parent) if found.package else _detect_file(found.file)


def resolve_source(source: str | os.PathLike[str], *, noun: str = "environment") -> SourceModule:
    """The module a Verifiers source path names, and the directory to import it from.

    Nothing is imported. Accepted layouts (paths are resolved; ``-`` in a folder name reads as ``_``):

    * a module file ``my_env.py`` -> ``my_env``, imported from its folder;
    * a package folder ``my_env/`` (or its ``__init__.py``) -> ``my_env``, from the parent folder;
    * a project folder ``my-env/`` holding ``my_env.py`` or ``my_env/__init__.py`` (the layout of
      ``prime env init`` and of upstream ``environments/``) -> ``my_env``, from the project folder;
    * a project folder holding one top-level module or package under another name, or several of
      which exactly one is, statically, a Verifiers environment (hidden, ``_private``, ``test``
      and ``tests`` entries are skipped).

    Args:
        source: a file or folder path.
        noun: what the caller calls the environment in its messages (``"taskset"`` for v1).

    Raises:
        SourceNotFound: the path does not exist.
        AmbiguousSource: a project folder holds several environments (the message lists them).
        DetectionError: no module can be told (a :class:`~openenv_gym.errors.ConfigurationError`).
    """
    path = Path(source).expanduser().resolve()
    if not path.exists():
        raise SourceNotFound(f"Verifiers {noun} source {str(source)!r} does not exist")
    if path.is_file():
        if path.name == "__init__.py":
            found = SourceModule(path.parent.parent, path.parent.name, path, True)
        elif path.suffix == ".py":
            found = SourceModule(path.parent, path.stem, path, False)
        else:
            raise DetectionError(f"Verifiers {noun} source {str(source)!r} is not a .py file or a folder")
    elif (path / "__init__.py").is_file():
        found = SourceModule(path.parent, path.name, path / "__init__.py", True)
    else:
        found = _in_project(path, noun)
    if not found.module.isidentifier():
        raise DetectionError(
            f"Verifiers {noun} source {str(source)!r} gives module name {found.module!r}, which is not importable")
    return found


def _in_project(folder: Path, noun: str) -> SourceModule:
    """The environment module of a project folder (not itself a package)."""
    name = folder.name.replace("-", "_")
    if (folder / f"{name}.py").is_file():
        return SourceModule(folder, name, folder / f"{name}.py", False)
    if (folder / name / "__init__.py").is_file():
        return SourceModule(folder, name, folder / name / "__init__.py", True)
    children = _children(folder)
    if len(children) == 1:
        return children[0]
    environments = [c for c in children if _detect(c) is not None]
    if len(environments) == 1:
        return environments[0]
    if len(environments) > 1:
        raise AmbiguousSource(
            f"{folder} holds several Verifiers environments ({', '.join(c.module for c in environments)}); "
            "import one of them by its file or package path")
    listed = ", ".join(c.module for c in children) or "no modules"
    raise DetectionError(
        f"cannot tell the {noun} module in {str(folder)!r}: expected a package (__init__.py), {name}.py or "
        f"{name}/__init__.py, or one Verifiers environment among its modules (found {listed}); "
        "or pass the module's path as source=")


def detect_verifiers(source: str | os.PathLike[str]) -> VerifiersSource:
    """The Verifiers environment in ``source`` (any layout :func:`resolve_source` accepts), found statically."""
    found = resolve_source(source)
    hit = _detect(found)
    folder = Path(source).expanduser().resolve()
    if hit is None and folder.is_dir():
        # A folder whose own module is no environment (a package that re-exports it, a helper
        # module named after the project): one of its top-level modules may be.
        hits = [h for h in map(_detect, _children(folder)) if h is not None]
        if len(hits) > 1:
            names = ", ".join(h.module for h in hits)
            raise AmbiguousSource(f"{folder} holds several Verifiers environments ({names}); "
                                  "import one of them by its file or package path")
        hit = hits[0] if hits else None
    if hit is None:
        where = found.file.parent if found.package else found.file
        raise DetectionError(
            f"no Verifiers environment found in {where}: looked for a module with a top-level "
            "load_environment() that imports verifiers (legacy v0), or a package whose __all__ exports "
            "a verifiers.v1 Taskset subclass (v1)"
        )
    return hit


_IMPORT_HINT = re.compile(r"^\s*(import|from)\s+verifiers\b", re.MULTILINE)


def looks_like_verifiers(path: Path) -> bool:
    """A cheap check: some Python file under ``path`` imports ``verifiers``."""
    files = [path] if path.is_file() else list(iter_python_files(path)) if path.is_dir() else []
    for f in files[:200]:
        try:
            if f.suffix == ".py" and _IMPORT_HINT.search(f.read_text(errors="replace")):
                return True
        except OSError:
            continue
    return False


# -- discovery of installed environment packages -------------------------------------------------

def cache_path() -> Path:
    """Where Verifiers discovery caches its result: ``verifiers-envs.json`` in :func:`cache_dir`."""
    return cache_dir() / "verifiers-envs.json"


def _depends_on_verifiers(dist: metadata.Distribution) -> bool:
    return any(_REQ.match(r) and "extra ==" not in r for r in dist.requires or ())


def _scan(paths: list[str]) -> list[dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    from importlib import metadata  # read only when the installed set changed

    for dist in metadata.distributions(path=paths):
        meta = dist.metadata  # PackageMetadata declares get() only from Python 3.12: the same lookup through `in`
        name = meta["Name"] if "Name" in meta else None
        if not name or name.lower() in found or not _depends_on_verifiers(dist):
            continue
        for where in module_locations(dist, paths).values():
            try:
                hit = detect_verifiers(where)
            except DetectionError:
                continue
            found[name.lower()] = {"name": name, "module": hit.module, "generation": hit.generation,
                                   "version": dist.version}
            break
    return sorted(found.values(), key=lambda e: e["name"].lower())


def discover_installed(paths: list[str] | None = None, *, use_cache: bool = True) -> list[dict[str, str]]:
    """Installed Verifiers environment packages: ``name``, ``module``, ``generation``, ``version``.

    Cached in :func:`cache_path` under a fingerprint of the installed distributions; a change to
    that set (an install, an upgrade, an uninstall) invalidates it.
    """
    return cached_scan(cache_path(), _scan, paths, use_cache=use_cache)


# -- the kind's detector, named by its descriptor -------------------------------------------------

def verifiers_source(source: Path, env_class: str | None) -> Detected:
    """The Verifiers environment (either generation) ``source`` defines."""
    found = detect_verifiers(source)
    if env_class is not None and env_class != found.entry:
        raise DetectionError(f"{source} defines {found.entry}, not {env_class!r}")
    return Detected(kind="verifiers", env_class=found.entry, env_name=found.module,
                    module_file=Path(found.path).name, sdk=found.generation, source=found.path)
