"""A backend is one folder plus one registration line: a toy ecosystem defined in this test alone
(a package laid out as the built-ins under openenv_gym/adapters/<kind>/) plays through gym.make,
both vector backends, the catalog and isolation's requirements, with nothing in the package edited.

The toy env: task ``i`` of a source asks for a number; its one tool ``answer(n)`` pays 1 when ``n``
is the task's number. A "source" of this kind is a ``.toy`` file whose first line is the base the
numbers start from, so the catalog entry carries something the adapter needs.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import openenv_gym  # noqa: F401
from openenv_gym import backends
from openenv_gym.importing import import_source
from openenv_gym.registration import register_builtins, register_catalog

TOY_PACKAGE = {
    # The descriptor and the one registration line, as each built-in backend's __init__ has them.
    "__init__.py": '''
from openenv_gym.backends import Backend, register


def catalog_kwargs(entry):
    return {"source": entry.source}


def venv_requirements(sdk, extra):
    return ["toy-sdk>=1"]


register(Backend(kind="toy", adapter="toy_backend.adapter:ToyAdapter", builtin="Toy", needs="nothing",
                 looks_like="toy_backend.detect:looks_like_toy", detect="toy_backend.detect:toy_source",
                 catalog_kwargs=catalog_kwargs, venv_requirements=venv_requirements))
''',
    "adapter.py": '''
from pathlib import Path
from openenv_gym.actions import tool_message, user_message
from openenv_gym.adapters.base import Adapter, Episode
from openenv_gym.errors import DetectionError
from openenv_gym.importers import Detected
from openenv_gym.wire import Opening, Outcome, Split, ToolSpec

ANSWER = ToolSpec("answer", "Say the number.", {"type": "object", "properties": {"n": {"type": "integer"}},
                                                 "required": ["n"]})


class ToyAdapter(Adapter):
    kind = "toy"

    def __init__(self, source: str | None = None):
        super().__init__()
        self.base = int(Path(source).read_text().split()[0]) if source else 100

    async def start(self): pass
    async def aclose(self): pass
    def episode(self): return ToyEpisode(self)
    async def tools(self): return [ANSWER]
    async def _fetch_splits(self): return [Split("train", "train")]
    async def _fetch_num_tasks(self, split): return 10
    async def task(self, split, index): return {"number": self.base + index}


class ToyEpisode(Episode):
    def __init__(self, adapter):
        self.adapter, self.number = adapter, None

    async def start(self, task):
        self.number = self.adapter.base + task.index
        return Opening([user_message(f"Say {self.number}.")], [ANSWER], f"{task.split}/{task.index}")

    async def step(self, turn):
        if not turn.calls:
            return Outcome([user_message("Call answer.")], reward=0.0)
        call = turn.calls[0]
        right = call.error is None and (call.arguments or {}).get("n") == self.number
        return Outcome([tool_message(call.id, "answer", "right" if right else "wrong")],
                       reward=1.0 if right else 0.0, terminated=True)

    async def aclose(self): pass
''',
    "detect.py": '''
from openenv_gym.errors import DetectionError
from openenv_gym.importers import Detected


def looks_like_toy(path):
    return path.suffix == ".toy"


def toy_source(path, env_class):
    if path.suffix != ".toy":
        raise DetectionError(f"a toy source is a .toy file; {path} is not")
    return Detected(kind="toy", env_class="", env_name=path.stem, module_file=path.name, sdk="toy", source=str(path))
''',
}


def answer(n: int) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": "answer", "arguments": json.dumps({"n": n})}}]}


def number_of(obs: list) -> int:
    return int(obs[0]["content"].split()[1].rstrip("."))


@pytest.fixture
def toy(tmp_path, monkeypatch):
    folder = tmp_path / "toy_backend"
    folder.mkdir()
    for name, text in TOY_PACKAGE.items():
        (folder / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # host processes and Ray workers import it too
    importlib.import_module("toy_backend")  # the one line: the folder registers its backend
    register_builtins()
    yield tmp_path
    backends.unregister("toy")
    gym.registry.pop("openenv/Toy-v0", None)
    for module in ("toy_backend", "toy_backend.adapter", "toy_backend.detect"):
        sys.modules.pop(module, None)


def test_the_toy_backend_plays_through_gym_make(toy):
    env = gym.make("openenv/Toy-v0")
    try:
        check_env(env.unwrapped, skip_render_check=True)
        obs, info = env.reset(seed=0)
        assert info["tools"][0]["function"]["name"] == "answer"
        _, reward, terminated, _, _ = env.step(answer(number_of(obs)))
        assert reward == 1.0 and terminated
    finally:
        env.close()


@pytest.mark.parametrize("backend", ["concurrent", pytest.param("ray", marks=pytest.mark.ray)])
def test_the_toy_backend_plays_through_make_vec(toy, backend):
    options = {"num_actors": 2, "runtime_env": {"env_vars": {"PYTHONPATH": str(toy)}}} if backend == "ray" else {}
    if backend == "ray":
        pytest.importorskip("ray")
    envs = gym.make_vec("openenv/Toy-v0", num_envs=4, backend=backend, vector_options=options)
    try:
        obs, _ = envs.reset(seed=0)
        _, rewards, terminated, _, _ = envs.step([answer(number_of(o)) for o in obs])
        assert rewards.tolist() == [1.0] * 4 and terminated.all()
    finally:
        envs.close()


def test_the_toy_backend_imports_into_the_catalog_and_plays_from_it(toy, tmp_path, private_catalog):
    source = tmp_path / "numbers.toy"
    source.write_text("500\n")
    entry = import_source(source, "MyToy")
    assert entry.kind == "toy"
    assert "openenv/MyToy-v0" in register_catalog()
    env = gym.make("openenv/MyToy-v0")
    try:
        obs, _ = env.reset(options={"index": 3})
        assert obs[0]["content"] == "Say 503."  # the entry's source reached the adapter
        assert env.step(answer(503))[1] == 1.0
    finally:
        env.close()
        gym.registry.pop("openenv/MyToy-v0", None)


def test_the_toy_kind_is_listed_where_kinds_are(toy):
    from openenv_gym.cli import _kinds
    from openenv_gym.importers import DETECTORS
    from openenv_gym.registration import ADAPTERS, needs

    assert "toy" in DETECTORS and "toy" in _kinds() and ADAPTERS["toy"] == "toy_backend.adapter:ToyAdapter"
    assert needs("toy_backend.adapter:ToyAdapter") == "nothing"


def test_the_toy_backend_gives_its_own_isolated_venv_requirements(toy, tmp_path):
    from openenv_gym.isolation import venvs

    source = tmp_path / "numbers.toy"
    source.write_text("500\n")
    requirements = venvs.requirements_for("toy", source, sdk="toy")
    assert "toy-sdk>=1" in requirements and requirements[-1] == venvs.this_package()


def test_each_builtin_backend_is_a_folder_that_registers_itself():
    """The built-ins are laid out as the toy is: adapters/<kind>/ holds the descriptor, the adapter,
    the detector; nothing per backend is left in importers/."""
    from pathlib import Path

    root = Path(openenv_gym.__file__).parent
    for backend in backends.backends()[:4]:
        folder = root / "adapters" / backend.kind
        assert (folder / "__init__.py").is_file() and (folder / "detect.py").is_file(), backend.kind
        for ref in (backend.adapter, backend.detect, backend.looks_like):
            assert ref.startswith(f"openenv_gym.adapters.{backend.kind}."), ref
    assert sorted(p.name for p in (root / "importers").glob("*.py")) == [
        "__init__.py", "catalog.py", "discovery.py", "pysource.py"]


@pytest.mark.parametrize("earlier, now", [
    ("openenv_gym.adapters.ors:ORSAdapter", "openenv_gym.adapters.ors.adapter:ORSAdapter"),
    ("openenv_gym.adapters.fleet:FleetAdapter", "openenv_gym.adapters.fleet.adapter:FleetAdapter"),
    ("openenv_gym.adapters.openenv:OpenEnvAdapter", "openenv_gym.adapters.openenv.adapter:OpenEnvAdapter"),
    ("openenv_gym.adapters.verifiers:adapter_spec", "openenv_gym.adapters.verifiers.adapter:adapter_spec"),
])
def test_adapter_entries_of_earlier_releases_still_resolve(earlier, now):
    """Ids that plugins registered before the backends had folders name the adapter by its package."""
    from openenv_gym.adapters.base import AdapterSpec

    assert AdapterSpec(earlier).target() is AdapterSpec(now).target()
    assert backends.kind_of_adapter(earlier) == backends.kind_of_adapter(now) == now.split(".")[2]


def test_the_public_apis_resolve_and_the_backend_authors_types_are_where_the_docs_say():
    import openenv_gym.adapters as authors

    for module in (openenv_gym, authors):
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
    assert authors.Opening is openenv_gym.Opening  # earlier releases' top-level names still resolve
    assert "Opening" not in openenv_gym.__all__ and "TextToolCalls" in openenv_gym.__all__
