"""A forked child never touches its parent's sessions: using an inherited env is a clear error,
and closing (or dropping) it releases nothing of the parent's.

Before, a child that closed an inherited env stopped the parent's server (the parent's next step
then timed out after the whole step_timeout, every sub-env of a vector env at once), and a step
in the child raised a bare RuntimeError about event loops.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import gymnasium as gym
import pytest

import openenv_gym  # noqa: F401
from openenv_gym.errors import InheritedEnv
from openenv_gym.pool import SessionPool

ENVS = Path(__file__).parent / "envs"
PROBE = dict(source=str(ENVS / "ors_probe.py"), env_class="Probe")
HINT = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                             "function": {"name": "hint", "arguments": json.dumps({})}}]}
_fork = multiprocessing.get_context("fork")


def _in_child(target, *args) -> int:
    process = _fork.Process(target=target, args=args)
    process.start()
    process.join(60)
    assert process.exitcode is not None, "the child hung"
    return process.exitcode


def _use_then_close(env) -> None:
    try:
        env.step(HINT) if not hasattr(env, "send") else env.step([HINT] * env.num_envs)
    except InheritedEnv as exc:
        assert f"process {os.getppid()}" in str(exc) and "forked child" in str(exc)
        env.close()
        os._exit(0)
    os._exit(1)  # the step went through: the child used the parent's sessions


def _drop(env) -> None:
    del env  # __del__ in the child, then the child's own exit hooks
    raise SystemExit(0)


@pytest.mark.parametrize("make", [
    lambda: gym.make("openenv/ORS-v0", step_timeout=20, **PROBE),
    lambda: gym.make_vec("openenv/ORS-v0", num_envs=3, step_timeout=20, **PROBE),
], ids=["env", "vector env"])
def test_a_child_cannot_use_an_inherited_env_and_its_close_leaves_the_parent_whole(make):
    env = make()
    try:
        env.reset(seed=0)
        assert _in_child(_use_then_close, env) == 0
        assert _in_child(_drop, env) == 0
        out = env.step(HINT) if not hasattr(env, "send") else env.step([HINT] * env.num_envs)
        obs = out[0] if not hasattr(env, "send") else out[0][0]
        assert obs[0]["content"] == "Think step by step.", "the parent's session was touched by its child"
        infos = out[4]
        assert "error" not in infos
    finally:
        env.close()


def _pool_child(pool) -> None:
    try:
        pool.lease()
    except InheritedEnv:
        pool.close()
        os._exit(0)
    os._exit(1)


def test_a_child_cannot_use_an_inherited_pool():
    pool = SessionPool.make("openenv/Arithmetic-v0", 2)
    try:
        assert _in_child(_pool_child, pool) == 0
        assert pool.lease() is not None
    finally:
        pool.close()


def test_a_plain_fork_child_exiting_normally_runs_no_close_of_the_parents(tmp_path):
    """``os.fork()`` then a normal exit in the child runs the inherited ``atexit`` hooks (unlike a
    multiprocessing child): they must release nothing of the parent's (its local server above all)."""
    import subprocess
    import sys

    script = tmp_path / "fork.py"
    script.write_text(
        "import json, os, sys\n"
        "import gymnasium as gym, openenv_gym\n"
        f"env = gym.make('openenv/ORS-v0', step_timeout=20, source={PROBE['source']!r}, env_class='Probe')\n"
        "env.reset(seed=0)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)  # the child's atexit hooks run here, with env still open in it\n"
        "os.waitpid(pid, 0)\n"
        "hint = {'role': 'assistant', 'tool_calls': [{'id': 'c', 'type': 'function', 'function': {'name': 'hint', 'arguments': '{}'}}]}\n"
        "print(env.step(hint)[0][0]['content'])\n"
        "env.close()\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "Think step by step."
