"""openenv_gym.trl.EnvSpec: the contract TRL's GRPOTrainer relies on, without torch or TRL.

TRL reads an environment class's tools with ``inspect.getmembers(type(env), inspect.isfunction)``
and describes them to the model with ``transformers.utils.get_json_schema``; it calls
``reset(**row)`` with each dataset row and appends what it returns to the row's prompt; it calls
each tool method with the model's arguments and shows the returned text; it adds ``get_reward``
as a reward source beside ``reward_funcs``. Those exact calls are made here, on real envs: the
bundled Arithmetic ORS server and legacy Verifiers envs (plain-text answers and a ToolEnv). The
trainer itself runs in the TRL venv (tests/examples/test_trl_env_factory.py).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import keyword
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import openenv_gym  # noqa: F401  (registers the ids)
from openenv_gym.errors import BackendError, ConcurrentUse, ConfigurationError
from openenv_gym.registration import ADAPTERS, ENTRY_POINT, VECTOR_ENTRY_POINT
from openenv_gym.testing import procs
from openenv_gym.trl import EnvSpec, env_reward
from openenv_gym.trl.tools import tool_function
from openenv_gym.wire import ToolSpec

get_json_schema = pytest.importorskip(  # the schema TRL describes tools with
    "transformers.utils", reason="TRL's tool schemas come from transformers (the tokens extra)").get_json_schema

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "tests" / "envs"
ARITHMETIC = "openenv/Arithmetic-v0"
SUMS = "openenv/TRLSums-v0"          # examples/vf_sums.py: answers in plain text, 1.0 or 0.0
CALC = "openenv/TRLCalc-v0"          # a Verifiers ToolEnv: tools, then a plain-text answer
THREE = "openenv/TRLThree-v0"        # a Verifiers env of three tasks


def _register(id: str, source: Path, **kwargs) -> None:
    if id not in gym.registry:
        gym.register(id, entry_point=ENTRY_POINT, vector_entry_point=VECTOR_ENTRY_POINT,
                     kwargs={"adapter": ADAPTERS["verifiers"], "source": str(source), **kwargs})


_register(SUMS, ROOT / "examples" / "vf_sums.py")
_register(CALC, ENVS / "verifiers_v0" / "vf_calc_tool.py")
_register(THREE, ENVS / "verifiers_v0" / "vf_arith.py")


def tools_of(cls: type) -> dict:
    """What TRL offers the model for an environment class: its public functions but reset/get_reward."""
    return {name: fn for name, fn in inspect.getmembers(cls, inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")}


def question(prompt: str) -> str:
    return re.search(r"Compute (.+?)\. You may", prompt).group(1)


def ors_servers() -> set[int]:
    return {p for p in procs.descendants(os.getpid()) if "local_servers/serve.py" in procs.cmdline(p)}


@pytest.fixture
def arithmetic():
    with EnvSpec(ARITHMETIC, num_tasks=16) as spec:
        yield spec


# -- the tools TRL reads ---------------------------------------------------------------------------
def test_trl_reads_back_the_envs_own_tool_schemas(arithmetic):
    cls = arithmetic.environment_factory
    env = cls()
    with gym.make(ARITHMETIC) as plain:  # the tools the env itself offers
        _, info = plain.reset(seed=0)
        own = {t["function"]["name"]: t["function"] for t in info["tools"]}
    assert set(tools_of(cls)) == set(own) == {"calculator", "submit"}
    for name, spec in own.items():
        read = get_json_schema(getattr(env, name))["function"]
        assert read["name"] == name and read["description"] == spec["description"]
        params, props = read["parameters"], spec["parameters"]["properties"]
        assert list(params["properties"]) == list(props)
        assert sorted(params.get("required", [])) == sorted(spec["parameters"].get("required", []))
        for p, prop in props.items():
            assert params["properties"][p]["type"] == prop["type"]
            assert params["properties"][p]["description"] == prop["description"]


def test_a_verifiers_tool_envs_python_tools_read_back_with_their_docstrings():
    with EnvSpec(CALC) as spec:
        env = spec.environment_factory()
        read = get_json_schema(env.multiply)["function"]
    assert read["description"] == "Multiply two integers."
    assert read["parameters"] == {"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "integer", "description": "the first factor"},
        "b": {"type": "integer", "description": "the second factor"}}}


_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: not keyword.iskeyword(n) and n not in ("self", "reset", "get_reward"))
_WORDS = st.lists(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.,'()+*/=-]{0,10}", fullmatch=True), min_size=1, max_size=8)
_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool}


@st.composite
def tool_specs(draw):
    props, required = {}, []
    for name in draw(st.lists(_NAMES, max_size=6, unique=True)):
        kind = draw(st.sampled_from(["string", "integer", "number", "boolean", "array", "enum", "nullable"]))
        prop: dict = {"description": " ".join(draw(_WORDS))}
        if kind == "array":
            prop.update(type="array", items={"type": draw(st.sampled_from(sorted(_TYPES)))})
        elif kind == "enum":
            prop.update(type="string", enum=draw(st.lists(_NAMES, min_size=1, max_size=4, unique=True)))
        elif kind == "nullable":
            prop.update(anyOf=[{"type": draw(st.sampled_from(sorted(_TYPES)))}, {"type": "null"}])
        else:
            prop["type"] = kind
        props[name] = prop
        if draw(st.booleans()):
            required.append(name)
    return ToolSpec(draw(_NAMES), " ".join(draw(_WORDS)), {"type": "object", "properties": props, "required": required})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tool_specs())
def test_any_schema_of_scalars_arrays_enums_and_optionals_round_trips_through_trls_reader(spec):
    calls = []
    fn = tool_function(spec, lambda self, name, arguments: calls.append((name, arguments)) or "ok")
    cls = type("Env", (), {spec.name: fn})
    read = get_json_schema(getattr(cls(), spec.name))["function"]
    props = spec.parameters["properties"]
    assert read["name"] == spec.name and read["description"] == spec.description
    assert list(read["parameters"]["properties"]) == list(props)  # the env's order, required or not
    assert sorted(read["parameters"].get("required", [])) == sorted(spec.parameters["required"])
    for name, prop in props.items():
        got = read["parameters"]["properties"][name]
        assert got["description"] == prop["description"]
        if "anyOf" in prop:
            assert got["type"] == prop["anyOf"][0]["type"] and got["nullable"] is True
        elif "enum" in prop:
            assert got["enum"] == prop["enum"] and got["type"] == "string"
        else:
            assert got["type"] == prop["type"]
            assert got.get("items") == prop.get("items")
    # What the model wrote reaches the env as it was written, checked by the env, not by Python.
    assert getattr(cls(), spec.name)(anything="x") == "ok" and calls == [(spec.name, {"anything": "x"})]


def test_text_the_docstring_reader_would_misread_reaches_the_model_nearly_unchanged():
    spec = ToolSpec("search", "Search the web.\n    Returns: a list\nRaises: nothing", {
        "type": "object", "required": ["q"], "properties": {
            "q": {"type": "string", "description": "the query\n  over two lines"},
            "k": {"type": "integer", "description": "how many (choices: [1, 2])"},
            "x": {"type": "object", "properties": {"y": {"type": "string"}}, "title": "X thing"}}})
    cls = type("Env", (), {"search": tool_function(spec, lambda *a: "")})
    read = get_json_schema(cls().search)["function"]
    assert read["description"] == "Search the web.\n    Returns : a list\nRaises : nothing"
    props = read["parameters"]["properties"]
    assert props["q"]["description"] == "the query over two lines"
    assert props["k"] == {"type": "integer", "description": "how many (choices: [1, 2])."}  # no enum made up
    assert props["x"] == {"type": "object", "description": "X thing"}  # nested properties cannot be said


@pytest.mark.parametrize("tool, why", [
    (ToolSpec("reset", "Reset the board."), "reserves"),
    (ToolSpec("get_reward", "x"), "reserves"),
    (ToolSpec("_hidden", "x"), "start with '_'"),
    (ToolSpec("send", "x", {"type": "object", "properties": {"from": {"type": "string"}}}), "'from'"),
    (ToolSpec("send", "x", {"type": "object", "properties": {"to-addr": {"type": "string"}}}), "'to-addr'"),
])
def test_tools_trl_cannot_offer_are_refused_by_name_not_dropped(tool, why):
    from openenv_gym.trl.tools import check_names

    with pytest.raises(ConfigurationError, match=re.escape(why)) as err:
        check_names([ToolSpec("fine", "ok"), tool], "openenv/X-v0")
    assert repr(tool.name) in str(err.value)


# -- the dataset ------------------------------------------------------------------------------------
def test_the_dataset_has_a_row_per_task_an_empty_prompt_and_no_answer(arithmetic):
    ds = arithmetic.train_dataset
    assert ds.column_names == ["prompt", "split", "index"] and len(ds) == 16
    assert ds["index"] == list(range(16)) and set(ds["split"]) == {"train"}
    assert all(p == [{"role": "user", "content": ""}] for p in ds["prompt"])
    with EnvSpec(ARITHMETIC, split="test", indices=[499, 3]) as spec:
        assert spec.train_dataset["index"] == [499, 3] and set(spec.train_dataset["split"]) == {"test"}
    with EnvSpec(ARITHMETIC) as spec:
        assert len(spec.train_dataset) == 2000


@pytest.mark.parametrize("kwargs, match", [
    ({"num_tasks": 4, "indices": [1]}, "not both"),
    ({"num_tasks": 0}, "positive"),
    ({"indices": [2000]}, "outside"),
    ({"split": "nope"}, "nope"),
])
def test_bad_dataset_arguments_are_configuration_errors(kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        with EnvSpec(ARITHMETIC, **kwargs) as spec:
            _ = spec.train_dataset  # reading the property builds the dataset, which raises


def test_a_weighted_mixture_shares_the_rows_by_weight_and_names_each_rows_env():
    with EnvSpec({ARITHMETIC: 3, THREE: 1}, num_tasks=8) as spec:
        ds = spec.train_dataset
        assert ds.column_names == ["prompt", "split", "index", "environment"]
        envs = ds["environment"]
        assert envs.count(ARITHMETIC) == 6 and envs.count(THREE) == 2
        assert envs[:4].count(THREE) == 1  # interleaved, not one env after the other
        assert [i for e, i in zip(envs, ds["index"]) if e == THREE] == [0, 1]
        factory = spec.environment_factory
        assert set(factory) == {ARITHMETIC, THREE} and spec.reward_funcs == [env_reward]
    # Without num_tasks every task of every env appears; the smaller env's repeat to keep the weights.
    with EnvSpec({ARITHMETIC: 1, THREE: 1}) as spec:
        ds = spec.train_dataset
        three = [i for e, i in zip(ds["environment"], ds["index"]) if e == THREE]
        arith = [i for e, i in zip(ds["environment"], ds["index"]) if e == ARITHMETIC]
        assert arith == list(range(2000)) and three == [i % 3 for i in range(2000)]


@pytest.mark.parametrize("mapping, match", [({}, "no environment"), ({ARITHMETIC: 0}, "positive"),
                                            ({ARITHMETIC: float("nan")}, "positive"),
                                            ({"openenv/Arithmetc-v0": 1}, "Arithmetic-v0")])
def test_bad_mappings_are_configuration_errors(mapping, match):
    with pytest.raises(ConfigurationError, match=match):
        EnvSpec(mapping)


def test_unknown_kwargs_are_refused_before_anything_starts():
    before = ors_servers()
    with pytest.raises(ConfigurationError, match="max_turn"):
        EnvSpec(ARITHMETIC, max_turn=3)
    assert ors_servers() == before


# -- episodes ----------------------------------------------------------------------------------------
def test_reset_returns_the_tasks_prompt_and_tools_play_the_episode(arithmetic):
    env = arithmetic.environment_factory()
    row = arithmetic.train_dataset[5]
    prompt = env.reset(**row)
    with gym.make(ARITHMETIC) as plain:
        obs, _ = plain.reset(options={"split": "train", "index": 5})
    assert prompt == obs[0]["content"]
    value = env.calculator(expression=question(prompt))
    assert "missing required argument(s) expression" in env.calculator(expresion="1")  # the env's own answer
    assert env.submit(answer=value) == "Correct!" and env.done and env.get_reward() == 1.0
    assert env.submit(answer=value) == "The episode has ended; this tool call was not run."
    env.reset(**arithmetic.train_dataset[6])  # the instance is reused for the next row, as TRL does
    assert env.get_reward() == 0.0 and not env.done
    assert env.submit(answer="-1") == "Incorrect." and env.get_reward() == 0.0
    with pytest.raises(ConfigurationError, match="index"):
        env.reset(prompt=[])


def test_plain_text_envs_are_scored_once_by_their_final_message():
    with EnvSpec({ARITHMETIC: 1, SUMS: 1}, num_tasks=4) as spec:
        factory = spec.environment_factory
        assert not tools_of(factory[SUMS]) and not hasattr(factory[SUMS], "get_reward")
        sums = [factory[SUMS]() for _ in range(3)]
        arith = factory[ARITHMETIC]()
        prompts = [e.reset(split="train", index=i) for i, e in enumerate(sums)]
        assert prompts[0].startswith("Answer with the number only.\n\nWhat is ")
        right = [str(eval(re.search(r"What is (.+)\?", p).group(1))) for p in prompts]
        arith.reset(split="train", index=0)
        completions = [[{"role": "assistant", "content": right[0]}],
                       [{"role": "assistant", "content": right[1] + "0"}],
                       [{"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]},
                        {"role": "tool", "content": "?"}],
                       [{"role": "assistant", "content": "42"}]]
        rewards = env_reward(completions, environments=[*sums, arith])
        assert rewards == [1.0, 0.0, 0.0, None]  # the ORS rollout is get_reward's to score
        assert env_reward([right[0]], environments=[sums[0]]) == [1.0]  # scored once: no second step
        with pytest.raises(ConfigurationError, match="environment_factory"):
            env_reward(completions)


def test_a_verifiers_tool_env_takes_tool_calls_then_the_text_answer():
    with EnvSpec(CALC) as spec:
        env = spec.environment_factory()
        assert spec.reward_funcs == [env_reward] and not hasattr(env, "get_reward")
        env.reset(split="train", index=0)  # 12 * 13
        assert env.multiply(a=12, b=13) == "156"
        assert "boom(3) exploded" in env.boom(x=3)
        assert env_reward([[{"role": "assistant", "content": "156"}]], environments=[env]) == [1.0]


def test_schema_parts_a_signature_cannot_carry_are_named_in_a_warning():
    with EnvSpec("openenv/ORS-v0", num_tasks=2, source=str(ENVS / "ors_probe.py"), env_class="Probe") as spec:
        with pytest.warns(UserWarning) as caught:
            _ = spec.environment_factory
    said = sorted(str(w.message) for w in caught)
    assert said == [f"openenv/ORS-v0: the schema of tool {name!r} has parts a Python signature cannot carry, so the "
                    f"model does not see them ({arg}: maximum, minimum)"
                    for name, arg in (("big", "n"), ("slow", "seconds"), ("tick", "seconds"))]


# -- many slots, one server, no threads ------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:.*the schema of tool:UserWarning")  # the probe's bounded integers (warned: tested above)
def test_hundreds_of_instances_share_one_server_and_run_tool_calls_concurrently():
    threads_before = threading.active_count()
    with EnvSpec(ARITHMETIC, num_tasks=64) as spec:
        cls, rows = spec.environment_factory, spec.train_dataset
        envs = [cls() for _ in range(256)]
        servers = ors_servers()  # one server for the source (a worker a core at most), not one per instance
        assert 1 <= len(servers) <= max(1, os.cpu_count() or 1)
        assert threading.active_count() <= threads_before + 2  # the runtime loop, at most

        def episode(k):
            env = envs[k]
            prompt = env.reset(**rows[k % 64])
            value = env.calculator(expression=question(prompt))
            env.submit(answer=value if k % 2 else str(int(value) + 1))
            return env.get_reward()

        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            rewards = list(pool.map(episode, range(256)))
        assert rewards == [float(k % 2) for k in range(256)]
        assert ors_servers() == servers
    assert procs.wait_dead(servers, 20) == []


_ANYTHING = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arguments=st.dictionaries(st.sampled_from(["expression", "answer", "other", "\ud800"]), _ANYTHING, max_size=3))
def test_whatever_arguments_a_model_writes_the_tool_answers_in_text_and_the_episode_goes_on(arithmetic, arguments):
    env = arithmetic.environment_factory()
    prompt = env.reset(**arithmetic.train_dataset[0])
    reply = env.calculator(**arguments)  # NaN, 10**30, lone surrogates, nesting, unknown names
    assert isinstance(reply, str) and reply and env.error is None and not env.done
    assert env.submit(answer=env.calculator(expression=question(prompt))) == "Correct!"


def test_a_spec_never_closed_leaves_no_server_after_exit(tmp_path):
    code = (
        "import openenv_gym, os\n"
        "from openenv_gym.testing import procs\n"
        "from openenv_gym.trl import EnvSpec\n"
        "spec = EnvSpec('openenv/Arithmetic-v0', num_tasks=2)\n"
        "env = spec.environment_factory()\n"
        "env.reset(**spec.train_dataset[0])\n"
        "print(*[p for p in procs.descendants(os.getpid()) if 'local_servers/serve.py' in procs.cmdline(p)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    servers = [int(p) for p in out.stdout.split()]
    assert servers and procs.wait_dead(servers, 20) == []


@pytest.mark.filterwarnings("ignore:.*the schema of tool:UserWarning")  # the probe's bounded integers (warned: tested above)
def test_one_instance_refuses_a_second_thread_while_a_call_runs():
    with EnvSpec("openenv/ORS-v0", num_tasks=2, source=str(ENVS / "ors_probe.py"), env_class="Probe") as spec:
        env = spec.environment_factory()
        env.reset(**spec.train_dataset[0])
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            first = ex.submit(env.slow, seconds=1.5)
            time.sleep(0.5)  # the slow call runs
            with pytest.raises(ConcurrentUse):
                env.hint()
            first.result(30)
        other = spec.environment_factory()  # another instance is not held up
        other.reset(**spec.train_dataset[1])
        assert other.hint() == "Think step by step."


# -- hosted ids ------------------------------------------------------------------------------------
def test_a_hosted_id_gives_the_same_rows_schemas_and_rewards():
    with EnvSpec(ARITHMETIC, num_tasks=40) as local, EnvSpec(ARITHMETIC, num_tasks=40, python=sys.executable) as hosted:
        assert hosted.train_dataset.to_list() == local.train_dataset.to_list()
        a, b = local.environment_factory(), hosted.environment_factory()
        for name in ("calculator", "submit"):
            assert get_json_schema(getattr(a, name)) == get_json_schema(getattr(b, name))
        envs = [hosted.environment_factory() for _ in range(40)]
        for k, env in enumerate(envs):
            prompt = env.reset(**hosted.train_dataset[k])
            assert prompt == a.reset(**local.train_dataset[k])
            value = env.calculator(expression=question(prompt))
            env.submit(answer=value if k % 3 else "x")
            assert env.get_reward() == (1.0 if k % 3 else 0.0)
        hosts = [p for p in procs.children(os.getpid()) if "openenv_gym.hosts.server" in procs.cmdline(p)]
        assert len(hosts) == 2  # 40 slots: two host processes of 32 slots each, not 40
    assert procs.wait_dead(hosts, 20) == []


def test_a_dead_host_fails_its_episodes_typed_and_the_next_reset_recovers():
    with EnvSpec(ARITHMETIC, num_tasks=4, python=sys.executable) as spec:
        env = spec.environment_factory()
        env.reset(**spec.train_dataset[0])
        (host,) = [p for p in procs.children(os.getpid()) if "openenv_gym.hosts.server" in procs.cmdline(p)]
        os.kill(host, 9)
        with pytest.raises(BackendError):
            env.calculator(expression="1 + 1")
        with pytest.warns(UserWarning, match="failed"):
            assert env.get_reward() is None  # unscorable: TRL leaves it out, never a silent 0
        prompt = env.reset(**spec.train_dataset[1])
        assert env.submit(answer=env.calculator(expression=question(prompt))) == "Correct!"


def test_a_killed_local_server_fails_the_episode_and_the_next_reset_relaunches_it(arithmetic):
    env = arithmetic.environment_factory()
    env.reset(**arithmetic.train_dataset[0])
    servers = ors_servers()
    for server in servers:
        os.kill(server, 9)
    procs.wait_dead(servers, 10)
    with pytest.raises(BackendError):
        env.calculator(expression="1 + 1")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert env.get_reward() is None
    prompt = env.reset(**arithmetic.train_dataset[1])
    assert env.submit(answer=env.calculator(expression=question(prompt))) == "Correct!"
    assert ors_servers() and not ors_servers() & servers


def test_closing_the_spec_stops_its_servers_and_refuses_further_calls():
    spec = EnvSpec(ARITHMETIC, num_tasks=2)
    env = spec.environment_factory()
    env.reset(**spec.train_dataset[0])
    servers = ors_servers()
    assert servers
    spec.close()
    spec.close()
    assert procs.wait_dead(servers, 20) == []
    with pytest.raises(ConfigurationError, match="the session pool is closed"):
        env.reset(**spec.train_dataset[0])


def test_an_id_imported_isolated_plays_in_host_processes(tmp_path, monkeypatch):
    from openenv_gym.examples import arithmetic as bundled
    from openenv_gym.importing import import_source
    from openenv_gym.registration import register_catalog

    monkeypatch.setenv("OPENENV_GYM_DATA", str(tmp_path / "data"))
    import_source(bundled.__file__, "TRLIsoArith", env_class="Arithmetic", isolated=True, build=False)
    register_catalog()
    assert gym.spec("openenv/TRLIsoArith-v0").kwargs["isolate"] is True

    def hosts():
        return [p for p in procs.children(os.getpid()) if "openenv_gym.hosts.server" in procs.cmdline(p)]

    # python= names the host's interpreter (a venv build is the -m venv test's business).
    with EnvSpec("openenv/TRLIsoArith-v0", num_tasks=2, python=sys.executable) as spec:
        env = spec.environment_factory()
        prompt = env.reset(**spec.train_dataset[1])
        assert len(hosts()) == 1 and env.submit(answer=env.calculator(expression=question(prompt))) == "Correct!"
    with EnvSpec("openenv/TRLIsoArith-v0", num_tasks=2, isolate=False) as spec:  # in this process
        env = spec.environment_factory()
        env.reset(**spec.train_dataset[1])
        assert hosts() == []


@pytest.mark.venv
def test_an_isolated_id_plays_the_same(tmp_path):
    start = time.monotonic()
    with EnvSpec(ARITHMETIC, num_tasks=4, isolate=True) as spec:
        env = spec.environment_factory()
        prompt = env.reset(**spec.train_dataset[2])
        assert env.submit(answer=env.calculator(expression=question(prompt))) == "Correct!"
        assert env.get_reward() == 1.0
    assert time.monotonic() - start < 900


ECHO = "openenv/TRLEcho-v0"  # an OpenEnv MCP env: one split, `default`, that never ends (task k is seed k)
if ECHO not in gym.registry:
    gym.register(ECHO, entry_point=ENTRY_POINT, vector_entry_point=VECTOR_ENTRY_POINT,
                 kwargs={"adapter": ADAPTERS["openenv"], "source": str(ENVS / "openenv_echo_env"), "in_process": True})


@pytest.mark.needs("openenv", "datasets")
def test_each_env_takes_its_own_split_and_an_endless_one_needs_a_row_count():
    with EnvSpec(ECHO) as spec:
        with pytest.raises(ConfigurationError, match="never ends .*num_tasks="):
            _ = spec.train_dataset
    with EnvSpec(ECHO, num_tasks=3) as spec:
        ds = spec.train_dataset
        assert ds["split"] == ["default"] * 3 and ds["index"] == [0, 1, 2]
        env = spec.environment_factory()
        assert isinstance(env.reset(split="default", index=2), str)  # the row's task starts
    # A mixture: Arithmetic's rows from its own train split, the echo env's from `default`.
    with EnvSpec({ARITHMETIC: 1, ECHO: 1}, num_tasks=4) as spec:
        ds = spec.train_dataset
        assert {(e, s) for e, s in zip(ds["environment"], ds["split"])} == {(ARITHMETIC, "train"), (ECHO, "default")}
    with EnvSpec({ARITHMETIC: 1, ECHO: 1}, num_tasks=4, split={ARITHMETIC: "test"}) as spec:
        assert {(e, s) for e, s in zip(spec.train_dataset["environment"], spec.train_dataset["split"])} == \
            {(ARITHMETIC, "test"), (ECHO, "default")}
    with pytest.raises(ConfigurationError, match="does not hold: openenv/Nope-v0"):
        EnvSpec(ARITHMETIC, split={"openenv/Nope-v0": "train"})
    with pytest.raises(ConfigurationError, match="split names"):
        EnvSpec(ARITHMETIC, split={ARITHMETIC: 3})
