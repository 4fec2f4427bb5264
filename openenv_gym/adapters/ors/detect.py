"""Static detection of ORS environments in a file or folder of Python source.

This module owns the answer to "which ORS environments does this source define, with which
tools, and how would it be served?" -- computed from the syntax tree alone. User code is never
imported or executed here: importing an environment module runs arbitrary top-level code
(servers, downloads, ``sys.exit``), and detection has to be safe on sources nobody has vetted.

The rules follow what the two SDK servers (``ors-sdk`` and ``openreward``) accept at runtime:

* an environment is a class deriving, directly or through local classes (also across the files
  of a folder), from ``ors.Environment`` or ``openreward.environments.Environment``;
  client-side classes of the same name (``ors.client.Environment``, ...) are not environments;
* a tool is a method decorated with the SDK's ``tool``; the server lists it only when the return
  annotation is ``ToolOutput`` and there is at most one parameter besides ``self`` (a pydantic
  model) -- otherwise it is dropped silently, so we mark it ``valid=False`` instead;
* a bare ``import ors`` proves nothing: PyPI's openrouteservice client is also called ``ors``.
  Only names that resolve to ORS server-side symbols count.

Names are resolved through ``import x as y`` / ``from x import y as z`` / relative imports, so
``ore.Environment`` and ``from .base import MyBase`` work. What cannot be resolved statically
(dynamic bases, computed decorators) is ignored rather than guessed.
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from openenv_gym.errors import AmbiguousSource, DetectionError, SourceNotFound
from openenv_gym.importers import Detected
from openenv_gym.importers.pysource import _MAX_FILE_BYTES, _SKIP_DIRS, _Module, _parse, iter_python_files

__all__ = [
    "ToolInfo",
    "EnvClassInfo",
    "ServerCall",
    "ORSDetection",
    "detect_ors",
    "looks_like_ors",
    "iter_python_files",
]

_ENV_BASES = {
    "ors.Environment": "ors",
    "ors.environment.Environment": "ors",
    "openreward.environments.Environment": "openreward",
    "openreward.environments.environment.Environment": "openreward",
}
_TOOLSET_BASES = {
    "ors.Toolset",
    "ors.toolset.Toolset",
    "openreward.environments.Toolset",
    "openreward.environments.toolset.Toolset",
}
_TOOL_DECORATORS = {
    "ors.tool",
    "ors.environment.tool",
    "openreward.environments.tool",
    "openreward.environments.environment.tool",
}
_TERMINAL_DECORATORS = {
    "openreward.environments.terminal",
    "openreward.environments.environment.terminal",
}
_SERVERS = {
    "ors.Server",
    "ors.server.Server",
    "openreward.environments.Server",
    "openreward.environments.server.Server",
}
# Names a `from <root> import *` can bring in that matter to detection.
_STAR_NAMES = _ENV_BASES.keys() | _TOOLSET_BASES | _TOOL_DECORATORS | _TERMINAL_DECORATORS | _SERVERS
# A single tool parameter must be a pydantic model class; these annotations never are.
_NOT_A_MODEL = {
    "dict", "list", "tuple", "set", "frozenset", "str", "bytes", "int", "float", "bool",
    "object", "typing.Any", "typing.Dict", "typing.List", "typing.Mapping", "typing.Optional",
    "typing.Union", "ors.JSONObject", "ors.types.JSONObject", "openreward.environments.JSONObject",
    "openreward.environments.types.JSONObject",
}
_REQUIRED = {
    "ors": (("list_splits",), ("list_tasks",), ("get_prompt",)),
    # openreward serves either prompt surface: get_prompt and get_messages default to each other.
    "openreward": (("list_splits",), ("list_tasks",), ("get_prompt", "get_messages")),
}
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_SDK_DISTS = {"ors-sdk", "openreward"}


class ToolInfo(msgspec.Struct):
    """One ``@tool`` method: whether the server would accept it and list it to the model."""

    name: str
    valid: bool
    listed: bool
    terminal: bool = False


class EnvClassInfo(msgspec.Struct):
    """A concrete environment class (it has at least one tool, own or inherited)."""

    class_name: str
    module_file: str
    sdk: str
    tools: list[ToolInfo]
    missing: list[str]
    env_name: str


class ServerCall(msgspec.Struct):
    """A ``Server([...])`` call and, when statically evident, its ``.run(host, port)``."""

    module_file: str
    classes: list[str]
    host: str | None = None
    port: int | str | None = None


class ORSDetection(msgspec.Struct, kw_only=True):
    """Everything static detection found in one source.

    ``files_scanned`` counts the ``.py`` files looked at; ``skipped`` lists those that could not
    be parsed (syntax errors, undecodable, oversized) -- nothing else is recorded from them.
    """

    kind: str = "ors"
    root: str
    envs: list[EnvClassInfo]
    servers: list[ServerCall]
    requirements: list[str]
    files_scanned: int = 0
    skipped: list[str] = []


@dataclass
class _Class:
    mod: _Module
    node: ast.ClassDef
    bases: list[_Class]
    sdk: str | None  # set for Environment subclasses
    toolset: bool


class _Project:
    """Parsed modules of one detection root plus the class graph between them."""

    def __init__(self, root: Path, eager: bool) -> None:
        self.root = root
        self.eager = eager  # folder mode: every file is preloaded and nothing else is loaded
        self.modules: dict[str, _Module | None] = {}
        self.classes: dict[tuple[str, str], _Class | None] = {}
        self.parsed: list[_Module] = []  # in scan order; two files may share a module name
        self.scanned = 0
        self.skipped: list[str] = []

    def add_file(self, path: Path) -> _Module | None:
        rel = path.relative_to(self.root).as_posix()
        self.scanned += 1
        tree = _parse(path)
        if tree is None:
            self.skipped.append(rel)
            return None
        mod = _Module.build(rel, tree)
        self.modules.setdefault(mod.name, mod)
        self.parsed.append(mod)
        return mod

    def load(self, name: str) -> _Module | None:
        if name in self.modules or self.eager or not name:
            return self.modules.get(name)
        self.modules[name] = None  # also guards against re-entrant loads
        rel = name.replace(".", "/")
        if any(p.startswith(".") or p in _SKIP_DIRS for p in rel.split("/")[:-1]):
            return None
        for cand in (self.root / f"{rel}.py", self.root / rel / "__init__.py"):
            if cand.is_file():
                return self.add_file(cand)
        return None

    # -- names -------------------------------------------------------------------------------

    def qualname(self, mod: _Module, node: ast.expr | None) -> str | None:
        """The dotted name an expression refers to, or None when it is not a plain reference."""
        if isinstance(node, ast.Name):
            if node.id in mod.classes:
                return f"{mod.name}.{node.id}" if mod.name else node.id
            if node.id in mod.aliases:
                return mod.aliases[node.id]
            for star in mod.stars:
                if f"{star}.{node.id}" in _STAR_NAMES:
                    return f"{star}.{node.id}"
            return None
        if isinstance(node, ast.Attribute):
            base = self.qualname(mod, node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # string annotation
            try:
                expr = ast.parse(node.value.strip(), mode="eval").body
            except SyntaxError:
                return None
            return self.qualname(mod, expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
        return None

    def local_class(self, qual: str, origin: _Module, depth: int = 0) -> _Class | None:
        """Resolve a dotted name to a class defined under the root, following re-exports."""
        modpart, _, name = qual.rpartition(".")
        if modpart == origin.name and name in origin.classes:
            return self.cls(origin, name)  # also covers classes of a root __init__.py
        if not modpart or depth > 8:
            return None
        # `from base import X` in pkg/env.py works when pkg/ is the script dir: try both.
        for cand in dict.fromkeys([modpart, f"{origin.package}.{modpart}" if origin.package else modpart]):
            mod = self.load(cand)
            if mod is None:
                continue
            if name in mod.classes:
                return self.cls(mod, name)
            if name in mod.aliases:
                return self.local_class(mod.aliases[name], mod, depth + 1)
        return None

    def cls(self, mod: _Module, name: str) -> _Class | None:
        key = (mod.rel, name)
        if key in self.classes:
            return self.classes[key]
        self.classes[key] = None  # cycle guard: a class that (indirectly) bases on itself
        node = mod.classes[name]
        bases: list[_Class] = []
        sdk: str | None = None
        toolset = False
        for b in node.bases:
            expr = b.value if isinstance(b, ast.Subscript) else b
            if isinstance(expr, ast.Name) and expr.id == name:
                # `class Env(Env)`: bases are evaluated before the class name is rebound.
                q = mod.aliases.get(name)
            else:
                q = self.qualname(mod, expr)
            if q is None:
                continue
            if q in _ENV_BASES:
                sdk = sdk or _ENV_BASES[q]
            elif q in _TOOLSET_BASES:
                toolset = True
            else:
                base = self.local_class(q, mod)
                if base is not None:
                    bases.append(base)
                    sdk = sdk or base.sdk
                    toolset = toolset or base.toolset
        info = _Class(mod=mod, node=node, bases=bases, sdk=sdk, toolset=toolset)
        self.classes[key] = info
        return info


def _mro(c: _Class) -> list[_Class]:
    # Depth-first, first occurrence wins: matches C3 for the shapes environments use.
    out: list[_Class] = []
    seen: set[int] = set()

    def visit(k: _Class) -> None:
        if id(k) in seen:
            return
        seen.add(id(k))
        out.append(k)
        for b in k.bases:
            visit(b)

    visit(c)
    return out


def _members(node: ast.ClassDef) -> Iterator[tuple[str, ast.stmt]]:
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield stmt.name, stmt
        elif isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    yield t.id, stmt
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            yield stmt.target.id, stmt


def _annotation(proj: _Project, mod: _Module, ann: ast.expr | None) -> str | None:
    """Dotted name of a plain (possibly quoted) annotation; a bare unresolved name as is.

    None for anything else -- ``dict[str, X]``, ``X | None``, ``Optional[X]`` are not classes,
    and the SDK's ``issubclass``/``==`` checks reject them.
    """
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        try:
            ann = ast.parse(ann.value.strip(), mode="eval").body
        except SyntaxError:
            return None
    if isinstance(ann, ast.Attribute):
        return proj.qualname(mod, ann) or ast.unparse(ann)
    if isinstance(ann, ast.Name):
        return proj.qualname(mod, ann) or ann.id
    return None


def _is_model_annotation(proj: _Project, mod: _Module, ann: ast.expr | None) -> bool:
    q = _annotation(proj, mod, ann)
    return q is not None and q not in _NOT_A_MODEL


def _tool_info(proj: _Project, mod: _Module, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ToolInfo | None:
    tool_at: int | None = None
    listed, terminal = True, False
    names: list[str | None] = []
    for i, dec in enumerate(fn.decorator_list):
        target = dec.func if isinstance(dec, ast.Call) else dec
        q = proj.qualname(mod, target)
        names.append(q or (target.id if isinstance(target, ast.Name) else None))
        if q in _TOOL_DECORATORS and tool_at is None:
            tool_at = i
            if isinstance(dec, ast.Call):
                for kw in dec.keywords:
                    if kw.arg == "shared" and isinstance(kw.value, ast.Constant) and kw.value.value is False:
                        listed = False
        elif q in _TERMINAL_DECORATORS:
            terminal = True
    if tool_at is None:
        return None
    a = fn.args
    params = [p for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg != "self"]
    params += [p for p in (a.vararg, a.kwarg) if p is not None]
    valid = True
    # Decorators apply bottom-up. A static/classmethod applied before @tool hides the marker
    # from the server; one applied after is transparent (a classmethod's `cls` is then bound).
    above, below = names[:tool_at], names[tool_at + 1 :]
    if {"staticmethod", "classmethod"} & set(filter(None, below)):
        valid = False
    if "classmethod" in above and params and params[0] in a.posonlyargs + a.args:
        params = params[1:]
    ret = _annotation(proj, mod, fn.returns)
    if ret is None or ret.rpartition(".")[2] != "ToolOutput":
        valid = False
    if len(params) > 1 or (len(params) == 1 and not _is_model_annotation(proj, mod, params[0].annotation)):
        valid = False
    return ToolInfo(name=fn.name, valid=valid, listed=listed, terminal=terminal)


def _class_tools(proj: _Project, c: _Class, taken: set[str]) -> list[ToolInfo]:
    tools: list[ToolInfo] = []
    for k in _mro(c):
        for name, stmt in _members(k.node):
            if name in taken:
                continue  # overridden further down the hierarchy
            taken.add(name)
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                info = _tool_info(proj, k.mod, stmt)
                if info is not None:
                    tools.append(info)
    return tools


def _toolset_classes(proj: _Project, c: _Class) -> list[_Class]:
    for k in _mro(c):
        for name, stmt in _members(k.node):
            if name != "toolsets" or not isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                continue
            value = stmt.value
            out: list[_Class] = []
            if isinstance(value, (ast.List, ast.Tuple)):
                for elt in value.elts:
                    q = proj.qualname(k.mod, elt)
                    ts = proj.local_class(q, k.mod) if q else None
                    if ts is not None and ts.toolset:
                        out.append(ts)
            return out
    return []


def _literal_name(fn: ast.stmt) -> str | None:
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # docstring
    if len(body) == 1 and isinstance(body[0], ast.Return):
        v = body[0].value
        if isinstance(v, ast.Constant) and isinstance(v.value, str):
            return v.value
    return None


def _env_info(proj: _Project, c: _Class) -> tuple[EnvClassInfo, bool]:
    """The class record, and whether it is abstract (declares @abstractmethod or lacks methods)."""
    assert c.sdk is not None
    names: dict[str, ast.stmt] = {}
    for k in _mro(c):
        for name, stmt in _members(k.node):
            names.setdefault(name, stmt)
    taken: set[str] = set()
    tools = _class_tools(proj, c, taken)
    for ts in _toolset_classes(proj, c):
        tools += _class_tools(proj, ts, set(taken))
    missing = ["/".join(alts) for alts in _REQUIRED[c.sdk] if not any(a in names for a in alts)]
    env_name = (_literal_name(names["name"]) if "name" in names else None) or c.node.name
    decorators = [
        proj.qualname(c.mod, d) or getattr(d, "id", "")
        for s in c.node.body
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
        for d in s.decorator_list
    ]
    abstract = bool(missing) or any(d.endswith("abstractmethod") for d in decorators)
    info = EnvClassInfo(
        class_name=c.node.name,
        module_file=c.mod.rel,
        sdk=c.sdk,
        tools=tools,
        missing=missing,
        # The servers key environments by `cls.name().lower()` and look them up lowercased.
        env_name=env_name.lower(),
    )
    return info, abstract


def _literal(node: ast.expr | None, want: type | tuple[type, ...]) -> object:
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, want) and not isinstance(node.value, bool):
        return node.value
    return "<expr>"


def _servers(proj: _Project, mod: _Module) -> tuple[list[ServerCall], list[_Class]]:
    calls: dict[int, ServerCall] = {}
    served: list[_Class] = []
    bound: dict[str, ServerCall] = {}  # variable name -> call it holds, for `srv.run(...)`
    for node in ast.walk(mod.tree):
        if not (isinstance(node, ast.Call) and proj.qualname(mod, node.func) in _SERVERS):
            continue
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        arg = node.args[0] if node.args else kwargs.get("environments")
        if isinstance(arg, ast.Name) and arg.id in mod.assigns:
            arg = mod.assigns[arg.id]
        names: list[str] = []
        for elt in arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else []:
            if isinstance(elt, (ast.Name, ast.Attribute)):
                names.append(elt.id if isinstance(elt, ast.Name) else elt.attr)
                q = proj.qualname(mod, elt)
                c = proj.local_class(q, mod) if q else None
                if c is not None:
                    served.append(c)
        calls[id(node)] = ServerCall(module_file=mod.rel, classes=names)
    if not calls:
        return [], served
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Assign) and id(node.value) in calls:
            for t in node.targets:
                if isinstance(t, ast.Name):
                    bound[t.id] = calls[id(node.value)]
    for node in ast.walk(mod.tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) or node.func.attr != "run":
            continue
        owner = node.func.value
        call = calls.get(id(owner)) or (bound.get(owner.id) if isinstance(owner, ast.Name) else None)
        if call is None:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        host = node.args[0] if node.args else kw.get("host")
        port = node.args[1] if len(node.args) > 1 else kw.get("port")
        call.host = _literal(host, str)  # type: ignore[assignment]
        call.port = _literal(port, (int, str))  # type: ignore[assignment]
    return list(calls.values()), served


def _requirements(root: Path) -> list[str]:
    """ORS SDK distributions named in the root's requirements.txt / pyproject.toml."""
    found: set[str] = set()

    def note(spec: str) -> None:
        m = _REQ_NAME.match(spec)
        if m:
            name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
            if name in _SDK_DISTS:
                found.add(name)

    for req in sorted(root.glob("requirements*.txt")):
        try:
            for line in req.read_text(errors="replace").splitlines():
                note(line.split("#", 1)[0])
        except OSError:
            pass
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text(errors="replace"))
    except (OSError, tomllib.TOMLDecodeError):
        data = {}
    project = data.get("project", {}) if isinstance(data.get("project"), dict) else {}
    specs: list[object] = list(project.get("dependencies", []) or [])
    for extra in (project.get("optional-dependencies") or {}).values():
        specs += list(extra or [])
    poetry = data.get("tool", {}).get("poetry", {}) if isinstance(data.get("tool"), dict) else {}
    specs += list((poetry.get("dependencies") or {}).keys()) if isinstance(poetry, dict) else []
    for spec in specs:
        if isinstance(spec, str):
            note(spec)
    return sorted(found)


