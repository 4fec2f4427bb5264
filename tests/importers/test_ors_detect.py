"""Static ORS detection (openenv_gym.adapters.ors.detect) and the import dispatcher's errors.

Every source is a real file written into tmp_path; detection must never run it.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from openenv_gym.adapters.ors.detect import ORSDetection, ServerCall, detect_ors, looks_like_ors
from openenv_gym.errors import AmbiguousSource, DetectionError, InvalidName, SourceNotFound
from openenv_gym.importers import Detected, detect
from openenv_gym.importers.catalog import load_catalog
from openenv_gym.importing import import_source

# A complete environment body (required methods) to append to test classes.
REQUIRED = """
    @classmethod
    def list_splits(cls):
        return ["train"]

    @classmethod
    def list_tasks(cls, split):
        return [{"q": 1}]

    def get_prompt(self):
        return []
"""


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).replace("    #REQUIRED", textwrap.indent(textwrap.dedent(REQUIRED), "    ")))
    return root


def envs_of(d: ORSDetection) -> dict[str, dict[str, tuple[bool, bool, bool]]]:
    """{ClassName: {tool: (valid, listed, terminal)}}"""
    return {e.class_name: {t.name: (t.valid, t.listed, t.terminal) for t in e.tools} for e in d.envs}


def test_import_aliases_resolve(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "a.py": """
                import ors as o
                from ors import Environment as E, tool as t, ToolOutput
                from openreward.environments.environment import Environment as OREnv, tool as ortool
                from openreward.environments import ToolOutput as TO

                class ViaModule(o.Environment):
                    #REQUIRED
                    @o.tool
                    def go(self) -> o.ToolOutput: ...

                class ViaName(E):
                    #REQUIRED
                    @t
                    def go(self) -> ToolOutput: ...

                class ViaSubmodule(OREnv):
                    #REQUIRED
                    @ortool()
                    async def go(self) -> TO: ...
            """
        },
    )
    d = detect_ors(tmp_path)
    assert envs_of(d) == {
        "ViaModule": {"go": (True, True, False)},
        "ViaName": {"go": (True, True, False)},
        "ViaSubmodule": {"go": (True, True, False)},
    }
    assert {e.class_name: e.sdk for e in d.envs} == {"ViaModule": "ors", "ViaName": "ors", "ViaSubmodule": "openreward"}
    assert all(e.missing == [] and e.module_file == "a.py" for e in d.envs)
    assert d.files_scanned == 1 and d.root == str(tmp_path.resolve())


def test_module_alias_concurrent_and_terminal(tmp_path: Path) -> None:
    src = write(
        tmp_path,
        {
            "env.py": """
                import openreward.environments as ore
                from openreward.environments import terminal
                from pydantic import BaseModel

                class Answer(BaseModel):
                    answer: str

                class Math(ore.Environment):
                    @classmethod
                    def list_splits(cls):
                        return ["train"]

                    @classmethod
                    def list_tasks(cls, split):
                        return []

                    def get_messages(self):
                        return []

                    @ore.tool(concurrent=True)
                    async def hint(self) -> ore.ToolOutput: ...

                    @terminal
                    @ore.tool
                    def final(self, params: Answer) -> "ore.ToolOutput": ...
            """
        },
    )
    d = detect_ors(src / "env.py")
    assert envs_of(d) == {"Math": {"hint": (True, True, False), "final": (True, True, True)}}
    # openreward accepts get_messages in place of get_prompt
    assert d.envs[0].missing == [] and d.envs[0].sdk == "openreward" and d.envs[0].env_name == "math"


def test_subclass_of_local_subclass_same_file(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "env.py": """
                from ors import Environment, tool, ToolOutput

                class Base(Environment):
                    @classmethod
                    def list_splits(cls):
                        return ["train"]

                class Mid(Base):
                    pass

                class Leaf(Mid):
                    @classmethod
                    def list_tasks(cls, split):
                        return []

                    def get_prompt(self):
                        return []

                    @tool
                    def submit(self) -> ToolOutput: ...
            """
        },
    )
    d = detect_ors(tmp_path)
    # Base and Mid have no tools: abstract intermediates, not reported.
    assert [e.class_name for e in d.envs] == ["Leaf"]
    assert d.envs[0].missing == [] and d.envs[0].sdk == "ors"


def test_inherited_tools_and_abstract_base_with_tools(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "env.py": """
                from ors import Environment, tool, ToolOutput

                class ToolBase(Environment):  # has a tool but no list_tasks: completed by Leaf
                    @tool
                    def submit(self) -> ToolOutput: ...

                    @tool
                    def hidden(self) -> ToolOutput: ...

                class Leaf(ToolBase):
                    #REQUIRED
                    def hidden(self):  # overriding without @tool removes the tool
                        return None
            """
        },
    )
    d = detect_ors(tmp_path)
    assert envs_of(d) == {"Leaf": {"submit": (True, True, False)}}


def test_subclass_across_files_relative_and_absolute(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/base.py": """
                from openreward.environments import Environment, tool, ToolOutput

                class MyBase(Environment):
                    #REQUIRED
            """,
            "pkg/env.py": """
                from .base import MyBase
                from openreward.environments import tool, ToolOutput

                class RelChild(MyBase):
                    @tool
                    def submit(self) -> ToolOutput: ...
            """,
            "flat/base.py": """
                import ors

                class FlatBase(ors.Environment):
                    #REQUIRED
                    @ors.tool
                    def shared_tool(self) -> ors.ToolOutput: ...

                    def helper(self):
                        pass
            """,
            "flat/env.py": """
                from base import FlatBase

                class AbsChild(FlatBase):
                    def helper(self):
                        return 1
            """,
        },
    )
    d = detect_ors(tmp_path)
    got = {e.class_name: (e.module_file, e.sdk, e.missing) for e in d.envs}
    assert got["RelChild"] == ("pkg/env.py", "openreward", [])
    assert got["AbsChild"] == ("flat/env.py", "ors", [])
    # FlatBase is complete and has a tool: a concrete env too, even though it is subclassed.
    assert "FlatBase" in got and "MyBase" not in got
    assert envs_of(d)["AbsChild"] == {"shared_tool": (True, True, False)}


def test_file_mode_follows_server_to_sibling_module(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "env.py": """
                from ors import Environment, tool, ToolOutput

                class Served(Environment):
                    #REQUIRED
                    @tool
                    def submit(self) -> ToolOutput: ...
            """,
            "other.py": """
                from ors import Environment, tool, ToolOutput

                class NotServed(Environment):
                    #REQUIRED
                    @tool
                    def submit(self) -> ToolOutput: ...
            """,
            "server.py": """
                from ors import Server
                from env import Served

                if __name__ == "__main__":
                    Server([Served]).run()
            """,
        },
    )
    d = detect_ors(tmp_path / "server.py")
    assert [(e.class_name, e.module_file) for e in d.envs] == [("Served", "env.py")]
    assert d.servers == [ServerCall(module_file="server.py", classes=["Served"], host=None, port=None)]
    assert detect(tmp_path / "server.py").module_file == "env.py"


def test_server_calls_alias_run_literals_and_expr_port(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "a.py": """
                import os
                from ors import Environment, tool, ToolOutput, Server as S

                class V1(Environment):
                    #REQUIRED
                    @tool
                    def t(self) -> ToolOutput: ...

                class V2(V1):
                    pass

                S([V1, V2]).run(host="127.0.0.1", port=9000)
            """,
            "b.py": """
                import os
                import openreward.environments as ore
                from a import V1

                def main():
                    srv = ore.Server(environments=[V1])
                    srv.run(port=int(os.environ.get("PORT", "8080")))
            """,
            "c.py": """
                from ors import Server
                from a import V2
                ENVS = [V2]
                app = Server(ENVS)
            """,
        },
    )
    d = detect_ors(tmp_path)
    assert d.servers == [
        ServerCall(module_file="a.py", classes=["V1", "V2"], host="127.0.0.1", port=9000),
        ServerCall(module_file="b.py", classes=["V1"], host=None, port="<expr>"),
        ServerCall(module_file="c.py", classes=["V2"], host=None, port=None),
    ]


def test_bad_signatures_invalid_and_shared_false_not_listed(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "env.py": """
                from typing import Optional
                from pydantic import BaseModel
                from ors import Environment, tool, ToolOutput

                class P(BaseModel):
                    x: int

                class Env(Environment):
                    #REQUIRED
                    @tool
                    def ok(self, params: P) -> ToolOutput: ...

                    @tool
                    def ok_quoted(self, params: "P") -> "ToolOutput": ...

                    @tool
                    def no_return(self): ...

                    @tool
                    def wrong_return(self) -> dict: ...

                    @tool
                    def two_params(self, a: P, b: P) -> ToolOutput: ...

                    @tool
                    def dict_param(self, a: dict) -> ToolOutput: ...

                    @tool
                    def optional_param(self, a: Optional[P]) -> ToolOutput: ...

                    @tool
                    def unannotated(self, a) -> ToolOutput: ...

                    @tool(shared=False)
                    def private(self) -> ToolOutput: ...

                    @tool(shared=True)
                    def public(self) -> ToolOutput: ...
            """
        },
    )
    tools = envs_of(detect_ors(tmp_path))["Env"]
    assert tools == {
        "ok": (True, True, False),
        "ok_quoted": (True, True, False),
        "no_return": (False, True, False),
        "wrong_return": (False, True, False),
        "two_params": (False, True, False),
        "dict_param": (False, True, False),
        "optional_param": (False, True, False),
        "unannotated": (False, True, False),
        "private": (True, False, False),
        "public": (True, True, False),
    }


def test_validity_matches_the_sdk(tmp_path: Path) -> None:
    """The static verdict agrees with what ors-sdk itself lists (this test does import its fixture)."""
    pytest.importorskip("ors.environment")
    src = write(
        tmp_path,
        {
            "parity_env.py": """
                from pydantic import BaseModel
                from ors import Environment, tool, ToolOutput

                class P(BaseModel):
                    x: int

                class Parity(Environment):
                    #REQUIRED
                    @tool
                    def a(self) -> ToolOutput: ...
                    @tool
                    def b(self, p: P) -> ToolOutput: ...
                    @tool
                    def c(self, p: dict) -> ToolOutput: ...
                    @tool
                    def d(self, p: P, q: P) -> ToolOutput: ...
                    @tool
                    def e(self): ...
                    @staticmethod
                    @tool
                    def f() -> ToolOutput: ...
                    @tool
                    @staticmethod
                    def g() -> ToolOutput: ...
                    @classmethod
                    @tool
                    def h(cls) -> ToolOutput: ...
                    @tool
                    @classmethod
                    def i(cls) -> ToolOutput: ...
                    @tool
                    def j(this, p: P) -> ToolOutput: ...
                    @tool(shared=False)
                    def k(self) -> ToolOutput: ...
            """
        },
    )
    static = {t.name for t in detect_ors(src).envs[0].tools if t.valid and t.listed}
    spec = importlib.util.spec_from_file_location("parity_env_fixture", src / "parity_env.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runtime = {t.name for t in module.Parity.list_tools().tools}
    assert static == runtime == {"a", "b", "f", "h"}


def test_local_toolset_tools_count(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "env.py": """
                from ors import Environment, Toolset, tool, ToolOutput

                class Shell(Toolset):
                    @tool
                    def run(self) -> ToolOutput: ...

                class WithToolset(Environment):
                    toolsets = [Shell]
                    #REQUIRED
            """
        },
    )
    assert envs_of(detect_ors(tmp_path)) == {"WithToolset": {"run": (True, True, False)}}


def test_name_override_literal(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "env.py": """
                from ors import Environment, tool, ToolOutput

                class Named(Environment):
                    #REQUIRED
                    @classmethod
                    def name(cls) -> str:
                        "The server keys environments by name().lower()."
                        return "GSM8K"

                    @tool
                    def t(self) -> ToolOutput: ...

                class Computed(Environment):
                    #REQUIRED
                    @classmethod
                    def name(cls) -> str:
                        return cls.__name__ + "x"

                    @tool
                    def t(self) -> ToolOutput: ...
            """
        },
    )
    assert {e.class_name: e.env_name for e in detect_ors(tmp_path).envs} == {"Named": "gsm8k", "Computed": "computed"}


def test_openrouteservice_decoy_not_detected(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "routes.py": """
                import ors
                from ors.client import Client

                client = ors.Client(key="xyz")

                class Environment:
                    pass

                class Router(Environment):
                    def tool(self):
                        return client.directions(((8.34, 48.23), (8.34, 48.24)))
            """
        },
    )
    assert detect_ors(tmp_path).envs == []
    assert looks_like_ors(tmp_path) is False
    assert looks_like_ors(tmp_path / "routes.py") is False
    with pytest.raises(DetectionError):
        detect(tmp_path)


def test_pydantic_model_with_tool_method_not_detected(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "models.py": """
                from pydantic import BaseModel
                from ors import ToolOutput

                def tool(fn):
                    return fn

                class Model(BaseModel):
                    x: int

                    @tool
                    def tool(self) -> ToolOutput: ...
            """
        },
    )
    assert detect_ors(tmp_path).envs == []


def test_client_side_names_not_detected(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "client.py": """
                import ors.client
                from ors import tool, ToolOutput
                from ors.client import Environment
                from openreward.api.environments.client import Environment as OREnv
                import openreward

                class A(Environment):
                    #REQUIRED
                    @tool
                    def t(self) -> ToolOutput: ...

                class B(ors.client.Environment):
                    #REQUIRED
                    @tool
                    def t(self) -> ToolOutput: ...

                class C(OREnv):
                    #REQUIRED
                    @tool
                    def t(self) -> ToolOutput: ...

                class D(openreward.OpenReward):
                    @tool
                    def t(self) -> ToolOutput: ...
            """
        },
    )
    assert detect_ors(tmp_path).envs == []


def test_syntax_error_file_skipped(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "broken.py": "from ors import Environment\nclass Broken(Environment:\n",
            "good.py": """
                from ors import Environment, tool, ToolOutput

                class Good(Environment):
                    #REQUIRED
                    @tool
                    def t(self) -> ToolOutput: ...
            """,
            ".hidden/x.py": "from ors import Environment\nclass Hidden(Environment): pass\n",
            "venv/lib/y.py": "raise SystemExit",
        },
    )
    d = detect_ors(tmp_path)
    assert [e.class_name for e in d.envs] == ["Good"]
    assert d.files_scanned == 2 and d.skipped == ["broken.py"]


def test_requirements_found(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "requirements.txt": "ors  # openrouteservice, not the SDK\nors_sdk>=0.1\n",
            "pyproject.toml": '[project]\nname = "x"\ndependencies = ["OpenReward>=0.1.157", "numpy"]\n',
        },
    )
    assert detect_ors(tmp_path).requirements == ["openreward", "ors-sdk"]


def test_detection_never_executes_the_source(tmp_path: Path) -> None:
    marker = tmp_path / "executed.txt"
    write(
        tmp_path,
        {
            "env.py": f"""
                open({str(marker)!r}, "w").write("ran")
                raise SystemExit("executed!")
                from ors import Environment, tool, ToolOutput, Server

                class Sneaky(Environment):
                    #REQUIRED
                    @tool
                    def t(self) -> ToolOutput: ...

                Server([Sneaky]).run()
            """
        },
    )
    d = detect_ors(tmp_path)
    assert looks_like_ors(tmp_path) and looks_like_ors(tmp_path / "env.py")
    found = detect(tmp_path)
    assert [e.class_name for e in d.envs] == ["Sneaky"] and found.env_class == "Sneaky"
    assert not marker.exists()
    assert "env" not in sys.modules or getattr(sys.modules["env"], "__file__", None) != str(tmp_path / "env.py")


# -- the dispatcher --------------------------------------------------------------------------


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFound, match="does not exist") as info:
        detect(tmp_path / "nope")
    assert isinstance(info.value, FileNotFoundError)


def test_unsupported_kind(tmp_path: Path) -> None:
    # (openenv was this test's unsupported kind until its adapter landed)
    with pytest.raises(DetectionError, match="'ors'") as info:
        detect(tmp_path, kind="gradio")
    assert "'openenv'" in str(info.value) and "'verifiers'" in str(info.value)


def test_nothing_found_says_what_was_looked_for(tmp_path: Path) -> None:
    write(tmp_path, {"a.py": "x = 1\n", "b.py": "import ors\nors.Client()\n"})
    with pytest.raises(DetectionError) as info:
        detect(tmp_path)
    msg = str(info.value)
    assert not isinstance(info.value, AmbiguousSource)
    assert "ors.Environment" in msg and "openreward.environments.Environment" in msg
    assert "@tool" in msg and "2 .py file(s)" in msg


def _two_envs(tmp_path: Path) -> Path:
    return write(
        tmp_path,
        {
            "a.py": """
                from ors import Environment, tool, ToolOutput

                class Alpha(Environment):
                    #REQUIRED
                    @tool
                    def t(self) -> ToolOutput: ...
            """,
            "sub/b.py": """
                from openreward.environments import Environment, tool, ToolOutput

                class Beta(Environment):
                    #REQUIRED
                    @tool
                    def t(self) -> ToolOutput: ...
            """,
        },
    )


def test_ambiguous_lists_candidates(tmp_path: Path) -> None:
    with pytest.raises(AmbiguousSource) as info:
        detect(_two_envs(tmp_path))
    msg = str(info.value)
    assert "a.py:Alpha" in msg and "sub/b.py:Beta" in msg and "--env-class" in msg


def test_env_class_selects(tmp_path: Path) -> None:
    src = _two_envs(tmp_path)
    got = detect(src, env_class="Beta")
    assert got == Detected(
        kind="ors", env_class="Beta", env_name="beta", module_file="sub/b.py", sdk="openreward", source=str(src.resolve())
    )
    assert detect(src, kind="ors", env_class="a.py:Alpha").env_class == "Alpha"
    with pytest.raises(DetectionError, match="a.py:Alpha") as info:
        detect(src, env_class="Gamma")
    assert "Gamma" in str(info.value) and not isinstance(info.value, AmbiguousSource)


def test_unservable_classes_explained(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "bad_tools.py": """
                from ors import Environment, tool, ToolOutput

                class OnlyBad(Environment):
                    #REQUIRED
                    @tool
                    def two(self, a, b) -> ToolOutput: ...

                    @tool(shared=False)
                    def private(self) -> ToolOutput: ...
            """,
            "missing.py": """
                from ors import Environment, tool, ToolOutput

                class NoTasks(Environment):
                    def get_prompt(self):
                        return []

                    @tool
                    def t(self) -> ToolOutput: ...
            """,
        },
    )
    with pytest.raises(DetectionError, match="no tool") as info:
        detect(tmp_path, env_class="OnlyBad")
    assert "two" in str(info.value) and "shared=False" in str(info.value)
    with pytest.raises(DetectionError, match="list_splits, list_tasks") as info:
        detect(tmp_path, env_class="NoTasks")
    assert "refuse" in str(info.value)


def test_openreward_terminal_only_env_is_servable(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "env.py": """
                from openreward.environments import Environment, tool, terminal, ToolOutput

                class TerminalOnly(Environment):
                    #REQUIRED
                    @terminal
                    @tool
                    def final(self) -> ToolOutput: ...
            """
        },
    )
    assert detect(tmp_path).env_class == "TerminalOnly"


def test_import_source_records_entry(tmp_path: Path) -> None:
    src = _two_envs(tmp_path / "src")
    catalog = tmp_path / "catalog.json"
    entry = import_source(src, "MyAlpha", env_class="Alpha", catalog=catalog)
    assert entry.env_class == "Alpha" and entry.module_file == "a.py" and entry.source == str(src.resolve())
    assert entry.added_at
    assert load_catalog(catalog) == {"MyAlpha": entry}
    with pytest.raises(InvalidName):
        import_source(src, "bad/name", env_class="Alpha", catalog=catalog)


def test_star_import_and_self_named_subclass(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "base.py": """
                from ors import *

                class Env(Environment):
                    #REQUIRED
                    @tool
                    def z(self) -> ToolOutput: ...
            """,
            "child.py": """
                from base import Env

                class Env(Env):  # the base is the imported Env, not itself
                    pass
            """,
        },
    )
    assert [(e.module_file, e.class_name) for e in detect_ors(tmp_path).envs] == [("base.py", "Env"), ("child.py", "Env")]
    with pytest.raises(AmbiguousSource, match="FILE:NAME"):
        detect(tmp_path, env_class="Env")
    assert detect(tmp_path, env_class="child.py:Env").module_file == "child.py"
