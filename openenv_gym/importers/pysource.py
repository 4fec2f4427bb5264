"""Python source read without running it: files of a folder, their syntax trees, their imports.

Shared by the static detectors of every kind (:mod:`openenv_gym.adapters.ors.detect`,
:mod:`openenv_gym.adapters.verifiers.detect`): user code is never imported or executed during
detection, because importing an environment module runs arbitrary top-level code (servers,
downloads, ``sys.exit``), and detection has to be safe on sources nobody has vetted.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["iter_python_files", "parse_file", "Module", "top_level"]

_SKIP_DIRS = {"venv", ".venv", "site-packages", "__pycache__", "node_modules", "build", "dist"}
# Generated or vendored blobs are never environment definitions and would only slow parsing.
_MAX_FILE_BYTES = 4 * 1024 * 1024


def iter_python_files(root: Path) -> Iterator[Path]:
    """Yield the ``*.py`` files under ``root`` in a stable order, skipping hidden and tool dirs."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS)
        for fname in sorted(filenames):
            if fname.endswith(".py") and not fname.startswith("."):
                yield Path(dirpath, fname)


def _parse(path: Path) -> ast.Module | None:
    try:
        if path.stat().st_size > _MAX_FILE_BYTES:
            return None
        # Bytes, not text: ast honours PEP 263 encoding cookies itself.
        return ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, UnicodeDecodeError, OSError, RecursionError, MemoryError):
        return None


def _module_name(rel: str) -> str:
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, looking inside ``if``/``try``/``with`` but not into defs."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.TryStar, ast.With)):
            for sub in ("body", "orelse", "finalbody"):
                yield from _top_level(getattr(node, sub, []))
            for handler in getattr(node, "handlers", []):
                yield from _top_level(handler.body)


@dataclass
class _Module:
    rel: str  # posix path relative to the detection root
    name: str  # dotted module name relative to the root
    package: str  # dotted package the module lives in ("" at the root)
    tree: ast.Module
    aliases: dict[str, str] = field(default_factory=dict)
    stars: list[str] = field(default_factory=list)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    assigns: dict[str, ast.expr] = field(default_factory=dict)

    @classmethod
    def build(cls, rel: str, tree: ast.Module) -> _Module:
        name = _module_name(rel)
        package = name if rel.endswith("/__init__.py") or rel == "__init__.py" else name.rpartition(".")[0]
        mod = cls(rel=rel, name=name, package=package, tree=tree)
        top = list(_top_level(tree.body))
        top_ids = {id(n) for n in top}
        # Function-local imports first so module-level bindings win on a name clash.
        imports = (ast.Import, ast.ImportFrom)
        nested = [n for n in ast.walk(tree) if isinstance(n, imports) and id(n) not in top_ids]
        for imp in nested + [n for n in top if isinstance(n, imports)]:
            mod._bind_import(imp)
        for node in top:
            if isinstance(node, ast.ClassDef):
                mod.classes[node.name] = node
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                if isinstance(node.targets[0], ast.Name):
                    mod.assigns[node.targets[0].id] = node.value
        return mod

    def _bind_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    self.aliases[a.asname] = a.name
                else:  # `import a.b.c` binds `a`
                    head = a.name.split(".")[0]
                    self.aliases[head] = head
            return
        if node.level:
            parts = self.package.split(".") if self.package else []
            if node.level - 1 > len(parts):
                return  # climbs above the detection root: nothing we can see
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        for a in node.names:
            if a.name == "*":
                self.stars.append(base)
            else:
                self.aliases[a.asname or a.name] = f"{base}.{a.name}" if base else a.name


parse_file = _parse
Module = _Module
top_level = _top_level