def detect_ors(source: str | os.PathLike[str]) -> ORSDetection:
    """Statically find the ORS environments in a ``.py`` file or a folder.

    For a folder every ``*.py`` below it is parsed (hidden and virtualenv/build directories are
    skipped). For a file, its own classes are reported plus the classes its ``Server([...])`` call
    serves from sibling modules; siblings are parsed only as far as imports lead. Paths in the
    result are relative to the root: the folder, or the file's directory.
    """
    path = Path(source).expanduser().resolve()
    if not path.exists():
        raise SourceNotFound(f"ORS source {path} does not exist")
    if path.is_dir():
        proj = _Project(path, eager=True)
        for f in iter_python_files(path):
            proj.add_file(f)
        report = list(proj.parsed)
    else:
        proj = _Project(path.parent, eager=False)
        mod = proj.add_file(path)
        report = [mod] if mod is not None else []

    servers: list[ServerCall] = []
    candidates: list[_Class] = []
    for mod in report:
        calls, served = _servers(proj, mod)
        servers += calls
        candidates += [c for name in mod.classes if (c := proj.cls(mod, name)) is not None]
        candidates += served
    # Resolve every loaded class so "is it subclassed?" sees the whole graph we know of.
    for mod in list(proj.parsed):
        for name in mod.classes:
            proj.cls(mod, name)
    subclassed = {id(b) for c in proj.classes.values() if c is not None for b in c.bases}

    envs: list[EnvClassInfo] = []
    seen: set[int] = set()
    for c in candidates:
        if id(c) in seen or c.sdk is None or c.toolset:
            continue
        seen.add(id(c))
        info, abstract = _env_info(proj, c)
        # A base with no tools, or an incomplete one that others complete, is not servable.
        if info.tools and not (abstract and id(c) in subclassed):
            envs.append(info)
    envs.sort(key=lambda e: (e.module_file, e.class_name))
    return ORSDetection(
        root=str(proj.root),
        envs=envs,
        servers=servers,
        requirements=_requirements(proj.root),
        files_scanned=proj.scanned,
        skipped=proj.skipped,
    )


