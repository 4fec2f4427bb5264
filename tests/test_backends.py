"""A backend is one descriptor: a toy ecosystem defined in this test alone plays through gym.make,
both vector backends and the catalog, with nothing in the package edited.

The toy env: task ``i`` of a source asks for a number; its one tool ``answer(n)`` pays 1 when ``n``
is the task's number. A "source" of this kind is a ``.toy`` file whose first line is the base the
numbers start from, so the catalog entry carries something the adapter needs.
"""

from __future__ import annotations

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

TOY_MODULE = '''
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


def looks_like_toy(path):
    return path.suffix == ".toy"


def toy_source(path, env_class):
    if path.suffix != ".toy":
        raise DetectionError(f"a toy source is a .toy file; {path} is not")
    return Detected(kind="toy", env_class="", env_name=path.stem, module_file=path.name, sdk="toy", source=str(path))


def toy_kwargs(entry):
    return {"source": entry.source}
'''


def answer(n: int) -> dict:
    return {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                 "function": {"name": "answer", "arguments": json.dumps({"n": n})}}]}


def number_of(obs: list) -> int:
    return int(obs[0]["content"].split()[1].rstrip("."))


@pytest.fixture
def toy(tmp_path, monkeypatch):
    module = tmp_path / "toy_backend_mod.py"
    module.write_text(textwrap.dedent(TOY_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # host processes and Ray workers import it too
    backends.register(backends.Backend(
        kind="toy", adapter="toy_backend_mod:ToyAdapter", builtin="Toy", needs="nothing",
        looks_like="toy_backend_mod:looks_like_toy", detect="toy_backend_mod:toy_source",
        catalog_kwargs="toy_backend_mod:toy_kwargs"))
    register_builtins()
    yield tmp_path
    backends.unregister("toy")
    gym.registry.pop("openenv/Toy-v0", None)
    sys.modules.pop("toy_backend_mod", None)


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

    assert "toy" in DETECTORS and "toy" in _kinds() and ADAPTERS["toy"] == "toy_backend_mod:ToyAdapter"
    assert needs("toy_backend_mod:ToyAdapter") == "nothing"
