"""The Verifiers front door: ``openenv/Verifiers-v0``, imports, discovery kwargs, vector envs.

The generation adapters have their own tests (test_verifiers_v0.py, test_verifiers_v1.py); this
file checks what a user goes through to reach them: ``gym.make`` with a source, an imported
source, ``gym.make_vec``, and ``max_turns`` reaching the library's own turn limit.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

vf = pytest.importorskip("verifiers", reason="the verifiers extra is not installed")
if not hasattr(vf, "SingleTurnEnv"):
    pytest.skip("the installed verifiers has no legacy API (this file runs under verifiers<0.4)", allow_module_level=True)

import openenv_gym  # noqa: E402,F401
from openenv_gym.errors import ConfigurationError  # noqa: E402

ENVS = Path(__file__).resolve().parents[1] / "envs" / "verifiers_v0"


def test_make_with_a_source_plays_the_library_loop():
    env = gym.make("openenv/Verifiers-v0", source=str(ENVS / "vf_arith.py"))
    try:
        assert env.unwrapped.adapter.info()["backend"].startswith("verifiers")
        obs, info = env.reset(options={"index": 1})
        assert obs[0]["role"] == "system" and "40 + 2" in obs[-1]["content"]
        obs, reward, terminated, truncated, info = env.step("42")
        assert terminated and not truncated
        assert reward == pytest.approx(1.0 - 0.5 * 0.01 * 2)  # exact match + weighted length penalty
        assert info["metrics"]["exact_match"] == 1.0
    finally:
        env.close()


def test_max_turns_reaches_the_librarys_turn_limit():
    env = gym.make("openenv/Verifiers-v0", source=str(ENVS / "vf_guess.py"), max_turns=2)
    try:
        env.reset(options={"index": 0})  # the number is 3
        _, reward, terminated, truncated, info = env.step("5")
        assert not (terminated or truncated)
        _, reward, terminated, truncated, info = env.step("4")
        assert truncated and not terminated
        assert info["stop_condition"] == "max_turns_reached"
        assert isinstance(reward, float)  # scored by the rubric, not cut off unscored
    finally:
        env.close()


def test_imported_source_registers_and_vectorises():
    from openenv_gym.importing import import_source
    from openenv_gym.registration import register_catalog

    entry = import_source(ENVS / "vf_arith.py", "VfArith")
    assert (entry.kind, entry.sdk, entry.env_name) == ("verifiers", "v0", "vf_arith")
    assert "openenv/VfArith-v0" in register_catalog()
    envs = gym.make_vec("openenv/VfArith-v0", num_envs=3)
    try:
        obs, infos = envs.reset(seed=0, options={"index": 0})
        _, rewards, terminated, _, infos = envs.step(["5", "5", "wrong"])
        assert terminated.all()
        assert rewards[0] == rewards[1] > rewards[2]
    finally:
        envs.close()


def test_unknown_environment_says_how_to_install_it():
    with pytest.raises(ConfigurationError, match="not installed"):
        gym.make("openenv/Verifiers-v0", env_id="someorg/no-such-env")


def test_an_unknown_generation_is_refused():
    with pytest.raises(ConfigurationError, match="generation"):
        gym.make("openenv/Verifiers-v0", source=str(ENVS / "vf_arith.py"), generation="v2")