_IMPORT_HINT = re.compile(r"^\s*(?:from|import)\s+(?:ors|openreward)\b", re.M)


def looks_like_ors(source: str | os.PathLike[str]) -> bool:
    """Cheap check for the kind dispatcher: does any file subclass an ORS ``Environment``?

    A text prefilter picks files that import ``ors``/``openreward``; only those are parsed, each
    on its own (a subclass of a local base implies the base's file matches). A single file is
    detected fully. The openrouteservice
    ``import ors`` decoy passes the prefilter but not the base-class test.
    """
    path = Path(source)
    if path.is_file():
        # One file is cheap to detect fully, and its env may live in a module its Server serves.
        try:
            hinted = _IMPORT_HINT.search(path.read_text(errors="replace")) is not None
        except OSError:
            return False
        return hinted and bool(detect_ors(path).envs)
    if not path.is_dir():
        return False
    root = path
    for f in iter_python_files(path):
        try:
            if f.stat().st_size > _MAX_FILE_BYTES or not _IMPORT_HINT.search(f.read_text(errors="replace")):
                continue
        except OSError:
            continue
        tree = _parse(f)
        if tree is None:
            continue
        proj = _Project(root, eager=True)
        mod = _Module.build(f.relative_to(root).as_posix(), tree)
        proj.modules[mod.name] = mod
        if any((c := proj.cls(mod, n)) is not None and c.sdk for n in mod.classes):
            return True
    return False


