"""Registration, the catalog round trip through the CLI, and entry-point plugins.

Each scenario runs `import openenv_gym` in a fresh interpreter, because registration happens at
import time: that is what a user's process sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import openenv_gym
from openenv_gym.errors import ConfigurationError

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
