"""Registration, the catalog round trip through the CLI, and entry-point plugins.

Each scenario runs `import openenv_gym` in a fresh interpreter, because registration happens at
import time: that is what a user's process sees.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import openenv_gym
from openenv_gym.errors import ConfigurationError
from openenv_gym.importers.catalog import read_catalog
from openenv_gym.registration import ADAPTERS

ENVS = Path(__file__).parent / "envs"


def run(args: list[str], catalog: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, "OPENENV_GYM_CATALOG": str(catalog), **env},
    )


def cli(*args: str, catalog: Path) -> subprocess.CompletedProcess:
    return run(["-m", "openenv_gym.cli", *args], catalog)


def test_builtins_are_registered_with_the_right_flags():
    ids = openenv_gym.list_environments()
    assert {"openenv/ORS-v0", "openenv/Arithmetic-v0"} <= set(ids)
    spec = gym.spec("openenv/Arithmetic-v0")
    assert spec.nondeterministic and not spec.order_enforce
    assert openenv_gym.env_info("openenv/Arithmetic-v0")["kwargs"]["env_class"] == "Arithmetic"
    with pytest.raises(ConfigurationError, match="not registered"):
        openenv_gym.env_info("openenv/Nope-v0")


def test_import_registers_on_the_next_import_and_the_env_plays(private_catalog):
    done = cli("import", str(ENVS / "openreward_probe.py"), "--name", "MyProbe", catalog=private_catalog)
    assert done.returncode == 0, done.stderr
    assert "openenv/MyProbe-v0" in done.stdout
    listed = cli("list", catalog=private_catalog)
    assert "openenv/MyProbe-v0" in listed.stdout
    info = json.loads(cli("info", "openenv/MyProbe-v0", catalog=private_catalog).stdout)
    assert info["kwargs"]["env_class"] == "Probe"
    script = textwrap.dedent("""
        import json, gymnasium as gym, openenv_gym
        env = gym.make("openenv/MyProbe-v0")
        obs, info = env.reset(seed=0, options={"index": 0})
        call = {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "submit",
                "arguments": json.dumps({"answer": "4"})}}]}
        _, reward, terminated, _, _ = env.step(call)
        print(json.dumps({"reward": reward, "terminated": terminated, "flavour": info["server_flavour"]}))
        env.close()
    """)
    played = run(["-c", script], private_catalog)
    assert played.returncode == 0, played.stderr
    assert json.loads(played.stdout.strip().splitlines()[-1]) == {
        "reward": 1.0, "terminated": True, "flavour": "openreward"}
    removed = cli("remove", "MyProbe", catalog=private_catalog)
    assert removed.returncode == 0
    assert "openenv/MyProbe-v0" not in cli("list", catalog=private_catalog).stdout


def test_list_flags_an_imported_source_that_is_gone(private_catalog, tmp_path):
    """A source deleted after its import is named in ``list`` with the command that drops it."""
    source = tmp_path / "probe.py"
    shutil.copy(ENVS / "openreward_probe.py", source)
    assert cli("import", str(source), "--name", "Gone", catalog=private_catalog).returncode == 0
    line = next(x for x in cli("list", catalog=private_catalog).stdout.splitlines() if "openenv/Gone-v0" in x)
    assert "gone" not in line
    source.unlink()
    line = next(x for x in cli("list", catalog=private_catalog).stdout.splitlines() if "openenv/Gone-v0" in x)
    assert line.endswith("[its source is gone: `openenv-gym remove Gone`]"), line
    assert cli("remove", "Gone", catalog=private_catalog).returncode == 0
    assert "openenv/Gone-v0" not in cli("list", catalog=private_catalog).stdout


@pytest.mark.parametrize("args, message", [
    (["import", "no/such/path.py", "--name", "X"], "does not exist"),
    (["import", str(ENVS / "ors_probe.py"), "--name", "bad:name"], ":"),
    (["import", str(ENVS / "ors_probe.py"), "--name", "a/b"], "/"),
    (["import", str(ENVS / "ors_probe.py"), "--name", "Two"], "--env-class"),
    (["import", str(ENVS / "ors_probe.py"), "--name", "X", "--env-class", "Nope"], "Nope"),
    (["import", str(ENVS / "ors_probe.py"), "--name", "X", "--kind", "weird"], "weird"),
    (["remove", "Never"], "Never"),
])
def test_cli_errors_are_one_clear_line_and_write_nothing(private_catalog, args, message):
    done = cli(*args, catalog=private_catalog)
    assert done.returncode == 2
    assert done.stderr.startswith("openenv-gym: error:") and message in done.stderr
    assert "Traceback" not in done.stderr
    assert not private_catalog.exists() or "entries" in private_catalog.read_text()


def test_env_class_picks_one_of_several(private_catalog):
    done = cli("import", str(ENVS / "ors_probe.py"), "--name", "Beta", "--env-class", "ProbeBeta",
               catalog=private_catalog)
    assert done.returncode == 0, done.stderr
    info = json.loads(cli("info", "openenv/Beta-v0", catalog=private_catalog).stdout)
    assert info["kwargs"]["env_class"] == "ProbeBeta" and info["kwargs"]["env_name"] == "probebeta"


def test_entry_point_plugins_register_at_import(tmp_path, private_catalog):
    (tmp_path / "my_plugin.py").write_text(textwrap.dedent(f"""
        def envs():
            return [{{"id": "openenv/Plugged-v0", "entry_point": "openenv_gym.adapters.ors:make_env",
                     "kwargs": {{"source": {str(ENVS / 'ors_probe.py')!r}, "env_class": "Probe"}}}}]
        def broken():
            raise RuntimeError("plugin exploded")
    """))
    dist = tmp_path / "my_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[openenv_gym.envs]\nmine = my_plugin:envs\nbad = my_plugin:broken\n")
    script = ("import warnings; warnings.simplefilter('always'); import gymnasium as gym, openenv_gym; "
              "print(gym.spec('openenv/Plugged-v0').kwargs['env_class'])")
    done = run(["-c", script], private_catalog, PYTHONPATH=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Probe"
    assert "plugin exploded" in done.stderr  # a broken plugin warns and does not break the import


def test_entry_points_are_read_again_after_a_reinstall_at_the_same_version(tmp_path, private_catalog):
    """Entry points are cached by the installed set; reinstalling a package (pip removes and writes
    its metadata folder) must show its new entry points at the next import, same version or not."""
    (tmp_path / "my_plugin.py").write_text(textwrap.dedent(f"""
        def envs(name="Plugged"):
            return [{{"id": f"openenv/{{name}}-v0", "entry_point": "openenv_gym.adapters.ors:make_env",
                     "kwargs": {{"source": {str(ENVS / 'ors_probe.py')!r}, "env_class": "Probe"}}}}]
        def renamed():
            return envs("Replugged")
    """))
    dist = tmp_path / "my_plugin-1.0.dist-info"

    def install(entry: str) -> None:
        shutil.rmtree(dist, ignore_errors=True)
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 1.0\n")
        (dist / "entry_points.txt").write_text(f"[openenv_gym.envs]\nmine = my_plugin:{entry}\n")

    script = "import gymnasium as gym, openenv_gym; print(sorted(i for i in gym.registry if 'plugged' in i.lower()))"
    cache = tmp_path / "cache"
    install("envs")
    for _ in range(2):  # the second import answers from the cache
        done = run(["-c", script], private_catalog, PYTHONPATH=str(tmp_path), OPENENV_GYM_CACHE=str(cache))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "['openenv/Plugged-v0']"
    assert (cache / "entry-points.json").exists()
    time.sleep(0.01)
    install("renamed")
    done = run(["-c", script], private_catalog, PYTHONPATH=str(tmp_path), OPENENV_GYM_CACHE=str(cache))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['openenv/Replugged-v0']"


def test_a_corrupt_catalog_warns_and_the_builtins_still_register(private_catalog):
    private_catalog.parent.mkdir(parents=True, exist_ok=True)
    private_catalog.write_text("{not json")
    done = run(["-c", "import gymnasium as gym, openenv_gym; print(gym.spec('openenv/Arithmetic-v0').id)"],
               private_catalog)
    assert done.returncode == 0 and "openenv/Arithmetic-v0" in done.stdout
    assert "catalog" in done.stderr


def test_check_env_passes_on_arithmetic():
    env = gym.make("openenv/Arithmetic-v0")
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


# -- a bad catalog entry costs only itself -------------------------------------------------------------

BAD_NAMES = ["../../x", "a/b", "a b", "emoji\U0001F600", "zero\u200bwidth", "rtl\u202emark", "", "a:b"]


def write_bad_catalog(catalog: Path) -> dict[str, object]:
    """Good entries plus every kind of bad one; returns the raw entries written."""
    entries: dict[str, object] = {
        "Good": {"name": "Good", "kind": "ors", "source": str(ENVS / "ors_probe.py"), "env_class": "Probe"},
        "AlsoGood": {"name": "AlsoGood", "kind": "ors", "source": str(ENVS / "ors_probe.py"), "env_class": "Probe"},
        "Corrupt": {"name": "Corrupt", "kind": "ors"},
        "Weird": {"name": "Weird", "kind": "weird", "source": "/s"},
    }
    for name in BAD_NAMES:
        entries[name] = {"name": name, "kind": "ors", "source": "/s"}
    body = json.dumps({"version": 1, "entries": entries})
    deep = '"Deep": {"name": "Deep", "kind": "ors", "source": "/s", "options": {"o": ' + "[" * 50_000 + "]" * 50_000 + "}}"
    catalog.parent.mkdir(parents=True, exist_ok=True)
    catalog.write_text(body[:-2] + ", " + deep + "}}")
    return entries


def test_bad_catalog_entries_are_skipped_with_one_warning_and_the_good_ones_register(private_catalog):
    write_bad_catalog(private_catalog)
    script = ("import json, warnings; warnings.simplefilter('always'); import openenv_gym; "
              "print(json.dumps(openenv_gym.list_environments()))")
    done = run(["-c", script], private_catalog)
    assert done.returncode == 0, done.stderr  # was: an exception from registration at import
    ids = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"openenv/Good-v0", "openenv/AlsoGood-v0", "openenv/Arithmetic-v0"} <= set(ids)
    assert done.stderr.count("invalid catalog entr") == 1  # one warning for them all
    assert "skipped 11 invalid catalog entries" in done.stderr
    for name in [*BAD_NAMES, "Corrupt", "Weird", "Deep"]:
        assert repr(name) in done.stderr
    assert "openenv-gym remove" in done.stderr
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr


def test_cli_list_and_remove_work_with_a_bad_catalog(private_catalog):
    write_bad_catalog(private_catalog)
    listed = cli("list", catalog=private_catalog)
    assert listed.returncode == 0, listed.stderr
    assert "openenv/Good-v0" in listed.stdout and "openenv/ORS-v0" in listed.stdout
    removed = cli("remove", "../../x", catalog=private_catalog)
    assert removed.returncode == 0, removed.stderr
    left = read_catalog(private_catalog, kinds=ADAPTERS)
    assert "../../x" not in left.invalid and "Deep" in left.invalid and set(left.entries) == {"Good", "AlsoGood"}
    removed = cli("remove", "--invalid", catalog=private_catalog)
    assert removed.returncode == 0, removed.stderr
    assert set(json.loads(private_catalog.read_text())["entries"]) == {"Good", "AlsoGood"}
    clean = run(["-c", "import warnings; warnings.simplefilter('always'); import openenv_gym"], private_catalog)
    assert clean.returncode == 0 and "catalog" not in clean.stderr


def test_plugins_name_an_adapter_and_get_the_generic_entry_points(tmp_path, private_catalog):
    (tmp_path / "adapter_plugin.py").write_text(textwrap.dedent(f"""
        def envs():
            return [
                {{"id": "openenv/Short-v0", "adapter": "openenv_gym.adapters.ors.adapter:ORSAdapter",
                  "kwargs": {{"source": {str(ENVS / 'ors_probe.py')!r}, "env_class": "Probe"}}}},
                {{"id": "openenv/Legacy-v0", "entry_point": "openenv_gym.adapters.ors:make_env",
                  "kwargs": {{"source": {str(ENVS / 'ors_probe.py')!r}, "env_class": "Probe"}}}},
            ]
    """))
    dist = tmp_path / "adapter_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: adapter-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[openenv_gym.envs]\nmine = adapter_plugin:envs\n")
    script = ("import json, gymnasium as gym, openenv_gym; print(json.dumps([[s.entry_point, s.vector_entry_point, "
              "s.kwargs['adapter']] for s in map(gym.spec, ['openenv/Short-v0', 'openenv/Legacy-v0'])]))")
    done = run(["-c", script], private_catalog, PYTHONPATH=str(tmp_path))
    assert done.returncode == 0, done.stderr
    expected = ["openenv_gym.registration:make_env", "openenv_gym.registration:make_vec",
                "openenv_gym.adapters.ors.adapter:ORSAdapter"]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [expected, expected]


def test_an_unknown_id_suggests_close_matches():
    with pytest.raises(ConfigurationError, match="did you mean openenv/Arithmetic-v0"):
        openenv_gym.env_info("openenv/Arithmetc-v0")
    with pytest.raises(ConfigurationError, match="did you mean openenv/ORS-v0"):
        openenv_gym.env_info("ors")


# -- the generic entry point: unknown kwargs are named, secrets never shown ---------------------------

SECRET = "SECRET-VALUE"


def make_single(id, **kwargs):
    return gym.make(id, **kwargs)


def make_concurrent(id, **kwargs):
    return gym.make_vec(id, num_envs=2, **kwargs)


def make_sync(id, **kwargs):
    return gym.make_vec(id, num_envs=2, vectorization_mode="sync", **kwargs)


def assert_no_secret(info: pytest.ExceptionInfo) -> None:
    shown = [str(info.value), repr(info.value), "".join(traceback.format_exception(info.value))]
    assert not [text for text in shown if SECRET in text]


@pytest.mark.parametrize("make", [make_single, make_concurrent, make_sync])
@pytest.mark.parametrize("id, kwargs, named", [
    ("openenv/ORS-v0", {"url": "http://127.0.0.1:9", "secrets": {"k": SECRET}, "step_timeout": 3, "bogus": 1}, "'bogus'"),
    ("openenv/ORS-v0", {"url": "http://127.0.0.1:9", "headers": {"Authorization": SECRET}, "secret": {"k": SECRET}},
     "'secret' (did you mean 'secrets'?)"),
    ("openenv/Fleet-v0", {"api_key": SECRET, "env_key": "x", "env_variables": {"T": SECRET}, "max_turn": 2},
     "'max_turn' (did you mean 'max_turns'?)"),
    ("openenv/Arithmetic-v0", {"secrets": {"k": SECRET}, "token": SECRET}, "'token'"),
])
def test_an_unknown_kwarg_is_named_before_anything_starts_and_no_secret_is_shown(make, id, kwargs, named):
    with pytest.raises(ConfigurationError) as info:  # was: Gymnasium's TypeError printing every kwarg
        make(id, **kwargs)
    assert named in str(info.value)
    assert_no_secret(info)


@pytest.mark.parametrize("make", [make_single, make_concurrent, make_sync])
def test_a_kwarg_of_the_wrong_type_never_shows_a_secret(make):
    # ORSAdapter(source=5) raises TypeError inside the entry point, which Gymnasium re-raised
    # with every kwarg in the message.
    with pytest.raises(ConfigurationError) as info:
        make("openenv/ORS-v0", source=5, secrets={"k": SECRET}, api_key=SECRET)
    assert_no_secret(info)


def test_vector_only_names_are_checked_too():
    with pytest.raises(ConfigurationError, match="did you mean 'concurrent'"):
        gym.make_vec("openenv/Arithmetic-v0", num_envs=2, backend="conccurent")
    with pytest.raises(ConfigurationError, match="'num_actor'"):
        gym.make_vec("openenv/Arithmetic-v0", num_envs=2, vector_options={"num_actor": 2})
    with pytest.raises(ConfigurationError, match="'backend'"):  # not a single env's kwarg
        gym.make("openenv/Arithmetic-v0", backend="ray")


def test_adapter_spec_repr_and_env_info_hide_secrets():
    from openenv_gym.adapters.base import AdapterSpec
    from openenv_gym.registration import _register

    kwargs = {"url": "http://127.0.0.1:9", "secrets": {"k": SECRET}, "headers": {"Authorization": SECRET},
              "api_key": SECRET, "env_args": {"nested": {"github_token": SECRET}}, "password": SECRET}
    spec = AdapterSpec("openenv_gym.adapters.ors.adapter:ORSAdapter", dict(kwargs))
    assert SECRET not in repr(spec) and SECRET not in str(spec) and "github_token" in repr(spec)
    assert spec.kwargs["secrets"] == {"k": SECRET}  # the recipe itself keeps what it must pass on
    _register("openenv/SecretHolder-v0", {"adapter": "openenv_gym.adapters.ors.adapter:ORSAdapter", **kwargs})
    try:
        assert SECRET not in repr(gym.spec("openenv/SecretHolder-v0"))  # the registry's spec prints safely
        assert gym.spec("openenv/SecretHolder-v0").kwargs["api_key"] == SECRET  # and still holds the value
        info = openenv_gym.env_info("openenv/SecretHolder-v0")
        assert SECRET not in json.dumps(info)
        assert info["kwargs"]["secrets"] == {"k": "***"} and info["kwargs"]["url"] == "http://127.0.0.1:9"
    finally:
        del gym.registry["openenv/SecretHolder-v0"]


def test_made_envs_keep_secrets_out_of_their_spec_and_get_step_timeout():
    env = gym.make("openenv/Arithmetic-v0", secrets={"k": SECRET}, step_timeout=30)
    try:
        assert env.unwrapped.step_timeout == 30
        assert env.unwrapped.max_turns == 8  # the registered kwarg still reaches the env
        for spec in (env.spec, env.unwrapped.spec):
            assert SECRET not in repr(spec) and SECRET not in spec.to_json()
        assert SECRET not in json.dumps(openenv_gym.env_info(env.spec.id))
        registered = gym.spec("openenv/Arithmetic-v0")  # the registry's spec stays data
        assert pickle.loads(pickle.dumps(registered)) == registered
        assert json.loads(registered.to_json())["kwargs"]["adapter"] == "openenv_gym.adapters.ors.adapter:ORSAdapter"
        again = gym.make(env.unwrapped.spec.id, max_turns=2)  # the spec's id and kwargs still make envs
        assert again.unwrapped.max_turns == 2
        again.close()
    finally:
        env.close()
    envs = gym.make_vec("openenv/Arithmetic-v0", num_envs=2, secrets={"k": SECRET})
    try:
        assert SECRET not in repr(envs.unwrapped.spec) and SECRET not in envs.unwrapped.spec.to_json()
    finally:
        envs.close()


def test_an_env_key_the_adapter_takes_goes_to_the_adapter():
    from openenv_gym.registration import _adapter_and_env_kwargs

    source = str(ENVS / "verifiers_v0" / "vf_arith.py")
    spec, env_kwargs = _adapter_and_env_kwargs(ADAPTERS["verifiers"], {"source": source, "max_turns": 2,
                                                                      "split": "train", "step_timeout": 5})
    assert spec.entry.endswith(":VerifiersV0Adapter")  # the front door chose the generation statically
    assert spec.kwargs == {"source": source, "max_turns": 2}  # the library's own turn limit
    assert env_kwargs == {"split": "train", "step_timeout": 5}
    spec, env_kwargs = _adapter_and_env_kwargs(ADAPTERS["ors"], {"source": source, "max_turns": 2})
    assert env_kwargs == {"max_turns": 2} and "max_turns" not in spec.kwargs


@pytest.mark.parametrize("kwargs, says", [
    ({"max_turns": "eight"}, "max_turns must be a positive integer or None, not 'eight' (str)"),
    ({"max_turns": 0}, "max_turns must be a positive integer or None, not 0"),
    ({"max_turns": True}, "max_turns must be a positive integer or None, not True"),
    ({"step_timeout": "1"}, "step_timeout must be a positive number of seconds or None, not '1' (str)"),
    ({"start_timeout": -1}, "start_timeout must be a positive number of seconds or None, not -1"),
    ({"split": 3}, "split must be a split's name (a string) or None, not 3 (int)"),
])
def test_a_wrong_type_of_env_kwarg_is_named_before_anything_starts(kwargs, says):
    from openenv_gym.errors import ConfigurationError

    for make in (gym.make, lambda id, **kw: gym.make_vec(id, num_envs=2, **kw)):
        with pytest.raises(ConfigurationError) as raised:
            make("openenv/Arithmetic-v0", **kwargs)
        assert str(raised.value) == says or str(raised.value).startswith(says), str(raised.value)


def test_one_name_for_the_start_wait():
    """The hint names start_timeout alone; startup_timeout, its old name, still works and says so."""
    from openenv_gym.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as raised:
        gym.make("openenv/ORS-v0", source=str(ENVS / "ors_probe.py"), env_class="Probe", start_timeot=3)
    assert "start_timeout" in str(raised.value) and "startup_timeout" not in str(raised.value)
    with pytest.warns(DeprecationWarning, match="startup_timeout is start_timeout's old name"):
        env = gym.make("openenv/ORS-v0", source=str(ENVS / "ors_probe.py"), env_class="Probe", startup_timeout=77)
    try:
        assert env.unwrapped.adapter.startup_timeout == 77  # the local server's wait, set from the one name
    finally:
        env.close()
    env = gym.make("openenv/ORS-v0", source=str(ENVS / "ors_probe.py"), env_class="Probe", start_timeout=55)
    try:
        assert env.unwrapped.adapter.startup_timeout == 55
    finally:
        env.close()
