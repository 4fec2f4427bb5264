"""The package's parts import only from floors below their own (docs/architecture.md, "Layers").

Every import of every module is read with ``ast`` (those inside functions too, which a runtime
check would miss) and mapped to the part it names: a top-level module, or a subpackage taken whole.
The floors come from the ``layers`` block of docs/architecture.md, so the page and the code
cannot drift apart.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "openenv_gym"


def floors() -> dict[str, int]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.DOTALL)
    assert block, "docs/architecture.md has no ```layers block"
    table: dict[str, int] = {}
    for line in block.group(1).splitlines():
        if line.strip():
            floor, *parts = line.split()
            for part in parts:
                assert part not in table, f"{part} is on two floors"
                table[part] = int(floor)
    return table


def part_of(module: str) -> str:
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else "__init__"


def imports() -> list[tuple[str, str, str]]:
    """Every ``(importing part, imported part, file)`` between two different parts."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts)
        package = module[: -len(".__init__")] if module.endswith(".__init__") else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    names = [".".join(base + ([node.module] if node.module else []))]
                else:
                    names = [node.module or ""]
                if names == ["openenv_gym"]:  # from openenv_gym import x: x is a part
                    names = [f"openenv_gym.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                if name == "openenv_gym" or name.startswith("openenv_gym."):
                    a, b = part_of(module), part_of(name)
                    if a != b:
                        edges.append((a, b, str(path.relative_to(ROOT))))
    return edges


def test_every_part_is_on_a_floor():
    table = floors()
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    assert parts - set(table) == set(), "parts missing from the layers table of docs/architecture.md"
    assert set(table) - parts == set(), "the layers table names parts that do not exist"


def test_every_import_goes_down():
    table = floors()
    wrong = sorted({f"{file}: {a} (floor {table[a]}) imports {b} (floor {table[b]})"
                    for a, b, file in imports() if table[b] >= table[a]})
    assert wrong == []


def test_a_single_env_does_not_load_the_vector_layer_or_the_hosts():
    code = ("import sys, openenv_gym.env; "
            "print(sorted(m for m in sys.modules if m.startswith(('openenv_gym.vector', 'openenv_gym.hosts', "
            "'openenv_gym.shard', 'ray'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