# -- the kind's detector, named by its descriptor -------------------------------------------------

def _tool_problem(t: ToolInfo) -> str:
    if not t.valid:
        return f"{t.name} (dropped: needs `-> ToolOutput` and at most one parameter, a pydantic model)"
    if not t.listed:
        return f"{t.name} (not listed: shared=False)"
    return t.name


def _servable(env: EnvClassInfo) -> bool:
    if any(t.valid and t.listed and not t.terminal for t in env.tools):
        return True
    # openreward accepts an environment whose only tool is its @terminal one.
    return env.sdk == "openreward" and any(t.valid and t.terminal for t in env.tools)


def _pick(envs: list[EnvClassInfo], env_class: str | None, where: Path) -> EnvClassInfo:
    labels = [f"{e.module_file}:{e.class_name}" for e in envs]
    if env_class is None:
        if len(envs) > 1:
            raise AmbiguousSource(
                f"{where} defines {len(envs)} environments: {', '.join(labels)}; "
                "pass --env-class NAME (or env_class=) to pick one"
            )
        return envs[0]
    # "pkg/env.py:Cls" picks among same-named classes of different files.
    chosen = [e for e, label in zip(envs, labels) if env_class in (e.class_name, label)]
    if not chosen:
        raise DetectionError(f"no environment class {env_class!r} in {where}; found: {', '.join(labels)}")
    if len(chosen) > 1:
        raise AmbiguousSource(
            f"several environment classes are named {env_class!r} in {where}: "
            f"{', '.join(f'{e.module_file}:{e.class_name}' for e in chosen)}; pass --env-class FILE:NAME"
        )
    return chosen[0]


def ors_source(source: Path, env_class: str | None) -> Detected:
    """The ORS environment class ``source`` serves (DetectionError: none, or the server would refuse it)."""
    found = detect_ors(source)
    if not found.envs:
        skipped = ""
        if found.skipped:
            skipped = f" ({len(found.skipped)} could not be parsed: {', '.join(found.skipped)})"
        raise DetectionError(
            f"no ORS environment found in {source}: looked for classes deriving from ors.Environment or "
            "openreward.environments.Environment (directly or through local base classes) with at least "
            f"one @tool method, in {found.files_scanned} .py file(s){skipped}"
        )
    env = _pick(found.envs, env_class, source)
    label = f"{env.module_file}:{env.class_name}"
    server = "ors-sdk" if env.sdk == "ors" else "openreward"
    if env.missing:
        raise DetectionError(
            f"{label} does not define {', '.join(env.missing)} (on the class or its local base classes); "
            f"the {server} server would refuse it"
        )
    if not _servable(env):
        problems = ", ".join(_tool_problem(t) for t in env.tools)
        raise DetectionError(
            f"{label} has no tool the {server} server would list: {problems}; "
            "the server refuses an environment without tools"
        )
    return Detected(
        kind="ors",
        env_class=env.class_name,
        env_name=env.env_name,
        module_file=env.module_file,
        sdk=env.sdk,
        source=str(source),
    )
